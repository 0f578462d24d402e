//! The target's side of RMA to its memory that is not dmable, and the
//! initiator's: the hand-over of such an operation to the rendezvous
//! (`assist_rma`) and its handling of the target's answers.
//!
//! Every request is checked against our own key table before we act on
//! it, as a peer's message is untrusted: the key must exist, grant the
//! access, and cover the whole range. A refused one is answered with an
//! `RmaNack` and moves no byte. A write is then a rendezvous receive into
//! the range (its purpose `RmaWrite`: it ends without a receive
//! completion); a read a rendezvous send of the range (class
//! `ReadResponse`: it ends without a send completion). A read's answer
//! takes a place in our transmit queue (its send id), and one peer's
//! reads a quarter of it at most: while the queue (or the peer's share) is
//! full, reads wait in `deferred_reads`, each peer's in arrival order, and
//! progress serves them as places free up (checked again then: the region
//! may be gone).
//!
//! Owns: `deferred_reads`. Touches `tx_ops`, `rx_xfers` and the events,
//! through the rendezvous' own methods.

use std::collections::HashMap;

use unimem_dma::{Access, DmaError};

use super::super::peers::DataItem;
use super::super::recv::rendezvous::{RxXfer, XferPurpose, NO_SEND_ID};
use super::super::send::{Payload, TxClass, TxKind, TxOp};
use super::super::{Addr, Backend, Messenger, PeerIdx};
use crate::matching::{IovList, Placement};
use crate::wire::{MatchInfo, RmaRefusal, Wire};
use crate::{AccessCounts, ErrorKind, Event, RmaKind};

/// A peer's read waiting for a place in our transmit queue.
pub(crate) struct DeferredRead {
    peer: PeerIdx,
    key: u64,
    addr: u64,
    len: u64,
    recv_id: u16,
}

impl<B: Backend> Messenger<B> {
    /// Checks a peer's request for `[addr, addr + len)` of our key `key`;
    /// whether the key counts such an access (`Access::counts`).
    pub(crate) fn check_own_range(
        &mut self,
        key: u64,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<bool, RmaRefusal> {
        let node = self.dma.local_node();
        let exposure = self
            .dma
            .lock()
            .resolve_key(node, key)
            .map_err(|e| match e {
                DmaError::NoSuchKey => RmaRefusal::NoKey,
                _ => RmaRefusal::Denied,
            })?;
        // The initiator sends our own address, whatever the key's mode.
        exposure
            .check(addr, len, need)
            .map_err(|_| RmaRefusal::Denied)?;
        Ok(exposure.access.counts(need))
    }

    /// A peer writes `len` bytes at our `addr` under `key`.
    pub(crate) fn on_rma_write(
        &mut self,
        peer: PeerIdx,
        src: Addr<B>,
        key: u64,
        addr: u64,
        len: u64,
        send_id: u16,
    ) {
        let notify = match self.check_own_range(key, addr, len, Access::REMOTE_WRITE) {
            Ok(notify) => notify,
            Err(error) => {
                tracing::debug!(%src, key, addr, len, "RMA write refused: {error:?}");
                let nack = Wire::RmaNack {
                    id: send_id,
                    read: false,
                    error,
                };
                self.queue_control(peer, nack.encode());
                return;
            }
        };
        let len = len as usize;
        let iov = IovList::One((addr as usize, len));
        let (fragments, direct) = self.xfer_shape(peer, &iov, len);
        self.insert_rx_xfer(RxXfer {
            purpose: XferPurpose::RmaWrite {
                notice: notify.then_some(key),
            },
            peer,
            src,
            send_id,
            info: MatchInfo::default(),
            placement: Placement {
                context: 0,
                iov,
                completion: false,
                multi: None,
            },
            msg_len: len,
            xfer_len: len,
            fragments,
            next_grant: 0,
            done: 0,
            direct,
            offer: None,
            staged: HashMap::new(),
            outstanding: Vec::new(),
        });
    }

    /// A peer reads `len` bytes at our `addr` under `key` into its
    /// transfer `recv_id`.
    pub(crate) fn on_rma_read(
        &mut self,
        peer: PeerIdx,
        key: u64,
        addr: u64,
        len: u64,
        recv_id: u16,
    ) {
        let read = DeferredRead {
            peer,
            key,
            addr,
            len,
            recv_id,
        };
        // Our answers take send ids, which are bounded by tx_size: with
        // the queue full, its peer's share of it taken, or reads of its
        // peer already waiting, it waits its turn.
        if !self.read_may_start(peer) || self.deferred_reads.iter().any(|r| r.peer == peer) {
            if self.check_read(&read).is_none() {
                return;
            }
            self.deferred_reads.push_back(read);
            return;
        }
        self.serve_read(read);
    }

    /// Answers to one peer's reads may hold a quarter of our transmit
    /// queue at most: a peer that reads and never takes the data (grants
    /// nothing) must not leave us without room for our own sends, nor for
    /// other peers' reads.
    fn per_peer_reads(&self) -> usize {
        (self.cfg.tx_size / 4).max(1)
    }

    fn read_may_start(&self, peer: PeerIdx) -> bool {
        self.outstanding_sends < self.cfg.tx_size
            && self.peers[peer].reads_served < self.per_peer_reads()
    }

    /// Serves the reads that waited for a place in our transmit queue,
    /// each peer's in order: a peer at its share does not hold back
    /// another's.
    pub(crate) fn serve_deferred_reads(&mut self) {
        if self.deferred_reads.is_empty() {
            return;
        }
        let mut waiting = std::mem::take(&mut self.deferred_reads);
        let mut held: Vec<PeerIdx> = Vec::new();
        while let Some(read) = waiting.pop_front() {
            // A dead reader's transfer is gone: nothing to answer.
            if self.peers[read.peer].dead {
                continue;
            }
            if self.outstanding_sends >= self.cfg.tx_size {
                self.deferred_reads.push_back(read);
                self.deferred_reads.append(&mut waiting);
                break;
            }
            if held.contains(&read.peer) || !self.read_may_start(read.peer) {
                if !held.contains(&read.peer) {
                    held.push(read.peer);
                }
                self.deferred_reads.push_back(read);
                continue;
            }
            self.serve_read(read);
        }
    }

    /// Checks `read` against our key table: whether the key counts
    /// accesses, or None for a refused one, answered with an `RmaNack`.
    fn check_read(&mut self, read: &DeferredRead) -> Option<bool> {
        let checked = self.check_own_range(read.key, read.addr, read.len, Access::REMOTE_READ);
        let error = match checked {
            Ok(notify) => return Some(notify),
            Err(error) => error,
        };
        tracing::debug!(read.key, read.addr, read.len, "RMA read refused: {error:?}");
        let nack = Wire::RmaNack {
            id: read.recv_id,
            read: true,
            error,
        };
        self.queue_control(read.peer, nack.encode());
        None
    }

    /// Answers `read` (a place in the transmit queue is free), or refuses
    /// it.
    fn serve_read(&mut self, read: DeferredRead) {
        let Some(notify) = self.check_read(&read) else {
            return;
        };
        let DeferredRead {
            peer,
            key,
            addr,
            len,
            recv_id,
        } = read;
        self.outstanding_sends += 1;
        self.peers[peer].reads_served += 1;
        let op = self.tx_ops.insert(TxOp {
            class: TxClass::ReadResponse {
                notice: notify.then_some(key),
            },
            peer,
            context: 0,
            info: MatchInfo::default(),
            len: len as usize,
            completion: false,
            ack: false,
            kind: TxKind::Rendezvous(Payload::User(IovList::One((addr as usize, len as usize)))),
        });
        let ready = Wire::ReadReady {
            send_id: op as u16,
            recv_id,
        };
        self.queue_control(peer, ready.encode());
    }

    /// Hands `op` over to the rendezvous: its target range (at `target`)
    /// is not dmable.
    pub(super) fn assist_rma(&mut self, op: usize, target: u64) {
        let rma = self.rma_ops.remove(op).expect("checked by the caller");
        let peer = rma.peer;
        match rma.kind {
            RmaKind::Write => {
                let payload = match rma._copy {
                    Some(bytes) => Payload::Copy(bytes),
                    None => Payload::User(rma.local),
                };
                let send = self.tx_ops.insert(TxOp {
                    class: TxClass::Write { data: rma.data },
                    peer,
                    context: rma.context,
                    info: MatchInfo::default(),
                    len: rma.len,
                    completion: rma.completion,
                    ack: false,
                    kind: TxKind::Rendezvous(payload),
                });
                self.peers[peer].writes_assisted += 1;
                if rma.len > u32::MAX as usize {
                    self.peers[peer]
                        .data
                        .push_back(DataItem::LenHigh { op: send });
                }
                self.peers[peer].data.push_back(DataItem::RmaWrite {
                    op: send,
                    key: rma.key,
                    addr: target,
                });
                self.mark_active(peer);
            }
            RmaKind::Read | RmaKind::Atomic | RmaKind::AtomicFetch => {
                debug_assert_eq!(rma.kind, RmaKind::Read, "atomics go their own way");
                if self.rx_xfers.len() >= self.rx_id_limit {
                    // Only with a tx_size past half the ids, all in use.
                    tracing::warn!("no free transfer id for an RMA read; it fails");
                    self.outstanding_sends -= 1;
                    self.events.push_back(Event::RmaError {
                        context: rma.context,
                        kind: RmaKind::Read,
                        error: ErrorKind::Invalid,
                    });
                    return;
                }
                let (fragments, direct) = self.xfer_shape(peer, &rma.local, rma.len);
                let src = self.peers[peer].addr;
                let recv_id = self.insert_rx_xfer(RxXfer {
                    purpose: XferPurpose::RmaRead,
                    peer,
                    src,
                    send_id: NO_SEND_ID,
                    info: MatchInfo::default(),
                    placement: Placement {
                        context: rma.context,
                        iov: rma.local,
                        completion: rma.completion,
                        multi: None,
                    },
                    msg_len: rma.len,
                    xfer_len: rma.len,
                    fragments,
                    next_grant: 0,
                    done: 0,
                    direct,
                    offer: None,
                    staged: HashMap::new(),
                    outstanding: Vec::new(),
                });
                if rma.len > u32::MAX as usize {
                    let high = Wire::LenHigh {
                        id: recv_id as u16,
                        read: true,
                        high: (rma.len as u64 >> 32) as u32,
                    };
                    self.queue_control(peer, high.encode());
                }
                let read = Wire::RmaRead {
                    key: rma.key,
                    addr: target,
                    len: rma.len as u32,
                    recv_id: recv_id as u16,
                };
                self.queue_control(peer, read.encode());
            }
        }
    }

    /// The target of our read `recv_id` serves it with its send `send_id`.
    pub(crate) fn on_read_ready(&mut self, peer: PeerIdx, send_id: u16, recv_id: u16) {
        let Some(xfer) = self.rx_xfers.get_mut(recv_id as usize) else {
            self.drop_invalid(peer, "read answer for an unknown transfer");
            return;
        };
        if xfer.purpose != XferPurpose::RmaRead
            || xfer.peer != peer
            || xfer.send_id != NO_SEND_ID
            || send_id == NO_SEND_ID
        {
            self.drop_invalid(peer, "read answer that does not fit its transfer");
            return;
        }
        xfer.send_id = send_id;
        if xfer.fragments == 0 {
            self.finish_rx(recv_id as usize);
        } else {
            self.continue_granting(recv_id as usize);
        }
    }

    /// The target refused our write (`id` a send id) or read (`id` a recv
    /// id).
    pub(crate) fn on_rma_nack(&mut self, peer: PeerIdx, id: u16, read: bool, error: RmaRefusal) {
        let kind = super::refusal_error(error);
        let id = id as usize;
        if read {
            let fits = self.rx_xfers.get(id).is_some_and(|x| {
                x.purpose == XferPurpose::RmaRead && x.peer == peer && x.send_id == NO_SEND_ID
            });
            if !fits {
                self.drop_invalid(peer, "read refusal for an unknown transfer");
                return;
            }
            let xfer = self.rx_xfers.remove(id).expect("checked above");
            self.fail_xfer(xfer, kind);
        } else {
            let fits = self
                .tx_ops
                .get(id)
                .is_some_and(|t| matches!(t.class, TxClass::Write { .. }) && t.peer == peer);
            if !fits {
                self.drop_invalid(peer, "write refusal for an unknown write");
                return;
            }
            // Its request left the queue; no grant came, nothing moved.
            self.fail_send_with(id, kind);
        }
    }

    /// A peer's one-sided accesses to our key are complete; they count
    /// only if the key is ours and counts accesses.
    pub(crate) fn on_remote_notice(&mut self, peer: PeerIdx, counts: AccessCounts) {
        let node = self.dma.local_node();
        let counted = self
            .dma
            .lock()
            .resolve_key(node, counts.key)
            .is_ok_and(|e| e.access.counts_any());
        if counted {
            self.events.push_back(Event::RemoteAccess(counts));
        } else {
            self.drop_invalid(peer, "access notice for a key that counts no accesses");
        }
    }

    /// A peer's write with CQ data is complete in our memory.
    pub(crate) fn on_remote_data(&mut self, data: u64, len: u64) {
        self.events.push_back(Event::RemoteWrite {
            data,
            len: len as usize,
        });
    }
}
