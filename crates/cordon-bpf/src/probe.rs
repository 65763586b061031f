//! Active probes: a short-lived child process born inside a cgroup (`clone3` with
//! `CLONE_INTO_CGROUP`, so it is never outside it) that tries connections, or execs a program,
//! and reports what the kernel answered. Verification uses them, since only a process in the
//! cgroup is subject to its programs.
//!
//! The child runs only async-signal-safe system calls on data prepared before the clone (the
//! parent may have other threads), and reports through a pipe.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of running a probe, each naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Opening the cgroup directory failed.
    #[error("opening cgroup {path}: {source}")]
    OpenCgroup {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Creating the report pipe failed.
    #[error("creating the probe's pipe: {0}")]
    Pipe(io::Error),
    /// `clone3` into the cgroup failed.
    #[error("starting a probe process in cgroup {path}: {source}")]
    Clone {
        /// The cgroup.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The probe did not finish in time and was killed.
    #[error("the probe process in {path} did not finish within {limit:?}")]
    Timeout {
        /// The cgroup.
        path: PathBuf,
        /// The limit.
        limit: Duration,
    },
    /// The probe's report was short or missing.
    #[error("the probe process in {path} reported {got} of {want} results")]
    Report {
        /// The cgroup.
        path: PathBuf,
        /// Results read.
        got: usize,
        /// Results expected.
        want: usize,
    },
    /// Too many probes in one process.
    #[error("{0} probes asked for; at most {MAX_PROBES} run in one process")]
    TooMany(usize),
    /// A path or argument contains NUL.
    #[error("argument {0:?} contains a NUL byte")]
    Nul(String),
}

/// Most probes one child runs.
pub const MAX_PROBES: usize = 16;

/// What a probe tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// A TCP `connect()` (blocking, at most 1 s).
    TcpConnect,
    /// A UDP `connect()`.
    UdpConnect,
    /// An unconnected UDP `sendto()` of one byte.
    UdpSendto,
}

/// One probe: what to try, where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// What.
    pub kind: ProbeKind,
    /// Where.
    pub dest: SocketAddr,
}

/// What the kernel answered to one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// The call succeeded.
    Ok,
    /// The call failed with this errno.
    Failed(i32),
    /// No socket could be made (errno).
    NoSocket(i32),
}

/// The probes' results and the pid of the process that ran them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRun {
    /// The probe process's pid (as the host sees it).
    pub pid: u32,
    /// One result per probe, in order.
    pub results: Vec<ProbeResult>,
}

/// Runs `probes` in a new process born in the cgroup `cgroup_dir`; waits at most `limit`.
pub fn connect_probes(
    cgroup_dir: &Path,
    probes: &[Probe],
    limit: Duration,
) -> Result<ProbeRun, ProbeError> {
    start_connect_probes(cgroup_dir, probes, limit)?.wait()
}

/// Probes started in a process of their own and not yet waited for
/// ([`start_connect_probes`]): the caller may do other work meanwhile.
#[derive(Debug)]
pub struct Started {
    child: Child,
    n: usize,
}

impl Started {
    /// The probe process's pid.
    pub fn pid(&self) -> u32 {
        self.child.pid
    }

    /// Waits for the results (at most the limit given when started, counted from the start).
    pub fn wait(self) -> Result<ProbeRun, ProbeError> {
        let n = self.n;
        let path = self.child.cgroup_dir.clone();
        let (pid, bytes, _) = self.child.wait()?;
        if bytes.len() < n * 4 {
            return Err(ProbeError::Report {
                path,
                got: bytes.len() / 4,
                want: n,
            });
        }
        let results = bytes
            .chunks_exact(4)
            .map(|c| {
                let v = i32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                match v {
                    0 => ProbeResult::Ok,
                    v if v > 0 => ProbeResult::Failed(v),
                    v => ProbeResult::NoSocket(-v),
                }
            })
            .collect();
        Ok(ProbeRun { pid, results })
    }
}

/// Starts `probes` in a new process born in the cgroup `cgroup_dir` and returns at once;
/// [`Started::wait`] collects the results (the process is killed if it takes over `limit`).
pub fn start_connect_probes(
    cgroup_dir: &Path,
    probes: &[Probe],
    limit: Duration,
) -> Result<Started, ProbeError> {
    if probes.len() > MAX_PROBES {
        return Err(ProbeError::TooMany(probes.len()));
    }
    let prepared: Vec<(
        libc::c_int,
        libc::c_int,
        libc::sockaddr_storage,
        libc::socklen_t,
    )> = probes
        .iter()
        .map(|p| {
            let (storage, len) = sockaddr(p.dest);
            let family = if p.dest.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            let ty = match p.kind {
                ProbeKind::TcpConnect => libc::SOCK_STREAM,
                ProbeKind::UdpConnect | ProbeKind::UdpSendto => libc::SOCK_DGRAM,
            };
            (family, ty, storage, len)
        })
        .collect();
    let kinds: Vec<ProbeKind> = probes.iter().map(|p| p.kind).collect();
    let n = probes.len();
    let child = spawn_child(cgroup_dir, limit, n * 4, |w| {
        let mut results = [0i32; MAX_PROBES];
        for (i, (family, ty, storage, len)) in prepared.iter().enumerate() {
            results[i] = child_probe(*family, *ty, storage, *len, kinds[i]);
        }
        child_write(w, results.as_ptr().cast(), n * 4);
    })?;
    Ok(Started { child, n })
}

/// Runs `path` with `args` (argv\[0\] included) in a new process born in the cgroup; returns
/// its pid and exit code (or 128 + signal) after at most `limit`.
pub fn exec_probe(
    cgroup_dir: &Path,
    path: &Path,
    args: &[&str],
    limit: Duration,
) -> Result<(u32, i32), ProbeError> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| ProbeError::Nul(path.display().to_string()))?;
    let c_args: Vec<CString> = args
        .iter()
        .map(|a| CString::new(*a).map_err(|_| ProbeError::Nul((*a).to_owned())))
        .collect::<Result<_, _>>()?;
    let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let child = spawn_child(cgroup_dir, limit, 0, |_| {
        // SAFETY: `c_path`, `argv` and `envp` are NUL-terminated and NULL-terminated arrays
        // prepared before the clone and present in this copy of the address space.
        unsafe { libc::execve(c_path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        // SAFETY: _exit is async-signal-safe and ends this child only.
        unsafe { libc::_exit(127) };
    })?;
    let (pid, _, status) = child.wait()?;
    Ok((pid, status))
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data, valid when zeroed.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: AF_INET,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: AF_INET6,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, socklen(len))
}

const AF_INET: libc::sa_family_t = 2;
const AF_INET6: libc::sa_family_t = 10;

/// A structure size as `socklen_t` (all sizes here are a few dozen bytes).
fn socklen(len: usize) -> libc::socklen_t {
    libc::socklen_t::try_from(len).unwrap_or(libc::socklen_t::MAX)
}

/// In the child: one probe, by raw system calls. Returns 0, the call's errno, or minus the
/// socket's errno.
fn child_probe(
    family: libc::c_int,
    ty: libc::c_int,
    addr: &libc::sockaddr_storage,
    len: libc::socklen_t,
    kind: ProbeKind,
) -> i32 {
    // SAFETY: socket(2) takes no pointers; async-signal-safe.
    let s = unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return -errno();
    }
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a timeval alive for the call, and its size is given.
    unsafe {
        libc::setsockopt(
            s,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            socklen(size_of::<libc::timeval>()),
        )
    };
    let sa = (addr as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
    let failed = match kind {
        ProbeKind::TcpConnect | ProbeKind::UdpConnect => {
            // SAFETY: `sa` points to a sockaddr of `len` bytes prepared before the clone.
            unsafe { libc::connect(s, sa, len) < 0 }
        }
        ProbeKind::UdpSendto => {
            let byte = [0u8; 1];
            // SAFETY: `byte` is one readable byte; `sa` as above.
            unsafe { libc::sendto(s, byte.as_ptr().cast(), 1, 0, sa, len) < 0 }
        }
    };
    let result = if failed { errno() } else { 0 };
    // SAFETY: closing the socket made above.
    unsafe { libc::close(s) };
    result
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn child_write(fd: RawFd, buf: *const u8, len: usize) {
    let mut done = 0;
    while done < len {
        let rest = buf.wrapping_add(done);
        // SAFETY: `rest` points into the `len` readable bytes at `buf`, `len - done` of which
        // remain; write is async-signal-safe.
        let n = unsafe { libc::write(fd, rest.cast(), len - done) };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A child process started by [`spawn_child`].
#[derive(Debug)]
struct Child {
    cgroup_dir: PathBuf,
    pid: u32,
    raw_pid: libc::pid_t,
    pidfd: OwnedFd,
    read_end: OwnedFd,
    report_len: usize,
    started: Instant,
    limit: Duration,
    reaped: bool,
}

impl Drop for Child {
    /// A child never waited for is killed and reaped, not left a zombie.
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // SAFETY: pidfd_send_signal on our own child's pidfd with SIGKILL; no pointers.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        let mut wstatus = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        unsafe { libc::waitpid(self.raw_pid, &mut wstatus, 0) };
    }
}

/// Clones a child into the cgroup that runs `child(pipe_write_fd)` and exits 0; returns at
/// once. [`Child::wait`] collects what it wrote and its status.
fn spawn_child(
    cgroup_dir: &Path,
    limit: Duration,
    report_len: usize,
    child: impl FnOnce(RawFd),
) -> Result<Child, ProbeError> {
    let cgroup = std::fs::File::open(cgroup_dir).map_err(|source| ProbeError::OpenCgroup {
        path: cgroup_dir.to_path_buf(),
        source,
    })?;
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(ProbeError::Pipe(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded, so both are new descriptors owned by nobody else.
    let read_end = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above, for the write end.
    let write_end = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: (&mut pidfd as *mut libc::c_int) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    let started = Instant::now();
    // SAFETY: clone3 without CLONE_VM behaves like fork: the child gets a copy of the address
    // space and returns 0 here; it then runs `child`, which makes only async-signal-safe calls
    // on data prepared before this point, and exits with _exit without returning.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        child(write_end.as_raw_fd());
        // SAFETY: _exit is async-signal-safe and ends this child only.
        unsafe { libc::_exit(0) };
    }
    if ret < 0 {
        return Err(ProbeError::Clone {
            path: cgroup_dir.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    let Ok(raw_pid) = libc::pid_t::try_from(ret) else {
        return Err(ProbeError::Clone {
            path: cgroup_dir.to_path_buf(),
            source: io::Error::from(io::ErrorKind::InvalidData),
        });
    };
    // SAFETY: CLONE_PIDFD stored a new descriptor owned by this process in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(write_end);
    Ok(Child {
        cgroup_dir: cgroup_dir.to_path_buf(),
        pid: raw_pid as u32,
        raw_pid,
        pidfd,
        read_end,
        report_len,
        started,
        limit,
        reaped: false,
    })
}

impl Child {
    /// Waits for the child (killing it once its limit is over): its pid, what it wrote (up to
    /// the report length), and its status (exit code, or 128 + signal).
    fn wait(mut self) -> Result<(u32, Vec<u8>, i32), ProbeError> {
        let mut timed_out = false;
        loop {
            let left = self.limit.saturating_sub(self.started.elapsed());
            let mut pfd = libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: `pfd` is one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                break;
            }
            if n == 0 || left.is_zero() {
                timed_out = true;
                // SAFETY: pidfd_send_signal on our own child's pidfd with SIGKILL; no pointers.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        self.pidfd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
                break;
            }
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let mut wstatus = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        unsafe { libc::waitpid(self.raw_pid, &mut wstatus, 0) };
        self.reaped = true;
        let status = if libc::WIFEXITED(wstatus) {
            libc::WEXITSTATUS(wstatus)
        } else {
            128 + libc::WTERMSIG(wstatus)
        };
        if timed_out {
            return Err(ProbeError::Timeout {
                path: self.cgroup_dir.clone(),
                limit: self.limit,
            });
        }
        let mut out = vec![0u8; self.report_len];
        let mut got = 0;
        while got < self.report_len {
            // SAFETY: reading into `out[got..]`, which has `report_len - got` writable bytes.
            let n = unsafe {
                libc::read(
                    self.read_end.as_raw_fd(),
                    out[got..].as_mut_ptr().cast(),
                    self.report_len - got,
                )
            };
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        out.truncate(got);
        Ok((self.pid, out, status))
    }
}
