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
//!
//! Here: the region, its configuration and what it serves.
//! `directory.rs` holds what peers read (the directory's layout, the
//! objects' names), `segments.rs` the segments of a region this library
//! made (growing, committing), `buf.rs` the buffers it hands out
//! ([`DmaBuf`]).

mod buf;
mod directory;
mod segments;

use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use unimem_mailbox::shm::{SharedObject, HEADER_SIZE};
use unimem_mailbox::{JobId, NodeId};

use crate::error::DmaError;
use crate::gens::GEN_PAGE;
use crate::heap_abi::{self, HeapAbi, HeapRegionId};

pub use buf::DmaBuf;
pub use directory::host_nodes;
pub(crate) use directory::{directory, directory_name, gen_table_name, segment_name};
use segments::{Own, Segments};

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
