//! Eager sends: the data goes into the next slot of the ring the receiver
//! set aside for us, then is announced by the data queue; a peer without a
//! ring gets it by rendezvous instead.
//!
//! To a peer of this host the CPU stores the data into the slot
//! ([`unimem_dma::DmaEngine::load_store`]: Unimem's unified addressing),
//! within the send's call when it can leave at once (`store_now`), else
//! from progress as credits come (`store_eager`): one copy, no bounce
//! buffer, no DMA to wait for. To any other peer it is put by DMA from a
//! bounce buffer: a send takes one only when it can leave (it has a
//! credit), its data copied from the application's buffers (or from an
//! inject's copy), and the buffer goes back to the pool as soon as the DMA
//! has read it. A send waiting for a slow peer holds none.
//!
//! Moves through [`TxRing`](super::super::peers::TxRing), our place in the
//! peer's ring (its credits are
//! [`credits`](super::super::credits)'). Submits DMA through the
//! messenger's DMA handle.

use unimem_mailbox::Message;

use super::super::peers::DataItem;

use super::super::{Backend, Messenger, PeerIdx};
use super::{recycle_copy, EagerState, Payload, TxKind, TxOp, Waiter};
use crate::iov::gather;
use crate::matching::IovList;
use crate::wire::{MatchInfo, Wire, EAGER_SEQ_MOD};

impl<B: Backend> Messenger<B> {
    /// If the DMA of an injected eager send started within its call, waits
    /// for it (its modeled time, a few microseconds at most) and sends the
    /// announcement now: an inject that can leave at once does, so that a
    /// sender that never calls in again still delivers it. One that waits
    /// for the peer leaves from progress, like any queued send.
    pub(crate) fn push_out_eager(&mut self, peer: PeerIdx, op: usize) {
        let in_flight = |this: &Self| {
            matches!(
                this.tx_ops.get(op),
                Some(TxOp {
                    kind: TxKind::Eager(EagerState::InFlight(_)),
                    ..
                })
            )
        };
        if !in_flight(self) {
            return;
        }
        while in_flight(self) {
            std::hint::spin_loop();
            self.reap_dma();
        }
        self.flush_peer(peer);
    }

    /// Starts the DMA of queued eager sends that have a credit, in order:
    /// first, outside the DMA lock, each gets a bounce buffer with its data
    /// in it; then the puts, under one lock. If it took the DMA lock, it
    /// reaps completions under it too, and says so: one lock for the whole
    /// step.
    pub(crate) fn start_eager_dma(&mut self, peer: PeerIdx) -> bool {
        let state = &mut self.peers[peer];
        let Some(ring) = state.tx.as_mut() else {
            if state.hello_received {
                self.eager_by_rendezvous(peer, 0);
            }
            return false;
        };
        if ring.credits == 0 {
            return false;
        }
        // The first eager send waiting for its DMA, if any: only then is the
        // DMA lock taken (inline messages queued here never take it).
        let tx_ops = &self.tx_ops;
        let Some(first) = state.data.iter().position(|item| match *item {
            DataItem::Eager { op } => matches!(
                tx_ops.get(op),
                Some(TxOp {
                    kind: TxKind::Eager(EagerState::Waiting(_)),
                    ..
                })
            ),
            _ => false,
        }) else {
            return false;
        };
        if ring.stores {
            match self.store_eager(peer, first) {
                Some(()) => return false,
                // Loads and stores do not reach it: by DMA from now on.
                None => self.peers[peer].tx.as_mut().expect("checked").stores = false,
            }
        }
        let state = &mut self.peers[peer];
        let ring = state.tx.as_mut().expect("checked above");
        // As many as have credits, in order, get their bounce buffers.
        let mut ready = 0;
        for item in state.data.iter().skip(first) {
            if ready == ring.credits {
                break;
            }
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.get_mut(op).expect("queued op exists");
            let TxKind::Eager(EagerState::Waiting(payload)) = &mut tx.kind else {
                continue;
            };
            if !matches!(payload, Payload::Bounce(_)) {
                let Some(bounce) = self.bounce_pool.get() else {
                    break;
                };
                let at = self.bounce_pool.addr(bounce);
                match payload {
                    // SAFETY: a non-inject send's buffers stay valid until it
                    // completes (caller of `send`); the bounce buffer holds a
                    // slot, at least eager_size >= len bytes.
                    Payload::User(iov) => unsafe { gather(iov, 0, at, tx.len) },
                    // SAFETY: the copy holds len bytes; as above.
                    Payload::Copy(bytes) => unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, tx.len)
                    },
                    Payload::Bounce(_) => unreachable!("checked above"),
                }
                if let Payload::Copy(bytes) = std::mem::replace(payload, Payload::Bounce(bounce)) {
                    recycle_copy(&mut self.spare_copies, bytes);
                }
            }
            ready += 1;
        }
        if ready == 0 {
            return false;
        }
        let mut dma = self.dma.lock();
        for item in state.data.iter().skip(first) {
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.get_mut(op).expect("queued op exists");
            let TxKind::Eager(eager) = &mut tx.kind else {
                continue;
            };
            let bounce = match eager {
                EagerState::Waiting(Payload::Bounce(bounce)) => *bounce,
                // Not ready (no credit or bounce buffer for it): it and
                // everything after it wait, in order.
                EagerState::Waiting(_) => break,
                EagerState::InFlight(_) | EagerState::Done => continue,
            };
            if ring.credits == 0 {
                break;
            }
            let remote = ring.next_slot();
            let token = self.dma_waiters.next_id();
            match dma.put(
                self.bounce_pool.addr(bounce),
                tx.len,
                ring.reg,
                remote,
                token,
            ) {
                Ok(()) => {
                    ring.spend();
                    *eager = EagerState::InFlight(token);
                    let id = self.dma_waiters.insert(Waiter::Eager { op, bounce });
                    debug_assert_eq!(id, token);
                }
                Err(e) => {
                    tracing::warn!("eager DMA refused: {e}");
                    break;
                }
            }
        }
        let mut done = std::mem::take(&mut self.dma_done);
        dma.completed(&mut done);
        drop(dma);
        self.on_dma_done(done);
        true
    }

    /// The announcement of an eager message whose data was just stored
    /// into the next slot of `peer`'s ring (its sequence number taken, the
    /// credits we owe the peer carried back).
    #[inline(always)]
    pub(crate) fn eager_announcement(
        &mut self,
        peer: PeerIdx,
        info: &MatchInfo,
        len: usize,
    ) -> Message {
        let credits = self.take_owed(peer);
        let ring = self.peers[peer]
            .tx
            .as_mut()
            .expect("the data went into its ring");
        let seq = ring.seq;
        ring.seq = (ring.seq + 1) % EAGER_SEQ_MOD;
        Wire::encode_eager(info, len as u32, seq, credits, None)
    }

    /// Whether a message of `len` bytes to `peer` would be stored into its
    /// slot within the call (see [`Self::store_now`]) and the profile
    /// charges a store nothing more than the mailbox message it saves:
    /// then a message that fits a few mailbox messages is stored instead
    /// (measured on one host: 64 B by `osu_bw`, 200 MB/s in parts, 264
    /// stored; latency the same).
    pub(crate) fn stores_first(&self, peer: PeerIdx, len: usize) -> bool {
        let state = &self.peers[peer];
        self.cfg.store_before_parts
            && !state.throttled
            && len <= state.eager_limit
            && self.leaves_stored(peer)
    }

    /// Nothing queued ahead, and a credit for a ring our stores reach.
    fn leaves_stored(&self, peer: PeerIdx) -> bool {
        let state = &self.peers[peer];
        state.data.is_empty() && state.tx.as_ref().is_some_and(|r| r.stores && r.credits > 0)
    }

    /// An inject (or a `copy` send) that can leave at once, nothing queued
    /// ahead of it and a credit to spend, to a ring our stores reach: its
    /// data goes from the caller's buffers straight into its slot within
    /// the call, one copy, where a bounce buffer would take two. False if
    /// it cannot (nothing done).
    ///
    /// # Safety
    /// `iov` must hold `len` readable bytes, `len` <= the peer's slot size.
    #[inline(always)]
    pub(crate) unsafe fn store_now(&mut self, peer: PeerIdx, iov: &IovList, len: usize) -> bool {
        if !self.leaves_stored(peer) {
            return false;
        }
        let ring = self.peers[peer].tx.as_mut().expect("checked above");
        if let Some(lease) = &ring.lease {
            // SAFETY: as in `store_by_engine`.
            let store = |at| unsafe { gather(iov, 0, at, len) };
            if lease.access(ring.next_slot(), len, true, store) {
                ring.spend();
                self.stats.stored += 1;
                return true;
            }
            ring.lease = None;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.store_by_engine(peer, iov, len) }
    }

    /// [`Self::store_now`] through the engine (no lease, or it refused):
    /// out of line, off the path of every stored send.
    ///
    /// # Safety
    /// As [`Self::store_now`].
    #[inline(never)]
    unsafe fn store_by_engine(&mut self, peer: PeerIdx, iov: &IovList, len: usize) -> bool {
        let ring = self.peers[peer].tx.as_mut().expect("checked by the caller");
        let remote = ring.next_slot();
        let mut dma = self.dma.lock();
        // SAFETY: `at` reaches the slot, slot_size >= len bytes (the engine
        // checked the range); the iov holds len bytes (caller).
        let stored = dma.load_store(ring.reg, remote, len, true, &mut |at| unsafe {
            gather(iov, 0, at, len)
        });
        match stored {
            Ok(()) => {
                ring.spend();
                self.stats.stored += 1;
                true
            }
            Err(unimem_dma::DmaError::NoLoadStore) => {
                ring.stores = false;
                false
            }
            Err(e) => {
                tracing::warn!("eager store refused: {e}");
                false
            }
        }
    }

    /// Stores the data of queued eager sends that have a credit, in order
    /// from the data queue's item `first`, straight into their slots of the
    /// peer's ring by the CPU (Unimem's unified addressing: a node stores
    /// into a remote node's memory): one copy, no bounce buffer, no DMA to
    /// wait for; the announcements follow from the same flush. `None` if
    /// loads and stores do not reach the ring (nothing done).
    fn store_eager(&mut self, peer: PeerIdx, first: usize) -> Option<()> {
        let state = &mut self.peers[peer];
        let ring = state.tx.as_mut().expect("checked by the caller");
        let mut dma = self.dma.lock();
        for item in state.data.iter().skip(first) {
            if ring.credits == 0 {
                break;
            }
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.get_mut(op).expect("queued op exists");
            let len = tx.len;
            let TxKind::Eager(eager) = &mut tx.kind else {
                continue;
            };
            let EagerState::Waiting(payload) = eager else {
                continue;
            };
            let remote = ring.next_slot();
            let bounce_pool = &self.bounce_pool;
            let mut store = |at: *mut u8| match payload {
                // SAFETY: `at` reaches the slot, slot_size >= len bytes
                // (the engine checked the range); a non-inject send's
                // buffers stay valid until it completes (caller of `send`).
                Payload::User(iov) => unsafe { gather(iov, 0, at, len) },
                // SAFETY: as above; the copy holds len bytes.
                Payload::Copy(bytes) => unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, len)
                },
                // SAFETY: as above; the bounce buffer holds len bytes.
                Payload::Bounce(bounce) => unsafe {
                    std::ptr::copy_nonoverlapping(bounce_pool.addr(*bounce), at, len)
                },
            };
            let leased = ring
                .lease
                .as_ref()
                .is_some_and(|lease| lease.access(remote, len, true, &mut store));
            let stored = if leased {
                Ok(())
            } else {
                ring.lease = None;
                dma.load_store(ring.reg, remote, len, true, &mut store)
            };
            match stored {
                Ok(()) => {
                    ring.spend();
                    self.stats.stored += 1;
                    match std::mem::replace(eager, EagerState::Done) {
                        EagerState::Waiting(Payload::Bounce(bounce)) => {
                            self.bounce_pool.put(bounce)
                        }
                        EagerState::Waiting(Payload::Copy(bytes)) => {
                            recycle_copy(&mut self.spare_copies, bytes)
                        }
                        _ => {}
                    }
                }
                Err(unimem_dma::DmaError::NoLoadStore) => return None,
                Err(e) => {
                    tracing::warn!("eager store refused: {e}");
                    break;
                }
            }
        }
        Some(())
    }

    /// The peer holds too much of our unexpected data (`on`), or no longer.
    /// While on, it returns no credits: our eager messages waiting for one
    /// go by rendezvous instead, so that nothing behind them in the queue
    /// waits for the peer's application to take what it holds.
    pub(crate) fn on_throttle(&mut self, peer: PeerIdx, on: bool) {
        self.peers[peer].throttled = on;
        if on {
            self.eager_by_rendezvous(peer, 0);
            self.mark_active(peer);
        }
    }

    /// A peer that offers no eager ring (it had no dmable memory for one, or
    /// we could not register it) gets queued eager messages by rendezvous,
    /// from wherever their data is (the application's buffers, a bounce
    /// buffer, an inject's copy); so does one whose slots are smaller than
    /// ours, the messages longer than `limit` (0: all).
    pub(crate) fn eager_by_rendezvous(&mut self, peer: PeerIdx, limit: usize) {
        for item in self.peers[peer].data.iter_mut() {
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.get_mut(op).expect("queued op exists");
            if limit > 0 && tx.len <= limit {
                continue;
            }
            // Those that started (a throttled peer's) stay eager.
            if let TxKind::Eager(EagerState::Waiting(_)) = tx.kind {
                let TxKind::Eager(EagerState::Waiting(payload)) =
                    std::mem::replace(&mut tx.kind, TxKind::Inline)
                else {
                    unreachable!("matched above")
                };
                tx.kind = TxKind::Rendezvous(payload);
                *item = DataItem::Rts { op };
            }
        }
    }
}
