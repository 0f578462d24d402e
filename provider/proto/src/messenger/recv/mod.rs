//! The receive side: posting receives, matching arrivals against them
//! (through the [`Matcher`](crate::matching::Matcher)), keeping unexpected
//! messages until a receive takes them, peek/claim/discard and cancel.
//!
//! Owns: `matcher`. The eager ring consumer and the rendezvous receive side
//! are its submodules; completions go through
//! [`completion`](super::completion).

pub(crate) mod eager;
pub(crate) mod parted;
pub(crate) mod rendezvous;

use super::peers::KnownPeer;
use super::{Addr, Backend, Messenger, PeerIdx};
use crate::iov::scatter;
use crate::matching::{Cancelled, Placement, PostedRecv, Unexpected};
use crate::wire::{MatchInfo, Wire};
use crate::{ErrorKind, Event, OpError, RecvDone, UNEXPECTED_OVERHEAD};

/// What an unexpected message keeps until a receive takes it.
pub enum Held {
    /// Its data, counted against its sender's `unexpected_held`.
    Data { bytes: Vec<u8>, peer: PeerIdx },
    /// A rendezvous: the data waits at the sender.
    Rts { peer: PeerIdx, send_id: u16 },
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Data { bytes, peer } => write!(f, "Data({} bytes of peer {peer})", bytes.len()),
            Held::Rts { peer, send_id } => write!(f, "Rts(peer {peer}, id {send_id})"),
        }
    }
}

impl<B: Backend> Messenger<B> {
    /// A message of `peer` whose `len` bytes are at `data` (a mailbox
    /// message or an eager slot, both ours until this returns). Inlined
    /// into each arrival's handler: a matched message's whole way to its
    /// completion is one function, the unexpected one's out of line.
    #[inline(always)]
    pub(crate) fn deliver(
        &mut self,
        peer: PeerIdx,
        src: Addr<B>,
        info: MatchInfo,
        len: usize,
        data: *const u8,
    ) {
        match self.matcher.match_arrival(&src, &info, len) {
            Some(placement) => {
                let copied = len.min(placement.capacity());
                // SAFETY: the placement's iov is a posted receive buffer,
                // valid until its completion; `data` holds `len` bytes.
                unsafe { scatter(&placement.iov, 0, data, copied) };
                self.complete_recv(placement, src, info, len, copied);
            }
            // SAFETY: `data` holds `len` bytes (see above).
            None => unsafe { self.hold_data(peer, src, info, len, data) },
        }
    }

    /// Queues a message no receive accepted, with a copy of its `len`
    /// bytes at `data`.
    ///
    /// # Safety
    /// `data` must hold `len` readable bytes.
    #[inline(never)]
    unsafe fn hold_data(
        &mut self,
        peer: PeerIdx,
        src: Addr<B>,
        info: MatchInfo,
        len: usize,
        data: *const u8,
    ) {
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
        self.hold_unexpected(peer, len);
        self.matcher.push_unexpected(Unexpected {
            src,
            info,
            len,
            body: Held::Data { bytes, peer },
            claimed_by: None,
        });
    }

    /// Counts `len` bytes of `peer`'s held as unexpected; past the limit,
    /// asks it to throttle. Data it sent before hearing it still comes,
    /// so the excess is bounded by what it can have in flight (its eager
    /// credits and mailbox messages).
    fn hold_unexpected(&mut self, peer: PeerIdx, len: usize) {
        let state = &mut self.peers[peer];
        state.unexpected_held += len + UNEXPECTED_OVERHEAD;
        self.stats.unexpected_peak = self.stats.unexpected_peak.max(state.unexpected_held);
        if state.unexpected_held > self.cfg.unexpected_limit && !state.throttling {
            state.throttling = true;
            self.stats.throttles += 1;
            tracing::debug!(peer, held = state.unexpected_held, "throttling a sender");
            self.queue_control(peer, Wire::Throttle { on: true }.encode());
        }
    }

    /// A receive took (or a discard dropped) `len` held bytes of `peer`;
    /// below half the limit, it may send data again.
    fn release_unexpected(&mut self, peer: PeerIdx, len: usize) {
        let state = &mut self.peers[peer];
        state.unexpected_held = state
            .unexpected_held
            .saturating_sub(len + UNEXPECTED_OVERHEAD);
        if state.throttling && state.unexpected_held <= self.cfg.unexpected_limit / 2 {
            state.throttling = false;
            self.queue_control(peer, Wire::Throttle { on: false }.encode());
        }
    }

    /// Posts a receive; it may complete at once from unexpected messages.
    ///
    /// # Safety
    /// `recv.iov` must stay valid until the receive completes.
    pub unsafe fn post_recv(&mut self, tagged: bool, recv: PostedRecv<Addr<B>>) {
        let peer = recv.src.and_then(|src| self.known_peer(&src));
        // SAFETY: forwarded from the caller.
        unsafe { self.post_recv_with(tagged, recv, peer) }
    }

    /// [`Self::post_recv`] of a receive from `peer` only (its `src` is the
    /// peer's address), with the lookup of the source done once before.
    ///
    /// # Safety
    /// As for [`Self::post_recv`].
    #[inline]
    pub unsafe fn post_recv_from(
        &mut self,
        tagged: bool,
        mut recv: PostedRecv<Addr<B>>,
        peer: KnownPeer,
    ) {
        let known = &self.peers[peer.0];
        recv.src = Some(known.addr);
        // Read now: posting does not change it.
        let dead = known.dead;
        let (context, multi) = (recv.context, recv.multi_recv);
        let Some(first) = self.matcher.post(tagged, recv) else {
            if dead {
                // Nothing it could match is left from that peer.
                self.fail_receives_from(peer.0);
            }
            return;
        };
        self.take_unexpected_posted(context, multi, first);
    }

    /// Posts `recv`; `peer` is the known peer of its source, if any.
    ///
    /// # Safety
    /// As for [`Self::post_recv`].
    #[inline]
    unsafe fn post_recv_with(
        &mut self,
        tagged: bool,
        recv: PostedRecv<Addr<B>>,
        peer: Option<PeerIdx>,
    ) {
        let (context, multi, src) = (recv.context, recv.multi_recv, recv.src);
        let Some(first) = self.matcher.post(tagged, recv) else {
            // Queued. Nothing to do unless a peer is gone, or was never
            // heard of (looked at out of line).
            match (src, peer) {
                (Some(_), Some(peer)) if !self.peers[peer].dead => {}
                (None, _) if !self.alone => {}
                _ => self.queued_for_the_lost(src, peer),
            }
            return;
        };
        self.take_unexpected_posted(context, multi, first);
    }

    /// A receive just queued from `src` (`peer` its known peer, if any),
    /// which may wait for a peer that is gone.
    #[cold]
    fn queued_for_the_lost(&mut self, src: Option<Addr<B>>, peer: Option<PeerIdx>) {
        // A directed receive at a peer we never heard of looks it up now,
        // so that the peer check watches it (it may have died before
        // sending anything).
        let peer = match (src, peer) {
            (Some(_), Some(peer)) => Some(peer),
            (Some(src), None) => self.watch_peer(src),
            (None, _) => {
                // Alone: a newcomer's first messages may wait in the mailbox.
                self.take_in_mailbox();
                if self.alone {
                    // Nobody is left who could send it anything.
                    self.fail_receives_from_anyone();
                }
                return;
            }
        };
        if let Some(peer) = peer.filter(|&p| self.peers[p].dead) {
            // Nothing it could match is left from that peer.
            self.fail_receives_from(peer);
        }
    }

    /// A receive just posted took `first` of the unexpected messages; a
    /// multi-receive buffer takes more while it has room.
    #[inline(never)]
    fn take_unexpected_posted(
        &mut self,
        context: usize,
        multi: bool,
        first: (Placement, Unexpected<Addr<B>, Held>),
    ) {
        let mut next = Some(first);
        while let Some((placement, message)) = next {
            self.take_unexpected(placement, message);
            next = if multi {
                self.matcher.repost_multi(context)
            } else {
                None
            };
        }
    }

    pub(crate) fn take_unexpected(
        &mut self,
        placement: Placement,
        message: Unexpected<Addr<B>, Held>,
    ) {
        match message.body {
            Held::Data { bytes, peer } => {
                self.release_unexpected(peer, bytes.len());
                let copied = bytes.len().min(placement.capacity());
                // SAFETY: the placement's iov is a posted receive buffer.
                unsafe { scatter(&placement.iov, 0, bytes.as_ptr(), copied) };
                self.complete_recv(placement, message.src, message.info, message.len, copied);
            }
            // Matched by a post: granted, the sender copies (it waits;
            // the caller of the post goes on).
            Held::Rts { peer, send_id } => self.start_rx_xfer(
                peer,
                message.src,
                (send_id, None),
                message.info,
                message.len,
                placement,
            ),
        }
    }

    /// `FI_PEEK` (with `claim`, `FI_CLAIM` too; with `discard`, drops the
    /// message): reports the first unexpected message `probe` accepts, or a
    /// `NoMessage` error.
    pub fn peek(&mut self, tagged: bool, probe: PostedRecv<Addr<B>>, claim: bool, discard: bool) {
        let found = self
            .matcher
            .peek(tagged, &probe, claim && !discard)
            .map(|u| (u.src, u.info, u.len));
        let Some((src, info, len)) = found else {
            self.events.push_back(Event::Error(OpError {
                context: probe.context,
                kind: ErrorKind::NoMessage,
                send: false,
                tagged,
                buf: 0,
                len: 0,
                olen: 0,
                tag: probe.tag,
                data: None,
                src: None,
                multi_released: false,
            }));
            return;
        };
        if discard {
            let _ = self.matcher.peek(tagged, &probe, true);
            if let Some(message) = self.matcher.take_claimed(tagged, probe.context) {
                self.discard(message);
            }
        }
        self.report_without_data(probe.context, true, tagged, src, info, len);
    }

    /// The completion of a receive that moved no data (a peek's answer, a
    /// discarded message): what it found, with no buffer.
    fn report_without_data(
        &mut self,
        context: usize,
        completion: bool,
        tagged: bool,
        src: Addr<B>,
        info: MatchInfo,
        len: usize,
    ) {
        self.events.push_back(Event::Recv(RecvDone {
            context,
            completion,
            tagged,
            buf: 0,
            len,
            tag: info.tag.unwrap_or(0),
            data: info.data,
            src,
            multi_released: false,
            multi: false,
        }));
    }

    /// `FI_CLAIM`: receives the message an earlier peek claimed for this
    /// context (or drops it with `discard`). False if there is none.
    ///
    /// # Safety
    /// As for [`Self::post_recv`].
    pub unsafe fn claim(&mut self, tagged: bool, recv: PostedRecv<Addr<B>>, discard: bool) -> bool {
        let Some(message) = self.matcher.take_claimed(tagged, recv.context) else {
            return false;
        };
        if discard {
            let (src, info, len) = (message.src, message.info, message.len);
            self.discard(message);
            self.report_without_data(recv.context, recv.completion, tagged, src, info, len);
            return true;
        }
        let placement = Placement {
            context: recv.context,
            iov: recv.iov,
            completion: recv.completion,
            multi: None,
        };
        self.take_unexpected(placement, message);
        true
    }

    /// Drops an unexpected message; a rendezvous sender is told it is done.
    pub(crate) fn discard(&mut self, message: Unexpected<Addr<B>, Held>) {
        match message.body {
            Held::Rts { peer, send_id } => {
                self.queue_control(peer, Wire::Fin { send_id }.encode());
            }
            Held::Data { bytes, peer } => self.release_unexpected(peer, bytes.len()),
        }
    }

    /// `fi_cancel` of a posted receive. Returns whether one was found.
    pub fn cancel(&mut self, context: usize) -> bool {
        let Some(Cancelled {
            tagged,
            recv,
            released,
        }) = self.matcher.cancel(context)
        else {
            return false;
        };
        self.fail_posted(tagged, &recv, ErrorKind::Canceled, None, released);
        true
    }
}
