//! The peer table: first contact (our Hello, with the eager ring we set
//! aside for the peer, and theirs), lookup by address, and the two outgoing
//! queues of each peer (control, and data in send order).
//!
//! Owns: `peers`, `by_addr`, `last_peer`, `active`, and the records of
//! each peer's eager rings ([`TxRing`], [`RxRing`]), which the eager send
//! side, the ring consumer and the credits move through. Touches the DMA handle
//! only to set up eager rings (allocation, and registration of the peer's).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use unimem_dma::{DmaBuf, RegId};
use unimem_mailbox::shm::rate_limited;
use unimem_mailbox::{Error as MailboxError, Mailbox, Message};

use super::{post_error, Addr, Backend, Messenger, Node, PeerIdx, Route};
use crate::wire::{Wire, ID_BITS, MAX_EAGER_LEN, NODE_LEN, PROTOCOL_VERSION};
use crate::{PostError, WireNode};

/// What waits in a peer's data queue, in send order.
pub(crate) enum DataItem {
    /// An encoded inline message; `op` completes when it leaves.
    Inline {
        message: Message,
        op: usize,
    },
    /// A part of an inline message sent in parts, but its last (which is
    /// an `Inline`, with the op).
    Part {
        message: Message,
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
    /// The offer of send `op`'s buffer (at `addr`, granted with `token`),
    /// just before its `Rts`.
    Offer {
        op: usize,
        addr: u64,
        token: u16,
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
    /// Sequence number of our next eager announcement to the peer.
    pub(crate) seq: u8,
    /// Our loads and stores reach the ring (a node of this host): eager
    /// data is stored into its slots, not put by DMA (`send/eager.rs`).
    pub(crate) stores: bool,
    /// The ring's registration as resolved, for those stores: checked at
    /// each, without the DMA lock or a lookup; gone once it refuses one
    /// (the engine's way then says why).
    pub(crate) lease: Option<unimem_dma::RegLease>,
}

impl TxRing {
    /// The peer's address of our next slot.
    pub(crate) fn next_slot(&self) -> u64 {
        self.base + (self.next * self.slot_size) as u64
    }

    /// That slot is filled: its credit is spent.
    pub(crate) fn spend(&mut self) {
        self.credits -= 1;
        // Not a modulo: a division on every eager message.
        self.next += 1;
        if self.next == self.slots {
            self.next = 0;
        }
    }
}

/// The eager ring we set aside for a peer.
pub(crate) struct RxRing {
    pub(crate) memory: DmaBuf,
    pub(crate) slot_size: usize,
    pub(crate) slots: usize,
    pub(crate) next: usize,
    /// Slots consumed and not yet handed back.
    pub(crate) owed: usize,
    /// Sequence number of the next eager announcement we expect.
    pub(crate) seq: u8,
}

/// The key the direct path used last with a peer, as resolved (a lease
/// whose slot is one load to check again), and the registration it used
/// (`rma::direct`), leased too where the engine leases registrations (an
/// access then checks what the engine checks, without the engine or the
/// domain's DMA lock).
pub(crate) struct Lane {
    pub(crate) lease: unimem_dma::KeyLease,
    pub(crate) reg: unimem_dma::RegId,
    pub(crate) mapped: Option<unimem_dma::RegLease>,
    /// The engine's atomic unit reaches the peer's memory.
    pub(crate) atomics: bool,
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
    /// Its parameters arrived (the first message of a peer).
    pub(crate) params_received: bool,
    /// Longest message we send it eagerly: our eager size, or its own if
    /// smaller (its slots are that size).
    pub(crate) eager_limit: usize,
    /// Fragment size of rendezvous transfers with it, both ways: the
    /// smaller of ours and its own, so that both sides' staging buffers
    /// hold one.
    pub(crate) fragment_size: usize,
    /// Refused at first contact (parameters we cannot work with), fenced
    /// for repeated invalid messages, or failed (found dead, or a transfer
    /// to it failed): dead to us, and its messages are dropped.
    pub(crate) refused: bool,
    /// Its messages dropped as invalid so far.
    pub(crate) violations: u32,
    pub(crate) control: VecDeque<Message>,
    pub(crate) data: VecDeque<DataItem>,
    /// In the messenger's list of peers with queued work.
    pub(crate) active: bool,
    pub(crate) dead: bool,
    /// Ids its rendezvous transfers to us hold (`recv::rendezvous`).
    pub(crate) rx_ids: usize,
    /// Its reads we are answering: places of our transmit queue they
    /// hold (`rma::target`).
    pub(crate) reads_served: usize,
    /// Our writes to it handed to its progress (the rendezvous), not yet
    /// finished: an atomic waits for them (`rma::atomic`).
    pub(crate) writes_assisted: usize,
    /// Our staging buffers its fragments were granted, not yet reported
    /// (`recv::rendezvous`).
    pub(crate) staging_held: usize,
    /// Its atomics on our memory still waiting for their operands
    /// (`rma::atomic`).
    pub(crate) atomics_pending: usize,
    /// Bytes of its unexpected messages we hold (see `unexpected_limit`).
    pub(crate) unexpected_held: usize,
    /// We asked it to throttle (our `Throttle { on: true }` is the latest).
    pub(crate) throttling: bool,
    /// It asked us to throttle: our messages to it go by rendezvous.
    pub(crate) throttled: bool,
    /// The buffer its next `Rts` offers (send id, address, token), from
    /// the `Offer` just before it.
    pub(crate) offer: Option<(u16, u64, u16)>,
    /// The high 32 bits of the length of its next transfer (read or not,
    /// id, high bits), from the `LenHigh` just before its start.
    pub(crate) long_len: Option<(bool, u16, u32)>,
    /// Its message in parts we are putting together (`recv::parted`).
    pub(crate) parted: Option<super::recv::parted::Parted>,
    /// The direct path's last key and registration with it (`rma::direct`).
    pub(crate) lane: Option<Lane>,
}

/// A peer the messenger knows, found once by [`Messenger::known_peer_of`]:
/// its holder may keep it for later sends to it and receives from it on
/// the same messenger (peers are never removed), and on no other (it is an
/// index into that messenger's peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownPeer(pub(crate) PeerIdx);

impl<B: Backend> Messenger<B> {
    /// The peer behind `addr`, for sends ([`Self::send_to`]) and directed
    /// receives ([`Self::post_recv_from`]); None while we have never heard
    /// of it (the address's way then looks it up, or connects). Peers are
    /// never removed: the answer holds for the messenger's life.
    pub fn known_peer_of(&mut self, addr: &Addr<B>) -> Option<KnownPeer> {
        self.known_peer(addr).map(KnownPeer)
    }

    /// A known peer's index. Peers are never removed, so the cached last
    /// lookup stays right.
    #[inline]
    pub(crate) fn known_peer(&mut self, addr: &Addr<B>) -> Option<PeerIdx> {
        if let Some((last, index)) = self.last_peer {
            if last == *addr {
                return Some(index);
            }
        }
        self.look_up_peer(addr)
    }

    /// [`Self::known_peer`] past the last peer: the map, out of line.
    #[inline(never)]
    fn look_up_peer(&mut self, addr: &Addr<B>) -> Option<PeerIdx> {
        let index = *self.by_addr.get(addr)?;
        self.last_peer = Some((*addr, index));
        Some(index)
    }

    #[inline]
    pub(crate) fn peer_index(&mut self, addr: &Addr<B>) -> Result<PeerIdx, PostError> {
        if let Some((last, index)) = self.last_peer {
            if last == *addr {
                return Ok(index);
            }
        }
        self.new_peer_index(addr)
    }

    /// [`Self::peer_index`] past the last peer: out of line.
    #[inline(never)]
    fn new_peer_index(&mut self, addr: &Addr<B>) -> Result<PeerIdx, PostError> {
        if let Some(index) = self.look_up_peer(addr) {
            return Ok(index);
        }
        // The address was well formed (the AV took it): no endpoint behind
        // it (closed, or its process gone) is unreachable, not invalid.
        let route = self.mbx.connect(addr).map_err(|e| match e {
            MailboxError::Invalid => PostError::Unreachable,
            e => post_error(e),
        })?;
        Ok(self.add_peer(*addr, Some(route)))
    }

    /// A peer we have not heard of yet, looked up because a receive is
    /// directed at it: reachable, it is added (and greeted); gone (no
    /// endpoint behind the address, or its process dead), it is added
    /// dead. When the lookup itself fails (out of file descriptors, say),
    /// nothing is known: `None`, and it is not taken for dead.
    pub(crate) fn watch_peer(&mut self, addr: Addr<B>) -> Option<PeerIdx> {
        match self.mbx.connect(&addr) {
            Ok(route) => Some(self.add_peer(addr, Some(route))),
            Err(MailboxError::Dead | MailboxError::Invalid) => Some(self.add_peer(addr, None)),
            Err(e) => {
                tracing::debug!(%addr, "cannot look up the source of a directed receive: {e}");
                None
            }
        }
    }

    /// The peer a message came from, known or not. If it cannot be reached
    /// back, its messages are still delivered.
    #[inline(always)]
    pub(crate) fn peer_for_source(&mut self, src: &Addr<B>) -> PeerIdx {
        match self.known_peer(src) {
            Some(index) => index,
            None => self.new_source(src),
        }
    }

    /// [`Self::peer_for_source`] for a sender never heard of: out of line.
    #[inline(never)]
    fn new_source(&mut self, src: &Addr<B>) -> PeerIdx {
        let route = match self.mbx.connect(src) {
            Ok(route) => Some(route),
            Err(e) => {
                // Any process can send from an address it then closes.
                static LAST: AtomicU64 = AtomicU64::new(0);
                rate_limited(
                    &LAST,
                    || tracing::warn!(%src, "cannot reach back to a sender: {e}"),
                );
                None
            }
        };
        self.add_peer(*src, route)
    }

    pub(crate) fn add_peer(&mut self, addr: Addr<B>, route: Option<Route<B>>) -> PeerIdx {
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
            params_received: false,
            eager_limit: self.cfg.eager_size,
            fragment_size: self.cfg.fragment_size,
            refused: false,
            violations: 0,
            control: VecDeque::new(),
            data: VecDeque::new(),
            active: false,
            dead,
            rx_ids: 0,
            reads_served: 0,
            writes_assisted: 0,
            staging_held: 0,
            atomics_pending: 0,
            unexpected_held: 0,
            throttling: false,
            throttled: false,
            offer: None,
            long_len: None,
            parted: None,
            lane: None,
        });
        self.by_addr.insert(addr, index);
        if !dead {
            // Someone who can send to us again.
            self.alone = false;
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
                seq: 0,
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
        let params = Wire::Params {
            version: PROTOCOL_VERSION,
            id_bits: ID_BITS,
            fragment_size: self.cfg.fragment_size as u32,
            eager_size: self.cfg.eager_size as u32,
        };
        let state = &mut self.peers[peer];
        state.rx = rx;
        state.hello_sent = true;
        self.queue_control(peer, params.encode());
        self.queue_control(peer, hello.encode());
    }

    /// A peer's first message: its protocol version and the parameters the
    /// wire depends on. Sizes are adapted to (the smaller of both sides'
    /// fragment and eager sizes is used with this peer); another version or
    /// id width refuses the peer.
    pub(crate) fn on_params(
        &mut self,
        peer: PeerIdx,
        version: u16,
        id_bits: u8,
        fragment_size: u32,
        eager_size: u32,
    ) {
        if self.peers[peer].params_received {
            self.drop_invalid(peer, "second first contact (parameters)");
            return;
        }
        if version != PROTOCOL_VERSION {
            let ours = PROTOCOL_VERSION;
            return self.refuse_peer(peer, "protocol version", ours.into(), version.into());
        }
        if id_bits != ID_BITS {
            return self.refuse_peer(peer, "id width (bits)", ID_BITS.into(), id_bits.into());
        }
        let (theirs_fragment, theirs_eager) = (fragment_size as usize, eager_size as usize);
        if theirs_fragment < 4096 || theirs_eager == 0 || theirs_eager > MAX_EAGER_LEN {
            let what = "fragment size (eager size)";
            return self.refuse_peer(
                peer,
                what,
                self.cfg.fragment_size as u64,
                fragment_size.into(),
            );
        }
        let state = &mut self.peers[peer];
        state.params_received = true;
        state.fragment_size = self.cfg.fragment_size.min(theirs_fragment);
        state.eager_limit = self.cfg.eager_size.min(theirs_eager);
        if theirs_fragment != self.cfg.fragment_size || theirs_eager != self.cfg.eager_size {
            tracing::info!(
                addr = %state.addr,
                fragment = state.fragment_size,
                eager = state.eager_limit,
                "peer has other sizes (fragment {theirs_fragment}, eager {theirs_eager}; ours {}, {}): using the smaller",
                self.cfg.fragment_size,
                self.cfg.eager_size
            );
        }
        // Eager sends queued for it before it spoke that its slots cannot
        // hold go by rendezvous.
        let limit = state.eager_limit;
        self.eager_by_rendezvous(peer, limit);
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
        if self.peers[peer].hello_received {
            self.drop_invalid(peer, "second hello");
            return;
        }
        if !self.peers[peer].params_received {
            // A peer of version 1 says hello first, without parameters.
            return self.refuse_peer(peer, "protocol version", PROTOCOL_VERSION.into(), 1);
        }
        let Some(node) = <Node<B>>::from_hello(node, &self.peers[peer].addr) else {
            self.drop_invalid(peer, "hello naming another process's node");
            return;
        };
        // Its slots hold what it sends eagerly at most: smaller ones, or a
        // ring past the address space, are not a ring.
        let limit = self.peers[peer].eager_limit;
        let slot_size = 1usize.checked_shl(u32::from(slot_shift)).unwrap_or(0);
        let ring_len = slot_size.checked_mul(slots as usize).unwrap_or(0);
        let ring_fits = slot_size >= limit && ring.checked_add(ring_len as u64).is_some();
        if slots > 0 && !ring_fits {
            let what = "eager slot size";
            return self.refuse_peer(peer, what, self.slot_size as u64, slot_size as u64);
        }
        self.peers[peer].node = Some(node);
        self.peers[peer].hello_received = true;
        if self.peers[peer].tx.is_none() && ring_len > 0 {
            match self.dma.register(node, ring, ring_len) {
                Ok(reg) => {
                    let lease = self.dma.lease_registration(reg);
                    self.peers[peer].tx = Some(TxRing {
                        reg,
                        base: ring,
                        slot_size,
                        slots: slots as usize,
                        next: 0,
                        credits: slots as usize,
                        seq: 0,
                        stores: true,
                        lease,
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
