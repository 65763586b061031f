//! Typed wrappers for the few syscalls neither `rustix` nor the standard library covers. Callers
//! never see raw return codes: every wrapper returns `io::Result`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::thread::Thread;

/// `clone3` flags cordon uses (the kernel's values, `include/uapi/linux/sched.h`).
pub mod clone_flags {
    /// New user namespace.
    pub const NEWUSER: u64 = 0x1000_0000;
    /// New PID namespace.
    pub const NEWPID: u64 = 0x2000_0000;
    /// New mount namespace.
    pub const NEWNS: u64 = 0x0002_0000;
    /// New network namespace.
    pub const NEWNET: u64 = 0x4000_0000;
    /// New IPC namespace.
    pub const NEWIPC: u64 = 0x0800_0000;
    /// New UTS namespace.
    pub const NEWUTS: u64 = 0x0400_0000;
    /// New cgroup namespace.
    pub const NEWCGROUP: u64 = 0x0200_0000;
    /// Return a pidfd for the child.
    pub const PIDFD: u64 = 0x0000_1000;
    /// Start the child in the cgroup given by `clone_args.cgroup`.
    pub const INTO_CGROUP: u64 = 0x2_0000_0000;
}

/// Converts a `-1 / errno` return into `io::Result`.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// What `clone3` returned.
#[derive(Debug)]
pub enum Cloned {
    /// In the parent: the child's pid and a pidfd for it.
    Parent {
        /// The child's pid in the parent's pid namespace.
        pid: libc::pid_t,
        /// A pidfd referring to the child.
        pidfd: OwnedFd,
    },
    /// In the child.
    Child,
}

/// `clone3` without a new stack (fork semantics) returning a pidfd, optionally straight into the
/// cgroup `cgroup_fd`.
///
/// # Safety
/// In the child only async-signal-safe operations are allowed until `execve` or `_exit` when the
/// calling process has other threads: the child is a copy of this one thread, and locks other
/// threads held (the allocator's among them) stay held forever in it.
pub unsafe fn clone3(flags: u64, cgroup_fd: Option<BorrowedFd<'_>>) -> io::Result<Cloned> {
    let mut pidfd: RawFd = -1;
    // SAFETY: `clone_args` is a plain C struct for which all-zeroes is a valid value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags | clone_flags::PIDFD;
    args.pidfd = std::ptr::addr_of_mut!(pidfd) as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    if let Some(fd) = cgroup_fd {
        args.flags |= clone_flags::INTO_CGROUP;
        args.cgroup = fd.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid, fully initialized `clone_args` of the size passed; `pidfd`
    // outlives the call. No stack is given, so the child runs on a copy of this stack (fork
    // semantics); the caller upholds the async-signal-safety contract for the child.
    let ret = check(unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of_mut!(args),
            std::mem::size_of::<libc::clone_args>(),
        )
    })?;
    if ret == 0 {
        Ok(Cloned::Child)
    } else {
        // SAFETY: with CLONE_PIDFD the kernel stored a new, owned file descriptor in `pidfd`.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let pid = libc::pid_t::try_from(ret)
            .map_err(|_| io::Error::other("clone3 returned an out-of-range pid"))?;
        Ok(Cloned::Parent { pid, pidfd })
    }
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE?, attr)`: changes mount attributes of the
/// (possibly detached) mount tree `fd` refers to. `userns_fd` is required with `MOUNT_ATTR_IDMAP`.
pub fn mount_setattr(
    fd: BorrowedFd<'_>,
    recursive: bool,
    set: u64,
    clear: u64,
    userns_fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = libc::mount_attr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: userns_fd.map_or(0, |f| f.as_raw_fd() as u64),
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: the path is a valid NUL-terminated empty string; `attr` is a valid `mount_attr` of
    // the size passed and outlives the call; `fd` is a live descriptor borrowed for the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            std::ptr::addr_of_mut!(attr),
            std::mem::size_of::<libc::mount_attr>(),
        )
    })
    .map(drop)
}

/// Gives the calling thread alone (raw system calls: glibc would apply `setgroups` to every
/// thread) the file-system identity `uid`:`gid` with no supplementary groups. Leaving fsuid 0
/// also clears the thread's file-system capabilities (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`,
/// `CAP_FOWNER`, …): paths are then reached, and files created, as that user. Other
/// capabilities (`CAP_SYS_ADMIN`: mounting) stay. Checked by reading the ids back.
pub fn take_fs_identity(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups with a count of 0 reads no memory.
    check(unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) })?;
    // setfsgid/setfsuid report no error; `-1` (u32::MAX) only reads the current value back.
    // SAFETY: setfsgid takes an integer and touches no memory.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid) };
    // SAFETY: as above, setfsuid.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid) };
    // SAFETY: as above.
    let fsgid = unsafe { libc::syscall(libc::SYS_setfsgid, u32::MAX) };
    // SAFETY: as above.
    let fsuid = unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) };
    if (fsuid, fsgid) != (libc::c_long::from(uid), libc::c_long::from(gid)) {
        return Err(io::Error::other(format!(
            "fsuid/fsgid are {fsuid}/{fsgid}, not {uid}/{gid}"
        )));
    }
    Ok(())
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)`. Returns only on failure.
///
/// Async-signal-safe: performs no allocation.
///
/// # Safety
/// `argv` and `envp` must be NULL-terminated arrays of pointers to NUL-terminated strings that
/// stay valid for the call.
pub unsafe fn execveat(
    fd: RawFd,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> io::Error {
    // SAFETY: the caller guarantees argv and envp; the path is an empty NUL-terminated string.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            argv,
            envp,
            libc::AT_EMPTY_PATH,
        )
    };
    io::Error::last_os_error()
}

/// Clears `FD_CLOEXEC` on `fd` so that it survives the next exec. Async-signal-safe.
pub fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) takes an int flag argument and touches no memory.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } as libc::c_long).map(drop)
}

/// Marks every descriptor from `first` up close-on-exec (`close_range(first, ~0,
/// CLOSE_RANGE_CLOEXEC)`): nothing the caller inherited survives its next exec unless it is
/// cleared again. Async-signal-safe.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes integer arguments and touches no memory.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    })
    .map(drop)
}

/// Closes every descriptor from 3 up except those in `keep` (`close_range` over the gaps).
/// Async-signal-safe.
pub fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|&fd| u32::try_from(fd).ok())
        .collect();
    keep.sort_unstable();
    let mut from = 3u32;
    for fd in keep.into_iter().filter(|&fd| fd >= 3) {
        if fd > from {
            close_range(from, fd - 1)?;
        }
        from = fd + 1;
    }
    close_range(from, libc::c_uint::MAX)
}

fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: close_range takes integer arguments and touches no memory. Closing descriptors
    // that Rust objects own is sound only because the caller never uses or drops them again
    // (see `close_all_but`'s callers).
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) }).map(drop)
}

/// What `PIDFD_GET_INFO` says of a process.
#[derive(Debug, Clone, Copy)]
pub struct PidfdInfo {
    /// Its pid, in the caller's pid namespace.
    pub pid: i32,
    /// Its parent's pid, in the caller's pid namespace.
    pub ppid: i32,
    /// The id of its cgroup v2 cgroup.
    pub cgroup_id: u64,
    /// Its real uid, on the host.
    pub uid: u32,
}

/// Asks the kernel about the process behind a pidfd (`PIDFD_GET_INFO`, Linux 6.13): its pid,
/// parent and cgroup, about exactly that process whatever became of its pid number.
pub fn pidfd_info(pidfd: &impl std::os::fd::AsFd) -> io::Result<PidfdInfo> {
    /// `struct pidfd_info` up to its first version's size (64 bytes).
    #[repr(C)]
    #[derive(Default)]
    struct Raw {
        mask: u64,
        cgroupid: u64,
        pid: u32,
        tgid: u32,
        ppid: u32,
        ids: [u32; 8],
        spare: u32,
    }
    const _: () = assert!(std::mem::size_of::<Raw>() == 64);
    const PIDFD_INFO_PID: u64 = 1 << 0;
    const PIDFD_INFO_CREDS: u64 = 1 << 1;
    const PIDFD_INFO_CGROUPID: u64 = 1 << 2;
    /// `_IOWR(PIDFS_IOCTL_MAGIC = 0xFF, 11, struct pidfd_info)` for a 64-byte struct.
    #[allow(clippy::cast_possible_wrap)] // musl's request type is `int`; the kernel reads 32 bits
    const PIDFD_GET_INFO: libc::Ioctl =
        ((3u32 << 30) | (64 << 16) | (0xFF << 8) | 11) as libc::Ioctl;
    let mut raw = Raw {
        mask: PIDFD_INFO_PID | PIDFD_INFO_CREDS | PIDFD_INFO_CGROUPID,
        ..Raw::default()
    };
    // SAFETY: PIDFD_GET_INFO reads the requested mask from and writes at most 64 bytes (the size
    // encoded in the request) into `raw`, which is 64 bytes and outlives the call.
    let r = unsafe {
        libc::ioctl(
            pidfd.as_fd().as_raw_fd(),
            PIDFD_GET_INFO,
            std::ptr::addr_of_mut!(raw),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if raw.mask & (PIDFD_INFO_PID | PIDFD_INFO_CGROUPID) != PIDFD_INFO_PID | PIDFD_INFO_CGROUPID {
        return Err(io::Error::other(
            "the kernel did not report the pid and cgroup",
        ));
    }
    Ok(PidfdInfo {
        pid: i32::try_from(raw.pid).map_err(io::Error::other)?,
        ppid: i32::try_from(raw.ppid).map_err(io::Error::other)?,
        cgroup_id: raw.cgroupid,
        // `ids` is ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid (PIDFD_INFO_CREDS is always
        // reported).
        uid: raw.ids[0],
    })
}

/// A new private anonymous mapping of `len` bytes, readable and writable, for a stack
/// (`MAP_STACK`): the caller runs a thread or process on it and unmaps it, or never does.
pub fn map_stack(len: usize) -> io::Result<*mut libc::c_void> {
    // SAFETY: a new mapping at an address the kernel chooses; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base)
}

/// The pid namespace of the process behind a pidfd (`PIDFD_GET_PID_NAMESPACE`, Linux 6.11), as
/// a descriptor, found without `/proc` (which a caller inside the sandbox's mount namespace, as
/// the launcher is right after the clone, does not have).
pub fn pidfd_pid_namespace(pidfd: impl std::os::fd::AsFd) -> io::Result<OwnedFd> {
    /// `_IO(PIDFS_IOCTL_MAGIC = 0xFF, 5)`.
    const PIDFD_GET_PID_NAMESPACE: libc::Ioctl = (0xFF << 8) | 5;
    // SAFETY: the request takes no argument and returns a new descriptor or -1.
    let fd = unsafe { libc::ioctl(pidfd.as_fd().as_raw_fd(), PIDFD_GET_PID_NAMESPACE, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads a small kernel-made file (`/proc`, cgroupfs, sysctl) into a string with one 8 KiB
/// read, where `fs::read_to_string` starts with a 32-byte probe and doubles (six reads for
/// `/proc/self/stat`): these files report size 0, and each read is a system call.
pub fn read_text(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes all of `buf` to `fd`, retrying on `EINTR`. Async-signal-safe.
pub fn write_all_raw(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice of the given length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// `_exit(code)`: ends the process without running destructors or `atexit` handlers.
/// Async-signal-safe.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

/// A NULL-terminated `char *[]` built from owned C strings, for `execve`. Build it before any
/// `clone`: the child only reads the pointers.
#[derive(Debug)]
pub struct CStringArray {
    _owned: Vec<std::ffi::CString>,
    ptrs: Vec<*const libc::c_char>,
}

impl CStringArray {
    /// Builds the array. Fails when an item contains a NUL byte.
    pub fn new<I, S>(items: I) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<Vec<u8>>,
    {
        let owned = items
            .into_iter()
            .map(std::ffi::CString::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut ptrs: Vec<*const libc::c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        Ok(CStringArray {
            _owned: owned,
            ptrs,
        })
    }

    /// The `char *const[]` pointer, valid while `self` lives.
    pub fn as_ptr(&self) -> *const *const libc::c_char {
        self.ptrs.as_ptr()
    }
}

/// The kernel's description of an errno value, for messages.
pub fn errno_name(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}

/// Sets every signal (1–64, but `SIGKILL` and `SIGSTOP`) to its default disposition, the real-time
/// signals the C library keeps for itself included (its wrappers refuse those, so this is the
/// raw `rt_sigaction`). Async-signal-safe.
pub fn default_signal_dispositions() {
    /// The kernel's `struct sigaction` on x86-64.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let dfl = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads the `KernelSigaction` passed (SIG_DFL, no handler to call)
        // and writes nothing (null old action); the mask size is the kernel's 8 bytes.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::addr_of!(dfl),
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
    }
}

/// A signal set holding exactly `signals`.
pub fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; zeroes are a valid (if unspecified) value that
    // sigemptyset then initializes.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for &s in signals {
        // SAFETY: as above; an invalid signal number only makes sigaddset fail.
        unsafe { libc::sigaddset(&mut set, s) };
    }
    set
}

/// The CPU the calling thread runs on, as the C library tells it: musl through the vDSO's
/// `getcpu`, found by the lookup its clock already made (~0.3 µs for the first call here);
/// glibc from the area the kernel keeps current for restartable sequences. rustix's own
/// `sched_getcpu` first looks the vDSO up itself, ~25 µs of the launcher's start here.
fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of the caller's.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Restricts the calling thread to the CPU it runs on (a thread it starts inherits that) and
/// returns the CPUs it had, to give back with [`unpin`]; `None` if it could not.
fn pin_here() -> Option<rustix::thread::CpuSet> {
    let all = rustix::thread::sched_getaffinity(None).ok()?;
    let mut here = rustix::thread::CpuSet::new();
    here.set(current_cpu()?);
    rustix::thread::sched_setaffinity(None, &here).ok()?;
    Some(all)
}

/// Gives the calling thread back the CPUs [`pin_here`] took away.
fn unpin(all: Option<rustix::thread::CpuSet>) {
    if let Some(all) = all {
        let _ = rustix::thread::sched_setaffinity(None, &all);
    }
}

/// Spawns a thread on another CPU than the caller's when the process may use one, for work that
/// should overlap the caller's. Left to itself the scheduler may queue a new thread behind its
/// creator, which then gains nothing until it blocks, or run it first on the creator's CPU,
/// which then waits for it (both seen here, the second costing up to a millisecond). So the
/// creator restricts the new thread to the other CPUs, and the thread, if it runs first anyway,
/// moves itself there at once. Once it has moved it may use any CPU the process may.
pub fn spawn_elsewhere<F, T>(name: &str, stack_size: usize, f: F) -> io::Result<Thread<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let allowed = rustix::thread::sched_getaffinity(None).ok();
    let elsewhere = allowed
        .zip(current_cpu())
        .and_then(|(all, here)| others_than(here, &all));
    let handle = crate::thread::spawn(name, stack_size, move || {
        if let (Some(others), Some(all)) = (&elsewhere, &allowed) {
            leave(others, all);
        }
        f()
    })?;
    if let Some(others) = &elsewhere {
        pin(&handle, others);
    }
    Ok(handle)
}

/// Runs `f`, which starts a thread it does not place itself (the runtime's recording thread),
/// with the calling thread restricted to the CPU it is on: the new thread inherits that, and
/// starts and stays there, beside the caller rather than on a CPU whose work is more urgent (the
/// sandbox's init, just cloned) or one that must first be woken. The caller gets back every CPU
/// it had.
pub fn spawning_here<R>(f: impl FnOnce() -> R) -> R {
    let all = pin_here();
    let r = f();
    unpin(all);
    r
}

/// [`spawning_here`], the new thread also ahead of its creator on the CPU they share: it starts
/// with a higher priority (nice -10; the creator's own is raised around the spawn, then given
/// back, and the thread inherits it), for work the caller will wait for but that must share the
/// caller's CPU with the caller's own (the runtime's recording thread, whose record gates the
/// command's start, beside the launcher's work while init builds: left level, the scheduler
/// gave the launcher the CPU back for ~0.5 ms in the middle of the record). Without the
/// privilege to raise a priority the thread starts level with its creator.
pub fn spawning_here_first<R>(f: impl FnOnce() -> R) -> R {
    use rustix::process::{Pid, getpriority_process, setpriority_process};
    // The calling thread (Linux's PRIO_PROCESS takes a thread id).
    let me = Pid::from_raw(rustix::thread::gettid().as_raw_nonzero().get());
    let before = getpriority_process(me).ok();
    let raised = before.is_some() && setpriority_process(me, -10).is_ok();
    let r = spawning_here(f);
    if let (true, Some(before)) = (raised, before) {
        let _ = setpriority_process(me, before);
    }
    r
}

/// Joins a thread started by [`spawn_elsewhere`], first letting it use every CPU the process may:
/// one still waiting for the other CPU (a virtual CPU the hypervisor has not run for a while;
/// seen here for over a millisecond) may then run on the caller's, which is about to wait.
pub fn join_elsewhere<T>(handle: Thread<T>) -> std::thread::Result<T> {
    if let Ok(all) = rustix::thread::sched_getaffinity(None) {
        pin(&handle, &all);
    }
    handle.join()
}

/// Moves the calling thread to one of `others` (a no-op when it already runs on one), then lets
/// it use any of `all` again: the scheduler does not move a running thread back at once.
fn leave(others: &rustix::thread::CpuSet, all: &rustix::thread::CpuSet) {
    let _ = rustix::thread::sched_setaffinity(None, others);
    let _ = rustix::thread::sched_setaffinity(None, all);
}

/// Waits at most `limit` for `fd` to be readable without going to sleep: it asks with a poll
/// that does not block and yields the CPU in between, and says whether `fd` became readable.
/// For a wait known to be short (init's exit, once it has reported the command's): a thread
/// that sleeps lets its virtual CPU halt, and waking a halted one costs ~40-190 µs here when the
/// host is quiet and up to ~0.8 ms when it is loaded (see [`bring_here`]); the yield lets any
/// other task of this CPU (init's exit, say) run first. The caller blocks afterwards if need be.
pub fn spin_until_readable(fd: impl std::os::fd::AsFd, limit: std::time::Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let until = std::time::Instant::now() + limit;
    loop {
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        if poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0) {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::yield_now();
    }
}

/// Restricts a parked thread (one blocked, waiting to be handed work) to the caller's CPU, for
/// work meant to fill the time the caller then spends waiting (on the disk, say). Woken where
/// it last ran, the thread would wait for an idle CPU to wake, which is dear on a virtual
/// machine: a wakeup across CPUs costs ~40-190 µs here when the host is quiet and up to ~0.8 ms
/// when it is loaded, against ~6-30 µs on one CPU (a pipe ping-pong, hot and after idling);
/// and the caller's own wakeup, when the thread is done, is then across CPUs too. The thread
/// stays there: it is meant for a short job, after which it ends.
pub fn bring_here<T>(handle: &Thread<T>) {
    if let Some(cpu) = current_cpu() {
        let mut here = rustix::thread::CpuSet::new();
        here.set(cpu);
        pin(handle, &here);
    }
}

/// Restricts a parked thread to the CPUs other than the caller's (when the process may use
/// another), for work handed to it now that should overlap the caller's own rather than compete
/// with it: the sandbox's mounts taken down while the launcher tears the run down and records
/// its end (on the launcher's CPU the two took turns, and the run's end waited for both).
pub fn send_elsewhere<T>(handle: &Thread<T>) {
    let others = rustix::thread::sched_getaffinity(None)
        .ok()
        .zip(current_cpu())
        .and_then(|(all, here)| others_than(here, &all));
    if let Some(others) = others {
        pin(handle, &others);
    }
}

/// The CPUs of `all` other than `cpu`, if there are any.
fn others_than(cpu: usize, all: &rustix::thread::CpuSet) -> Option<rustix::thread::CpuSet> {
    use rustix::thread::CpuSet;
    let mut others = CpuSet::new();
    for c in (0..CpuSet::MAX_CPU).filter(|&c| c != cpu && all.is_set(c)) {
        others.set(c);
    }
    (others.count() > 0).then_some(others)
}

/// Restricts a thread (not yet joined; it may not have run yet, or have ended) to the CPUs in
/// `cpus`.
fn pin<T>(handle: &Thread<T>, cpus: &rustix::thread::CpuSet) {
    // SAFETY: cpu_set_t is plain data for which zeroes are valid (the empty set).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| cpus.is_set(c)) {
        // SAFETY: `c` is below the set's capacity (rustix's MAX_CPU is CPU_SETSIZE).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the handle's pthread_t names a live (not yet joined) thread; `set` is a valid
    // cpu_set_t of the size passed.
    unsafe {
        libc::pthread_setaffinity_np(
            handle.pthread(),
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    /// The spin sees a descriptor become readable while it waits, and gives up on one that
    /// does not within its limit (the control: the same pipe, nothing written).
    #[test]
    fn spin_until_readable_sees_data_and_gives_up_without() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        let started = Instant::now();
        assert!(!spin_until_readable(&r, Duration::from_millis(5)));
        assert!(started.elapsed() >= Duration::from_millis(5));

        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            std::fs::File::from(w).write_all(b"x").unwrap();
        });
        assert!(spin_until_readable(&r, Duration::from_secs(10)));
        writer.join().unwrap();
    }
}
