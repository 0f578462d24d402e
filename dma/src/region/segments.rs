//! The segments of a region this library made: finding the one that
//! holds a range, committing their memory as it is handed out, and adding
//! one when none has room.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use unimem_mailbox::shm::{SharedObject, HEADER_SIZE};
use unimem_mailbox::NodeId;

use super::directory::{directory, gen_table_name, segment_name};
use super::{MemClass, RegionConfig, COMMIT_CHUNK, MAX_SEGMENTS};
use crate::alloc::RangeAllocator;
use crate::error::DmaError;
use crate::gens::{page_span, GenTable};

pub(super) struct Segment {
    pub(super) object: SharedObject,
    /// Generations of its pages, bumped by every free.
    pub(super) gens: Arc<GenTable>,
    pub(super) allocator: RangeAllocator,
    pub(super) class: MemClass,
    /// Data bytes committed in `/dev/shm` so far (from the start).
    pub(super) committed: usize,
}

impl Segment {
    #[inline]
    pub(super) fn data(&self) -> *mut u8 {
        // SAFETY: data starts right after the header page of the object.
        unsafe { self.object.base().add(HEADER_SIZE) }
    }

    #[inline]
    pub(super) fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.data() as usize;
        addr >= base && addr + len <= base + self.allocator.capacity()
    }
}

pub(super) struct Segments {
    pub(super) list: Vec<Segment>,
    pub(super) total: usize,
}

/// The objects of a region this library made.
pub(super) struct Own {
    pub(super) config: RegionConfig,
    pub(super) directory: SharedObject,
    pub(super) segments: Mutex<Segments>,
}

impl Drop for Own {
    /// Segments go first, the directory (a field, dropped after this) last:
    /// once a new region of this process could create its directory, the
    /// old one's segment names are free too (see `for_process`).
    fn drop(&mut self) {
        self.segments.get_mut().list.clear();
    }
}

impl Own {
    /// The generation table of the segment holding `[addr, addr + len)`,
    /// and the pages of the range in it.
    pub(super) fn pages_of(
        &self,
        addr: usize,
        len: usize,
    ) -> Option<(Arc<GenTable>, usize, usize)> {
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
    pub(super) fn commit(
        &self,
        segment: &mut Segment,
        index: usize,
        end: usize,
    ) -> Result<(), DmaError> {
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

    pub(super) fn grow(
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
