//! The handshake between the dmable heap (`libunimem-heap.so`, preloaded)
//! and whoever else in the process needs dmable memory (the provider,
//! `dlopen`ed later by libfabric).
//!
//! A process is one Unimem node and has one dmable region: peers find a
//! node's memory through its one directory object. When the heap is
//! preloaded it owns that region; the provider must not create a second
//! one. The two are separate shared libraries with separate Rust statics
//! (and separate copies of this crate), so they meet through one C symbol,
//! [`HEAP_ABI_SYMBOL`], which the heap exports and everyone else looks up
//! with `dlsym(RTLD_DEFAULT, ...)`. Only C types cross: integers, raw
//! pointers and `extern "C"` functions; no Rust type, no allocation, no
//! unwinding.
//!
//! Versioning: the symbol's name carries the ABI version; the table
//! repeats it with a magic number and the layout version of the region's
//! shared objects ([`REGION_LAYOUT`]). A table that does not match in all
//! three is ignored (the caller makes a region of its own).

use std::os::raw::{c_int, c_void};

/// Name of the function the heap exports: `extern "C" fn() -> *const HeapAbi`.
pub const HEAP_ABI_SYMBOL: &std::ffi::CStr = c"unimem_heap_abi_v3";
/// First field of [`HeapAbi`].
pub const HEAP_ABI_MAGIC: u64 = u64::from_le_bytes(*b"UMHEAPv3");
/// Version of [`HeapAbi`] (also in the symbol's name). 3: `exposed`.
pub const HEAP_ABI_VERSION: u32 = 3;
/// Version of the layout of a region's shared objects (directory and
/// segments, see `region/`): both libraries must read the same layout.
/// Bump it with any change of `Directory`, `SegmentEntry`,
/// `DIRECTORY_OFFSET`, `MAX_SEGMENTS`, the generation tables (`gens.rs`)
/// or the object names. 2: generation tables, page-aligned allocations.
pub const REGION_LAYOUT: u32 = 2;

/// Identity of the heap's region: the node peers address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapRegionId {
    /// `JobId` of the region (the hash of `FI_UNIMEM_JOB`).
    pub job: u32,
    pub pid: u32,
    /// `NodeId::nonce`: the low 32 bits of the process start time.
    pub nonce: u32,
    pub reserved: u32,
}

/// The table the heap's [`HEAP_ABI_SYMBOL`] function returns; static, valid
/// for the life of the process. Every function is thread-safe and
/// async-signal-unsafe (they take the heap's lock).
#[repr(C)]
pub struct HeapAbi {
    pub magic: u64,
    pub version: u32,
    pub layout: u32,
    /// The heap's region, created now if the heap has none yet (in a forked
    /// child: the child's own). 0 and `*out` filled, or a negative errno
    /// when the heap has no region to offer.
    pub region: unsafe extern "C" fn(out: *mut HeapRegionId) -> c_int,
    /// 1 if `[addr, addr + len)` lies in the region's segments, else 0.
    pub contains: unsafe extern "C" fn(addr: usize, len: usize) -> c_int,
    /// `len` bytes of dmable memory for the caller's own buffers (cache-line
    /// aligned), never from or to the application's heap (see
    /// [`crate::MemClass`]); null when the region is full.
    pub alloc: unsafe extern "C" fn(len: usize) -> *mut c_void,
    /// Returns a buffer from `alloc`.
    pub free: unsafe extern "C" fn(ptr: *mut c_void),
    /// Bytes of the region allocated, for everyone.
    pub in_use: unsafe extern "C" fn() -> usize,
    /// The grant token of `[addr, addr + len)` (0..=65535, see
    /// [`crate::DmaRegion::grant_token`]), or -1 if that is not the
    /// region's memory.
    pub grant_token: unsafe extern "C" fn(addr: usize, len: usize) -> i32,
    /// `[addr, addr + len)` is exposed to peers under a key: a small block
    /// in it retires its pages when freed (generations bumped, pins waited
    /// for), which the free of a block never exposed spares itself.
    pub exposed: unsafe extern "C" fn(addr: usize, len: usize),
}

/// The preloaded heap's table, if a heap that speaks this version is in
/// the process.
pub fn find() -> Option<&'static HeapAbi> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, HEAP_ABI_SYMBOL.as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: a symbol of this name is the heap's `extern "C" fn() -> *const
    // HeapAbi` (the name carries the version).
    let get: extern "C" fn() -> *const HeapAbi = unsafe { std::mem::transmute(sym) };
    let table = get();
    if table.is_null() {
        return None;
    }
    // SAFETY: the heap returns a pointer to its static table.
    let table = unsafe { &*table };
    if table.magic != HEAP_ABI_MAGIC
        || table.version != HEAP_ABI_VERSION
        || table.layout != REGION_LAYOUT
    {
        tracing::warn!(
            version = table.version,
            layout = table.layout,
            "the preloaded dmable heap speaks another version; not using its region"
        );
        return None;
    }
    Some(table)
}

/// Tells the preloaded heap, if there is one, that `[addr, addr + len)` is
/// exposed to peers under a key (see [`HeapAbi::exposed`]).
pub fn exposed(addr: usize, len: usize) {
    if let Some(abi) = find() {
        // SAFETY: the heap's function takes any range and only records it.
        unsafe { (abi.exposed)(addr, len) }
    }
}
