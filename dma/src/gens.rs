//! Generations of a segment's pages: how the owner of dmable memory
//! invalidates what peers hold of it before the memory serves again.
//!
//! Each segment has a table in shared memory (object `…-gen<i>`): a
//! generation per page of the segment, and a pin count in two halves. The
//! owner bumps the generation of every page of a block it frees, then
//! waits until every transfer that might have started before the bump is
//! done; only then does the block go back to the allocator. A peer pins
//! the table for each transfer, reads the generations of the pages it is
//! about to touch, checks them against what it holds (the snapshot of its
//! registration, the token of the grant it acts on), copies, and unpins.
//!
//! The two sides meet in one sequentially consistent order: either the
//! peer's pin comes first (the owner waits for its unpin, so the copy is
//! over before the memory is handed out again), or the owner's bump comes
//! first (the peer sees the new generation and refuses to copy). The pin
//! counts have two halves, flipped by every free (a grace period, as in
//! SRCU), so that a stream of transfers into other pages of the segment
//! cannot keep a free waiting; a pin counts only if the phase did not move
//! while it was taken, and the owner's frees of one segment take turns, so
//! every free waits for every pin that could have missed its bump.
//!
//! The peer's side of the table is untrusted input to the owner only as
//! far as waiting goes: a pin that is never released (its holder died
//! mid-copy, or is hostile) holds a free for [`PIN_PATIENCE`] at most.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unimem_mailbox::shm::{SharedObject, HEADER_SIZE};

/// The unit of invalidation: a page. Heap blocks are page-aligned and
/// page-rounded, so freeing one never bumps a page of a neighbour.
pub const GEN_PAGE: usize = 4096;

/// Most a free waits for the pins of transfers that started before it.
/// Only a holder that died mid-copy (or a hostile one) is this slow: a
/// copy of a fragment takes microseconds.
pub const PIN_PATIENCE: Duration = Duration::from_secs(1);

/// The table's control words, after the object header.
#[repr(C)]
struct Control {
    /// Pages the table covers (set before publishing, never changed).
    pages: AtomicU32,
    /// Which half of `pins` new transfers count in (its low bit).
    phase: AtomicU32,
    pins: [AtomicU32; 2],
}

const CONTROL_AT: usize = HEADER_SIZE;
const GENS_AT: usize = HEADER_SIZE + 64;
const _: () = assert!(std::mem::size_of::<Control>() <= GENS_AT - CONTROL_AT);

/// The pages of data bytes `[from, to)` of a segment: the first, and how
/// many (an empty range touches none).
pub(crate) fn page_span(from: usize, to: usize) -> (usize, usize) {
    let first = from / GEN_PAGE;
    (first, to.div_ceil(GEN_PAGE).saturating_sub(first))
}

/// Object size for a segment of `capacity` data bytes.
pub(crate) fn table_len(capacity: usize) -> usize {
    GENS_AT + capacity.div_ceil(GEN_PAGE) * 4
}

/// A segment's generation table, the owner's or a peer's mapping of it.
pub(crate) struct GenTable {
    object: SharedObject,
    /// Owner: its frees of this segment take turns (see the module comment).
    turns: parking_lot::Mutex<()>,
    /// Pages covered: from the owner's layout, or (a peer's view) the
    /// smaller of what the table claims and what its object holds.
    pages: usize,
}

impl GenTable {
    /// The owner's new table for a segment of `capacity` data bytes; every
    /// generation starts at 0.
    pub(crate) fn create(name: &str, capacity: usize) -> std::io::Result<GenTable> {
        let object = SharedObject::create_avoiding(name, table_len(capacity), table_len(capacity))?;
        let pages = capacity.div_ceil(GEN_PAGE);
        let table = GenTable {
            object,
            turns: parking_lot::Mutex::new(()),
            pages,
        };
        table.control().pages.store(pages as u32, Ordering::Relaxed);
        table.object.publish();
        Ok(table)
    }

    /// A peer's view of an owner's table (opened and checked by the caller).
    /// What the table claims is the owner's to write: only pages inside the
    /// object are ever looked at.
    pub(crate) fn from_peer(object: SharedObject) -> Option<GenTable> {
        if object.len() < GENS_AT {
            return None;
        }
        // SAFETY: the object is at least GENS_AT bytes (checked above).
        let claimed = unsafe { &*(object.base().add(CONTROL_AT) as *const Control) }
            .pages
            .load(Ordering::Relaxed) as usize;
        let pages = claimed.min((object.len() - GENS_AT) / 4);
        Some(GenTable {
            object,
            turns: parking_lot::Mutex::new(()),
            pages,
        })
    }

    pub(crate) fn name(&self) -> &str {
        self.object.name()
    }

    fn control(&self) -> &Control {
        // SAFETY: every table is at least GENS_AT bytes (create, from_peer),
        // and Control is atomics only.
        unsafe { &*(self.object.base().add(CONTROL_AT) as *const Control) }
    }

    /// The generation word of page `page`, if the table covers it.
    fn word(&self, page: usize) -> Option<&AtomicU32> {
        (page < self.pages).then(|| {
            // SAFETY: page < pages, which fit in the object after GENS_AT.
            unsafe { &*(self.object.base().add(GENS_AT + page * 4) as *const AtomicU32) }
        })
    }

    /// Pages `[first, first + count)` (of the segment's data), if covered.
    fn words(&self, first: usize, count: usize) -> Option<impl Iterator<Item = &AtomicU32>> {
        let end = first.checked_add(count)?;
        (end <= self.pages).then(|| (first..end).map(|page| self.word(page).expect("covered")))
    }

    /// The generations of pages `[first, first + count)` now.
    pub(crate) fn snapshot(&self, first: usize, count: usize) -> Option<Vec<u32>> {
        Some(
            self.words(first, count)?
                .map(|w| w.load(Ordering::SeqCst))
                .collect(),
        )
    }

    /// The token a grant of pages `[first, first + count)` carries: the sum
    /// of their generations, modulo 2^16 (a page's generation only grows,
    /// so any free in the range changes it, unless the range was freed a
    /// multiple of 65,536 times meanwhile).
    pub(crate) fn token(&self, first: usize, count: usize) -> Option<u16> {
        Some(
            self.words(first, count)?
                .fold(0u32, |sum, w| sum.wrapping_add(w.load(Ordering::SeqCst))) as u16,
        )
    }

    /// Owner: pages `[first, first + count)` are freed. Bumps their
    /// generations, then waits until transfers that may not have seen the
    /// bump are done (see the module comment).
    pub(crate) fn invalidate(&self, first: usize, count: usize) {
        let Some(words) = self.words(first, count) else {
            return;
        };
        let _turn = self.turns.lock();
        // Only the owner writes generations (and its frees take turns):
        // plain stores, ordered before the pin check by the fence below,
        // not a locked instruction per page.
        for word in words {
            word.store(
                word.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
        }
        fence(Ordering::SeqCst);
        let control = self.control();
        // New pins go to the other half; the old half only drains.
        let old = control.phase.fetch_add(1, Ordering::SeqCst) as usize & 1;
        // The clock is read only if a pin holds the free (most frees find
        // none: a small block's free is a malloc-rate path).
        let mut deadline = None;
        let mut spins = 0u32;
        while control.pins[old].load(Ordering::SeqCst) != 0 {
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + PIN_PATIENCE);
            if Instant::now() >= deadline {
                static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                unimem_mailbox::shm::rate_limited(&LAST, || {
                    tracing::warn!(
                        table = self.name(),
                        "a peer held a transfer into freed dmable memory for {PIN_PATIENCE:?}: \
                         taken for dead, its pin ignored"
                    )
                });
                // It cannot hold this half forever: the next free waits
                // on it again only if it is still there.
                control.pins[old].store(0, Ordering::SeqCst);
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Peer: pins the table for one transfer; the pin is released when the
    /// returned guard goes.
    #[inline]
    pub(crate) fn pin(&self) -> Pin<'_> {
        let control = self.control();
        loop {
            let phase = control.phase.load(Ordering::SeqCst);
            let count = &control.pins[phase as usize & 1];
            count.fetch_add(1, Ordering::SeqCst);
            if control.phase.load(Ordering::SeqCst) == phase {
                return Pin { count };
            }
            // A free flipped meanwhile and may not wait for this half.
            drop(Pin { count });
        }
    }

    /// Peer, under a pin: whether pages `[first, first + count)` still have
    /// the generations in `expected` (one per page), and the token of the
    /// range (see [`Self::token`]).
    pub(crate) fn check(&self, first: usize, expected: &[u32]) -> Option<(bool, u16)> {
        let mut same = true;
        let mut sum = 0u32;
        for (word, &was) in self.words(first, expected.len())?.zip(expected) {
            let now = word.load(Ordering::SeqCst);
            same &= now == was;
            sum = sum.wrapping_add(now);
        }
        Some((same, sum as u16))
    }
}

impl GenTable {
    /// [`Self::check`] without the token: whether pages `[first, first +
    /// expected.len())` still have the generations in `expected` (false
    /// for pages the table does not cover). The per-message check of a
    /// leased registration (`engine/registration.rs`), kept to indexing.
    #[inline]
    pub(crate) fn holds(&self, first: usize, expected: &[u32]) -> bool {
        if first.saturating_add(expected.len()) > self.pages {
            return false;
        }
        // SAFETY: first + expected.len() <= pages, which fit in the object
        // after GENS_AT (checked above).
        let words = unsafe { self.object.base().add(GENS_AT + first * 4) } as *const AtomicU32;
        for (i, &was) in expected.iter().enumerate() {
            // SAFETY: as above; the word is an atomic.
            if unsafe { &*words.add(i) }.load(Ordering::SeqCst) != was {
                return false;
            }
        }
        true
    }
}

/// A pinned table: the owner's frees wait for it (see [`GenTable::pin`]).
pub(crate) struct Pin<'a> {
    count: &'a AtomicU32,
}

impl Pin<'_> {
    /// The same pin, held by whoever holds the result (a copy that another
    /// thread finishes): `table` must be the table pinned.
    pub(crate) fn detach(self, table: Arc<GenTable>) -> OwnedPin {
        let control = table.control();
        let half = usize::from(!std::ptr::eq(self.count, &control.pins[0]));
        // The count moves to the OwnedPin, which releases it.
        std::mem::forget(self);
        OwnedPin { table, half }
    }
}

impl Drop for Pin<'_> {
    #[inline]
    fn drop(&mut self) {
        unpin(self.count);
    }
}

/// A [`Pin`] that owns its table.
pub(crate) struct OwnedPin {
    table: Arc<GenTable>,
    half: usize,
}

impl Drop for OwnedPin {
    fn drop(&mut self) {
        unpin(&self.table.control().pins[self.half]);
    }
}

#[inline]
fn unpin(count: &AtomicU32) {
    // A count the owner reset (it took us for dead) stays at 0.
    let _ = count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use unimem_mailbox::JobId;

    use super::*;

    fn tables(tag: &str) -> (GenTable, GenTable) {
        let name = unimem_mailbox::shm::object_name(
            JobId::from_name(&format!("gens-{tag}-{}", std::process::id())),
            "gen0",
        );
        let owner = GenTable::create(&name, 64 * GEN_PAGE).unwrap();
        let peer = GenTable::from_peer(SharedObject::open(owner.name()).unwrap()).unwrap();
        (owner, peer)
    }

    #[test]
    fn a_free_waits_for_the_transfer_that_pinned_before_it() {
        let (owner, peer) = tables("wait");
        let before = peer.snapshot(3, 2).unwrap();
        let copying = Arc::new(AtomicBool::new(true));
        let (peer, flag) = (Arc::new(peer), Arc::clone(&copying));
        let pinned = Arc::new(std::sync::Barrier::new(2));
        let holder = {
            let (peer, pinned) = (Arc::clone(&peer), Arc::clone(&pinned));
            std::thread::spawn(move || {
                let pin = peer.pin();
                pinned.wait();
                std::thread::sleep(Duration::from_millis(100));
                flag.store(false, Ordering::SeqCst);
                drop(pin);
            })
        };
        pinned.wait();
        let started = Instant::now();
        owner.invalidate(3, 1);
        assert!(
            !copying.load(Ordering::SeqCst),
            "the free returned mid-copy"
        );
        assert!(started.elapsed() >= Duration::from_millis(90));
        holder.join().unwrap();
        // A transfer that pins now sees the bump of page 3, not of page 4.
        let pin = peer.pin();
        let (same, _) = peer.check(3, &before).unwrap();
        assert!(!same);
        assert!(peer.check(4, &before[1..]).unwrap().0);
        drop(pin);
        // With nothing pinned, a free does not wait.
        let started = Instant::now();
        owner.invalidate(10, 1);
        assert!(started.elapsed() < PIN_PATIENCE);
    }

    #[test]
    fn a_pin_never_released_holds_a_free_for_its_patience_only() {
        let (owner, peer) = tables("dead");
        std::mem::forget(peer.pin());
        let started = Instant::now();
        owner.invalidate(0, 1);
        assert!(started.elapsed() >= PIN_PATIENCE);
        let started = Instant::now();
        owner.invalidate(0, 1);
        assert!(started.elapsed() < PIN_PATIENCE);
    }

    #[test]
    fn tables_of_hostile_size_cover_only_what_they_hold() {
        let (owner, _) = tables("size");
        owner.control().pages.store(u32::MAX, Ordering::Relaxed);
        let peer = GenTable::from_peer(SharedObject::open(owner.name()).unwrap()).unwrap();
        assert_eq!(peer.pages, 64);
        assert!(peer.snapshot(63, 1).is_some());
        assert!(peer.snapshot(63, 2).is_none());
        assert!(peer.token(usize::MAX, 2).is_none());
    }
}
