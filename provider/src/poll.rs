//! Poll sets (`fi_poll_open`): CQs and counters that one `fi_poll` call
//! progresses and checks, as prov/util's poll sets do.
//!
//! `fi_poll` runs the endpoints of each member's domain (manual progress,
//! as a read of the member would) and returns the fid contexts of the members with
//! something new: a CQ that is not empty (successes or errors), a counter
//! whose success or error count changed since the last `fi_poll`,
//! `fi_cntr_set` or `fi_cntr_add` (the checkpoint lives in the counter, see
//! cntr.rs). It returns 0 when nothing is ready, never blocks.
//!
//! Decisions:
//! - Members are CQs and counters of ours; anything else (EQs included, as
//!   in prov/util for application poll sets) is -FI_EINVAL.
//! - A member is held like a bound endpoint holds it: closing a CQ or
//!   counter still in a poll set fails with -FI_EBUSY instead of leaving
//!   the set with a dangling pointer. `fi_poll_del` lets it go.
//! - Adding a member twice is harmless (one entry); deleting a non-member
//!   is -FI_EINVAL. Flags of `fi_poll_add`/`fi_poll_del` are ignored, as
//!   in prov/util (none are defined).
//! - Poll sets are deprecated in libfabric 2.x but still in its API.

use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, FiObject, FidObject, ParentRef};
use crate::base::guard::ffi_guard;
use crate::cntr::{Cntr, CntrInner};
use crate::cq::{Cq, CqInner};
use crate::state::DomainState;

/// Our `struct fid_poll`.
pub type PollSet = FidObject<PollState>;

/// What a poll set holds.
pub struct PollState {
    /// Held, not read: the domain cannot close while the set is open.
    _domain: ParentRef<DomainState>,
    members: Mutex<Vec<Member>>,
}

enum Watched {
    Cq(ParentRef<CqInner>),
    Cntr(ParentRef<CntrInner>),
}

struct Member {
    /// The member's fid, as the application names it in `fi_poll_del`.
    fid: *const ffi::fid,
    /// Returned by `fi_poll` (the fid's context, read when it is added).
    context: *mut c_void,
    watched: Watched,
}

// SAFETY: `fid` and `context` are only compared and handed back to the
// application, never dereferenced after `fi_poll_add`; the member's state
// is reached through `watched`, which is Send + Sync.
unsafe impl Send for Member {}

impl Member {
    /// Progresses the member; true if it has something new.
    fn ready(&self) -> bool {
        match &self.watched {
            Watched::Cq(cq) => cq.poll_ready(),
            Watched::Cntr(cntr) => cntr.poll_changed(),
        }
    }
}

static POLL_FI_OPS: ffi::fi_ops = fid::fi_ops::<PollState>();

// SAFETY: fid_poll starts with its struct fid.
unsafe impl FiObject for PollState {
    type Fid = ffi::fid_poll;
    const CLASS: u32 = ffi::FI_CLASS_POLL;
    const KIND: &'static str = "poll set";
    const FI_OPS: &'static ffi::fi_ops = &POLL_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(set: &PollSet) -> Result<(), Error> {
        let n = set.inner.members.lock().len();
        if n > 0 {
            // fi_poll(3): nothing may be associated with a closing set.
            tracing::warn!("fi_close(poll): {n} CQ(s)/counter(s) still in the set");
            return Err(Error::EBUSY);
        }
        tracing::debug!("poll set {set:p} closed");
        Ok(())
    }
}

static POLL_OPS: ffi::fi_ops_poll = ffi::fi_ops_poll {
    size: size_of::<ffi::fi_ops_poll>(),
    poll: Some(poll_run),
    poll_add: Some(poll_add),
    poll_del: Some(poll_del),
};

/// `fi_poll_open` on one of our domains.
///
/// # Safety
/// `attr` must be NULL or a valid `fi_poll_attr`; `pollset` NULL or
/// writable.
pub unsafe fn open(
    domain: &Arc<DomainState>,
    attr: *mut ffi::fi_poll_attr,
    pollset: *mut *mut ffi::fid_poll,
) -> Result<(), Error> {
    if pollset.is_null() {
        tracing::warn!("fi_poll_open: NULL poll set pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL attr is a valid fi_poll_attr (caller).
    if let Some(a) = unsafe { attr.as_ref() } {
        if a.flags != 0 {
            tracing::warn!(
                "fi_poll_open: flags {:#x} are reserved (must be 0)",
                a.flags
            );
            return Err(Error::EINVAL);
        }
    }
    let obj = Box::new(PollSet {
        fid: ffi::fid_poll {
            fid: PollSet::header(std::ptr::null_mut()),
            ops: fid::ops_ptr(&POLL_OPS),
        },
        inner: Arc::new(PollState {
            _domain: ParentRef::new(domain),
            members: Mutex::new(Vec::new()),
        }),
    });
    // SAFETY: pollset is non-NULL (checked).
    let obj = unsafe { obj.install(pollset) };
    tracing::debug!("poll set {obj:p} opened");
    Ok(())
}

/// The state of our poll set behind `pollset`, or None (with a warning).
///
/// # Safety
/// `pollset` must be NULL or a live `struct fid_poll`.
unsafe fn poll_of<'a>(pollset: *mut ffi::fid_poll, op: &str) -> Option<&'a PollState> {
    // SAFETY: forwarded from the caller.
    unsafe { PollSet::from_ptr(pollset, op) }.map(|set| &*set.inner)
}

unsafe extern "C" fn poll_add(
    pollset: *mut ffi::fid_poll,
    event_fid: *mut ffi::fid,
    _flags: u64,
) -> c_int {
    ffi_guard("fi_poll_add", || {
        // SAFETY: fid_poll starts with its fid; it comes from the application.
        let Some(set) = (unsafe { poll_of(pollset, "fi_poll_add") }) else {
            return ret::EINVAL;
        };
        // SAFETY: event_fid is NULL or a live fid (application contract);
        // the lookups check class and ops table before using it.
        let watched = unsafe {
            if let Some(cq) = Cq::state_of(event_fid) {
                Watched::Cq(ParentRef::new(&cq))
            } else if let Some(cntr) = Cntr::state_of(event_fid) {
                Watched::Cntr(ParentRef::new(&cntr))
            } else {
                tracing::warn!("fi_poll_add: only unimem CQs and counters can be polled");
                return ret::EINVAL;
            }
        };
        let mut members = set.members.lock();
        if members.iter().any(|m| std::ptr::eq(m.fid, event_fid)) {
            return ret::SUCCESS;
        }
        members.push(Member {
            fid: event_fid,
            // SAFETY: event_fid is one of our live CQs or counters (checked above).
            context: unsafe { (*event_fid).context },
            watched,
        });
        ret::SUCCESS
    })
}

unsafe extern "C" fn poll_del(
    pollset: *mut ffi::fid_poll,
    event_fid: *mut ffi::fid,
    _flags: u64,
) -> c_int {
    ffi_guard("fi_poll_del", || {
        // SAFETY: fid_poll starts with its fid; it comes from the application.
        let Some(set) = (unsafe { poll_of(pollset, "fi_poll_del") }) else {
            return ret::EINVAL;
        };
        let mut members = set.members.lock();
        let before = members.len();
        members.retain(|m| !std::ptr::eq(m.fid, event_fid));
        if members.len() == before {
            tracing::warn!("fi_poll_del: {event_fid:p} is not in the poll set");
            return ret::EINVAL;
        }
        ret::SUCCESS
    })
}

unsafe extern "C" fn poll_run(
    pollset: *mut ffi::fid_poll,
    context: *mut *mut c_void,
    count: c_int,
) -> c_int {
    ffi_guard("fi_poll", || {
        // SAFETY: fid_poll starts with its fid; it comes from the application.
        let Some(set) = (unsafe { poll_of(pollset, "fi_poll") }) else {
            return ret::EINVAL;
        };
        let Ok(count) = usize::try_from(count) else {
            tracing::warn!("fi_poll: negative count {count}");
            return ret::EINVAL;
        };
        if count > 0 && context.is_null() {
            tracing::warn!("fi_poll: NULL context array");
            return ret::EINVAL;
        }
        let members = set.members.lock();
        let mut found = 0;
        // Every member is progressed (and its counter checkpoint moved on),
        // even once the array is full, as prov/util does.
        for m in members.iter() {
            if m.ready() && found < count {
                // SAFETY: context holds count > found entries (application contract).
                unsafe { *context.add(found) = m.context };
                found += 1;
            }
        }
        found as c_int
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::tests::{close, fabric_domain};
    use crate::cq::Completion;
    use crate::state::progress::Progress;
    use std::ptr;

    fn open_set(dom: *mut ffi::fid_domain) -> *mut ffi::fid_poll {
        let mut p: *mut ffi::fid_poll = ptr::null_mut();
        // SAFETY: dom is a live domain of ours; locals are live.
        let rc = unsafe { ((*(*dom).ops).poll_open.unwrap())(dom, ptr::null_mut(), &mut p) };
        assert_eq!(rc, 0);
        p
    }

    fn ops(p: *mut ffi::fid_poll) -> &'static ffi::fi_ops_poll {
        // SAFETY: p is a live poll set of ours.
        unsafe { &*(*p).ops }
    }

    fn poll(p: *mut ffi::fid_poll) -> Vec<usize> {
        let mut out = [ptr::null_mut::<c_void>(); 4];
        // SAFETY: p is live; out holds 4 entries.
        let n = unsafe { (ops(p).poll.unwrap())(p, out.as_mut_ptr(), 4) };
        assert!(n >= 0, "fi_poll: {n}");
        out[..n as usize].iter().map(|&c| c as usize).collect()
    }

    struct Counting(std::sync::atomic::AtomicUsize);
    impl Progress for Counting {
        fn progress(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn reports_ready_cqs_and_changed_counters_and_progresses_them() {
        let (fab, dom) = fabric_domain();
        let mut cq: *mut ffi::fid_cq = ptr::null_mut();
        let mut cntr: *mut ffi::fid_cntr = ptr::null_mut();
        let mut cq_attr = ffi::fi_cq_attr::default();
        // SAFETY: dom is a live domain; the out pointers are live locals;
        // the contexts are only handed back.
        unsafe {
            let d = &*(*dom).ops;
            assert_eq!(
                (d.cq_open.unwrap())(dom, &mut cq_attr, &mut cq, 11 as *mut c_void),
                0
            );
            assert_eq!(
                (d.cntr_open.unwrap())(dom, ptr::null_mut(), &mut cntr, 22 as *mut c_void),
                0
            );
        }
        let set = open_set(dom);
        // SAFETY: live objects of ours.
        let (cq_inner, cntr_inner) = unsafe {
            (
                Cq::state_of(cq as *const ffi::fid).unwrap(),
                Cntr::state_of(cntr as *const ffi::fid).unwrap(),
            )
        };
        let ep = Arc::new(Counting(Default::default()));
        let ep_dyn: Arc<dyn Progress> = ep.clone();
        cq_inner.progress().add(&ep_dyn);
        // SAFETY: live objects of ours.
        unsafe {
            let add = ops(set).poll_add.unwrap();
            assert_eq!(add(set, cq as *mut ffi::fid, 0), 0);
            assert_eq!(add(set, cq as *mut ffi::fid, 0), 0, "twice is harmless");
            assert_eq!(add(set, cntr as *mut ffi::fid, 0), 0);
            assert_eq!(add(set, set as *mut ffi::fid, 0), ret::EINVAL);
        }
        assert!(poll(set).is_empty());
        assert!(
            ep.0.load(std::sync::atomic::Ordering::Relaxed) >= 1,
            "fi_poll progresses"
        );

        cq_inner.write(Completion::new(ptr::null_mut(), ffi::FI_SEND));
        cntr_inner.inc();
        assert_eq!(poll(set), vec![11, 22]);
        // The CQ stays ready until read; the counter reported its change once.
        assert_eq!(poll(set), vec![11]);
        cntr_inner.inc_err();
        assert_eq!(poll(set), vec![11, 22]);
        // SAFETY: live counter of ours.
        unsafe {
            let c = &*(*cntr).ops;
            assert_eq!((c.add.unwrap())(cntr, 5), 0);
        }
        assert_eq!(poll(set), vec![11], "the application's own add is no event");

        // Members cannot close under the set; the set cannot close with members.
        // SAFETY: live objects of ours, closed once each.
        unsafe {
            assert_eq!(close(cq as *mut ffi::fid), ret::EBUSY);
            assert_eq!(close(set as *mut ffi::fid), ret::EBUSY);
            let del = ops(set).poll_del.unwrap();
            assert_eq!(del(set, cq as *mut ffi::fid, 0), 0);
            assert_eq!(del(set, cq as *mut ffi::fid, 0), ret::EINVAL);
            assert_eq!(del(set, cntr as *mut ffi::fid, 0), 0);
            assert_eq!(close(set as *mut ffi::fid), 0);
            assert_eq!(close(cq as *mut ffi::fid), 0);
            assert_eq!(close(cntr as *mut ffi::fid), 0);
        }
        // Our own references keep the domain busy too.
        drop((cq_inner, cntr_inner));
        // SAFETY: live objects of ours, closed once each.
        unsafe {
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }
}
