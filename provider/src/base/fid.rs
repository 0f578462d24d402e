//! What every libfabric object (fid) of ours shares: recognising our objects
//! in pointers applications hand back, parent/child reference counting, and
//! freeing them at `fi_close`.
//!
//! Object layout: each object is a `#[repr(C)]` struct whose first field is
//! the libfabric `fid_*` struct (itself starting with `struct fid`), so the
//! `fid` pointer the application holds is the address of our object.

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::base::ffi::{self, ret};
use crate::base::guard::ffi_guard;
use crate::base::unsupported;

/// Recover our object `T` from a fid pointer.
///
/// It is ours iff it is non-NULL, of class `class` and uses our `fi_ops`
/// table `ops` (a foreign object never points at our static table).
///
/// # Safety
/// `fid` must be NULL or point to a live `struct fid`; if it passes the
/// checks it must be the first field of a live `T`.
pub unsafe fn ours<T>(
    fid: *const ffi::fid,
    class: usize,
    ops: &'static ffi::fi_ops,
) -> Option<*mut T> {
    // SAFETY: non-NULL fid points to a live struct fid (caller).
    let f = unsafe { fid.as_ref() }?;
    (f.fclass == class && ptr::eq(f.ops, ops)).then_some(fid as *mut T)
}

/// `&'static` table → the `*mut` libfabric's structs declare. Nobody
/// writes through it: the core and applications only call the entries.
pub fn ops_ptr<T>(table: &'static T) -> *mut T {
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
/// `fid` must be the first field of a live `Box<T>` made by one of our
/// open functions, handed back by the application's `fi_close`.
pub unsafe fn free_closed<T>(fid: *mut ffi::fid) {
    // SAFETY: fid points to a live object of ours (caller).
    unsafe {
        (*fid).fclass = ffi::FI_CLASS_UNSPEC as usize;
        (*fid).ops = ops_ptr(&CLOSED_OPS);
        drop(Box::from_raw(fid as *mut T));
    }
}

/// What a closed object's fid answers.
pub static CLOSED_OPS: ffi::fi_ops = ffi::fi_ops {
    size: std::mem::size_of::<ffi::fi_ops>(),
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

    static OPS: ffi::fi_ops = ffi::fi_ops {
        size: std::mem::size_of::<ffi::fi_ops>(),
        close: None,
        bind: Some(unsupported::fi_bind),
        control: Some(unsupported::fi_control),
        ops_open: Some(unsupported::fi_open_ops),
        tostr: Some(unsupported::fi_tostr),
        ops_set: Some(unsupported::fi_set_ops),
    };
    static OTHER_OPS: ffi::fi_ops = ffi::fi_ops {
        size: 0,
        close: None,
        bind: None,
        control: None,
        ops_open: None,
        tostr: None,
        ops_set: None,
    };

    #[test]
    fn recognises_own_objects_only() {
        let mut f = ffi::fid {
            fclass: ffi::FI_CLASS_FABRIC as usize,
            context: ptr::null_mut(),
            ops: ops_ptr(&OPS),
        };
        let fabric = ffi::FI_CLASS_FABRIC as usize;
        // SAFETY: f is a live struct fid.
        unsafe {
            assert!(ours::<ffi::fid>(&f, fabric, &OPS).is_some());
            assert!(ours::<ffi::fid>(&f, ffi::FI_CLASS_DOMAIN as usize, &OPS).is_none());
            assert!(ours::<ffi::fid>(ptr::null(), fabric, &OPS).is_none());
            f.ops = ops_ptr(&OTHER_OPS);
            assert!(ours::<ffi::fid>(&f, fabric, &OPS).is_none());
        }
    }
}
