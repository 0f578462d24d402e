//! `libunimem-heap.so`: dmable memory for unmodified applications.
//!
//! Preloaded (`LD_PRELOAD`), it replaces the process's allocation API
//! (`malloc`, `calloc`, `realloc`, `reallocarray`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`,
//! `malloc_usable_size`): allocations of at least `FI_UNIMEM_HEAP_THRESHOLD`
//! bytes (1 by default: all) come from the process's dmable region, the
//! rest from the system allocator. The provider, loaded later, adopts that
//! region through a small C handshake (`unimem_dma::heap_abi`), so the
//! application's buffers are dmable: a rendezvous moves them with one DMA,
//! and a one-sided operation on any window goes direct.
//!
//! - `real.rs`: the system allocator (`dlsym(RTLD_NEXT)`), the bootstrap
//!   arena, and the library's own Rust allocator;
//! - `heap.rs`: the region side, the provider's side of the handshake,
//!   fork; `small.rs`: the size classes of small blocks; `ranges.rs`:
//!   which addresses are ours, without a lock;
//! - `exports.rs`: the C functions; `config.rs`: the tunables; `log.rs`.
//!
//! The library never loads libfabric (nor anything beyond libc): MPI
//! brings its own libfabric, and a second copy would be trouble.

// The unit tests leave the C functions out (a test binary must keep the
// system's malloc): what only they use is dead there.
#![cfg_attr(test, allow(dead_code))]

mod config;
#[cfg(not(test))]
mod exports;
mod heap;
mod log;
mod ranges;
mod real;
mod small;

#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: real::SystemDirect = real::SystemDirect;

/// Resolves the system allocator and registers the fork handlers, before
/// `main`.
extern "C" fn init() {
    let _ = real::get();
    let _ = heap::threshold();
    // SAFETY: registering three `extern "C" fn()` handlers.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        )
    };
}

/// Holds the heap's lock across `fork`, so that the child's copy of the
/// heap (and of the region's allocator, used only under that lock) is
/// consistent.
extern "C" fn before_fork() {
    std::mem::forget(heap::HEAP.lock());
}

extern "C" fn after_fork_parent() {
    // SAFETY: `before_fork` in this thread locked it and forgot the guard.
    unsafe { heap::HEAP.force_unlock() };
}

extern "C" fn after_fork_child() {
    // SAFETY: as in the parent: the forking thread is this one.
    unsafe { heap::HEAP.force_unlock() };
    heap::HEAP.lock().after_fork();
}

/// At exit: unlink the region's objects from /dev/shm (the mappings stay:
/// destructors and `atexit` handlers after this one may still free).
extern "C" fn fini() {
    if heap::REGION_PID.load(std::sync::atomic::Ordering::Relaxed) == std::process::id() {
        let _ = std::panic::catch_unwind(unimem_mailbox::shm::remove_own_objects);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
