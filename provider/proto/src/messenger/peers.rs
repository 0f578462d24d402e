//! The peer table: first contact (our Hello, with the eager ring we set
//! aside for the peer, and theirs), lookup by address, and the two outgoing
//! queues of each peer (control, and data in send order).
//!
//! Owns: `peers`, `by_addr`, `last_peer`, `active`, and the records of
//! each peer's eager rings ([`TxRing`], [`RxRing`]), which the eager send
//! side, the ring consumer and the credits move through. Touches the DMA handle
//! only to set up eager rings (allocation, and registration of the peer's).

use std::collections::VecDeque;
use std::hash::Hash;

use unimem_dma::{DmaBuf, DmaEngine, RegId};
use unimem_mailbox::{Mailbox, Message};

use super::{post_error, Messenger, PeerIdx};
use crate::wire::{Wire, NODE_LEN};
use crate::{PostError, WireNode};

/// What waits in a peer's data queue, in send order.
pub(crate) enum DataItem {
    /// An encoded inline message; `op` completes when it leaves.
    Inline {
        message: Message,
        op: usize,
    },
    Eager {
        op: usize,
    },
    Rts {
        op: usize,
    },
    /// The high bits of the length of send `op`, 4 GiB or more, just before
    /// its `Rts` or `RmaWrite`.
    LenHigh {
        op: usize,
    },
    /// An RMA write the target must grant: `addr` is the target's own
    /// address, `key` what it checks it against.
    RmaWrite {
        op: usize,
        key: u64,
        addr: u64,
    },
}

/// The eager ring a peer set aside for us, and our place in it.
pub(crate) struct TxRing {
    pub(crate) reg: RegId,
    pub(crate) base: u64,
    pub(crate) slot_size: usize,
    pub(crate) slots: usize,
    pub(crate) next: usize,
    pub(crate) credits: usize,
}

/// The eager ring we set aside for a peer.
pub(crate) struct RxRing {
    pub(crate) memory: DmaBuf,
    pub(crate) slot_size: usize,
    pub(crate) slots: usize,
    pub(crate) next: usize,
    /// Slots consumed and not yet handed back.
    pub(crate) owed: usize,
}

/// A peer: its address and route (mailbox), node (DMA), eager rings and
/// outgoing queues.
pub(crate) struct Peer<A, R, N> {
    pub(crate) addr: A,
    pub(crate) route: Option<R>,
    pub(crate) node: Option<N>,
    pub(crate) tx: Option<TxRing>,
    pub(crate) rx: Option<RxRing>,
    pub(crate) hello_sent: bool,
    /// Its hello arrived: we know its node, and whether it has a ring for us.
    pub(crate) hello_received: bool,
    pub(crate) control: VecDeque<Message>,
    pub(crate) data: VecDeque<DataItem>,
    /// In the messenger's list of peers with queued work.
    pub(crate) active: bool,
    pub(crate) dead: bool,
    /// Bytes of its unexpected messages we hold (see `unexpected_limit`).
    pub(crate) unexpected_held: usize,
    /// We asked it to throttle (our `Throttle { on: true }` is the latest).
    pub(crate) throttling: bool,
    /// It asked us to throttle: our messages to it go by rendezvous.
    pub(crate) throttled: bool,
}

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode,
{
    /// A known peer's index. Peers are never removed, so the cached last
    /// lookup stays right.
    pub(crate) fn known_peer(&mut self, addr: &M::Addr) -> Option<PeerIdx> {
        if let Some((last, index)) = self.last_peer {
            if last == *addr {
                return Some(index);
            }
        }
        let index = *self.by_addr.get(addr)?;
        self.last_peer = Some((*addr, index));
        Some(index)
    }

    pub(crate) fn peer_index(&mut self, addr: &M::Addr) -> Result<PeerIdx, PostError> {
        if let Some(index) = self.known_peer(addr) {
            return Ok(index);
        }
        let route = self.mbx.connect(addr).map_err(post_error)?;
        Ok(self.add_peer(*addr, Some(route)))
    }

    /// The peer a message came from, known or not. If it cannot be reached
    /// back, its messages are still delivered.
    pub(crate) fn peer_for_source(&mut self, src: &M::Addr) -> PeerIdx {
        if let Some(index) = self.known_peer(src) {
            return index;
        }
        let route = match self.mbx.connect(src) {
            Ok(route) => Some(route),
            Err(e) => {
                tracing::warn!(%src, "cannot reach back to a sender: {e}");
                None
            }
        };
        self.add_peer(*src, route)
    }

    pub(crate) fn add_peer(&mut self, addr: M::Addr, route: Option<M::Peer>) -> PeerIdx {
        let index = self.peers.len();
        let dead = route.is_none();
        self.peers.push(Peer {
            addr,
            route,
            node: None,
            tx: None,
            rx: None,
            hello_sent: false,
            hello_received: false,
            control: VecDeque::new(),
            data: VecDeque::new(),
            active: false,
            dead,
            unexpected_held: 0,
            throttling: false,
            throttled: false,
        });
        self.by_addr.insert(addr, index);
        if !dead {
            self.send_hello(index);
        }
        tracing::debug!(%addr, index, "new peer");
        index
    }

    /// Sets aside our eager ring for `peer` and tells it where it is.
    pub(crate) fn send_hello(&mut self, peer: PeerIdx) {
        if self.peers[peer].hello_sent {
            return;
        }
        let slots = self.cfg.eager_credits.min(u8::MAX as usize);
        // Without a ring (none configured, or no memory for one) the hello
        // still goes out, offering no slots: the peer needs our node for
        // rendezvous, and learns to send its eager messages that way.
        let rx = match self.dma.alloc(self.slot_size * slots) {
            _ if slots == 0 => None,
            Ok(memory) => Some(RxRing {
                memory,
                slot_size: self.slot_size,
                slots,
                next: 0,
                owed: 0,
            }),
            Err(e) => {
                tracing::warn!("no dmable memory for a peer's eager ring: {e}; its eager messages will come by rendezvous");
                None
            }
        };
        let hello = Wire::Hello {
            node: self.dma.local_node().to_wire(),
            ring: rx.as_ref().map_or(0, |rx| rx.memory.remote_addr()),
            slot_shift: self.slot_size.trailing_zeros() as u8,
            slots: rx.as_ref().map_or(0, |rx| rx.slots as u16),
        };
        let state = &mut self.peers[peer];
        state.rx = rx;
        state.hello_sent = true;
        self.queue_control(peer, hello.encode());
    }

    pub(crate) fn queue_control(&mut self, peer: PeerIdx, message: Message) {
        self.peers[peer].control.push_back(message);
        self.mark_active(peer);
    }

    pub(crate) fn mark_active(&mut self, peer: PeerIdx) {
        if !self.peers[peer].active {
            self.peers[peer].active = true;
            self.active.push(peer);
        }
    }

    pub(crate) fn on_hello(
        &mut self,
        peer: PeerIdx,
        node: &[u8; NODE_LEN],
        ring: u64,
        slot_shift: u8,
        slots: u16,
    ) {
        let node = D::Node::from_wire(node);
        let slot_size = 1usize.checked_shl(u32::from(slot_shift)).unwrap_or(0);
        self.peers[peer].node = Some(node);
        self.peers[peer].hello_received = true;
        if self.peers[peer].tx.is_none() && slot_size > 0 && slots > 0 {
            match self.dma.register(node, ring, slot_size * slots as usize) {
                Ok(reg) => {
                    self.peers[peer].tx = Some(TxRing {
                        reg,
                        base: ring,
                        slot_size,
                        slots: slots as usize,
                        next: 0,
                        credits: slots as usize,
                    })
                }
                Err(e) => {
                    tracing::warn!(%node, "cannot register a peer's eager ring: {e}; eager messages to it go by rendezvous")
                }
            }
        }
        self.send_hello(peer);
        self.mark_active(peer);
    }
}
