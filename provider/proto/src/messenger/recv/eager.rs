//! The eager ring consumer: each eager message's data sits in the next slot
//! of the ring we set aside for its sender; it is delivered from there, and
//! the slot is owed back as a credit.
//!
//! Moves through [`RxRing`](super::super::peers::RxRing) (the ring's memory
//! and our place in it).

use std::hash::Hash;

use unimem_dma::DmaEngine;
use unimem_mailbox::Mailbox;

use super::super::{Messenger, PeerIdx};
use crate::wire::{MatchInfo, Wire};
use crate::WireNode;

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode,
{
    /// An eager message from `peer`: its `len` bytes are in the next slot.
    /// With `ack`, its sender waits for a `Fin` naming that send id: it is
    /// sent once the message is delivered into a posted receive or copied
    /// out of the slot as an unexpected message (both within `deliver`),
    /// which is match and delivery complete.
    pub(crate) fn on_eager(
        &mut self,
        peer: PeerIdx,
        src: M::Addr,
        info: MatchInfo,
        len: u32,
        ack: Option<u16>,
    ) {
        let Some(rx) = self.peers[peer].rx.as_mut() else {
            tracing::warn!(%src, "eager message from a peer without our ring; dropped");
            return;
        };
        let slot = rx.memory.as_ptr().wrapping_add(rx.next * rx.slot_size);
        let len = (len as usize).min(rx.slot_size);
        rx.next = (rx.next + 1) % rx.slots;
        rx.owed += 1;
        self.deliver(peer, src, info, len, slot);
        if let Some(send_id) = ack {
            self.queue_control(peer, Wire::Fin { send_id }.encode());
        }
    }
}
