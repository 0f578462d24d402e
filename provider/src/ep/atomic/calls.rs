//! The entry points of `fi_ops_atomic`: each turns its arguments into a
//! [`Call`] and hands it to [`atomic`] (mod.rs); and the three `*valid`
//! queries.

use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::ptr;

use super::{atomic, Call, Elems};
use crate::base::ffi::{self, Error};
use unimem_proto::atomic::{max_count, AtomicCall};

pub static ATOMIC_OPS: ffi::fi_ops_atomic = ffi::fi_ops_atomic {
    size: size_of::<ffi::fi_ops_atomic>(),
    write: Some(atomic_write),
    writev: Some(atomic_writev),
    writemsg: Some(atomic_writemsg),
    inject: Some(atomic_inject),
    readwrite: Some(atomic_readwrite),
    readwritev: Some(atomic_readwritev),
    readwritemsg: Some(atomic_readwritemsg),
    compwrite: Some(atomic_compwrite),
    compwritev: Some(atomic_compwritev),
    compwritemsg: Some(atomic_compwritemsg),
    writevalid: Some(atomic_writevalid),
    readwritevalid: Some(atomic_readwritevalid),
    compwritevalid: Some(atomic_compwritevalid),
};

/// A `*valid` query.
///
/// # Safety
/// `count` must be NULL or writable.
unsafe fn valid(
    call: AtomicCall,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    count: *mut usize,
) -> Result<(), Error> {
    let (max, _) = max_count(call, datatype, op).ok_or(Error::EOPNOTSUPP)?;
    // SAFETY: count is NULL or writable (caller).
    if let Some(out) = unsafe { count.as_mut() } {
        *out = max;
    }
    Ok(())
}

// Each entry point below: its arguments into a Call.

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_write(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
) -> isize {
    let call = Call::new(
        AtomicCall::Write,
        Elems::One(buf, count),
        dest,
        addr,
        key,
        datatype,
        op,
        context,
    );
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_atomic", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_writev(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::fi_ioc,
    _desc: *mut *mut c_void,
    count: usize,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
) -> isize {
    let call = Call::new(
        AtomicCall::Write,
        Elems::Ioc(iov, count),
        dest,
        addr,
        key,
        datatype,
        op,
        context,
    );
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_atomicv", ep, Ok(call)) }
}

unsafe extern "C" fn atomic_writemsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_atomic,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_atomic (API contract).
    let call = match unsafe { msg.as_ref() } {
        // SAFETY: as above.
        Some(m) => unsafe { Call::msg(AtomicCall::Write, m, flags) },
        None => Err("NULL msg"),
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_atomicmsg", ep, call) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_inject(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    count: usize,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
) -> isize {
    let call = Call {
        flags: Some(0),
        inject: true,
        ..Call::new(
            AtomicCall::Write,
            Elems::One(buf, count),
            dest,
            addr,
            key,
            datatype,
            op,
            ptr::null_mut(),
        )
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_inject_atomic", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_readwrite(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
) -> isize {
    let call = Call {
        result: Elems::One(result, count),
        ..Call::new(
            AtomicCall::Fetch,
            Elems::One(buf, count),
            dest,
            addr,
            key,
            datatype,
            op,
            context,
        )
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_fetch_atomic", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_readwritev(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::fi_ioc,
    _desc: *mut *mut c_void,
    count: usize,
    resultv: *mut ffi::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
) -> isize {
    let call = Call {
        result: Elems::Ioc(resultv, result_count),
        ..Call::new(
            AtomicCall::Fetch,
            Elems::Ioc(iov, count),
            dest,
            addr,
            key,
            datatype,
            op,
            context,
        )
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_fetch_atomicv", ep, Ok(call)) }
}

unsafe extern "C" fn atomic_readwritemsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_atomic,
    resultv: *mut ffi::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_atomic (API contract).
    let call = match unsafe { msg.as_ref() } {
        // SAFETY: as above.
        Some(m) => unsafe { Call::msg(AtomicCall::Fetch, m, flags) }.map(|c| Call {
            result: Elems::Ioc(resultv, result_count),
            ..c
        }),
        None => Err("NULL msg"),
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_fetch_atomicmsg", ep, call) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_compwrite(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    count: usize,
    _desc: *mut c_void,
    compare: *const c_void,
    _compare_desc: *mut c_void,
    result: *mut c_void,
    _result_desc: *mut c_void,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
) -> isize {
    let call = Call {
        compare: Elems::One(compare, count),
        result: Elems::One(result, count),
        ..Call::new(
            AtomicCall::Compare,
            Elems::One(buf, count),
            dest,
            addr,
            key,
            datatype,
            op,
            context,
        )
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_compare_atomic", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_compwritev(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::fi_ioc,
    _desc: *mut *mut c_void,
    count: usize,
    comparev: *const ffi::fi_ioc,
    _compare_desc: *mut *mut c_void,
    compare_count: usize,
    resultv: *mut ffi::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
) -> isize {
    let call = Call {
        compare: Elems::Ioc(comparev, compare_count),
        result: Elems::Ioc(resultv, result_count),
        ..Call::new(
            AtomicCall::Compare,
            Elems::Ioc(iov, count),
            dest,
            addr,
            key,
            datatype,
            op,
            context,
        )
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_compare_atomicv", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn atomic_compwritemsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_atomic,
    comparev: *const ffi::fi_ioc,
    _compare_desc: *mut *mut c_void,
    compare_count: usize,
    resultv: *mut ffi::fi_ioc,
    _result_desc: *mut *mut c_void,
    result_count: usize,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_atomic (API contract).
    let call = match unsafe { msg.as_ref() } {
        // SAFETY: as above.
        Some(m) => unsafe { Call::msg(AtomicCall::Compare, m, flags) }.map(|c| Call {
            compare: Elems::Ioc(comparev, compare_count),
            result: Elems::Ioc(resultv, result_count),
            ..c
        }),
        None => Err("NULL msg"),
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { atomic("fi_compare_atomicmsg", ep, call) }
}

unsafe extern "C" fn atomic_writevalid(
    _ep: *mut ffi::fid_ep,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: count as the application passed it (NULL or writable).
    ffi::error::ret_of(unsafe { valid(AtomicCall::Write, datatype, op, count) })
}

unsafe extern "C" fn atomic_readwritevalid(
    _ep: *mut ffi::fid_ep,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: as above.
    ffi::error::ret_of(unsafe { valid(AtomicCall::Fetch, datatype, op, count) })
}

unsafe extern "C" fn atomic_compwritevalid(
    _ep: *mut ffi::fid_ep,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: as above.
    ffi::error::ret_of(unsafe { valid(AtomicCall::Compare, datatype, op, count) })
}
