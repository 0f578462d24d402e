//! Completion counters (`fi_cntr_open`): a success and an error count that
//! endpoints bump ([`CntrInner::inc`], [`CntrInner::inc_err`]) and the
//! application reads, sets, adds to and waits on.
//!
//! Manual progress, as for CQs: reads and waits first run the endpoints
//! of the counter's domain. `fi_cntr_wait` polls, then, on a counter with
//! a wait object, sleeps on the endpoints' doorbells as `fi_cq_sread` does
//! (see wait.rs), and, like prov/util, returns -FI_EAVAIL as soon as the
//! error count changes while it waits and -FI_ETIMEDOUT when the time is
//! up.

use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, Children, Control, FiObject, FidObject, Parent, ParentRef};
use crate::base::guard::{ffi_guard, ffi_guard_or};
use crate::state::progress::ProgressList;
use crate::state::DomainState;
use crate::wait::{self, Backoff, Deadline, Sleepers};

/// 2.x `FI_CNTR_EVENTS_BYTES` (absent from the 1.17 headers): counting
/// bytes instead of completions is not supported.
const FI_CNTR_EVENTS_BYTES: ffi::fi_cntr_events = 1;

/// One read or wait in this many progresses even when its count needs no
/// progress (see `CntrInner::skip_progress`).
const SKIPS_PER_PROGRESS: u32 = 16;

/// Our `struct fid_cntr`.
pub type Cntr = FidObject<CntrInner>;

/// State shared with the endpoints bound to the counter.
#[derive(Debug)]
pub struct CntrInner {
    domain: ParentRef<DomainState>,
    wait_obj: ffi::fi_wait_obj,
    spin_yield: usize,
    wait_spin_us: usize,
    count: AtomicU64,
    errors: AtomicU64,
    /// The count the last `fi_cntr_read` returned (see `cntr_read`).
    last_read: AtomicU64,
    /// Reads and waits served without progress since the last one that
    /// progressed (see [`Self::skip_progress`]).
    unprogressed: AtomicU32,
    /// (count, errors) as `fi_poll` last saw them, or as the application
    /// last set or added to them: `fi_poll` reports changes since then.
    checkpoint: Mutex<(u64, u64)>,
    /// Waits asleep (`fi_cntr_wait` with a wait object): a count the
    /// progress agent bumped wakes them.
    sleepers: Sleepers,
    /// Endpoints bound to this counter.
    children: Children,
}

impl Parent for CntrInner {
    fn children(&self) -> &Children {
        &self.children
    }
}

impl CntrInner {
    /// One more successful operation.
    pub fn inc(&self) {
        self.add_successes(1);
    }

    /// `n` more successful operations (accesses a peer told of at once).
    pub fn add_successes(&self, n: u64) {
        self.count.fetch_add(n, Ordering::AcqRel);
        self.sleepers.wake(self.domain.has_agent());
    }

    /// One more failed operation.
    pub fn inc_err(&self) {
        self.errors.fetch_add(1, Ordering::AcqRel);
        self.sleepers.wake(self.domain.has_agent());
    }

    /// Whether it has a wait object (`fi_cntr_wait` sleeps on the doorbells
    /// of its endpoints' mailboxes).
    pub fn blocks(&self) -> bool {
        self.wait_obj != ffi::FI_WAIT_NONE
    }

    /// The endpoints a read of this counter progresses: its domain's.
    pub fn progress(&self) -> &ProgressList {
        self.domain.progress()
    }

    /// The domain the counter belongs to (endpoints must share it).
    pub fn domain(&self) -> &DomainState {
        &self.domain
    }

    /// `fi_cntr_read`: the count, progressing first only if it has not
    /// moved since the last read. A waiting application (the count stands
    /// still) drives progress on every read; one whose operations completed
    /// inside their posting calls (one-sided DMA) gets the new count at
    /// the price of a load, as MPI's flush reads it right after its puts.
    pub fn read_progressing(&self) -> u64 {
        let now = self.value();
        if self.last_read.swap(now, Ordering::Relaxed) != now && self.skip_progress() {
            return now;
        }
        self.progress().run();
        let now = self.value();
        self.last_read.store(now, Ordering::Relaxed);
        now
    }

    /// Whether a read or wait that needs no progress for itself may skip
    /// it: not every time. A process whose threads only post operations
    /// that complete inside the call and read counters they met (OpenSHMEM
    /// spinning on a lock held by a peer) must still serve the peers that
    /// wait on it: one such call in 16 progresses. (Neither the agent, kept
    /// out while a thread is inside the provider, nor the peers can.)
    fn skip_progress(&self) -> bool {
        self.unprogressed.fetch_add(1, Ordering::Relaxed) % SKIPS_PER_PROGRESS
            != SKIPS_PER_PROGRESS - 1
    }

    /// Current success count, without progress.
    pub fn value(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Current error count, without progress.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Acquire)
    }

    /// `fi_poll`: progress, then whether either count changed since the
    /// checkpoint, which moves on.
    pub fn poll_changed(&self) -> bool {
        self.progress().run();
        let now = (self.value(), self.errors());
        let mut seen = self.checkpoint.lock();
        std::mem::replace(&mut *seen, now) != now
    }

    /// The application changed the success count itself: not an event.
    fn checkpoint_count(&self) {
        self.checkpoint.lock().0 = self.value();
    }

    /// Same for the error count.
    fn checkpoint_errors(&self) {
        self.checkpoint.lock().1 = self.errors();
    }

    /// A wait that has lasted [`crate::wait::STALL_NS`]: what the domain's
    /// endpoints wait for, at info level (as a CQ's stalled reads say it).
    #[cold]
    fn report_stall(&self, threshold: u64) {
        let secs = crate::wait::STALL_NS / 1_000_000_000;
        tracing::info!(
            "counter {:p}: at {} of {threshold} for {secs} s in fi_cntr_wait",
            self,
            self.value()
        );
        for (i, member) in self.progress().members().iter().enumerate() {
            if let Some(what) = member.in_flight() {
                tracing::info!(
                    "counter {:p}: endpoint {i} of its domain has in flight: {what}",
                    self
                );
            }
        }
    }

    /// `fi_cntr_wait`.
    fn wait(&self, threshold: u64, timeout: c_int) -> Result<(), Error> {
        // Met before any progress: operations done inside their call (the
        // direct path) leave nothing to progress, and OpenSHMEM's quiet
        // waits on its counter after each of them (twice: puts and gets),
        // so this return reads no clock.
        if self.value() >= threshold && self.skip_progress() {
            return Ok(());
        }
        let errors = self.errors();
        let deadline = Deadline::after_ms(timeout);
        let mut backoff = Backoff::for_wait(self.spin_yield, self.wait_spin_us);
        let stall = Deadline::after_ms((crate::wait::STALL_NS / 1_000_000) as c_int);
        let mut reported = false;
        loop {
            self.progress().run();
            if self.value() >= threshold {
                return Ok(());
            }
            if self.errors() != errors {
                return Err(Error::EAVAIL);
            }
            if deadline.expired() {
                return Err(Error::ETIMEDOUT);
            }
            if !reported && stall.expired() {
                reported = true;
                self.report_stall(threshold);
            }
            let ready = || self.value() >= threshold || self.errors() != errors;
            if backoff.spinning()
                || !self.blocks()
                || !self.sleepers.sleep(self.progress(), ready, &deadline)
            {
                backoff.snooze();
            }
        }
    }
}

static CNTR_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    control: Some(fid::control::<CntrInner>),
    ..fid::fi_ops::<CntrInner>()
};

// SAFETY: fid_cntr starts with its struct fid.
unsafe impl FiObject for CntrInner {
    type Fid = ffi::fid_cntr;
    const CLASS: u32 = ffi::FI_CLASS_CNTR;
    const KIND: &'static str = "counter";
    const FI_OPS: &'static ffi::fi_ops = &CNTR_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(cntr: &Cntr) -> Result<(), Error> {
        if let Err(n) = fid::check_no_children(cntr.inner.children()) {
            tracing::warn!("fi_close(cntr): still bound to {n} endpoint(s) or poll set(s)");
            return Err(Error::EBUSY);
        }
        // Dropping it releases the domain.
        tracing::debug!("cntr {cntr:p} closed");
        Ok(())
    }
}

impl Control for CntrInner {
    unsafe fn control(cntr: &Cntr, command: c_int, arg: *mut c_void) -> Result<(), Error> {
        let warn = |why| tracing::warn!("fi_control(cntr, {command}): {why}");
        // SAFETY: arg is what the command expects (caller).
        unsafe { wait::polled_control(cntr.inner.wait_obj, command, arg, warn) }
    }
}

static CNTR_OPS: ffi::fi_ops_cntr = ffi::fi_ops_cntr {
    size: size_of::<ffi::fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
};

fn check_attr(a: &ffi::fi_cntr_attr) -> Result<(), Error> {
    match a.events {
        ffi::FI_CNTR_EVENTS_COMP => {}
        FI_CNTR_EVENTS_BYTES => {
            tracing::warn!("fi_cntr_open: FI_CNTR_EVENTS_BYTES not supported");
            return Err(Error::ENOSYS);
        }
        other => {
            tracing::warn!("fi_cntr_open: unknown events {other}");
            return Err(Error::EINVAL);
        }
    }
    wait::check_polled(a.wait_obj).map_err(|r| {
        tracing::warn!("fi_cntr_open: wait object {}: {}", a.wait_obj, r.reason);
        r.code
    })?;
    if a.flags != 0 {
        tracing::warn!("fi_cntr_open: unsupported flags {:#x}", a.flags);
        return Err(Error::EINVAL);
    }
    Ok(())
}

/// `fi_cntr_open` on one of our domains. A NULL `attr` means the defaults
/// (completion events, no wait object).
///
/// # Safety
/// `attr` must be NULL or a valid `fi_cntr_attr`; `cntr` NULL or writable.
pub unsafe fn open(
    domain: &Arc<DomainState>,
    attr: *mut ffi::fi_cntr_attr,
    cntr: *mut *mut ffi::fid_cntr,
    context: *mut c_void,
) -> Result<(), Error> {
    if cntr.is_null() {
        tracing::warn!("fi_cntr_open: NULL counter pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL attr is a valid fi_cntr_attr (caller).
    let a = unsafe { attr.as_ref() }.copied().unwrap_or_default();
    check_attr(&a)?;
    let obj = Box::new(Cntr {
        fid: ffi::fid_cntr {
            fid: Cntr::header(context),
            ops: fid::ops_ptr(&CNTR_OPS),
        },
        inner: Arc::new(CntrInner {
            domain: ParentRef::new(domain),
            wait_obj: a.wait_obj,
            spin_yield: domain.config().spin_yield,
            wait_spin_us: domain.config().wait_spin_us,
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            last_read: AtomicU64::new(0),
            unprogressed: AtomicU32::new(0),
            checkpoint: Mutex::new((0, 0)),
            sleepers: Sleepers::new(),
            children: Children::default(),
        }),
    });
    // SAFETY: cntr is non-NULL (checked).
    let obj = unsafe { obj.install(cntr) };
    tracing::debug!("cntr {obj:p} opened");
    Ok(())
}

/// `fi_trywait` on `fid`: None if it is not our counter; otherwise 0 (a
/// counter has no "ready" state of its own to report).
///
/// # Safety
/// `fid` must be NULL or a live `struct fid`.
pub unsafe fn trywait(fid: *const ffi::fid) -> Option<c_int> {
    // SAFETY: guaranteed by the caller.
    let cntr = unsafe { Cntr::find(fid) }?;
    cntr.inner.progress().run();
    Some(ret::SUCCESS)
}

/// Run `f` on our counter behind `cntr` (`fi_cntr_add`, `_set`, ...).
///
/// # Safety
/// `cntr` must be NULL or a live `struct fid_cntr`.
unsafe fn with_cntr(
    op: &'static str,
    cntr: *mut ffi::fid_cntr,
    f: impl FnOnce(&CntrInner) -> Result<(), Error>,
) -> c_int {
    ffi_guard(op, || {
        // SAFETY: fid_cntr starts with its fid (caller).
        match unsafe { Cntr::from_ptr(cntr, op) } {
            Some(c) => ffi::error::ret_of(f(&c.inner)),
            None => ret::EINVAL,
        }
    })
}

/// `fi_cntr_read`/`readerr` return a bare u64: a bad counter reads as 0.
///
/// # Safety
/// `cntr` must be NULL or a live `struct fid_cntr`.
unsafe fn read_with(
    op: &'static str,
    cntr: *mut ffi::fid_cntr,
    f: impl FnOnce(&CntrInner) -> u64,
) -> u64 {
    ffi_guard_or(op, 0, || {
        // SAFETY: fid_cntr starts with its fid (caller).
        unsafe { Cntr::from_ptr(cntr, op) }.map_or(0, |c| {
            c.inner.progress().run();
            f(&c.inner)
        })
    })
}

unsafe extern "C" fn cntr_read(cntr: *mut ffi::fid_cntr) -> u64 {
    const OP: &str = "fi_cntr_read";
    ffi_guard_or(OP, 0, || {
        // SAFETY: fid_cntr starts with its fid (the application's).
        unsafe { Cntr::from_ptr(cntr, OP) }.map_or(0, |c| c.inner.read_progressing())
    })
}

unsafe extern "C" fn cntr_readerr(cntr: *mut ffi::fid_cntr) -> u64 {
    // SAFETY: cntr comes from the application.
    unsafe { read_with("fi_cntr_readerr", cntr, CntrInner::errors) }
}

unsafe extern "C" fn cntr_add(cntr: *mut ffi::fid_cntr, value: u64) -> c_int {
    // SAFETY: cntr comes from the application.
    unsafe {
        with_cntr("fi_cntr_add", cntr, |c| {
            c.count.fetch_add(value, Ordering::AcqRel);
            c.checkpoint_count();
            Ok(())
        })
    }
}

unsafe extern "C" fn cntr_adderr(cntr: *mut ffi::fid_cntr, value: u64) -> c_int {
    // SAFETY: cntr comes from the application.
    unsafe {
        with_cntr("fi_cntr_adderr", cntr, |c| {
            c.errors.fetch_add(value, Ordering::AcqRel);
            c.checkpoint_errors();
            Ok(())
        })
    }
}

unsafe extern "C" fn cntr_set(cntr: *mut ffi::fid_cntr, value: u64) -> c_int {
    // SAFETY: cntr comes from the application.
    unsafe {
        with_cntr("fi_cntr_set", cntr, |c| {
            c.count.store(value, Ordering::Release);
            c.checkpoint_count();
            Ok(())
        })
    }
}

unsafe extern "C" fn cntr_seterr(cntr: *mut ffi::fid_cntr, value: u64) -> c_int {
    // SAFETY: cntr comes from the application.
    unsafe {
        with_cntr("fi_cntr_seterr", cntr, |c| {
            c.errors.store(value, Ordering::Release);
            c.checkpoint_errors();
            Ok(())
        })
    }
}

unsafe extern "C" fn cntr_wait(cntr: *mut ffi::fid_cntr, threshold: u64, timeout: c_int) -> c_int {
    // SAFETY: cntr comes from the application.
    unsafe { with_cntr("fi_cntr_wait", cntr, |c| c.wait(threshold, timeout)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::tests::{close, fabric_domain};
    use std::ptr;
    use std::time::{Duration, Instant};

    fn open_cntr(
        dom: *mut ffi::fid_domain,
        attr: Option<ffi::fi_cntr_attr>,
    ) -> Result<*mut ffi::fid_cntr, Error> {
        let mut attr = attr;
        let ap = attr.as_mut().map_or(ptr::null_mut(), |a| a as *mut _);
        let mut c: *mut ffi::fid_cntr = ptr::null_mut();
        // SAFETY: dom is a live domain of ours; locals are live.
        let rc = unsafe { ((*(*dom).ops).cntr_open.unwrap())(dom, ap, &mut c, ptr::null_mut()) };
        crate::base::result_of(rc).map(|()| c)
    }

    #[test]
    fn set_add_read() {
        let (fab, dom) = fabric_domain();
        let c = open_cntr(dom, None).unwrap();
        // SAFETY: live objects of ours.
        unsafe {
            let ops = &*(*c).ops;
            assert_eq!(ops.size, size_of::<ffi::fi_ops_cntr>());
            assert_eq!(ops.set.unwrap()(c, 5), 0);
            assert_eq!(ops.seterr.unwrap()(c, 10), 0);
            assert_eq!(ops.add.unwrap()(c, 5), 0);
            assert_eq!(ops.adderr.unwrap()(c, 5), 0);
            assert_eq!(ops.read.unwrap()(c), 10);
            assert_eq!(ops.readerr.unwrap()(c), 15);
            let inner = Cntr::state_of(c as *const ffi::fid).unwrap();
            inner.inc();
            inner.inc_err();
            assert_eq!((inner.value(), inner.errors()), (11, 16));
            drop(inner);
            assert_eq!(ops.read.unwrap()(ptr::null_mut()), 0);
            assert_eq!(ops.add.unwrap()(ptr::null_mut(), 1), ret::EINVAL);
            assert_eq!(close(dom as *mut ffi::fid), ret::EBUSY);
            assert_eq!(close(c as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn wait_threshold_timeout_and_errors() {
        let (fab, dom) = fabric_domain();
        let attr = ffi::fi_cntr_attr {
            wait_obj: ffi::FI_WAIT_UNSPEC,
            ..Default::default()
        };
        let c = open_cntr(dom, Some(attr)).unwrap();
        // SAFETY: live objects of ours.
        unsafe {
            let wait = (*(*c).ops).wait.unwrap();
            let t = Instant::now();
            assert_eq!(wait(c, 1, 50), ret::ETIMEDOUT);
            assert!(t.elapsed() >= Duration::from_millis(50));
            assert_eq!(wait(c, 0, 0), 0);

            let inner = Cntr::state_of(c as *const ffi::fid).unwrap();
            let bump = Arc::clone(&inner);
            let t = std::thread::spawn(move || {
                for _ in 0..3 {
                    // Not a synchronisation: likely lets wait block first.
                    std::thread::sleep(Duration::from_millis(5));
                    bump.inc();
                }
            });
            // 60 s: only a guard against a hang.
            assert_eq!(wait(c, 3, 60_000), 0);
            t.join().unwrap();

            let bump = Arc::clone(&inner);
            let t = std::thread::spawn(move || {
                // Not a synchronisation: likely lets wait block first.
                std::thread::sleep(Duration::from_millis(10));
                bump.inc_err();
            });
            assert_eq!(wait(c, 100, -1), ret::EAVAIL);
            t.join().unwrap();
            drop(inner);
            assert_eq!(close(c as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn open_checks_attributes() {
        let (fab, dom) = fabric_domain();
        let bad = [
            (
                ffi::fi_cntr_attr {
                    events: FI_CNTR_EVENTS_BYTES,
                    ..Default::default()
                },
                Error::ENOSYS,
            ),
            (
                ffi::fi_cntr_attr {
                    events: 9,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
            (
                ffi::fi_cntr_attr {
                    wait_obj: ffi::FI_WAIT_FD,
                    ..Default::default()
                },
                Error::ENOSYS,
            ),
            (
                ffi::fi_cntr_attr {
                    flags: 1,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
        ];
        for (attr, rc) in bad {
            assert_eq!(open_cntr(dom, Some(attr)).err(), Some(rc));
        }
        // SAFETY: live objects of ours.
        unsafe {
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
            assert_eq!(fid::close::<CntrInner>(ptr::null_mut()), ret::EINVAL);
        }
    }
}
