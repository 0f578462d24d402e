//! Event queues (`fi_eq_open`): control events, for now user events
//! (`fi_eq_write`) and asynchronous AV inserts (FI_AV_COMPLETE).
//!
//! Every event is produced by a call into the provider, never behind the
//! application's back, so an EQ can block honestly: `fi_eq_sread` sleeps
//! on a condition variable, and with FI_WAIT_FD an eventfd mirrors "the
//! queue is not empty" (readable exactly while an event is queued; FI_PEEK
//! leaves it readable). FI_WAIT_UNSPEC and FI_WAIT_YIELD use the condition
//! variable; wait sets and FI_WAIT_MUTEX_COND are not supported.
//!
//! Decisions:
//! - Unbounded: `size` is a minimum the queue always meets; a write never
//!   fails for lack of room (no FI_EOVERRUN state).
//! - A read into a buffer smaller than the event fails with
//!   -FI_ETOOSMALL and leaves the event queued (rather than truncating).
//! - Error entries are delivered in order, like CQ errors: a read
//!   returns -FI_EAVAIL while one is at the head.
//! - `fi_eq_write` works whether or not the EQ was opened with FI_WRITE
//!   (without it, fi_eq(3) only says the application may not call it).

use std::collections::VecDeque;
use std::fmt;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::base::errdata;
use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, Children, Control, FiObject, FidObject, Parent, ParentRef};
use crate::base::guard::ffi_guard_or;
use crate::state::FabricState;
use crate::wait::Deadline;

/// Default size when `fi_eq_open` asks for 0 (a hint only, see above).
const DEFAULT_SIZE: usize = 1024;

const V1_5: u32 = ffi::fi_version(1, 5);

/// An error event (read with `fi_eq_readerr`).
#[derive(Clone, Debug)]
pub struct EqError {
    /// The object the error is about (e.g. the AV).
    pub fid: *mut ffi::fid,
    pub context: *mut c_void,
    /// Event-specific (for an AV insert: the index of the failed address).
    pub data: u64,
    /// Positive FI_E* code.
    pub err: i32,
    /// Positive libfabric error code with more detail, or 0.
    pub prov_errno: i32,
    pub err_data: Vec<u8>,
}

// SAFETY: `fid` and `context` are handed back to the application as they
// are, never dereferenced by the EQ.
unsafe impl Send for EqError {}

#[derive(Debug)]
enum Event {
    Data { event: u32, bytes: Vec<u8> },
    Error(EqError),
}

#[derive(Debug, Default)]
struct EqState {
    events: VecDeque<Event>,
    /// Whether the eventfd currently reads as ready.
    fd_ready: bool,
    /// Error data handed out by the last `fi_eq_readerr` without a buffer.
    saved_err_data: Vec<u8>,
}

/// Our `struct fid_eq`.
pub type Eq = FidObject<EqInner>;

/// State shared with the objects bound to the EQ (AVs, domains).
#[derive(Debug)]
pub struct EqInner {
    _fabric: ParentRef<FabricState>,
    api_version: u32,
    wait_obj: ffi::fi_wait_obj,
    /// FI_WAIT_FD only.
    fd: Option<OwnedFd>,
    state: Mutex<EqState>,
    ready: Condvar,
    children: Children,
}

impl Parent for EqInner {
    fn children(&self) -> &Children {
        &self.children
    }
}

impl EqInner {
    /// Queue an event whose data is `entry` (a `struct fi_eq_entry` or
    /// a longer event-specific structure).
    pub fn write_event(&self, event: u32, entry: &[u8]) {
        self.push(Event::Data {
            event,
            bytes: entry.to_vec(),
        });
    }

    /// Queue a `struct fi_eq_entry` event.
    pub fn write_entry(&self, event: u32, fid: *mut ffi::fid, context: *mut c_void, data: u64) {
        let entry = ffi::fi_eq_entry { fid, context, data };
        // SAFETY: fi_eq_entry is plain data without padding (two pointers and a u64).
        let bytes = unsafe {
            std::slice::from_raw_parts(
                &entry as *const ffi::fi_eq_entry as *const u8,
                size_of::<ffi::fi_eq_entry>(),
            )
        };
        self.write_event(event, bytes);
    }

    /// Queue an error event.
    pub fn write_error(&self, e: EqError) {
        self.push(Event::Error(e));
    }

    fn push(&self, event: Event) {
        let mut st = self.state.lock();
        st.events.push_back(event);
        self.sync_fd(&mut st);
        drop(st);
        self.ready.notify_all();
    }

    /// Make the eventfd readable iff an event is queued.
    fn sync_fd(&self, st: &mut EqState) {
        let Some(fd) = &self.fd else { return };
        let want = !st.events.is_empty();
        if want == st.fd_ready {
            return;
        }
        let mut value: u64 = 1;
        let p = &mut value as *mut u64 as *mut c_void;
        // SAFETY: an eventfd reads and writes exactly 8 bytes, here from/to `value`.
        let n = unsafe {
            if want {
                libc::write(fd.as_raw_fd(), p, 8)
            } else {
                libc::read(fd.as_raw_fd(), p, 8)
            }
        };
        if n == 8 {
            st.fd_ready = want;
        } else {
            tracing::warn!(
                "eq: eventfd {} failed: {}",
                if want { "write" } else { "read" },
                std::io::Error::last_os_error()
            );
        }
    }

    /// `fi_eq_read` on the locked state.
    ///
    /// # Safety
    /// `event` NULL or writable; `buf` NULL or writable for `len` bytes.
    unsafe fn read_locked(
        &self,
        st: &mut EqState,
        event: *mut u32,
        buf: *mut c_void,
        len: usize,
        flags: u64,
    ) -> isize {
        let (ev, bytes) = match st.events.front() {
            None => return Error::EAGAIN.ssize(),
            Some(Event::Error(_)) => return Error::EAVAIL.ssize(),
            Some(Event::Data { event, bytes }) => (*event, bytes),
        };
        if !buf.is_null() && len < bytes.len() {
            tracing::warn!(
                "fi_eq_read: buffer of {len} bytes for an event of {}",
                bytes.len()
            );
            return Error::ETOOSMALL.ssize();
        }
        let n = if buf.is_null() { 0 } else { bytes.len() };
        // SAFETY: event and buf are writable as promised (caller); n <= len.
        unsafe {
            if !event.is_null() {
                *event = ev;
            }
            ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        }
        if flags & ffi::FI_PEEK == 0 {
            st.events.pop_front();
            self.sync_fd(st);
        }
        n as isize
    }

    /// `fi_eq_readerr` on the locked state.
    ///
    /// # Safety
    /// `user` must be a writable `fi_eq_err_entry` of the application's API.
    unsafe fn read_err_locked(
        &self,
        st: &mut EqState,
        user: *mut ffi::fi_eq_err_entry,
        flags: u64,
    ) -> isize {
        let Some(Event::Error(e)) = st.events.front() else {
            return Error::EAGAIN.ssize();
        };
        let peek = flags & ffi::FI_PEEK != 0;
        let e = e.clone();
        let api = self.api_version;
        let old_layout = ffi::fi_version_lt(api, V1_5);
        let (user_data, user_size) = if old_layout {
            (ptr::null_mut(), 0)
        } else {
            // SAFETY: user is readable (caller).
            unsafe { ((*user).err_data, (*user).err_data_size) }
        };
        // A peek hands out a copy (e was cloned): the entry keeps its data.
        // SAFETY: user_data is the application's buffer of user_size bytes.
        let (err_data, err_data_size) = unsafe {
            errdata::deliver_err_data(
                api,
                user_data,
                user_size,
                e.err_data,
                &mut st.saved_err_data,
            )
        };
        let out = ffi::fi_eq_err_entry {
            fid: e.fid,
            context: e.context,
            data: e.data,
            err: e.err,
            prov_errno: e.prov_errno,
            err_data,
            err_data_size,
        };
        // API < 1.5 entries end before err_data_size.
        let size = if old_layout {
            offset_of!(ffi::fi_eq_err_entry, err_data_size)
        } else {
            size_of::<ffi::fi_eq_err_entry>()
        };
        // SAFETY: the application's entry holds `size` bytes (caller).
        unsafe {
            ptr::copy_nonoverlapping(
                &out as *const ffi::fi_eq_err_entry as *const u8,
                user as *mut u8,
                size,
            )
        };
        if !peek {
            st.events.pop_front();
            self.sync_fd(st);
        }
        size as isize
    }

    /// `fi_eq_sread`: wait up to `timeout` ms (< 0: forever) for an event.
    ///
    /// # Safety
    /// As [`EqInner::read_locked`].
    unsafe fn sread(
        &self,
        event: *mut u32,
        buf: *mut c_void,
        len: usize,
        timeout: c_int,
        flags: u64,
    ) -> isize {
        let deadline = Deadline::after_ms(timeout);
        let mut st = self.state.lock();
        loop {
            // SAFETY: forwarded from the caller.
            let n = unsafe { self.read_locked(&mut st, event, buf, len, flags) };
            if n != Error::EAGAIN.ssize() {
                return n;
            }
            match deadline.instant() {
                None => self.ready.wait(&mut st),
                Some(end) => {
                    if self.ready.wait_until(&mut st, end).timed_out() {
                        // SAFETY: as above.
                        return unsafe { self.read_locked(&mut st, event, buf, len, flags) };
                    }
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.state.lock().events.is_empty()
    }
}

static EQ_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    control: Some(fid::control::<EqInner>),
    ..fid::fi_ops::<EqInner>()
};

// SAFETY: fid_eq starts with its struct fid.
unsafe impl FiObject for EqInner {
    type Fid = ffi::fid_eq;
    const CLASS: u32 = ffi::FI_CLASS_EQ;
    const KIND: &'static str = "event queue";
    const FI_OPS: &'static ffi::fi_ops = &EQ_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(eq: &Eq) -> Result<(), Error> {
        if let Err(n) = fid::check_no_children(eq.inner.children()) {
            tracing::warn!("fi_close(eq): still bound to {n} object(s)");
            return Err(Error::EBUSY);
        }
        // Dropping it closes the eventfd.
        tracing::debug!("eq {eq:p} closed");
        Ok(())
    }
}

static EQ_OPS: ffi::fi_ops_eq = ffi::fi_ops_eq {
    size: size_of::<ffi::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};

fn check_attr(a: &ffi::fi_eq_attr) -> Result<(), Error> {
    match a.wait_obj {
        ffi::FI_WAIT_NONE | ffi::FI_WAIT_UNSPEC | ffi::FI_WAIT_YIELD | ffi::FI_WAIT_FD => {}
        ffi::FI_WAIT_SET | ffi::FI_WAIT_MUTEX_COND | ffi::FI_WAIT_POLLFD => {
            tracing::warn!(
                "fi_eq_open: wait object {} not supported (use FI_WAIT_UNSPEC or FI_WAIT_FD)",
                a.wait_obj
            );
            return Err(Error::ENOSYS);
        }
        other => {
            tracing::warn!("fi_eq_open: unknown wait object {other}");
            return Err(Error::EINVAL);
        }
    }
    let unknown = a.flags & !(ffi::FI_WRITE | ffi::FI_AFFINITY);
    if unknown != 0 {
        tracing::warn!("fi_eq_open: unsupported flags {unknown:#x}");
        return Err(Error::EINVAL);
    }
    if a.flags & ffi::FI_AFFINITY != 0 {
        tracing::info!("fi_eq_open: FI_AFFINITY ignored (no interrupts)");
    }
    Ok(())
}

/// An OS error as libfabric's (its FI_E* codes are the errno values).
fn os_error(e: &std::io::Error) -> Error {
    let errno = e.raw_os_error().unwrap_or(libc::ENOMEM);
    isize::try_from(errno)
        .ok()
        .and_then(|n| Error::from_ret(-n))
        .unwrap_or(Error::ENOMEM)
}

/// `fi_eq_open` on one of our fabrics.
///
/// # Safety
/// `attr` must be NULL or a valid `fi_eq_attr`; `eq` NULL or writable.
pub unsafe fn open(
    fabric: &Arc<FabricState>,
    api_version: u32,
    attr: *mut ffi::fi_eq_attr,
    eq: *mut *mut ffi::fid_eq,
    context: *mut c_void,
) -> Result<(), Error> {
    if attr.is_null() || eq.is_null() {
        tracing::warn!("fi_eq_open: NULL attr or eq pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL attr is a valid fi_eq_attr (caller).
    let a = unsafe { &*attr };
    check_attr(a)?;
    let fd = if a.wait_obj == ffi::FI_WAIT_FD {
        // SAFETY: plain syscall; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!("fi_eq_open: eventfd: {e}");
            return Err(os_error(&e));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        Some(unsafe { OwnedFd::from_raw_fd(raw) })
    } else {
        None
    };
    let size = if a.size == 0 { DEFAULT_SIZE } else { a.size };
    let obj = Box::new(Eq {
        fid: ffi::fid_eq {
            fid: Eq::header(context),
            ops: fid::ops_ptr(&EQ_OPS),
        },
        inner: Arc::new(EqInner {
            _fabric: ParentRef::new(fabric),
            api_version,
            wait_obj: a.wait_obj,
            fd,
            state: Mutex::new(EqState {
                events: VecDeque::with_capacity(size.min(64)),
                ..EqState::default()
            }),
            ready: Condvar::new(),
            children: Children::default(),
        }),
    });
    // SAFETY: eq is non-NULL (checked).
    let obj = unsafe { obj.install(eq) };
    tracing::debug!("eq {obj:p} opened: wait object {}", a.wait_obj);
    Ok(())
}

/// `fi_trywait` on `fid`: None if it is not our EQ; otherwise -FI_EAGAIN
/// if an event is queued (do not block), else 0.
///
/// # Safety
/// `fid` must be NULL or a live `struct fid`.
pub unsafe fn trywait(fid: *const ffi::fid) -> Option<c_int> {
    // SAFETY: guaranteed by the caller.
    let eq = unsafe { Eq::find(fid) }?;
    Some(if eq.inner.is_empty() {
        ret::SUCCESS
    } else {
        ret::EAGAIN
    })
}

impl Control for EqInner {
    unsafe fn control(eq: &Eq, command: c_int, arg: *mut c_void) -> Result<(), Error> {
        let inner = &eq.inner;
        if arg.is_null() && matches!(command as u32, ffi::FI_GETWAIT | ffi::FI_GETWAITOBJ) {
            tracing::warn!("fi_control(eq): NULL argument");
            return Err(Error::EINVAL);
        }
        match command as u32 {
            ffi::FI_GETWAIT => match &inner.fd {
                // SAFETY: FI_GETWAIT on an FD EQ takes an `int *` (API contract).
                Some(fd) => unsafe {
                    *(arg as *mut c_int) = fd.as_raw_fd();
                    Ok(())
                },
                None => Err(Error::ENODATA),
            },
            ffi::FI_GETWAITOBJ => {
                let obj = match inner.wait_obj {
                    ffi::FI_WAIT_NONE | ffi::FI_WAIT_FD => inner.wait_obj,
                    // Our own (condition variable) wait.
                    _ => ffi::FI_WAIT_UNSPEC,
                };
                // SAFETY: FI_GETWAITOBJ takes an `enum fi_wait_obj *` (API contract).
                unsafe { *(arg as *mut ffi::fi_wait_obj) = obj };
                Ok(())
            }
            _ => {
                tracing::info!("fi_control(eq): command {command} not supported");
                Err(Error::ENOSYS)
            }
        }
    }
}

/// Shared checks of the read entry points.
///
/// # Safety
/// `eq` must be NULL or a live `struct fid_eq`.
unsafe fn readable<'a>(eq: *mut ffi::fid_eq, flags: u64, op: &str) -> Result<&'a EqInner, Error> {
    // SAFETY: fid_eq starts with its fid (caller).
    let Some(e) = (unsafe { Eq::from_ptr(eq, op) }) else {
        return Err(Error::EINVAL);
    };
    let unknown = flags & !ffi::FI_PEEK;
    if unknown != 0 {
        tracing::warn!("{op}: unsupported flags {unknown:#x}");
        return Err(Error::EBADFLAGS);
    }
    Ok(&e.inner)
}

unsafe extern "C" fn eq_read(
    eq: *mut ffi::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    ffi_guard_or("fi_eq_read", Error::EOTHER.ssize(), || {
        // SAFETY: eq comes from the application.
        let inner = match unsafe { readable(eq, flags, "fi_eq_read") } {
            Ok(i) => i,
            Err(e) => return e.ssize(),
        };
        let mut st = inner.state.lock();
        // SAFETY: event and buf are as the API promises.
        unsafe { inner.read_locked(&mut st, event, buf, len, flags) }
    })
}

unsafe extern "C" fn eq_sread(
    eq: *mut ffi::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    ffi_guard_or("fi_eq_sread", Error::EOTHER.ssize(), || {
        // SAFETY: eq comes from the application.
        let inner = match unsafe { readable(eq, flags, "fi_eq_sread") } {
            Ok(i) => i,
            Err(e) => return e.ssize(),
        };
        // SAFETY: event and buf are as the API promises.
        unsafe { inner.sread(event, buf, len, timeout, flags) }
    })
}

unsafe extern "C" fn eq_readerr(
    eq: *mut ffi::fid_eq,
    buf: *mut ffi::fi_eq_err_entry,
    flags: u64,
) -> isize {
    ffi_guard_or("fi_eq_readerr", Error::EOTHER.ssize(), || {
        // SAFETY: eq comes from the application.
        let inner = match unsafe { readable(eq, flags, "fi_eq_readerr") } {
            Ok(i) => i,
            Err(e) => return e.ssize(),
        };
        if buf.is_null() {
            tracing::warn!("fi_eq_readerr: NULL entry");
            return Error::EINVAL.ssize();
        }
        let mut st = inner.state.lock();
        // SAFETY: buf is an fi_eq_err_entry of the application's API version.
        unsafe { inner.read_err_locked(&mut st, buf, flags) }
    })
}

unsafe extern "C" fn eq_write(
    eq: *mut ffi::fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    flags: u64,
) -> isize {
    ffi_guard_or("fi_eq_write", Error::EOTHER.ssize(), || {
        // SAFETY: eq comes from the application.
        let Some(e) = (unsafe { Eq::from_ptr(eq, "fi_eq_write") }) else {
            return Error::EINVAL.ssize();
        };
        if flags != 0 {
            tracing::warn!("fi_eq_write: unsupported flags {flags:#x}");
            return Error::EBADFLAGS.ssize();
        }
        if buf.is_null() && len > 0 {
            tracing::warn!("fi_eq_write: NULL buffer of {len} bytes");
            return Error::EINVAL.ssize();
        }
        let bytes = if len == 0 {
            &[][..]
        } else {
            // SAFETY: buf holds len bytes (API contract).
            unsafe { std::slice::from_raw_parts(buf as *const u8, len) }
        };
        e.inner.write_event(event, bytes);
        len as isize
    })
}

unsafe extern "C" fn eq_strerror(
    _eq: *mut ffi::fid_eq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    ffi_guard_or("fi_eq_strerror", c"unimem: error".as_ptr(), || {
        // SAFETY: buf is NULL or holds len bytes (API contract).
        unsafe { errdata::strerror(prov_errno, buf, len) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn open_fabric() -> *mut ffi::fid_fabric {
        let mut attr = ffi::fi_fabric_attr {
            // The API version the core would have set.
            api_version: ffi::fi_version(1, 17),
            ..Default::default()
        };
        let mut fab: *mut ffi::fid_fabric = ptr::null_mut();
        // SAFETY: live locals.
        let opened = unsafe { crate::fabric::open(&mut attr, &mut fab, ptr::null_mut()) };
        assert_eq!(opened, Ok(()));
        fab
    }

    fn open_eq(
        fab: *mut ffi::fid_fabric,
        wait_obj: ffi::fi_wait_obj,
    ) -> Result<*mut ffi::fid_eq, Error> {
        let mut attr = ffi::fi_eq_attr {
            size: 32,
            flags: ffi::FI_WRITE,
            wait_obj,
            ..Default::default()
        };
        let mut eq: *mut ffi::fid_eq = ptr::null_mut();
        // SAFETY: fab is a live fabric of ours; locals are live.
        let rc =
            unsafe { ((*(*fab).ops).eq_open.unwrap())(fab, &mut attr, &mut eq, ptr::null_mut()) };
        crate::base::result_of(rc).map(|()| eq)
    }

    /// # Safety
    /// `fid` must be a live object of ours.
    unsafe fn close(fid: *mut ffi::fid) -> c_int {
        // SAFETY: guaranteed by the caller.
        unsafe { ((*(*fid).ops).close.unwrap())(fid) }
    }

    fn entry(context: usize) -> ffi::fi_eq_entry {
        ffi::fi_eq_entry {
            fid: ptr::null_mut(),
            context: context as *mut c_void,
            data: 0,
        }
    }

    const ENTRY: usize = size_of::<ffi::fi_eq_entry>();

    /// # Safety
    /// `eq` must be a live EQ of ours.
    unsafe fn write(eq: *mut ffi::fid_eq, context: usize) -> isize {
        let e = entry(context);
        // SAFETY: e holds ENTRY bytes.
        unsafe {
            ((*(*eq).ops).write.unwrap())(
                eq,
                ffi::FI_NOTIFY,
                &e as *const _ as *const c_void,
                ENTRY,
                0,
            )
        }
    }

    /// # Safety
    /// `eq` must be a live EQ of ours.
    unsafe fn read(eq: *mut ffi::fid_eq, flags: u64) -> Result<(u32, usize), Error> {
        let mut e = entry(0);
        let mut event = u32::MAX;
        // SAFETY: e holds ENTRY bytes.
        let n = unsafe {
            ((*(*eq).ops).read.unwrap())(
                eq,
                &mut event,
                &mut e as *mut _ as *mut c_void,
                ENTRY,
                flags,
            )
        };
        match Error::from_ret(n) {
            Some(e) => Err(e),
            None if n == ENTRY as isize => Ok((event, e.context as usize)),
            None => panic!("fi_eq_read returned {n}"),
        }
    }

    #[test]
    fn peek_then_read_in_order() {
        let fab = open_fabric();
        let eq = open_eq(fab, ffi::FI_WAIT_NONE).unwrap();
        // SAFETY: live objects of ours.
        unsafe {
            for i in 0..5 {
                assert_eq!(write(eq, i), ENTRY as isize);
            }
            for i in 0..5 {
                assert_eq!(read(eq, ffi::FI_PEEK), Ok((ffi::FI_NOTIFY, i)));
                assert_eq!(read(eq, ffi::FI_PEEK), Ok((ffi::FI_NOTIFY, i)));
                assert_eq!(read(eq, 0), Ok((ffi::FI_NOTIFY, i)));
            }
            assert_eq!(read(eq, 0), Err(Error::EAGAIN));
            assert_eq!(read(eq, ffi::FI_WRITE), Err(Error::EBADFLAGS));
            // Too small a buffer: refused, event kept.
            assert_eq!(write(eq, 7), ENTRY as isize);
            let mut small = [0u8; 4];
            let n = ((*(*eq).ops).read.unwrap())(
                eq,
                ptr::null_mut(),
                small.as_mut_ptr() as *mut c_void,
                4,
                0,
            );
            assert_eq!(n, Error::ETOOSMALL.ssize());
            assert_eq!(read(eq, 0), Ok((ffi::FI_NOTIFY, 7)));
            assert_eq!(close(eq as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn errors_block_reads_until_taken() {
        let fab = open_fabric();
        let eq = open_eq(fab, ffi::FI_WAIT_UNSPEC).unwrap();
        // SAFETY: live objects of ours.
        unsafe {
            let inner = Eq::state_of(eq as *const ffi::fid).unwrap();
            inner.write_error(EqError {
                fid: eq as *mut ffi::fid,
                context: 5 as *mut c_void,
                data: 3,
                err: ffi::FI_EINVAL,
                prov_errno: 0,
                err_data: b"detail".to_vec(),
            });
            inner.write_entry(
                ffi::FI_AV_COMPLETE,
                eq as *mut ffi::fid,
                5 as *mut c_void,
                2,
            );
            assert_eq!(read(eq, 0), Err(Error::EAVAIL));
            let readerr = (*(*eq).ops).readerr.unwrap();
            let mut err = ffi::fi_eq_err_entry::default();
            let full = size_of::<ffi::fi_eq_err_entry>() as isize;
            assert_eq!(readerr(eq, &mut err, ffi::FI_PEEK), full);
            assert_eq!((err.data, err.err_data_size), (3, 6));
            let peeked = std::slice::from_raw_parts(err.err_data as *const u8, 6);
            assert_eq!(peeked, b"detail", "valid until the next read");
            // A buffer of our own this time: the data is copied into it.
            let mut mine = [0u8; 3];
            err.err_data = mine.as_mut_ptr() as *mut c_void;
            err.err_data_size = mine.len();
            assert_eq!(readerr(eq, &mut err, ffi::FI_PEEK), full);
            assert_eq!((&mine, err.err_data_size), (b"det", 3));
            err = ffi::fi_eq_err_entry::default();
            assert_eq!(readerr(eq, &mut err, 0), full);
            assert_eq!(
                (err.context as usize, err.data, err.err),
                (5, 3, ffi::FI_EINVAL)
            );
            assert_eq!(err.err_data_size, 6);
            let data = std::slice::from_raw_parts(err.err_data as *const u8, 6);
            assert_eq!(data, b"detail");
            assert_eq!(readerr(eq, &mut err, 0), Error::EAGAIN.ssize());
            assert_eq!(read(eq, 0), Ok((ffi::FI_AV_COMPLETE, 5)));
            drop(inner);
            assert_eq!(close(eq as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn wait_fd_mirrors_the_queue() {
        let fab = open_fabric();
        let eq = open_eq(fab, ffi::FI_WAIT_FD).unwrap();
        let readable = |fd: c_int| {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 0) }
        };
        // SAFETY: live objects of ours.
        unsafe {
            let mut fd: c_int = -1;
            let control = (*(*eq).fid.ops).control.unwrap();
            assert_eq!(
                control(
                    eq as *mut ffi::fid,
                    ffi::FI_GETWAIT as c_int,
                    &mut fd as *mut c_int as *mut c_void
                ),
                0
            );
            assert!(fd >= 0);
            assert_eq!(trywait(eq as *const ffi::fid), Some(0));
            assert_eq!(readable(fd), 0);
            assert_eq!(write(eq, 1), ENTRY as isize);
            assert_eq!(trywait(eq as *const ffi::fid), Some(ret::EAGAIN));
            assert_eq!(readable(fd), 1);
            assert!(read(eq, ffi::FI_PEEK).is_ok());
            assert_eq!(readable(fd), 1, "a peek leaves it readable");
            assert!(read(eq, 0).is_ok());
            assert_eq!(readable(fd), 0);
            assert_eq!(close(eq as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn sread_times_out_and_wakes() {
        let fab = open_fabric();
        let eq = open_eq(fab, ffi::FI_WAIT_UNSPEC).unwrap();
        // SAFETY: live objects of ours.
        unsafe {
            let sread = (*(*eq).ops).sread.unwrap();
            let mut e = entry(0);
            let mut event = 0u32;
            let t = Instant::now();
            let n = sread(
                eq,
                &mut event,
                &mut e as *mut _ as *mut c_void,
                ENTRY,
                100,
                0,
            );
            assert_eq!(n, Error::EAGAIN.ssize());
            assert!(t.elapsed() >= Duration::from_millis(100));
            let inner = Eq::state_of(eq as *const ffi::fid).unwrap();
            let writer = std::thread::spawn(move || {
                // Not a synchronisation: likely lets sread block first.
                std::thread::sleep(Duration::from_millis(20));
                inner.write_entry(ffi::FI_NOTIFY, ptr::null_mut(), 8 as *mut c_void, 0);
            });
            let n = sread(
                eq,
                &mut event,
                &mut e as *mut _ as *mut c_void,
                ENTRY,
                -1,
                0,
            );
            assert_eq!(n, ENTRY as isize);
            assert_eq!(e.context as usize, 8);
            writer.join().unwrap();
            assert_eq!(close(eq as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn open_checks_attributes() {
        let fab = open_fabric();
        assert_eq!(open_eq(fab, ffi::FI_WAIT_SET).err(), Some(Error::ENOSYS));
        assert_eq!(
            open_eq(fab, ffi::FI_WAIT_MUTEX_COND).err(),
            Some(Error::ENOSYS)
        );
        assert_eq!(open_eq(fab, 77).err(), Some(Error::EINVAL));
        let eq = open_eq(fab, ffi::FI_WAIT_YIELD).unwrap();
        // SAFETY: live objects of ours.
        unsafe {
            assert_eq!(close(fab as *mut ffi::fid), ret::EBUSY, "EQ still open");
            assert_eq!(close(eq as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
            assert_eq!(fid::close::<EqInner>(ptr::null_mut()), ret::EINVAL);
        }
    }
}
