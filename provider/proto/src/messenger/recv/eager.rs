//! The eager ring consumer: each eager message's data sits in the next slot
//! of the ring we set aside for its sender; it is delivered from there, and
//! the slot is owed back as a credit.
//!
//! Moves through [`RxRing`](super::super::peers::RxRing) (the ring's memory
//! and our place in it).

use super::super::{Addr, Backend, Messenger, PeerIdx};
use crate::wire::{MatchInfo, Wire, EAGER_SEQ_MOD};

impl<B: Backend> Messenger<B> {
    /// An eager message from `peer`: its `len` bytes are in the next slot.
    /// With `ack`, its sender waits for a `Fin` naming that send id: it is
    /// sent once the message is delivered into a posted receive or copied
    /// out of the slot as an unexpected message (both within `deliver`),
    /// which is match and delivery complete.
    ///
    /// Only the announcement of the slot we expect next (its sequence
    /// number), of no more than our eager size, is taken: any other is
    /// dropped, and the ring stays where it was. Inlined into the arrival's
    /// handler with the delivery (see `deliver`).
    #[inline(always)]
    pub(crate) fn on_eager(
        &mut self,
        peer: PeerIdx,
        src: Addr<B>,
        info: MatchInfo,
        len: u32,
        seq: u8,
        ack: Option<u16>,
    ) {
        let eager_size = self.cfg.eager_size;
        let Some(rx) = self.peers[peer].rx.as_mut() else {
            self.drop_invalid(peer, "eager message from a peer without our ring");
            return;
        };
        if seq != rx.seq || len as usize > eager_size {
            self.drop_invalid(peer, "eager announcement out of sequence or too long");
            return;
        }
        rx.seq = (rx.seq + 1) % EAGER_SEQ_MOD;
        let slot = rx.memory.as_ptr().wrapping_add(rx.next * rx.slot_size);
        let len = len as usize;
        // A compare, not a division: the ring's size is not a constant.
        rx.next = if rx.next + 1 == rx.slots {
            0
        } else {
            rx.next + 1
        };
        rx.owed += 1;
        self.deliver(peer, src, info, len, slot);
        if let Some(send_id) = ack {
            self.queue_control(peer, Wire::Fin { send_id }.encode());
        }
    }
}
