//! One-sided RMA in flight: the DMAs of an operation whose target range is
//! dmable (one from a dmable local buffer, else a staging buffer at a
//! time), their completions, and what the target is told once it is done
//! (access notices, `fi_writedata`'s CQ data).
//!
//! Owns nothing of its own: it moves the operations of `rma_ops` that
//! [`super`] resolved, through `tx_staging` and `dma_waiters`, and queues
//! control messages to the target.

use unimem_dma::RegId;

use super::super::send::Waiter;
use super::super::{Backend, Messenger, PeerIdx};
use super::RmaState;
use crate::iov::{gather, scatter};
use crate::wire::Wire;
use crate::{AccessCounts, ErrorKind, RmaKind};

impl<B: Backend> Messenger<B> {
    /// Submits the DMAs of one-sided `op` as far as staging buffers allow;
    /// false if some wait for one. `probed` registers the whole target
    /// range (see `resolve_rma`): the first piece uses it.
    pub(super) fn submit_pieces(&mut self, op: usize, mut probed: Option<RegId>) -> bool {
        // A dmable local buffer moves in one DMA; any other, a staging
        // buffer at a time. (Asked once: the question takes the domain's
        // DMA lock.)
        let whole = self.rma_ops.get(op).is_some_and(|rma| {
            rma.local.len() == 1
                && self
                    .dma
                    .is_dmable(rma.local[0].0 as *const u8, rma.len.max(1))
        });
        loop {
            let Some(rma) = self.rma_ops.get(op) else {
                return true;
            };
            let RmaState::Direct { target, next, .. } = rma.state else {
                return true;
            };
            if next == rma.len {
                return true;
            }
            let (peer, kind) = (rma.peer, rma.kind);
            let Some(node) = self.peers[peer].node else {
                return true;
            };
            let (local, len, staging) = if whole {
                (rma.local[0].0 + next, rma.len - next, None)
            } else {
                let Some(staging) = self.tx_staging.get() else {
                    return false;
                };
                let at = self.tx_staging.addr(staging);
                let len = self.cfg.fragment_size.min(rma.len - next);
                if kind == RmaKind::Write {
                    // SAFETY: the iov is valid until the operation
                    // completes; the staging buffer holds fragment_size
                    // >= len bytes.
                    unsafe { gather(&rma.local, next, at, len) };
                }
                (at as usize, len, Some(staging))
            };
            let remote = target + next as u64;
            let token = self.dma_waiters.next_id();
            let mut dma = self.dma.lock();
            let rma = self.rma_ops.get(op).expect("checked above");
            let submitted = dma.with_registration(
                probed.take(),
                (node, remote, len),
                |dma| rma.still_allowed(dma, node),
                |dma, reg| {
                    if kind == RmaKind::Write {
                        dma.put(local as *const u8, len, reg, remote, token)
                    } else {
                        dma.get(local as *mut u8, len, reg, remote, token)
                    }
                },
            );
            drop(dma);
            if let Err(e) = submitted {
                tracing::warn!(%node, "RMA DMA refused: {e}");
                if let Some(staging) = staging {
                    self.tx_staging.put(staging);
                }
                self.fail_peer(peer);
                return true;
            }
            let id = self.dma_waiters.insert(Waiter::Rma {
                op,
                offset: next,
                len,
                staging,
            });
            debug_assert_eq!(id, token);
            let rma = self.rma_ops.get_mut(op).expect("checked above");
            if let RmaState::Direct {
                next, in_flight, ..
            } = &mut rma.state
            {
                *next += len;
                *in_flight += 1;
            }
        }
    }

    /// A DMA of one-sided `op` completed: `len` bytes at `offset`.
    pub(crate) fn on_rma_piece_done(
        &mut self,
        op: usize,
        offset: usize,
        len: usize,
        staging: Option<crate::pool::Buffer>,
    ) {
        let Some(rma) = self.rma_ops.get_mut(op) else {
            if let Some(staging) = staging {
                self.tx_staging.put(staging);
            }
            return;
        };
        if let Some(staging) = staging {
            if rma.kind == RmaKind::Read {
                // SAFETY: the staging buffer holds the piece (its DMA
                // completed); the iov is valid until the read completes.
                unsafe { scatter(&rma.local, offset, self.tx_staging.addr(staging), len) };
            }
            self.tx_staging.put(staging);
        }
        let RmaState::Direct {
            next,
            in_flight,
            failed,
            ..
        } = &mut rma.state
        else {
            return;
        };
        *in_flight -= 1;
        if *in_flight > 0 {
            return;
        }
        if *failed {
            self.end_rma(op, Some(ErrorKind::PeerUnreachable));
        } else if *next == rma.len {
            self.end_rma(op, None);
        }
    }

    /// Tells the target of a finished access of ours what it asks to know:
    /// the access (`notice`: read, write) when its key counts them, and
    /// `fi_writedata`'s CQ data (`data`, for a write of `len` bytes).
    #[inline]
    pub(crate) fn tell_target(
        &mut self,
        peer: PeerIdx,
        key: u64,
        notice: Option<(bool, bool)>,
        data: Option<u64>,
        len: usize,
    ) {
        if let Some((read, write)) = notice {
            self.stats.notices += 1;
            self.queue_notice(peer, AccessCounts::one(key, read, write));
        }
        if let Some(data) = data {
            let done = Wire::RemoteData {
                data,
                len: len as u64,
            };
            self.queue_control(peer, done.encode());
        }
    }

    /// Queues a notice of `counts` to `peer`: into the notice last queued,
    /// when it is the last control message and of the same key (a stream
    /// of puts tells its target once, not once per put, without passing
    /// anything queued between them).
    fn queue_notice(&mut self, peer: PeerIdx, counts: AccessCounts) {
        if let Some(last) = self.peers[peer].control.back_mut() {
            if let Some(Wire::RemoteNotice(queued)) = Wire::decode(last) {
                if let Some(sum) = (queued.key == counts.key)
                    .then(|| queued.merged(&counts))
                    .flatten()
                {
                    *last = Wire::RemoteNotice(sum).encode();
                    return;
                }
            }
        }
        self.queue_control(peer, Wire::RemoteNotice(counts).encode());
    }
}
