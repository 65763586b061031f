//! The allocator of the musl build: dlmalloc behind a lock of the standard library's.
//!
//! musl's own allocator gives memory back to the kernel eagerly, and each unmap in a process
//! with several threads is a TLB shootdown on the other CPUs: with it a run took 7 % longer than
//! the glibc build, with dlmalloc 16 % less (ARCHITECTURE.md, "the binary"). The dlmalloc
//! crate's own global allocator takes a `pthread_mutex` around every call, a function call into
//! the C library and its checks each time (~2,000 allocations in a run); the standard library's
//! futex lock is one atomic instruction each way when nobody waits, which is nearly always.
//!
//! Fork: the launcher forks init only once no other thread of it can run
//! (`launcher::own_status`), so the lock is free in the child.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// dlmalloc, one heap for every thread.
pub struct Allocator(Mutex<dlmalloc::Dlmalloc>);

impl Allocator {
    pub const fn new() -> Allocator {
        Allocator(Mutex::new(dlmalloc::Dlmalloc::new()))
    }

    fn heap(&self) -> MutexGuard<'_, dlmalloc::Dlmalloc> {
        // Nothing panics while the lock is held (dlmalloc's calls do not), so poisoning would
        // only mean a panic elsewhere on this thread: the heap itself is consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// SAFETY: every method hands the caller's layout (or the one the block was allocated with, as
// GlobalAlloc's contract guarantees for dealloc and realloc) to the dlmalloc call of the same
// meaning, under the lock, so no two threads use the heap at once; dlmalloc returns null on
// failure and blocks aligned as asked, which is what GlobalAlloc requires.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl; a non-zero size is GlobalAlloc's precondition, passed on.
        unsafe { self.heap().malloc(layout.size(), layout.align()) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`; dlmalloc clears what it does not know to be fresh.
        unsafe { self.heap().calloc(layout.size(), layout.align()) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout` (GlobalAlloc's precondition).
        unsafe { self.heap().free(ptr, layout.size(), layout.align()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`, and `new_size` is non-zero and
        // does not overflow when rounded up to the alignment (GlobalAlloc's preconditions).
        unsafe {
            self.heap()
                .realloc(ptr, layout.size(), layout.align(), new_size)
        }
    }
}

/// The size of musl's `DIR` (`struct __dirstream`: an offset, four ints, a 2048-byte buffer).
const MUSL_DIR_BYTES: usize = 8 + 4 * 4 + 2048;

/// Keeps two blocks of the C library's own allocator for the whole process: a small one and
/// one of a directory listing's size. The C library still allocates with musl's allocator for
/// itself: `std::fs::canonicalize` goes through its `realpath`, which returns a string it
/// allocated, and `std::fs::read_dir` through its `opendir`. That allocator maps a group of
/// blocks for the first block taken and unmaps the group when the last is freed, so every
/// canonicalized path and every listing cost an mmap and an munmap (a TLB shootdown on the
/// other CPUs when threads run there): ~30 in a run, some in the cleanup that the run's end
/// waits for. With one block of each group always taken, the others are reused; one 8-byte
/// block keeps the groups that paths of every length up to ~70 bytes were seen to use. Should
/// a musl size things differently, this does no more than hold 2 KiB.
pub fn hold_allocator_groups() {
    for size in [8, MUSL_DIR_BYTES] {
        // SAFETY: malloc takes a size and returns a block or null; the block is never used or
        // freed, on purpose. (`black_box`: an allocation nothing uses may be optimized away.)
        std::hint::black_box(unsafe { libc::malloc(size) });
    }
}
