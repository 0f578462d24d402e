//! Manual progress: the provider moves data only inside the application's
//! calls. Reading a CQ or a counter progresses every endpoint bound to it,
//! so an application that only polls its receive CQ still gets its sends
//! delivered.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Something that advances its protocol when polled: an endpoint.
pub trait Progress: Send + Sync {
    fn progress(&self);
}

/// The endpoints bound to one CQ or counter.
#[derive(Default)]
pub struct ProgressList {
    members: Mutex<Vec<Weak<dyn Progress>>>,
}

impl ProgressList {
    pub fn add(&self, member: &Arc<dyn Progress>) {
        let mut members = self.members.lock();
        let weak = Arc::downgrade(member);
        if !members.iter().any(|m| m.ptr_eq(&weak)) {
            members.push(weak);
        }
    }

    pub fn remove(&self, member: &Arc<dyn Progress>) {
        let weak = Arc::downgrade(member);
        self.members.lock().retain(|m| !m.ptr_eq(&weak));
    }

    /// Progresses every live member. The list lock is not held meanwhile:
    /// an endpoint's progress writes completions into CQs, which may be
    /// polling this very list.
    pub fn run(&self) {
        let live: Vec<Arc<dyn Progress>> = {
            let mut members = self.members.lock();
            members.retain(|m| m.strong_count() > 0);
            members.iter().filter_map(Weak::upgrade).collect()
        };
        for member in live {
            member.progress();
        }
    }
}

impl std::fmt::Debug for ProgressList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProgressList({} members)", self.members.lock().len())
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
