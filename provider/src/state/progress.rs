//! Manual progress: the provider moves data only inside the application's
//! calls. A domain keeps one list of its enabled endpoints, and reading any
//! of its CQs or counters progresses them all, as prov/tcp's per-domain
//! progress does: an application that only polls its receive CQ still gets
//! its sends delivered, and there is one place that drives the domain.

use std::sync::Arc;

use unimem_mailbox::doorbell::Doorbell;

use crate::base::lock::{DomainRwLock, Locking};

/// Something that advances its protocol when polled: an endpoint.
pub trait Progress: Send + Sync {
    /// The application's progress (a CQ or counter read, a blocking wait):
    /// takes the endpoint's lock, waiting for it if need be.
    fn progress(&self);

    /// The progress agent's, while it holds the provider (no application
    /// call is in it, `base/handover.rs`). Returns what is left.
    fn progress_for_agent(&self) -> Pending {
        Pending::default()
    }

    /// What is left, without progressing (a look under the lock).
    fn pending(&self) -> Pending {
        Pending::default()
    }

    /// The doorbell of its mailbox, if it rings when a message comes.
    fn doorbell(&self) -> Option<&Doorbell> {
        None
    }

    /// What it has in flight, for a report when nothing moves (None:
    /// nothing).
    fn in_flight(&self) -> Option<String> {
        None
    }
}

/// What an endpoint still has to do, for a thread deciding how long it
/// may sleep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// A message waits in its mailbox.
    pub message: bool,
    /// Work that no message will announce: DMA completions to reap,
    /// queued sends, deferred grants and reads (look again soon).
    pub local_work: bool,
    /// Operations in flight that wait for peers (a message will come, or
    /// the peer's death must be noticed: look again now and then).
    pub busy: bool,
}

impl std::ops::BitOrAssign for Pending {
    fn bitor_assign(&mut self, other: Pending) {
        self.message |= other.message;
        self.local_work |= other.local_work;
        self.busy |= other.busy;
    }
}

/// The enabled endpoints of one domain.
pub struct ProgressList {
    /// Strong references, so that a read pays no upgrade: an endpoint
    /// removes itself when it closes, which breaks the cycle through the
    /// CQ or counter it holds. Under `FI_THREAD_DOMAIN` the lock is elided.
    members: DomainRwLock<Vec<Arc<dyn Progress>>>,
}

impl ProgressList {
    pub fn new(locking: Locking) -> Self {
        ProgressList {
            members: DomainRwLock::new(Vec::new(), locking),
        }
    }

    pub fn add(&self, member: &Arc<dyn Progress>) {
        let mut members = self.members.write();
        if !members.iter().any(|m| same(m, member)) {
            members.push(Arc::clone(member));
        }
    }

    pub fn remove(&self, member: &Arc<dyn Progress>) {
        self.members.write().retain(|m| !same(m, member));
    }

    /// Progresses every live member, under the read lock: this runs on
    /// every CQ and counter read, so it must not allocate. Progress never
    /// comes back to this list (it writes CQ entries, which have locks of
    /// their own), and binding or closing, the writers, only wait.
    pub fn run(&self) {
        for member in self.members.read().iter() {
            member.progress();
        }
    }

    /// The members as they are now (a blocking wait, which must not hold
    /// the list while it sleeps).
    pub fn members(&self) -> Vec<Arc<dyn Progress>> {
        self.members.read().clone()
    }
}

/// Same object: compares the data pointers only (vtable pointers of one
/// type may differ between codegen units).
pub(crate) fn same(a: &Arc<dyn Progress>, b: &Arc<dyn Progress>) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

impl std::fmt::Debug for ProgressList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProgressList({} members)", self.members.read().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);

    impl Progress for Counter {
        fn progress(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn runs_each_member_once() {
        let list = ProgressList::new(Locking::Locked);
        let a = Arc::new(Counter(AtomicUsize::new(0)));
        let a_dyn: Arc<dyn Progress> = a.clone();
        list.add(&a_dyn);
        list.add(&a_dyn);
        {
            let b: Arc<dyn Progress> = Arc::new(Counter(AtomicUsize::new(0)));
            list.add(&b);
        }
        list.run();
        assert_eq!(a.0.load(Ordering::Relaxed), 1);
        list.remove(&a_dyn);
        list.run();
        assert_eq!(a.0.load(Ordering::Relaxed), 1);
    }
}
