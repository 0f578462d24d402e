//! Lock-free tables of address ranges: which addresses are the heap's.
//!
//! Every `free`, `realloc` and `malloc_usable_size` of the process asks
//! whether its pointer is ours before anything else, so the question must
//! cost a few loads and no lock. A table only grows while its process
//! lives (segments are never removed); a forked child moves its parent's
//! entries to its table of inherited ranges (`INHERITED`; see
//! `State::after_fork` in `heap.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

use unimem_dma::MAX_SEGMENTS;

pub struct Ranges {
    count: AtomicUsize,
    start: [AtomicUsize; MAX_SEGMENTS],
    end: [AtomicUsize; MAX_SEGMENTS],
}

impl Ranges {
    pub const fn new() -> Ranges {
        Ranges {
            count: AtomicUsize::new(0),
            start: [const { AtomicUsize::new(0) }; MAX_SEGMENTS],
            end: [const { AtomicUsize::new(0) }; MAX_SEGMENTS],
        }
    }

    /// Whether `[addr, addr + len)` lies in one range.
    #[inline]
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let Some(last) = addr.checked_add(len) else {
            return false;
        };
        let count = self.count.load(Ordering::Acquire).min(MAX_SEGMENTS);
        (0..count).any(|i| {
            addr >= self.start[i].load(Ordering::Relaxed)
                && last <= self.end[i].load(Ordering::Relaxed)
        })
    }

    /// Adds `(start, len)` unless present. Callers serialize (the heap's lock).
    pub fn add(&self, start: usize, len: usize) {
        let count = self.count.load(Ordering::Relaxed);
        if count == MAX_SEGMENTS || self.entries().any(|(s, _)| s == start) {
            return;
        }
        self.start[count].store(start, Ordering::Relaxed);
        self.end[count].store(start + len, Ordering::Relaxed);
        self.count.store(count + 1, Ordering::Release);
    }

    /// The ranges, as `(start, len)`.
    pub fn entries(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let count = self.count.load(Ordering::Acquire).min(MAX_SEGMENTS);
        (0..count).map(|i| {
            let start = self.start[i].load(Ordering::Relaxed);
            (start, self.end[i].load(Ordering::Relaxed) - start)
        })
    }

    /// Forgets every range (a forked child, single-threaded).
    pub fn clear(&self) {
        self.count.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_whole_ranges_only() {
        let r = Ranges::new();
        assert!(!r.contains(100, 1));
        r.add(100, 50);
        r.add(100, 50);
        r.add(1000, 10);
        assert_eq!(r.entries().count(), 2);
        assert!(r.contains(100, 50));
        assert!(r.contains(149, 1));
        assert!(!r.contains(149, 2));
        assert!(!r.contains(99, 1));
        assert!(r.contains(1005, 5));
        assert!(!r.contains(usize::MAX, 2));
        r.clear();
        assert!(!r.contains(100, 1));
    }
}
