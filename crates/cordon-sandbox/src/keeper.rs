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
/// once, in a process that ends with its run (`thread::start_keeper` does).
pub fn start() -> std::io::Result<()> {
    imp::start()
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
        let ret: libc::c_long;
        // SAFETY: the x86-64 Linux system call convention: the number in rax, the arguments in
        // rdi, rsi, rdx and r10, the result in rax; the kernel clobbers rcx and r11 and uses
        // no user stack. What the call does with memory is the caller's contract.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr => ret,
                in("rdi") args[0],
                in("rsi") args[1],
                in("rdx") args[2],
                in("r10") args[3],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// The keeper: see the module documentation. `arg` is the number of its end of the pipe.
    /// It returns when that end reads end of file (or fails); the C library's clone then makes
    /// the `exit` system call, which ends it.
    extern "C" fn keep(arg: *mut libc::c_void) -> libc::c_int {
        let fd = arg as usize;
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
        0
    }

    pub(super) fn start() -> io::Result<()> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // SAFETY: a new private anonymous mapping, which nothing else refers to; it is never
        // unmapped (the keeper runs on it until the address space goes).
        let stack = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if stack == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
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
        // SAFETY: `keep` runs on the mapping above (stacks grow down from `top`), in a process
        // sharing this address space (CLONE_VM, no CLONE_THREAD, exit signal 0); it makes raw
        // system calls only and touches only its own frame and `NAME`. Its argument is a
        // descriptor number, not a pointer.
        let pid = unsafe {
            libc::clone(
                keep,
                top.cast(),
                libc::CLONE_VM,
                read.as_raw_fd() as usize as *mut libc::c_void,
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
    pub(super) fn start() -> std::io::Result<()> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}
