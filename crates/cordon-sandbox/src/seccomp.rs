//! The seccomp filter: a default-kill allowlist of the system calls real workloads (shells,
//! Python, git, compilers) make, with argument filters where a call is needed but some of its
//! uses are not (`clone` creating namespaces, `ioctl(TIOCSTI)`, unusual socket families).
//!
//! One program is installed. Each system call gets one verdict: allowed, an errno (calls that
//! libraries probe and handle gracefully: `clone3` → `ENOSYS` so that glibc falls back to the
//! filterable `clone`; a socket family outside the list → `EAFNOSUPPORT`; a setuid bit → `EPERM`),
//! or `KILL_PROCESS`, the default: everything not named in the allowlist kills the process.
//!
//! The program is cordon's own small compiler's output (see [`compile`]): after the architecture
//! check, a binary search over ranges of system call numbers that share a verdict, so that a call
//! costs about eight comparisons, and the kernel's per-call action cache (which emulates the
//! filter once per number at install time) finds every unconditionally allowed call in a few
//! steps. The linear chains of one comparison per allowed call that general-purpose filter
//! builders emit made the install take ~0.6 ms of every run's startup (four filters, ~1,400
//! instructions); this one is ~200 instructions and installs in a few microseconds. A test runs
//! both through a BPF interpreter and checks that they decide every call alike. In particular, and by design: ptrace,
//! process_vm_readv/writev, mount and the new mount API, pivot_root, chroot, unshare, setns, bpf,
//! keyctl/add_key/request_key, io_uring, perf_event_open, userfaultfd, kexec, module loading,
//! name_to_handle_at/open_by_handle_at, swapon/off, reboot, acct, quotactl, syslog, clock and
//! hostname setters, iopl/ioperm, pidfd_getfd, kcmp.

use std::collections::BTreeMap;

/// Errors building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The table cannot be expressed (a jump beyond classic BPF's reach, too many instructions).
    #[error("compiling the seccomp filter: {0}")]
    Compile(String),
    /// The kernel refused the filter.
    #[error("installing the seccomp filter: {0}")]
    Install(std::io::Error),
}

/// Namespace-creating `clone` flags. A `clone` with any of them set hits the default (kill).
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWTIME) as u32;

/// The terminal ioctls refused: pushing input into a terminal (`TIOCSTI`), the Linux console
/// multiplexer (`TIOCLINUX`, which can also inject text), and setting a line discipline
/// (`TIOCSETD`, which can make the kernel load a module on hosts with `dev.tty.ldisc_autoload`).
const DENIED_IOCTLS: [u32; 3] = [
    request(libc::TIOCSTI),
    request(libc::TIOCLINUX),
    request(libc::TIOCSETD),
];

/// An ioctl request number as the kernel reads it (`unsigned int`); fails the build if one does
/// not fit. The C library's type for it differs (glibc: `unsigned long`; musl: `int`, in which
/// numbers with the top bit set are negative), so the check is a round trip.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked by the assertion, at compile time
const fn request(r: libc::Ioctl) -> u32 {
    let n = r as u32;
    assert!(n as libc::Ioctl == r);
    n
}

/// Socket families a contained command may create. Others get `EAFNOSUPPORT` (soft filter).
const ALLOWED_FAMILIES: [i32; 4] = [
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// System calls allowed without conditions.
const ALLOWED: &[i64] = &[
    // file I/O
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_creat,
    libc::SYS_stat,
    libc::SYS_fstat,
    libc::SYS_lstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_sendfile,
    libc::SYS_copy_file_range,
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_vmsplice,
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_pipe,
    libc::SYS_pipe2,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync,
    libc::SYS_syncfs,
    libc::SYS_sync_file_range,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    libc::SYS_getdents,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rmdir,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_symlink,
    libc::SYS_symlinkat,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_chown,
    libc::SYS_fchown,
    libc::SYS_lchown,
    libc::SYS_fchownat,
    libc::SYS_umask,
    libc::SYS_mknod,
    libc::SYS_mknodat,
    libc::SYS_utime,
    libc::SYS_utimes,
    libc::SYS_utimensat,
    libc::SYS_futimesat,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_memfd_create,
    // polling and events
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    libc::SYS_signalfd,
    libc::SYS_signalfd4,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // legacy asynchronous I/O (not io_uring)
    libc::SYS_io_setup,
    libc::SYS_io_destroy,
    libc::SYS_io_submit,
    libc::SYS_io_cancel,
    libc::SYS_io_getevents,
    // memory
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_madvise,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_membarrier,
    libc::SYS_pkey_mprotect,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_mbind,
    libc::SYS_mseal,
    // System V and POSIX IPC (private to the run's IPC namespace)
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
    // processes and threads (clone is conditional, below)
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_clone3,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_kill,
    libc::SYS_tkill,
    libc::SYS_tgkill,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getpgid,
    libc::SYS_setpgid,
    libc::SYS_getpgrp,
    libc::SYS_getsid,
    libc::SYS_setsid,
    libc::SYS_set_tid_address,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_futex,
    libc::SYS_futex_waitv,
    libc::SYS_arch_prctl,
    libc::SYS_prctl,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_getattr,
    libc::SYS_sched_setattr,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_getcpu,
    libc::SYS_getrlimit,
    libc::SYS_setrlimit,
    libc::SYS_prlimit64,
    libc::SYS_getrusage,
    libc::SYS_times,
    libc::SYS_sysinfo,
    libc::SYS_uname,
    libc::SYS_restart_syscall,
    // identity: reading is free; changing only within what the user namespace maps
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_capget,
    libc::SYS_capset,
    // signals
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_rt_sigsuspend,
    libc::SYS_sigaltstack,
    libc::SYS_pause,
    // time
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_time,
    libc::SYS_alarm,
    libc::SYS_getitimer,
    libc::SYS_setitimer,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete,
    // sockets (socket itself is conditional, below)
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    // randomness, and further self-restriction (which can only narrow the boundary)
    libc::SYS_getrandom,
    libc::SYS_seccomp,
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_restrict_self,
];

/// Answered `ENOSYS` (as if the kernel lacked them), though allowlisted so as not to kill:
/// `clone3` (its flags sit in memory a filter cannot read; glibc falls back to `clone`), `openat2`
/// (likewise its mode), and the legacy AIO calls, whose event reservations count against a
/// host-wide limit (`fs.aio-max-nr`) that one run could exhaust for everyone.
const ENOSYS: [i64; 7] = [
    libc::SYS_clone3,
    libc::SYS_openat2,
    libc::SYS_io_setup,
    libc::SYS_io_destroy,
    libc::SYS_io_submit,
    libc::SYS_io_cancel,
    libc::SYS_io_getevents,
];

/// `S_ISUID | S_ISGID`.
const SET_ID_BITS: u32 = 0o6000;
/// `O_CREAT` and `__O_TMPFILE`: the `open` flags under which the mode argument is used.
const CREATE_FLAGS: [u32; 2] = [0o100, 0o20_000_000];

/// What the filter answers for one system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Let it through.
    Allow,
    /// Fail it with this errno, without running it.
    Errno(u16),
    /// Kill the whole process (`SIGSYS`).
    Kill,
}

impl Verdict {
    /// The `SECCOMP_RET_*` value.
    fn ret(self) -> u32 {
        match self {
            Verdict::Allow => SECCOMP_RET_ALLOW,
            Verdict::Errno(e) => SECCOMP_RET_ERRNO | u32::from(e),
            Verdict::Kill => SECCOMP_RET_KILL_PROCESS,
        }
    }
}

/// A test on the low 32 bits of one argument. Every argument cordon tests is an `int`, an
/// `unsigned int` or a `mode_t` whose high half the kernel ignores, so the high half is ignored
/// here too (garbage there can neither trigger nor dodge a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// `arg & mask != 0`.
    AnyBit(u32),
    /// `arg == value`.
    Is(u32),
}

/// One arm of an argument rule: when every test holds, the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    /// `(argument index, test)`, all of which must hold.
    pub when: Vec<(u8, Test)>,
    /// The verdict when they do.
    pub then: Verdict,
}

/// What the filter does with one system call number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The same verdict whatever the arguments.
    Always(Verdict),
    /// The first arm whose tests hold decides; with none, `otherwise`.
    Args {
        /// The arms, in order.
        arms: Vec<Arm>,
        /// The verdict when no arm matches.
        otherwise: Verdict,
    },
}

fn arm(when: Vec<(u8, Test)>, then: Verdict) -> Arm {
    Arm { when, then }
}

/// The decision table: every system call number the filter names, with its rule. A number
/// absent from the table is killed.
pub fn table() -> BTreeMap<u32, Rule> {
    let nr = |n: i64| u32::try_from(n).expect("system call numbers are small");
    let errno = |e: i32| Verdict::Errno(u16::try_from(e).expect("errno values are small"));
    let mut t: BTreeMap<u32, Rule> = ALLOWED
        .iter()
        .map(|&n| (nr(n), Rule::Always(Verdict::Allow)))
        .collect();
    for n in ENOSYS {
        t.insert(nr(n), Rule::Always(errno(libc::ENOSYS)));
    }
    // clone without namespace flags (they all sit in the low half of the flags word).
    t.insert(
        nr(libc::SYS_clone),
        Rule::Args {
            arms: vec![arm(vec![(0, Test::AnyBit(NAMESPACE_FLAGS))], Verdict::Kill)],
            otherwise: Verdict::Allow,
        },
    );
    // ioctl except terminal injection. The request is an `unsigned int`: compare 32 bits so that
    // garbage in the upper half cannot smuggle a denied request past the check.
    t.insert(
        nr(libc::SYS_ioctl),
        Rule::Args {
            arms: DENIED_IOCTLS
                .iter()
                .map(|&req| arm(vec![(1, Test::Is(req))], Verdict::Kill))
                .collect(),
            otherwise: Verdict::Allow,
        },
    );
    // socket for the allowed families; any other family is answered EAFNOSUPPORT.
    t.insert(
        nr(libc::SYS_socket),
        Rule::Args {
            arms: ALLOWED_FAMILIES
                .iter()
                .map(|&f| arm(vec![(0, Test::Is(f as u32))], Verdict::Allow))
                .collect(),
            otherwise: errno(libc::EAFNOSUPPORT),
        },
    );
    // personality: only the query and the default persona (no ADDR_NO_RANDOMIZE and friends).
    t.insert(
        nr(libc::SYS_personality),
        Rule::Args {
            arms: vec![
                arm(vec![(0, Test::Is(0))], Verdict::Allow),
                arm(vec![(0, Test::Is(0xffff_ffff))], Verdict::Allow),
            ],
            otherwise: Verdict::Kill,
        },
    );
    // A file the command makes setuid or setgid in a writable grant would keep the bit on the
    // host, where the grant is not `nosuid`, as a binary running with the workspace owner's
    // identity: such modes are refused with EPERM. (syscall, index of the mode argument)
    for (n, mode) in [
        (libc::SYS_chmod, 1),
        (libc::SYS_fchmod, 1),
        (libc::SYS_fchmodat, 2),
        (libc::SYS_fchmodat2, 2),
        (libc::SYS_mknod, 1),
        (libc::SYS_mknodat, 2),
        (libc::SYS_creat, 1),
    ] {
        t.insert(
            nr(n),
            Rule::Args {
                arms: vec![arm(
                    vec![(mode, Test::AnyBit(SET_ID_BITS))],
                    errno(libc::EPERM),
                )],
                otherwise: Verdict::Allow,
            },
        );
    }
    // (syscall, index of the flags, index of the mode): the mode counts only when creating.
    for (n, flags, mode) in [(libc::SYS_open, 1, 2), (libc::SYS_openat, 2, 3)] {
        t.insert(
            nr(n),
            Rule::Args {
                arms: CREATE_FLAGS
                    .iter()
                    .map(|&c| {
                        arm(
                            vec![(flags, Test::AnyBit(c)), (mode, Test::AnyBit(SET_ID_BITS))],
                            errno(libc::EPERM),
                        )
                    })
                    .collect(),
                otherwise: Verdict::Allow,
            },
        );
    }
    t
}

/// One classic BPF instruction (`struct sock_filter`).
pub type Insn = libc::sock_filter;
/// A compiled program.
pub type Program = Vec<Insn>;

// Classic BPF opcodes (`linux/bpf_common.h`: class | size/op | mode/source) and seccomp's
// layout and return values.
/// `BPF_LD | BPF_W | BPF_ABS`.
const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`.
const BPF_JMP_JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const BPF_JMP_JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const BPF_JMP_JGE_K: u16 = 0x35;
/// `BPF_JMP | BPF_JSET | BPF_K`.
const BPF_JMP_JSET_K: u16 = 0x45;
/// `BPF_RET | BPF_K`.
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// `offsetof(struct seccomp_data, nr)`, `arch`, `args[0]`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARGS: u32 = 16;
/// System call numbers of the x32 ABI carry this bit; cordon's table is for the 64-bit ABI.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH: u32 = 0xc000_003e;
/// The kernel's limit on one program (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// A run of consecutive system call numbers `[lo, next range's lo)` with one leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    Ret(Verdict),
    /// The argument block of this number.
    Block(u32),
}

/// Compiles `table` to one classic BPF program for seccomp: architecture check, x32 check, a
/// binary search over number ranges (each leaf a return or a jump to an argument block), then
/// the argument blocks.
pub fn compile(table: &BTreeMap<u32, Rule>) -> Result<Program, SeccompError> {
    // Ranges over [0, X32_SYSCALL_BIT): a number in no entry is killed.
    let mut ranges: Vec<(u32, Leaf)> = Vec::new();
    let push = |lo: u32, leaf: Leaf, ranges: &mut Vec<(u32, Leaf)>| {
        if ranges.last().map(|&(_, l)| l) != Some(leaf) {
            ranges.push((lo, leaf));
        }
    };
    let mut next = 0u32;
    for (&nr, rule) in table {
        if nr >= X32_SYSCALL_BIT {
            return Err(SeccompError::Compile(format!(
                "system call number {nr} out of range"
            )));
        }
        if nr > next {
            push(next, Leaf::Ret(Verdict::Kill), &mut ranges);
        }
        let leaf = match rule {
            Rule::Always(v) => Leaf::Ret(*v),
            Rule::Args { .. } => Leaf::Block(nr),
        };
        // An argument block is never merged with a neighbour, even an identical one.
        if let Leaf::Block(_) = leaf {
            ranges.push((nr, leaf));
        } else {
            push(nr, leaf, &mut ranges);
        }
        next = nr + 1;
    }
    push(next, Leaf::Ret(Verdict::Kill), &mut ranges);

    let mut prog: Program = vec![
        insn(BPF_LD_W_ABS, 0, 0, OFF_ARCH),
        insn(BPF_JMP_JEQ_K, 1, 0, AUDIT_ARCH),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        insn(BPF_LD_W_ABS, 0, 0, OFF_NR),
        insn(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ];
    // (index of a `ja` to patch, number whose block it jumps to)
    let mut fixups: Vec<(usize, u32)> = Vec::new();
    search(&ranges, &mut prog, &mut fixups)?;

    let mut blocks: BTreeMap<u32, usize> = BTreeMap::new();
    for (&nr, rule) in table {
        if let Rule::Args { arms, otherwise } = rule {
            blocks.insert(nr, prog.len());
            emit_block(nr, arms, *otherwise, &mut prog)?;
        }
    }
    for (at, nr) in fixups {
        let target = blocks[&nr];
        prog[at].k = u32::try_from(target - at - 1)
            .map_err(|_| SeccompError::Compile("jump out of range".into()))?;
    }
    if prog.len() > MAX_INSNS {
        return Err(SeccompError::Compile(format!(
            "{} instructions, over the kernel's {MAX_INSNS}",
            prog.len()
        )));
    }
    Ok(prog)
}

/// Emits the search over `ranges` (sorted by their first number; each extends to the next's).
/// The accumulator holds the system call number throughout.
fn search(
    ranges: &[(u32, Leaf)],
    prog: &mut Program,
    fixups: &mut Vec<(usize, u32)>,
) -> Result<(), SeccompError> {
    if let [(_, leaf)] = ranges {
        match *leaf {
            Leaf::Ret(v) => prog.push(insn(BPF_RET_K, 0, 0, v.ret())),
            Leaf::Block(nr) => {
                fixups.push((prog.len(), nr));
                prog.push(insn(BPF_JMP_JA, 0, 0, 0));
            }
        }
        return Ok(());
    }
    let mid = ranges.len() / 2;
    let (left, right) = ranges.split_at(mid);
    let split = right[0].0;
    // nr >= split goes right. The true branch jumps over the left half; a left half beyond a
    // conditional jump's 255-instruction reach goes through an unconditional `ja`.
    let at = prog.len();
    prog.push(insn(BPF_JMP_JGE_K, 0, 0, split));
    let left_len = search_len(left);
    let base = if let Ok(jt) = u8::try_from(left_len) {
        prog[at].jt = jt;
        prog.len()
    } else {
        prog[at].jf = 1;
        prog.push(insn(
            BPF_JMP_JA,
            0,
            0,
            u32::try_from(left_len)
                .map_err(|_| SeccompError::Compile("jump out of range".into()))?,
        ));
        prog.len()
    };
    search(left, prog, fixups)?;
    debug_assert_eq!(prog.len() - base, left_len);
    search(right, prog, fixups)
}

/// How many instructions [`search`] emits for `ranges`.
fn search_len(ranges: &[(u32, Leaf)]) -> usize {
    if ranges.len() <= 1 {
        return 1;
    }
    let (left, right) = ranges.split_at(ranges.len() / 2);
    let left_len = search_len(left);
    let trampoline = usize::from(u8::try_from(left_len).is_err());
    1 + trampoline + left_len + search_len(right)
}

/// Emits the argument block of `nr`: each arm's tests in turn (a failing test jumps to the next
/// arm), its verdict, and finally `otherwise`.
fn emit_block(
    nr: u32,
    arms: &[Arm],
    otherwise: Verdict,
    prog: &mut Program,
) -> Result<(), SeccompError> {
    let too_far = || SeccompError::Compile(format!("argument rule of system call {nr} too long"));
    let mut loaded: Option<u8> = None;
    for a in arms {
        if a.when.is_empty() {
            return Err(SeccompError::Compile(format!(
                "an arm of system call {nr} has no test"
            )));
        }
        // Instructions of this arm: a load where the argument changes, one per test, the return.
        let mut len = 1;
        let mut l = loaded;
        for (arg, _) in &a.when {
            if l != Some(*arg) {
                len += 1;
                l = Some(*arg);
            }
            len += 1;
        }
        let start = prog.len();
        for (arg, test) in &a.when {
            if *arg > 5 {
                return Err(SeccompError::Compile(format!(
                    "argument {arg} of system call {nr}"
                )));
            }
            if loaded != Some(*arg) {
                prog.push(insn(BPF_LD_W_ABS, 0, 0, OFF_ARGS + 8 * u32::from(*arg)));
                loaded = Some(*arg);
            }
            // On failure, skip to the first instruction after this arm.
            let here = prog.len();
            let skip = u8::try_from(start + len - here - 1).map_err(|_| too_far())?;
            prog.push(match *test {
                Test::AnyBit(mask) => insn(BPF_JMP_JSET_K, 0, skip, mask),
                Test::Is(v) => insn(BPF_JMP_JEQ_K, 0, skip, v),
            });
        }
        prog.push(insn(BPF_RET_K, 0, 0, a.then.ret()));
        debug_assert_eq!(prog.len(), start + len);
        // The next arm starts where the accumulator holds this arm's last argument, whether
        // the arm failed early or not: a failing test may have left an earlier argument loaded.
        if a.when.windows(2).any(|w| w[0].0 != w[1].0) {
            loaded = None;
        }
    }
    prog.push(insn(BPF_RET_K, 0, 0, otherwise.ret()));
    Ok(())
}

/// Builds the filter for this architecture.
pub fn build() -> Result<Program, SeccompError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(SeccompError::Compile(
            "no seccomp allowlist for this architecture".into(),
        ));
    }
    compile(&table())
}

/// The filter, compiled once per process: the launcher compiles it before cloning init, which
/// then finds it ready in its copy of the launcher's memory.
pub fn prepare() -> Result<&'static Program, SeccompError> {
    static PROGRAM: std::sync::OnceLock<Result<Program, String>> = std::sync::OnceLock::new();
    PROGRAM
        .get_or_init(|| build().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| SeccompError::Compile(e.clone()))
}

/// Installs `program` on the calling thread. `no_new_privs` must already be set.
pub fn install(program: &Program) -> Result<(), SeccompError> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len())
            .map_err(|_| SeccompError::Compile("program too long".into()))?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: SECCOMP_SET_MODE_FILTER with no flags reads the `sock_fprog` passed, which points
    // at `program.len()` instructions owned by `program`; both outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            std::ptr::addr_of!(fprog),
        )
    };
    if r < 0 {
        return Err(SeccompError::Install(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // the low halves of arguments, small syscall numbers
mod tests {
    use super::*;

    /// The filters cordon installed before it compiled its own (seccompiler's linear chains, four
    /// programs, the most severe verdict winning): the reference the compiled program must agree
    /// with, call by call.
    mod reference {
        use super::super::{ALLOWED, ALLOWED_FAMILIES, DENIED_IOCTLS, ENOSYS, NAMESPACE_FLAGS};
        use seccompiler::{
            BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
            SeccompFilter, SeccompRule, TargetArch,
        };
        use std::collections::BTreeMap;

        const SET_ID_BITS: [u64; 2] = [0o4000, 0o2000];
        const CREATE_FLAGS: [u64; 2] = [0o100, 0o20_000_000];

        fn setid_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, Box<dyn std::error::Error>> {
            let bit = |arg: u8, b: u64| {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(b), b)
            };
            let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
            // (syscall, index of the mode argument)
            for (nr, mode) in [
                (libc::SYS_chmod, 1),
                (libc::SYS_fchmod, 1),
                (libc::SYS_fchmodat, 2),
                (libc::SYS_fchmodat2, 2),
                (libc::SYS_mknod, 1),
                (libc::SYS_mknodat, 2),
                (libc::SYS_creat, 1),
            ] {
                let list = SET_ID_BITS
                    .iter()
                    .map(|&b| SeccompRule::new(vec![bit(mode, b)?]))
                    .collect::<Result<Vec<_>, _>>()?;
                rules.insert(nr, list);
            }
            // (syscall, index of the flags, index of the mode)
            for (nr, flags, mode) in [(libc::SYS_open, 1, 2), (libc::SYS_openat, 2, 3)] {
                let mut list = Vec::new();
                for &create in &CREATE_FLAGS {
                    for &b in &SET_ID_BITS {
                        list.push(SeccompRule::new(vec![bit(flags, create)?, bit(mode, b)?])?);
                    }
                }
                rules.insert(nr, list);
            }
            Ok(rules)
        }

        pub fn build() -> Result<Vec<BpfProgram>, Box<dyn std::error::Error>> {
            let arch = if cfg!(target_arch = "x86_64") {
                TargetArch::x86_64
            } else if cfg!(target_arch = "aarch64") {
                TargetArch::aarch64
            } else {
                return Err("no reference for this architecture".into());
            };

            let mut allow: BTreeMap<i64, Vec<SeccompRule>> =
                ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
            // clone without namespace flags.
            allow.insert(
                libc::SYS_clone,
                vec![SeccompRule::new(vec![SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(u64::from(NAMESPACE_FLAGS)),
                    0,
                )?])?],
            );
            // ioctl except terminal injection. The request is an `unsigned int`: compare 32 bits so that
            // garbage in the upper half cannot smuggle a denied request past the check.
            allow.insert(
                libc::SYS_ioctl,
                vec![SeccompRule::new(
                    DENIED_IOCTLS
                        .iter()
                        .map(|&req| {
                            SeccompCondition::new(
                                1,
                                SeccompCmpArgLen::Dword,
                                SeccompCmpOp::Ne,
                                u64::from(req),
                            )
                        })
                        .collect::<Result<_, _>>()?,
                )?],
            );
            // socket for the allowed families (any other family is answered by the soft filter).
            allow.insert(libc::SYS_socket, Vec::new());
            // personality: only the query and the default persona (no ADDR_NO_RANDOMIZE and friends).
            allow.insert(
                libc::SYS_personality,
                vec![
                    SeccompRule::new(vec![SeccompCondition::new(
                        0,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::Eq,
                        0,
                    )?])?,
                    SeccompRule::new(vec![SeccompCondition::new(
                        0,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::Eq,
                        0xffff_ffff,
                    )?])?,
                ],
            );
            let allowlist = SeccompFilter::new(
                allow,
                SeccompAction::KillProcess,
                SeccompAction::Allow,
                arch,
            )?;

            let mut soft: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
            for nr in ENOSYS {
                soft.insert(nr, Vec::new());
            }
            let soft_clone3 = SeccompFilter::new(
                soft,
                SeccompAction::Allow,
                SeccompAction::Errno(libc::ENOSYS as u32),
                arch,
            )?;
            let mut families: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
            families.insert(
                libc::SYS_socket,
                vec![SeccompRule::new(
                    ALLOWED_FAMILIES
                        .iter()
                        .map(|&f| {
                            SeccompCondition::new(
                                0,
                                SeccompCmpArgLen::Dword,
                                SeccompCmpOp::Ne,
                                f as u64,
                            )
                        })
                        .collect::<Result<_, _>>()?,
                )?],
            );
            let soft_families = SeccompFilter::new(
                families,
                SeccompAction::Allow,
                SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
                arch,
            )?;

            let soft_setid = SeccompFilter::new(
                setid_rules()?,
                SeccompAction::Allow,
                SeccompAction::Errno(libc::EPERM as u32),
                arch,
            )?;

            Ok(vec![
                allowlist.try_into()?,
                soft_clone3.try_into()?,
                soft_families.try_into()?,
                soft_setid.try_into()?,
            ])
        }
    }

    /// `struct seccomp_data` as the kernel lays it out.
    fn data(arch: u32, nr: u32, args: [u64; 6]) -> Vec<u8> {
        let mut d = Vec::with_capacity(64);
        d.extend_from_slice(&nr.to_ne_bytes());
        d.extend_from_slice(&arch.to_ne_bytes());
        d.extend_from_slice(&0u64.to_ne_bytes()); // instruction pointer
        for a in args {
            d.extend_from_slice(&a.to_ne_bytes());
        }
        d
    }

    /// A classic BPF interpreter for the instructions seccomp filters use (absolute word loads,
    /// `and`, jumps on constants, returns); anything else fails the test.
    fn run(prog: &[Insn], data: &[u8]) -> u32 {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        for _ in 0..MAX_INSNS {
            let i = prog[pc];
            let k = i.k;
            pc += 1;
            let jump = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
            match i.code {
                0x20 => {
                    let o = k as usize;
                    acc = u32::from_ne_bytes(data[o..o + 4].try_into().unwrap());
                }
                0x54 => acc &= k,
                0x05 => pc += k as usize,
                0x15 => pc += jump(acc == k),
                0x25 => pc += jump(acc > k),
                0x35 => pc += jump(acc >= k),
                0x45 => pc += jump(acc & k != 0),
                0x06 => return k,
                c => panic!("opcode {c:#x} at {}", pc - 1),
            }
        }
        panic!("no return within {MAX_INSNS} steps");
    }

    /// Seccomp's order of severity (`seccomp_run_filters`): lower action values win.
    fn severity(ret: u32) -> i64 {
        let action = ret & 0xffff_0000;
        // KILL_PROCESS (0x80000000) is the most severe; the others order as unsigned values.
        if action == SECCOMP_RET_KILL_PROCESS {
            -1
        } else {
            i64::from(action)
        }
    }

    fn reference_verdict(progs: &[Vec<Insn>], data: &[u8]) -> u32 {
        progs
            .iter()
            .map(|p| run(p, data))
            .min_by_key(|&r| severity(r))
            .unwrap()
    }

    /// The table's meaning, read directly.
    fn decide(table: &BTreeMap<u32, Rule>, nr: u32, args: [u64; 6]) -> Verdict {
        let holds = |(arg, test): &(u8, Test)| {
            let v = args[usize::from(*arg)] as u32;
            match *test {
                Test::AnyBit(m) => v & m != 0,
                Test::Is(x) => v == x,
            }
        };
        match table.get(&nr) {
            None => Verdict::Kill,
            Some(Rule::Always(v)) => *v,
            Some(Rule::Args { arms, otherwise }) => arms
                .iter()
                .find(|a| a.when.iter().all(holds))
                .map_or(*otherwise, |a| a.then),
        }
    }

    fn reference_programs() -> Vec<Vec<Insn>> {
        reference::build()
            .unwrap()
            .into_iter()
            .map(|p| {
                p.into_iter()
                    .map(|f| insn(f.code, f.jt, f.jf, f.k))
                    .collect()
            })
            .collect()
    }

    /// Argument values that sit on the edges of the table's tests.
    fn interesting() -> Vec<u64> {
        let mut v: Vec<u64> = vec![0, 1, 0xffff_ffff, 0xffff_ffff_0000_0000, u64::MAX];
        v.extend([
            0o4000,
            0o2000,
            0o6000,
            0o4755,
            0o0755,
            0o100,
            0o20_000_000,
            0o20_200_000,
        ]);
        v.extend([0o100 | 0o4000, 0o1_000_101]);
        v.extend(DENIED_IOCTLS.iter().map(|&x| u64::from(x)));
        v.extend(DENIED_IOCTLS.iter().map(|&x| u64::from(x) | 1 << 32));
        v.extend([0x5401, 0x5413]); // TCGETS, TIOCGWINSZ
        v.extend(ALLOWED_FAMILIES.iter().map(|&f| f as u64));
        v.extend([17, 16 | 1 << 40, 2 | 1 << 32]); // AF_PACKET, a netlink with high bits, AF_INET+high
        v.extend([
            u64::from(NAMESPACE_FLAGS),
            0x1000_0000,
            0x0002_0000,
            0x11_0000,
            0x3d0f00,
        ]);
        v.extend([8, 0x0040_0000, 0x0004_0000]); // personality values
        v
    }

    #[test]
    fn builds_for_this_arch() {
        let prog = build().unwrap();
        assert!(
            !prog.is_empty() && prog.len() < 400,
            "{} instructions",
            prog.len()
        );
    }

    #[test]
    fn agrees_with_the_reference_filters_on_every_number() {
        let ours = build().unwrap();
        let reference = reference_programs();
        let table = table();
        let vals = interesting();
        let mut checked = 0;
        for nr in (0..1024u32).chain([X32_SYSCALL_BIT, X32_SYSCALL_BIT | 1, u32::MAX]) {
            // Every number with plain arguments, and the numbers with rules with every
            // combination of interesting values in the argument positions they test.
            let mut cases = vec![[0u64; 6]];
            if let Some(Rule::Args { .. }) = table.get(&nr) {
                for &a in &vals {
                    for &b in &vals {
                        for (i, j) in [(0, 1), (1, 2), (2, 3)] {
                            let mut args = [0u64; 6];
                            args[i] = a;
                            args[j] = b;
                            cases.push(args);
                        }
                    }
                }
            }
            for args in cases {
                let d = data(AUDIT_ARCH, nr, args);
                let got = run(&ours, &d);
                let want = reference_verdict(&reference, &d);
                assert_eq!(got, want, "nr {nr} args {args:x?}");
                if nr < X32_SYSCALL_BIT {
                    assert_eq!(
                        got,
                        decide(&table, nr, args).ret(),
                        "nr {nr} args {args:x?}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn another_architecture_is_killed() {
        let ours = build().unwrap();
        let read = libc::SYS_read as u32;
        assert_eq!(
            run(&ours, &data(AUDIT_ARCH, read, [0; 6])),
            SECCOMP_RET_ALLOW
        );
        for arch in [0x4000_0003u32, 0xc000_00b7, 0] {
            assert_eq!(
                run(&ours, &data(arch, read, [0; 6])),
                SECCOMP_RET_KILL_PROCESS
            );
        }
    }

    proptest::proptest! {
        /// Random numbers and arguments: the program does what the table says.
        #[test]
        fn random_calls_follow_the_table(nr in 0u32..600, args: [u64; 6], pick: [usize; 6]) {
            let vals = interesting();
            let mut args = args;
            // Half the arguments from the edge values, the other half random.
            for (a, p) in args.iter_mut().zip(pick) {
                if p % 2 == 0 {
                    *a = vals[p % vals.len()];
                }
            }
            let ours = build().unwrap();
            let d = data(AUDIT_ARCH, nr, args);
            proptest::prop_assert_eq!(run(&ours, &d), decide(&table(), nr, args).ret());
        }

        /// Tables far larger than cordon's, whose ranges need trampolines beyond a conditional
        /// jump's reach, compile to programs that follow them.
        #[test]
        fn large_tables_compile_faithfully(
            entries in proptest::collection::btree_map(0u32..3000, 0u8..8, 0..500),
            probes in proptest::collection::vec((0u32..3100, proptest::prelude::any::<u32>()), 64),
        ) {
            let table: BTreeMap<u32, Rule> = entries
                .into_iter()
                .map(|(nr, kind)| {
                    let rule = match kind {
                        0..=2 => Rule::Always(Verdict::Allow),
                        3 => Rule::Always(Verdict::Errno(38)),
                        4 => Rule::Always(Verdict::Kill),
                        5 => Rule::Args {
                            arms: vec![arm(vec![(1, Test::Is(nr))], Verdict::Allow)],
                            otherwise: Verdict::Errno(1),
                        },
                        _ => Rule::Args {
                            arms: vec![
                                arm(vec![(0, Test::AnyBit(4)), (2, Test::AnyBit(8))], Verdict::Kill),
                                arm(vec![(0, Test::AnyBit(4))], Verdict::Errno(13)),
                            ],
                            otherwise: Verdict::Allow,
                        },
                    };
                    (nr, rule)
                })
                .collect();
            let prog = compile(&table).unwrap();
            for (nr, a) in probes {
                let args = [u64::from(a), u64::from(nr), u64::from(a.rotate_left(3)), 0, 0, 0];
                let d = data(AUDIT_ARCH, nr, args);
                proptest::prop_assert_eq!(run(&prog, &d), decide(&table, nr, args).ret(), "nr {}", nr);
            }
        }
    }

    /// A table whose search tree is wider than a conditional jump reaches: the compiler goes
    /// through trampolines, and the program still follows the table on every number.
    #[test]
    fn far_jumps_go_through_trampolines() {
        let table: BTreeMap<u32, Rule> = (0..2000u32)
            .filter(|n| n % 2 == 0)
            .map(|n| {
                (
                    n,
                    Rule::Always(if n % 4 == 0 {
                        Verdict::Allow
                    } else {
                        Verdict::Errno(1)
                    }),
                )
            })
            .collect();
        let prog = compile(&table).unwrap();
        let trampolines = prog
            .windows(2)
            .filter(|w| w[0].code == BPF_JMP_JGE_K && w[0].jf == 1 && w[1].code == BPF_JMP_JA)
            .count();
        assert!(trampolines > 0);
        for nr in 0..2100 {
            let d = data(AUDIT_ARCH, nr, [0; 6]);
            assert_eq!(run(&prog, &d), decide(&table, nr, [0; 6]).ret(), "nr {nr}");
        }
    }

    #[test]
    fn dangerous_calls_are_not_allowlisted() {
        let table = table();
        for nr in [
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_open_by_handle_at,
            libc::SYS_name_to_handle_at,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_fsopen,
            libc::SYS_fsmount,
            libc::SYS_mount_setattr,
            libc::SYS_pidfd_getfd,
            libc::SYS_kcmp,
            libc::SYS_sethostname,
            libc::SYS_syslog,
        ] {
            assert!(!ALLOWED.contains(&nr), "syscall {nr} is allowlisted");
            assert_eq!(
                decide(&table, nr as u32, [0; 6]),
                Verdict::Kill,
                "syscall {nr}"
            );
        }
    }

    #[test]
    fn allowlist_has_no_duplicates() {
        let mut v = ALLOWED.to_vec();
        v.sort_unstable();
        let before = v.len();
        v.dedup();
        assert_eq!(before, v.len());
    }
}
