//! Small blocks: allocations of at most [`SMALL_MAX`] bytes, carved from
//! slabs of [`SLAB_LEN`] dmable bytes, one size class per slab.
//!
//! A block of the region's own allocator takes whole pages (a free bumps
//! the generations of its pages, and must not bump a neighbour's), which
//! is right for buffers and wasteful for a counter or a flag: an 8-byte
//! `MPI_Win_allocate` would take 4 KiB. Small blocks share pages instead,
//! so a free bumps pages other live blocks sit on: a peer holding a
//! registration of one of them finds it stale and renews it (the general
//! path's rule), and the provider never grants a small block's pages to a
//! rendezvous in place (`heap::abi_grant_token`), which a neighbour's free
//! would void mid-transfer.
//!
//! Slabs are never given back: like glibc's arenas, the heap keeps what its
//! busiest moment needed.

/// Largest small block.
pub const SMALL_MAX: usize = 2048;

/// Bytes of one slab (whole pages of the region).
pub const SLAB_LEN: usize = 64 << 10;

/// The block sizes: multiples of 16 (malloc's alignment), at most a third
/// more than asked above 32 bytes.
const SIZES: [usize; CLASSES] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
];

pub const CLASSES: usize = 14;

/// Class of each size in 16-byte steps: `BY_STEP[(size + 15) / 16]`.
const BY_STEP: [u8; SMALL_MAX / 16 + 1] = {
    let mut table = [0u8; SMALL_MAX / 16 + 1];
    let mut step = 0;
    let mut class = 0;
    while step < table.len() {
        while SIZES[class] < step * 16 {
            class += 1;
        }
        table[step] = class as u8;
        step += 1;
    }
    table
};

/// Bytes of a block of `class`.
#[inline]
pub fn block_len(class: usize) -> usize {
    SIZES[class]
}

/// The class that serves `size` bytes aligned to `align` (a power of
/// two), or None if no small block does.
#[inline]
pub fn class_of(size: usize, align: usize) -> Option<usize> {
    if size > SMALL_MAX {
        return None;
    }
    let first = BY_STEP[size.max(1).div_ceil(16)] as usize;
    // Slabs start on a page: a block is aligned to the largest power of
    // two that divides its size (16 at least).
    (first..CLASSES).find(|&c| SIZES[c].is_multiple_of(align))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_gets_the_smallest_block_that_holds_it() {
        for size in 0..=SMALL_MAX {
            let class = class_of(size, 16).unwrap();
            assert!(block_len(class) >= size.max(1), "{size}");
            if class > 0 {
                assert!(block_len(class - 1) < size, "{size}");
            }
        }
        assert_eq!(class_of(SMALL_MAX + 1, 16), None);
    }

    #[test]
    fn blocks_keep_mallocs_alignment_and_waste_little() {
        for (class, &len) in SIZES.iter().enumerate() {
            assert!(len.is_multiple_of(16));
            assert!(SLAB_LEN.is_multiple_of(4096) && SLAB_LEN / len >= 32);
            if len > 32 {
                assert!(len <= SIZES[class - 1] * 3 / 2 + 16, "{len}");
            }
        }
    }

    #[test]
    fn an_aligned_request_takes_a_class_its_alignment_divides() {
        assert_eq!(block_len(class_of(100, 256).unwrap()), 256);
        assert_eq!(block_len(class_of(300, 256).unwrap()), 512);
        assert_eq!(block_len(class_of(8, 64).unwrap()), 64);
        assert_eq!(class_of(100, 4096), None);
    }
}
