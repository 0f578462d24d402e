//! Eager sends: the data, copied into a bounce buffer, is put by DMA into
//! the next slot of the ring the receiver set aside for us, then announced
//! by the data queue; a peer without a ring gets it by rendezvous instead.
//!
//! Moves through [`TxRing`](super::super::peers::TxRing), our place in the
//! peer's ring (its credits are
//! [`credits`](super::super::credits)'). Submits DMA through the
//! messenger's DMA handle.

use std::hash::Hash;

use unimem_dma::DmaEngine;
use unimem_mailbox::Mailbox;

use super::super::peers::DataItem;

use super::super::{Messenger, PeerIdx};
use super::{EagerState, TxKind, TxOp, Waiter};
use crate::matching::IovList;
use crate::WireNode;

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode,
{
    /// Waits for the DMA of an injected eager send (its modeled time, a few
    /// microseconds at most) and sends its announcement now.
    pub(crate) fn push_out_eager(&mut self, peer: PeerIdx, op: usize) {
        let in_flight = |this: &Self| {
            matches!(
                this.tx_ops.get(op),
                Some(TxOp {
                    kind: TxKind::Eager {
                        state: EagerState::InFlight,
                        ..
                    },
                    ..
                })
            )
        };
        while in_flight(self) {
            std::hint::spin_loop();
            self.reap_dma();
        }
        self.flush_peer(peer);
    }

    /// Starts the DMA of queued eager sends that have a credit, in order.
    /// If it took the DMA lock for that, it reaps completions under it too,
    /// and says so: one lock for the whole step.
    pub(crate) fn start_eager_dma(&mut self, peer: PeerIdx) -> bool {
        let state = &mut self.peers[peer];
        let Some(ring) = state.tx.as_mut() else {
            if state.hello_received {
                self.eager_by_rendezvous(peer);
            }
            return false;
        };
        // The first eager send waiting for its DMA, if any: only then is the
        // DMA lock taken (inline messages queued here never take it).
        let tx_ops = &self.tx_ops;
        let Some(first) = state.data.iter().position(|item| match *item {
            DataItem::Eager { op } => matches!(
                tx_ops.get(op),
                Some(TxOp {
                    kind: TxKind::Eager {
                        state: EagerState::Waiting,
                        ..
                    },
                    ..
                })
            ),
            _ => false,
        }) else {
            return false;
        };
        if ring.credits == 0 {
            return false;
        }
        let mut dma = self.dma.lock();
        for item in state.data.iter().skip(first) {
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.get_mut(op).expect("queued op exists");
            let TxKind::Eager {
                bounce,
                state: ref mut eager,
            } = tx.kind
            else {
                continue;
            };
            if *eager != EagerState::Waiting {
                continue;
            }
            if ring.credits == 0 {
                break;
            }
            let remote = ring.base + (ring.next * ring.slot_size) as u64;
            let token = self.dma_waiters.next_id();
            match dma.put(
                self.bounce_pool.addr(bounce),
                tx.len,
                ring.reg,
                remote,
                token,
            ) {
                Ok(()) => {
                    ring.credits -= 1;
                    ring.next = (ring.next + 1) % ring.slots;
                    *eager = EagerState::InFlight;
                    let id = self.dma_waiters.insert(Waiter::Eager { op });
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

    /// A peer that offers no eager ring (it had no dmable memory for one, or
    /// we could not register it) gets queued eager messages by rendezvous,
    /// from the bounce buffers they were copied into.
    pub(crate) fn eager_by_rendezvous(&mut self, peer: PeerIdx) {
        for item in self.peers[peer].data.iter_mut() {
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.get_mut(op).expect("queued op exists");
            let TxKind::Eager { bounce, .. } = tx.kind else {
                continue;
            };
            tx.kind = TxKind::Rendezvous {
                iov: IovList::One((self.bounce_pool.addr(bounce) as usize, tx.len)),
                bounce: Some(bounce),
            };
            *item = DataItem::Rts { op };
        }
    }
}
