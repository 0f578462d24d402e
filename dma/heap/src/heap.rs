//! The dmable part of the heap: allocations at or above the threshold,
//! served from the process's dmable region (the [`MemClass::Heap`]
//! segments), and the provider's buffers ([`MemClass::Internal`]) asked for
//! through the handshake.
//!
//! One lock guards it all; the paths that only ask "is this address
//! ours?" never take it (see `ranges.rs`). Reentrancy: the heap's own Rust
//! allocations go straight to the system allocator (`real::SystemDirect`),
//! and anything else that calls `malloc` while this thread is inside the
//! heap (libc inside `shm_open`, say) is sent to the system allocator by a
//! thread-local flag.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use unimem_dma::{DmaBuf, DmaError, DmaRegion, MemClass};

use crate::config::Config;
use crate::log;
use crate::ranges::Ranges;
use crate::small::{self, CLASSES, SLAB_LEN};

pub struct State {
    config: Option<Config>,
    region: Option<Arc<DmaRegion>>,
    /// The region could not be made: everything comes from the system.
    failed: bool,
    /// The application's allocations, by the address handed out.
    live: BTreeMap<usize, DmaBuf>,
    /// The provider's buffers (handshake `alloc`), by address.
    internal: BTreeMap<usize, DmaBuf>,
    /// Small blocks' slabs by address (`small.rs`).
    slabs: BTreeMap<usize, Slab>,
    /// Free small blocks of each class, the last freed on top (still in
    /// the cache).
    free_blocks: [Vec<usize>; CLASSES],
    /// Small blocks that were exposed to peers under a key (`abi_exposed`):
    /// only their frees retire their pages.
    exposed: BTreeSet<usize>,
    /// In a forked child: the parent's allocations (now private copies),
    /// address → usable size. Never freed, never reused.
    inherited: BTreeMap<usize, usize>,
    /// In a forked child: the parent's slabs, address → block size.
    inherited_slabs: BTreeMap<usize, usize>,
}

/// A slab of small blocks of one class, and which of them are handed out.
struct Slab {
    buf: DmaBuf,
    class: u8,
    /// A bit per block: set while it is the application's. A free of a
    /// block that is not (freed twice, or never handed out) is ignored, as
    /// the region's own blocks are, instead of handing it out twice.
    used: [u64; SLAB_LEN / 16 / 64],
}

impl Slab {
    /// Marks block `index` handed out (`true`) or free; whether it changed.
    fn mark(&mut self, index: usize, used: bool) -> bool {
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        let was = self.used[word] & bit != 0;
        if used {
            self.used[word] |= bit;
        } else {
            self.used[word] &= !bit;
        }
        was != used
    }
}

pub static HEAP: Mutex<State> = Mutex::new(State {
    config: None,
    region: None,
    failed: false,
    live: BTreeMap::new(),
    internal: BTreeMap::new(),
    slabs: BTreeMap::new(),
    free_blocks: [const { Vec::new() }; CLASSES],
    exposed: BTreeSet::new(),
    inherited: BTreeMap::new(),
    inherited_slabs: BTreeMap::new(),
});

/// The data of this process's segments.
pub static RANGES: Ranges = Ranges::new();
/// In a forked child: the parent's segments (private copies now).
pub static INHERITED: Ranges = Ranges::new();

/// 0 until read from the environment.
static THRESHOLD: AtomicUsize = AtomicUsize::new(0);
static EXHAUSTED: AtomicBool = AtomicBool::new(false);
/// Whether the heap said that /dev/shm is full.
static NO_SPACE: AtomicBool = AtomicBool::new(false);
/// Pid of the process that made the current region (for the exit clean-up).
pub static REGION_PID: AtomicU32 = AtomicU32::new(0);
/// This process's pid, kept by the fork handler (`getpid` is a system
/// call, which the allocation path should not pay); 0 until first known.
static PID: AtomicU32 = AtomicU32::new(0);

/// This process's pid.
pub fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

thread_local! {
    /// This thread is inside the heap: a nested `malloc` goes to the system.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// This thread asked for the system's memory only
    /// ([`set_system_only`]).
    static SYSTEM_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// From now on (`on`) or no longer, this thread's allocations come from
/// the system, whatever their size; returns the previous setting. The
/// provider sets it around its calls into the libfabric provider that
/// carries its network backend: that provider's own buffers are no
/// application data, and must not take dmable memory.
pub fn set_system_only(on: bool) -> bool {
    SYSTEM_ONLY.replace(on)
}

/// The allocation size from which the dmable region serves.
#[inline]
pub fn threshold() -> usize {
    match THRESHOLD.load(Ordering::Relaxed) {
        0 => {
            let t = Config::threshold_from_env();
            THRESHOLD.store(t, Ordering::Relaxed);
            t
        }
        t => t,
    }
}

/// Runs `f` on the heap's state, unless this thread is already inside.
fn enter<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    if INSIDE.get() {
        return None;
    }
    INSIDE.set(true);
    let result = f(&mut HEAP.lock());
    INSIDE.set(false);
    Some(result)
}

/// Who owns an address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Owner {
    /// Not the heap: the system allocator (or the bootstrap arena).
    System,
    /// This process's dmable region.
    Region,
    /// A forked child's copy of its parent's region.
    Inherited,
}

#[inline]
pub fn owner(ptr: *const c_void) -> Owner {
    let addr = ptr as usize;
    if RANGES.contains(addr, 1) {
        Owner::Region
    } else if INHERITED.contains(addr, 1) {
        Owner::Inherited
    } else {
        Owner::System
    }
}

/// `size` bytes aligned to `align` (a power of two) from the region, or
/// null if the region does not serve them (the caller asks the system).
pub fn alloc(size: usize, align: usize) -> *mut c_void {
    if SYSTEM_ONLY.get() {
        return std::ptr::null_mut();
    }
    enter(|heap| heap.alloc(size, align)).unwrap_or(std::ptr::null_mut())
}

/// Returns an application allocation of the region (or of an inherited
/// one, which is ignored).
pub fn free(ptr: *mut c_void) {
    if owner(ptr) == Owner::Inherited {
        return;
    }
    // A nested free (from inside the heap) of a region pointer cannot
    // happen: the heap's own memory is the system's.
    // The buffer goes back to the region under the heap's lock.
    enter(|heap| heap.free(ptr as usize));
}

/// Grows the region allocation at `ptr` to `size` bytes where it is, if
/// the memory after it is free: whether it did.
pub fn grow_in_place(ptr: *mut c_void, size: usize) -> bool {
    let addr = ptr as usize;
    enter(|heap| {
        // A small block grows within its block only (realloc checks that).
        heap.live.get_mut(&addr).is_some_and(|buf| {
            let start = buf.as_ptr() as usize;
            (addr - start)
                .checked_add(size)
                .is_some_and(|len| buf.try_extend(len))
        })
    })
    .unwrap_or(false)
}

/// Usable size of a region or inherited allocation (0 if unknown).
pub fn usable_size(ptr: *const c_void) -> usize {
    let addr = ptr as usize;
    enter(|heap| {
        heap.live
            .get(&addr)
            .map(|buf| buf.as_ptr() as usize + buf.len() - addr)
            .or_else(|| heap.small_block(addr).map(|(_, c)| small::block_len(c)))
            .or_else(|| heap.inherited.get(&addr).copied())
            .or_else(|| inherited_block(&heap.inherited_slabs, addr))
            .unwrap_or(0)
    })
    .unwrap_or(0)
}

impl State {
    /// This process's region, made on first need. In a forked child, the
    /// fork handler gave up the parent's region first (`after_fork`).
    fn region(&mut self) -> Option<Arc<DmaRegion>> {
        if let Some(region) = &self.region {
            if region.node().pid == pid() {
                return Some(Arc::clone(region));
            }
            self.after_fork();
        }
        if self.failed {
            return None;
        }
        let config = self.config.get_or_insert_with(Config::from_env);
        match DmaRegion::owned(&config.region) {
            Ok(region) => {
                REGION_PID.store(pid(), Ordering::Relaxed);
                self.region = Some(Arc::clone(&region));
                Some(region)
            }
            Err(e) => {
                self.failed = true;
                log::line(&format!(
                    "cannot make the dmable region ({e}); every allocation comes from the system allocator"
                ));
                None
            }
        }
    }

    fn alloc_buf(&mut self, class: MemClass, len: usize) -> Option<DmaBuf> {
        let region = self.region()?;
        let bound = match class {
            MemClass::Heap => self.config.as_ref().map_or(usize::MAX, |c| c.heap_max),
            MemClass::Internal => usize::MAX,
        };
        match region.alloc_in(class, len, bound) {
            Ok(buf) => {
                if !RANGES.contains(buf.as_ptr() as usize, buf.len()) {
                    for (start, len) in region.segment_ranges() {
                        RANGES.add(start, len);
                    }
                }
                Some(buf)
            }
            Err(DmaError::OutOfMemory) if class == MemClass::Heap => {
                // A block larger than the bounds would never fit: that is
                // no exhaustion, just a block for the system allocator.
                let fits = self
                    .config
                    .as_ref()
                    .is_some_and(|c| len <= c.heap_max.min(c.region.max_size));
                if fits && !EXHAUSTED.swap(true, Ordering::Relaxed) {
                    let config = self.config.as_ref();
                    log::line(&format!(
                        "the dmable region is full ({} bytes in use; heap bound {}, region bound {}): \
                         allocations the region cannot serve now come from the system allocator \
                         (said once)",
                        region.in_use(),
                        config.map_or(0, |c| c.heap_max),
                        config.map_or(0, |c| c.region.max_size),
                    ));
                }
                None
            }
            Err(DmaError::NoSpace) => {
                if !NO_SPACE.swap(true, Ordering::Relaxed) {
                    log::line(
                        "/dev/shm is full: dmable memory cannot grow; allocations the region \
                         cannot serve now come from the system allocator (said once)",
                    );
                }
                None
            }
            Err(_) => None,
        }
    }

    fn alloc(&mut self, size: usize, align: usize) -> *mut c_void {
        if let Some(class) = small::class_of(size, align) {
            if let Some(addr) = self.alloc_small(class) {
                return addr as *mut c_void;
            }
        }
        let slack = align.saturating_sub(unimem_dma::ALLOC_ALIGN);
        let Some(len) = size.max(1).checked_add(slack) else {
            return std::ptr::null_mut();
        };
        let Some(buf) = self.alloc_buf(MemClass::Heap, len) else {
            return std::ptr::null_mut();
        };
        let addr = (buf.as_ptr() as usize).next_multiple_of(align.max(1));
        self.live.insert(addr, buf);
        addr as *mut c_void
    }

    /// A block of `class`: the last freed, else one of a new slab.
    fn alloc_small(&mut self, class: usize) -> Option<usize> {
        let addr = match self.free_blocks[class].pop() {
            Some(addr) => addr,
            None => {
                let buf = self.alloc_buf(MemClass::Heap, SLAB_LEN)?;
                let start = buf.as_ptr() as usize;
                let len = small::block_len(class);
                // Handed out from the slab's start, so the first blocks
                // are the first pages touched.
                self.free_blocks[class].extend((1..SLAB_LEN / len).rev().map(|i| start + i * len));
                let slab = Slab {
                    buf,
                    class: class as u8,
                    used: [0; SLAB_LEN / 16 / 64],
                };
                self.slabs.insert(start, slab);
                start
            }
        };
        let (start, slab) = self
            .slabs
            .range_mut(..=addr)
            .next_back()
            .expect("a free block lies in its slab");
        slab.mark((addr - start) / small::block_len(class), true);
        Some(addr)
    }

    /// The start of the slab and the class of the small block at `addr`
    /// (its start exactly), if it is one.
    fn small_block(&self, addr: usize) -> Option<(usize, usize)> {
        let (&start, slab) = self.slabs.range(..=addr).next_back()?;
        let class = slab.class as usize;
        block_start(start, small::block_len(class), addr).then_some((start, class))
    }

    /// Frees the region allocation at `addr`: a small block goes back to
    /// its class (once peers' hold on its pages ended, if it was ever
    /// exposed), a buffer to the region. Anything else (not an allocation
    /// of ours, or one freed already) is ignored.
    fn free(&mut self, addr: usize) {
        let Some((start, class)) = self.small_block(addr) else {
            drop(self.live.remove(&addr));
            return;
        };
        let len = small::block_len(class);
        let slab = self.slabs.get_mut(&start).expect("found above");
        if !slab.mark((addr - start) / len, false) {
            return;
        }
        // Peers reach heap memory only under a key (a small block is never
        // granted in place): a block never exposed needs no retiring, and
        // sparing it keeps the generations of the pages it shares with
        // exposed blocks (a window) from moving at every free of a
        // neighbour.
        if !self.exposed.is_empty() && self.exposed.remove(&addr) {
            slab.buf.retire(addr - start, len);
        }
        self.free_blocks[class].push(addr);
    }

    /// Marks the small blocks in `[addr, addr + len)` exposed.
    fn expose(&mut self, addr: usize, len: usize) {
        let end = addr.saturating_add(len.max(1));
        let first = self
            .slabs
            .range(..=addr)
            .next_back()
            .map_or(addr, |(&start, _)| start);
        for (&start, slab) in self.slabs.range(first..end) {
            let block = small::block_len(slab.class as usize);
            let from = addr.max(start);
            let to = end.min(start + SLAB_LEN);
            if from >= to {
                continue;
            }
            let mut at = start + (from - start) / block * block;
            while at < to {
                self.exposed.insert(at);
                at += block;
            }
        }
    }

    /// A forked child gives up its parent's region: each segment becomes a
    /// private copy of what was allocated in it (the parent's peers write
    /// into the shared pages; the child must see a snapshot, as fork
    /// promises), its allocations stay usable but are never freed or
    /// reused, and the next allocation makes the child's own region.
    pub fn after_fork(&mut self) {
        PID.store(std::process::id(), Ordering::Relaxed);
        let Some(region) = self.region.take() else {
            return;
        };
        if region.node().pid == pid() {
            self.region = Some(region);
            return;
        }
        let allocated: Vec<(usize, usize)> = self
            .live
            .values()
            .chain(self.internal.values())
            .chain(self.slabs.values().map(|slab| &slab.buf))
            .map(|buf| (buf.as_ptr() as usize, buf.len()))
            .collect();
        let segments: Vec<(usize, usize)> = RANGES.entries().collect();
        RANGES.clear();
        for (start, len) in segments {
            privatize(start, len, &allocated);
            INHERITED.add(start, len);
        }
        for (addr, buf) in std::mem::take(&mut self.live) {
            self.inherited
                .insert(addr, buf.as_ptr() as usize + buf.len() - addr);
            // Dropping would return it to the parent's allocator state.
            std::mem::forget(buf);
        }
        for (_, buf) in std::mem::take(&mut self.internal) {
            std::mem::forget(buf);
        }
        for (start, slab) in std::mem::take(&mut self.slabs) {
            self.inherited_slabs
                .insert(start, small::block_len(slab.class as usize));
            std::mem::forget(slab.buf);
        }
        for blocks in &mut self.free_blocks {
            blocks.clear();
        }
        self.exposed.clear();
        // Dropping the last reference would unlink the parent's objects.
        std::mem::forget(region);
        REGION_PID.store(0, Ordering::Relaxed);
        EXHAUSTED.store(false, Ordering::Relaxed);
    }
}

/// Whether `addr` is where a block of `len` bytes of the slab at `start`
/// begins.
fn block_start(start: usize, len: usize, addr: usize) -> bool {
    let offset = addr - start;
    offset < SLAB_LEN && offset.is_multiple_of(len)
}

/// Usable size of a small block of a parent's slab at `addr`.
fn inherited_block(slabs: &BTreeMap<usize, usize>, addr: usize) -> Option<usize> {
    let (&start, &len) = slabs.range(..=addr).next_back()?;
    block_start(start, len, addr).then_some(len)
}

/// Replaces the shared mapping `[start, start + len)` by a private one
/// holding a copy of the `allocated` ranges inside it.
fn privatize(start: usize, len: usize, allocated: &[(usize, usize)]) {
    // SAFETY: a fresh private anonymous mapping.
    let copy = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if copy == libc::MAP_FAILED {
        log::line("fork: cannot copy the parent's dmable segment; the child shares it");
        return;
    }
    for &(addr, n) in allocated {
        if addr >= start && addr + n <= start + len {
            // SAFETY: the source lies in the segment (mapped), the
            // destination at the same offset of the copy, which is as long.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr as *const u8,
                    (copy as *mut u8).add(addr - start),
                    n,
                )
            };
        }
    }
    // SAFETY: moves our private mapping over the segment's range, which
    // this process mapped; the old shared mapping there is replaced.
    let moved = unsafe {
        libc::mremap(
            copy,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        // SAFETY: unmapping the copy made above.
        unsafe { libc::munmap(copy, len) };
        log::line("fork: cannot replace the parent's dmable segment; the child shares it");
    }
}

// --- The handshake's functions (see unimem_dma::heap_abi) ---------------------

pub fn abi_region() -> Option<unimem_mailbox::NodeId> {
    enter(|heap| heap.region().map(|r| r.node())).flatten()
}

pub fn abi_alloc(len: usize) -> *mut c_void {
    enter(|heap| {
        let Some(buf) = heap.alloc_buf(MemClass::Internal, len) else {
            return std::ptr::null_mut();
        };
        let addr = buf.as_ptr() as usize;
        heap.internal.insert(addr, buf);
        addr as *mut c_void
    })
    .unwrap_or(std::ptr::null_mut())
}

pub fn abi_free(ptr: *mut c_void) {
    if owner(ptr) != Owner::Region {
        return;
    }
    enter(|heap| drop(heap.internal.remove(&(ptr as usize))));
}

/// None for a range that is not ours, or that touches a slab: a
/// neighbour's free would void the grant mid-transfer (`small.rs`).
pub fn abi_grant_token(addr: usize, len: usize) -> Option<u16> {
    if !RANGES.contains(addr, len.max(1)) {
        return None;
    }
    enter(|heap| {
        let end = addr.checked_add(len.max(1))?;
        let touches_slab = heap
            .slabs
            .range(..end)
            .next_back()
            .is_some_and(|(&start, _)| start + SLAB_LEN > addr);
        if touches_slab {
            return None;
        }
        heap.region.as_ref()?.grant_token(addr, len)
    })
    .flatten()
}

pub fn abi_exposed(addr: usize, len: usize) {
    if RANGES.contains(addr, len.max(1)) {
        enter(|heap| heap.expose(addr, len));
    }
}

pub fn abi_in_use() -> usize {
    enter(|heap| heap.region.as_ref().map_or(0, |r| r.in_use())).unwrap_or(0)
}
