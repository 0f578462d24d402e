//! Completion: turning finished and failed operations into [`Event`]s, and
//! giving back what a finished send held (its id, its bounce buffer).
//!
//! Owns: `events` (filled here, drained by `next_event`) and the count of
//! `outstanding_sends`. Touches `tx_ops`, the bounce pool and the matcher's
//! multi-receive accounting.

use super::send::{EagerState, Payload, TxClass, TxKind};
use super::{Addr, Backend, Messenger};
use crate::matching::{MultiDone, Placement, PostedRecv};
use crate::wire::{MatchInfo, Wire};
use crate::{AccessCounts, ErrorKind, Event, OpError, RecvDone, RmaKind};

impl<B: Backend> Messenger<B> {
    /// Gives back the bounce buffer a finished send held, if any (a DMA in
    /// flight holds its own, in its waiter).
    pub(crate) fn release_bounce(&mut self, kind: &TxKind) {
        match *kind {
            TxKind::Eager(EagerState::Waiting(Payload::Bounce(bounce)))
            | TxKind::Rendezvous(Payload::Bounce(bounce)) => self.bounce_pool.put(bounce),
            _ => {}
        }
    }

    /// Counts a send that ended, and reports it: always when it asks for
    /// a CQ entry, else only if a send counter wants it
    /// (`report_silent_sends`).
    pub(crate) fn report_send(&mut self, context: usize, tagged: bool, completion: bool) {
        self.stats.sends += 1;
        if completion || self.report_silent_sends {
            self.events.push_back(Event::Send {
                context,
                tagged,
                completion,
            });
        }
    }

    /// Reports a finished RMA operation or atomic: an event, or only a
    /// count for the counters when it asks for no completion and the
    /// messenger counts those (`count_silent_rma`).
    #[inline]
    pub(crate) fn report_rma(&mut self, context: usize, kind: RmaKind, completion: bool) {
        if completion || !self.count_silent_rma {
            self.events.push_back(Event::Rma {
                context,
                kind,
                completion,
            });
        } else {
            self.silent_rma[kind as usize] += 1;
            self.silent_any = true;
        }
    }

    pub(crate) fn complete_send(&mut self, op: usize) {
        let Some(tx) = self.tx_ops.remove(op) else {
            return;
        };
        // Its id may be reused at once: no grant of it may stay behind.
        self.deferred_fragments.retain(|grant| grant.op != op);
        self.outstanding_sends -= 1;
        self.release_bounce(&tx.kind);
        match tx.class {
            // Injects report too (`completion` is false for them): counters
            // count every send, CQs only those asking for an entry.
            TxClass::Msg => {
                self.report_send(tx.context, tx.info.tag.is_some(), tx.completion);
            }
            TxClass::Write { data } => {
                self.peers[tx.peer].writes_assisted -= 1;
                if let Some(data) = data {
                    let len = tx.len as u64;
                    self.queue_control(tx.peer, Wire::RemoteData { data, len }.encode());
                }
                self.report_rma(tx.context, RmaKind::Write, tx.completion);
            }
            TxClass::ReadResponse { notice } => {
                self.peers[tx.peer].reads_served -= 1;
                if let Some(key) = notice {
                    self.events
                        .push_back(Event::RemoteAccess(AccessCounts::one(key, true, false)));
                }
            }
        }
    }

    /// Fails send `op` because its peer is gone.
    pub(crate) fn fail_send(&mut self, op: usize) {
        self.fail_send_with(op, ErrorKind::PeerUnreachable);
    }

    pub(crate) fn fail_send_with(&mut self, op: usize, kind: ErrorKind) {
        let Some(tx) = self.tx_ops.remove(op) else {
            return;
        };
        self.deferred_fragments.retain(|grant| grant.op != op);
        self.release_bounce(&tx.kind);
        self.outstanding_sends -= 1;
        match tx.class {
            TxClass::Msg => {}
            TxClass::Write { .. } => {
                self.peers[tx.peer].writes_assisted -= 1;
                self.events.push_back(Event::RmaError {
                    context: tx.context,
                    kind: RmaKind::Write,
                    error: kind,
                });
                return;
            }
            TxClass::ReadResponse { .. } => {
                self.peers[tx.peer].reads_served -= 1;
                return;
            }
        }
        self.events.push_back(Event::Error(OpError {
            context: tx.context,
            kind,
            send: true,
            tagged: tx.info.tag.is_some(),
            buf: 0,
            len: 0,
            olen: 0,
            tag: tx.info.tag.unwrap_or(0),
            data: tx.info.data,
            src: None,
            multi_released: false,
        }));
    }

    #[inline(always)]
    pub(crate) fn complete_recv(
        &mut self,
        placement: Placement,
        src: Addr<B>,
        info: MatchInfo,
        msg_len: usize,
        copied: usize,
    ) {
        if copied < msg_len {
            let olen = msg_len - copied;
            self.complete_recv_error(placement, Some(src), info, olen, ErrorKind::Truncated);
            return;
        }
        let multi_released = placement
            .multi
            .is_some_and(|id| self.matcher.multi_piece_done(id) == MultiDone::Released);
        self.stats.receives += 1;
        let done = RecvDone {
            context: placement.context,
            completion: placement.completion,
            tagged: info.tag.is_some(),
            buf: placement.buf(),
            len: copied,
            tag: info.tag.unwrap_or(0),
            data: info.data,
            src,
            multi_released,
            multi: placement.multi.is_some(),
        };
        match &mut self.recv_sink {
            Some(sink) if self.events.is_empty() => sink.received(&done),
            _ => self.events.push_back(Event::Recv(done)),
        }
    }

    #[inline(never)]
    pub(crate) fn complete_recv_error(
        &mut self,
        placement: Placement,
        src: Option<Addr<B>>,
        info: MatchInfo,
        olen: usize,
        kind: ErrorKind,
    ) {
        let multi_released = placement
            .multi
            .is_some_and(|id| self.matcher.multi_piece_done(id) == MultiDone::Released);
        let len = if kind == ErrorKind::Truncated {
            placement.capacity()
        } else {
            0
        };
        self.events.push_back(Event::Error(OpError {
            context: placement.context,
            kind,
            send: false,
            tagged: info.tag.is_some(),
            buf: placement.buf(),
            len,
            olen,
            tag: info.tag.unwrap_or(0),
            data: info.data,
            src,
            multi_released,
        }));
    }

    /// Reports a posted receive that ends without data.
    pub(crate) fn fail_posted(
        &mut self,
        tagged: bool,
        recv: &PostedRecv<Addr<B>>,
        kind: ErrorKind,
        src: Option<Addr<B>>,
        multi_released: bool,
    ) {
        self.events.push_back(Event::Error(OpError {
            context: recv.context,
            kind,
            send: false,
            tagged,
            buf: recv.iov.first().map_or(0, |&(addr, _)| addr),
            len: 0,
            olen: 0,
            tag: recv.tag,
            data: None,
            src,
            multi_released,
        }));
    }
}
