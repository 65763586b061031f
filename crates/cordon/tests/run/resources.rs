//! Resource attacks and lifetime: fork bomb, memory bomb, outliving the timeout, leaving a
//! daemon behind. Each negative control runs under a safety net of its own (a cgroup with
//! limits and a kill), never unbounded on the host.

use crate::support::*;

const FORK_BOMB: &str = "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n    except OSError:\n        time.sleep(0.01)\n";

#[test]
fn fork_bomb_is_killed_by_the_pids_limit() {
    if !privileged("fork_bomb_is_killed_by_the_pids_limit") {
        return;
    }
    // Negative control: the bomb, held only by the safety net, forks until the net stops it.
    let net = SafetyNet::new(&format!("forkbomb-{}", std::process::id()), 256 << 20, 64);
    net.run(&[PY, "-c", FORK_BOMB], 3);
    assert!(
        net.pids_max_hits() > 0,
        "the fork bomb never reached the safety net's limit"
    );
    drop(net);

    let area = Area::new();
    let r = area.run(
        &["--pids", "32", "--timeout", "60s"],
        &[PY, "-c", FORK_BOMB],
    );
    assert_eq!(r.code(), 137, "{}", r.explain());
    assert_eq!(r.verdict(), "KILLED");
    assert_eq!(r.report["reasons"][0], "killed: pids", "{}", r.explain());
    assert_eq!(
        r.report["teardown"]["verified_empty"],
        true,
        "{}",
        r.explain()
    );
}

#[test]
fn memory_bomb_is_killed_by_the_memory_limit() {
    if !privileged("memory_bomb_is_killed_by_the_memory_limit") {
        return;
    }
    let bomb = "b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ALLOCATED')";
    // Negative control under a 512 MiB net: the allocation succeeds.
    let net = SafetyNet::new(&format!("membomb-{}", std::process::id()), 512 << 20, 64);
    let out = net.run(&[PY, "-c", bomb], 20);
    assert!(stdout(&out).contains("ALLOCATED"), "control: {out:?}");
    drop(net);

    let area = Area::new();
    let r = area.run(&["--memory", "64M"], &[PY, "-c", bomb]);
    assert_eq!(r.code(), 137, "{}", r.explain());
    assert_eq!(r.verdict(), "KILLED");
    assert_eq!(r.report["reasons"][0], "killed: memory", "{}", r.explain());
    assert!(!r.stdout().contains("ALLOCATED"));
}

#[test]
fn outliving_the_timeout() {
    if !privileged("outliving_the_timeout") {
        return;
    }
    let area = Area::new();
    let marker = format!("7{}.123", std::process::id() % 1000);
    // A command that ignores SIGTERM and spawns a child that does too.
    let script = format!("trap '' TERM; sleep {marker} & sleep {marker}; wait");
    // Negative control: without a timeout the same command is still running a moment later.
    let mut free = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger"])
        .arg(area.path("ledger"))
        .args(["--", "/bin/sh", "-c", &script])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        free.try_wait().unwrap().is_none(),
        "control: the command ended by itself"
    );
    assert!(!host_processes_with(&marker).is_empty());
    free.kill().unwrap();
    free.wait().unwrap();
    // cordon died with SIGKILL; its init follows it (parent-death signal) and takes the rest.
    wait_until_gone(&marker);

    let r = area.run(&["--timeout", "1s"], &["/bin/sh", "-c", &script]);
    assert_eq!(r.code(), 137, "{}", r.explain());
    assert_eq!(r.report["reasons"][0], "killed: timeout", "{}", r.explain());
    assert!(
        host_processes_with(&marker).is_empty(),
        "a process outlived the timeout"
    );
}

#[test]
fn a_double_forked_daemon_does_not_survive() {
    if !privileged("a_double_forked_daemon_does_not_survive") {
        return;
    }
    let area = Area::new();
    let marker = format!("8{}.321", std::process::id() % 1000);
    // The classic daemon: fork, setsid, fork again, parent exits at once.
    let daemon = format!(
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        null = os.open('/dev/null', os.O_RDWR)\n        for fd in (0, 1, 2):\n            os.dup2(null, fd)\n        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\nos.wait()\nprint('DETACHED')"
    );
    // Negative control on the host: the daemon survives its parent.
    let out = host(&[PY, "-c", &daemon]);
    assert!(stdout(&out).contains("DETACHED"));
    let survivors = host_processes_with(&marker);
    assert!(
        !survivors.is_empty(),
        "control: the daemon did not survive on the host"
    );
    for pid in survivors {
        // SAFETY: kill(2) on a pid we just found running our marker command.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_until_gone(&marker);

    let r = area.run(&[], &[PY, "-c", &daemon]);
    assert!(r.ok().contains("DETACHED"));
    assert!(
        host_processes_with(&marker).is_empty(),
        "the daemon outlived the run"
    );
    let steps = r.report["teardown"]["steps"].to_string();
    assert!(steps.contains("populated 0"), "{steps}");
}

fn wait_until_gone(marker: &str) {
    for _ in 0..300 {
        if host_processes_with(marker).is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("processes with {marker} are still running");
}
