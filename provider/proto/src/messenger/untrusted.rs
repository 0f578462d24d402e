//! Untrusted peers: a message that does not fit what its peer may send is
//! dropped with a rate-limited warning and counted against that peer,
//! which is fenced after [`FENCE_AFTER`] of them (cut off, and told); a
//! peer whose first contact does not fit ours is refused (cut off, not
//! told); a peer that cut us off fails as a dead one.
//!
//! Owns: `dropped`, and each peer's `violations` and `refused`.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use unimem_mailbox::shm::rate_limited;
use unimem_mailbox::Mailbox;

use super::{Backend, Messenger, PeerIdx};
use crate::wire::Wire;

/// Invalid messages of one peer after which it is fenced: its operations
/// fail as if it were dead, and its messages are dropped. One stray
/// message is a bug worth a warning; this many, a peer not to trust.
pub(crate) const FENCE_AFTER: u32 = 16;

/// Peer messages dropped as invalid, warned about at most once a second.
#[derive(Debug, Default)]
pub(crate) struct DroppedMessages {
    total: u64,
    since_warning: u64,
    last_warning: Option<Instant>,
}

impl<B: Backend> Messenger<B> {
    /// How many peer messages were dropped as invalid so far.
    pub fn dropped_messages(&self) -> u64 {
        self.dropped.total
    }

    /// Drops a message of `peer` that does not fit what it may send
    /// (`what` says which), with a rate-limited warning: a broken or
    /// hostile peer must not flood the log, nor be acted upon.
    ///
    /// Each drop counts against the peer: after [`FENCE_AFTER`] of them it
    /// is fenced (progress, [`Self::dispatch`]).
    pub(crate) fn drop_invalid(&mut self, peer: PeerIdx, what: &str) {
        if let Some(state) = self.peers.get_mut(peer) {
            state.violations = state.violations.saturating_add(1);
        }
        let dropped = &mut self.dropped;
        dropped.total += 1;
        dropped.since_warning += 1;
        let now = Instant::now();
        if dropped
            .last_warning
            .is_some_and(|last| now.duration_since(last).as_secs() < 1)
        {
            return;
        }
        let addr = self.peers.get(peer).map(|p| p.addr);
        let count = std::mem::take(&mut dropped.since_warning);
        dropped.last_warning = Some(now);
        match addr {
            Some(addr) => tracing::warn!(%addr, count, "dropped invalid peer message(s): {what}"),
            None => tracing::warn!(count, "dropped invalid peer message(s): {what}"),
        }
    }

    /// Refuses `peer`, whose `what` is `theirs` where ours is `ours`: one
    /// log line naming both, then it is dead to us (its operations fail
    /// with an error, its messages are dropped).
    pub(crate) fn refuse_peer(&mut self, peer: PeerIdx, what: &str, ours: u64, theirs: u64) {
        let addr = self.peers[peer].addr;
        // One line per peer, but a process can open new peers at will.
        static LAST: AtomicU64 = AtomicU64::new(0);
        rate_limited(
            &LAST,
            || tracing::warn!(%addr, "peer refused: its {what} is {theirs}, ours {ours}"),
        );
        // Not told: a peer of another version would misread the `Cut`,
        // and one of ours refuses us too, by the same checks.
        self.cut_off(peer);
    }

    /// Cuts `peer` off: it counts as dead, and its messages are dropped.
    /// It may be alive and innocent (another process broke its memory),
    /// so it is told, once and best effort (a full mailbox drops it): its
    /// operations with us then fail instead of waiting for us.
    pub(crate) fn fence(&mut self, peer: PeerIdx) {
        if !self.peers[peer].refused {
            if let Some(route) = &self.peers[peer].route {
                let _ = self.mbx.send(route, &Wire::Cut.encode());
            }
        }
        self.cut_off(peer);
    }

    /// `peer` counts as dead, and its messages are dropped.
    fn cut_off(&mut self, peer: PeerIdx) {
        self.peers[peer].refused = true;
        self.fail_peer(peer);
    }

    /// `peer` cut us off: it drops what we send, so everything with it
    /// fails now, as with a dead peer.
    pub(crate) fn on_cut(&mut self, peer: PeerIdx) {
        let addr = self.peers[peer].addr;
        static LAST: AtomicU64 = AtomicU64::new(0);
        rate_limited(
            &LAST,
            || tracing::warn!(%addr, "a peer cut us off (it found our messages or memory invalid): operations with it fail"),
        );
        self.fail_peer(peer);
    }
}
