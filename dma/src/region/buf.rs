//! A buffer of dmable memory: what the region hands out.

use std::ptr::NonNull;
use std::sync::Arc;

use super::{Backing, DmaRegion, ALLOC_ALIGN};
use crate::gens::page_span;

/// A buffer of dmable memory, returned to the region when dropped.
///
/// It hands out raw pointers only: peers may write into it by DMA at any
/// time, so the owner decides when it is safe to look.
pub struct DmaBuf {
    pub(super) region: Arc<DmaRegion>,
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    /// Where it is in an own region (unused in an adopted one).
    pub(super) segment: usize,
    pub(super) offset: usize,
    pub(super) rounded: usize,
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
