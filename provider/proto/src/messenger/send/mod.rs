//! The send side: posting a send, choosing how it travels (inline, eager or
//! rendezvous, by size), and flushing each peer's outgoing queues into the
//! mailbox as far as it and the credits allow.
//!
//! Owns: `tx_ops` (sends in flight, addressed by `send_id`). The ways to
//! carry a message are its submodules; completions go through
//! [`completion`](super::completion).

pub(crate) mod eager;
pub(crate) mod inline;
pub(crate) mod rendezvous;

use unimem_mailbox::{Error as MailboxError, Mailbox};

use super::peers::{DataItem, KnownPeer};
use super::{Addr, Backend, Messenger, PeerIdx};
use crate::dma::Token;
use crate::iov::{gather, total_len};
use crate::matching::IovList;
use crate::pool::Buffer;
use crate::wire::{inline_capacity, MatchInfo, Wire, EAGER_SEQ_MOD, INLINE_MAX};
use crate::PostError;

/// Copies of sends up to this long come from spares of this size
/// ([`Messenger::take_copy`]): the small injects that wait for a credit.
const SPARE_COPY_LEN: usize = 256;
/// Most spare copies an endpoint keeps (16 KiB).
const SPARE_COPIES: usize = 64;

/// A copy whose data has left: kept in `spares` for
/// [`Messenger::take_copy`] if it is one of the small ones and fewer than
/// [`SPARE_COPIES`] wait. (A function of the spares alone: its callers
/// hold a peer.)
pub(crate) fn recycle_copy(spares: &mut Vec<Box<[u8]>>, bytes: Box<[u8]>) {
    if bytes.len() == SPARE_COPY_LEN && spares.len() < SPARE_COPIES {
        spares.push(bytes);
    }
}

/// A send request. The iov stays valid until the send's completion (or,
/// for an inject or a `copy` send, until the call returns).
#[derive(Clone, Debug)]
pub struct SendReq<A> {
    pub dest: A,
    pub iov: IovList,
    pub info: MatchInfo,
    pub context: usize,
    pub completion: bool,
    /// `fi_inject`: copied within the call, reported without a completion.
    pub inject: bool,
    /// `FI_INJECT`: the buffers may be reused once the call returns, so the
    /// data is copied within it (an inject implies it).
    pub copy: bool,
    /// `FI_MATCH_COMPLETE` or `FI_DELIVERY_COMPLETE`: the send completes
    /// only once the target has matched the message to a receive (its data
    /// in the receive buffer) or queued it as unexpected (its data copied
    /// into the target's memory). The target does both in one step, so
    /// one condition serves both levels. Ignored for an inject, which has
    /// no completion.
    ///
    /// Without it a send completes at `FI_TRANSMIT_COMPLETE`: an inline or
    /// eager one when its message is in the target's mailbox (and its data
    /// in the target's eager ring), which for a reliable endpoint is
    /// transmit complete (and inject complete: the buffer is free). A
    /// rendezvous send always completes on the target's `Fin`, sent once
    /// the data is in the matched receive buffer: every level.
    pub delivery_complete: bool,
}

/// Where the data of a send is until it leaves.
pub(crate) enum Payload {
    /// Still in the application's buffers, which stay valid until the send
    /// completes: an eager send is copied into a bounce buffer only when it
    /// can leave (it has a credit), so that a send waiting for a slow peer
    /// holds no bounce buffer.
    User(IovList),
    /// In one of our bounce buffers.
    Bounce(Buffer),
    /// The copy an inject (or an `FI_INJECT` send) made within its call
    /// when it could not leave at once: it waits in ordinary memory, not in
    /// a bounce buffer, and moves into one when it leaves.
    Copy(Box<[u8]>),
}

/// Where an eager send is: waiting for a credit (and a bounce buffer), on
/// its way into the peer's ring (the DMA's waiter holds the bounce buffer),
/// or there (the announcement may leave).
pub(crate) enum EagerState {
    Waiting(Payload),
    /// Its DMA is the one with this token: only that DMA's completion moves
    /// it on (a send id is reused once its send ends, and a DMA of an ended
    /// send may still complete).
    InFlight(Token),
    Done,
}

/// How a send travels, and what it holds meanwhile.
pub(crate) enum TxKind {
    Inline,
    Eager(EagerState),
    /// An eager send that had to go this way keeps its payload (a bounce
    /// buffer or a copy).
    Rendezvous(Payload),
}

/// What a send in `tx_ops` is for: a message, or the data of an RMA
/// operation that needs the target's help (its range is not dmable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxClass {
    Msg,
    /// Our write, granted by the target like a rendezvous; with CQ data
    /// for the target once it is done.
    Write {
        data: Option<u64>,
    },
    /// Our answer to a peer's read: the range goes to it like a
    /// rendezvous send, and ends without an event of ours (but the notice
    /// of an access to a key that counts them).
    ReadResponse {
        notice: Option<u64>,
    },
}

/// A send in flight; its id in `tx_ops` is the `send_id` on the wire.
pub(crate) struct TxOp {
    pub(crate) class: TxClass,
    pub(crate) peer: PeerIdx,
    pub(crate) context: usize,
    pub(crate) info: MatchInfo,
    pub(crate) len: usize,
    pub(crate) completion: bool,
    /// An eager send that completes on the target's `Fin`, not when its
    /// announcement leaves ([`SendReq::delivery_complete`]).
    pub(crate) ack: bool,
    pub(crate) kind: TxKind,
}

/// What a DMA in flight is for, to act on its completion.
pub(crate) enum Waiter {
    Eager {
        op: usize,
        /// The bounce buffer the DMA reads, given back when it completes.
        bounce: Buffer,
    },
    Fragment {
        op: usize,
        /// The peer that granted it, which the report goes to (the send may
        /// end, and its id be reused, before the DMA completes).
        peer: PeerIdx,
        fragment: u32,
        recv_id: u16,
        recv_gen: u16,
        staging: Option<Buffer>,
    },
    /// The read of rendezvous receive `id` (of generation `gen`) from its
    /// sender's offered buffer.
    Pull { id: usize, gen: u16 },
    /// A piece of a one-sided RMA operation: `len` bytes at `offset` of
    /// the operation, through `staging` when the local buffer is not
    /// dmable (a read scatters it out when the DMA completes).
    Rma {
        op: usize,
        offset: usize,
        len: usize,
        staging: Option<Buffer>,
    },
}

impl<B: Backend> Messenger<B> {
    /// Posts a send. Never blocks, and never waits for the peer: a send
    /// that cannot leave yet (no credit, a full mailbox, no bounce buffer,
    /// first contact not done) is queued, in order, and leaves from
    /// progress. Refused with [`PostError::Again`] only when `tx_size`
    /// sends are outstanding.
    ///
    /// # Safety
    /// `req.iov` must stay valid until the send completes (until this call
    /// returns for an inject or a `copy` send).
    pub unsafe fn send(&mut self, req: SendReq<Addr<B>>) -> Result<(), PostError> {
        let peer = self.peer_index(&req.dest)?;
        // SAFETY: forwarded (caller).
        unsafe { self.send_with(peer, req) }
    }

    /// [`Self::send`] to a peer found once before (its `dest` is not looked
    /// up again).
    ///
    /// # Safety
    /// As for [`Self::send`].
    #[inline]
    pub unsafe fn send_to(
        &mut self,
        peer: KnownPeer,
        req: SendReq<Addr<B>>,
    ) -> Result<(), PostError> {
        // SAFETY: forwarded (caller).
        unsafe { self.send_with(peer.0, req) }
    }

    /// The address of a peer found once before.
    pub fn addr_of(&self, peer: KnownPeer) -> Addr<B> {
        self.peers[peer.0].addr
    }

    #[inline(always)]
    unsafe fn send_with(&mut self, peer: PeerIdx, req: SendReq<Addr<B>>) -> Result<(), PostError> {
        let len = total_len(&req.iov);
        let copy = req.inject || req.copy;
        if len > self.cfg.max_msg_size || (copy && len > self.cfg.eager_size) {
            return Err(PostError::TooLong);
        }
        if self.outstanding_sends >= self.cfg.tx_size {
            return Err(PostError::Again);
        }
        if self.peers[peer].dead {
            return Err(PostError::Unreachable);
        }
        // A send waiting for the target's acknowledgement goes eager even
        // when it would fit inline: an inline message has no room for the
        // send id the target's `Fin` names.
        let ack = req.delivery_complete && !req.inject;
        // Longer than any inline message, and a slot our stores reach now
        // takes it (most small sends to a peer of this host): straight to
        // the eager path below, where the ways that follow would send it.
        let over_inline = len > INLINE_MAX;
        if ack || !over_inline || !self.stores_first(peer, len) {
            // An inline message goes as it is even to a receiver that
            // throttles us: its data costs the receiver no more than the
            // rendezvous announcement that would replace it, and it
            // completes in send order.
            let inline = inline_capacity(&req.info);
            if len <= inline && !ack {
                return self.send_inline(peer, &req, len);
            }
            // A little longer: in a few mailbox messages, rather than a DMA
            // and its announcement; but a slot our stores reach now takes
            // the data for less than the parts (one message, not up to
            // four; known not to when longer than an inline message).
            if len <= self.parted_after(inline)
                && !ack
                && (over_inline || !self.stores_first(peer, len))
            {
                return self.send_parted(peer, &req, len, inline);
            }
        }
        // The receiver holds too much of our unexpected data: messages
        // with data wait here, announced by rendezvous, until it matches
        // them (in order with the rest: the same queue).
        let throttled = self.peers[peer].throttled && len > 0;
        // The peer's eager slots may be smaller than ours (first contact);
        // a throttled message waits here for the receiver.
        let by_rendezvous = len > self.peers[peer].eager_limit || throttled;
        // Injected or not, a send whose data goes into its slot within the
        // call has its buffer free and is as complete as a later flush
        // would make it: no bounce buffer, no DMA.
        // SAFETY: the iov is valid during this call (caller).
        let stored = !by_rendezvous && unsafe { self.store_now(peer, &req.iov, len) };
        if stored && !ack && self.peers[peer].control.is_empty() {
            // Nothing ahead of it: the announcement goes at once, as an
            // inline message does, with no operation to track.
            let message = self.eager_announcement(peer, &req.info, len);
            return self.send_message(peer, &req, len, &message);
        }
        let kind = if by_rendezvous {
            TxKind::Rendezvous(if copy {
                // Memory of its own: a rendezvous may wait long for the
                // receiver, too long to hold a bounce buffer.
                let mut bytes = self.take_copy(len);
                // SAFETY: the iov is valid during this call (caller); the
                // copy holds at least len bytes.
                unsafe { gather(&req.iov, 0, bytes.as_mut_ptr(), len) };
                Payload::Copy(bytes)
            } else {
                Payload::User(req.iov)
            })
        } else if stored {
            TxKind::Eager(EagerState::Done)
        } else if copy {
            // SAFETY: the iov is valid during this call (caller).
            let payload = unsafe { self.copy_payload(peer, &req.iov, len) };
            TxKind::Eager(EagerState::Waiting(payload))
        } else {
            TxKind::Eager(EagerState::Waiting(Payload::User(req.iov)))
        };
        let rendezvous = matches!(kind, TxKind::Rendezvous(_));
        let op = self.tx_ops.insert(TxOp {
            class: TxClass::Msg,
            peer,
            context: req.context,
            info: req.info,
            len,
            completion: req.completion && !req.inject,
            ack,
            kind,
        });
        self.outstanding_sends += 1;
        if rendezvous && len > u32::MAX as usize {
            self.peers[peer].data.push_back(DataItem::LenHigh { op });
        }
        if let Some((addr, token)) = rendezvous.then(|| self.offer(op)).flatten() {
            self.peers[peer]
                .data
                .push_back(DataItem::Offer { op, addr, token });
        }
        self.peers[peer].data.push_back(if rendezvous {
            DataItem::Rts { op }
        } else {
            DataItem::Eager { op }
        });
        self.mark_active(peer);
        self.flush_peer(peer);
        if req.inject {
            self.push_out_eager(peer, op);
        }
        Ok(())
    }

    /// What rendezvous send `op` offers the receiver to read: its buffer
    /// (address, grant token) when it is the user's, contiguous and dmable.
    /// (A receiver on another host, whose loads do not reach it, grants.)
    fn offer(&self, op: usize) -> Option<(u64, u16)> {
        let tx = self.tx_ops.get(op)?;
        let TxKind::Rendezvous(Payload::User(iov)) = &tx.kind else {
            return None;
        };
        let &[(addr, len)] = &iov[..] else {
            return None;
        };
        let token = self.dma.grant_token(addr as *const u8, len)?;
        (len == tx.len).then_some((addr as u64, token))
    }

    /// The copy of an inject's data, made within its call: into a bounce
    /// buffer when the message can leave at once (nothing queued ahead of
    /// it and a credit to spend: the common case, which allocates
    /// nothing), else into memory of its own, so that a send waiting for a
    /// slow peer holds no bounce buffer.
    ///
    /// # Safety
    /// `iov` must hold `len` readable bytes, `len` <= `eager_size`.
    unsafe fn copy_payload(&mut self, peer: PeerIdx, iov: &IovList, len: usize) -> Payload {
        let state = &self.peers[peer];
        let leaves = state.data.is_empty() && state.tx.as_ref().is_some_and(|r| r.credits > 0);
        if leaves {
            if let Some(bounce) = self.bounce_pool.get() {
                // SAFETY: the iov holds len bytes (caller); the bounce buffer
                // holds a slot, at least eager_size >= len bytes.
                unsafe { gather(iov, 0, self.bounce_pool.addr(bounce), len) };
                return Payload::Bounce(bounce);
            }
        }
        let mut bytes = self.take_copy(len);
        // SAFETY: as above; `bytes` holds at least len bytes.
        unsafe { gather(iov, 0, bytes.as_mut_ptr(), len) };
        Payload::Copy(bytes)
    }

    /// Memory for the copy of a send of `len` bytes: a spare one for a
    /// small send (its first `len` bytes are the message: every reader
    /// takes the send's length, not the copy's), else its own.
    fn take_copy(&mut self, len: usize) -> Box<[u8]> {
        if len > SPARE_COPY_LEN {
            return vec![0u8; len].into_boxed_slice();
        }
        self.spare_copies
            .pop()
            .unwrap_or_else(|| vec![0u8; SPARE_COPY_LEN].into_boxed_slice())
    }

    /// `peer` says our send `op` is delivered: a rendezvous send (or the
    /// answer to its read) whose data it has, or an acknowledged eager send
    /// whose message left. Anything else is not its to complete.
    pub(crate) fn on_fin(&mut self, peer: PeerIdx, op: usize) {
        let fits = self.tx_ops.get(op).is_some_and(|tx| {
            tx.peer == peer
                && match &tx.kind {
                    TxKind::Rendezvous(_) => true,
                    TxKind::Eager(EagerState::Done) => tx.ack,
                    _ => false,
                }
                // Its request (or acknowledged message) has left.
                && !self.peers[peer].data.iter().any(|item| match *item {
                    DataItem::Eager { op: queued }
                    | DataItem::Rts { op: queued }
                    | DataItem::LenHigh { op: queued }
                    | DataItem::Offer { op: queued, .. }
                    | DataItem::RmaWrite { op: queued, .. } => queued == op,
                    DataItem::Inline { .. } | DataItem::Part { .. } => false,
                })
        });
        if fits {
            self.complete_send(op);
        } else {
            self.drop_invalid(peer, "FIN for none of our sends to it");
        }
    }

    /// Sends what `peer`'s queues hold, as far as the mailbox and credits
    /// allow. Returns whether anything is left.
    pub(crate) fn flush_peer(&mut self, peer: PeerIdx) -> bool {
        if self.peers[peer].route.is_none() {
            return false;
        }
        // Control first: it frees resources the data may be waiting for.
        while let Some(message) = self.peers[peer].control.front() {
            let route = self.peers[peer].route.as_ref().expect("checked above");
            match self.mbx.send(route, message) {
                Ok(()) => {
                    self.peers[peer].control.pop_front();
                }
                Err(MailboxError::Busy) => return true,
                Err(_) => {
                    self.fail_peer(peer);
                    return false;
                }
            }
        }
        if !self.start_eager_dma(peer) {
            self.reap_dma();
        }
        while let Some(item) = self.peers[peer].data.front() {
            let (message, op, piggyback) = match *item {
                DataItem::Inline { message, op } => (message, Some(op), 0),
                DataItem::Part { message } => (message, None, 0),
                DataItem::Eager { op } => {
                    let tx = self.tx_ops.get(op).expect("queued op exists");
                    let (info, len, ack) = (tx.info, tx.len, tx.ack);
                    let TxKind::Eager(ref state) = tx.kind else {
                        unreachable!("eager item holds an eager op")
                    };
                    if !matches!(state, EagerState::Done) {
                        return true;
                    }
                    let credits = self.take_owed(peer);
                    let seq = self.peers[peer].tx.as_ref().map_or(0, |ring| ring.seq);
                    let message = Wire::encode_eager(
                        &info,
                        len as u32,
                        seq,
                        credits,
                        ack.then_some(op as u16),
                    );
                    // Acknowledged: it stays in `tx_ops` (holding nothing:
                    // its bounce buffer went back when its DMA completed)
                    // until the target's `Fin`, or fails with the peer.
                    (message, (!ack).then_some(op), credits)
                }
                DataItem::LenHigh { op } => {
                    let len = self.tx_ops.get(op).expect("queued op exists").len;
                    let message = Wire::LenHigh {
                        id: op as u16,
                        read: false,
                        high: (len as u64 >> 32) as u32,
                    };
                    (message.encode(), None, 0)
                }
                DataItem::Offer { op, addr, token } => {
                    let message = Wire::Offer {
                        send_id: op as u16,
                        token,
                        addr,
                    };
                    (message.encode(), None, 0)
                }
                DataItem::RmaWrite { op, key, addr } => {
                    let len = self.tx_ops.get(op).expect("queued op exists").len;
                    let message = Wire::RmaWrite {
                        key,
                        addr,
                        len: len as u32,
                        send_id: op as u16,
                    };
                    (message.encode(), None, 0)
                }
                DataItem::Rts { op } => {
                    let tx = self.tx_ops.get(op).expect("queued op exists");
                    let (info, len) = (tx.info, tx.len);
                    let credits = self.take_owed(peer);
                    let message = Wire::Rts {
                        info,
                        send_id: op as u16,
                        len: len as u32,
                        credits,
                    };
                    (message.encode(), None, credits)
                }
            };
            let route = self.peers[peer].route.as_ref().expect("checked above");
            match self.mbx.send(route, &message) {
                Ok(()) => {
                    let item = self.peers[peer].data.pop_front();
                    if let Some(DataItem::Eager { .. }) = item {
                        if let Some(ring) = self.peers[peer].tx.as_mut() {
                            ring.seq = (ring.seq + 1) % EAGER_SEQ_MOD;
                        }
                    }
                    if let (Some(op), Some(DataItem::Inline { .. } | DataItem::Eager { .. })) =
                        (op, item)
                    {
                        self.complete_send(op);
                    }
                }
                Err(MailboxError::Busy) => {
                    if let Some(rx) = self.peers[peer].rx.as_mut() {
                        rx.owed += piggyback as usize;
                    }
                    return true;
                }
                Err(_) => {
                    self.fail_peer(peer);
                    return false;
                }
            }
        }
        false
    }
}
