//! The seccomp filter: a default-kill allowlist of the system calls real workloads (shells,
//! Python, git, compilers) make, with argument filters where a call is needed but some of its
//! uses are not (`clone` creating namespaces, `ioctl(TIOCSTI)`, unusual socket families).
//!
//! Two filters are installed; the kernel applies the most severe verdict of all filters:
//! 1. the **allowlist**, default action `KILL_PROCESS`;
//! 2. the **soft denials**, default `ALLOW`, returning an errno for calls that libraries probe
//!    and handle gracefully (`clone3` → `ENOSYS` so glibc falls back to the filterable `clone`).
//!
//! Everything not named in the allowlist kills the process. In particular, and by design: ptrace,
//! process_vm_readv/writev, mount and the new mount API, pivot_root, chroot, unshare, setns, bpf,
//! keyctl/add_key/request_key, io_uring, perf_event_open, userfaultfd, kexec, module loading,
//! name_to_handle_at/open_by_handle_at, swapon/off, reboot, acct, quotactl, syslog, clock and
//! hostname setters, iopl/ioperm, pidfd_getfd, kcmp.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Errors building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The rules could not be compiled to BPF.
    #[error("compiling the seccomp filter: {0}")]
    Compile(#[from] seccompiler::Error),
    /// A rule or condition is malformed.
    #[error("building the seccomp rules: {0}")]
    Rule(#[from] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("installing the seccomp filter: {0}")]
    Install(seccompiler::Error),
    /// This architecture has no allowlist.
    #[error("no seccomp allowlist for this architecture")]
    Arch,
}

/// Namespace-creating `clone` flags. A `clone` with any of them set hits the default (kill).
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWTIME) as u64;

/// The terminal ioctls refused: pushing input into a terminal (`TIOCSTI`), the Linux console
/// multiplexer (`TIOCLINUX`, which can also inject text), and setting a line discipline
/// (`TIOCSETD`, which can make the kernel load a module on hosts with `dev.tty.ldisc_autoload`).
const DENIED_IOCTLS: [u64; 3] = [libc::TIOCSTI, libc::TIOCLINUX, libc::TIOCSETD];

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

/// `S_ISUID` and `S_ISGID`.
const SET_ID_BITS: [u64; 2] = [0o4000, 0o2000];
/// `O_CREAT` and `__O_TMPFILE`: the `open` flags under which the mode argument is used.
const CREATE_FLAGS: [u64; 2] = [0o100, 0o20_000_000];

/// Rules matching a request to set the setuid or setgid bit on a file: `EPERM`. A file the
/// command makes setuid or setgid in a writable grant would keep the bit on the host, where the
/// grant is not `nosuid`, as a binary running with the workspace owner's identity.
fn setid_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
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

/// Builds the BPF programs: the allowlist first, then the soft denials.
pub fn build() -> Result<Vec<BpfProgram>, SeccompError> {
    let arch = if cfg!(target_arch = "x86_64") {
        TargetArch::x86_64
    } else if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        return Err(SeccompError::Arch);
    };

    let mut allow: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    // clone without namespace flags.
    allow.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(NAMESPACE_FLAGS),
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
                    SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, req)
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
                    SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, f as u64)
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

/// Installs the programs on the calling thread. `no_new_privs` must already be set.
pub fn install(programs: &[BpfProgram]) -> Result<(), SeccompError> {
    for p in programs {
        seccompiler::apply_filter(p).map_err(SeccompError::Install)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_for_this_arch() {
        let progs = build().unwrap();
        assert_eq!(progs.len(), 4);
        assert!(progs.iter().all(|p| !p.is_empty() && p.len() < 4096));
    }

    #[test]
    fn dangerous_calls_are_not_allowlisted() {
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
