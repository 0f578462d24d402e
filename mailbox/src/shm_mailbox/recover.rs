//! How the receiver passes a head slot it must not wait for: a state word
//! no sound sender writes (a peer wrote into the ring), or a claim whose
//! sender died in the middle of its send.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ring::{state, state_pid, FREE};
use super::ShmMailbox;
use crate::node::monotonic_ns;
use crate::shm::rate_limited;

/// How long a slot may stay claimed before the receiver asks whether its
/// sender is still alive.
pub(super) const CLAIM_STALL_NS: u64 = 10_000_000;

impl ShmMailbox {
    /// Passes over the head slot, whose state word a peer corrupted: no
    /// sound sender wrote it, so there is no message to wait for.
    #[cold]
    pub(super) fn skip_corrupt(&mut self, word: u64) {
        let slot = self.ring.slot(self.head);
        let next = state(self.head.wrapping_add(self.ring.depth()), FREE, 0);
        // Only if it still holds what we judged; else look again.
        if slot
            .state
            .compare_exchange(word, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            static LAST: AtomicU64 = AtomicU64::new(0);
            let head = self.head;
            rate_limited(&LAST, || {
                tracing::warn!(
                    mailbox = %self.addr,
                    slot = head & self.ring.mask,
                    word = format_args!("{word:#018x}"),
                    "skipped a corrupted mailbox slot (a peer wrote into the ring)"
                )
            });
            self.head = self.head.wrapping_add(1);
            self.corrupt += 1;
            self.stalled_since = None;
            self.claimed_polls = 0;
        }
    }

    /// A claimed head slot whose sender has been at it for a long time:
    /// skip it if that sender is dead, so that later messages flow.
    pub(super) fn check_stalled_claim(&mut self, word: u64) -> bool {
        // Usually the sender is just between its claim and its store: only
        // a long run of such polls is worth reading the clock.
        self.claimed_polls = self.claimed_polls.wrapping_add(1);
        if !self.claimed_polls.is_multiple_of(1024) {
            return false;
        }
        let now = monotonic_ns();
        match self.stalled_since {
            Some((pos, since)) if pos == self.head => {
                if now - since < CLAIM_STALL_NS {
                    return false;
                }
            }
            _ => {
                self.stalled_since = Some((self.head, now));
                return false;
            }
        }
        self.stalled_since = Some((self.head, now));
        // SAFETY: kill with signal 0 only checks that the pid exists.
        let alive = unsafe { libc::kill(state_pid(word) as libc::pid_t, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if alive {
            return false;
        }
        let slot = self.ring.slot(self.head);
        let next = state(self.head.wrapping_add(self.ring.depth()), FREE, 0);
        if slot
            .state
            .compare_exchange(word, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                pid = state_pid(word),
                "skipped a message slot of a sender that died mid-send"
            );
            self.head = self.head.wrapping_add(1);
            self.abandoned += 1;
            self.stalled_since = None;
            return true;
        }
        false
    }
}
