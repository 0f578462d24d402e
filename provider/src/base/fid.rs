//! What every libfabric object (fid) of ours shares: its layout and
//! recognition ([`FidObject`], [`FiObject`]), handing it to the
//! application and freeing it at `fi_close`, the generic `fi_ops` entries
//! (close, bind, control), and parent/child reference counting.
//!
//! Object layout: each object is a `#[repr(C)]` [`FidObject`] whose first
//! field is the libfabric `fid_*` struct (itself starting with `struct
//! fid`), so the `fid` pointer the application holds is the address of our
//! object. The state behind it is shared (`Arc`) with the objects opened
//! from it or bound to it, which may outlive the application's handle.
//! Each kind of object says only what is particular to it by implementing
//! [`FiObject`] on its state (and [`Bind`], [`Control`] where it has them).

use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::base::ffi::{self, ret, Error};
use crate::base::guard::ffi_guard;
use crate::base::unsupported;

/// One of our libfabric objects, as the application holds it.
#[repr(C)]
pub struct FidObject<S: FiObject> {
    /// Must stay first: applications hold a pointer to it.
    pub fid: S::Fid,
    /// What the object's children and bound objects share with it.
    pub inner: Arc<S>,
}

/// One kind of libfabric object, implemented by its shared state.
///
/// # Safety
/// `Fid` must be a `#[repr(C)]` libfabric struct that starts with `struct
/// fid` (`fid_cq`, ...): the plumbing casts between the two.
pub unsafe trait FiObject: Send + Sync + Sized + 'static {
    /// The libfabric struct the application sees (`fid_cq`, ...).
    type Fid;
    /// `FI_CLASS_*`.
    const CLASS: u32;
    /// How a warning names it: "not a unimem {KIND}".
    const KIND: &'static str;
    /// The object's `fi_ops` table, usually [`fi_ops`] with some entries
    /// replaced. A static: its address tells our objects from others.
    const FI_OPS: &'static ffi::fi_ops;

    /// Logs a warning about this kind of object. Implemented in the
    /// object's module as `tracing::warn!("{args}")`: tracing names the
    /// module of the call site, which chooses the libfabric log subsystem.
    fn warn(args: fmt::Arguments<'_>);

    /// `fi_close`: `Ok` lets the object go (logging that it closes), an
    /// error keeps it open (logging why).
    fn on_close(obj: &FidObject<Self>) -> Result<(), Error>;
}

/// Objects with an `fi_bind` of their own ([`bind`]).
pub trait Bind: FiObject {
    /// # Safety
    /// `bfid` must be NULL or a live `struct fid`.
    unsafe fn bind(obj: &FidObject<Self>, bfid: *mut ffi::fid, flags: u64) -> Result<(), Error>;
}

/// Objects with an `fi_control` of their own ([`control`]).
pub trait Control: FiObject {
    /// # Safety
    /// `arg` must be what `command` expects (application contract).
    unsafe fn control(obj: &FidObject<Self>, command: c_int, arg: *mut c_void)
        -> Result<(), Error>;
}

impl<S: FiObject> FidObject<S> {
    /// The `struct fid` of a new object of this kind.
    pub fn header(context: *mut c_void) -> ffi::fid {
        ffi::fid {
            fclass: S::CLASS as usize,
            context,
            ops: ops_ptr(S::FI_OPS),
        }
    }

    /// Hands a new object to the application: `*out` becomes its address,
    /// which the application passes back to every call until `fi_close`
    /// frees it. Returns the address too.
    ///
    /// # Safety
    /// `out` must be valid for a write.
    pub unsafe fn install(self: Box<Self>, out: *mut *mut S::Fid) -> *mut Self {
        let obj = Box::into_raw(self);
        // SAFETY: out is writable (caller); repr(C) with the fid first, so
        // the object's address is the fid's.
        unsafe { *out = obj as *mut S::Fid };
        obj
    }

    /// Our object behind `fid`, or None if it is not one of this kind
    /// (NULL, another class, or another provider's: those never point at
    /// our `fi_ops` table).
    ///
    /// # Safety
    /// `fid` must be NULL or a live `struct fid`; an object found stays
    /// alive for `'a` (until the application closes it).
    #[inline]
    pub unsafe fn find<'a>(fid: *const ffi::fid) -> Option<&'a Self> {
        // SAFETY: non-NULL fid points to a live struct fid (caller).
        let f = unsafe { fid.as_ref() }?;
        let ours = f.fclass == S::CLASS as usize && ptr::eq(f.ops, S::FI_OPS);
        // SAFETY: class and ops table are ours: fid is the first field of a live FidObject<S>.
        ours.then(|| unsafe { &*(fid as *const Self) })
    }

    /// [`find`](Self::find), with a warning naming `op` when it is not ours.
    ///
    /// # Safety
    /// As [`find`](Self::find).
    #[inline]
    pub unsafe fn from_fid<'a>(fid: *const ffi::fid, op: &str) -> Option<&'a Self> {
        // SAFETY: forwarded from the caller.
        let found = unsafe { Self::find(fid) };
        if found.is_none() {
            not_ours::<S>(op);
        }
        found
    }

    /// [`from_fid`](Self::from_fid) for the typed pointer of the object's
    /// own ops (`*mut fid_cq` for `fi_cq_read`, ...).
    ///
    /// # Safety
    /// `ptr` must be NULL or a live `S::Fid`; see [`find`](Self::find).
    #[inline]
    pub unsafe fn from_ptr<'a>(ptr: *const S::Fid, op: &str) -> Option<&'a Self> {
        // SAFETY: S::Fid starts with its struct fid (FiObject contract).
        unsafe { Self::from_fid(ptr as *const ffi::fid, op) }
    }

    /// The shared state of our object behind `fid` (given to a bind), or
    /// None if it is not one of this kind.
    ///
    /// # Safety
    /// `fid` must be NULL or a live `struct fid`.
    pub unsafe fn state_of(fid: *const ffi::fid) -> Option<Arc<S>> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::find(fid) }.map(|obj| Arc::clone(&obj.inner))
    }
}

#[cold]
#[inline(never)]
fn not_ours<S: FiObject>(op: &str) {
    S::warn(format_args!("{op}: not a unimem {}", S::KIND));
}

/// The `fi_ops` table of an object of kind `S` with nothing particular:
/// the generic `fi_close` and the unsupported stubs. An object replaces
/// the entries it implements (`bind: Some(fid::bind::<S>)`, ...).
pub const fn fi_ops<S: FiObject>() -> ffi::fi_ops {
    ffi::fi_ops {
        size: size_of::<ffi::fi_ops>(),
        close: Some(close::<S>),
        bind: Some(unsupported::fi_bind),
        control: Some(unsupported::fi_control),
        ops_open: Some(unsupported::fi_open_ops),
        tostr: Some(unsupported::fi_tostr),
        ops_set: Some(unsupported::fi_set_ops),
    }
}

/// `fi_close` of an object of kind `S`.
///
/// # Safety
/// `fid` must be NULL or a live `struct fid`.
pub unsafe extern "C" fn close<S: FiObject>(fid: *mut ffi::fid) -> c_int {
    ffi_guard("fi_close", || {
        // SAFETY: fid comes from the application's fi_close.
        let Some(obj) = (unsafe { FidObject::<S>::from_fid(fid, "fi_close") }) else {
            return ret::EINVAL;
        };
        if let Err(e) = S::on_close(obj) {
            return e.ret();
        }
        // SAFETY: a live object of ours, boxed by install(); the
        // application gives up its pointer with fi_close. Children and
        // bound objects hold the Arc'd state, not this box.
        unsafe { free_closed::<S>(fid) };
        ret::SUCCESS
    })
}

/// `fi_bind` (`fi_ep_bind`, `fi_av_bind`, ...) of an object of kind `S`.
///
/// # Safety
/// `fid` and `bfid` must be NULL or live `struct fid`s.
pub unsafe extern "C" fn bind<S: Bind>(
    fid: *mut ffi::fid,
    bfid: *mut ffi::fid,
    flags: u64,
) -> c_int {
    ffi_guard("fi_bind", || {
        // SAFETY: fid comes from the application.
        match unsafe { FidObject::<S>::from_fid(fid, "fi_bind") } {
            // SAFETY: bfid comes from the application.
            Some(obj) => ffi::error::ret_of(unsafe { S::bind(obj, bfid, flags) }),
            None => ret::EINVAL,
        }
    })
}

/// `fi_control` of an object of kind `S`.
///
/// # Safety
/// `fid` must be NULL or a live `struct fid`, `arg` right for `command`.
pub unsafe extern "C" fn control<S: Control>(
    fid: *mut ffi::fid,
    command: c_int,
    arg: *mut c_void,
) -> c_int {
    ffi_guard("fi_control", || {
        // SAFETY: fid comes from the application.
        match unsafe { FidObject::<S>::from_fid(fid, "fi_control") } {
            // SAFETY: arg is what the command expects (application contract).
            Some(obj) => ffi::error::ret_of(unsafe { S::control(obj, command, arg) }),
            None => ret::EINVAL,
        }
    })
}

/// `&'static` table → the `*mut` libfabric's structs declare. Nobody
/// writes through it: the core and applications only call the entries.
pub const fn ops_ptr<T>(table: &'static T) -> *mut T {
    table as *const T as *mut T
}

/// Number of open children of an object. `fi_close` on the object is
/// refused with -FI_EBUSY while it is not zero.
#[derive(Debug, Default)]
pub struct Children(AtomicUsize);

impl Children {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// Objects that can have children.
pub trait Parent: Send + Sync + 'static {
    fn children(&self) -> &Children;
}

/// Held by a child for its whole life: keeps the parent's state alive and
/// counted, so closing the parent first fails with -FI_EBUSY instead of
/// leaving the child with a dangling parent.
pub struct ParentRef<P: Parent + ?Sized>(Arc<P>);

impl<P: Parent + ?Sized> ParentRef<P> {
    pub fn new(parent: &Arc<P>) -> Self {
        parent.children().0.fetch_add(1, Ordering::AcqRel);
        ParentRef(Arc::clone(parent))
    }
}

/// Another hold on the same parent, counted like the first.
impl<P: Parent + ?Sized> Clone for ParentRef<P> {
    fn clone(&self) -> Self {
        ParentRef::new(&self.0)
    }
}

impl<P: Parent + ?Sized> std::ops::Deref for ParentRef<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.0
    }
}

impl<P: Parent + ?Sized> std::fmt::Debug for ParentRef<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ParentRef({:p})", Arc::as_ptr(&self.0))
    }
}

impl<P: Parent + ?Sized> Drop for ParentRef<P> {
    fn drop(&mut self) {
        self.0.children().0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Refuse to close an object with open children: `Err(open children)`.
/// The caller logs (under its own subsystem) and returns -FI_EBUSY.
pub fn check_no_children(children: &Children) -> Result<(), usize> {
    match children.count() {
        0 => Ok(()),
        n => Err(n),
    }
}

/// Frees one of our objects at `fi_close`, leaving its fid pointing at
/// [`CLOSED_OPS`]. Using an object after closing it is an application
/// error that no provider can always catch (the memory may be reused), but
/// the usual case, a second `fi_close` or a bind on a stale pointer, then
/// gets -FI_EINVAL and a warning instead of a double free: allocators keep
/// their bookkeeping at the start of a freed block, before `ops`.
///
/// # Safety
/// `fid` must be the first field of a live `FidObject<S>` made by
/// [`FidObject::install`], handed back by the application's `fi_close`.
unsafe fn free_closed<S: FiObject>(fid: *mut ffi::fid) {
    // SAFETY: fid points to a live object of ours (caller).
    unsafe {
        (*fid).fclass = ffi::FI_CLASS_UNSPEC as usize;
        (*fid).ops = ops_ptr(&CLOSED_OPS);
        drop(Box::from_raw(fid as *mut FidObject<S>));
    }
}

/// What a closed object's fid answers.
pub static CLOSED_OPS: ffi::fi_ops = ffi::fi_ops {
    size: size_of::<ffi::fi_ops>(),
    close: Some(closed_close),
    bind: Some(closed_bind),
    control: Some(closed_control),
    ops_open: Some(unsupported::fi_open_ops),
    tostr: Some(unsupported::fi_tostr),
    ops_set: Some(unsupported::fi_set_ops),
};

fn use_after_close(op: &str) -> c_int {
    tracing::warn!("{op}: the object was already closed");
    ret::EINVAL
}

unsafe extern "C" fn closed_close(_fid: *mut ffi::fid) -> c_int {
    ffi_guard("fi_close", || use_after_close("fi_close"))
}

unsafe extern "C" fn closed_bind(_fid: *mut ffi::fid, _bfid: *mut ffi::fid, _flags: u64) -> c_int {
    ffi_guard("fi_bind", || use_after_close("fi_bind"))
}

unsafe extern "C" fn closed_control(
    _fid: *mut ffi::fid,
    _command: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi_guard("fi_control", || use_after_close("fi_control"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Node(Children);
    impl Parent for Node {
        fn children(&self) -> &Children {
            &self.0
        }
    }

    #[test]
    fn parent_refs_count_children() {
        let p = Arc::new(Node::default());
        assert!(check_no_children(&p.0).is_ok());
        let a = ParentRef::new(&p);
        let b = ParentRef::new(&p);
        assert_eq!(p.0.count(), 2);
        assert_eq!(check_no_children(&p.0), Err(2));
        drop(a);
        drop(b);
        assert!(check_no_children(&p.0).is_ok());
    }

    /// A kind of object for the tests; `busy` refuses fi_close.
    #[derive(Default)]
    struct Thing {
        busy: std::sync::atomic::AtomicBool,
    }

    static THING_OPS: ffi::fi_ops = fi_ops::<Thing>();

    // SAFETY: struct fid trivially starts with a struct fid.
    unsafe impl FiObject for Thing {
        type Fid = ffi::fid;
        const CLASS: u32 = ffi::FI_CLASS_CNTR;
        const KIND: &'static str = "thing";
        const FI_OPS: &'static ffi::fi_ops = &THING_OPS;

        fn warn(args: fmt::Arguments<'_>) {
            tracing::warn!("{args}");
        }

        fn on_close(obj: &FidObject<Self>) -> Result<(), Error> {
            match obj.inner.busy.load(Ordering::Relaxed) {
                true => Err(Error::EBUSY),
                false => Ok(()),
            }
        }
    }

    #[test]
    fn installs_recognises_and_closes_own_objects_only() {
        let obj = Box::new(FidObject {
            fid: FidObject::<Thing>::header(7 as *mut c_void),
            inner: Arc::new(Thing::default()),
        });
        let mut out: *mut ffi::fid = ptr::null_mut();
        // SAFETY: out is writable; the object stays alive until closed below.
        unsafe {
            let obj = obj.install(&mut out);
            assert_eq!(out, obj as *mut ffi::fid);
            assert_eq!((*out).context as usize, 7);
            let found = FidObject::<Thing>::from_fid(out, "test").unwrap();
            assert!(ptr::eq(found, obj));
            let state = FidObject::<Thing>::state_of(out).unwrap();
            assert_eq!(Arc::strong_count(&state), 2);
            assert!(FidObject::<Thing>::find(ptr::null()).is_none());

            let mut other = ffi::fid {
                fclass: ffi::FI_CLASS_CQ as usize,
                ..*out
            };
            assert!(FidObject::<Thing>::find(&other).is_none(), "other class");
            other.fclass = ffi::FI_CLASS_CNTR as usize;
            other.ops = ops_ptr(&CLOSED_OPS);
            assert!(FidObject::<Thing>::find(&other).is_none(), "other table");

            let close = (*(*out).ops).close.unwrap();
            state.busy.store(true, Ordering::Relaxed);
            assert_eq!(close(out), ret::EBUSY);
            assert!(FidObject::<Thing>::find(out).is_some(), "still open");
            assert_eq!(close(&mut other), ret::EINVAL);
            state.busy.store(false, Ordering::Relaxed);
            assert_eq!(close(out), ret::SUCCESS);
            assert_eq!(Arc::strong_count(&state), 1, "the box is gone");
            assert_eq!(THING_OPS.bind.unwrap()(out, out, 0), ret::ENOSYS);
        }
    }
}
