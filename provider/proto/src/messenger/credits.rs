//! Eager credits: the slots of the ring a receiver set aside for a sender.
//! A sender spends one per eager message; the receiver owes them back as it
//! consumes slots, piggybacked on its own data messages when it can, or in
//! a Credit message once half the ring is owed.
//!
//! Owns: the `credits` of each peer's [`TxRing`](super::peers::TxRing)
//! and the `owed` of each [`RxRing`](super::peers::RxRing).

use super::{Backend, Messenger, PeerIdx};
use crate::wire::Wire;

impl<B: Backend> Messenger<B> {
    /// Credits owed to `peer`, taken for piggybacking (at most 255). None
    /// while we throttle it: its eager messages wait, and what it has in
    /// flight stays within its ring.
    #[inline(always)]
    pub(crate) fn take_owed(&mut self, peer: PeerIdx) -> u8 {
        if self.peers[peer].throttling {
            return 0;
        }
        let Some(rx) = self.peers[peer].rx.as_mut() else {
            return 0;
        };
        let credits = rx.owed.min(u8::MAX as usize);
        rx.owed -= credits;
        credits as u8
    }

    pub(crate) fn add_credits(&mut self, peer: PeerIdx, credits: u8) {
        if credits == 0 {
            return;
        }
        if let Some(tx) = self.peers[peer].tx.as_mut() {
            tx.credits = (tx.credits + credits as usize).min(tx.slots);
        }
        self.mark_active(peer);
    }

    pub(crate) fn return_credits(&mut self) {
        for peer in 0..self.peers.len() {
            let Some(rx) = self.peers[peer].rx.as_ref() else {
                continue;
            };
            // Half the ring: a sender that ran dry always gets its credits back.
            if rx.owed > 0
                && rx.owed >= rx.slots.div_ceil(2)
                && !self.peers[peer].dead
                && !self.peers[peer].throttling
            {
                let credits = self.take_owed(peer);
                self.queue_control(peer, Wire::Credit { credits }.encode());
            }
        }
    }
}
