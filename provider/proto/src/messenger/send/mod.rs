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

use std::hash::Hash;

use unimem_dma::DmaEngine;
use unimem_mailbox::{Error as MailboxError, Mailbox};

use super::peers::{DataItem, Peer};
use super::{Messenger, PeerIdx, SendReq};
use crate::iov::{gather, total_len};
use crate::matching::IovList;
use crate::pool::Buffer;
use crate::wire::{inline_capacity, MatchInfo, Wire};
use crate::{PostError, WireNode};

/// Where the data of an eager send is: in its bounce buffer, on its way
/// into the peer's ring, or there (the announcement may leave).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum EagerState {
    Waiting,
    InFlight,
    Done,
}

/// How a send travels, and what it holds meanwhile.
pub(crate) enum TxKind {
    Inline,
    Eager {
        bounce: Buffer,
        state: EagerState,
    },
    /// `bounce` holds the data of an eager send that had to go this way.
    Rendezvous {
        iov: IovList,
        bounce: Option<Buffer>,
    },
}

/// A send in flight; its id in `tx_ops` is the `send_id` on the wire.
pub(crate) struct TxOp {
    pub(crate) peer: PeerIdx,
    pub(crate) context: usize,
    pub(crate) info: MatchInfo,
    pub(crate) len: usize,
    pub(crate) completion: bool,
    pub(crate) kind: TxKind,
}

/// What a DMA in flight is for, to act on its completion.
pub(crate) enum Waiter {
    Eager {
        op: usize,
    },
    Fragment {
        op: usize,
        fragment: u32,
        recv_id: u16,
        staging: Option<Buffer>,
    },
}

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode,
{
    /// Posts a send. Never blocks: out of resources, it says so.
    ///
    /// # Safety
    /// `req.iov` must stay valid until the send completes (until this call
    /// returns for an inject).
    pub unsafe fn send(&mut self, req: SendReq<M::Addr>) -> Result<(), PostError> {
        let len = total_len(&req.iov);
        if len > self.cfg.max_msg_size || (req.inject && len > self.cfg.eager_size) {
            return Err(PostError::TooLong);
        }
        if self.outstanding_sends >= self.cfg.tx_size {
            return Err(PostError::Again);
        }
        let peer = self.peer_index(&req.dest)?;
        if self.peers[peer].dead {
            return Err(PostError::Unreachable);
        }
        let inline = len <= inline_capacity(&req.info);
        if req.inject && !self.inject_ready(peer, inline) {
            return Err(PostError::Again);
        }
        if inline {
            return self.send_inline(peer, &req, len);
        }
        let kind = if len <= self.cfg.eager_size {
            let bounce = self.bounce_pool.get().ok_or(PostError::Again)?;
            // SAFETY: the iov is valid (caller); the bounce buffer holds a slot, at
            // least eager_size >= len bytes, of our own dmable memory.
            unsafe { gather(&req.iov, 0, self.bounce_pool.addr(bounce), len) };
            TxKind::Eager {
                bounce,
                state: EagerState::Waiting,
            }
        } else {
            TxKind::Rendezvous {
                iov: req.iov.clone(),
                bounce: None,
            }
        };
        let rendezvous = matches!(kind, TxKind::Rendezvous { .. });
        let op = self.tx_ops.insert(TxOp {
            peer,
            context: req.context,
            info: req.info,
            len,
            completion: req.completion && !req.inject,
            kind,
        });
        self.outstanding_sends += 1;
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

    /// An inject has no completion the application would wait for, so it
    /// may never call in again: it must leave within this call, or be
    /// refused. It can when nothing is queued ahead of it and, beyond the
    /// inline size, the peer's ring has a free slot (or the peer has no
    /// ring: then it goes by rendezvous, which needs the receiver anyway).
    pub(crate) fn inject_ready(&mut self, peer: PeerIdx, inline: bool) -> bool {
        let ready = |state: &Peer<M::Addr, M::Peer, D::Node>| {
            state.data.is_empty()
                && (inline
                    || match &state.tx {
                        Some(ring) => ring.credits > 0,
                        None => state.hello_received,
                    })
        };
        if !ready(&self.peers[peer]) {
            self.progress();
        }
        ready(&self.peers[peer])
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
                DataItem::Eager { op } => {
                    let tx = self.tx_ops.get(op).expect("queued op exists");
                    let (info, len) = (tx.info, tx.len);
                    let TxKind::Eager { state, .. } = tx.kind else {
                        unreachable!("eager item holds an eager op")
                    };
                    if state != EagerState::Done {
                        return true;
                    }
                    let credits = self.take_owed(peer);
                    let message = Wire::Eager {
                        info,
                        len: len as u32,
                        credits,
                    };
                    (message.encode(), Some(op), credits)
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
