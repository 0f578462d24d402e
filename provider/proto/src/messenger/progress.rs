//! Progress: the loop every call into the messenger may run. It reaps DMA
//! completions, dispatches arrived mailbox messages to the module that
//! handles each kind, retries work that waited for a resource, returns
//! credits and flushes the peers with queued messages.
//!
//! Owns: `dma_waiters` (what each DMA in flight is for) and the spare half
//! of `active`. Touches everything, through the other modules' handlers.

use unimem_dma::{DmaError, RegId};
use unimem_mailbox::{Mailbox, Message};

use super::send::rendezvous::Grant;
use super::send::{EagerState, TxKind, Waiter};
use super::untrusted::FENCE_AFTER;
use super::{Addr, Backend, Messenger, Node, PeerIdx};
use crate::dma::{DmaSession, Token};
use crate::wire::Wire;

impl<B: Backend> Messenger<B> {
    /// Advances everything: DMA completions, arrived messages, deferred work,
    /// credits and queued sends.
    #[inline]
    pub fn progress(&mut self) {
        // Waiting for a message with nothing in flight is the common case
        // (MPI polls in a loop): a look at the mailbox is all it takes,
        // inline in the caller's poll.
        if self.dma_waiters.is_empty()
            && self.active.is_empty()
            && self.deferred_grants.is_empty()
            && self.deferred_fragments.is_empty()
            && !self.rma_waiting()
            && self.deferred_reads.is_empty()
            && !self.mbx.has_message()
        {
            self.check_peers();
            return;
        }
        self.progress_pass();
    }

    /// A whole pass: something arrived or waits.
    fn progress_pass(&mut self) {
        self.reap_dma();
        for _ in 0..self.cfg.poll_budget {
            let Some((src, message)) = self.mbx.poll() else {
                break;
            };
            self.dispatch(src, &message);
        }
        self.retry_deferred();
        self.return_credits();
        self.flush_active();
        self.reap_dma();
        self.check_peers();
    }

    /// Before the endpoint goes: sends what peers still wait for from us
    /// (FINs and acknowledgements of messages we received, fragment
    /// reports, credits), progressing for at most `patience`. A receive can
    /// complete inside the call that posted it, its acknowledgement queued
    /// for the next progress; an application that then closes (MPI at its
    /// end) would leave the sender waiting for it until it finds us dead.
    pub fn linger(&mut self, patience: std::time::Duration) {
        let deadline = std::time::Instant::now() + patience;
        let owed = |this: &Self| {
            this.peers
                .iter()
                .any(|p| !p.dead && p.route.is_some() && !p.control.is_empty())
        };
        while owed(self) && std::time::Instant::now() < deadline {
            self.progress();
            if owed(self) {
                std::thread::yield_now();
            }
        }
    }

    pub(crate) fn flush_active(&mut self) {
        let mut active = std::mem::take(&mut self.active_spare);
        std::mem::swap(&mut active, &mut self.active);
        for &peer in &active {
            self.peers[peer].active = false;
            if self.flush_peer(peer) {
                self.mark_active(peer);
            }
        }
        active.clear();
        self.active_spare = active;
    }

    pub(crate) fn reap_dma(&mut self) {
        // Nothing of ours in flight: no lock to take (inline messages never
        // do).
        if self.dma_waiters.is_empty() {
            return;
        }
        let mut done = std::mem::take(&mut self.dma_done);
        self.dma.completed(&mut done);
        self.on_dma_done(done);
    }

    /// Submits a granted transfer (`transfer`, given the registration and
    /// its token) of `len` bytes at `addr` of `node`, a peer's grant or
    /// offer: a stale registration of that memory is renewed, the grant's
    /// own token deciding whether the memory is still the one granted.
    /// Taken, it is waited for as `waiter`, and what completed meanwhile
    /// (reaped under the same lock) is acted on once the waiter is in.
    pub(crate) fn submit_granted(
        &mut self,
        (node, addr, len): (Node<B>, u64, usize),
        mut transfer: impl FnMut(&mut DmaSession<'_, B::Dma>, RegId, Token) -> Result<(), DmaError>,
        waiter: Waiter,
    ) -> Result<(), DmaError> {
        let token = self.dma_waiters.next_id();
        let mut dma = self.dma.lock();
        let result = dma.with_registration(
            None,
            (node, addr, len),
            |_| Ok(()),
            |dma, reg| transfer(dma, reg, token),
        );
        let mut done = std::mem::take(&mut self.dma_done);
        if result.is_ok() {
            dma.completed(&mut done);
        }
        drop(dma);
        if result.is_err() {
            self.dma_done = done;
            return result;
        }
        let id = self.dma_waiters.insert(waiter);
        debug_assert_eq!(id, token);
        self.on_dma_done(done);
        Ok(())
    }

    /// Acts on the completed DMAs whose tokens are in `done`, then keeps it
    /// (empty) for its allocation.
    pub(crate) fn on_dma_done(&mut self, mut done: Vec<Token>) {
        for &token in &done {
            match self.dma_waiters.remove(token) {
                Some(Waiter::Eager { op, bounce }) => {
                    // The data is in the peer's ring: the bounce buffer is
                    // free for the next send, whatever the announcement waits
                    // for.
                    self.bounce_pool.put(bounce);
                    if let Some(tx) = self.tx_ops.get_mut(op) {
                        if let TxKind::Eager(state) = &mut tx.kind {
                            if matches!(state, EagerState::InFlight(mine) if *mine == token) {
                                *state = EagerState::Done;
                                let peer = tx.peer;
                                self.mark_active(peer);
                            }
                        }
                    }
                }
                Some(Waiter::Fragment {
                    op,
                    peer,
                    fragment,
                    recv_id,
                    recv_gen,
                    staging,
                }) => {
                    if let Some(staging) = staging {
                        self.tx_staging.put(staging);
                    }
                    // To the peer that granted it, whatever became of the
                    // send: it checks the report against its grants.
                    if !self.peers[peer].dead {
                        let done = Wire::FragDone {
                            send_id: op as u16,
                            fragment,
                            recv_id,
                            recv_gen,
                        };
                        self.queue_control(peer, done.encode());
                    }
                }
                Some(Waiter::Rma {
                    op,
                    offset,
                    len,
                    staging,
                }) => self.on_rma_piece_done(op, offset, len, staging),
                Some(Waiter::Pull { id, gen }) => self.on_pulled(id, gen),
                None => tracing::warn!(token, "completion of an unknown DMA"),
            }
        }
        done.clear();
        self.dma_done = done;
    }

    pub(crate) fn retry_deferred(&mut self) {
        let mut at = 0;
        while let Some(&id) = self.deferred_grants.get(at) {
            // It may have been granted up to its window since it queued.
            if self.wants_grant(id) && !self.grant_next(id) {
                if self.rx_staging.available() == 0 {
                    break;
                }
                // Its peer holds its share of the staging buffers: the
                // transfers behind it may go.
                at += 1;
                continue;
            }
            self.deferred_grants.remove(at);
            self.continue_granting(id);
        }
        while let Some(grant) = self.deferred_fragments.pop_front() {
            if !self.put_fragment(grant) {
                self.deferred_fragments.push_front(grant);
                break;
            }
        }
        if !self.rx_backlog.is_empty() {
            self.start_backlog();
        }
        self.retry_rma();
        self.serve_deferred_reads();
    }

    /// Hands one arrived mailbox message to its handler.
    pub(crate) fn dispatch(&mut self, src: Addr<B>, message: &Message) {
        // The commonest message, a whole inline one, goes from the
        // mailbox's bytes to the receive buffer: no `Wire` built, no copy
        // of its payload on the way (delivering never counts a violation).
        if let Some((info, payload)) = Wire::inline_view(message) {
            let peer = self.peer_for_source(&src);
            if !self.peers[peer].refused {
                self.deliver(peer, src, info, payload.len(), payload.as_ptr());
            }
            return;
        }
        // The next commonest, an eager announcement: read in place too.
        if let Some(e) = Wire::eager_view(message) {
            let peer = self.peer_for_source(&src);
            if !self.peers[peer].refused {
                self.add_credits(peer, e.credits);
                self.on_eager(peer, src, e.info, e.len, e.seq, e.ack);
                self.fence_if_over(peer);
            }
            return;
        }
        let Some(wire) = Wire::decode(message) else {
            let peer = self.peer_for_source(&src);
            self.drop_invalid(peer, "malformed message");
            self.fence_if_over(peer);
            return;
        };
        if matches!(wire, Wire::Cut) && self.known_peer(&src).is_none() {
            // Cut off by someone we never spoke to: nothing to fail.
            return;
        }
        let peer = self.peer_for_source(&src);
        if self.peers[peer].refused {
            // Refused at first contact, or fenced: nothing of it is acted on.
            return;
        }
        match wire {
            Wire::Params {
                version,
                id_bits,
                fragment_size,
                eager_size,
            } => self.on_params(peer, version, id_bits, fragment_size, eager_size),
            Wire::Hello {
                node,
                ring,
                slot_shift,
                slots,
            } => self.on_hello(peer, &node, ring, slot_shift, slots),
            Wire::Inline { info, payload } => {
                let bytes = payload.as_slice();
                self.deliver(peer, src, info, bytes.len(), bytes.as_ptr());
            }
            Wire::InlineFirst { info, len, payload } => {
                self.on_inline_first(peer, info, len as usize, &payload)
            }
            Wire::InlineMore { payload } => self.on_inline_more(peer, src, &payload),
            Wire::Eager {
                info,
                len,
                seq,
                credits,
                ack,
            } => {
                self.add_credits(peer, credits);
                self.on_eager(peer, src, info, len, seq, ack);
            }
            Wire::Rts {
                info,
                send_id,
                len,
                credits,
            } => {
                self.add_credits(peer, credits);
                let len = self.full_length(peer, false, send_id, len);
                self.on_rts(peer, src, info, send_id, len);
            }
            Wire::Grant {
                send_id,
                fragment,
                addr,
                len,
                recv_id,
                recv_gen,
                token,
            } => self.on_grant(
                peer,
                Grant {
                    op: send_id as usize,
                    fragment,
                    addr,
                    len: len as usize,
                    recv_id,
                    recv_gen,
                    token,
                },
            ),
            Wire::FragDone {
                send_id,
                fragment,
                recv_id,
                recv_gen,
            } => self.on_fragment_done(peer, send_id, recv_id as usize, recv_gen, fragment),
            Wire::Fin { send_id } => self.on_fin(peer, send_id as usize),
            Wire::LenHigh { id, read, high } => self.on_len_high(peer, id, read, high),
            Wire::Offer {
                send_id,
                token,
                addr,
            } => self.on_offer(peer, send_id, (addr, token)),
            Wire::Credit { credits } => self.add_credits(peer, credits),
            // Any value is the peer's to give: it throttles only our
            // traffic to it.
            Wire::Throttle { on } => self.on_throttle(peer, on),
            Wire::Cut => self.on_cut(peer),
            Wire::RmaWrite {
                key,
                addr,
                len,
                send_id,
            } => {
                let len = self.full_length(peer, false, send_id, len) as u64;
                self.on_rma_write(peer, src, key, addr, len, send_id)
            }
            Wire::RmaRead {
                key,
                addr,
                len,
                recv_id,
            } => {
                let len = self.full_length(peer, true, recv_id, len) as u64;
                self.on_rma_read(peer, key, addr, len, recv_id)
            }
            Wire::ReadReady { send_id, recv_id } => self.on_read_ready(peer, send_id, recv_id),
            Wire::RmaNack { id, read, error } => self.on_rma_nack(peer, id, read, error),
            Wire::RemoteData { data, len } => self.on_remote_data(data, len),
            Wire::RemoteNotice(counts) => self.on_remote_notice(peer, counts),
            Wire::AtomicReq {
                key,
                addr,
                op,
                datatype,
                count,
                id,
                fetch,
            } => self.on_atomic_req(peer, key, addr, op, datatype, count, id, fetch),
            Wire::AtomicData { id, bytes } => self.on_atomic_data(peer, id, bytes.as_slice()),
            Wire::AtomicResult { id, bytes } => self.on_atomic_result(peer, id, bytes.as_slice()),
            Wire::AtomicReply { id, refusal } => self.on_atomic_reply(peer, id, refusal),
        }
        self.fence_if_over(peer);
    }

    /// Fences `peer` once its invalid messages reach [`FENCE_AFTER`]: after
    /// a whole message is handled, never in the middle of one.
    #[inline(always)]
    fn fence_if_over(&mut self, peer: PeerIdx) {
        if self.peers[peer].violations >= FENCE_AFTER && !self.peers[peer].refused {
            self.fence_for_violations(peer);
        }
    }

    #[cold]
    #[inline(never)]
    fn fence_for_violations(&mut self, peer: PeerIdx) {
        let addr = self.peers[peer].addr;
        tracing::warn!(%addr, violations = FENCE_AFTER, "peer fenced: too many invalid messages; its operations fail");
        self.fence(peer);
    }
}
