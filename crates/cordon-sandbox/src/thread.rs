//! The launcher's helper threads, and what a one-shot process (`cordon run`) leaves to its exit.
//!
//! A standard-library thread maps its stack, and a signal stack of its own, when it starts; it
//! unmaps the signal stack when it ends and its joiner unmaps the stack. In a process with
//! threads on other CPUs each unmap is a TLB shootdown there: ~20-100 µs on the machine
//! described in ARCHITECTURE.md when the host is quiet, more when it is loaded. A run waits for
//! three helpers to end (the network namespace's and the tree's before init may be cloned, the
//! unmounter's in the cleanup) and for the cleanup's helper, whose own end competes with it. In a
//! process that ends with its run ([`one_shot_process`]), a helper instead runs on a stack this
//! module maps (with a guard page below it) and never unmaps: the process's exit takes it down
//! with the rest. Without a signal stack, a helper that overflows its stack is killed with the
//! process by the fault on the guard page, without the standard library's message. Any other
//! process gets standard-library threads.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// See [`one_shot_process`].
static ONE_SHOT: AtomicBool = AtomicBool::new(false);

/// Says that this process ends right after its run (`cordon run`), before any helper thread
/// starts: what it maps for the run (helper threads' stacks, the eBPF event ring) is left for
/// its exit to take down, which needs no TLB shootdown, and that exit leaves taking its
/// address space down to a [`keeper`](crate::keeper) (if one can be started). A long-lived
/// process (a daemon running many runs) must not call this: each run would leave its mappings
/// behind.
pub fn one_shot_process() {
    ONE_SHOT.store(true, Ordering::Relaxed);
    cordon_bpf::observer::leave_mappings_to_exit();
}

/// In a one-shot process, starts the [`keeper`](crate::keeper) of its address space, once,
/// with what `refill` says to make for the namespace pool: the launcher calls this when it has
/// nothing else to do (the command running). Without a keeper the exit takes the address space
/// down itself: slower, nothing lost.
pub(crate) fn start_keeper(refill: impl FnOnce() -> Option<crate::pool::Refill>) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if ONE_SHOT.load(Ordering::Relaxed) && !STARTED.swap(true, Ordering::Relaxed) {
        let _ = crate::keeper::start(refill());
    }
}

/// A helper thread (see the module documentation).
pub struct Thread<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    Std(std::thread::JoinHandle<T>),
    Kept(Kept<T>),
}

impl<T> std::fmt::Debug for Thread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Thread")
            .field("pthread", &self.pthread())
            .field("kept_stack", &matches!(self.inner, Inner::Kept(_)))
            .finish()
    }
}

/// Starts `f` on a thread named `name` with a stack of `stack_size` bytes: on a kept stack in
/// a one-shot process, a standard-library thread otherwise.
pub fn spawn<F, T>(name: &str, stack_size: usize, f: F) -> io::Result<Thread<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let inner = if ONE_SHOT.load(Ordering::Relaxed) {
        Inner::Kept(spawn_kept(name, stack_size, f)?)
    } else {
        Inner::Std(
            std::thread::Builder::new()
                .name(name.to_owned())
                .stack_size(stack_size)
                .spawn(f)?,
        )
    };
    Ok(Thread { inner })
}

impl<T> Thread<T> {
    /// The thread's pthread id, valid until it is joined (or, dropped, has ended).
    pub fn pthread(&self) -> libc::pthread_t {
        match &self.inner {
            Inner::Std(h) => {
                use std::os::unix::thread::JoinHandleExt;
                h.as_pthread_t() as libc::pthread_t
            }
            Inner::Kept(k) => k.id,
        }
    }

    /// Waits for the thread to end: what `f` returned, or its panic.
    pub fn join(self) -> std::thread::Result<T> {
        match self.inner {
            Inner::Std(h) => h.join(),
            Inner::Kept(k) => k.join(),
        }
    }
}

/// What a kept thread leaves for its joiner.
type Packet<T> = Arc<Mutex<Option<std::thread::Result<T>>>>;

/// A thread on a stack of this module's own mapping, which is never unmapped.
struct Kept<T> {
    id: libc::pthread_t,
    packet: Packet<T>,
    /// Whether it was joined (otherwise it is detached when dropped).
    joined: bool,
}

// SAFETY: a pthread id names the thread to any thread of the process (pthread_join, detach and
// setaffinity may be called from any of them); the rest is an `Arc<Mutex<..>>` of a `Send` value.
// This is what makes the standard library's `JoinHandle<T>` `Send` and `Sync` too.
unsafe impl<T: Send> Send for Kept<T> {}
// SAFETY: as above; `&Kept` gives out only the id.
unsafe impl<T: Send> Sync for Kept<T> {}

/// What the new thread is handed.
struct Start<F, T> {
    f: F,
    packet: Packet<T>,
    name: Option<std::ffi::CString>,
}

/// The kept thread's entry: names itself, runs `f` (catching a panic, which must not unwind
/// out of a C function) and leaves the outcome for the joiner.
extern "C" fn start<F, T>(arg: *mut libc::c_void) -> *mut libc::c_void
where
    F: FnOnce() -> T,
{
    // SAFETY: `arg` is the `Box<Start<F, T>>` that `spawn_kept` leaked for this thread, with
    // these type parameters, handed over exactly once.
    let start = unsafe { Box::from_raw(arg.cast::<Start<F, T>>()) };
    let Start { f, packet, name } = *start;
    if let Some(name) = &name {
        let _ = rustix::thread::set_name(name);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    *packet.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    std::ptr::null_mut()
}

/// The size of the guard page below a kept stack.
const GUARD: usize = 4096;

fn spawn_kept<F, T>(name: &str, stack_size: usize, f: F) -> io::Result<Kept<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let size = stack_size.max(64 * 1024).next_multiple_of(GUARD);
    let base = crate::sys::map_stack(GUARD + size)?;
    // SAFETY: `base` starts the mapping made above, at least GUARD bytes long; making its
    // first page inaccessible touches nothing else.
    if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: the mapping made above, not yet handed to anyone.
        unsafe { libc::munmap(base, GUARD + size) };
        return Err(e);
    }
    // Not copied into a process forked from this one (the sandbox's init): no thread of it
    // runs on this stack, and each mapping copied costs the fork and that process's exit.
    // SAFETY: advice on the mapping made above, which changes only what a fork copies.
    unsafe { libc::madvise(base, GUARD + size, libc::MADV_DONTFORK) };
    let packet: Packet<T> = Arc::new(Mutex::new(None));
    let arg = Box::into_raw(Box::new(Start {
        f,
        packet: Arc::clone(&packet),
        name: std::ffi::CString::new(name).ok(),
    }));
    // SAFETY: pthread_attr_t is plain data, initialized by pthread_attr_init before any use.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `attr` is a pthread_attr_t of this process, initialized here once.
    let mut rc = unsafe { libc::pthread_attr_init(&mut attr) };
    if rc == 0 {
        let stack = base.cast::<u8>().wrapping_add(GUARD).cast();
        // SAFETY: `stack` is in the mapping above, `size` bytes above its guard page, never
        // unmapped and used by the one thread created with `attr`.
        rc = unsafe { libc::pthread_attr_setstack(&mut attr, stack, size) };
    }
    let mut id = std::mem::MaybeUninit::<libc::pthread_t>::uninit();
    if rc == 0 {
        // SAFETY: `attr` is initialized; `start::<F, T>` takes the `arg` made for it, with the
        // same type parameters; `id` has room for the new thread's id.
        rc = unsafe { libc::pthread_create(id.as_mut_ptr(), &attr, start::<F, T>, arg.cast()) };
    }
    // SAFETY: `attr` was initialized above (destroying it does not affect the thread); on a
    // failed init, pthread_attr_destroy of the zeroed struct is a no-op in musl and glibc.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if rc != 0 {
        // SAFETY: the thread was not created, so `arg` was not handed over: it is ours to free.
        drop(unsafe { Box::from_raw(arg) });
        // SAFETY: the mapping made above, which no thread uses.
        unsafe { libc::munmap(base, GUARD + size) };
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(Kept {
        // SAFETY: pthread_create succeeded, so it stored the new thread's id.
        id: unsafe { id.assume_init() },
        packet,
        joined: false,
    })
}

impl<T> Kept<T> {
    fn join(mut self) -> std::thread::Result<T> {
        self.joined = true;
        // SAFETY: `id` names a thread created joinable and neither joined nor detached yet.
        let rc = unsafe { libc::pthread_join(self.id, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(Box::new(format!("pthread_join: error {rc}")));
        }
        self.packet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| Err(Box::new("the thread left no outcome")))
    }
}

impl<T> Drop for Kept<T> {
    /// Not joined: detached, it ends by itself (its stack stays mapped, as every kept stack).
    fn drop(&mut self) {
        if !self.joined {
            // SAFETY: `id` names a thread created joinable and neither joined nor detached.
            unsafe { libc::pthread_detach(self.id) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept thread runs on its own stack, under its name, and hands back what it returned.
    #[test]
    fn a_kept_thread_returns_its_value_and_is_named() {
        let t = spawn_kept("cordon-test-kt", 64 * 1024, || {
            let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
            let here = 0u8;
            (name, &here as *const u8 as usize)
        })
        .unwrap();
        let (name, stack_addr) = Thread {
            inner: Inner::Kept(t),
        }
        .join()
        .unwrap();
        assert_eq!(name.trim_end(), "cordon-test-kt");
        let mine = 0u8;
        assert_ne!(stack_addr >> 16, (&mine as *const u8 as usize) >> 16);
    }

    /// A panic comes back as the join's error, as with a standard-library thread, and the
    /// process goes on.
    #[test]
    fn a_kept_threads_panic_comes_back_from_join() {
        let t = spawn_kept("cordon-test-kp", 64 * 1024, || -> u32 {
            panic!("on purpose")
        })
        .unwrap();
        let err = t.join().unwrap_err();
        assert_eq!(err.downcast_ref::<&str>(), Some(&"on purpose"));
    }

    /// Dropped unjoined, a kept thread is detached and still runs to its end.
    #[test]
    fn a_dropped_kept_thread_runs_to_its_end() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let t = spawn_kept("cordon-test-kd", 64 * 1024, move || {
            go.recv().unwrap();
            tx.send(7).unwrap();
        })
        .unwrap();
        drop(t);
        go_tx.send(()).unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
    }

    /// The guard page is there: the page below a kept stack cannot be read or written.
    #[test]
    fn a_kept_stack_has_a_guard_page_below_it() {
        let t = spawn_kept("cordon-test-kg", 64 * 1024, || {
            let here = 0u8;
            let addr = &here as *const u8 as usize;
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            // The mapping holding this frame, and the one just below it.
            let ranges: Vec<(usize, usize, String)> = maps
                .lines()
                .map(|l| {
                    let mut f = l.split_whitespace();
                    let (a, b) = f.next().unwrap().split_once('-').unwrap();
                    (
                        usize::from_str_radix(a, 16).unwrap(),
                        usize::from_str_radix(b, 16).unwrap(),
                        f.next().unwrap().to_owned(),
                    )
                })
                .collect();
            let i = ranges
                .iter()
                .position(|(a, b, _)| (*a..*b).contains(&addr))
                .unwrap();
            (ranges[i].2.clone(), ranges[i - 1].clone(), ranges[i].0)
        })
        .unwrap();
        let (perms, below, start) = t.join().unwrap();
        assert!(perms.starts_with("rw"), "{perms}");
        assert_eq!(below.1, start, "the guard page is adjacent");
        assert_eq!(below.1 - below.0, GUARD);
        assert!(below.2.starts_with("---"), "{}", below.2);
    }
}
