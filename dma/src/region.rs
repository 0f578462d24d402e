//! Dmable memory: the per-process region the emulated DMA engine works on.
//!
//! The region is a list of shared-memory segments, created on demand up to a
//! configured bound, plus a *directory* object that tells peers where each
//! segment sits in this process's address space. A peer that registers one
//! of our addresses finds its segment in the directory and maps that part of
//! it: the emulated route. Addresses are this process's own virtual
//! addresses, as with Unimem's unified addressing.
//!
//! When the dmable heap (`libunimem-heap.so`) is preloaded, it owns the
//! process's region and [`DmaRegion::for_process`] *adopts* it through the
//! heap's C handshake (`heap_abi.rs`): allocations, frees and `contains`
//! then go to the heap, and the node is the heap's.
//!
//! Each segment serves one [`MemClass`]: the provider's own buffers and the
//! application's heap never share a segment, so memory a peer may still
//! write into after the provider let it go never becomes application
//! memory.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use unimem_mailbox::shm::{object_name, SharedObject, HEADER_SIZE};
use unimem_mailbox::{JobId, NodeId};

use crate::alloc::RangeAllocator;
use crate::error::DmaError;
use crate::gens::{page_span, GenTable, GEN_PAGE};
use crate::heap_abi::{self, HeapAbi, HeapRegionId};

/// Every allocation is aligned to (and rounded up to) a page: the unit in
/// which a free invalidates what peers hold (`gens.rs`), so that freeing a
/// block never touches a neighbour's pages.
pub const ALLOC_ALIGN: usize = GEN_PAGE;
/// Most segments one region can hold (the directory is one page).
pub const MAX_SEGMENTS: usize = 240;
/// Accepted segment sizes (`dma_segment_size`), in bytes: a region of
/// [`MAX_SEGMENTS`] segments of these sizes maps at most 240 GiB.
pub const SEGMENT_SIZE_MIN: usize = 64 << 10;
pub const SEGMENT_SIZE_MAX: usize = 1 << 30;
/// Accepted bounds of a region (`dma_max_size`), in bytes.
pub const REGION_SIZE_MIN: usize = 64 << 10;
pub const REGION_SIZE_MAX: usize = 64 << 30;
/// A segment's memory is committed in `/dev/shm` (`posix_fallocate`) in
/// steps of this many bytes as its allocator hands it out, never all at
/// once: a process uses what it touches, and a full `/dev/shm` is an error
/// of the allocation that needs more, not a SIGBUS.
pub const COMMIT_CHUNK: usize = 2 << 20;

/// Configuration of a process's dmable region.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    pub job: JobId,
    /// Size of one segment; a larger allocation gets a segment of its own.
    pub segment_size: usize,
    /// Bound on the total size of all segments.
    pub max_size: usize,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            job: JobId::from_name("default"),
            segment_size: 64 << 20,
            max_size: 1 << 30,
        }
    }
}

/// What a segment's memory is for.
///
/// Peers write into the provider's buffers (eager rings, staging buffers)
/// on the strength of credits and grants they hold; an endpoint that
/// closes frees its buffers while such a credit or grant may still be on
/// its way, and a late put then lands in freed memory. Among the
/// provider's buffers that was harmless enough; in application memory it
/// would not be. So the application's heap has segments of its own: a
/// peer writes into heap memory only through a grant for a posted receive
/// buffer, and every grant is used up before that receive completes,
/// hence before the application may free the buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemClass {
    /// The provider's buffers: bounce, staging, eager rings.
    Internal,
    /// The application's heap (`libunimem-heap.so`).
    Heap,
}

// --- Directory layout (shared with peers) -------------------------------------

#[repr(C)]
pub(crate) struct SegmentEntry {
    /// Address of the segment's first data byte in the owner's address space.
    pub base: AtomicU64,
    /// Bytes of the segment committed so far (stored with Release once
    /// committed): peers register ranges inside these only.
    pub len: AtomicU64,
}

#[repr(C)]
pub(crate) struct Directory {
    /// Entries below this count are valid (stored with Release after the entry).
    pub count: AtomicU32,
    _pad: u32,
    pub segments: [SegmentEntry; MAX_SEGMENTS],
}

pub(crate) const DIRECTORY_OFFSET: usize = 128;
const _: () = assert!(DIRECTORY_OFFSET + std::mem::size_of::<Directory>() <= HEADER_SIZE);

pub(crate) fn directory_name(node: &NodeId) -> String {
    object_name(node.job, &format!("{}-dma", node.pid))
}

/// How many processes of this user on this host have dmable memory, in any
/// job: each has one directory object (`…-dma`, or `…-dma-<random>` when a
/// foreign object held that name). (Objects of killed processes count
/// until someone reclaims them.)
pub fn host_nodes() -> usize {
    unimem_mailbox::shm::list_objects(None)
        .iter()
        .filter(|name| name.ends_with("-dma") || name.contains("-dma-"))
        .count()
}

pub(crate) fn segment_name(node: &NodeId, index: usize) -> String {
    object_name(node.job, &format!("{}-seg{index}", node.pid))
}

/// The generation table of segment `index` (see `gens.rs`).
pub(crate) fn gen_table_name(node: &NodeId, index: usize) -> String {
    object_name(node.job, &format!("{}-gen{index}", node.pid))
}

/// The directory inside a mapped directory object.
pub(crate) fn directory(object: &SharedObject) -> &Directory {
    // SAFETY: directory objects are at least a header page long and the
    // Directory fits in it after the object header; it is atomics only.
    unsafe { &*(object.base().add(DIRECTORY_OFFSET) as *const Directory) }
}

// --- The region -------------------------------------------------------------

struct Segment {
    object: SharedObject,
    /// Generations of its pages, bumped by every free.
    gens: Arc<GenTable>,
    allocator: RangeAllocator,
    class: MemClass,
    /// Data bytes committed in `/dev/shm` so far (from the start).
    committed: usize,
}

impl Segment {
    fn data(&self) -> *mut u8 {
        // SAFETY: data starts right after the header page of the object.
        unsafe { self.object.base().add(HEADER_SIZE) }
    }

    fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.data() as usize;
        addr >= base && addr + len <= base + self.allocator.capacity()
    }
}

struct Segments {
    list: Vec<Segment>,
    total: usize,
}

/// The objects of a region this library made.
struct Own {
    config: RegionConfig,
    directory: SharedObject,
    segments: Mutex<Segments>,
}

impl Drop for Own {
    /// Segments go first, the directory (a field, dropped after this) last:
    /// once a new region of this process could create its directory, the
    /// old one's segment names are free too (see `for_process`).
    fn drop(&mut self) {
        self.segments.get_mut().list.clear();
    }
}

enum Backing {
    Own(Own),
    /// The preloaded heap's region, reached through its handshake table.
    Heap(&'static HeapAbi),
}

/// This process's dmable memory.
pub struct DmaRegion {
    node: NodeId,
    backing: Backing,
}

static PROCESS_REGION: Mutex<Weak<DmaRegion>> = Mutex::new(Weak::new());

impl DmaRegion {
    /// The region of this process, created on first use. A process is one
    /// node and has one region: later calls share it whatever their config
    /// (a different job is refused).
    ///
    /// With the dmable heap preloaded, the region is the heap's (adopted,
    /// see the module comment), provided it belongs to `config.job`; its
    /// segment size and bound are then the heap's (which reads them from
    /// the environment), not `config`'s. If it
    /// belongs to another job, a warning says so and this process gets a
    /// region of its own in `config.job` as without the heap: everything
    /// works, but heap memory is ordinary memory for this region's users
    /// (large messages go through staging buffers).
    pub fn for_process(config: &RegionConfig) -> Result<Arc<DmaRegion>, DmaError> {
        let mut current = PROCESS_REGION.lock();
        if let Some(region) = current.upgrade() {
            // After fork the inherited region belongs to the parent.
            if region.node.pid == std::process::id() {
                if region.node.job != config.job {
                    return Err(DmaError::Invalid);
                }
                return Ok(region);
            }
        }
        if let Some(adopted) = DmaRegion::adopt(config) {
            let region = Arc::new(adopted);
            *current = Arc::downgrade(&region);
            return Ok(region);
        }
        // The process's previous region may still be dropping in another
        // thread (its last reference went, its objects are not unlinked
        // yet): the same node's names are then still taken for a moment.
        let previous_dropping = !Weak::ptr_eq(&current, &Weak::new());
        let mut tries = 0;
        let region = loop {
            match DmaRegion::create(config) {
                Err(DmaError::Io(e))
                    if e.kind() == std::io::ErrorKind::AlreadyExists
                        && previous_dropping
                        && tries < 100_000 =>
                {
                    tries += 1;
                    std::thread::yield_now();
                }
                created => break Arc::new(created?),
            }
        };
        *current = Arc::downgrade(&region);
        Ok(region)
    }

    /// The preloaded heap's region, if there is a heap and its region is of
    /// `config.job`.
    fn adopt(config: &RegionConfig) -> Option<DmaRegion> {
        let abi = heap_abi::find()?;
        let mut id = HeapRegionId::default();
        // SAFETY: `region` fills the HeapRegionId we pass.
        let rc = unsafe { (abi.region)(&mut id) };
        if rc != 0 {
            tracing::warn!(
                "the preloaded dmable heap has no region ({}); using a region of our own",
                std::io::Error::from_raw_os_error(-rc)
            );
            return None;
        }
        let node = NodeId {
            job: unimem_mailbox::JobId(id.job),
            pid: id.pid,
            nonce: id.nonce,
            nic: None,
        };
        if node.pid != std::process::id() {
            tracing::warn!(
                %node,
                "the preloaded dmable heap reports another process's region; using a region of our own"
            );
            return None;
        }
        if node.job != config.job {
            tracing::warn!(
                heap_job = %node.job,
                job = %config.job,
                "the preloaded dmable heap runs another job (its FI_UNIMEM_JOB differs): \
                 its memory is not dmable here; using a region of our own"
            );
            return None;
        }
        tracing::info!(%node, "dmable region: the preloaded heap's (libunimem-heap.so)");
        Some(DmaRegion {
            node,
            backing: Backing::Heap(abi),
        })
    }

    /// A region of this process that is not its shared one: for the dmable
    /// heap, whose region is what [`Self::for_process`] adopts elsewhere in
    /// the process. Never adopts.
    pub fn owned(config: &RegionConfig) -> Result<Arc<DmaRegion>, DmaError> {
        DmaRegion::create(config).map(Arc::new)
    }

    /// Whether this region is the preloaded heap's.
    pub fn is_adopted(&self) -> bool {
        matches!(self.backing, Backing::Heap(_))
    }

    fn create(config: &RegionConfig) -> Result<DmaRegion, DmaError> {
        // The tunables' readers keep them in range; this is the last word.
        if !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_MAX).contains(&config.segment_size)
            || !(REGION_SIZE_MIN..=REGION_SIZE_MAX).contains(&config.max_size)
            || config.max_size < config.segment_size
        {
            tracing::warn!(
                segment_size = config.segment_size,
                max_size = config.max_size,
                "dmable region: segment size must lie in {SEGMENT_SIZE_MIN}..={SEGMENT_SIZE_MAX}, \
                 bound in {REGION_SIZE_MIN}..={REGION_SIZE_MAX} and at least one segment: refused"
            );
            return Err(DmaError::Invalid);
        }
        let node = NodeId::current(config.job);
        let directory =
            SharedObject::create_avoiding(&directory_name(&node), HEADER_SIZE, HEADER_SIZE)?;
        directory.publish();
        tracing::debug!(%node, segment_size = config.segment_size, "dmable region created");
        Ok(DmaRegion {
            node,
            backing: Backing::Own(Own {
                config: config.clone(),
                directory,
                segments: Mutex::new(Segments {
                    list: Vec::new(),
                    total: 0,
                }),
            }),
        })
    }

    /// The node this region belongs to: the address peers register against.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Allocates `len` dmable bytes (cache-line aligned) for the provider's
    /// own buffers ([`MemClass::Internal`]), growing the region by one
    /// segment if no segment has room.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<DmaBuf, DmaError> {
        self.alloc_in(MemClass::Internal, len, usize::MAX)
    }

    /// Allocates `len` dmable bytes (cache-line aligned) from the segments
    /// of `class`, adding one if none has room and the class's segments
    /// stay within `class_bound` bytes (and the region within its bound).
    /// An adopted region serves [`MemClass::Internal`] only.
    pub fn alloc_in(
        self: &Arc<Self>,
        class: MemClass,
        len: usize,
        class_bound: usize,
    ) -> Result<DmaBuf, DmaError> {
        if len == 0 {
            return Err(DmaError::Invalid);
        }
        let rounded = len
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(DmaError::LengthOverflow)?;
        let own = match &self.backing {
            Backing::Own(own) => own,
            Backing::Heap(abi) => {
                if class != MemClass::Internal {
                    return Err(DmaError::Invalid);
                }
                // SAFETY: the heap's alloc takes any length.
                let ptr = unsafe { (abi.alloc)(len) } as *mut u8;
                return Ok(DmaBuf {
                    region: Arc::clone(self),
                    ptr: NonNull::new(ptr).ok_or(DmaError::OutOfMemory)?,
                    len,
                    segment: usize::MAX,
                    offset: 0,
                    rounded,
                });
            }
        };
        let mut segments = own.segments.lock();
        let found = segments
            .list
            .iter_mut()
            .enumerate()
            .filter(|(_, seg)| seg.class == class)
            .find_map(|(index, seg)| seg.allocator.alloc(rounded).map(|offset| (index, offset)));
        let (segment, offset) = match found {
            Some(found) => found,
            None => {
                let index = own.grow(&self.node, &mut segments, rounded, class, class_bound)?;
                let offset = segments.list[index]
                    .allocator
                    .alloc(rounded)
                    .ok_or(DmaError::OutOfMemory)?;
                (index, offset)
            }
        };
        if let Err(e) = own.commit(&mut segments.list[segment], segment, offset + rounded) {
            segments.list[segment].allocator.free(offset, rounded);
            return Err(e);
        }
        // SAFETY: the allocator returned a range inside the segment's data.
        let ptr = unsafe { segments.list[segment].data().add(offset) };
        Ok(DmaBuf {
            region: Arc::clone(self),
            ptr: NonNull::new(ptr).expect("segment mapping is not null"),
            len,
            segment,
            offset,
            rounded,
        })
    }

    /// Address and length of the data of each segment, in order (empty for
    /// an adopted region): the ranges `contains` looks at.
    pub fn segment_ranges(&self) -> Vec<(usize, usize)> {
        match &self.backing {
            Backing::Own(own) => own
                .segments
                .lock()
                .list
                .iter()
                .map(|seg| (seg.data() as usize, seg.allocator.capacity()))
                .collect(),
            Backing::Heap(_) => Vec::new(),
        }
    }

    /// Whether `[addr, addr + len)` lies inside this process's dmable memory.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let Some(_) = addr.checked_add(len) else {
            return false;
        };
        match &self.backing {
            Backing::Own(own) => own
                .segments
                .lock()
                .list
                .iter()
                .any(|seg| seg.contains(addr, len)),
            // SAFETY: the heap's contains only compares addresses.
            Backing::Heap(abi) => unsafe { (abi.contains)(addr, len) != 0 },
        }
    }

    /// Bytes currently allocated.
    pub fn in_use(&self) -> usize {
        match &self.backing {
            Backing::Own(own) => own
                .segments
                .lock()
                .list
                .iter()
                .map(|seg| seg.allocator.in_use())
                .sum(),
            // SAFETY: in_use takes no arguments and only reads.
            Backing::Heap(abi) => unsafe { (abi.in_use)() },
        }
    }

    /// The token a grant of `[addr, addr + len)` carries (see
    /// `GenTable::token`); `None` if that is not this region's memory.
    pub fn grant_token(&self, addr: usize, len: usize) -> Option<u16> {
        match &self.backing {
            Backing::Own(own) => {
                let (gens, first, count) = own.pages_of(addr, len)?;
                gens.token(first, count)
            }
            Backing::Heap(abi) => {
                // SAFETY: the heap's grant_token only reads its tables.
                let token = unsafe { (abi.grant_token)(addr, len) };
                u16::try_from(token).ok()
            }
        }
    }

    fn free(&self, buf: &DmaBuf) {
        match &self.backing {
            Backing::Own(own) => {
                // Peers' hold on the block ends before it can serve again;
                // the wait (if a peer is mid-copy) is outside the lock.
                let gens = Arc::clone(&own.segments.lock().list[buf.segment].gens);
                gens.invalidate(buf.offset / GEN_PAGE, buf.rounded / GEN_PAGE);
                own.segments.lock().list[buf.segment]
                    .allocator
                    .free(buf.offset, buf.rounded)
            }
            // SAFETY: the pointer came from this heap's alloc and goes back
            // once (from DmaBuf's drop).
            Backing::Heap(abi) => unsafe { (abi.free)(buf.ptr.as_ptr().cast()) },
        }
    }
}

impl Own {
    /// The generation table of the segment holding `[addr, addr + len)`,
    /// and the pages of the range in it.
    fn pages_of(&self, addr: usize, len: usize) -> Option<(Arc<GenTable>, usize, usize)> {
        let end = addr.checked_add(len.max(1))?;
        let segments = self.segments.lock();
        let seg = segments.list.iter().find(|seg| seg.contains(addr, len))?;
        let base = seg.data() as usize;
        let (first, count) = page_span(addr - base, end - base);
        Some((Arc::clone(&seg.gens), first, count))
    }

    /// Commits segment `index` up to `end` data bytes (in [`COMMIT_CHUNK`]
    /// steps) and tells peers in the directory. `ENOSPC` from a full
    /// `/dev/shm` is an error here, with one line in the log.
    fn commit(&self, segment: &mut Segment, index: usize, end: usize) -> Result<(), DmaError> {
        if end <= segment.committed {
            return Ok(());
        }
        let capacity = segment.allocator.capacity();
        let target = end
            .checked_next_multiple_of(COMMIT_CHUNK)
            .map_or(capacity, |t| t.min(capacity));
        let from = segment.committed;
        if let Err(e) = segment.object.commit(HEADER_SIZE + from, target - from) {
            static LAST: AtomicU64 = AtomicU64::new(0);
            unimem_mailbox::shm::rate_limited(&LAST, || {
                tracing::warn!(
                    bytes = target - from,
                    committed = segment.committed,
                    "cannot commit dmable memory in /dev/shm: {e} (is /dev/shm full or too small?)"
                )
            });
            return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                DmaError::NoSpace
            } else {
                DmaError::Io(e)
            });
        }
        segment.committed = target;
        directory(&self.directory).segments[index]
            .len
            .store(target as u64, Ordering::Release);
        Ok(())
    }

    fn grow(
        &self,
        node: &NodeId,
        segments: &mut Segments,
        min_len: usize,
        class: MemClass,
        class_bound: usize,
    ) -> Result<usize, DmaError> {
        let len = min_len
            .max(self.config.segment_size)
            .checked_next_multiple_of(HEADER_SIZE)
            .ok_or(DmaError::LengthOverflow)?;
        let index = segments.list.len();
        let class_total: usize = segments
            .list
            .iter()
            .filter(|seg| seg.class == class)
            .map(|seg| seg.allocator.capacity())
            .sum();
        if index == MAX_SEGMENTS
            || segments.total.saturating_add(len) > self.config.max_size
            || class_total.saturating_add(len) > class_bound
        {
            tracing::warn!(
                in_use = segments.total,
                requested = len,
                max = self.config.max_size,
                ?class,
                "dmable region is full"
            );
            return Err(DmaError::OutOfMemory);
        }
        // Only the header page is committed now: the data as it is used.
        let object = SharedObject::create_avoiding(
            &segment_name(node, index),
            HEADER_SIZE + len,
            HEADER_SIZE,
        )
        .map_err(|e| {
            tracing::warn!("cannot make a dmable segment in /dev/shm: {e}");
            if e.raw_os_error() == Some(libc::ENOSPC) {
                DmaError::NoSpace
            } else {
                DmaError::Io(e)
            }
        })?;
        let gens = GenTable::create(&gen_table_name(node, index), len).map_err(|e| {
            tracing::warn!("cannot make a dmable segment's generation table in /dev/shm: {e}");
            DmaError::Io(e)
        })?;
        object.publish();
        let segment = Segment {
            object,
            gens: Arc::new(gens),
            allocator: RangeAllocator::new(len),
            class,
            committed: 0,
        };
        let entry = &directory(&self.directory).segments[index];
        entry.base.store(segment.data() as u64, Ordering::Relaxed);
        entry.len.store(0, Ordering::Relaxed);
        directory(&self.directory)
            .count
            .store(index as u32 + 1, Ordering::Release);
        segments.list.push(segment);
        segments.total += len;
        tracing::debug!(index, len, ?class, "dmable segment added");
        Ok(index)
    }
}

/// A buffer of dmable memory, returned to the region when dropped.
///
/// It hands out raw pointers only: peers may write into it by DMA at any
/// time, so the owner decides when it is safe to look.
pub struct DmaBuf {
    region: Arc<DmaRegion>,
    ptr: NonNull<u8>,
    len: usize,
    /// Where it is in an own region (unused in an adopted one).
    segment: usize,
    offset: usize,
    rounded: usize,
}

// SAFETY: the buffer is plain memory owned by this handle alone.
unsafe impl Send for DmaBuf {}
// SAFETY: `&DmaBuf` only exposes the address and length.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address peers use to register and reach this buffer.
    pub fn remote_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Grows the buffer to `new_len` bytes where it is, if the memory right
    /// after it is free (never for an adopted region's buffers): whether it
    /// did. Its contents stay.
    pub fn try_extend(&mut self, new_len: usize) -> bool {
        if new_len <= self.len {
            return true;
        }
        let Backing::Own(own) = &self.region.backing else {
            return false;
        };
        let Some(rounded) = new_len.checked_next_multiple_of(ALLOC_ALIGN) else {
            return false;
        };
        if rounded > self.rounded {
            let mut segments = own.segments.lock();
            let segment = &mut segments.list[self.segment];
            if !segment.allocator.extend(self.offset, self.rounded, rounded) {
                return false;
            }
            if own
                .commit(segment, self.segment, self.offset + rounded)
                .is_err()
            {
                // Back to the old length: the extension is not committed.
                segment
                    .allocator
                    .free(self.offset + self.rounded, rounded - self.rounded);
                return false;
            }
            self.rounded = rounded;
        }
        self.len = new_len;
        true
    }

    /// Bytes `[offset, offset + len)` of the buffer are freed inside it (a
    /// block carved from it serves again): what freeing the whole buffer
    /// does to its pages, done to theirs. Their generations move on, and
    /// transfers into them that began before are waited for, so that no
    /// peer's late write lands in the next owner's data. Nothing in an
    /// adopted region (its heap does it).
    pub fn retire(&self, offset: usize, len: usize) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        let Backing::Own(own) = &self.region.backing else {
            return;
        };
        let gens = Arc::clone(&own.segments.lock().list[self.segment].gens);
        let (first, count) = page_span(self.offset + offset, self.offset + offset + len);
        gens.invalidate(first, count);
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset
            .checked_add(data.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: bounds checked above; the destination is our own mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.as_ptr().add(offset), data.len())
        };
    }

    /// Copies `out.len()` bytes from the buffer at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset
            .checked_add(out.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: bounds checked above; the source is our own mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        self.region.free(self);
    }
}

impl std::fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaBuf")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(tag: &str) -> RegionConfig {
        RegionConfig {
            job: JobId::from_name(&format!("region-{tag}-{}", std::process::id())),
            segment_size: 1 << 20,
            max_size: 4 << 20,
        }
    }

    #[test]
    fn alloc_grow_bound_and_free() {
        // One process has one region: these assertions share it.
        let region = DmaRegion::for_process(&config("one")).unwrap();
        let again = DmaRegion::for_process(&config("one")).unwrap();
        assert!(Arc::ptr_eq(&region, &again));
        assert!(matches!(
            DmaRegion::for_process(&config("other-job")),
            Err(DmaError::Invalid)
        ));

        let a = region.alloc(100).unwrap();
        assert_eq!(a.as_ptr() as usize % ALLOC_ALIGN, 0);
        assert!(region.contains(a.as_ptr() as usize, 100));
        assert!(!region.contains(&a as *const DmaBuf as usize, 1));
        a.write(10, b"hello");
        let mut out = [0u8; 5];
        a.read(10, &mut out);
        assert_eq!(&out, b"hello");

        // A 3 MiB buffer needs a segment of its own; the 4 MiB bound then
        // leaves no room for another such one.
        let big = region.alloc(3 << 20).unwrap();
        assert!(matches!(region.alloc(3 << 20), Err(DmaError::OutOfMemory)));
        assert_eq!(region.in_use(), ALLOC_ALIGN + (3 << 20));
        drop(big);
        drop(a);
        assert_eq!(region.in_use(), 0);
        assert!(matches!(region.alloc(0), Err(DmaError::Invalid)));
    }

    /// Memory the provider let go (a peer may still hold a grant or credit
    /// for it) is never handed to the application's heap, and the heap's
    /// class bound holds.
    #[test]
    fn classes_never_share_memory() {
        let region = DmaRegion::owned(&config("classes")).unwrap();
        assert!(!region.is_adopted());
        let internal = region.alloc(4096).unwrap();
        let freed = internal.as_ptr() as usize;
        drop(internal);
        let heap = region.alloc_in(MemClass::Heap, 4096, 1 << 20).unwrap();
        let ranges = region.segment_ranges();
        assert_eq!(ranges.len(), 2, "one segment per class");
        let in_segment = |addr: usize| ranges.iter().position(|&(b, l)| addr >= b && addr < b + l);
        assert_ne!(in_segment(freed), in_segment(heap.as_ptr() as usize));
        assert!(region.contains(heap.as_ptr() as usize, 4096));
        // The heap's class may not grow past its bound (one 1 MiB segment).
        assert!(matches!(
            region.alloc_in(MemClass::Heap, 2 << 20, 1 << 20),
            Err(DmaError::OutOfMemory)
        ));
        // A buffer grows in place into free memory after it, not over
        // another buffer.
        let mut first = region.alloc_in(MemClass::Heap, 4096, 1 << 20).unwrap();
        let after = region.alloc_in(MemClass::Heap, 64, 1 << 20).unwrap();
        assert!(!first.try_extend(8192));
        drop(after);
        let start = first.as_ptr();
        assert!(first.try_extend(8192));
        assert_eq!((first.as_ptr(), first.len()), (start, 8192));
        drop(first);
        // The provider still can.
        let big = region.alloc(2 << 20).unwrap();
        assert_eq!(region.segment_ranges().len(), 3);
        drop((big, heap));
        assert_eq!(region.in_use(), 0);
    }
}
