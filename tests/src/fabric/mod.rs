//! A thin wrapper over the real libfabric core (`libfabric.so.1`, loaded
//! with `dlopen`), for the `fabric-peer` helper: `fi_getinfo`, the fabric,
//! domain, AV, CQ, counter, memory region and endpoint objects, and the
//! data path (messages, RMA and atomics) through the ops tables (in C, `fi_send`,
//! `fi_write` and friends are `static inline` wrappers over exactly these
//! calls).
//!
//! Objects close on drop; [`Object::close`] closes explicitly and hands the
//! object back when the provider refuses (`-FI_EBUSY`). Posting operations
//! take raw buffers and are `unsafe`: libfabric reads or writes them until
//! the operation's completion, which no Rust lifetime can express here.

mod api;
mod atomic;
mod cq;
mod domain;
mod ep;
mod info;
mod rma;

pub use api::{api, Api};
pub use atomic::{AtomicBufs, AtomicFamily, AtomicForm, AtomicTarget, DATATYPE_NAMES, OP_NAMES};
pub use cq::{CqEntry, CqError};
pub use ep::{Match, TagMatch};
pub use info::{Hints, Info};
pub use rma::{RmaCall, RmaTarget};

use std::os::raw::c_int;

use unimem_fi_sys as ffi;

/// `FI_ADDR_UNSPEC`: any source.
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub use unimem_fi_sys::FI_ADDR_NOTAVAIL;

/// Negated libfabric error codes, as the calls return them.
pub mod rc {
    use unimem_fi_sys as ffi;
    pub const EAGAIN: i32 = -ffi::FI_EAGAIN;
    pub const EAVAIL: i32 = -(ffi::FI_EAVAIL as i32);
    pub const EINVAL: i32 = -ffi::FI_EINVAL;
    pub const EBUSY: i32 = -ffi::FI_EBUSY;
    pub const ENODATA: i32 = -ffi::FI_ENODATA;
    pub const ENOENT: i32 = -ffi::FI_ENOENT;
    pub const EMSGSIZE: i32 = -ffi::FI_EMSGSIZE;
    pub const EOPBADSTATE: i32 = -(ffi::FI_EOPBADSTATE as i32);
    pub const ENOKEY: i32 = -(ffi::FI_ENOKEY as i32);
}

/// A libfabric object: anything that starts with a `struct fid`.
pub trait Object: Sized {
    fn fid(&self) -> *mut ffi::fid;

    /// `fi_close`. On failure the object stays open and is handed back.
    fn close(self) -> Result<(), (Self, i32)> {
        // SAFETY: fid() is a live object we opened and have not closed.
        let rc = unsafe { raw_close(self.fid()) };
        if rc == 0 {
            std::mem::forget(self);
            Ok(())
        } else {
            Err((self, rc))
        }
    }
}

/// `fi_close`.
///
/// # Safety
/// `fid` must be a live object; on success it is gone.
unsafe fn raw_close(fid: *mut ffi::fid) -> c_int {
    // SAFETY: guaranteed by the caller; every object has fi_ops.close.
    unsafe { ((*(*fid).ops).close.expect("fi_ops.close"))(fid) }
}

/// Declares an owned handle of a libfabric object type, closed on drop.
macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $c:ty) => {
        $(#[$doc])*
        pub struct $name {
            ptr: *mut $c,
        }

        impl Object for $name {
            fn fid(&self) -> *mut ffi::fid {
                self.ptr.cast()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: ptr is live (close() forgets a closed handle).
                let rc = unsafe { raw_close(self.fid()) };
                if rc != 0 {
                    eprintln!("fi_close({}) on drop: {rc}", stringify!($name));
                }
            }
        }
    };
}

handle!(
    /// `struct fid_fabric`.
    Fabric,
    ffi::fid_fabric
);
handle!(
    /// `struct fid_domain`.
    Domain,
    ffi::fid_domain
);
handle!(
    /// `struct fid_av`.
    Av,
    ffi::fid_av
);
handle!(
    /// `struct fid_cq`.
    Cq,
    ffi::fid_cq
);
handle!(
    /// `struct fid_ep`.
    Ep,
    ffi::fid_ep
);
handle!(
    /// `struct fid_cntr`.
    Cntr,
    ffi::fid_cntr
);
handle!(
    /// `struct fid_mr`.
    Mr,
    ffi::fid_mr
);

fn check(rc: c_int) -> Result<(), i32> {
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}
