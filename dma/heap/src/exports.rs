//! The C allocation API the heap replaces, and the handshake symbol.
//!
//! Each function routes by size (at or above the threshold: the dmable
//! region first) and, for a pointer, by address (the region's ranges, a
//! forked child's inherited ranges, the bootstrap arena, else the system
//! allocator). Semantics are glibc's: `free(NULL)` does nothing,
//! `realloc(NULL, n)` is `malloc(n)`, `realloc(p, 0)` frees `p` and
//! returns NULL, `calloc` checks its product for overflow, the aligned
//! functions check their alignment (EINVAL) as glibc does, and a failure
//! sets `errno` to ENOMEM.

use std::os::raw::{c_int, c_void};

use unimem_dma::heap_abi::{
    HeapAbi, HeapRegionId, HEAP_ABI_MAGIC, HEAP_ABI_VERSION, REGION_LAYOUT,
};

use crate::heap::{self, Owner};
use crate::real;

const PTR_SIZE: usize = std::mem::size_of::<*const c_void>();

fn set_errno(value: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = value };
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// `size` bytes aligned to `align` (a power of two): the region for large
/// sizes, else the system through `system` (called with the real table).
fn alloc_routed(
    size: usize,
    align: usize,
    system: impl FnOnce(&real::Real) -> *mut c_void,
) -> *mut c_void {
    let Some(real) = real::get() else {
        return real::arena_alloc(size, align);
    };
    if size >= heap::threshold() {
        let p = heap::alloc(size, align);
        if !p.is_null() {
            return p;
        }
    }
    system(real)
}

/// Usable size of any pointer the process's allocators handed out.
fn usable(ptr: *mut c_void) -> usize {
    if real::in_arena(ptr) {
        return real::arena_size(ptr);
    }
    match heap::owner(ptr) {
        Owner::Region | Owner::Inherited => heap::usable_size(ptr),
        Owner::System => match real::get().and_then(|r| r.usable_size) {
            // SAFETY: a live pointer of the system allocator.
            Some(usable) => unsafe { usable(ptr) },
            None => 0,
        },
    }
}

/// # Safety
/// As C's `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    // SAFETY: plain malloc of the system.
    alloc_routed(size, 16, |real| unsafe { (real.malloc)(size) })
}

/// # Safety
/// As C's `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    let Some(real) = real::get() else {
        // The arena is never reused: still zero.
        return real::arena_alloc(total, 16);
    };
    if total >= heap::threshold() {
        let p = heap::alloc(total, 16);
        if !p.is_null() {
            // SAFETY: `total` bytes at p are ours (freed memory is reused: zero it).
            unsafe { std::ptr::write_bytes(p as *mut u8, 0, total) };
            return p;
        }
    }
    // SAFETY: plain calloc of the system.
    unsafe { (real.calloc)(count, size) }
}

/// # Safety
/// As C's `free`.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() || real::in_arena(ptr) {
        return;
    }
    match heap::owner(ptr) {
        Owner::Region | Owner::Inherited => heap::free(ptr),
        Owner::System => {
            if let Some(real) = real::get() {
                // SAFETY: a pointer of the system allocator.
                unsafe { (real.free)(ptr) }
            }
        }
    }
}

/// # Safety
/// As C's `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        // SAFETY: as malloc.
        return unsafe { malloc(size) };
    }
    let from_system = !real::in_arena(ptr) && heap::owner(ptr) == Owner::System;
    if from_system {
        let Some(real) = real::get() else {
            return std::ptr::null_mut();
        };
        // Crossing the threshold upwards: into the region if it can (and
        // the system can say how long the old block is).
        let (true, Some(usable)) = (size >= heap::threshold(), real.usable_size) else {
            // SAFETY: a pointer of the system allocator.
            return unsafe { (real.realloc)(ptr, size) };
        };
        let p = heap::alloc(size, 16);
        if p.is_null() {
            // SAFETY: as above.
            return unsafe { (real.realloc)(ptr, size) };
        }
        // SAFETY: ptr is live; copy what both hold, then free the old block.
        unsafe {
            let old = usable(ptr);
            std::ptr::copy_nonoverlapping(ptr as *const u8, p as *mut u8, old.min(size));
            (real.free)(ptr);
        }
        return p;
    }
    if size == 0 {
        // SAFETY: as free (glibc's realloc(p, 0) frees and returns NULL).
        unsafe { free(ptr) };
        return std::ptr::null_mut();
    }
    // A block of the region, of a parent's region, or of the arena.
    let old = usable(ptr);
    if size >= heap::threshold()
        && heap::owner(ptr) == Owner::Region
        && (size <= old || heap::grow_in_place(ptr, size))
    {
        return ptr;
    }
    // SAFETY: as malloc; it routes the new size.
    let p = unsafe { malloc(size) };
    if p.is_null() {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    }
    // SAFETY: both blocks are live and at least this long.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr as *const u8, p as *mut u8, old.min(size));
        free(ptr);
    }
    p
}

/// # Safety
/// As glibc's `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, count: usize, size: usize) -> *mut c_void {
    match count.checked_mul(size) {
        // SAFETY: as realloc.
        Some(total) => unsafe { realloc(ptr, total) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// As POSIX `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(PTR_SIZE) {
        return libc::EINVAL;
    }
    let mut rc = 0;
    let p = alloc_routed(size, align, |real| {
        let mut p = std::ptr::null_mut();
        // SAFETY: posix_memalign of the system, into a local.
        rc = unsafe { (real.posix_memalign)(&mut p, align, size) };
        p
    });
    if rc != 0 {
        return rc;
    }
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer.
    unsafe { *out = p };
    0
}

/// # Safety
/// As C11's `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    alloc_routed(size, align, |real| match real.aligned_alloc {
        // SAFETY: the system's aligned_alloc.
        Some(f) => unsafe { f(align, size) },
        // SAFETY: memalign with a power-of-two alignment.
        None => unsafe { (real.memalign)(align, size) },
    })
}

/// # Safety
/// As glibc's `memalign` (an alignment that is not a power of two is
/// rounded up to one).
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let Some(rounded) = align.max(1).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: the system's memalign.
    alloc_routed(size, rounded, |real| unsafe {
        (real.memalign)(align, size)
    })
}

/// # Safety
/// As glibc's `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    let page = page_size();
    alloc_routed(size, page, |real| match real.valloc {
        // SAFETY: the system's valloc.
        Some(f) => unsafe { f(size) },
        // SAFETY: memalign with the page size.
        None => unsafe { (real.memalign)(page, size) },
    })
}

/// # Safety
/// As glibc's `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let page = page_size();
    let Some(rounded) = size.max(1).checked_next_multiple_of(page) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    alloc_routed(rounded, page, |real| match real.pvalloc {
        // SAFETY: the system's pvalloc.
        Some(f) => unsafe { f(size) },
        // SAFETY: memalign with the page size.
        None => unsafe { (real.memalign)(page, rounded) },
    })
}

/// # Safety
/// As glibc's `malloc_usable_size`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    usable(ptr)
}

// --- The handshake ------------------------------------------------------------

unsafe extern "C" fn abi_region(out: *mut HeapRegionId) -> c_int {
    match heap::abi_region() {
        Some(node) => {
            // SAFETY: the caller passes a writable HeapRegionId.
            unsafe {
                *out = HeapRegionId {
                    job: node.job.0,
                    pid: node.pid,
                    nonce: node.nonce,
                    reserved: 0,
                }
            };
            0
        }
        None => -libc::ENOMEM,
    }
}

unsafe extern "C" fn abi_contains(addr: usize, len: usize) -> c_int {
    heap::RANGES.contains(addr, len.max(1)) as c_int
}

unsafe extern "C" fn abi_alloc(len: usize) -> *mut c_void {
    heap::abi_alloc(len)
}

unsafe extern "C" fn abi_free(ptr: *mut c_void) {
    heap::abi_free(ptr)
}

unsafe extern "C" fn abi_in_use() -> usize {
    heap::abi_in_use()
}

unsafe extern "C" fn abi_grant_token(addr: usize, len: usize) -> i32 {
    heap::abi_grant_token(addr, len).map_or(-1, i32::from)
}

unsafe extern "C" fn abi_exposed(addr: usize, len: usize) {
    heap::abi_exposed(addr, len)
}

static ABI: HeapAbi = HeapAbi {
    magic: HEAP_ABI_MAGIC,
    version: HEAP_ABI_VERSION,
    layout: REGION_LAYOUT,
    region: abi_region,
    contains: abi_contains,
    alloc: abi_alloc,
    free: abi_free,
    in_use: abi_in_use,
    grant_token: abi_grant_token,
    exposed: abi_exposed,
};

/// The handshake (`unimem_dma::heap_abi::HEAP_ABI_SYMBOL`).
/// This thread's allocations come from the system from now on (`on`
/// non-zero) or no longer; returns the previous setting (see
/// `heap::set_system_only`). Looked up by name, like the ABI table, by a
/// provider that finds the heap preloaded.
#[no_mangle]
pub extern "C" fn unimem_heap_system_only(on: c_int) -> c_int {
    c_int::from(heap::set_system_only(on != 0))
}

#[no_mangle]
pub extern "C" fn unimem_heap_abi_v3() -> *const HeapAbi {
    &ABI
}
