//! The escape-attempt suite. Every probe runs twice: on the host with no boundary (the negative
//! control, which must succeed, or the test proves nothing) and under `cordon run`, where it must
//! fail with the specific errno or verdict the boundary produces.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;

use crate::support::*;

/// Reading a file outside the readable set, by every route an agent has been seen to try.
#[test]
fn read_outside_the_readable_set() {
    if !privileged("read_outside_the_readable_set") {
        return;
    }
    let area = Area::new();
    let secret = area.secret();
    let s = secret.display().to_string();
    // A symlink, planted by the host inside a directory the command may read, to the secret.
    let readable = area.path("readable");
    fs::create_dir(&readable).unwrap();
    std::os::unix::fs::symlink(&secret, readable.join("link")).unwrap();
    // (route on the host, the same route inside). `/proc/1` is the sandbox's init inside; on
    // the host the same trick goes through a process the test may trace: itself.
    let me = std::process::id();
    let link = readable.join("link").display().to_string();
    // The third element is the errno inside: the route leads nowhere (ENOENT), except through
    // `/proc/1/root`, which the kernel guards like ptrace and init is not dumpable (EACCES).
    let routes = [
        (s.clone(), s.clone(), "ENOENT"),
        (
            format!("/proc/self/root{s}"),
            format!("/proc/self/root{s}"),
            "ENOENT",
        ),
        (
            format!("/proc/{me}/root{s}"),
            format!("/proc/1/root{s}"),
            "EACCES",
        ),
        (
            format!("/proc/self/cwd/../../../../../../..{s}"),
            format!("/proc/self/cwd/../../../../../../..{s}"),
            "ENOENT",
        ),
        (format!("/usr/../..{s}"), format!("/usr/../..{s}"), "ENOENT"),
        (link.clone(), link.clone(), "ENOENT"),
    ];
    for (on_host, inside, errno) in &routes {
        let control = py(&format!("print('OK', open({on_host:?}).read().strip())"));
        assert_eq!(
            stdout(&host(&strs(&control))).trim(),
            "OK TOP-SECRET",
            "negative control via {on_host}"
        );
        let probe = py(&format!("print('OK', open({inside:?}).read().strip())"));
        let r = area.run(&["--read", readable.to_str().unwrap()], &strs(&probe));
        assert_eq!(
            r.ok().trim(),
            format!("ERR {errno}"),
            "via {inside}: {}",
            r.explain()
        );
    }
    // A symlink the command makes itself in its workspace, pointing out.
    let ws = area.workspace("ws");
    let link = ws.join("mine");
    let probe = py(&format!(
        "os.symlink({s:?}, {:?})\nprint('OK', open({:?}).read().strip())",
        link.display().to_string(),
        link.display().to_string()
    ));
    let r = area.run(&["--write", ws.to_str().unwrap()], &strs(&probe));
    assert_eq!(r.ok().trim(), "ERR ENOENT", "{}", r.explain());
}

/// Writing outside the writable set: into a read-only grant, through symlinks and hardlinks.
#[test]
fn write_outside_the_writable_set() {
    if !privileged("write_outside_the_writable_set") {
        return;
    }
    let area = Area::new();
    let ro = area.path("ro");
    fs::create_dir(&ro).unwrap();
    fs::write(ro.join("target"), "original\n").unwrap();
    let ws = area.workspace("ws");
    let ro_s = ro.display().to_string();
    let ws_s = ws.display().to_string();
    let grants = ["--read", ro_s.as_str(), "--write", ws_s.as_str()];

    // Into the read-only grant directly.
    let direct = py(&format!(
        "open({:?}, 'w').write('x')\nprint('OK')",
        format!("{ro_s}/new")
    ));
    assert_eq!(stdout(&host(&strs(&direct))).trim(), "OK");
    fs::remove_file(ro.join("new")).unwrap();
    let r = area.run(&grants, &strs(&direct));
    assert_eq!(r.ok().trim(), "ERR EROFS", "{}", r.explain());

    // Through a symlink in the workspace pointing into the read-only grant.
    let via_symlink = py(&format!(
        "os.symlink({:?}, {:?})\nopen({:?}, 'w').write('x')\nprint('OK')",
        format!("{ro_s}/target"),
        format!("{ws_s}/sl"),
        format!("{ws_s}/sl")
    ));
    let r = area.run(&grants, &strs(&via_symlink));
    assert_eq!(r.ok().trim(), "ERR EROFS", "{}", r.explain());

    // Through a hardlink from the workspace to a read-only file (then writing the link).
    let via_hardlink = py(&format!(
        "os.link({:?}, {:?})\nopen({:?}, 'w').write('x')\nprint('OK')",
        format!("{ro_s}/target"),
        format!("{ws_s}/hl"),
        format!("{ws_s}/hl")
    ));
    // Negative control: the same on the host works (same file system, no boundary).
    let host_ws = area.path("hostws");
    fs::create_dir(&host_ws).unwrap();
    let control = py(&format!(
        "os.link({:?}, {:?})\nprint('OK')",
        format!("{ro_s}/target"),
        host_ws.join("hl").display().to_string()
    ));
    assert_eq!(stdout(&host(&strs(&control))).trim(), "OK");
    let r = area.run(&grants, &strs(&via_hardlink));
    assert_eq!(r.ok().trim(), "ERR EXDEV", "{}", r.explain());
    assert_eq!(fs::read_to_string(ro.join("target")).unwrap(), "original\n");

    // Into the root and the system's directories.
    for target in ["/evil", "/usr/evil", "/etc/evil"] {
        let p = py(&format!("open({target:?}, 'w').write('x')\nprint('OK')"));
        let r = area.run(&[], &strs(&p));
        let out = r.ok();
        assert!(
            out.trim() == "ERR EROFS" || out.trim() == "ERR EACCES",
            "{target}: {}",
            r.explain()
        );
    }
}

/// A binary written during the run cannot be executed when `--exec` restricts execution.
#[test]
fn exec_of_a_binary_written_during_the_run() {
    if !privileged("exec_of_a_binary_written_during_the_run") {
        return;
    }
    let area = Area::new();
    let ws = area.workspace("ws");
    let ws_s = ws.display().to_string();
    let script = format!("cp /bin/echo {ws_s}/mine && {ws_s}/mine escaped");
    // Negative control: the same run under a policy that does not restrict execution (the
    // built-in default does: /usr/bin only) executes it.
    let open = area.path("open.toml");
    fs::write(&open, "[filesystem]\nread = [\"/usr\", \"/etc\"]\n").unwrap();
    let free = area.run(
        &["--policy", open.to_str().unwrap(), "--write", &ws_s],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(free.ok().trim(), "escaped");
    // With --exec, the kernel (Landlock) refuses: EACCES, which sh reports as 126.
    let script = format!(
        "cp /bin/echo {ws_s}/mine2 && {PY} -c \"import os; os.execv('{ws_s}/mine2', ['x'])\""
    );
    let r = area.run(
        &["--write", &ws_s, "--exec", "/usr/bin", "--exec", "/bin"],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(r.code(), 1, "{}", r.explain());
    assert!(r.stderr().contains("PermissionError"), "{}", r.explain());
    // And cordon itself refuses to start a command outside the exec set: 126.
    let r = area.run(
        &["--write", &ws_s, "--exec", "/usr/bin"],
        &[&format!("{ws_s}/mine")],
    );
    assert_eq!(r.code(), 126, "{}", r.explain());
    assert_eq!(r.verdict(), "FAILED");
}

/// TCP and UDP to the host on 127.0.0.1 and ::1.
#[test]
fn reach_the_host_over_loopback() {
    if !privileged("reach_the_host_over_loopback") {
        return;
    }
    let area = Area::new();
    let tcp4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp6 = std::net::TcpListener::bind("[::1]:0").unwrap();
    for (l, host_addr) in [(&tcp4, "127.0.0.1"), (&tcp6, "::1")] {
        let port = l.local_addr().unwrap().port();
        let family = if host_addr.contains(':') {
            "AF_INET6"
        } else {
            "AF_INET"
        };
        let probe = py(&format!(
            "s = socket.socket(socket.{family}, socket.SOCK_STREAM)\ns.settimeout(5)\ns.connect(({host_addr:?}, {port}))\nprint('OK')"
        ));
        assert_eq!(
            stdout(&host(&strs(&probe))).trim(),
            "OK",
            "control tcp {host_addr}"
        );
        let r = area.run(&[], &strs(&probe));
        // Landlock refuses every TCP connect (EACCES) before the empty namespace could.
        assert_eq!(
            r.ok().trim(),
            "ERR EACCES",
            "tcp {host_addr}: {}",
            r.explain()
        );
    }
    // UDP: Landlock has no UDP rules; the empty network namespace is the barrier. The datagram
    // must never reach the host's socket.
    for addr in ["127.0.0.1", "::1"] {
        let ip: std::net::IpAddr = addr.parse().unwrap();
        let sock = std::net::UdpSocket::bind((ip, 0)).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        let port = sock.local_addr().unwrap().port();
        let family = if addr.contains(':') {
            "AF_INET6"
        } else {
            "AF_INET"
        };
        let probe = py(&format!(
            "s = socket.socket(socket.{family}, socket.SOCK_DGRAM)\ns.sendto(b'ping', ({addr:?}, {port}))\nprint('SENT')"
        ));
        assert_eq!(stdout(&host(&strs(&probe))).trim(), "SENT");
        let mut buf = [0u8; 16];
        assert_eq!(sock.recv(&mut buf).unwrap(), 4, "control udp {addr}");
        let r = area.run(&[], &strs(&probe));
        // Sending into the sandbox's own loopback succeeds locally, or fails outright; either
        // way nothing arrives on the host.
        let out = r.ok();
        assert!(
            out.contains("SENT") || out.contains("ERR"),
            "{}",
            r.explain()
        );
        assert!(
            sock.recv(&mut buf).is_err(),
            "udp {addr}: a datagram reached the host"
        );
    }
}

/// Host UNIX sockets, by path and abstract name.
#[test]
fn reach_host_unix_sockets() {
    if !privileged("reach_host_unix_sockets") {
        return;
    }
    let area = Area::new();
    let path = area.path("host.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let p = path.display().to_string();
    let probe = py(&format!(
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ns.connect({p:?})\nprint('OK')"
    ));
    assert_eq!(stdout(&host(&strs(&probe))).trim(), "OK");
    let r = area.run(&[], &strs(&probe));
    assert_eq!(r.ok().trim(), "ERR ENOENT", "{}", r.explain());

    // Abstract: named in the network namespace, so unreachable from a new one; with the host's
    // network namespace, Landlock's abstract-socket scoping refuses it (EPERM).
    let name = format!("cordon-test-{}", std::process::id());
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    abstract_listener.set_nonblocking(true).unwrap();
    let probe = py(&format!(
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ns.connect('\\0{name}')\nprint('OK')"
    ));
    assert_eq!(stdout(&host(&strs(&probe))).trim(), "OK");
    let r = area.run(&[], &strs(&probe));
    assert_eq!(r.ok().trim(), "ERR ECONNREFUSED", "{}", r.explain());
    for net in ["host", "allow:192.0.2.0/24"] {
        let r = area.run(&["--net", net], &strs(&probe));
        assert_eq!(r.ok().trim(), "ERR EPERM", "--net {net}: {}", r.explain());
    }
    drop((listener, abstract_listener));
}

/// Signalling or tracing a host process.
#[test]
fn signal_or_trace_a_host_process() {
    if !privileged("signal_or_trace_a_host_process") {
        return;
    }
    let area = Area::new();
    let mut victim = std::process::Command::new("/bin/sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let pid = victim.id();
    let kill = py(&format!("os.kill({pid}, 0)\nprint('OK')"));
    assert_eq!(stdout(&host(&strs(&kill))).trim(), "OK");
    let r = area.run(&[], &strs(&kill));
    assert_eq!(r.ok().trim(), "ERR ESRCH", "{}", r.explain());
    // With the host's pid visible by number only through a shared pid namespace (never), the
    // other route is the signal itself to every process: kill(-1) reaches only the sandbox.
    let kill_all = py("os.kill(-1, 0)\nprint('OK')");
    let r = area.run(&[], &strs(&kill_all));
    let out = r.ok();
    assert!(
        out.trim() == "OK" || out.trim() == "ERR ESRCH",
        "{}",
        r.explain()
    );
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process was hurt"
    );

    let ptrace = py(&format!(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, {pid}, 0, 0)\nprint('OK' if r == 0 else 'ERR %d' % ctypes.get_errno())"
    ));
    let control = stdout(&host(&strs(&ptrace)));
    assert_eq!(control.trim(), "OK", "negative control: root may attach");
    let r = area.run(&[], &strs(&ptrace));
    r.killed_by_seccomp();
    victim.kill().unwrap();
    victim.wait().unwrap();
}

/// unshare, setns and mount: the calls that rebuild or leave a sandbox.
#[test]
fn namespace_and_mount_calls() {
    if !privileged("namespace_and_mount_calls") {
        return;
    }
    let area = Area::new();
    // Negative controls on the host: each call is available there.
    let cases = [
        ("unshare", "r = libc.unshare(0x10000000)"),
        (
            "setns",
            "fd = os.open('/proc/self/ns/uts', os.O_RDONLY)\nr = libc.setns(fd, 0)",
        ),
        (
            "mount",
            "r = libc.mount(b'none', b'/mnt', b'tmpfs', 0, None)",
        ),
    ];
    for (name, call) in cases {
        let probe = py(&format!(
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n{call}\nprint('RETURNED')"
        ));
        // On the host the call returns (whatever it returns): it exists and does not kill.
        let control = host(&["/usr/bin/unshare", "--mount", "--", PY, "-c", &probe[2]]);
        assert!(
            stdout(&control).contains("RETURNED"),
            "control {name}: {control:?}"
        );
        let r = area.run(&[], &strs(&probe));
        r.killed_by_seccomp();
    }
    // The unshare(1) tool too.
    assert!(
        host(&["/usr/bin/unshare", "--user", "/bin/true"])
            .status
            .success()
    );
    let r = area.run(&[], &["/usr/bin/unshare", "--user", "/bin/true"]);
    r.killed_by_seccomp();
}

/// Moving out of the run's cgroup.
#[test]
fn move_out_of_the_cgroup() {
    if !privileged("move_out_of_the_cgroup") {
        return;
    }
    let area = Area::new();
    let target = if std::path::Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
        "/sys/fs/cgroup/unified/cgroup.procs"
    } else {
        "/sys/fs/cgroup/cgroup.procs"
    };
    let probe = py(&format!(
        "open({target:?}, 'w').write(str(os.getpid()))\nprint('OK')"
    ));
    // Negative control: a host process can move itself to the root cgroup.
    assert_eq!(stdout(&host(&strs(&probe))).trim(), "OK");
    let r = area.run(&[], &strs(&probe));
    assert_eq!(r.ok().trim(), "ERR ENOENT", "{}", r.explain());
    // Even with /sys readable, the cgroup file system is read-only inside.
    let r = area.run(&["--read", "/sys"], &strs(&probe));
    let out = r.ok();
    assert!(
        out.trim() == "ERR EROFS" || out.trim() == "ERR EACCES",
        "{}",
        r.explain()
    );
}

/// Dangerous system calls, each killed by the seccomp filter.
#[test]
fn dangerous_syscalls_are_killed() {
    if !privileged("dangerous_syscalls_are_killed") {
        return;
    }
    let area = Area::new();
    // x86_64 numbers; the probe passes harmless arguments.
    let calls = [
        (
            "io_uring_setup",
            "libc.syscall(425, 1, ctypes.byref(ctypes.create_string_buffer(120)))",
        ),
        ("bpf", "libc.syscall(321, 0, None, 0)"),
        ("perf_event_open", "libc.syscall(298, None, 0, -1, -1, 0)"),
        ("keyctl", "libc.syscall(250, 0, -3, 0)"),
        ("userfaultfd", "libc.syscall(323, 0)"),
        // Invalid architecture bits in the flags: EINVAL on the host, nothing loaded or unloaded.
        ("kexec_load", "libc.syscall(246, 0, 0, None, 0x7fff0000)"),
        ("init_module", "libc.syscall(175, None, 0, b'')"),
        ("open_by_handle_at", "libc.syscall(304, -100, None, 0)"),
    ];
    for (name, call) in calls {
        let probe = py(&format!(
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n{call}\nprint('RETURNED')"
        ));
        let control = host(&strs(&probe));
        assert!(
            stdout(&control).contains("RETURNED"),
            "control {name}: {control:?}"
        );
        let r = area.run(&[], &strs(&probe));
        assert_eq!(r.signal(), Some(SIGSYS), "{name}: {}", r.explain());
    }
}

/// Pushing characters into the terminal (TIOCSTI).
#[test]
fn terminal_injection() {
    if !privileged("terminal_injection") {
        return;
    }
    let area = Area::new();
    // The probe makes a fresh pty its controlling terminal and pushes a byte into it.
    let body = "import fcntl, termios, pty\nm, s = pty.openpty()\nos.setsid() if os.getpid() != os.getsid(0) else None\nfcntl.ioctl(s, termios.TIOCSCTTY, 0)\nfcntl.ioctl(s, termios.TIOCSTI, b'x')\nprint('INJECTED', os.read(m, 1))";
    let probe = py(body);
    // Negative control: in a new session on the host, the injection works.
    let control = host(&["/usr/bin/setsid", PY, "-c", &probe[2]]);
    assert!(
        stdout(&control).contains("INJECTED"),
        "control: {control:?}"
    );
    let r = area.run(&[], &strs(&probe));
    r.killed_by_seccomp();
}

/// No capabilities, no_new_privs set, and setuid binaries gain nothing.
#[test]
fn capabilities_and_no_new_privs() {
    if !privileged("capabilities_and_no_new_privs") {
        return;
    }
    let area = Area::new();
    let show = [
        "/bin/sh",
        "-c",
        "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status",
    ];
    let control = stdout(&host(&show));
    assert!(control.contains("NoNewPrivs:\t0"), "{control}");
    assert!(!control.contains("CapEff:\t0000000000000000"), "{control}");
    let out = area.run(&[], &show).ok();
    for line in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        assert!(out.contains(line), "missing {line:?} in {out}");
    }
    // uid 0 is unmapped: becoming root fails.
    let setuid = py("os.setuid(0)\nprint('OK')");
    assert_eq!(stdout(&host(&strs(&setuid))).trim(), "OK");
    let r = area.run(&[], &strs(&setuid));
    let out = r.ok();
    assert!(
        out.trim() == "ERR EPERM" || out.trim() == "ERR EINVAL",
        "{}",
        r.explain()
    );
}

/// The host's environment (and its secrets) does not reach the command.
#[test]
fn host_environment_is_not_inherited() {
    if !privileged("host_environment_is_not_inherited") {
        return;
    }
    let area = Area::new();
    let control = std::process::Command::new("/usr/bin/env")
        .env("CORDON_TEST_SECRET", "hunter2")
        .output()
        .unwrap();
    assert!(stdout(&control).contains("hunter2"));
    let r = area.run_with(&["--env", "GIVEN=yes"], &["/usr/bin/env"], |c| {
        c.env("CORDON_TEST_SECRET", "hunter2")
            .env("AWS_SECRET_ACCESS_KEY", "x");
    });
    let out = r.ok();
    assert!(
        !out.contains("hunter2") && !out.contains("AWS_SECRET"),
        "{out}"
    );
    assert!(out.contains("GIVEN=yes"), "{out}");
    let mut names: Vec<&str> = out.lines().filter_map(|l| l.split('=').next()).collect();
    names.sort_unstable();
    assert_eq!(names, ["GIVEN", "HOME", "LANG", "PATH", "TERM"], "{out}");
}

/// Init, pid 1 inside, is a copy of the `cordon` process (no exec): what cordon held — the
/// host's environment, its command line, its memory — is out of the command's reach.
/// `/proc/1/environ` and `/proc/1/mem` are refused (init is not dumpable) and its command line
/// reads `cordon-init`. Negative control: a host process's environment is readable by its own
/// user through `/proc`, and inside, the command reads its own.
#[test]
fn init_exposes_nothing_of_cordon() {
    if !privileged("init_exposes_nothing_of_cordon") {
        return;
    }
    let area = Area::new();
    let mut control = std::process::Command::new("/bin/sleep")
        .arg("30")
        .env("CORDON_TEST_SECRET", "hunter2")
        .spawn()
        .unwrap();
    // Read once the child has executed `sleep` (before, it still shares the test's memory).
    let mut environ = Vec::new();
    for _ in 0..400 {
        let cmdline = fs::read(format!("/proc/{}/cmdline", control.id())).unwrap_or_default();
        if cmdline.starts_with(b"/bin/sleep") {
            environ = fs::read(format!("/proc/{}/environ", control.id())).unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    control.kill().unwrap();
    control.wait().unwrap();
    assert!(String::from_utf8_lossy(&environ).contains("hunter2"));

    let probe = py(r#"
for name in ("environ", "mem", "cmdline"):
    try:
        with open("/proc/1/" + name, "rb") as f:
            data = f.read(4096)
        print(name, "READ", data.replace(b"\0", b" ").decode(errors="replace").strip())
    except OSError as e:
        print(name, "ERR", errno.errorcode.get(e.errno, e.errno))
own = open("/proc/self/environ", "rb").read()
print("own", "READ" if b"HOME=" in own else "EMPTY")
"#);
    let r = area.run_with(&["--env", "GIVEN=marker-in-argv"], &strs(&probe), |c| {
        c.env("CORDON_TEST_SECRET", "hunter2");
    });
    let out = r.ok();
    assert!(out.contains("environ ERR EACCES"), "{out}");
    assert!(out.contains("mem ERR EACCES"), "{out}");
    assert!(out.contains("cmdline READ cordon-init\n"), "{out}");
    assert!(out.contains("own READ"), "{out}");
    assert!(
        !out.contains("hunter2") && !out.contains("marker-in-argv") && !out.contains("--ledger"),
        "{out}"
    );
}

/// What the command writes to its stdout and reads from its stdin passes through.
#[test]
fn standard_streams_pass_through() {
    if !privileged("standard_streams_pass_through") {
        return;
    }
    let area = Area::new();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger"])
        .arg(area.path("ledger"))
        .args(["--", "/usr/bin/tr", "a-z", "A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(out, "HELLO\n");
}

/// `--net allow:`: the host's network, but only the destinations listed; every attempt, allowed or
/// refused, is in the ledger as the kernel saw it.
#[test]
fn egress_allowlist_lets_through_only_what_it_lists() {
    if !privileged("egress_allowlist_lets_through_only_what_it_lists") {
        return;
    }
    let area = Area::new();
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (pa, pr) = (
        allowed.local_addr().unwrap().port(),
        refused.local_addr().unwrap().port(),
    );
    let probe = |port: u16| {
        py(&format!(
            "s = socket.socket()\ns.settimeout(5)\ns.connect(('127.0.0.1', {port}))\nprint('OK')"
        ))
    };
    // Negative control: both are reachable from the host.
    assert_eq!(stdout(&host(&strs(&probe(pa)))).trim(), "OK");
    assert_eq!(stdout(&host(&strs(&probe(pr)))).trim(), "OK");
    let net = format!("allow:127.0.0.1/32:{pa}");
    let r = area.run(&["--net", &net], &strs(&probe(pa)));
    assert_eq!(r.ok().trim(), "OK", "{}", r.explain());
    let r = area.run(&["--net", &net], &strs(&probe(pr)));
    assert_eq!(r.ok().trim(), "ERR EPERM", "{}", r.explain());
    let egress = r.report["enforcement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["provider"] == "egress")
        .cloned()
        .unwrap();
    assert_eq!(egress["state"], "ENFORCED", "{egress}");
    // The refused attempt is in the ledger, seen by the kernel, not labelled as a probe.
    let ledger = fs::read_to_string(area.path("ledger/ledger.jsonl")).unwrap();
    let refused_seen = ledger.lines().any(|l| {
        let e: serde_json::Value = serde_json::from_str(l).unwrap();
        e["kind"] == "host.connect"
            && e["data"]["port"] == pr
            && e["data"]["allowed"] == false
            && e["data"]["probe"] == false
    });
    assert!(refused_seen, "the refused connect is not in the ledger");
    drop((allowed, refused));
}

/// `--exec` also holds against the two ways around `execve`'s check: asking the dynamic loader to
/// map a written binary (`ld.so ./binary`), and executing an anonymous memfd (no path to check).
/// Negative control: both work in the same run under a policy that does not restrict execution.
#[test]
fn exec_restriction_holds_against_the_loader_and_memfd() {
    if !privileged("exec_restriction_holds_against_the_loader_and_memfd") {
        return;
    }
    let area = Area::new();
    let ws = area.workspace("ws");
    let ws_s = ws.display().to_string();
    let loader = std::fs::read_dir("/lib64")
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("ld-linux"))
        .map(|e| e.path().display().to_string())
        .expect("a dynamic loader in /lib64");
    let via_loader = format!(
        "import shutil, subprocess\nshutil.copy('/usr/bin/echo', '{ws_s}/e')\n\
         r = subprocess.run(['{loader}', '{ws_s}/e', 'RAN'], capture_output=True, text=True)\n\
         print('OK' if r.stdout.strip() == 'RAN' else 'REFUSED ' + r.stderr.strip().split(': ')[-1])"
    );
    let via_memfd = r#"fd = os.memfd_create('x')
os.write(fd, open('/usr/bin/echo', 'rb').read())
pid = os.fork()
if pid == 0:
    try:
        os.execve(fd, ['echo', 'OK'], {})
    except OSError as e:
        print('ERR', errno.errorcode[e.errno], flush=True)
        os._exit(1)
os.waitpid(pid, 0)"#;
    let open = area.path("open.toml");
    fs::write(&open, "[filesystem]\nread = [\"/usr\", \"/etc\"]\n").unwrap();
    let open = open.display().to_string();

    for (name, probe) in [("loader", py(&via_loader)), ("memfd", py(via_memfd))] {
        let free = area.run(&["--policy", &open, "--write", &ws_s], &strs(&probe));
        assert_eq!(
            free.ok().trim(),
            "OK",
            "control via {name}: {}",
            free.explain()
        );
        let r = area.run(
            &["--policy", &open, "--write", &ws_s, "--exec", "/usr"],
            &strs(&probe),
        );
        let out = r.ok();
        match name {
            // The kernel refuses to map the file executable (noexec mount).
            "loader" => assert!(
                out.contains("REFUSED failed to map segment from shared object"),
                "{}",
                r.explain()
            ),
            // memfd_noexec=2 in the run's pid namespace: exec of a memfd is refused.
            _ => assert_eq!(out.trim(), "ERR EACCES", "{}", r.explain()),
        }
    }
}

/// Descriptors cordon inherits (an open root-only file, a directory of the host) never reach the
/// command: Landlock checks at open, so an inherited descriptor would carry its rights past it.
#[test]
fn inherited_descriptors_do_not_reach_the_command() {
    if !privileged("inherited_descriptors_do_not_reach_the_command") {
        return;
    }
    let area = Area::new();
    let secret = area.secret();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let s = secret.display().to_string();
    let probe = py("print('OK', os.read(5, 100).decode().strip(), sorted(os.listdir(6))[:1])");
    // Negative control: a process that inherits them reads the file and lists the directory.
    let control = std::process::Command::new("/bin/sh")
        .args(["-c", &format!("exec \"$@\" 5<{s} 6</"), "sh"])
        .args(strs(&probe))
        .output()
        .unwrap();
    assert!(stdout(&control).starts_with("OK TOP-SECRET"), "{control:?}");
    let ledger = area.path("ledger").display().to_string();
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", &format!("exec \"$@\" 5<{s} 6</"), "sh"])
        .arg(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger", &ledger, "--"])
        .args(strs(&probe))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out).trim(), "ERR EBADF", "{out:?}");
}

/// The command cannot make a file setuid or setgid: on the host, where a writable grant is not
/// `nosuid`, it would run with the workspace owner's identity.
#[test]
fn no_setuid_or_setgid_files() {
    if !privileged("no_setuid_or_setgid_files") {
        return;
    }
    let area = Area::new();
    let ws = area.workspace("ws");
    let w = ws.display().to_string();
    let chmod = |mode: &str| {
        py(&format!(
            "open('{w}/f', 'w').close()\nos.chmod('{w}/f', {mode})\nprint('OK')"
        ))
    };
    let create = py(&format!(
        "os.close(os.open('{w}/g', os.O_CREAT | os.O_WRONLY, 0o4755))\nprint('OK', oct(os.stat('{w}/g').st_mode & 0o7777))"
    ));
    // Negative control: on the host the same calls set the bits.
    let host_ws = area.path("hostws");
    fs::create_dir(&host_ws).unwrap();
    let hw = host_ws.display().to_string();
    let host_chmod = py(&format!(
        "open('{hw}/f', 'w').close()\nos.chmod('{hw}/f', 0o4755)\nprint('OK')"
    ));
    assert_eq!(stdout(&host(&strs(&host_chmod))).trim(), "OK");
    for mode in ["0o4755", "0o2755"] {
        let r = area.run(&["--write", &w], &strs(&chmod(mode)));
        assert_eq!(r.ok().trim(), "ERR EPERM", "chmod {mode}: {}", r.explain());
    }
    let r = area.run(&["--write", &w], &strs(&chmod("0o755")));
    assert_eq!(r.ok().trim(), "OK", "{}", r.explain());
    let r = area.run(&["--write", &w], &strs(&create));
    assert_eq!(r.ok().trim(), "ERR EPERM", "{}", r.explain());
}

/// The ledger is public evidence, readable when granted, but its lock is root's alone: a
/// command holding it would stall every writer, its own supervisor and `cordon contain` first.
#[test]
fn the_ledger_lock_is_out_of_the_commands_reach() {
    if !privileged("the_ledger_lock_is_out_of_the_commands_reach") {
        return;
    }
    let area = Area::new();
    let first = area.run(&[], &["/bin/true"]);
    first.ok();
    let ledger = area.path("ledger");
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(ledger.join("ledger.lock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let l = ledger.display().to_string();
    let probe = py(&format!(
        "print(len(open('{l}/ledger.jsonl').read()) > 0)\nimport fcntl\nf = open('{l}/ledger.lock', 'rb')\nfcntl.flock(f, fcntl.LOCK_EX)\nprint('LOCKED')"
    ));
    // Negative control: were the lock file open to others, the same uid could hold it.
    let open_lock = area.path("open.lock");
    fs::write(&open_lock, "").unwrap();
    fs::set_permissions(&open_lock, fs::Permissions::from_mode(0o644)).unwrap();
    let control = std::process::Command::new("/usr/bin/setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            PY,
            "-c",
        ])
        .arg(format!(
            "import fcntl\nf = open('{}', 'rb')\nfcntl.flock(f, fcntl.LOCK_EX)\nprint('LOCKED')",
            open_lock.display()
        ))
        .output()
        .unwrap();
    assert_eq!(stdout(&control).trim(), "LOCKED", "{control:?}");
    let r = area.run(&["--read", &l], &strs(&probe));
    assert_eq!(r.ok().trim(), "True\nERR EACCES", "{}", r.explain());
}

/// A run cannot exhaust the per-user kernel resources its user namespace also charges to the
/// host's root: inotify instances stop at a quarter of root's.
#[test]
fn per_user_kernel_resources_are_bounded_below_roots() {
    if !privileged("per_user_kernel_resources_are_bounded_below_roots") {
        return;
    }
    let area = Area::new();
    let host_max: usize = fs::read_to_string("/proc/sys/user/max_inotify_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let probe = py(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nn = 0\nwhile libc.inotify_init1(0) >= 0 and n < 100000:\n    n += 1\nprint(n, errno.errorcode.get(ctypes.get_errno()))",
    );
    // Negative control: in a user namespace without the bound, far more can be taken.
    let control = std::process::Command::new("/usr/bin/unshare")
        .args(["--user", "--"])
        .args(strs(&probe))
        .output()
        .unwrap();
    let taken: usize = stdout(&control)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        taken > host_max / 4,
        "control took only {taken}: {control:?}"
    );
    let r = area.run(&[], &strs(&probe));
    assert_eq!(
        r.ok().trim(),
        format!("{} EMFILE", host_max / 4),
        "{}",
        r.explain()
    );
}

/// Setting a terminal's line discipline (`TIOCSETD`, which can make the kernel load a module) is
/// refused by seccomp. Negative control: on the host the call returns.
#[test]
fn line_discipline_changes_are_killed() {
    if !privileged("line_discipline_changes_are_killed") {
        return;
    }
    let area = Area::new();
    let probe = py(
        "import fcntl, pty, struct, termios\nm, s = pty.openpty()\nfcntl.ioctl(s, termios.TIOCSETD, struct.pack('i', 0))\nprint('RETURNED')",
    );
    assert_eq!(stdout(&host(&strs(&probe))).trim(), "RETURNED");
    let r = area.run(&[], &strs(&probe));
    r.killed_by_seccomp();
}

/// Landlock's rules hold where nothing else refuses: a process may rename itself through its
/// own `/proc/self/comm`, which neither the mounts, the uid nor seccomp refuse, but the run's
/// ruleset grants `/proc` for reading only. Refused however the ruleset is made: in the tree
/// built ahead by the launcher's thread, with `/proc`'s rule added by the launcher once it has
/// mounted the run's `/proc` (`cordon run` as root), or by init (a launcher with threads of its
/// own, this test's, executes init). Reading `/proc` works either way (that rule is there).
/// Negative control: on the host the same write succeeds.
#[test]
fn landlock_rules_hold_however_the_ruleset_is_made() {
    if !privileged("landlock_rules_hold_however_the_ruleset_is_made") {
        return;
    }
    // 7: /proc unreadable; 9: the write refused.
    let probe =
        "grep -q '^Name:' /proc/self/status || exit 7; printf renamed > /proc/self/comm || exit 9";
    let control = host(&["/bin/sh", "-c", probe]);
    assert!(control.status.success(), "control: {control:?}");

    let area = Area::new();
    let r = area.run(&[], &["/bin/sh", "-c", probe]);
    assert_eq!(r.code(), 9, "{}", r.explain());
    assert!(r.stderr().contains("Permission denied"), "{}", r.explain());

    let spec = cordon_runtime::RunSpec {
        command: vec!["/bin/sh".into(), "-c".into(), probe.into()],
        read: vec!["/usr".into(), "/etc".into()],
        base_dir: area.path(""),
        caller: (0, 0),
        ..cordon_runtime::RunSpec::default()
    };
    let plan = spec.validate("r-landlock-by-init").unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cordon"));
    let mut backend = cordon_sandbox::LinuxBackend::new(exe);
    let report = cordon_runtime::execute(&plan, &mut backend, &mut Memory);
    assert_eq!(
        report.verdict,
        cordon_runtime::Verdict::Allowed,
        "{report:?}"
    );
    assert_eq!(report.exit.code, Some(9), "{report:?}");
}
