//! Liveness: now and then a look whether known peers are still alive, and
//! what follows when one is not: every operation in flight with it fails,
//! receives only it could satisfy fail, and the domain's cached
//! registrations of its node are dropped.
//!
//! Owns: the peer-check clock (`calls_since_clock`, `next_peer_check`) and
//! `peers_lost`. Touches every queue and table that can name the dead peer.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use unimem_mailbox::shm::rate_limited;
use unimem_mailbox::{Error as MailboxError, Mailbox};

use super::peers::DataItem;
use super::{Addr, Backend, Messenger, PeerIdx};
use crate::ErrorKind;

/// Progress calls between two looks at the clock for the peer check: a
/// clock read on every call would cost the fast path.
pub(crate) const CALLS_PER_CLOCK_READ: u32 = 64;

impl<B: Backend> Messenger<B> {
    /// The peer is gone: everything in flight with it fails. What it sent
    /// before it went is taken in first: a peer that acknowledges our send
    /// and closes at once (MPI at its end) has its FIN in our mailbox, and
    /// that send must complete, not fail.
    pub(crate) fn fail_peer(&mut self, peer: PeerIdx) {
        if self.peers[peer].dead && self.peers[peer].route.is_none() {
            return;
        }
        if self.take_in_mailbox() && self.peers[peer].dead && self.peers[peer].route.is_none() {
            return;
        }
        let events_before = self.events.len();
        self.peers_lost += 1;
        let state = &mut self.peers[peer];
        state.dead = true;
        state.route = None;
        // Its ring's mapping, and its memory's through the direct path's
        // lane, are not held past its death.
        if let Some(ring) = state.tx.as_mut() {
            ring.lease = None;
        }
        state.lane = None;
        // Everything of it fails here: what it may still send (it can be
        // alive, when a transfer to it failed) must start nothing new,
        // which nothing would ever end (a transfer of a dead peer holds its
        // id for good).
        state.refused = true;
        state.control.clear();
        let queued: Vec<DataItem> = state.data.drain(..).collect();
        for item in queued {
            match item {
                DataItem::Inline { op, .. }
                | DataItem::Eager { op }
                | DataItem::Rts { op }
                | DataItem::RmaWrite { op, .. } => self.fail_send(op),
                // Its Rts or RmaWrite, just behind it, fails the send (a
                // part: its last part).
                DataItem::LenHigh { .. } | DataItem::Offer { .. } | DataItem::Part { .. } => {}
            }
        }
        for op in self.tx_ops.ids_where(|o| o.peer == peer) {
            self.fail_send(op);
        }
        self.peers[peer].rx_ids = 0;
        for id in self.rx_xfers.ids_where(|x| x.peer == peer) {
            let xfer = self.rx_xfers.remove(id).expect("listed above");
            // Its slot may be reused: it must not keep a place in the queue.
            self.deferred_grants.retain(|&d| d != id);
            self.release_staged(&xfer);
            self.fail_xfer(xfer, ErrorKind::PeerUnreachable);
        }
        let (theirs, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.rx_backlog)
            .into_iter()
            .partition(|x| x.peer == peer);
        self.rx_backlog = others.into();
        for xfer in theirs {
            self.fail_xfer(xfer, ErrorKind::PeerUnreachable);
        }
        self.fail_rma_with(peer);
        self.forget_atomics_of(peer);
        self.peers[peer].long_len = None;
        self.peers[peer].offer = None;
        self.fail_receives_from(peer);
        if let Some(node) = self.peers[peer].node {
            // For every messenger of the domain: the cache is shared.
            self.dma.invalidate_node(node);
        }
        let failed = self.events.len() - events_before;
        let addr = self.peers[peer].addr;
        if failed > 0 {
            tracing::warn!(%addr, failed, "peer is dead or unreachable: its operations failed");
        } else {
            // A peer that closed its endpoint and left, as at the end of a job.
            tracing::debug!(%addr, "peer is gone");
        }
    }

    /// Takes in every message waiting in the mailbox, unless a caller
    /// further up does it already (true if it did).
    pub(crate) fn take_in_mailbox(&mut self) -> bool {
        if self.draining {
            return false;
        }
        self.draining = true;
        while let Some((src, message)) = self.mbx.poll() {
            self.dispatch(src, &message);
        }
        self.draining = false;
        true
    }

    /// Fails the posted receives that only a dead `peer` could satisfy.
    pub(crate) fn fail_receives_from(&mut self, peer: PeerIdx) {
        let addr = self.peers[peer].addr;
        for (tagged, recv) in self.matcher.remove_posted_from(Some(&addr)) {
            self.fail_posted(tagged, &recv, ErrorKind::PeerUnreachable, Some(addr), false);
        }
    }

    /// Whether the peer at `addr` is lost to us: a known one dead, fenced,
    /// refused, or its transfers failed; one we never spoke to, gone (no
    /// endpoint behind the address, or its process dead: a look at its
    /// mailbox, for cold paths). A lookup that fails otherwise (out of
    /// file descriptors, say) is not taken for gone.
    pub fn lost(&mut self, addr: &Addr<B>) -> bool {
        match self.known_peer(addr) {
            Some(peer) => self.peers[peer].dead,
            None => matches!(
                self.mbx.connect(addr),
                Err(MailboxError::Dead | MailboxError::Invalid)
            ),
        }
    }

    /// Whether every peer we know (ourselves apart) is lost: `None` if we
    /// know none.
    pub fn known_peers_lost(&self) -> Option<bool> {
        let own = self.mbx.addr();
        let mut others = self.peers.iter().filter(|p| p.addr != own).peekable();
        others.peek()?;
        Some(others.all(|p| p.dead))
    }

    /// Whether the provider should look, now, whether anyone is left who
    /// could send to us (see [`Self::left_alone`]): set by the peer check
    /// while a receive from any source waits and no known peer lives
    /// (peers that never reached us, in the AV only, are not watched
    /// otherwise), taken by this call.
    #[inline]
    pub fn audience_check_due(&mut self) -> bool {
        std::mem::take(&mut self.audience_due)
    }

    /// No peer is left that could send to this endpoint: the provider
    /// found every address it could hear from lost (it knows the AV, the
    /// messenger does not). Receives from any source posted now or later
    /// fail with [`ErrorKind::PeerUnreachable`] instead of waiting for
    /// ever, until a peer that is not lost appears.
    pub fn left_alone(&mut self) {
        self.alone = true;
        self.fail_receives_from_anyone();
    }

    pub(crate) fn fail_receives_from_anyone(&mut self) {
        let removed = self.matcher.remove_posted_from(None);
        if !removed.is_empty() {
            static LAST: AtomicU64 = AtomicU64::new(0);
            let receives = removed.len();
            rate_limited(&LAST, || {
                tracing::warn!(
                    receives,
                    "every peer is dead or unreachable: receives from any source failed"
                )
            });
        }
        for (tagged, recv) in removed {
            self.fail_posted(tagged, &recv, ErrorKind::PeerUnreachable, None, false);
        }
    }

    /// Now and then, looks whether known peers are still alive. A receiver
    /// waiting on a sender that died hears nothing more from it: only this
    /// look ends its wait (a sender learns it from the mailbox).
    #[inline]
    pub(crate) fn check_peers(&mut self) {
        // Every call of an idle poll comes here: the count inline, the
        // clock and the look out of line.
        self.calls_since_clock += 1;
        if self.calls_since_clock >= CALLS_PER_CLOCK_READ {
            self.calls_since_clock = 0;
            self.check_peers_now();
        }
    }

    #[inline(never)]
    fn check_peers_now(&mut self) {
        let Some(interval) = self.cfg.peer_check else {
            return;
        };
        let now = Instant::now();
        if now < self.next_peer_check {
            return;
        }
        self.next_peer_check = now + interval;
        self.audience_due = !self.alone
            && self.known_peers_lost() != Some(false)
            && self.matcher.posted_from_anyone();
        for peer in 0..self.peers.len() {
            let alive = match &self.peers[peer].route {
                Some(route) => self.mbx.peer_alive(route),
                None => true,
            };
            if !alive {
                self.fail_peer(peer);
            }
        }
    }
}
