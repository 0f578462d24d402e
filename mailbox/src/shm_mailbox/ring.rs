//! The ring's shared layout: the slot word (ticket, state, claimer's pid),
//! the slots, the header fields and the tail, and the rebuilding of a tail
//! a peer corrupted.

use std::cell::UnsafeCell;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::MAX_DEPTH;
use crate::addr::ADDR_LEN;
use crate::doorbell;
use crate::shm::{rate_limited, SharedObject, HEADER_SIZE};
use crate::Message;

// --- Slot state word -------------------------------------------------------

pub(super) const FREE: u64 = 0;
pub(super) const CLAIMED: u64 = 1;
pub(super) const FULL: u64 = 2;

#[inline]
pub(super) fn state(pos: u32, kind: u64, pid: u32) -> u64 {
    u64::from(pos) | kind << 32 | u64::from(pid) << 34
}

#[inline]
pub(super) fn state_pos(word: u64) -> u32 {
    word as u32
}

#[inline]
pub(super) fn state_kind(word: u64) -> u64 {
    (word >> 32) & 3
}

#[inline]
pub(super) fn state_pid(word: u64) -> u32 {
    (word >> 34) as u32
}

// --- Shared layout ---------------------------------------------------------

/// One message in the ring: exactly one cache line.
#[repr(C, align(64))]
pub(super) struct Slot {
    pub(super) state: AtomicU64,
    /// Monotonic time before which the receiver must not see the message
    /// (`paper` profile); 0 for immediately.
    pub(super) visible_at: UnsafeCell<u64>,
    pub(super) source: UnsafeCell<[u8; ADDR_LEN]>,
    pub(super) message: UnsafeCell<Message>,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// Mailbox fields of the header page, after the generic object header.
#[repr(C)]
pub(super) struct RingHeader {
    depth: AtomicU32,
    /// Modeled one-way latency chosen by the receiver's profile.
    pub(super) latency_ns: AtomicU64,
}

/// The shared tail, on its own cache line: only senders touch it.
#[repr(C, align(64))]
struct Tail(AtomicU32);

const RING_HEADER_OFFSET: usize = 128;
const TAIL_OFFSET: usize = 256;
const _: () = assert!(doorbell::BELL_OFFSET + 64 <= TAIL_OFFSET);
const _: () =
    assert!(RING_HEADER_OFFSET + std::mem::size_of::<RingHeader>() <= doorbell::BELL_OFFSET);

/// A view of a mapped mailbox object.
pub(super) struct Ring {
    /// Shared with the owner's [`Doorbell`] handles.
    pub(super) object: Arc<SharedObject>,
    pub(super) mask: u32,
}

impl Ring {
    pub(super) fn create(name: &str, depth: usize, latency_ns: u64) -> io::Result<Ring> {
        let object = SharedObject::create(name, HEADER_SIZE + depth * std::mem::size_of::<Slot>())?;
        let ring = Ring {
            object: Arc::new(object),
            mask: depth as u32 - 1,
        };
        ring.header().depth.store(depth as u32, Ordering::Relaxed);
        ring.header()
            .latency_ns
            .store(latency_ns, Ordering::Relaxed);
        ring.tail().store(0, Ordering::Relaxed);
        for pos in 0..depth as u32 {
            ring.slot(pos)
                .state
                .store(state(pos, FREE, 0), Ordering::Relaxed);
        }
        ring.object.publish();
        Ok(ring)
    }

    pub(super) fn open(name: &str) -> io::Result<Ring> {
        let object = SharedObject::open(name)?;
        let header_ok = |depth: usize| {
            depth.is_power_of_two()
                && depth <= MAX_DEPTH
                && object.len() >= HEADER_SIZE + depth * std::mem::size_of::<Slot>()
        };
        // SAFETY: the object has at least a header page, which holds RingHeader.
        let depth = unsafe { &*(object.base().add(RING_HEADER_OFFSET) as *const RingHeader) }
            .depth
            .load(Ordering::Relaxed) as usize;
        if !header_ok(depth) {
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        Ok(Ring {
            object: Arc::new(object),
            mask: depth as u32 - 1,
        })
    }

    #[inline]
    pub(super) fn header(&self) -> &RingHeader {
        // SAFETY: RING_HEADER_OFFSET lies in the header page; atomics only.
        unsafe { &*(self.object.base().add(RING_HEADER_OFFSET) as *const RingHeader) }
    }

    #[inline]
    pub(super) fn tail(&self) -> &AtomicU32 {
        // SAFETY: TAIL_OFFSET lies in the header page and is 64-byte aligned.
        unsafe { &(*(self.object.base().add(TAIL_OFFSET) as *const Tail)).0 }
    }

    #[inline]
    pub(super) fn slot(&self, pos: u32) -> &Slot {
        let index = (pos & self.mask) as usize;
        // SAFETY: index < depth and the object holds depth slots after the
        // header page (checked at open); Slot's plain fields are only touched
        // under the state protocol described at the top of this module.
        unsafe { &*(self.object.base().add(HEADER_SIZE) as *const Slot).add(index) }
    }

    #[inline]
    pub(super) fn depth(&self) -> u32 {
        self.mask + 1
    }
}

/// Rebuilds a corrupted tail (seen as `bad`) from the slots: the next
/// ticket to claim is the lowest free one. Rare (a peer wrote into the
/// ring), so a scan of the ring is fine.
#[cold]
pub(super) fn resync_tail(ring: &Ring, bad: u32) {
    // Tickets compare by distance from any slot's: all lie within a lap.
    let anchor = state_pos(ring.slot(0).state.load(Ordering::Acquire));
    // A sound slot's ticket always maps to its index: others are corrupt
    // and count for nothing.
    let words = || {
        (0..ring.depth())
            .map(|index| (index, ring.slot(index).state.load(Ordering::Acquire)))
            .filter(|&(index, word)| state_pos(word) & ring.mask == index)
            .map(|(_, word)| word)
    };
    let lowest_free = words()
        .filter(|&word| state_kind(word) == FREE)
        .map(state_pos)
        .min_by_key(|&pos| pos.wrapping_sub(anchor).wrapping_add(ring.depth()));
    // No free slot: the ring is full; the tail then points at a slot of
    // the previous lap, the lowest ticket in use plus a lap.
    let fixed = lowest_free.unwrap_or_else(|| {
        let lowest = words()
            .map(state_pos)
            .min_by_key(|&pos| pos.wrapping_sub(anchor).wrapping_add(ring.depth()))
            .unwrap_or(anchor);
        lowest.wrapping_add(ring.depth())
    });
    if ring
        .tail()
        .compare_exchange(bad, fixed, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        static LAST: AtomicU64 = AtomicU64::new(0);
        rate_limited(&LAST, || {
            tracing::warn!(
                mailbox = ring.object.name(),
                tail = bad,
                fixed,
                "a peer's mailbox tail was corrupt: rebuilt from its slots"
            )
        });
    }
}

/// Moves the tail past ticket `pos` unless someone already did.
#[inline]
pub(super) fn advance_tail(tail: &AtomicU32, pos: u32) {
    let _ = tail.compare_exchange(
        pos,
        pos.wrapping_add(1),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_word_round_trip() {
        let word = state(0xffff_fffe, CLAIMED, (1 << 22) - 1);
        assert_eq!(state_pos(word), 0xffff_fffe);
        assert_eq!(state_kind(word), CLAIMED);
        assert_eq!(state_pid(word), (1 << 22) - 1);
    }
}
