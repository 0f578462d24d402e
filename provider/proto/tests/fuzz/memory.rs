//! Guarded memory: every buffer the harness hands a messenger has guard
//! bytes on each side, checked after every execution; and the byte
//! patterns that make a message's data its own.

use super::*;

// --- guarded memory --------------------------------------------------------------

/// Guard bytes on each side of every buffer the harness hands a messenger.
const GUARD: usize = 32;
/// What a receive buffer holds beyond the data that arrived.
pub(crate) const FILL: u8 = 0xee;

/// What a buffer's memory is, kept for its lifetime (never read: the
/// buffer works through its pointer).
#[allow(dead_code)]
enum Backing {
    Dma(DmaBuf),
    /// `u64`s, so that atomics find their words aligned.
    Heap(Box<[u64]>),
}

/// A buffer with guards: `[guard][len bytes][guard]`.
pub(crate) struct Mem {
    _backing: Backing,
    base: *mut u8,
    pub(crate) len: usize,
    guard: u8,
}

impl Mem {
    pub(crate) fn new(region: &Arc<DmaRegion>, dmable: bool, len: usize, guard: u8) -> Mem {
        let total = len + 2 * GUARD;
        let (backing, base) = if dmable {
            let buf = region.alloc(total).expect("dmable memory");
            let base = buf.as_ptr();
            (Backing::Dma(buf), base)
        } else {
            let mut words = vec![0u64; total.div_ceil(8)].into_boxed_slice();
            let base = words.as_mut_ptr() as *mut u8;
            (Backing::Heap(words), base)
        };
        let mem = Mem {
            _backing: backing,
            base,
            len,
            guard,
        };
        // SAFETY: `base` holds `total` bytes, ours alone.
        unsafe {
            std::ptr::write_bytes(base, guard, GUARD);
            std::ptr::write_bytes(base.add(GUARD), FILL, len);
            std::ptr::write_bytes(base.add(GUARD + len), guard, GUARD);
        }
        mem
    }

    fn ptr(&self) -> *mut u8 {
        self.base.wrapping_add(GUARD)
    }

    pub(crate) fn addr(&self) -> usize {
        self.ptr() as usize
    }

    /// The data bytes; the caller holds no other view of them meanwhile.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes past the front guard are ours; the harness is
        // single-threaded, so no DMA writes them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this view unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    pub(crate) fn guards_intact(&self) -> bool {
        // SAFETY: both guards lie inside the allocation.
        let (front, back) = unsafe {
            (
                std::slice::from_raw_parts(self.base, GUARD),
                std::slice::from_raw_parts(self.base.add(GUARD + self.len), GUARD),
            )
        };
        front.iter().chain(back).all(|&b| b == self.guard)
    }

    pub(crate) fn iov(&self, len: usize) -> IovList {
        IovList::One((self.addr(), len))
    }
}

fn pattern_byte(seed: u64, i: usize) -> u8 {
    (seed as u8) ^ (seed >> 8) as u8 ^ (i as u8).wrapping_mul(31) ^ (i >> 8) as u8
}

pub(crate) fn fill_pattern(out: &mut [u8], seed: u64) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = pattern_byte(seed, i);
    }
}

pub(crate) fn is_pattern(data: &[u8], seed: u64) -> bool {
    data.iter()
        .enumerate()
        .all(|(i, &b)| b == pattern_byte(seed, i))
}
