//! Positive controls (real workloads work inside the boundary), refusals before anything is
//! created, signals, and the evidence each run leaves.

use std::fs;
use std::path::Path;

use crate::support::*;

/// A shell pipeline, a Python script, `git init && git commit` and a C compile-and-run, in a
/// writable workspace under the coding-agent policy shipped in `policies/`.
#[test]
fn real_workloads_run_under_the_coding_agent_policy() {
    if !privileged("real_workloads_run_under_the_coding_agent_policy") {
        return;
    }
    let area = Area::new();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/coding-agent.toml");
    fs::copy(&shipped, area.path("coding-agent.toml")).unwrap();
    let ws = area.workspace("workspace");
    let policy = area.path("coding-agent.toml");
    let policy = policy.to_str().unwrap();
    let git_env = [
        "--env",
        "GIT_AUTHOR_NAME=agent",
        "--env",
        "GIT_AUTHOR_EMAIL=agent@example.invalid",
        "--env",
        "GIT_COMMITTER_NAME=agent",
        "--env",
        "GIT_COMMITTER_EMAIL=agent@example.invalid",
    ];

    let pipeline = area.run(
        &["--policy", policy],
        &[
            "/bin/sh",
            "-c",
            "seq 1 100 | grep 7 | sort -r | head -n 2 | tr '\\n' ' '",
        ],
    );
    assert_eq!(pipeline.ok().trim(), "97 87");

    fs::write(ws.join("script.py"), "import json, sys\nprint(json.dumps({'sum': sum(range(10)), 'cwd': __import__('os').getcwd()}))\n").unwrap();
    let python = area.run(&["--policy", policy], &["python3", "script.py"]);
    let out = python.ok();
    assert!(out.contains("\"sum\": 45"), "{out}");
    assert!(
        out.contains(ws.canonicalize().unwrap().to_str().unwrap()),
        "cwd is the workspace: {out}"
    );

    let mut flags = vec!["--policy", policy];
    flags.extend(git_env);
    let git = area.run(&flags, &["/bin/sh", "-c", "git init -q && echo hi > f && git add f && git commit -qm first && git log --format=%s"]);
    assert_eq!(git.ok().trim(), "first");
    assert!(ws.join(".git/HEAD").exists());

    fs::write(
        ws.join("hello.c"),
        "#include <stdio.h>\nint main(void){puts(\"compiled and ran\");return 0;}\n",
    )
    .unwrap();
    let cc = area.run(
        &["--policy", policy],
        &["/bin/sh", "-c", "cc -O1 -o hello hello.c && ./hello"],
    );
    assert_eq!(cc.ok().trim(), "compiled and ran");
}

/// Bad input is refused before anything starts: exit 125, one line, and nothing created. The
/// ledger is opened before the backend exists, and the run's cgroup is created only after the
/// ledger records the run's start: no ledger, then, means nothing of the run was created.
#[test]
fn bad_input_is_refused_before_anything_is_created() {
    let area = Area::new();
    let cases: &[(&[&str], &[&str], &str)] = &[
        (&[], &[], "COMMAND"),
        (
            &["--read", "/does/not/exist"],
            &["/bin/true"],
            "/does/not/exist",
        ),
        (
            &["--policy", "/does/not/exist.toml"],
            &["/bin/true"],
            "exist.toml",
        ),
        (&["--memory", "12Q"], &["/bin/true"], "12Q"),
        (&["--timeout", "-3s"], &["/bin/true"], "-3s"),
        (&["--pids", "lots"], &["/bin/true"], "lots"),
        (&["--net", "allow:0.0.0.0/0"], &["/bin/true"], "0.0.0.0/0"),
        (&["--write", "/"], &["/bin/true"], "writable /"),
        (&["--env", "1X=y"], &["/bin/true"], "1X"),
        (&["--read", "/proc"], &["/bin/true"], "/proc"),
    ];
    for (flags, cmd, mention) in cases {
        let r = if cmd.is_empty() {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
                .arg("run")
                .arg("--ledger")
                .arg(area.path("ledger"))
                .output()
                .unwrap();
            Run {
                out,
                report: serde_json::Value::Null,
            }
        } else {
            area.run(flags, cmd)
        };
        assert_eq!(r.code(), 125, "{flags:?}: {}", r.explain());
        assert!(
            r.stderr().contains(mention),
            "{flags:?} must mention {mention}: {}",
            r.stderr()
        );
        assert!(!r.stderr().contains("panicked"), "{}", r.stderr());
        assert!(
            !area.path("ledger").exists(),
            "{flags:?} created the ledger"
        );
    }
    // An unreadable policy (a directory) and a policy with an error.
    fs::write(area.path("bad.toml"), "[filesystem]\nwirte = [\"/tmp\"]\n").unwrap();
    let r = area.run(
        &["--policy", area.path("bad.toml").to_str().unwrap()],
        &["/bin/true"],
    );
    assert_eq!(r.code(), 125, "{}", r.explain());
    assert!(r.stderr().contains("wirte"), "{}", r.stderr());
    assert!(
        !area.path("ledger").exists(),
        "an invalid policy created the ledger"
    );
}

/// Exit status: the command's own when allowed, 128+N for a signal, 126/127 for exec failures.
#[test]
fn exit_status_follows_the_contract() {
    if !privileged("exit_status_follows_the_contract") {
        return;
    }
    let area = Area::new();
    assert_eq!(area.run(&[], &["/bin/sh", "-c", "exit 42"]).code(), 42);
    let r = area.run(&[], &["/bin/sh", "-c", "kill -TERM $$"]);
    assert_eq!(r.code(), 128 + 15, "{}", r.explain());
    assert_eq!(r.signal(), Some(15));
    let r = area.run(&[], &["no-such-command-anywhere"]);
    assert_eq!(r.code(), 127, "{}", r.explain());
    assert_eq!(r.verdict(), "FAILED");
    let r = area.run(&[], &["/etc/ld.so.cache"]);
    assert_eq!(r.code(), 126, "{}", r.explain());
}

/// Ctrl-C (SIGINT to cordon) reaches the command.
#[test]
fn signals_to_cordon_reach_the_command() {
    if !privileged("signals_to_cordon_reach_the_command") {
        return;
    }
    let area = Area::new();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger"])
        .arg(area.path("ledger"))
        .args([
            "--",
            "/bin/sh",
            "-c",
            "trap 'echo GOT-INT; exit 3' INT; while :; do sleep 0.05; done",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the command is running (its sleep appears), then interrupt cordon.
    for _ in 0..200 {
        if fs::read_dir("/sys/fs/cgroup/unified/cordon")
            .map(|d| d.count() > 0)
            .unwrap_or(false)
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(stdout(&out).contains("GOT-INT"));
}

/// Each run is in the ledger (start and end, with the spec's hash, every mechanism's state and
/// the verdict), the report points at its last entry, and the ledger verifies.
#[test]
fn every_run_is_recorded_in_the_ledger() {
    if !privileged("every_run_is_recorded_in_the_ledger") {
        return;
    }
    let area = Area::new();
    let r = area.run(&["--timeout", "1s"], &["/bin/sleep", "5"]);
    assert_eq!(r.verdict(), "KILLED");
    let ledger = fs::read_to_string(area.path("ledger/ledger.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = ledger
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = entries.last().unwrap();
    assert_eq!(end["kind"], "run.end");
    assert_eq!(end["data"]["verdict"], "KILLED");
    assert_eq!(end["data"]["reasons"][0], "killed: timeout");
    assert_eq!(end["data"]["run_id"], r.report["run_id"]);
    assert_eq!(r.report["ledger"]["seq"], end["seq"]);
    assert_eq!(r.report["ledger"]["head"], end["hash"]);
    let start_at = entries
        .iter()
        .rposition(|e| e["kind"] == "run.start")
        .unwrap();
    let start = &entries[start_at];
    assert_eq!(start["data"]["spec_hash"], r.report["spec_hash"]);
    // Between start and end: what the kernel saw the run do, never what it said about itself.
    let execs: Vec<&serde_json::Value> = entries[start_at..]
        .iter()
        .filter(|e| e["kind"] == "host.exec" && e["data"]["probe"] == false)
        .collect();
    assert!(
        execs.iter().any(|e| e["data"]["path"] == "/bin/sleep"),
        "no host-observed exec of /bin/sleep between the run's start and end: {execs:?}"
    );
    let providers: Vec<&str> = end["data"]["enforcement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["provider"].as_str().unwrap())
        .collect();
    for p in [
        "namespaces",
        "mounts",
        "capabilities",
        "no_new_privs",
        "landlock",
        "seccomp",
        "cgroup",
    ] {
        assert!(providers.contains(&p), "{p} missing from {providers:?}");
    }
    let verify = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["ledger", "verify"])
        .arg(area.path("ledger"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
}

/// Started by an ordinary user, cordon refuses (the cgroup is missing) unless told to run
/// degraded, and then says so in the report.
#[test]
fn unprivileged_runs_are_refused_or_marked_degraded() {
    if !privileged("unprivileged_runs_are_refused_or_marked_degraded") {
        return;
    }
    let area = Area::new();
    let ledger = area.workspace("ledger-nobody");
    let report = area.workspace("reports").join("r.json");
    let base = |extra: &[&str]| {
        let mut c = std::process::Command::new("/usr/bin/setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_cordon"))
            .args(["run", "--ledger"])
            .arg(&ledger)
            .arg("--report")
            .arg(&report)
            .args(extra)
            .args([
                "--",
                "/bin/sh",
                "-c",
                "id -u; grep NoNewPrivs /proc/self/status",
            ])
            .env("HOME", "/tmp");
        c.output().unwrap()
    };
    let refused = base(&[]);
    assert_eq!(refused.status.code(), Some(125), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("cgroup"),
        "{refused:?}"
    );
    let degraded = base(&["--allow-degraded"]);
    assert_eq!(degraded.status.code(), Some(0), "{degraded:?}");
    let out = stdout(&degraded);
    assert!(
        out.contains("1000") && out.contains("NoNewPrivs:\t1"),
        "{out}"
    );
    let rep: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&report).unwrap()).unwrap();
    let cgroup = rep["enforcement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["provider"] == "cgroup")
        .unwrap();
    assert_eq!(cgroup["state"], "NOT_CONFIGURED");
    assert_eq!(rep["teardown"]["verified_empty"], true, "{rep}");
}

/// A grant through a symlink that others can replace is refused: whoever controls the link
/// (another run with a writable grant, another user) would decide what this run is given.
/// Negative control: the same link in a directory only root can change is followed.
#[test]
fn grants_through_replaceable_symlinks_are_refused() {
    if !privileged("grants_through_replaceable_symlinks_are_refused") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let area = Area::new();
    let target = area.path("target");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("f"), "through the link\n").unwrap();
    let trusted = area.path("trusted");
    fs::create_dir(&trusted).unwrap();
    fs::set_permissions(&trusted, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&target, trusted.join("link")).unwrap();
    let open_dir = area.workspace("shared");
    std::os::unix::fs::symlink(&target, open_dir.join("link")).unwrap();

    let via = |dir: &Path| dir.join("link").display().to_string();
    let cat = |dir: &Path| format!("{}/f", via(dir));
    let ok = area.run(&["--read", &via(&trusted)], &["/bin/cat", &cat(&trusted)]);
    assert_eq!(ok.ok(), "through the link\n");
    let r = area.run(&["--read", &via(&open_dir)], &["/bin/cat", &cat(&open_dir)]);
    assert_eq!(r.code(), 125, "{}", r.explain());
    assert!(
        r.stderr().contains("goes through the symlink"),
        "{}",
        r.stderr()
    );
}

/// A grant replaced between the check and the mount is refused, not followed: the launcher
/// binds a path only if it is still the file the spec named (device and inode) and is reached
/// without a symlink. Negative control: the same plan launches while the path is unchanged.
#[test]
fn a_grant_replaced_after_the_check_is_refused() {
    if !privileged("a_grant_replaced_after_the_check_is_refused") {
        return;
    }
    use cordon_runtime::{RunSpec, Verdict};
    let area = Area::new();
    let grant = area.path("grant");
    fs::create_dir(&grant).unwrap();
    fs::write(grant.join("f"), "the checked one\n").unwrap();
    let spec = RunSpec {
        command: vec!["/bin/cat".into(), grant.join("f").display().to_string()],
        read: vec!["/usr".into(), grant.clone()],
        base_dir: area.path(""),
        caller: (0, 0),
        ..RunSpec::default()
    };
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cordon"));
    let plan = spec.validate("r-replaced-ok").unwrap();
    let mut backend = cordon_sandbox::LinuxBackend::new(exe.clone());
    let report = cordon_runtime::execute(&plan, &mut backend, &mut Memory);
    assert_eq!(report.verdict, Verdict::Allowed, "{:?}", report.reasons);

    let plan = spec.validate("r-replaced-no").unwrap();
    fs::rename(&grant, area.path("moved")).unwrap();
    fs::create_dir(&grant).unwrap();
    fs::write(grant.join("f"), "a substitute\n").unwrap();
    let mut backend = cordon_sandbox::LinuxBackend::new(exe);
    let report = cordon_runtime::execute(&plan, &mut backend, &mut Memory);
    assert_eq!(report.verdict, Verdict::Failed, "{:?}", report);
    assert!(
        report.reasons.iter().any(|r| r.contains("replaced since")),
        "{:?}",
        report.reasons
    );
}

/// The tree's sources are reached with the command's identity (the plan's host uid, no
/// supplementary groups), not root's, however the tree is built: ahead, on a thread of the
/// launcher's (`cordon run` as root, with or without a network), or by init (a launcher in a
/// process with threads of its own, this test's, executes init rather than forking it). A grant
/// below a directory only root may search is refused (exit 125, naming the mounts); a private
/// workspace of the command's own is bound. Negative control: root on the host reads the file
/// the refused grant holds.
#[test]
fn grants_are_reached_with_the_commands_identity_however_the_tree_is_built() {
    if !privileged("grants_are_reached_with_the_commands_identity_however_the_tree_is_built") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let area = Area::new();
    let locked = area.path("root-only");
    fs::create_dir(&locked).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o700)).unwrap();
    let grant = locked.join("grant");
    fs::create_dir(&grant).unwrap();
    fs::set_permissions(&grant, fs::Permissions::from_mode(0o755)).unwrap();
    let hidden = grant.join("f");
    fs::write(&hidden, "behind a root-only directory\n").unwrap();
    let hidden = hidden.display().to_string();
    let out = host(&["/bin/cat", &hidden]);
    assert!(
        stdout(&out).contains("behind a root-only directory"),
        "control: root reads it on the host"
    );

    let private = area.workspace("private");
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let own = private.join("f");
    fs::write(&own, "the command's own\n").unwrap();
    std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap();
    fs::set_permissions(&own, fs::Permissions::from_mode(0o600)).unwrap();
    let own = own.display().to_string();

    let grant = grant.display().to_string();
    let private = private.display().to_string();
    for net in [&[][..], &["--net", "allow:127.0.0.1/32:9"][..]] {
        let mut flags = vec!["--read", grant.as_str()];
        flags.extend_from_slice(net);
        let r = area.run(&flags, &["/bin/cat", &hidden]);
        assert_eq!(r.code(), 125, "{net:?}: {}", r.explain());
        let err = r.stderr();
        assert!(
            err.contains("mounts") && err.contains("Permission denied"),
            "{net:?}: {err}"
        );

        let mut flags = vec!["--read", private.as_str()];
        flags.extend_from_slice(net);
        let r = area.run(&flags, &["/bin/cat", &own]);
        assert!(
            r.ok().contains("the command's own"),
            "{net:?}: {}",
            r.explain()
        );
    }

    let report = built_by_init(&area, &[&grant], &[], &["/bin/cat", &hidden]);
    assert_eq!(
        report.verdict,
        cordon_runtime::Verdict::Failed,
        "{report:?}"
    );
    assert!(
        report
            .reasons
            .iter()
            .any(|r| r.contains("mounts") && r.contains("Permission denied")),
        "{:?}",
        report.reasons
    );
    let report = built_by_init(&area, &[&private], &[], &["/bin/cat", &own]);
    assert_eq!(
        report.verdict,
        cordon_runtime::Verdict::Allowed,
        "{report:?}"
    );
}

/// A run whose tree init builds: through the library, from this multi-threaded test process,
/// where the launcher executes init instead of forking it (and init builds the tree itself).
fn built_by_init(
    area: &Area,
    read: &[&str],
    write: &[&str],
    command: &[&str],
) -> cordon_runtime::Report {
    let mut paths = vec![std::path::PathBuf::from("/usr")];
    paths.extend(read.iter().map(std::path::PathBuf::from));
    let spec = cordon_runtime::RunSpec {
        command: command.iter().map(|c| (*c).to_owned()).collect(),
        read: paths,
        write: write.iter().map(std::path::PathBuf::from).collect(),
        base_dir: area.path(""),
        caller: (0, 0),
        ..cordon_runtime::RunSpec::default()
    };
    let plan = spec.validate("r-built-by-init").unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cordon"));
    let mut backend = cordon_sandbox::LinuxBackend::new(exe);
    cordon_runtime::execute(&plan, &mut backend, &mut Memory)
}

/// Nothing of the sandbox's tree reaches the host's mount namespace, even when a grant is a
/// shared mount (whose copies would otherwise join its peer group): a grant nested in it is
/// mounted into the copy alone. Negative control: a mount made in a copy of the host's
/// namespace that keeps propagation (`unshare --propagation unchanged`) does appear on the host.
#[test]
fn no_mount_of_the_tree_propagates_to_the_host() {
    if !privileged("no_mount_of_the_tree_propagates_to_the_host") {
        return;
    }
    let area = Area::new();
    let shared = area.path("shared");
    fs::create_dir(&shared).unwrap();
    let sub = area.workspace("shared/sub");
    let (d, s) = (shared.display().to_string(), sub.display().to_string());
    let below = |path: &str| {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(path))
            .count()
    };
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = host(&["/usr/bin/umount", "-l", &self.0]);
        }
    }
    assert!(host(&["/usr/bin/mount", "--bind", &d, &d]).status.success());
    let _bound = Unmount(d.clone());
    assert!(
        host(&["/usr/bin/mount", "--make-shared", &d])
            .status
            .success()
    );

    let ctl = host(&[
        "/usr/bin/unshare",
        "-m",
        "--propagation",
        "unchanged",
        "/usr/bin/mount",
        "-t",
        "tmpfs",
        "control",
        &s,
    ]);
    assert!(ctl.status.success(), "{ctl:?}");
    assert_eq!(below(&s), 1, "control: the mount propagated to the host");
    assert!(host(&["/usr/bin/umount", &s]).status.success());
    assert_eq!(below(&s), 0);

    for net in [&[][..], &["--net", "allow:127.0.0.1/32:9"][..]] {
        let mut flags = vec!["--read", d.as_str(), "--write", s.as_str()];
        flags.extend_from_slice(net);
        let r = area.run(
            &flags,
            &["/bin/sh", "-c", &format!("echo in > {s}/f && cat {s}/f")],
        );
        assert!(r.ok().contains("in"), "{net:?}: {}", r.explain());
        assert_eq!(
            below(&s),
            0,
            "{net:?}: a mount of the tree appeared on the host"
        );
    }
    let write = format!("echo in > {s}/f");
    let report = built_by_init(&area, &[&d], &[&s], &["/bin/sh", "-c", &write]);
    assert_eq!(
        report.verdict,
        cordon_runtime::Verdict::Allowed,
        "{report:?}"
    );
    assert_eq!(below(&s), 0, "init's tree: a mount appeared on the host");
}

/// The command starts with every signal at its default disposition and none blocked, though
/// cordon's own runtime ignores `SIGPIPE` (and the test runner passes others ignored): `yes |
/// head -n 1` ends quietly, `yes` killed by the signal. Negative control: the `cordon` process
/// itself ignores `SIGPIPE` (read from its `/proc/<pid>/status` while it runs).
#[test]
fn the_command_starts_with_default_signal_dispositions() {
    if !privileged("the_command_starts_with_default_signal_dispositions") {
        return;
    }
    let area = Area::new();
    let mut cordon = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger"])
        .arg(area.path("ledger"))
        .args(["--", "/bin/sleep", "5"])
        .spawn()
        .unwrap();
    let sigpipe = 1u64 << (13 - 1);
    let mut ignored = None;
    for _ in 0..200 {
        let status = fs::read_to_string(format!("/proc/{}/status", cordon.id())).unwrap();
        ignored = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap());
        if ignored.is_some_and(|m| m & sigpipe != 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _ = cordon.kill();
    let _ = cordon.wait();
    assert!(ignored.is_some_and(|m| m & sigpipe != 0), "{ignored:?}");

    let r = area.run(
        &[],
        &[
            "/bin/sh",
            "-c",
            "grep -E '^Sig(Ign|Blk)' /proc/self/status; yes | head -n 1; echo \"status ${?}\"",
        ],
    );
    let out = r.ok();
    // No signal is ignored, the real-time ones glibc keeps for itself included (the test
    // runner starts this test with 32 and 33 ignored).
    assert!(out.contains("SigIgn:\t0000000000000000"), "{out}");
    assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
    assert!(out.contains("y\nstatus 0"), "{out}");
    assert!(!r.stderr().contains("Broken pipe"), "{}", r.explain());
}

/// Init is a copy of cordon (no exec) when cordon is single-threaded, as `cordon run` is at the
/// clone; an embedder with other threads gets the `cordon` binary executed as init instead, and
/// the same boundary. Both are asserted on the report's stage names and verdict.
#[test]
fn init_is_forked_or_executed_as_the_launcher_allows() {
    if !privileged("init_is_forked_or_executed_as_the_launcher_allows") {
        return;
    }
    use cordon_runtime::{RunSpec, Verdict};
    let stage = |timings: &serde_json::Value| -> String {
        timings
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t[0].as_str())
            .find(|s| s.starts_with("clone3"))
            .unwrap_or("")
            .to_owned()
    };
    let area = Area::new();
    let r = area.run(&[], &["/bin/true"]);
    r.ok();
    assert_eq!(
        stage(&r.report["timings_us"]),
        "clone3 (init forked), id maps",
        "{}",
        r.explain()
    );

    // A second thread, alive across the launch.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let parked = std::thread::spawn(move || rx.recv());
    let spec = RunSpec {
        command: vec!["/bin/sh".into(), "-c".into(), "exit 7".into()],
        read: vec!["/usr".into()],
        base_dir: area.path(""),
        caller: (0, 0),
        ..RunSpec::default()
    };
    let plan = spec.validate("r-executed-init").unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cordon"));
    let mut backend = cordon_sandbox::LinuxBackend::new(exe);
    let report = cordon_runtime::execute(&plan, &mut backend, &mut Memory);
    tx.send(()).unwrap();
    parked.join().unwrap().unwrap();
    assert_eq!(report.verdict, Verdict::Allowed, "{report:?}");
    assert_eq!(report.exit.code, Some(7));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        stage(&json["timings_us"]),
        "clone3 (init re-executed), id maps",
        "{report:?}"
    );
    for p in &report.enforcement {
        assert_ne!(
            p.state,
            cordon_runtime::EnforcementState::VerificationFailed,
            "{report:?}"
        );
    }
}

/// With no network, the sandbox still has its own loopback, up: a datagram sent to itself on
/// 127.0.0.1 arrives. (That it is not the host's loopback is `reach_the_host_over_loopback`.)
/// Negative control: in a fresh network namespace, loopback is down until brought up.
#[test]
fn loopback_is_up_inside() {
    if !privileged("loopback_is_up_inside") {
        return;
    }
    let probe = py(r#"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
s.sendto(b"ping", s.getsockname())
s.settimeout(2)
print("GOT", s.recv(16).decode())
"#);
    let control = std::process::Command::new("unshare")
        .args(["--net", "--"])
        .args(&probe)
        .output()
        .unwrap();
    let out = stdout(&control);
    assert!(
        out.contains("ERR EADDRNOTAVAIL") || out.contains("ERR ENETUNREACH"),
        "{out}"
    );
    let area = Area::new();
    let r = area.run(&[], &strs(&probe));
    assert!(r.ok().contains("GOT ping"), "{}", r.explain());
}

/// `cordon run` leaves taking its address space down to a keeper (`cordon_sandbox::keeper`), a
/// process sharing that address space which outlives cordon by a moment. It must hold nothing
/// of cordon's but the memory (no descriptor but its pipe, every signal blocked, the idle
/// scheduling class) and end once cordon has, however cordon ends. The check that it shares
/// cordon's address space (`kcmp`) has its negative control: the test's own process does not.
#[test]
fn the_address_space_keeper_holds_nothing_and_ends_with_cordon() {
    if !privileged("the_address_space_keeper_holds_nothing_and_ends_with_cordon") {
        return;
    }
    let area = Area::new();
    for how in ["exits", "is killed"] {
        let mut cordon = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["run", "--ledger"])
            .arg(area.path("ledger"))
            .args(["--", "/bin/sleep", "30"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let parent = cordon.id() as i32;
        let keeper = wait_for(|| children_named(parent, "cordon-keeper").pop())
            .expect("cordon started no keeper");

        let same_vm = |a: i32, b: i32| {
            // SAFETY: kcmp takes integers; as root both processes may be inspected.
            unsafe {
                libc::syscall(libc::SYS_kcmp, a, b, 1 /* KCMP_VM */, 0, 0)
            }
        };
        assert_eq!(
            same_vm(parent, keeper),
            0,
            "the keeper shares cordon's memory"
        );
        assert_ne!(
            same_vm(std::process::id() as i32, keeper),
            0,
            "control: another process's memory is not the keeper's"
        );
        let fds: Vec<String> = fs::read_dir(format!("/proc/{keeper}/fd"))
            .unwrap()
            .flatten()
            .map(|e| fs::read_link(e.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(fds.len(), 1, "the keeper holds its pipe alone: {fds:?}");
        assert!(fds[0].starts_with("pipe:"), "{fds:?}");
        let status = fs::read_to_string(format!("/proc/{keeper}/status")).unwrap();
        // Every signal but SIGKILL and SIGSTOP, which cannot be blocked.
        assert!(status.contains("SigBlk:\tfffffffffffbfeff\n"), "{status}");
        assert_eq!(stat_field(keeper, 41), Some(5), "SCHED_IDLE");

        if how == "is killed" {
            cordon.kill().unwrap();
        } else {
            // sleep 30 is cut short from the outside: cordon forwards SIGTERM to it and ends.
            // SAFETY: kill(2) on our own child, which is alive.
            unsafe { libc::kill(parent, libc::SIGTERM) };
        }
        cordon.wait().unwrap();
        assert!(
            wait_for(|| (!alive(keeper)).then_some(())).is_some(),
            "the keeper outlived cordon (which {how}): {:?}",
            fs::read_to_string(format!("/proc/{keeper}/status"))
        );
    }
}

/// Polls `f` for up to 10 s.
fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..1000 {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

/// Field `n` (1-based, as in proc(5)) of `/proc/<pid>/stat`, as a number.
fn stat_field(pid: i32, n: usize) -> Option<i64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (field 2, in parentheses) start with field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n - 3)?.parse().ok()
}

/// Whether `pid` runs: not gone, not a zombie waiting to be reaped.
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_owned()))
        .is_some_and(|r| !r.starts_with('Z') && !r.starts_with('X'))
}

/// The children of `parent` whose `comm` is `name`.
fn children_named(parent: i32, name: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            stat_field(pid, 4) == Some(i64::from(parent))
                && fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == name)
        })
        .collect()
}

/// As root a run's keeper leaves an empty network, IPC and UTS namespace set in the pool for
/// the next run (`cordon_sandbox::pool`), which claims it, checks it and says so in its report.
/// A set tampered with in the pool (loopback brought down inside) is refused: that run makes
/// its own namespaces and the set is gone. The untampered set being used is the control. The
/// pool is one of the test's own (`CORDON_NETNS_POOL`), so that no other test's run takes a
/// set from it.
#[test]
fn the_next_run_takes_checked_namespaces_from_the_pool() {
    if !privileged("the_next_run_takes_checked_namespaces_from_the_pool") {
        return;
    }
    let area = Area::new();
    let pool = TestPool(std::path::PathBuf::from(format!(
        "/run/cordon-test-pool-{}",
        std::process::id()
    )));
    let run = || {
        area.run_with(&[], &["/bin/true"], |c| {
            c.env("CORDON_NETNS_POOL", &pool.0);
        })
    };
    let detail = |r: &Run| -> String {
        r.report["enforcement"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["provider"] == "namespaces")
            .map(|p| p["detail"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    // A set in a slot once the keeper of the run before has ended.
    let slot = || pool.slots().find(|p| p.join("ns/net").exists());
    let wait_for_set = || {
        for _ in 0..1000 {
            if let Some(s) = slot() {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("no set was left in {}", pool.0.display());
    };

    let first = run();
    first.ok();
    assert!(!detail(&first).contains("pool"), "{}", detail(&first));
    wait_for_set();
    let second = run();
    second.ok();
    assert!(
        detail(&second).contains("left in the pool by an earlier run, checked empty"),
        "{}",
        detail(&second)
    );

    // Loopback down inside the set the last run left.
    let set = wait_for_set();
    let down = std::process::Command::new("nsenter")
        .arg(format!("--net={}", set.join("ns/net").display()))
        .args(["ip", "link", "set", "lo", "down"])
        .status()
        .unwrap();
    assert!(down.success());
    // Both slots hold a set at most; take any other out of the way so the tampered one is the
    // one found.
    for other in pool.slots().filter(|other| *other != set) {
        TestPool::unpin(&other);
    }
    let third = run();
    third.ok();
    assert!(!detail(&third).contains("pool"), "{}", detail(&third));

    // The refused set is taken out of the pool and unpinned. Its slot's name is not evidence
    // (the third run's keeper may already have put a new set under it), so once that keeper
    // has refilled the pool: every set there has loopback up, and no claimed set is left.
    wait_for_set();
    for slot in pool.slots() {
        let net = slot.join("ns/net");
        if !net.exists() {
            continue;
        }
        let lo = std::process::Command::new("nsenter")
            .arg(format!("--net={}", net.display()))
            .args(["ip", "-o", "link", "show", "lo"])
            .output()
            .unwrap();
        let lo = String::from_utf8_lossy(&lo.stdout);
        assert!(
            lo.contains(",UP"),
            "the refused set is taken out of the pool: {lo}"
        );
    }
    let claims: Vec<_> = fs::read_dir(&pool.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("claim-"))
        .collect();
    assert!(claims.is_empty(), "the refused set is unpinned: {claims:?}");
}

/// A namespace pool of a test's own: whatever sets are left in it are unpinned and it is
/// removed when it is dropped, a failed assertion's unwinding included.
struct TestPool(std::path::PathBuf);

impl TestPool {
    /// The pool's two slots (`cordon_sandbox::pool`), whether they hold a set or not.
    fn slots(&self) -> impl Iterator<Item = std::path::PathBuf> + '_ {
        (0..2).map(|i| self.0.join(i.to_string()))
    }

    /// Unpins the set in `dir`, if it holds one, and removes it.
    fn unpin(dir: &Path) {
        if !dir.exists() {
            return;
        }
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(dir.join("ns"))
            .status();
        let _ = fs::remove_dir_all(dir);
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        for e in fs::read_dir(&self.0).into_iter().flatten().flatten() {
            TestPool::unpin(&e.path());
        }
        let _ = fs::remove_dir(&self.0);
    }
}
