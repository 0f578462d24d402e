//! The fabric object (`fi_fabric`): the root of everything a process opens
//! through unimem. It holds the configuration snapshot its children use,
//! opens event queues and answers `fi_trywait`.

use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use crate::base::config;
use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, FiObject, FidObject, Parent};
use crate::base::guard::ffi_guard;
use crate::base::provider;
use crate::base::unsupported;
use crate::cntr;
use crate::cq;
use crate::domain;
use crate::eq;
use crate::info::attr::FabricAttr;
use crate::state::FabricState;

/// Our `struct fid_fabric`.
pub type Fabric = FidObject<FabricState>;

static FABRIC_FI_OPS: ffi::fi_ops = fid::fi_ops::<FabricState>();

// SAFETY: fid_fabric starts with its struct fid.
unsafe impl FiObject for FabricState {
    type Fid = ffi::fid_fabric;
    const CLASS: u32 = ffi::FI_CLASS_FABRIC;
    const KIND: &'static str = "fabric";
    const FI_OPS: &'static ffi::fi_ops = &FABRIC_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(fabric: &Fabric) -> Result<(), Error> {
        if let Err(n) = fid::check_no_children(fabric.inner.children()) {
            tracing::warn!("fi_close(fabric): {n} child object(s) still open");
            return Err(Error::EBUSY);
        }
        tracing::info!("fabric {fabric:p} closed");
        Ok(())
    }
}

static FABRIC_OPS: ffi::fi_ops_fabric = ffi::fi_ops_fabric {
    size: size_of::<ffi::fi_ops_fabric>(),
    domain: Some(fabric_domain),
    passive_ep: Some(unsupported::fi_passive_ep),
    eq_open: Some(fabric_eq_open),
    wait_open: Some(unsupported::fi_wait_open),
    trywait: Some(fabric_trywait),
    domain2: Some(fabric_domain2),
};

/// The provider's `fabric` callback (behind `fi_fabric`).
///
/// # Safety
/// `attr` must be NULL or a valid `fi_fabric_attr`; `fabric` NULL or
/// writable.
pub unsafe fn open(
    attr: *mut ffi::fi_fabric_attr,
    fabric: *mut *mut ffi::fid_fabric,
    context: *mut c_void,
) -> Result<(), Error> {
    if attr.is_null() || fabric.is_null() {
        tracing::warn!("fi_fabric: NULL attr or fabric pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL attr is a valid fi_fabric_attr from the core.
    let attr = unsafe { FabricAttr::from_c(&*attr) };
    if let Some(name) = attr.name.as_deref().filter(|n| *n != provider::NAME) {
        tracing::warn!(
            "fi_fabric: fabric '{name}' is not ours ('{}')",
            provider::NAME
        );
        return Err(Error::EINVAL);
    }
    let obj = Box::new(Fabric {
        fid: ffi::fid_fabric {
            fid: Fabric::header(context),
            ops: fid::ops_ptr(&FABRIC_OPS),
            // Set by the core once we return.
            api_version: attr.api_version,
        },
        inner: Arc::new(FabricState::new(config::get())),
    });
    // SAFETY: fabric is non-NULL (checked).
    let obj = unsafe { obj.install(fabric) };
    tracing::info!("fabric {obj:p} opened");
    Ok(())
}

unsafe extern "C" fn fabric_domain(
    fabric: *mut ffi::fid_fabric,
    info: *mut ffi::fi_info,
    dom: *mut *mut ffi::fid_domain,
    context: *mut c_void,
) -> c_int {
    ffi_guard("fi_domain", || {
        // SAFETY: fabric comes from the application (fid_fabric starts with fid).
        let Some(f) = (unsafe { Fabric::from_ptr(fabric, "fi_domain") }) else {
            return ret::EINVAL;
        };
        // SAFETY: info and dom come from the application's fi_domain call.
        ffi::error::ret_of(unsafe { domain::open(&f.inner, f.fid.api_version, info, dom, context) })
    })
}

unsafe extern "C" fn fabric_domain2(
    fabric: *mut ffi::fid_fabric,
    info: *mut ffi::fi_info,
    dom: *mut *mut ffi::fid_domain,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    if flags != 0 {
        // FI_PEER (peer providers) and friends.
        return ffi_guard("fi_domain2", || {
            tracing::info!("fi_domain2: flags {flags:#x} not supported");
            ret::ENOSYS
        });
    }
    // SAFETY: same contract as fi_domain.
    unsafe { fabric_domain(fabric, info, dom, context) }
}

unsafe extern "C" fn fabric_eq_open(
    fabric: *mut ffi::fid_fabric,
    attr: *mut ffi::fi_eq_attr,
    eq: *mut *mut ffi::fid_eq,
    context: *mut c_void,
) -> c_int {
    ffi_guard("fi_eq_open", || {
        // SAFETY: fabric comes from the application (fid_fabric starts with fid).
        let Some(f) = (unsafe { Fabric::from_ptr(fabric, "fi_eq_open") }) else {
            return ret::EINVAL;
        };
        // SAFETY: attr and eq come from the application's fi_eq_open.
        ffi::error::ret_of(unsafe { eq::open(&f.inner, f.fid.api_version, attr, eq, context) })
    })
}

/// `fi_trywait`: 0 when the application may block on the wait objects of
/// `fids`, -FI_EAGAIN when one of them has something to read (after a
/// progress pass for CQs and counters).
unsafe extern "C" fn fabric_trywait(
    fabric: *mut ffi::fid_fabric,
    fids: *mut *mut ffi::fid,
    count: c_int,
) -> c_int {
    ffi_guard("fi_trywait", || {
        // SAFETY: fabric comes from the application (fid_fabric starts with fid).
        if unsafe { Fabric::from_ptr(fabric, "fi_trywait") }.is_none() {
            return ret::EINVAL;
        }
        let Ok(count) = usize::try_from(count) else {
            tracing::warn!("fi_trywait: negative count {count}");
            return ret::EINVAL;
        };
        if fids.is_null() && count > 0 {
            tracing::warn!("fi_trywait: NULL fid array");
            return ret::EINVAL;
        }
        for i in 0..count {
            // SAFETY: fids holds count fid pointers (API contract).
            let fid = unsafe { *fids.add(i) } as *const ffi::fid;
            // SAFETY: each is NULL or a live fid; each check recognises only its own class.
            let rc = unsafe {
                eq::trywait(fid)
                    .or_else(|| cq::trywait(fid))
                    .or_else(|| cntr::trywait(fid))
            };
            match rc {
                Some(ret::SUCCESS) => {}
                Some(rc) => return rc,
                None => {
                    tracing::warn!("fi_trywait: fid {i} is not a unimem EQ, CQ or counter");
                    return ret::EINVAL;
                }
            }
        }
        ret::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr;

    #[test]
    fn open_close() {
        let mut attr = ffi::fi_fabric_attr::default();
        let mut fab: *mut ffi::fid_fabric = ptr::null_mut();
        // SAFETY: attr and fab are live locals; fab is then a fabric of ours.
        unsafe {
            assert_eq!(open(&mut attr, &mut fab, ptr::null_mut()), Ok(()));
            assert!(!fab.is_null());
            let ops = &*(*fab).fid.ops;
            assert_eq!(ops.size, size_of::<ffi::fi_ops>());
            assert_eq!((*(*fab).ops).size, size_of::<ffi::fi_ops_fabric>());
            let eq_open = (*(*fab).ops).eq_open.unwrap();
            assert_eq!(
                eq_open(fab, ptr::null_mut(), ptr::null_mut(), ptr::null_mut()),
                ret::EINVAL
            );
            let trywait = (*(*fab).ops).trywait.unwrap();
            assert_eq!(trywait(fab, ptr::null_mut(), 0), ret::SUCCESS);
            let mut not_ours: *mut ffi::fid = &mut (*fab).fid;
            assert_eq!(trywait(fab, &mut not_ours, 1), ret::EINVAL);
            assert_eq!((ops.close.unwrap())(&mut (*fab).fid), ret::SUCCESS);
        }
    }

    #[test]
    fn bad_arguments() {
        let mut attr = ffi::fi_fabric_attr::default();
        let mut fab: *mut ffi::fid_fabric = ptr::null_mut();
        attr.name = c"tcp".as_ptr() as *mut _;
        // SAFETY: open/close check the NULL pointers under test; other arguments are live locals.
        unsafe {
            assert_eq!(
                open(ptr::null_mut(), &mut fab, ptr::null_mut()),
                Err(Error::EINVAL)
            );
            assert_eq!(
                open(&mut attr, ptr::null_mut(), ptr::null_mut()),
                Err(Error::EINVAL)
            );
            assert_eq!(
                open(&mut attr, &mut fab, ptr::null_mut()),
                Err(Error::EINVAL)
            );
            assert_eq!(fid::close::<FabricState>(ptr::null_mut()), ret::EINVAL);
        }
    }
}
