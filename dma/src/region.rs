//! Dmable memory: the per-process region the emulated DMA engine works on.
//!
//! The region is a list of shared-memory segments, created on demand up to a
//! configured bound, plus a *directory* object that tells peers where each
//! segment sits in this process's address space. A peer that registers one
//! of our addresses finds its segment in the directory and maps that part of
//! it: the emulated route. Addresses are this process's own virtual
//! addresses, as with Unimem's unified addressing.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use unimem_mailbox::shm::{object_name, SharedObject, HEADER_SIZE};
use unimem_mailbox::{JobId, NodeId};

use crate::alloc::RangeAllocator;
use crate::error::DmaError;

/// Every allocation is aligned to (and rounded up to) a cache line.
pub const ALLOC_ALIGN: usize = 64;
/// Most segments one region can hold (the directory is one page).
pub const MAX_SEGMENTS: usize = 240;

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

// --- Directory layout (shared with peers) -------------------------------------

#[repr(C)]
pub(crate) struct SegmentEntry {
    /// Address of the segment's first data byte in the owner's address space.
    pub base: AtomicU64,
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
/// job: each has one directory object. (Objects of killed processes count
/// until someone reclaims them.)
pub fn host_nodes() -> usize {
    unimem_mailbox::shm::list_objects(None)
        .iter()
        .filter(|name| name.ends_with("-dma"))
        .count()
}

pub(crate) fn segment_name(node: &NodeId, index: usize) -> String {
    object_name(node.job, &format!("{}-seg{index}", node.pid))
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
    allocator: RangeAllocator,
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

/// This process's dmable memory.
pub struct DmaRegion {
    node: NodeId,
    config: RegionConfig,
    directory: SharedObject,
    segments: Mutex<Segments>,
}

static PROCESS_REGION: Mutex<Weak<DmaRegion>> = Mutex::new(Weak::new());

impl Drop for DmaRegion {
    /// Segments go first, the directory (a field, dropped after this) last:
    /// once a new region of this process could create its directory, the
    /// old one's segment names are free too (see `for_process`).
    fn drop(&mut self) {
        self.segments.get_mut().list.clear();
    }
}

impl DmaRegion {
    /// The region of this process, created on first use. A process is one
    /// node and has one region: later calls share it whatever their config
    /// (a different job is refused).
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

    fn create(config: &RegionConfig) -> Result<DmaRegion, DmaError> {
        if config.segment_size == 0 || config.max_size < config.segment_size {
            return Err(DmaError::Invalid);
        }
        let node = NodeId::current(config.job);
        let directory = SharedObject::create(&directory_name(&node), HEADER_SIZE)?;
        directory.publish();
        tracing::debug!(%node, segment_size = config.segment_size, "dmable region created");
        Ok(DmaRegion {
            node,
            config: config.clone(),
            directory,
            segments: Mutex::new(Segments {
                list: Vec::new(),
                total: 0,
            }),
        })
    }

    /// The node this region belongs to: the address peers register against.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Allocates `len` dmable bytes (cache-line aligned), growing the region
    /// by one segment if no segment has room.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<DmaBuf, DmaError> {
        if len == 0 {
            return Err(DmaError::Invalid);
        }
        let rounded = len
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(DmaError::LengthOverflow)?;
        let mut segments = self.segments.lock();
        let found = segments
            .list
            .iter_mut()
            .enumerate()
            .find_map(|(index, seg)| seg.allocator.alloc(rounded).map(|offset| (index, offset)));
        let (segment, offset) = match found {
            Some(found) => found,
            None => {
                let index = self.grow(&mut segments, rounded)?;
                let offset = segments.list[index]
                    .allocator
                    .alloc(rounded)
                    .ok_or(DmaError::OutOfMemory)?;
                (index, offset)
            }
        };
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

    fn grow(&self, segments: &mut Segments, min_len: usize) -> Result<usize, DmaError> {
        let len = min_len
            .max(self.config.segment_size)
            .checked_next_multiple_of(HEADER_SIZE)
            .ok_or(DmaError::LengthOverflow)?;
        let index = segments.list.len();
        if index == MAX_SEGMENTS || segments.total + len > self.config.max_size {
            tracing::warn!(
                in_use = segments.total,
                requested = len,
                max = self.config.max_size,
                "dmable region is full"
            );
            return Err(DmaError::OutOfMemory);
        }
        let object = SharedObject::create(&segment_name(&self.node, index), HEADER_SIZE + len)?;
        object.publish();
        let segment = Segment {
            object,
            allocator: RangeAllocator::new(len),
        };
        let entry = &directory(&self.directory).segments[index];
        entry.base.store(segment.data() as u64, Ordering::Relaxed);
        entry.len.store(len as u64, Ordering::Relaxed);
        directory(&self.directory)
            .count
            .store(index as u32 + 1, Ordering::Release);
        segments.list.push(segment);
        segments.total += len;
        tracing::debug!(index, len, "dmable segment added");
        Ok(index)
    }

    /// Whether `[addr, addr + len)` lies inside this process's dmable memory.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let Some(_) = addr.checked_add(len) else {
            return false;
        };
        self.segments
            .lock()
            .list
            .iter()
            .any(|seg| seg.contains(addr, len))
    }

    /// Bytes currently allocated.
    pub fn in_use(&self) -> usize {
        self.segments
            .lock()
            .list
            .iter()
            .map(|seg| seg.allocator.in_use())
            .sum()
    }

    fn free(&self, segment: usize, offset: usize, rounded: usize) {
        self.segments.lock().list[segment]
            .allocator
            .free(offset, rounded);
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
        self.region.free(self.segment, self.offset, self.rounded);
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
        assert_eq!(region.in_use(), 128 + (3 << 20));
        drop(big);
        drop(a);
        assert_eq!(region.in_use(), 0);
        assert!(matches!(region.alloc(0), Err(DmaError::Invalid)));
    }
}
