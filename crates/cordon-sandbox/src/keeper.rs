//! The keeper of a one-shot process's address space: a second process that shares it and
//! outlives the process by a moment, so that taking the address space down is not part of the
//! process's exit.
//!
//! A process's exit tears down its address space (`exit_mmap`: every page-table entry of the
//! binary's text, of its data and of the mapped eBPF event ring removed, the pages released)
//! before its parent is told. For `cordon run` that was ~0.8 ms of a ~9 ms run on the machine
//! described in ARCHITECTURE.md (some 1,700 entries, each a costly page-table update on a
//! nested virtual machine), paid after the run's end was recorded and before whoever started
//! cordon learnt its exit status. An address space is taken down by its last user. The keeper,
//! cloned with `CLONE_VM` (a process of its own, not a thread: `exit_group` does not take it
//! along), is that last user: when cordon exits its mapping count merely drops, its parent is
//! told at once, and the keeper, woken by the end of file of a pipe whose only writer was
//! cordon, ends and takes the address space down on its own time.
//!
//! What the keeper does, and why it is harmless:
//! - It runs on a small stack of its own and makes raw system calls only (the C library's
//!   wrappers set `errno` in the calling thread's thread-local storage, which the keeper shares
//!   with cordon's main thread), touching no memory but its own stack frame.
//! - First it closes every descriptor it was cloned with but its end of the pipe: nothing
//!   cordon holds (the caller's standard streams, the ledger, the cgroup) is kept open by it, so
//!   a caller reading cordon's output sees its end when cordon exits.
//! - It runs with every signal blocked (they are blocked around the clone) and under
//!   `SCHED_IDLE`, so that its teardown yields the CPU to any other task, the caller woken by
//!   cordon's exit first; then it waits for the end of file and returns, which ends it.
//! - The pipe's write end is close-on-exec and belongs to cordon alone (the keeper is started
//!   once the command runs, after every process cordon forks for a run); a process forked from
//!   cordon later would only delay the keeper's end. Cordon never closes it: its exit does,
//!   also a `kill -9`.
//! - Orphaned when cordon exits, the keeper is reparented to the nearest subreaper or to pid 1,
//!   which reaps it as any orphan. It is not part of the run: it is outside the sandbox and its
//!   cgroup, and the command cannot reach it.
//!
//! Only a process that ends with its run has one ([`crate::thread::one_shot_process`]), started
//! by the launcher once the command runs, when it has nothing else to do; it exists on x86-64
//! only (the raw system calls are written for it) and is skipped, silently, wherever it cannot
//! be started (or a run ends before its command runs): the address space is then taken down by
//! cordon's exit, as before.

/// Starts the keeper of this process's address space (see the module documentation). Call it
/// once, in a process that ends with its run (`thread::start_keeper` does). With `refill`, the
/// keeper, once cordon has exited, also makes a set of empty namespaces for the next run at
/// the paths it names (see [`pool`](crate::pool)); it reads them only then, when nothing else
/// of this process runs.
pub fn start(refill: Option<crate::pool::Refill>) -> std::io::Result<()> {
    imp::start(refill)
}

/// Makes, on the calling thread, a set of empty namespaces for the pool at the paths `refill`
/// names, as a keeper does once cordon has exited: what the pool's tests use. The thread is
/// left in the new network, IPC and UTS namespaces.
#[cfg(test)]
pub(crate) fn refill_here(refill: &crate::pool::Refill) {
    imp::produce(refill);
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::io;
    use std::os::fd::{AsRawFd, IntoRawFd};

    /// The keeper's stack: it needs a few hundred bytes.
    const STACK: usize = 16 * 1024;

    /// What the keeper calls itself (`/proc/<pid>/comm`).
    const NAME: &std::ffi::CStr = c"cordon-keeper";

    /// A system call made with the `syscall` instruction itself: no C library wrapper, so no
    /// `errno` written into thread-local storage, and no memory touched but what the call
    /// itself reads or writes. Unused arguments are passed as 0.
    ///
    /// # Safety
    /// The arguments must be valid for system call `nr`.
    unsafe fn syscall(nr: libc::c_long, args: [usize; 4]) -> libc::c_long {
        // SAFETY: the caller's contract, with a fifth argument of 0.
        unsafe { syscall5(nr, [args[0], args[1], args[2], args[3], 0]) }
    }

    /// [`syscall`] with five arguments.
    ///
    /// # Safety
    /// The arguments must be valid for system call `nr`.
    unsafe fn syscall5(nr: libc::c_long, args: [usize; 5]) -> libc::c_long {
        let ret: libc::c_long;
        // SAFETY: the x86-64 Linux system call convention: the number in rax, the arguments in
        // rdi, rsi, rdx, r10 and r8, the result in rax; the kernel clobbers rcx and r11 and
        // uses no user stack. What the call does with memory is the caller's contract.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr => ret,
                in("rdi") args[0],
                in("rsi") args[1],
                in("rdx") args[2],
                in("r10") args[3],
                in("r8") args[4],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// What the keeper is handed: its end of the pipe, and what to make for the pool, both
    /// leaked by [`start`] (never freed: the address space goes with the keeper).
    struct Job {
        fd: usize,
        refill: Option<crate::pool::Refill>,
    }

    /// The keeper: see the module documentation. `arg` is its [`Job`]. It returns when its end
    /// of the pipe reads end of file (or fails), having made a set for the pool if asked to;
    /// the C library's clone then makes the `exit` system call, which ends it.
    extern "C" fn keep(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `Job` `start` leaked for the keeper, never written after.
        let job = unsafe { &*arg.cast::<Job>() };
        let fd = job.fd;
        // The C library's mask, inherited, leaves its own real-time signals open: the kernel's
        // call blocks them too.
        let all: u64 = !0;
        let mask = &raw const all as usize;
        // SAFETY: rt_sigprocmask reads the 8-byte set on this frame and writes nothing back.
        unsafe {
            syscall(
                libc::SYS_rt_sigprocmask,
                [libc::SIG_SETMASK as usize, mask, 0, size_of::<u64>()],
            )
        };
        // Closing the copies of the descriptors this process was cloned with touches nothing of
        // cordon's: they are this process's own table, and nothing here uses them.
        if fd > 0 {
            // SAFETY: close_range takes integers.
            unsafe { syscall(libc::SYS_close_range, [0, fd - 1, 0, 0]) };
        }
        // SAFETY: as above.
        unsafe { syscall(libc::SYS_close_range, [fd + 1, u32::MAX as usize, 0, 0]) };
        let priority: libc::c_int = 0;
        let param = &raw const priority as usize;
        // SAFETY: sched_setscheduler reads the `int` priority (0, as SCHED_IDLE requires) on
        // this frame.
        unsafe {
            syscall(
                libc::SYS_sched_setscheduler,
                [0, libc::SCHED_IDLE as usize, param, 0],
            )
        };
        let name = NAME.as_ptr() as usize;
        // SAFETY: PR_SET_NAME reads the NUL-terminated static string.
        unsafe { syscall(libc::SYS_prctl, [libc::PR_SET_NAME as usize, name, 0, 0]) };
        let mut byte = 0u8;
        let buf = &raw mut byte as usize;
        // SAFETY: read writes at most one byte into `byte`, on this frame.
        while unsafe { syscall(libc::SYS_read, [fd, buf, 1, 0]) }
            == -libc::c_long::from(libc::EINTR)
        {}
        // Cordon has exited: nothing else runs in this address space now.
        if let Some(refill) = &job.refill {
            if let Some(set) = refill.claimed.as_ref().and_then(|c| c.paths()) {
                unpin(set);
            }
            produce(refill);
        }
        0
    }

    /// The raw system calls the keeper's work for the pool makes, each wrapped so that its
    /// pointers come from references (NUL-terminated strings, a frame's own `ifreq`), and
    /// reporting success as a `bool`.
    mod raw {
        use std::ffi::CStr;

        use super::{syscall, syscall5};

        fn path(p: &CStr) -> usize {
            p.as_ptr() as usize
        }

        pub(super) fn exists(p: &CStr) -> bool {
            // SAFETY: access reads the NUL-terminated path.
            unsafe { syscall(libc::SYS_access, [path(p), libc::F_OK as usize, 0, 0]) == 0 }
        }

        pub(super) fn mkdir(p: &CStr) -> bool {
            // SAFETY: mkdir reads the NUL-terminated path.
            unsafe { syscall(libc::SYS_mkdir, [path(p), 0o700, 0, 0]) == 0 }
        }

        /// Creates an empty file (read-only, never there before) to bind a namespace onto.
        pub(super) fn create(p: &CStr) -> bool {
            let flags = (libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC) as usize;
            // SAFETY: open reads the NUL-terminated path.
            let fd = unsafe { syscall(libc::SYS_open, [path(p), flags, 0o400, 0]) };
            let Ok(fd) = usize::try_from(fd) else {
                return false;
            };
            // SAFETY: close of the descriptor just opened.
            unsafe { syscall(libc::SYS_close, [fd, 0, 0, 0]) };
            true
        }

        pub(super) fn bind(from: &CStr, to: &CStr) -> bool {
            /// `MS_BIND` (`linux/mount.h`).
            const MS_BIND: usize = 4096;
            // SAFETY: mount reads the two NUL-terminated paths; no type, no data.
            unsafe { syscall5(libc::SYS_mount, [path(from), path(to), 0, MS_BIND, 0]) == 0 }
        }

        pub(super) fn make_private(p: &CStr) -> bool {
            /// `MS_PRIVATE` (`linux/mount.h`).
            const MS_PRIVATE: usize = 1 << 18;
            // SAFETY: mount reads the NUL-terminated path; no source, type or data.
            unsafe { syscall5(libc::SYS_mount, [0, path(p), 0, MS_PRIVATE, 0]) == 0 }
        }

        pub(super) fn detach(p: &CStr) {
            // SAFETY: umount2 reads the NUL-terminated path.
            unsafe {
                syscall(
                    libc::SYS_umount2,
                    [path(p), libc::MNT_DETACH as usize, 0, 0],
                )
            };
        }

        pub(super) fn unlink(p: &CStr) {
            // SAFETY: unlink reads the NUL-terminated path.
            unsafe { syscall(libc::SYS_unlink, [path(p), 0, 0, 0]) };
        }

        pub(super) fn rmdir(p: &CStr) {
            // SAFETY: rmdir reads the NUL-terminated path.
            unsafe { syscall(libc::SYS_rmdir, [path(p), 0, 0, 0]) };
        }

        /// Renames `from` to `to` unless `to` exists.
        pub(super) fn rename_new(from: &CStr, to: &CStr) -> bool {
            let cwd = libc::AT_FDCWD as usize;
            let noreplace = libc::RENAME_NOREPLACE as usize;
            let args = [cwd, path(from), cwd, path(to), noreplace];
            // SAFETY: renameat2 reads the two NUL-terminated paths.
            unsafe { syscall5(libc::SYS_renameat2, args) == 0 }
        }

        /// The calling task's own network, IPC and UTS namespaces.
        pub(super) fn unshare_namespaces() -> bool {
            let flags = (libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) as usize;
            // SAFETY: unshare takes flags only.
            unsafe { syscall(libc::SYS_unshare, [flags, 0, 0, 0]) == 0 }
        }

        pub(super) fn sethostname(name: &[u8]) -> bool {
            let (p, len) = (name.as_ptr() as usize, name.len());
            // SAFETY: sethostname reads `len` bytes of the slice.
            unsafe { syscall(libc::SYS_sethostname, [p, len, 0, 0]) == 0 }
        }

        /// Brings loopback up in the calling task's network namespace.
        pub(super) fn loopback_up() -> bool {
            /// `IFF_UP`, as the `short` an `ifreq` carries.
            const IFF_UP: libc::c_short = 0x1;
            /// `SIOCGIFFLAGS` and `SIOCSIFFLAGS` (`linux/sockios.h`).
            const SIOCGIFFLAGS: usize = 0x8913;
            const SIOCSIFFLAGS: usize = 0x8914;
            let inet = libc::AF_INET as usize;
            let dgram = (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as usize;
            // SAFETY: socket takes integers.
            let sock = unsafe { syscall(libc::SYS_socket, [inet, dgram, 0, 0]) };
            let Ok(sock) = usize::try_from(sock) else {
                return false;
            };
            // SAFETY: `ifreq` is plain data for which zeroes are valid.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
                *dst = *src as libc::c_char;
            }
            let at = &raw mut req as usize;
            // SAFETY: SIOCGIFFLAGS fills the `ifreq` of this frame, which outlives the call.
            let mut up = unsafe { syscall(libc::SYS_ioctl, [sock, SIOCGIFFLAGS, at, 0]) == 0 };
            if up {
                // SAFETY: after SIOCGIFFLAGS the kernel initialized the union's flags member.
                let flags = unsafe { req.ifr_ifru.ifru_flags };
                req.ifr_ifru.ifru_flags = flags | IFF_UP;
                let at = &raw const req as usize;
                // SAFETY: SIOCSIFFLAGS reads the `ifreq` of this frame.
                up = unsafe { syscall(libc::SYS_ioctl, [sock, SIOCSIFFLAGS, at, 0]) == 0 };
            }
            // SAFETY: close of the socket opened above.
            unsafe { syscall(libc::SYS_close, [sock, 0, 0, 0]) };
            up
        }
    }

    /// Makes a set of empty namespaces for the pool at the paths `r` names, in raw system calls
    /// (see [`crate::pool`]): the calling task unshares a network, an IPC and a UTS namespace,
    /// brings loopback up, names the host, binds the three namespaces onto files in a new
    /// directory and renames that into a free slot. Nothing is made when both slots are taken;
    /// whatever fails is undone, as far as it can be; nothing is reported (the next run makes
    /// its own namespaces when the pool is empty).
    pub(super) fn produce(r: &crate::pool::Refill) {
        if r.slots.iter().all(|s| raw::exists(s)) {
            return;
        }
        if !(raw::unshare_namespaces()
            && raw::sethostname(cordon_runtime::HOSTNAME.as_bytes())
            && raw::loopback_up()
            && raw::mkdir(&r.build.dir))
        {
            return;
        }
        // Into the first free slot; a slot taken meanwhile is never replaced.
        let placed = pin(&r.build) && r.slots.iter().any(|s| raw::rename_new(&r.build.dir, s));
        if !placed {
            unpin(&r.build);
        }
    }

    /// The set's `ns` directory bound onto itself, private, and the three namespaces bound onto
    /// files in it: whether all of it was done.
    fn pin(set: &crate::pool::SetPaths) -> bool {
        const SOURCES: [&std::ffi::CStr; 3] = [
            c"/proc/thread-self/ns/net",
            c"/proc/thread-self/ns/ipc",
            c"/proc/thread-self/ns/uts",
        ];
        raw::mkdir(&set.ns)
            && raw::bind(&set.ns, &set.ns)
            && raw::make_private(&set.ns)
            && set
                .files
                .iter()
                .zip(SOURCES)
                .all(|(file, source)| raw::create(file) && raw::bind(source, file))
    }

    /// Undoes [`pin`] and the set's directory, whatever is left of them.
    fn unpin(set: &crate::pool::SetPaths) {
        raw::detach(&set.ns);
        for file in &set.files {
            raw::unlink(file);
        }
        raw::rmdir(&set.ns);
        raw::rmdir(&set.dir);
    }

    pub(super) fn start(refill: Option<crate::pool::Refill>) -> io::Result<()> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // Never unmapped once the keeper runs on it: it goes with the address space.
        let stack = crate::sys::map_stack(STACK)?;
        // Every signal blocked in the keeper from its first instruction (but the C library's
        // own two, which it blocks itself right away): a signal it took would run cordon's
        // handler on the keeper's stack, with the main thread's thread-local storage.
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initializes the set it is given.
        unsafe { libc::sigfillset(all.as_mut_ptr()) };
        // SAFETY: reads the set initialized above and stores the calling thread's previous
        // mask into `old`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr()) };
        let top = stack.cast::<u8>().wrapping_add(STACK);
        // Never freed: the keeper reads it until it ends, after this process.
        let job: &'static Job = Box::leak(Box::new(Job {
            fd: read.as_raw_fd() as usize,
            refill,
        }));
        // SAFETY: `keep` runs on the mapping above (stacks grow down from `top`), in a process
        // sharing this address space (CLONE_VM, no CLONE_THREAD, exit signal 0); it makes raw
        // system calls only and touches only its own frame, `NAME` and `job`, which nothing
        // writes after this point.
        let pid = unsafe {
            libc::clone(
                keep,
                top.cast(),
                libc::CLONE_VM,
                std::ptr::from_ref(job).cast_mut().cast(),
            )
        };
        let cloned = if pid < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
        // SAFETY: restores the mask stored above, on the same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
        if cloned.is_err() {
            // SAFETY: the mapping made above, which no process runs on.
            unsafe { libc::munmap(stack, STACK) };
            return cloned;
        }
        // The keeper has its own copy of the read end; the write end stays open until this
        // process's exit closes it (its number is let go of, never to be closed here).
        drop(read);
        let _ = write.into_raw_fd();
        Ok(())
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub(super) fn start(_: Option<crate::pool::Refill>) -> std::io::Result<()> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    #[cfg(test)]
    pub(super) fn produce(_: &crate::pool::Refill) {}
}
