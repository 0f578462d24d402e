//! Manual progress: the provider moves data only inside the application's
//! calls. Reading a CQ or a counter progresses every endpoint bound to it,
//! so an application that only polls its receive CQ still gets its sends
//! delivered.

use std::sync::{Arc, Weak};

use parking_lot::RwLock;

/// Something that advances its protocol when polled: an endpoint.
pub trait Progress: Send + Sync {
    fn progress(&self);
}

/// The endpoints bound to one CQ or counter.
#[derive(Default)]
pub struct ProgressList {
    members: RwLock<Vec<Weak<dyn Progress>>>,
}

impl ProgressList {
    pub fn add(&self, member: &Arc<dyn Progress>) {
        let mut members = self.members.write();
        let weak = Arc::downgrade(member);
        if !members.iter().any(|m| m.ptr_eq(&weak)) {
            members.push(weak);
        }
    }

    pub fn remove(&self, member: &Arc<dyn Progress>) {
        let weak = Arc::downgrade(member);
        self.members.write().retain(|m| !m.ptr_eq(&weak));
    }

    /// Progresses every live member, under the read lock: this runs on
    /// every CQ and counter read, so it must not allocate. Progress never
    /// comes back to this list (it writes CQ entries, which have locks of
    /// their own), and binding or closing, the writers, only wait.
    pub fn run(&self) {
        for member in self.members.read().iter() {
            if let Some(member) = member.upgrade() {
                member.progress();
            }
        }
    }
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
    fn runs_live_members_once_each() {
        let list = ProgressList::default();
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
