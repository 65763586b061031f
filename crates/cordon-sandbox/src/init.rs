//! The sandbox's init: pid 1 of the run's pid namespace, started by the launcher as a fresh
//! `cordon` process (so it is single-threaded and may allocate freely).
//!
//! It waits for the launcher's go, then builds the boundary in the order the best sandboxes
//! converge on — identity, mount tree and `pivot_root`, hostname, loopback, rlimits, drop every
//! capability, `no_new_privs`, Landlock, seccomp **last** — reports, waits for the launcher's
//! second go (given only after the launcher has checked the boundary from the host), then forks
//! the command into a session of its own and stays as its reaper, forwarding signals, until the
//! command ends. When init exits, the kernel kills whatever else is left in the pid namespace.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd};
use std::path::Path;

use cordon_runtime::Plan;

use crate::proto::{GO_BUILD, GO_EXEC, InitConfig, Message, Ready};
use crate::{caps, landlock, mounts, seccomp, sys};

/// A failure inside init, reported to the launcher as [`Message::Error`].
struct Failure {
    stage: &'static str,
    message: String,
}

trait Stage<T> {
    fn stage(self, stage: &'static str) -> Result<T, Failure>;
}

impl<T, E: std::fmt::Display> Stage<T> for Result<T, E> {
    fn stage(self, stage: &'static str) -> Result<T, Failure> {
        self.map_err(|e| Failure {
            stage,
            message: e.to_string(),
        })
    }
}

/// Init's entry point when the launcher re-executed the `cordon` binary (it had other threads):
/// `args` are `cordon-init CONFIG_FD STATUS_FD`. Never returns.
pub fn main(args: &[String]) -> ! {
    let fd = |i: usize| args.get(i).and_then(|s| s.parse::<i32>().ok());
    let (Some(config_fd), Some(status_fd)) = (fd(1), fd(2)) else {
        eprintln!("cordon-init: started without its descriptors; it is started by `cordon run`");
        sys::exit_now(125);
    };
    // SAFETY: the launcher passed this descriptor number, opened for this process and owned by
    // nothing else in it; it is wrapped exactly once.
    let mut config_file = unsafe { File::from_raw_fd(config_fd) };
    // SAFETY: as above, for the status pipe.
    let status = unsafe { File::from_raw_fd(status_fd) };
    let mut status = Status(status);
    let mut text = String::new();
    let config = config_file
        .read_to_string(&mut text)
        .stage("config")
        .and_then(|_| serde_json::from_str::<InitConfig>(&text).stage("config"));
    drop(config_file);
    let code = match config {
        Ok(config) => match run(&config, &mut status, Origin::Executed) {
            Ok(code) => code,
            Err(f) => status.fail(f),
        },
        Err(f) => status.fail(f),
    };
    sys::exit_now(code)
}

/// Init's entry point in a process the launcher cloned from a single-threaded process, without
/// an exec: it carries a copy of the launcher's memory, in which `config` is. Never returns,
/// and nothing unwinds out of it into the launcher's frames (whose objects this copy must never
/// drop: their descriptors are closed here first).
///
/// # Safety
/// The calling process must have been cloned (fork semantics) from a process that had exactly
/// one thread at the time, so that no lock is held by a thread that does not exist here; and
/// the caller must never return into code that uses or drops descriptors other than
/// `config.sync_fd`, `config.status_fd` and the Landlock ruleset's in `config.landlock`.
pub unsafe fn forked(config: &InitConfig) -> ! {
    // Only the standard streams, init's two pipe ends and the Landlock ruleset made ahead (used,
    // and closed, before the command exists) stay open: nothing cordon holds (its ledger, the
    // cgroup and eBPF descriptors, the launcher's ends of the pipes) reaches the sandbox.
    let mut keep = vec![config.sync_fd, config.status_fd];
    keep.extend(config.landlock.map(|(fd, _)| fd));
    if sys::close_all_but(&keep).is_err() {
        let _ = sys::write_all_raw(
            config.status_fd,
            b"{\"Error\":{\"stage\":\"init\",\"message\":\"could not close inherited descriptors\"}}\n",
        );
        sys::exit_now(125);
    }
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the launcher passed this descriptor for this process; the launcher's own
        // object for it lives in frames this process never returns to.
        let status = unsafe { File::from_raw_fd(config.status_fd) };
        let mut status = Status(status);
        match run(config, &mut status, Origin::Forked) {
            Ok(code) => code,
            Err(f) => status.fail(f),
        }
    }));
    sys::exit_now(code.unwrap_or(125))
}

/// Blanks the argument and environment strings this process inherited from `cordon` (the
/// host's environment, cordon's command line): init is a copy of the launcher, not a fresh
/// exec. `/proc/1/cmdline` then reads `cordon-init`; `/proc/1/environ` is refused anyway (init
/// is not dumpable) and would read nothing.
fn scrub_inherited_strings() -> Result<(), String> {
    let stat = sys::read_text("/proc/self/stat").map_err(|e| format!("/proc/self/stat: {e}"))?;
    // Fields 48–51: arg_start, arg_end, env_start, env_end (after the ')' of the name, the
    // third field is index 0).
    let fields: Vec<usize> = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(45)
                .take(4)
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let [arg_start, arg_end, env_start, env_end] = fields[..] else {
        return Err("no argument and environment bounds in /proc/self/stat".to_owned());
    };
    if arg_start == 0 || arg_end <= arg_start || env_end < env_start {
        return Err(format!(
            "implausible argument and environment bounds {arg_start:#x}-{arg_end:#x}, \
             {env_start:#x}-{env_end:#x}"
        ));
    }
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        if end == start {
            continue;
        }
        // SAFETY: the kernel reports [start, end) as this process's initial argument
        // (environment) strings, on its writable stack; nothing in init reads them after this
        // point (init uses neither `std::env::args` nor the environment).
        unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
    }
    let name = INIT_NAME.as_bytes();
    if arg_end - arg_start > name.len() {
        // SAFETY: as above; the name and its terminating zero fit in the argument area.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), arg_start as *mut u8, name.len()) };
    }
    Ok(())
}

/// What init calls itself in `/proc/<pid>/cmdline` and `comm`.
const INIT_NAME: &str = "cordon-init";

/// The status pipe to the launcher.
struct Status(File);

impl Status {
    /// Reports a failure; returns init's exit status for it.
    fn fail(&mut self, f: Failure) -> i32 {
        self.send(&Message::Error {
            stage: f.stage.to_owned(),
            message: f.message,
        });
        125
    }

    fn send(&mut self, msg: &Message) {
        if let Ok(mut line) = serde_json::to_vec(msg) {
            line.push(b'\n');
            // If the launcher is gone there is nobody to tell; the death signal follows.
            let _ = self.0.write_all(&line);
        }
    }
}

/// How init came to be: forked, it is a copy of the launcher and carries its command line and
/// environment; executed, it is a fresh `cordon` process.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Forked,
    Executed,
}

fn run(config: &InitConfig, status: &mut Status, origin: Origin) -> Result<i32, Failure> {
    let plan = &config.plan;
    // SAFETY: the launcher passed this descriptor number for this process; wrapped exactly once.
    let mut sync = unsafe { File::from_raw_fd(config.sync_fd) };
    for f in [sync.as_fd(), status.0.as_fd()] {
        rustix::io::fcntl_setfd(f, rustix::io::FdFlags::CLOEXEC).stage("config")?;
    }
    // SAFETY: PR_SET_NAME reads the NUL-terminated string passed, which outlives the call.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"cordon-init".as_ptr()) };

    if !wait_for(&mut sync, GO_BUILD) {
        return Ok(0);
    }
    cordon_runtime::mark("init: go");
    // The launcher has mapped the user namespace (which needs this process's /proc files to be
    // its own): from here on nothing of the sandbox may read init's memory (`/proc/1/mem`,
    // `/proc/1/environ`), whatever the host's `fs.suid_dumpable`. Set again after the uid
    // change below, which resets it.
    set_not_dumpable().stage("dumpable")?;
    // Nothing of cordon's command line or environment may stay readable: fail otherwise. (Not
    // before the go: `/proc`, which says where they are, is mounted by then, also when init was
    // cloned straight into a tree built ahead.)
    if origin == Origin::Forked {
        scrub_inherited_strings().stage("init")?;
    }

    // A memfd lives on no path Landlock can name, so `execveat(memfd)` would slip past the
    // execute rules: under --exec, in this pid namespace (and any below it, which cannot lower
    // it) memfds are never executable. The setting belongs to the writer's pid namespace; the
    // file is writable only by the host's uid 0, which this process still is when cordon was
    // started by root (until the change below). Started by an ordinary user, it cannot be set,
    // and the launcher reports that.
    let memfd_exec_refused = match (&plan.landlock.exec, config.unprivileged) {
        (None, _) => None,
        (Some(_), false) => {
            std::fs::write("/proc/sys/vm/memfd_noexec", b"2").stage("memfd_noexec")?;
            Some(true)
        }
        (Some(_), true) => Some(std::fs::write("/proc/sys/vm/memfd_noexec", b"2").is_ok()),
    };

    // Per-user kernel resources that the run's user namespace also charges to the user that
    // created it (root, on the host): bounded here so that one run cannot use them up for every
    // root daemon. The settings belong to this process's user namespace.
    for (name, value) in &config.user_ns_limits {
        std::fs::write(format!("/proc/sys/user/{name}"), value.to_string())
            .stage("user namespace limits")?;
    }

    // Identity first: files created while building the tree must belong to a mapped id. The
    // capabilities this process holds in its user namespace survive the change (uid 0 is not
    // mapped, so the kernel's root-to-non-root rule does not apply); they are dropped below.
    let id = plan.identity;
    if !config.unprivileged {
        rustix::thread::set_thread_groups(&[]).stage("setgroups")?;
    }
    rustix::thread::set_thread_res_gid(
        rustix::process::Gid::from_raw(id.gid),
        rustix::process::Gid::from_raw(id.gid),
        rustix::process::Gid::from_raw(id.gid),
    )
    .stage("setresgid")?;
    rustix::thread::set_thread_res_uid(
        rustix::process::Uid::from_raw(id.uid),
        rustix::process::Uid::from_raw(id.uid),
        rustix::process::Uid::from_raw(id.uid),
    )
    .stage("setresuid")?;
    set_not_dumpable().stage("dumpable")?;
    // Die with the launcher: a sandbox nobody supervises must not keep running. Armed after the
    // uid change, which would clear it; if the launcher died before this point, the next read
    // of the sync pipe sees end of file and init stops there.
    // SAFETY: PR_SET_PDEATHSIG takes an integer signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } < 0 {
        return Err(Failure {
            stage: "pdeathsig",
            message: std::io::Error::last_os_error().to_string(),
        });
    }

    let mut clock = Stopwatch::start();
    let mounts = match config.tree {
        // Cloned into the tree built ahead, `/proc` mounted by the launcher: nothing to mount.
        Some(made) => made,
        None => mounts::build(plan).stage("mounts")?,
    };
    clock.lap("mounts");
    cordon_runtime::mark("init: mounts");

    if config.hostname {
        rustix::system::sethostname(plan.hostname.as_bytes()).stage("hostname")?;
    }
    if config.loopback {
        crate::netns::loopback_up().stage("loopback")?;
    }
    set_rlimits().stage("rlimits")?;
    caps::drop_all().stage("capabilities")?;
    rustix::thread::set_no_new_privs(true).stage("no_new_privs")?;
    clock.lap("hostname, loopback, rlimits, capabilities, no_new_privs");
    let landlock = match config.landlock {
        Some((fd, enforcement)) => {
            // SAFETY: the launcher passed this descriptor (the ruleset made ahead) for this
            // process, which inherited it in the fork; wrapped exactly once, here.
            let ruleset = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
            landlock::restrict(ruleset).stage("landlock")?;
            enforcement
        }
        None => landlock::apply(&plan.landlock).stage("landlock")?,
    };
    clock.lap("landlock");
    let program = seccomp::prepare().stage("seccomp")?;
    clock.lap("seccomp (compile, unless the launcher did)");
    seccomp::install(program).stage("seccomp")?;
    clock.lap("seccomp (install)");
    cordon_runtime::mark("init: seccomp");
    // From here on only the allowlist's calls are possible, in this process and its children.

    status.send(&Message::Ready(Ready {
        landlock: match landlock {
            landlock::Enforcement::Full => "full",
            landlock::Enforcement::Partial => "partial",
            landlock::Enforcement::None => "none",
        }
        .to_owned(),
        landlock_abi: landlock::kernel_abi(),
        seccomp_programs: 1,
        mounts,
        groups_dropped: !config.unprivileged,
        memfd_exec_refused,
        timings: clock.laps,
    }));
    // What starting the command needs is made ready while the launcher checks the boundary;
    // a failure is reported once the launcher says go, as before.
    let start = prepare_start(plan);
    if !wait_for(&mut sync, GO_EXEC) {
        return Ok(0);
    }
    drop(sync);
    start_and_reap(start?, status)
}

fn set_not_dumpable() -> std::io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes an integer and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Stage durations, measured with the monotonic clock.
struct Stopwatch {
    last: std::time::Instant,
    laps: Vec<(String, u64)>,
}

impl Stopwatch {
    fn start() -> Self {
        Stopwatch {
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    fn lap(&mut self, stage: &str) {
        let now = std::time::Instant::now();
        let us = u64::try_from((now - self.last).as_micros()).unwrap_or(u64::MAX);
        self.laps.push((stage.to_owned(), us));
        self.last = now;
    }
}

/// Reads one byte and checks it; end of file (the launcher is gone or said stop) is `false`.
fn wait_for(sync: &mut File, expected: u8) -> bool {
    let mut b = [0u8; 1];
    loop {
        match sync.read(&mut b) {
            Ok(1) => return b[0] == expected,
            Ok(_) => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// Resource limits set before the command starts: no core dumps (they would write the command's
/// memory to the host), and bounded queued signals and POSIX message queue bytes, which the
/// kernel counts per user across namespaces.
fn set_rlimits() -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    for (resource, limit) in [
        (Resource::Core, 0),
        (Resource::Sigpending, 4096),
        (Resource::Msgqueue, 1 << 19),
    ] {
        // Only ever lower: raising a hard limit is not this process's to do.
        let have = getrlimit(resource);
        let limit = have.maximum.map_or(limit, |m| m.min(limit));
        setrlimit(
            resource,
            Rlimit {
                current: Some(limit),
                maximum: Some(limit),
            },
        )?;
    }
    Ok(())
}

/// Signals init receives and forwards to the command's process group, plus `SIGCHLD`.
const FORWARDED: [libc::c_int; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
];

/// Forks the command, reports how its exec went, then reaps until it ends.
/// The command's start, made ready before the launcher's go.
struct Start {
    argv: sys::CStringArray,
    envp: sys::CStringArray,
    candidates: Vec<CString>,
    /// The signals init waits for (the forwarded ones and `SIGCHLD`), blocked.
    blocked: libc::sigset_t,
    command: String,
}

fn prepare_start(plan: &Plan) -> Result<Start, Failure> {
    let argv =
        sys::CStringArray::new(plan.argv.iter().map(|s| s.as_bytes().to_vec())).stage("exec")?;
    let envp =
        sys::CStringArray::new(plan.env.iter().map(|(k, v)| format!("{k}={v}"))).stage("exec")?;
    let candidates = candidates(plan).stage("exec")?;
    std::env::set_current_dir(&plan.cwd).stage("chdir")?;

    let mut all = FORWARDED.to_vec();
    all.push(libc::SIGCHLD);
    let blocked = sys::sigset(&all);
    // SAFETY: sigprocmask with valid set pointers; init is single-threaded.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut()) };

    // Only the standard streams pass to the command (init's own descriptors are marked
    // close-on-exec), and it starts with every signal at its default disposition: an ignored
    // signal stays ignored across exec, and init's runtime ignores SIGPIPE (so would the
    // command, and `yes | head` would end in an error instead of the signal), as the caller
    // may ignore others.
    sys::cloexec_from(3).stage("exec")?;
    sys::default_signal_dispositions();
    Ok(Start {
        argv,
        envp,
        candidates,
        blocked,
        command: plan.argv[0].clone(),
    })
}

fn start_and_reap(start: Start, status: &mut Status) -> Result<i32, Failure> {
    let Start {
        argv,
        envp,
        candidates,
        blocked,
        command,
    } = start;
    let started = match spawn(&candidates, &argv, &envp) {
        Ok(pid) => {
            cordon_runtime::mark("init: spawned");
            status.send(&Message::Started { pid });
            pid
        }
        Err(errno) => {
            status.send(&Message::ExecFailed { errno, command });
            return Ok(0);
        }
    };
    let pid = started;

    loop {
        let mut info: libc::siginfo_t =
            // SAFETY: siginfo_t is plain data; zeroes are valid.
            unsafe { std::mem::zeroed() };
        // SAFETY: waits for one of the blocked signals; `info` is a valid out-pointer.
        let sig = unsafe { libc::sigwaitinfo(&blocked, &mut info) };
        if sig < 0 {
            continue;
        }
        if sig != libc::SIGCHLD {
            // SAFETY: kill(2) on the command's process group (its pid, it called setsid).
            unsafe { libc::kill(-pid, sig) };
            continue;
        }
        loop {
            let mut wstatus = 0;
            // SAFETY: waitpid with a valid out-pointer.
            let r = unsafe { libc::waitpid(-1, &mut wstatus, libc::WNOHANG) };
            if r <= 0 {
                break;
            }
            if r == pid {
                {
                    let (code, signal) = if libc::WIFEXITED(wstatus) {
                        (Some(libc::WEXITSTATUS(wstatus)), None)
                    } else if libc::WIFSIGNALED(wstatus) {
                        (None, Some(libc::WTERMSIG(wstatus)))
                    } else {
                        (None, None)
                    };
                    cordon_runtime::mark("init: command exited");
                    status.send(&Message::Exited { code, signal });
                }
                return Ok(0);
            }
        }
    }
}

/// The paths `execve` is tried on, as `execvp` would: the name itself when it has a slash,
/// otherwise each `PATH` directory of the plan's environment.
fn candidates(plan: &Plan) -> Result<Vec<CString>, std::ffi::NulError> {
    let name = &plan.argv[0];
    if name.contains('/') {
        return Ok(vec![CString::new(name.as_bytes())?]);
    }
    let path = plan
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/bin:/bin", |(_, v)| v.as_str());
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| {
            CString::new(
                Path::new(d)
                    .join(name)
                    .into_os_string()
                    .into_encoded_bytes(),
            )
        })
        .collect()
}

/// What the spawned child reads (and writes back) while it shares init's memory.
struct SpawnArgs<'a> {
    candidates: &'a [CString],
    argv: &'a sys::CStringArray,
    envp: &'a sys::CStringArray,
    empty: libc::sigset_t,
    /// The errno of the last exec attempt that mattered, written by the child before it exits.
    errno: std::sync::atomic::AtomicI32,
}

/// The spawned child: a new session, no signal blocked (dispositions are already the defaults),
/// then `execve` of each candidate as `execvp` would. Runs on its own stack in init's memory
/// (`CLONE_VM | CLONE_VFORK`, init suspended until it execs or exits), so it makes system calls
/// only, allocates nothing and returns nowhere.
extern "C" fn spawned(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `SpawnArgs` `spawn` passed, alive in the shared memory while init is
    // suspended by CLONE_VFORK.
    let a = unsafe { &*(arg as *const SpawnArgs<'_>) };
    // SAFETY: setsid takes no arguments and touches no memory.
    unsafe { libc::setsid() };
    // SAFETY: sigprocmask reads the valid signal set passed and writes nothing.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &a.empty, std::ptr::null_mut()) };
    let mut errno = libc::ENOENT;
    for c in a.candidates {
        // SAFETY: `c`, `argv` and `envp` are NUL-terminated and NULL-terminated as execve needs
        // and outlive the call.
        unsafe { libc::execve(c.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr()) };
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOENT);
        // As execvp: a missing candidate lets the search go on; anything else is remembered.
        if e != libc::ENOENT && e != libc::ENOTDIR {
            errno = e;
        }
    }
    a.errno.store(errno, std::sync::atomic::Ordering::Relaxed);
    sys::exit_now(127)
}

/// Starts the command as a vfork child of init (its memory, a copy of cordon's, is not copied
/// again): see [`spawned`]. `Err` is the errno of the last exec attempt that mattered.
fn spawn(
    candidates: &[CString],
    argv: &sys::CStringArray,
    envp: &sys::CStringArray,
) -> Result<libc::pid_t, i32> {
    const STACK: usize = 64 << 10;
    // Unmapped below.
    let stack = sys::map_stack(STACK).map_err(|_| libc::ENOMEM)?;
    let args = SpawnArgs {
        candidates,
        argv,
        envp,
        empty: sys::sigset(&[]),
        errno: std::sync::atomic::AtomicI32::new(0),
    };
    // SAFETY: one past the end of the STACK-byte mapping: the top of the child's stack.
    let top = unsafe { stack.cast::<u8>().add(STACK) };
    // SAFETY: `spawned` runs on the mapping above (stacks grow down) with `args`, which outlives
    // the call: with CLONE_VFORK this thread resumes only once the child has executed the
    // command or exited. SIGCHLD reports its end to init's reaper.
    let pid = unsafe {
        libc::clone(
            spawned,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast(),
        )
    };
    let clone_errno = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: the mapping made above, no longer in use (the child has exec'd or exited).
    unsafe { libc::munmap(stack, STACK) };
    if pid < 0 {
        return Err(clone_errno.unwrap_or(libc::EAGAIN));
    }
    match args.errno.load(std::sync::atomic::Ordering::Relaxed) {
        0 => Ok(pid),
        errno => {
            // The child exited without executing anything: reap it here.
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            Err(errno)
        }
    }
}
