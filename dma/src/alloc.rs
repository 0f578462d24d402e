//! Best-fit allocator of byte ranges inside one segment. Plain Rust: it hands
//! out offsets, the region turns them into addresses.

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges indexed both by offset (to coalesce on free) and by size (to
/// find the best fit in O(log n)).
#[derive(Debug)]
pub struct RangeAllocator {
    by_offset: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
    capacity: usize,
    in_use: usize,
}

impl RangeAllocator {
    pub fn new(capacity: usize) -> RangeAllocator {
        let mut allocator = RangeAllocator {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            capacity,
            in_use: 0,
        };
        if capacity > 0 {
            allocator.insert_free(0, capacity);
        }
        allocator
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Takes `len` bytes (a multiple of the caller's alignment, which every
    /// offset also keeps) from the smallest free range that holds them.
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        debug_assert!(len > 0);
        let &(size, offset) = self.by_size.range((len, 0)..).next()?;
        self.remove_free(offset, size);
        if size > len {
            self.insert_free(offset + len, size - len);
        }
        self.in_use += len;
        Some(offset)
    }

    /// Grows the allocation `[offset, offset + len)` to `new_len` bytes in
    /// place, if the free range right after it is long enough.
    pub fn extend(&mut self, offset: usize, len: usize, new_len: usize) -> bool {
        debug_assert!(new_len >= len);
        let end = offset + len;
        let more = new_len - len;
        match self.by_offset.get(&end) {
            Some(&next_len) if next_len >= more => {
                self.remove_free(end, next_len);
                if next_len > more {
                    self.insert_free(end + more, next_len - more);
                }
                self.in_use += more;
                true
            }
            _ => more == 0,
        }
    }

    /// Returns `[offset, offset + len)`, merging it with free neighbours.
    pub fn free(&mut self, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.capacity);
        self.in_use -= len;
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&prev, &prev_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(prev + prev_len <= offset, "double free");
            if prev + prev_len == offset {
                self.remove_free(prev, prev_len);
                start = prev;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&end) {
            self.remove_free(end, next_len);
            end += next_len;
        }
        self.insert_free(start, end - start);
    }

    fn insert_free(&mut self, offset: usize, len: usize) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: usize, len: usize) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
    }

    /// Number of disjoint free ranges (for tests of coalescing).
    #[cfg(test)]
    fn free_ranges(&self) -> usize {
        self.by_offset.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_coalesce() {
        let mut a = RangeAllocator::new(1000);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(200).unwrap();
        let z = a.alloc(300).unwrap();
        assert_eq!((x, y, z), (0, 100, 300));
        assert_eq!(a.in_use(), 600);
        a.free(y, 200);
        // 150 fits the 200-byte hole better than the 400-byte tail.
        assert_eq!(a.alloc(150), Some(100));
        a.free(100, 150);
        a.free(x, 100);
        a.free(z, 300);
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.alloc(1000), Some(0));
        assert_eq!(a.alloc(1), None);
    }

    #[test]
    fn extend_in_place_only_into_free_space() {
        let mut a = RangeAllocator::new(1000);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        assert!(!a.extend(x, 100, 150), "y is in the way");
        assert!(a.extend(y, 100, 300));
        assert_eq!(a.in_use(), 400);
        assert_eq!(a.alloc(700), None);
        assert_eq!(a.alloc(600), Some(400));
        assert!(!a.extend(y, 300, 301));
        a.free(400, 600);
        assert!(a.extend(y, 300, 900));
        assert_eq!(a.free_ranges(), 0);
        a.free(x, 100);
        a.free(y, 900);
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.in_use(), 0);
    }

    #[test]
    fn random_alloc_free_never_overlaps() {
        let mut a = RangeAllocator::new(1 << 16);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
        let mut next = || rng.u64(..);
        for _ in 0..20_000 {
            if next() % 3 != 0 || live.is_empty() {
                let len = (next() % 2048 + 1) as usize;
                if let Some(offset) = a.alloc(len) {
                    assert!(offset + len <= a.capacity());
                    for &(o, l) in &live {
                        assert!(offset + len <= o || o + l <= offset, "overlap");
                    }
                    live.push((offset, len));
                }
            } else {
                let (o, l) = live.swap_remove((next() as usize) % live.len());
                a.free(o, l);
            }
            assert_eq!(a.in_use(), live.iter().map(|&(_, l)| l).sum::<usize>());
        }
        for (o, l) in live.drain(..) {
            a.free(o, l);
        }
        assert_eq!(a.free_ranges(), 1);
    }
}
