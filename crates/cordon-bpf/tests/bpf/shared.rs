//! The programs shared by every run on a boot: runs at once never see each other's events or
//! disturb each other; what a killed cordon left is cleaned; the shared objects are checked by
//! every run (a detached or replaced one is caught, a damaged or older one replaced when
//! idle); concurrent first starts load them once. Tests that damage or replace the shared
//! objects do it on a bpffs of their own, never under the other tests' runs.

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_bpf::probe::{self, Probe, ProbeKind, ProbeResult};
use cordon_bpf::shared::{self, SharedState};
use cordon_bpf::{
    Egress, EgressError, Event, Observer, ObserverError, SharedError, VerifyState, cleanup_stale,
    sys,
};

use crate::common::*;

const ROOT: &str = "/sys/fs/bpf";
const EPERM: ProbeResult = ProbeResult::Failed(libc::EPERM);

fn state(root: &Path) -> SharedState {
    shared::state(root)
        .expect("reading the shared objects")
        .expect("shared objects exist")
}

/// A run as `cordon run` makes it: an observer, and egress control reporting into it.
struct Run {
    egress: EgressGuard,
    observer: ObserverGuard,
}

impl Run {
    fn attach_at(root: &Path, cg: &TestCgroup, allow: &[cordon_bpf::Allow]) -> Run {
        let run_id = unique("shared");
        let observer = Observer::attach_at(root, &run_id, &cg.path).expect("attach observer");
        let egress = Egress::attach_at(root, &run_id, &cg.path, allow, Some(&observer))
            .expect("attach egress");
        Run {
            egress: EgressGuard(Some(egress)),
            observer: ObserverGuard(Some(observer)),
        }
    }

    fn attach(cg: &TestCgroup, allow: &[cordon_bpf::Allow]) -> Run {
        Run::attach_at(Path::new(ROOT), cg, allow)
    }

    fn verify(&mut self) -> cordon_bpf::Verification {
        let o = self.observer.get().verify();
        o.and(self.egress.get().verify())
    }

    /// Events until `done` holds for what was collected, or `limit` passes.
    fn collect_until(&mut self, limit: Duration, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let start = Instant::now();
        let mut all = Vec::new();
        while start.elapsed() < limit && !done(&all) {
            all.extend(self.observer.get().poll(Duration::from_millis(50)).unwrap());
        }
        all
    }

    fn release(mut self) {
        self.egress
            .0
            .take()
            .unwrap()
            .release()
            .expect("release egress");
        self.observer
            .0
            .take()
            .unwrap()
            .release()
            .expect("release observer");
    }
}

fn exec_true(cgroup: &Path, marker: &str) -> u32 {
    let (pid, code) = probe::exec_probe(
        cgroup,
        Path::new("/bin/true"),
        &["true", marker],
        Duration::from_secs(5),
    )
    .expect("exec probe");
    assert_eq!(code, 0);
    pid
}

fn tcp_from(cgroup: &Path, dest: std::net::SocketAddr) -> (u32, ProbeResult) {
    let run = probe::connect_probes(
        cgroup,
        &[Probe {
            kind: ProbeKind::TcpConnect,
            dest,
        }],
        Duration::from_secs(5),
    )
    .expect("probe process");
    (run.pid, run.results[0])
}

#[test]
fn two_runs_at_once_each_get_only_their_own_events() {
    if !privileged("two_runs_at_once_each_get_only_their_own_events") {
        return;
    }
    let refused = TcpServer::start("127.0.0.3");
    let (a, b) = (TestCgroup::new(), TestCgroup::new());
    // Attached at the same time, from two threads.
    let (mut ra, mut rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| Run::attach(&a, &[allow("127.0.0.2/32", None)]));
        let tb = s.spawn(|| Run::attach(&b, &[allow("127.0.0.2/32", None)]));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert_ne!(ra.observer.get().slot(), rb.observer.get().slot());
    assert_ne!(ra.egress.get().slot(), rb.egress.get().slot());
    // The same shared programs serve both.
    assert_eq!(ra.observer.get().link_id(), rb.observer.get().link_id());
    assert_eq!(ra.egress.get().program_ids(), rb.egress.get().program_ids());

    // Interleaved execs and refused connects in both cgroups.
    let (mut pids_a, mut pids_b) = (Vec::new(), Vec::new());
    for i in 0..4 {
        pids_a.push(exec_true(&a.path, &format!("a-{i}")));
        pids_b.push(exec_true(&b.path, &format!("b-{i}")));
        let (pa, r) = tcp_from(&a.path, refused.addr);
        assert_eq!(r, EPERM);
        pids_a.push(pa);
        let (pb, r) = tcp_from(&b.path, refused.addr);
        assert_eq!(r, EPERM);
        pids_b.push(pb);
    }
    let all_of = |pids: &[u32]| {
        let pids = pids.to_vec();
        move |ev: &[Event]| pids.iter().all(|p| ev.iter().any(|e| e.pid() == *p))
    };
    let ev_a = ra.collect_until(Duration::from_secs(5), all_of(&pids_a));
    let ev_b = rb.collect_until(Duration::from_secs(5), all_of(&pids_b));
    assert!(all_of(&pids_a)(&ev_a), "run A missed events: {ev_a:?}");
    assert!(all_of(&pids_b)(&ev_b), "run B missed events: {ev_b:?}");
    let cgroup_of = |e: &Event| match e {
        Event::Exec(x) => x.cgroup_id,
        Event::Connect(c) => c.cgroup_id,
    };
    assert!(
        ev_a.iter()
            .all(|e| cgroup_of(e) == a.id() && !pids_b.contains(&e.pid())),
        "run A got another cgroup's events: {ev_a:?}"
    );
    assert!(
        ev_b.iter()
            .all(|e| cgroup_of(e) == b.id() && !pids_a.contains(&e.pid())),
        "run B got another cgroup's events: {ev_b:?}"
    );
    // Both kinds arrived, in each run's own ring buffer.
    for ev in [&ev_a, &ev_b] {
        assert!(ev.iter().any(|e| matches!(e, Event::Exec(_))));
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::Connect(c) if !c.allowed))
        );
    }
    assert_eq!(ra.observer.get().lost().unwrap(), 0);
    assert_eq!(rb.observer.get().lost().unwrap(), 0);
    ra.release();
    rb.release();
}

#[test]
fn releasing_one_run_leaves_another_untouched() {
    if !privileged("releasing_one_run_leaves_another_untouched") {
        return;
    }
    let refused = TcpServer::start("127.0.0.3");
    let (a, b) = (TestCgroup::new(), TestCgroup::new());
    let ra = Run::attach(&a, &[allow("127.0.0.2/32", None)]);
    let mut rb = Run::attach(&b, &[allow("127.0.0.2/32", None)]);
    let v = rb.verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    assert_eq!(tcp_from(&a.path, refused.addr).1, EPERM);

    ra.release();
    // A is free again (the negative control of B's boundary)...
    assert_eq!(tcp_from(&a.path, refused.addr).1, ProbeResult::Ok);
    let s = state(Path::new(ROOT));
    assert!(!s.watched.iter().any(|(c, _)| *c == a.id()), "{s:?}");
    assert!(!s.egress_owners.iter().any(|(_, c)| *c == a.id()), "{s:?}");
    // ... while B's boundary, its entries and its events are as they were.
    assert!(s.watched.iter().any(|(c, _)| *c == b.id()), "{s:?}");
    assert!(s.egress_owners.iter().any(|(_, c)| *c == b.id()), "{s:?}");
    let v = rb.verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    let (pid, r) = tcp_from(&b.path, refused.addr);
    assert_eq!(r, EPERM);
    let exec = exec_true(&b.path, "after-release");
    let ev = rb.collect_until(Duration::from_secs(3), |ev| {
        [pid, exec].iter().all(|p| ev.iter().any(|e| e.pid() == *p))
    });
    assert!(ev.iter().any(|e| e.pid() == exec), "{ev:?}");
    assert!(ev.iter().any(|e| e.pid() == pid), "{ev:?}");
    rb.release();
}

#[test]
fn what_a_killed_cordon_left_is_cleaned_on_the_next_start() {
    if !privileged("what_a_killed_cordon_left_is_cleaned_on_the_next_start") {
        return;
    }
    let refused = TcpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let run_id = unique("killed");
    let mut cordon = Command::new(helper())
        .args([
            "observe-and-wait",
            &run_id,
            cg.path.to_str().unwrap(),
            "127.0.0.2/32",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn helper");
    let mut line = String::new();
    BufReader::new(cordon.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let root = Path::new(ROOT);
    let entered = |s: &SharedState| {
        (
            s.watched.iter().any(|(c, _)| *c == cg.id()),
            s.lost.contains(&cg.id()),
            s.ring_owners.iter().any(|(_, c)| *c == cg.id()),
            s.egress_owners.iter().any(|(_, c)| *c == cg.id()),
        )
    };
    // Negative control: while the process lives, cleaning leaves everything.
    cleanup_stale(root).unwrap();
    assert_eq!(entered(&state(root)), (true, true, true, true));

    cordon.kill().unwrap(); // SIGKILL
    cordon.wait().unwrap();
    // The entries outlive the process until the next start cleans them.
    assert_eq!(entered(&state(root)), (true, true, true, true));
    let found = cleanup_stale(root).unwrap();
    let mine = found
        .iter()
        .find(|s| s.run_id == run_id)
        .expect("run found");
    // The observer's part is gone at once; the egress part stays, in force, with its cgroup.
    assert!(!mine.removed, "{mine:?}");
    assert_eq!(entered(&state(root)), (false, false, false, true));
    assert!(
        !cordon_bpf::bpffs::run_dir(root, &run_id)
            .join("observer")
            .exists()
    );
    assert_eq!(tcp_from(&cg.path, refused.addr).1, EPERM);
    // A new observer of that cgroup can start.
    let o = ObserverGuard(Some(
        Observer::attach(&unique("after"), &cg.path).expect("observer after cleanup"),
    ));
    drop(o);

    // Once the cgroup is gone, its slot is freed and the pins removed.
    let cg_id = cg.id();
    drop(cg);
    let start = Instant::now();
    loop {
        let found = cleanup_stale(root).unwrap();
        match found.iter().find(|s| s.run_id == run_id) {
            None => break,
            Some(s) if s.removed => break,
            Some(s) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "never stale: {s:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let s = state(root);
    assert!(!s.egress_owners.iter().any(|(_, c)| *c == cg_id), "{s:?}");
    assert!(!cordon_bpf::bpffs::run_dir(root, &run_id).exists());
}

#[test]
fn a_detached_link_to_a_shared_program_fails_only_its_run() {
    if !privileged("a_detached_link_to_a_shared_program_fails_only_its_run") {
        return;
    }
    let (a, b) = (TestCgroup::new(), TestCgroup::new());
    let mut ra = Run::attach(&a, &[allow("127.0.0.2/32", None)]);
    let mut rb = Run::attach(&b, &[allow("127.0.0.2/32", None)]);
    // Another root process opens run A's link to the shared skb_egress program by id and
    // detaches it.
    let pin = ra.egress.get().pin_dir().join("skb_egress");
    let id = sys::cgroup_link_info(sys::obj_get(&pin).unwrap().as_fd())
        .unwrap()
        .link_id;
    let fd = sys::link_by_id(id).unwrap();
    sys::link_detach(fd.as_fd()).unwrap();
    let v = ra.egress.get().verify_attached();
    assert_eq!(v.state, VerifyState::VerificationFailed);
    assert!(
        v.problems
            .iter()
            .any(|p| p.starts_with("skb_egress: program")),
        "{:?}",
        v.problems
    );
    assert!(
        v.problems.iter().all(|p| p.starts_with("skb_egress")),
        "{:?}",
        v.problems
    );
    // The same program still runs for B, whose own link is untouched.
    let v = rb.verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    ra.release();
    rb.release();
}

#[test]
fn a_removed_shared_exec_link_fails_verification_and_is_replaced_once_idle() {
    if !privileged("a_removed_shared_exec_link_fails_verification_and_is_replaced_once_idle") {
        return;
    }
    let fs = FreshBpffs::new();
    let cg = TestCgroup::new();
    let mut obs = ObserverGuard(Some(
        Observer::attach_at(&fs.root, &unique("exec-link"), &cg.path).expect("attach observer"),
    ));
    let v = obs.get().verify_attached();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    let old_link = obs.get().link_id();

    // Another root process removes the pinned shared link behind cordon's back.
    let gen_dir = shared::generation_dir(&fs.root);
    std::fs::remove_file(gen_dir.join(shared::EXEC_LINK)).unwrap();
    let v = obs.get().verify_attached();
    assert_eq!(v.state, VerifyState::VerificationFailed);
    assert!(
        v.problems.iter().any(|p| p.starts_with("on_exec:")),
        "{:?}",
        v.problems
    );
    // The observer's own reference keeps the program attached: its events still arrive.
    let pid = exec_true(&cg.path, "after-unpin");
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < Duration::from_secs(3) && !seen.iter().any(|e: &Event| e.pid() == pid) {
        seen.extend(obs.get().poll(Duration::from_millis(50)).unwrap());
    }
    assert!(seen.iter().any(|e| e.pid() == pid), "{seen:?}");

    // While the damaged objects are in use, a new run is refused rather than attached to them.
    let other = TestCgroup::new();
    match Observer::attach_at(&fs.root, &unique("refused"), &other.path) {
        Err(ObserverError::Shared(SharedError::DamagedInUse { why, .. })) => {
            assert!(why.contains(shared::EXEC_LINK), "{why}")
        }
        r => panic!("attached to damaged shared objects: {r:?}"),
    }
    drop(obs);
    // Idle, they are replaced: the next run loads new ones, and verifies.
    let mut obs = ObserverGuard(Some(
        Observer::attach_at(&fs.root, &unique("repaired"), &other.path).expect("attach"),
    ));
    assert_ne!(obs.get().link_id(), old_link);
    let v = obs.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
}

/// Loads a program of type `BPF_PROG_TYPE_CGROUP_SOCK_ADDR` for `connect4`, named `connect4`,
/// that refers to `maps` and allows everything: a look-alike of the shared one.
fn lookalike_connect4(maps: &[&sys::RawMap]) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut insns: Vec<u64> = Vec::new();
    let insn = |code: u8, regs: u8, off: i16, imm: i32| {
        u64::from(code)
            | (u64::from(regs) << 8)
            | (u64::from(off as u16) << 16)
            | (u64::from(imm as u32) << 32)
    };
    for m in maps {
        // r1 = map (ld_imm64, BPF_PSEUDO_MAP_FD)
        insns.push(insn(0x18, 0x11, 0, m.as_fd().as_raw_fd()));
        insns.push(0);
    }
    insns.push(insn(0xb7, 0, 0, 1)); // r0 = 1
    insns.push(insn(0x95, 0, 0, 0)); // exit
    let license = c"GPL";
    let mut attr = [0u8; 128];
    let put32 =
        |a: &mut [u8; 128], off: usize, v: u32| a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    let put64 =
        |a: &mut [u8; 128], off: usize, v: u64| a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    put32(&mut attr, 0, 18); // BPF_PROG_TYPE_CGROUP_SOCK_ADDR
    put32(&mut attr, 4, u32::try_from(insns.len()).unwrap());
    put64(&mut attr, 8, insns.as_ptr() as u64);
    put64(&mut attr, 16, license.as_ptr() as u64);
    attr[48..56].copy_from_slice(b"connect4");
    put32(&mut attr, 68, 10); // BPF_CGROUP_INET4_CONNECT
    // SAFETY: `attr` is BPF_PROG_LOAD's struct (zeroed past expected_attach_type); `insns` and
    // `license` are alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_mut_ptr(), attr.len()) };
    assert!(
        fd >= 0,
        "BPF_PROG_LOAD: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor owned by nobody else.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(i32::try_from(fd).unwrap()) }
}

#[test]
fn a_lookalike_pinned_in_place_of_a_shared_program_is_refused() {
    if !privileged("a_lookalike_pinned_in_place_of_a_shared_program_is_refused") {
        return;
    }
    let fs = FreshBpffs::new();
    let (a, b) = (TestCgroup::new(), TestCgroup::new());
    // A live run holds the shared objects.
    let obs = ObserverGuard(Some(
        Observer::attach_at(&fs.root, &unique("holder"), &a.path).expect("attach observer"),
    ));
    let gen_dir = shared::generation_dir(&fs.root);
    let genuine = sys::prog_info(sys::obj_get(&gen_dir.join("connect4")).unwrap().as_fd()).unwrap();
    // A program that allows everything, with the same name and type, using the same maps (so
    // the map checks pass), pinned where the shared connect4 was.
    let maps: Vec<sys::RawMap> = [shared::RUN_OF, shared::OUTER[2], shared::WATCHED]
        .iter()
        .map(|n| sys::RawMap::open(&gen_dir.join(n)).unwrap())
        .collect();
    let fake = lookalike_connect4(&maps.iter().collect::<Vec<_>>());
    let info = sys::prog_info(fake.as_fd()).unwrap();
    assert_eq!(
        (info.name.as_str(), info.prog_type),
        ("connect4", genuine.prog_type)
    );
    std::fs::remove_file(gen_dir.join("connect4")).unwrap();
    sys::obj_pin(fake.as_fd(), &gen_dir.join("connect4")).unwrap();

    // Egress control refuses to attach it (the objects are in use: they cannot be replaced).
    match Egress::attach_at(
        &fs.root,
        &unique("refused"),
        &b.path,
        &[allow("127.0.0.2/32", None)],
        None,
    ) {
        Err(EgressError::Shared(SharedError::DamagedInUse { why, .. })) => {
            assert!(why.contains("connect4") && why.contains("tag"), "{why}")
        }
        r => panic!("attached a look-alike: {r:?}"),
    }
    assert!(
        sys::effective_programs(&b.path, sys::AttachPoint::Connect4)
            .unwrap()
            .is_empty()
    );
    // Once idle, the objects are replaced by this build's, and the next run gets those.
    drop(obs);
    let mut eg = EgressGuard(Some(
        Egress::attach_at(
            &fs.root,
            &unique("replaced"),
            &b.path,
            &[allow("127.0.0.2/32", None)],
            None,
        )
        .expect("attach egress"),
    ));
    let connect4 = eg
        .get()
        .program_ids()
        .into_iter()
        .find(|(n, _)| *n == "connect4")
        .unwrap()
        .1;
    assert_ne!(connect4, info.id);
    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
}

#[test]
fn an_older_builds_shared_objects_are_replaced_when_idle() {
    if !privileged("an_older_builds_shared_objects_are_replaced_when_idle") {
        return;
    }
    let fs = FreshBpffs::new();
    let shared_dir = shared::shared_dir(&fs.root);
    std::fs::create_dir_all(&shared_dir).unwrap();
    // Two generations of an older build: an exec program attached and pinned in each.
    let old_link = |name: &str| {
        let dir = shared_dir.join(name);
        std::fs::create_dir(&dir).unwrap();
        let mut bpf = aya::Ebpf::load(cordon_bpf::OBSERVE_OBJECT).unwrap();
        let prog: &mut aya::programs::RawTracePoint =
            bpf.program_mut("on_exec").unwrap().try_into().unwrap();
        prog.load().unwrap();
        let id = prog.attach(shared::EXEC_TRACEPOINT).unwrap();
        let link: aya::programs::links::FdLink = prog.take_link(id).unwrap().into();
        let link_id = link.info().unwrap().id();
        link.pin(dir.join(shared::EXEC_LINK)).unwrap();
        (dir, link_id)
    };
    let (idle_dir, idle_link) = old_link("00000000000000aa");
    let (busy_dir, busy_link) = old_link("00000000000000bb");
    // A live process of that build still uses the second one.
    let busy = std::fs::File::open(&busy_dir).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&busy);
    // SAFETY: flock on a descriptor owned here; no pointers.
    let locked = unsafe { libc::flock(fd, libc::LOCK_SH) };
    assert_eq!(locked, 0);

    let cg = TestCgroup::new();
    let mut obs = ObserverGuard(Some(
        Observer::attach_at(&fs.root, &unique("new-build"), &cg.path).expect("attach observer"),
    ));
    let v = obs.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    // This build's objects are in place, the idle older ones gone — pins and program.
    assert!(shared::generation_dir(&fs.root).exists());
    assert!(!idle_dir.exists());
    assert_eq!(
        sys::link_by_id(idle_link)
            .map_err(|e| e.raw_os_error())
            .err(),
        Some(Some(libc::ENOENT))
    );
    // The one in use stays, running, until its process is done with it.
    assert!(busy_dir.exists());
    assert!(sys::link_by_id(busy_link).is_ok());
    drop(busy);
    let retired = shared::retire_idle(&fs.root).unwrap();
    assert!(
        retired
            .iter()
            .any(|r| r.name == "00000000000000bb" && r.removed),
        "{retired:?}"
    );
    assert!(!busy_dir.exists());
    assert_eq!(
        sys::link_by_id(busy_link)
            .map_err(|e| e.raw_os_error())
            .err(),
        Some(Some(libc::ENOENT))
    );
    // This build's objects stay.
    assert!(shared::generation_dir(&fs.root).exists());
    let v = obs.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
}

#[test]
fn concurrent_first_starts_load_the_shared_objects_once() {
    if !privileged("concurrent_first_starts_load_the_shared_objects_once") {
        return;
    }
    let fs = FreshBpffs::new();
    let cgs: Vec<TestCgroup> = (0..4).map(|_| TestCgroup::new()).collect();
    let root = fs.root.clone();
    let mut runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = cgs
            .iter()
            .map(|cg| {
                let root = root.clone();
                s.spawn(move || Run::attach_at(&root, cg, &[allow("127.0.0.2/32", None)]))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let entries: Vec<_> = std::fs::read_dir(shared::shared_dir(&fs.root))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, [shared::generation_name()]);
    let s = state(&fs.root);
    for r in &mut runs {
        assert_eq!(r.observer.get().link_id(), Some(s.exec_link.0));
        assert_eq!(r.egress.get().program_ids(), s.egress_progs);
        let v = r.verify();
        assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    }
    let mut slots: Vec<u32> = runs.iter_mut().map(|r| r.egress.get().slot()).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 4);
    for r in runs {
        r.release();
    }
    let s = state(&fs.root);
    assert!(s.watched.is_empty() && s.ring_owners.is_empty() && s.egress_owners.is_empty());
    // The slots stay made, for the next runs.
    assert!(s.ring_slots >= 4 && s.egress_slots >= 4, "{s:?}");
}

#[test]
fn a_slot_reused_by_a_later_run_starts_clean() {
    if !privileged("a_slot_reused_by_a_later_run_starts_clean") {
        return;
    }
    let fs = FreshBpffs::new();
    let allowed = TcpServer::start("127.0.0.2");
    let (a, b) = (TestCgroup::new(), TestCgroup::new());
    // Run A allows 127.0.0.2, is blocked, makes events, and ends without reading them.
    let mut ra = Run::attach_at(&fs.root, &a, &[allow("127.0.0.2/32", None)]);
    let slots = (ra.observer.get().slot(), ra.egress.get().slot());
    exec_true(&a.path, "left-behind");
    ra.egress.get().block_all().unwrap();
    ra.release();
    // Run B gets the same slots: none of A's allowlist, block or events.
    let mut rb = Run::attach_at(&fs.root, &b, &[allow("127.0.0.4/32", None)]);
    assert_eq!((rb.observer.get().slot(), rb.egress.get().slot()), slots);
    assert!(!rb.egress.get().blocked().unwrap());
    assert_eq!(rb.egress.get().tries().v4.len(), 1);
    assert_eq!(
        rb.egress.get().read_tries().unwrap(),
        *rb.egress.get().tries()
    );
    assert_eq!(tcp_from(&b.path, allowed.addr).1, EPERM);
    assert_eq!(rb.egress.get().stats().unwrap().connect_refused, 1);
    let pid = exec_true(&b.path, "mine");
    let ev = rb.collect_until(Duration::from_secs(3), |ev| {
        ev.iter().any(|e| e.pid() == pid)
    });
    assert!(
        ev.iter().all(|e| match e {
            Event::Exec(x) => x.cgroup_id == b.id(),
            Event::Connect(c) => c.cgroup_id == b.id(),
        }),
        "{ev:?}"
    );
    assert!(ev.iter().any(|e| e.pid() == pid));
    let v = rb.verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    rb.release();
}

#[test]
fn nested_runs_each_apply_their_own_list_and_see_the_inner_events() {
    if !privileged("nested_runs_each_apply_their_own_list_and_see_the_inner_events") {
        return;
    }
    let two = TcpServer::start("127.0.0.2");
    let three = TcpServer::start("127.0.0.3");
    let outer = TestCgroup::new();
    let inner_path = outer.path.join("inner");
    std::fs::create_dir(&inner_path).unwrap();
    let inner = TestCgroup { path: inner_path };
    for (outer_allows_three, inner_allows_three) in [(true, false), (false, true)] {
        let list = |three: bool| {
            let mut l = vec![allow("127.0.0.2/32", None)];
            if three {
                l.push(allow("127.0.0.3/32", None));
            }
            l
        };
        let mut ro = Run::attach(&outer, &list(outer_allows_three));
        let mut ri = Run::attach(&inner, &list(inner_allows_three));
        // Inside the inner run both lists apply: 127.0.0.3 is refused by whichever refuses it.
        assert_eq!(tcp_from(&inner.path, two.addr).1, ProbeResult::Ok);
        assert_eq!(tcp_from(&inner.path, three.addr).1, EPERM);
        // The outer run alone (negative control of the inner list) follows its own.
        let expect = if outer_allows_three {
            ProbeResult::Ok
        } else {
            EPERM
        };
        assert_eq!(tcp_from(&outer.path, three.addr).1, expect);
        // An exec in the inner cgroup is an event of both runs.
        let pid = exec_true(&inner.path, "nested");
        let seen = |r: &mut Run| {
            r.collect_until(Duration::from_secs(3), |ev| {
                ev.iter()
                    .any(|e| matches!(e, Event::Exec(x) if x.pid == pid))
            })
            .iter()
            .any(|e| matches!(e, Event::Exec(x) if x.pid == pid && x.cgroup_id == inner.id()))
        };
        assert!(seen(&mut ro), "the outer run missed the inner exec");
        assert!(seen(&mut ri), "the inner run missed its exec");
        let v = ri.verify().and(ro.verify());
        assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
        ri.release();
        ro.release();
    }
}

#[test]
fn an_observer_released_after_its_filter_entry_was_removed_leaves_nothing() {
    if !privileged("an_observer_released_after_its_filter_entry_was_removed_leaves_nothing") {
        return;
    }
    let cg = TestCgroup::new();
    let obs = Observer::attach(&unique("unfiltered"), &cg.path).expect("attach observer");
    let root = Path::new(ROOT);
    let s = state(root);
    assert!(s.watched.iter().any(|(c, _)| *c == cg.id()));
    assert!(s.lost.contains(&cg.id()));
    // Another root process removes the run's filter entry.
    let watched = sys::RawMap::open(&obs.pin_dir().join(shared::WATCHED)).unwrap();
    assert!(watched.delete(&cg.id().to_ne_bytes()).unwrap());
    obs.release().unwrap();
    let s = state(root);
    assert!(!s.lost.contains(&cg.id()), "{s:?}");
    assert!(!s.ring_owners.iter().any(|(_, c)| *c == cg.id()), "{s:?}");
}
