//! The endpoint's `fi_ops_ep` (`fi_cancel`, `fi_getopt`, `fi_setopt`) and
//! `fi_ops_cm` (`fi_getname`; the rest is for connected endpoints).

use std::mem::size_of;
use std::os::raw::{c_int, c_void};

use super::inner::Ep;
use crate::base::ffi::{self, ret, Error};
use crate::base::guard::{ffi_guard, ffi_guard_or};
use crate::base::unsupported;

pub(super) static EP_OPS: ffi::fi_ops_ep = ffi::fi_ops_ep {
    size: size_of::<ffi::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(unsupported::fi_tx_context),
    rx_ctx: Some(unsupported::fi_rx_context),
    rx_size_left: Some(unsupported::fi_rx_size_left),
    tx_size_left: Some(unsupported::fi_tx_size_left),
};

pub(super) static EP_CM_OPS: ffi::fi_ops_cm = ffi::fi_ops_cm {
    size: size_of::<ffi::fi_ops_cm>(),
    setname: Some(unsupported::fi_setname),
    getname: Some(cm_getname),
    getpeer: Some(unsupported::fi_getpeer),
    connect: Some(unsupported::fi_connect),
    listen: Some(unsupported::fi_listen),
    accept: Some(unsupported::fi_accept),
    reject: Some(unsupported::fi_reject),
    shutdown: Some(unsupported::fi_shutdown),
    join: Some(unsupported::fi_join),
};

// --- fi_ops_ep --------------------------------------------------------------------

unsafe extern "C" fn ep_cancel(fid: *mut ffi::fid, context: *mut c_void) -> isize {
    ffi_guard_or("fi_cancel", Error::EOTHER.ssize(), || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_cancel") }) else {
            return Error::EINVAL.ssize();
        };
        let mut messenger = ep.inner.messenger.lock();
        let found = messenger.cancel(context as usize);
        ep.inner.drain(&mut messenger);
        if found {
            0
        } else {
            Error::ENOENT.ssize()
        }
    })
}

unsafe extern "C" fn ep_getopt(
    fid: *mut ffi::fid,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut usize,
) -> c_int {
    ffi_guard("fi_getopt", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_getopt") }) else {
            return ret::EINVAL;
        };
        if level as u32 != ffi::FI_OPT_ENDPOINT || optname as u32 != ffi::FI_OPT_MIN_MULTI_RECV {
            return ret::ENOPROTOOPT;
        }
        if optval.is_null() || optlen.is_null() {
            return ret::EINVAL;
        }
        // SAFETY: optlen is non-NULL and points to the caller's size.
        if unsafe { *optlen } < size_of::<usize>() {
            return ret::ETOOSMALL;
        }
        let min = ep.inner.messenger.lock().min_multi_recv();
        // SAFETY: optval holds at least size_of::<usize>() bytes (checked).
        unsafe {
            (optval as *mut usize).write_unaligned(min);
            *optlen = size_of::<usize>();
        }
        ret::SUCCESS
    })
}

unsafe extern "C" fn ep_setopt(
    fid: *mut ffi::fid,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    ffi_guard("fi_setopt", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_setopt") }) else {
            return ret::EINVAL;
        };
        if level as u32 != ffi::FI_OPT_ENDPOINT || optname as u32 != ffi::FI_OPT_MIN_MULTI_RECV {
            tracing::info!("fi_setopt: option {level}/{optname} is not supported");
            return ret::ENOPROTOOPT;
        }
        if optval.is_null() || optlen != size_of::<usize>() {
            tracing::warn!("fi_setopt(FI_OPT_MIN_MULTI_RECV): the value must be a size_t");
            return ret::EINVAL;
        }
        // SAFETY: optval points to a size_t (checked length).
        let min = unsafe { (optval as *const usize).read_unaligned() };
        ep.inner.messenger.lock().set_min_multi_recv(min);
        ret::SUCCESS
    })
}

// --- fi_ops_cm ----------------------------------------------------------------------

unsafe extern "C" fn cm_getname(
    fid: *mut ffi::fid,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    ffi_guard("fi_getname", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_getname") }) else {
            return ret::EINVAL;
        };
        if addrlen.is_null() {
            return ret::EINVAL;
        }
        let name = ep.inner.messenger.lock().addr().to_string();
        // Every name has the same length, NUL-padded: MPICH and SOS gather
        // names at the stride of their own (pid and index digits vary).
        let needed = (name.len() + 1).max(crate::info::addr::MAX_ADDR_LEN);
        // SAFETY: addrlen is non-NULL and holds the buffer's size.
        let room = unsafe { *addrlen };
        // SAFETY: as above; the caller learns the size it needs.
        unsafe { *addrlen = needed };
        if addr.is_null() || room < needed {
            return ret::ETOOSMALL;
        }
        // SAFETY: addr holds `room >= needed` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), addr as *mut u8, name.len());
            std::ptr::write_bytes((addr as *mut u8).add(name.len()), 0, needed - name.len());
        }
        ret::SUCCESS
    })
}
