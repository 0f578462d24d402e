//! Completion queues (`fi_cq_open`).
//!
//! Endpoints post [`Completion`]s and [`CompletionError`]s through
//! [`CqInner::write`] / [`CqInner::write_error`]; the application reads them
//! in the format it chose. Successes and errors share one FIFO, so an error
//! is seen exactly where it happened: `fi_cq_read` returns the successes
//! before it, then -FI_EAVAIL until `fi_cq_readerr` takes it.
//!
//! Decisions:
//! - The queue is unbounded and never drops. `size` is recorded (the
//!   endpoint may use [`CqInner::size`] for flow control) but not enforced:
//!   with FI_RM_ENABLED the endpoint refuses work it could not complete, so
//!   an overrun would be a provider bug, and losing completions is worse.
//! - Manual progress: every read first runs the endpoints of the CQ's
//!   domain ([`CqInner::progress`]).
//! - Blocking reads poll (see wait.rs); `fi_cq_signal` makes the current
//!   or next `fi_cq_sread` return -FI_EAGAIN.
//! - `prov_errno` is a positive libfabric error code (0 if none); its text
//!   (`fi_cq_strerror`) is the core's `fi_strerror`.
//! - `fi_cq_readerr` writes the `fi_cq_err_entry` layout of the
//!   application's API version (1.0, 1.5, or 1.20 with `src_addr`).
//!
//! The FIFO and the entry layouts are in `queue`; here, the object.

mod queue;

use std::collections::VecDeque;
use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::base::errdata;
use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, Children, Control, FiObject, FidObject, Parent, ParentRef};
use crate::base::guard::{ffi_guard, ffi_guard_or};
use crate::base::lock::DomainMutex;
use crate::state::progress::ProgressList;
use crate::state::DomainState;
use crate::wait::{self, Backoff, Deadline, IdlePolls, IdleYield, Sleepers};
use queue::{Entry, ErrEntry, Queue};

pub use queue::{Completion, CompletionError};

/// Our `struct fid_cq`.
pub type Cq = FidObject<CqInner>;

/// State shared with the endpoints bound to the CQ.
#[derive(Debug)]
pub struct CqInner {
    domain: ParentRef<DomainState>,
    /// Never FI_CQ_FORMAT_UNSPEC (resolved to CONTEXT at open).
    format: ffi::fi_cq_format,
    wait_obj: ffi::fi_wait_obj,
    size: usize,
    spin_yield: usize,
    wait_spin_us: usize,
    idle_yield: IdleYield,
    idle_polls: IdlePolls,
    /// Its lock is elided under `FI_THREAD_DOMAIN`.
    queue: DomainMutex<Queue>,
    /// `queue`'s length, stored under its lock after every change: an empty
    /// poll (MPI polls in a loop) then reads it instead of taking the lock.
    queued: AtomicUsize,
    /// Set by `fi_cq_signal`, taken by the blocking read it wakes.
    signaled: AtomicBool,
    /// Blocking reads asleep: an entry written (by the progress agent) or
    /// a signal wakes them.
    sleepers: Sleepers,
    /// Endpoints bound to this CQ.
    children: Children,
}

impl Parent for CqInner {
    fn children(&self) -> &Children {
        &self.children
    }
}

impl CqInner {
    /// Queue a successful completion.
    pub fn write(&self, c: Completion) {
        self.with_queue(|q| q.entries.push_back(Entry::Done(c)));
    }

    /// Queue an error completion (read with `fi_cq_readerr`).
    pub fn write_error(&self, e: CompletionError) {
        self.with_queue(|q| q.entries.push_back(Entry::Failed(Box::new(e))));
    }

    /// Runs `f` on the locked queue, then publishes its length.
    fn with_queue<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        let mut q = self.queue.lock();
        let result = f(&mut q);
        self.queued.store(q.entries.len(), Ordering::Release);
        drop(q);
        self.sleepers.wake(self.domain.has_agent());
        result
    }

    /// Whether it has a wait object (blocking reads sleep on the doorbells
    /// of its endpoints' mailboxes).
    pub fn blocks(&self) -> bool {
        self.wait_obj != ffi::FI_WAIT_NONE
    }

    /// The entry format the application reads (never UNSPEC).
    pub fn format(&self) -> ffi::fi_cq_format {
        self.format
    }

    /// The endpoints a read of this CQ progresses: its domain's.
    pub fn progress(&self) -> &ProgressList {
        self.domain.progress()
    }

    /// The size asked at open (or the configured default); not enforced.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Entries (successes and errors) waiting to be read.
    pub fn len(&self) -> usize {
        self.queue.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.lock().entries.is_empty()
    }

    /// `fi_poll`: progress, then whether there is anything to read.
    pub fn poll_ready(&self) -> bool {
        self.progress().run();
        !self.is_empty()
    }

    /// The domain the CQ belongs to (endpoints must share it).
    pub fn domain(&self) -> &DomainState {
        &self.domain
    }

    /// Wake the current or next blocking read (`fi_cq_signal`).
    pub fn signal(&self) {
        self.signaled.store(true, Ordering::Release);
        self.sleepers.wake(true);
    }

    /// `fi_cq_readfrom` after one progress pass.
    ///
    /// # Safety
    /// As [`Queue::read`] for `self.format`.
    #[inline]
    unsafe fn read(&self, buf: *mut c_void, count: usize, src_addr: *mut ffi::fi_addr_t) -> isize {
        self.progress().run();
        let n = if self.queued.load(Ordering::Acquire) == 0 {
            Error::EAGAIN.ssize()
        } else {
            // SAFETY: forwarded from the caller.
            self.with_queue(|q| unsafe { q.read(self.format, buf, count, src_addr) })
        };
        if n == Error::EAGAIN.ssize() {
            if self.idle_polls.nothing(self.spin_yield, self.idle_yield) {
                self.report_stall();
            }
        } else {
            self.idle_polls.found();
        }
        n
    }

    /// Nothing was read for [`wait::STALL_NS`]: what the domain's endpoints
    /// wait for, at info level (a rank blocked on a slow peer is normal;
    /// a hung job's log then says where each process stands).
    #[cold]
    fn report_stall(&self) {
        for (i, member) in self.progress().members().iter().enumerate() {
            if let Some(what) = member.in_flight() {
                tracing::info!(
                    "CQ {:p}: nothing completed for {} s; endpoint {i} of its domain has in flight: {what}",
                    self,
                    crate::wait::STALL_NS / 1_000_000_000
                );
            }
        }
    }

    /// `fi_cq_sreadfrom`: read, or wait up to `timeout` ms (< 0: forever)
    /// for something to read, or for a signal.
    ///
    /// # Safety
    /// As [`Queue::read`] for `self.format`.
    unsafe fn sread(
        &self,
        buf: *mut c_void,
        count: usize,
        src_addr: *mut ffi::fi_addr_t,
        timeout: c_int,
    ) -> isize {
        let deadline = Deadline::after_ms(timeout);
        let mut backoff = Backoff::for_wait(self.spin_yield, self.wait_spin_us);
        loop {
            // SAFETY: forwarded from the caller.
            let n = unsafe { self.read(buf, count, src_addr) };
            if n != Error::EAGAIN.ssize()
                || self.signaled.swap(false, Ordering::AcqRel)
                || deadline.expired()
            {
                return n;
            }
            let ready =
                || self.queued.load(Ordering::SeqCst) != 0 || self.signaled.load(Ordering::Acquire);
            if backoff.spinning() || !self.sleepers.sleep(self.progress(), ready, &deadline) {
                backoff.snooze();
            }
        }
    }
}

static CQ_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    control: Some(fid::control::<CqInner>),
    ..fid::fi_ops::<CqInner>()
};

// SAFETY: fid_cq starts with its struct fid.
unsafe impl FiObject for CqInner {
    type Fid = ffi::fid_cq;
    const CLASS: u32 = ffi::FI_CLASS_CQ;
    const KIND: &'static str = "completion queue";
    const FI_OPS: &'static ffi::fi_ops = &CQ_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(cq: &Cq) -> Result<(), Error> {
        if let Err(n) = fid::check_no_children(cq.inner.children()) {
            tracing::warn!("fi_close(cq): still bound to {n} endpoint(s) or poll set(s)");
            return Err(Error::EBUSY);
        }
        // Dropping it releases the domain.
        tracing::debug!("cq {cq:p} closed");
        Ok(())
    }
}

impl Control for CqInner {
    unsafe fn control(cq: &Cq, command: c_int, arg: *mut c_void) -> Result<(), Error> {
        let warn = |why| tracing::warn!("fi_control(cq, {command}): {why}");
        // SAFETY: arg is what the command expects (caller).
        unsafe { wait::polled_control(cq.inner.wait_obj, command, arg, warn) }
    }
}

static CQ_OPS: ffi::fi_ops_cq = ffi::fi_ops_cq {
    size: size_of::<ffi::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
};

/// Check a `fi_cq_attr`: the format to use, or the error.
fn check_attr(a: &ffi::fi_cq_attr) -> Result<ffi::fi_cq_format, Error> {
    let format = match a.format {
        ffi::FI_CQ_FORMAT_UNSPEC => ffi::FI_CQ_FORMAT_CONTEXT,
        f @ (ffi::FI_CQ_FORMAT_CONTEXT
        | ffi::FI_CQ_FORMAT_MSG
        | ffi::FI_CQ_FORMAT_DATA
        | ffi::FI_CQ_FORMAT_TAGGED) => f,
        other => {
            tracing::warn!("fi_cq_open: unknown format {other}");
            return Err(Error::EINVAL);
        }
    };
    wait::check_polled(a.wait_obj).map_err(|r| {
        tracing::warn!("fi_cq_open: wait object {}: {}", a.wait_obj, r.reason);
        r.code
    })?;
    // The condition is only a hint (we return as soon as one entry is there).
    if a.wait_obj != ffi::FI_WAIT_NONE
        && a.wait_cond != ffi::FI_CQ_COND_NONE
        && a.wait_cond != ffi::FI_CQ_COND_THRESHOLD
    {
        tracing::warn!("fi_cq_open: unknown wait condition {}", a.wait_cond);
        return Err(Error::EINVAL);
    }
    let unknown = a.flags & !ffi::FI_AFFINITY;
    if unknown != 0 {
        tracing::warn!("fi_cq_open: unsupported flags {unknown:#x}");
        return Err(Error::EINVAL);
    }
    if a.flags & ffi::FI_AFFINITY != 0 {
        // A hint by definition; there are no interrupts to steer.
        tracing::info!("fi_cq_open: FI_AFFINITY ignored (no interrupts)");
    }
    Ok(format)
}

/// `fi_cq_open` on one of our domains.
///
/// # Safety
/// `attr` must be NULL or a valid `fi_cq_attr`; `cq` NULL or writable.
pub unsafe fn open(
    domain: &Arc<DomainState>,
    attr: *mut ffi::fi_cq_attr,
    cq: *mut *mut ffi::fid_cq,
    context: *mut c_void,
) -> Result<(), Error> {
    if attr.is_null() || cq.is_null() {
        tracing::warn!("fi_cq_open: NULL attr or cq pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL attr is a valid fi_cq_attr (caller).
    let a = unsafe { &*attr };
    let format = check_attr(a)?;
    let config = domain.config();
    let size = if a.size == 0 { config.cq_size } else { a.size };
    let obj = Box::new(Cq {
        fid: ffi::fid_cq {
            fid: Cq::header(context),
            ops: fid::ops_ptr(&CQ_OPS),
        },
        inner: Arc::new(CqInner {
            domain: ParentRef::new(domain),
            format,
            wait_obj: a.wait_obj,
            size,
            spin_yield: config.spin_yield,
            wait_spin_us: config.wait_spin_us,
            idle_yield: IdleYield::from_tunable(config.idle_yield),
            idle_polls: IdlePolls::default(),
            queue: DomainMutex::new(
                Queue {
                    // Grows on demand: hundreds of CQs of the default size must stay cheap.
                    entries: VecDeque::with_capacity(size.min(64)),
                    saved_err_data: Vec::new(),
                },
                domain.locking(),
            ),
            queued: AtomicUsize::new(0),
            signaled: AtomicBool::new(false),
            sleepers: Sleepers::new(),
            children: Children::default(),
        }),
    });
    // SAFETY: cq is non-NULL (checked).
    let obj = unsafe { obj.install(cq) };
    tracing::debug!("cq {obj:p} opened: format {format}, size {size}");
    Ok(())
}

/// `fi_trywait` on `fid`: None if it is not our CQ; otherwise
/// -FI_EAGAIN if there is something to read after a progress pass, else 0.
///
/// # Safety
/// `fid` must be NULL or a live `struct fid`.
pub unsafe fn trywait(fid: *const ffi::fid) -> Option<c_int> {
    // SAFETY: guaranteed by the caller.
    let inner = &unsafe { Cq::find(fid) }?.inner;
    inner.progress().run();
    Some(if inner.is_empty() {
        ret::SUCCESS
    } else {
        ret::EAGAIN
    })
}

/// Shared checks of the read entry points.
///
/// # Safety
/// `cq` must be NULL or a live `struct fid_cq`.
#[inline]
unsafe fn readable<'a>(
    cq: *mut ffi::fid_cq,
    buf: *mut c_void,
    count: usize,
    op: &str,
) -> Result<&'a CqInner, Error> {
    // SAFETY: fid_cq starts with its fid (caller).
    let Some(c) = (unsafe { Cq::from_ptr(cq, op) }) else {
        return Err(Error::EINVAL);
    };
    if buf.is_null() && count > 0 {
        tracing::warn!("{op}: NULL buffer for {count} entries");
        return Err(Error::EINVAL);
    }
    Ok(&c.inner)
}

unsafe extern "C" fn cq_read(cq: *mut ffi::fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: same contract, no source addresses.
    unsafe { cq_readfrom(cq, buf, count, ptr::null_mut()) }
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut ffi::fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut ffi::fi_addr_t,
) -> isize {
    ffi_guard_or("fi_cq_read", Error::EOTHER.ssize(), || {
        // SAFETY: cq comes from the application.
        let inner = match unsafe { readable(cq, buf, count, "fi_cq_read") } {
            Ok(i) => i,
            Err(e) => return e.ssize(),
        };
        // SAFETY: buf holds count entries of the CQ's format, src_addr count addresses (API contract).
        unsafe { inner.read(buf, count, src_addr) }
    })
}

unsafe extern "C" fn cq_sread(
    cq: *mut ffi::fid_cq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: same contract, no source addresses.
    unsafe { cq_sreadfrom(cq, buf, count, ptr::null_mut(), cond, timeout) }
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut ffi::fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut ffi::fi_addr_t,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    ffi_guard_or("fi_cq_sread", Error::EOTHER.ssize(), || {
        // SAFETY: cq comes from the application.
        let inner = match unsafe { readable(cq, buf, count, "fi_cq_sread") } {
            Ok(i) => i,
            Err(e) => return e.ssize(),
        };
        // SAFETY: as for fi_cq_readfrom.
        unsafe { inner.sread(buf, count, src_addr, timeout) }
    })
}

unsafe extern "C" fn cq_readerr(
    cq: *mut ffi::fid_cq,
    buf: *mut ffi::fi_cq_err_entry,
    _flags: u64,
) -> isize {
    ffi_guard_or("fi_cq_readerr", Error::EOTHER.ssize(), || {
        // SAFETY: cq comes from the application.
        let Some(c) = (unsafe { Cq::from_ptr(cq, "fi_cq_readerr") }) else {
            return Error::EINVAL.ssize();
        };
        if buf.is_null() {
            tracing::warn!("fi_cq_readerr: NULL entry");
            return Error::EINVAL.ssize();
        }
        let inner = &c.inner;
        inner.progress().run();
        let api = inner.domain.api_version;
        // SAFETY: buf is an fi_cq_err_entry of the application's API version.
        inner.with_queue(|q| unsafe { q.read_err(api, buf as *mut ErrEntry) })
    })
}

unsafe extern "C" fn cq_signal(cq: *mut ffi::fid_cq) -> c_int {
    ffi_guard("fi_cq_signal", || {
        // SAFETY: cq comes from the application.
        let Some(c) = (unsafe { Cq::from_ptr(cq, "fi_cq_signal") }) else {
            return ret::EINVAL;
        };
        c.inner.signal();
        ret::SUCCESS
    })
}

unsafe extern "C" fn cq_strerror(
    _cq: *mut ffi::fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    ffi_guard_or("fi_cq_strerror", c"unimem: error".as_ptr(), || {
        // SAFETY: buf is NULL or holds len bytes (API contract).
        unsafe { errdata::strerror(prov_errno, buf, len) }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fabric;
    use std::time::{Duration, Instant};

    /// A fabric + domain for object tests; closed by the caller.
    pub(crate) fn fabric_domain() -> (*mut ffi::fid_fabric, *mut ffi::fid_domain) {
        let mut fattr = ffi::fi_fabric_attr::default();
        let mut dattr = ffi::fi_domain_attr::default();
        let mut info = ffi::fi_info {
            domain_attr: &mut dattr,
            ..Default::default()
        };
        let mut fab: *mut ffi::fid_fabric = ptr::null_mut();
        let mut dom: *mut ffi::fid_domain = ptr::null_mut();
        // SAFETY: live locals; fab is then a fabric of ours.
        unsafe {
            assert_eq!(fabric::open(&mut fattr, &mut fab, ptr::null_mut()), Ok(()));
            (*fab).api_version = ffi::fi_version(1, 17);
            let domain = (*(*fab).ops).domain.unwrap();
            assert_eq!(domain(fab, &mut info, &mut dom, ptr::null_mut()), 0);
        }
        (fab, dom)
    }

    /// # Safety
    /// `fid` must be a live object of ours.
    pub(crate) unsafe fn close(fid: *mut ffi::fid) -> c_int {
        // SAFETY: guaranteed by the caller.
        unsafe { ((*(*fid).ops).close.unwrap())(fid) }
    }

    fn open_cq(
        dom: *mut ffi::fid_domain,
        attr: &mut ffi::fi_cq_attr,
    ) -> Result<*mut ffi::fid_cq, Error> {
        let mut cq: *mut ffi::fid_cq = ptr::null_mut();
        // SAFETY: dom is a live domain of ours; attr and cq are live locals.
        let rc = unsafe { ((*(*dom).ops).cq_open.unwrap())(dom, attr, &mut cq, ptr::null_mut()) };
        crate::base::result_of(rc).map(|()| cq)
    }

    #[test]
    fn open_checks_attributes() {
        let (fab, dom) = fabric_domain();
        let bad = [
            (
                ffi::fi_cq_attr {
                    format: 99,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
            (
                ffi::fi_cq_attr {
                    wait_obj: ffi::FI_WAIT_FD,
                    ..Default::default()
                },
                Error::ENOSYS,
            ),
            (
                ffi::fi_cq_attr {
                    wait_obj: ffi::FI_WAIT_SET,
                    ..Default::default()
                },
                Error::ENOSYS,
            ),
            (
                ffi::fi_cq_attr {
                    wait_obj: 42,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
            (
                ffi::fi_cq_attr {
                    wait_obj: ffi::FI_WAIT_UNSPEC,
                    wait_cond: 9,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
            (
                ffi::fi_cq_attr {
                    flags: ffi::FI_PEEK,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
        ];
        for (mut attr, rc) in bad {
            assert_eq!(open_cq(dom, &mut attr).err(), Some(rc));
        }
        // SAFETY: NULL attr is checked.
        let rc = unsafe {
            let mut cq = ptr::null_mut();
            ((*(*dom).ops).cq_open.unwrap())(dom, ptr::null_mut(), &mut cq, ptr::null_mut())
        };
        assert_eq!(rc, ret::EINVAL);

        let mut attr = ffi::fi_cq_attr {
            flags: ffi::FI_AFFINITY,
            wait_obj: ffi::FI_WAIT_UNSPEC,
            ..Default::default()
        };
        let cq = open_cq(dom, &mut attr).unwrap();
        // SAFETY: cq, dom and fab are live objects of ours.
        unsafe {
            let inner = Cq::state_of(cq as *const ffi::fid).unwrap();
            assert_eq!(inner.format(), ffi::FI_CQ_FORMAT_CONTEXT);
            assert_eq!(
                inner.size(),
                crate::base::config::Config::defaults().cq_size
            );
            assert!(Cq::state_of(dom as *const ffi::fid).is_none());
            drop(inner);
            let mut obj = 0u32;
            let control = (*(*cq).fid.ops).control.unwrap();
            assert_eq!(
                control(
                    cq as *mut ffi::fid,
                    ffi::FI_GETWAITOBJ as c_int,
                    &mut obj as *mut u32 as *mut c_void
                ),
                0
            );
            assert_eq!(obj, ffi::FI_WAIT_YIELD);
            assert_eq!(
                control(
                    cq as *mut ffi::fid,
                    ffi::FI_GETWAIT as c_int,
                    &mut obj as *mut u32 as *mut c_void
                ),
                ret::ENODATA
            );
            assert_eq!(close(dom as *mut ffi::fid), ret::EBUSY, "CQ still open");
            assert_eq!(close(cq as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
            assert_eq!(fid::close::<CqInner>(ptr::null_mut()), ret::EINVAL);
        }
    }

    #[test]
    fn bound_endpoints_keep_the_cq_open_and_are_progressed() {
        struct Ep(Arc<CqInner>, AtomicBool);
        impl crate::state::progress::Progress for Ep {
            fn progress(&self) {
                if !self.1.swap(true, Ordering::AcqRel) {
                    self.0
                        .write(Completion::new(42 as *mut c_void, ffi::FI_SEND));
                }
            }
        }
        let (fab, dom) = fabric_domain();
        let mut attr = ffi::fi_cq_attr {
            format: ffi::FI_CQ_FORMAT_MSG,
            ..Default::default()
        };
        let cq = open_cq(dom, &mut attr).unwrap();
        // SAFETY: cq is a live CQ of ours.
        let inner = unsafe { Cq::state_of(cq as *const ffi::fid) }.unwrap();
        let bound = ParentRef::new(&inner);
        let ep: Arc<dyn crate::state::progress::Progress> =
            Arc::new(Ep(Arc::clone(&inner), AtomicBool::new(false)));
        inner.progress().add(&ep);
        let mut msg = [ffi::fi_cq_msg_entry::default(); 2];
        // SAFETY: live objects of ours; msg has room for 2 entries.
        unsafe {
            let ops = &*(*cq).ops;
            assert_eq!(ops.size, size_of::<ffi::fi_ops_cq>());
            assert_eq!(ops.read.unwrap()(cq, msg.as_mut_ptr() as *mut c_void, 2), 1);
            assert_eq!(msg[0].op_context as usize, 42);
            assert_eq!(msg[0].flags, ffi::FI_SEND);
            assert_eq!(
                ops.read.unwrap()(cq, msg.as_mut_ptr() as *mut c_void, 2),
                Error::EAGAIN.ssize()
            );
            assert_eq!(
                ops.read.unwrap()(cq, ptr::null_mut(), 2),
                Error::EINVAL.ssize()
            );
            assert_eq!(close(cq as *mut ffi::fid), ret::EBUSY);
            // As an endpoint's fi_close does: leave the progress list, then
            // release the binding.
            inner.progress().remove(&ep);
            drop(bound);
            drop(ep);
            drop(inner);
            assert_eq!(close(cq as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn sread_times_out_wakes_on_signal_and_on_data() {
        let (fab, dom) = fabric_domain();
        let mut attr = ffi::fi_cq_attr {
            wait_obj: ffi::FI_WAIT_UNSPEC,
            ..Default::default()
        };
        let cq = open_cq(dom, &mut attr).unwrap();
        let mut e = [ffi::fi_cq_entry::default(); 1];
        let buf = e.as_mut_ptr() as *mut c_void;
        // SAFETY: live objects of ours; e has room for 1 entry.
        unsafe {
            let ops = &*(*cq).ops;
            let t = Instant::now();
            assert_eq!(
                ops.sread.unwrap()(cq, buf, 1, ptr::null(), 100),
                Error::EAGAIN.ssize()
            );
            let waited = t.elapsed();
            // It waited; how much longer is up to the machine's load.
            assert!(waited >= Duration::from_millis(100), "{waited:?}");

            assert_eq!(ops.signal.unwrap()(cq), 0);
            assert_eq!(
                ops.sread.unwrap()(cq, buf, 1, ptr::null(), -1),
                Error::EAGAIN.ssize()
            );

            let inner = Cq::state_of(cq as *const ffi::fid).unwrap();
            let writer = std::thread::spawn(move || {
                // Not a synchronisation: likely lets sread block first.
                std::thread::sleep(Duration::from_millis(20));
                inner.write(Completion::new(9 as *mut c_void, ffi::FI_RECV));
            });
            // 60 s: only a guard against a hang.
            assert_eq!(ops.sread.unwrap()(cq, buf, 1, ptr::null(), 60_000), 1);
            assert_eq!(e[0].op_context as usize, 9);
            writer.join().unwrap();

            assert_eq!(close(cq as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }
}
