//! The cgroup provider against sabotage, and containment on demand. Root only: each test skips
//! with a printed reason otherwise, and fails instead under `CORDON_REQUIRE_PRIVILEGED=1`.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cordon_runtime::EnforcementState;
use cordon_sandbox::cgroup::{CgroupError, CgroupLimits, Layout, RunCgroup};
use cordon_sandbox::contain::contain;

fn privileged(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let msg = format!("SKIP {test}: needs root to create cgroups");
    if std::env::var_os("CORDON_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1") {
        panic!("{msg}; CORDON_REQUIRE_PRIVILEGED=1 turns this skip into a failure");
    }
    eprintln!("{msg}");
    false
}

/// A run cgroup for one test, torn down at the end whatever happens.
struct Fixture {
    cg: Option<RunCgroup>,
    children: Vec<Child>,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let layout = Layout::detect().unwrap();
        let name = format!("test-{name}-{}", std::process::id());
        let cg = RunCgroup::create(&layout, &name, CgroupLimits::default()).unwrap();
        Fixture {
            cg: Some(cg),
            children: Vec::new(),
        }
    }

    fn cg(&self) -> &RunCgroup {
        self.cg.as_ref().unwrap()
    }

    /// Starts `sleep` processes inside the cgroup: `n` in total, as one shell and its children.
    fn spawn_tree(&mut self, n: usize) {
        let procs = self.cg().v2.join("cgroup.procs");
        let script = format!(
            "echo $$ > {} && for i in $(seq 2 {n}); do sleep 1000 & done; exec sleep 1000",
            procs.display()
        );
        let child = Command::new("/bin/sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
        for _ in 0..500 {
            if self.cg().procs().unwrap().len() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("the tree of {n} did not start");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(cg) = self.cg.take() {
            let mut steps = Vec::new();
            cg.teardown(&mut steps);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_cgroup_deleted_and_recreated_under_its_name_is_refused() {
    if !privileged("a_cgroup_deleted_and_recreated_under_its_name_is_refused") {
        return;
    }
    let fx = Fixture::new("recreated");
    let cg = fx.cg();
    let handle = cg.handle();
    // Negative control: the run's own cgroup is accepted.
    cg.check_identity().unwrap();
    RunCgroup::open(&handle).unwrap();
    // Sabotage: remove it and make another one under the same path.
    fs::remove_dir(&cg.v2).unwrap();
    fs::create_dir(&cg.v2).unwrap();
    assert!(matches!(
        cg.check_identity(),
        Err(CgroupError::Replaced { .. })
    ));
    assert!(matches!(cg.kill(), Err(CgroupError::Replaced { .. })));
    assert!(matches!(
        cg.freeze(Duration::from_millis(10)),
        Err(CgroupError::Replaced { .. })
    ));
    assert!(matches!(
        RunCgroup::open(&handle),
        Err(CgroupError::Replaced { .. })
    ));
    fs::remove_dir(&cg.v2).unwrap();
}

#[test]
fn a_freeze_is_verified_and_a_thaw_behind_cordons_back_is_caught() {
    if !privileged("a_freeze_is_verified_and_a_thaw_behind_cordons_back_is_caught") {
        return;
    }
    let mut fx = Fixture::new("freeze");
    fx.spawn_tree(3);
    let cg = fx.cg();
    // Negative control: not frozen before.
    assert!(!cg.frozen().unwrap());
    assert!(cg.freeze(Duration::from_secs(2)).unwrap().is_some());
    assert!(cg.frozen().unwrap());
    // A process added after the freeze is frozen with the rest: the kernel freezes it on entry,
    // and `frozen 1` holds.
    let late = Command::new("/bin/sh")
        .args([
            "-c",
            &format!(
                "echo $$ > {} && exec sleep 1000",
                cg.v2.join("cgroup.procs").display()
            ),
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    fx.children.push(late);
    let cg = fx.cg();
    for _ in 0..500 {
        if cg.procs().unwrap().len() >= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(cg.procs().unwrap().len(), 4);
    assert!(
        cg.wait_event("frozen", 1, Duration::from_secs(2))
            .unwrap()
            .is_some()
    );
    assert!(cg.frozen().unwrap());
    // Sabotage: someone thaws the cgroup behind cordon's back.
    fs::write(cg.v2.join("cgroup.freeze"), "0").unwrap();
    cg.wait_event("frozen", 0, Duration::from_secs(2)).unwrap();
    assert!(!cg.frozen().unwrap(), "a lifted freeze must not verify");
}

#[test]
fn containment_freezes_records_kills_and_verifies() {
    if !privileged("containment_freezes_records_kills_and_verifies") {
        return;
    }
    let mut fx = Fixture::new("contain");
    fx.spawn_tree(10);
    let pids = fx.cg().procs().unwrap();
    // Negative control: the processes are alive before containment.
    for pid in &pids {
        assert!(Path::new(&format!("/proc/{pid}")).exists());
    }
    let outcome = contain(fx.cg(), None);
    assert!(outcome.verified_dead, "{outcome:#?}");
    assert!(outcome.complete(), "{outcome:#?}");
    let actions: Vec<&str> = outcome.steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(
        actions,
        ["egress-block", "freeze", "record", "kill", "verify"]
    );
    assert_eq!(outcome.steps[0].state, EnforcementState::NotConfigured);
    assert!(
        outcome.steps[1..]
            .iter()
            .all(|s| s.state == EnforcementState::Enforced)
    );
    assert_eq!(outcome.processes.len(), 10, "{:#?}", outcome.processes);
    // The recorded tree is the listed one: every pid, each one's parent either another recorded
    // process or this test (which started the tree), all root's.
    let mut recorded: Vec<i32> = outcome.processes.iter().map(|p| p.pid).collect();
    recorded.sort_unstable();
    let mut listed = pids.clone();
    listed.sort_unstable();
    assert_eq!(recorded, listed);
    let me = i32::try_from(std::process::id()).unwrap();
    for p in &outcome.processes {
        assert!(
            p.ppid == me || recorded.contains(&p.ppid),
            "{p:?} in {:#?}",
            outcome.processes
        );
        assert_eq!(p.uid, 0, "{p:?}");
    }
    assert!(
        outcome.processes.iter().any(|p| p.ppid != me),
        "a tree, not a flat list: {:#?}",
        outcome.processes
    );
    assert!(!fx.cg().populated().unwrap());
    for pid in pids {
        // Reaped by their parent (this test) or gone: either way not running.
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "{pid} still runs: {stat}"
        );
    }
}

#[test]
fn a_failing_egress_block_is_reported_and_containment_goes_on() {
    if !privileged("a_failing_egress_block_is_reported_and_containment_goes_on") {
        return;
    }
    let mut fx = Fixture::new("egressfail");
    fx.spawn_tree(2);
    let mut block =
        || -> Result<String, String> { Err("program detached behind cordon's back".into()) };
    let outcome = contain(fx.cg(), Some(&mut block));
    assert_eq!(outcome.steps[0].state, EnforcementState::VerificationFailed);
    assert!(
        outcome.verified_dead,
        "the kill still happened: {outcome:#?}"
    );
    assert!(!outcome.complete());
}
