//! The system allocator: the next definitions of `malloc` and its kin after
//! ours (`dlsym(RTLD_NEXT, ...)`: glibc's, or whichever allocator comes
//! next), resolved on first use.
//!
//! `dlsym` itself may allocate (glibc's `dlerror` buffer uses `calloc`):
//! while a thread resolves, its own allocations come from a small static
//! bootstrap arena that is never freed. Other threads wait for the
//! resolution (at that point a process rarely has any).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type AlignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// The system's functions, once resolved.
pub struct Real {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub calloc: CallocFn,
    pub realloc: ReallocFn,
    pub memalign: AlignFn,
    pub posix_memalign: PosixMemalignFn,
    pub aligned_alloc: Option<AlignFn>,
    pub valloc: Option<MallocFn>,
    pub pvalloc: Option<MallocFn>,
    pub usable_size: Option<UsableFn>,
}

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const READY: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);
static mut REAL: Option<Real> = None;

thread_local! {
    /// This thread is inside `dlsym` resolving the system's functions.
    static RESOLVING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// The system allocator, or `None` while this very thread resolves it (its
/// allocations then come from the bootstrap arena).
#[inline]
pub fn get() -> Option<&'static Real> {
    if STATE.load(Ordering::Acquire) != READY && !resolve() {
        return None;
    }
    // SAFETY: REAL is written once, before STATE becomes READY (Release),
    // and never again.
    unsafe { (*std::ptr::addr_of!(REAL)).as_ref() }
}

#[cold]
fn resolve() -> bool {
    if RESOLVING_HERE.get() {
        return false;
    }
    match STATE.compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            RESOLVING_HERE.set(true);
            let real = Real {
                malloc: required(c"malloc"),
                free: required(c"free"),
                calloc: required(c"calloc"),
                realloc: required(c"realloc"),
                memalign: required(c"memalign"),
                posix_memalign: required(c"posix_memalign"),
                aligned_alloc: optional(c"aligned_alloc"),
                valloc: optional(c"valloc"),
                pvalloc: optional(c"pvalloc"),
                usable_size: optional(c"malloc_usable_size"),
            };
            // SAFETY: only the thread that won the exchange writes, once,
            // and nobody reads before STATE is READY.
            unsafe { *std::ptr::addr_of_mut!(REAL) = Some(real) };
            RESOLVING_HERE.set(false);
            STATE.store(READY, Ordering::Release);
            true
        }
        Err(_) => {
            while STATE.load(Ordering::Acquire) != READY {
                std::hint::spin_loop();
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            true
        }
    }
}

fn lookup(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

fn required<F: Copy>(name: &std::ffi::CStr) -> F {
    let sym = lookup(name);
    if sym.is_null() {
        crate::log::raw(b"unimem-heap: no system allocator after this library (dlsym RTLD_NEXT failed); aborting\n");
        std::process::abort();
    }
    // SAFETY: F is the fn-pointer type of that C function, the size of a pointer.
    unsafe { std::mem::transmute_copy(&sym) }
}

fn optional<F: Copy>(name: &std::ffi::CStr) -> Option<F> {
    let sym = lookup(name);
    // SAFETY: as in `required`.
    (!sym.is_null()).then(|| unsafe { std::mem::transmute_copy(&sym) })
}

// --- The bootstrap arena ------------------------------------------------------

const ARENA_SIZE: usize = 256 << 10;
/// Each block starts with its size, 16 bytes before the pointer handed out.
const ARENA_HEADER: usize = 16;

#[repr(C, align(4096))]
struct Arena([u8; ARENA_SIZE]);

static mut ARENA: Arena = Arena([0; ARENA_SIZE]);
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    std::ptr::addr_of!(ARENA) as usize
}

/// Whether `ptr` came from the bootstrap arena.
#[inline]
pub fn in_arena(ptr: *const c_void) -> bool {
    let addr = ptr as usize;
    addr >= arena_base() && addr < arena_base() + ARENA_SIZE
}

/// `size` zeroed bytes aligned to `align` (a power of two) from the arena,
/// which is never reused: null once it is used up.
pub fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(ARENA_HEADER);
    let mut used = ARENA_USED.load(Ordering::Relaxed);
    loop {
        let Some(start) = (arena_base() + used + ARENA_HEADER).checked_next_multiple_of(align)
        else {
            return std::ptr::null_mut();
        };
        let end = start.saturating_add(size);
        if end > arena_base() + ARENA_SIZE {
            return std::ptr::null_mut();
        }
        match ARENA_USED.compare_exchange_weak(
            used,
            end - arena_base(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                // SAFETY: [start - 16, end) is ours alone now, inside the arena.
                unsafe { *((start - ARENA_HEADER) as *mut usize) = size };
                return start as *mut c_void;
            }
            Err(now) => used = now,
        }
    }
}

/// Size of an arena block.
pub fn arena_size(ptr: *const c_void) -> usize {
    // SAFETY: every arena pointer has its size 16 bytes before it.
    unsafe { *((ptr as usize - ARENA_HEADER) as *const usize) }
}

// --- The library's own Rust allocations ----------------------------------------

/// The library's Rust code allocates straight from the system allocator:
/// its maps and vectors never go through the exported `malloc`.
pub struct SystemDirect;

// SAFETY: every block comes from the system allocator (or the arena) with
// at least the layout's alignment, and goes back to where it came from.
unsafe impl GlobalAlloc for SystemDirect {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match get() {
            Some(real) if layout.align() <= 16 => {
                // SAFETY: plain malloc.
                unsafe { (real.malloc)(layout.size()) as *mut u8 }
            }
            // SAFETY: memalign with a power-of-two alignment.
            Some(real) => unsafe { (real.memalign)(layout.align(), layout.size()) as *mut u8 },
            None => arena_alloc(layout.size(), layout.align()) as *mut u8,
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        if in_arena(ptr.cast()) {
            return;
        }
        if let Some(real) = get() {
            // SAFETY: the block came from the system allocator.
            unsafe { (real.free)(ptr.cast()) }
        }
    }
}
