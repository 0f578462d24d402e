//! The RMA data path: `fi_read`, `fi_write` and their kin. Seven of the
//! nine entry points turn their arguments into one [`RmaCall`] and hand it
//! to [`post_rma`], which checks it, finds the target, and posts it to the
//! protocol ([`unimem_proto::Messenger::rma`]); the two inject calls, the
//! path of MPI's small puts, go [`inject`] with their buffer as it is
//! ([`unimem_proto::Messenger::inject_write`]).
//!
//! Completion levels: a write completes when its data is in the target's
//! memory (a DMA done, or the target's FIN), a read when its data is in
//! ours. That meets `FI_INJECT_COMPLETE`, `FI_TRANSMIT_COMPLETE` and
//! `FI_DELIVERY_COMPLETE` alike, so all three are accepted.
//!
//! Local descriptors are not needed (no `FI_MR_LOCAL`) and are ignored.

use std::mem::size_of;
use std::os::raw::c_void;
use std::sync::atomic::Ordering;

use super::inner::{Ep, EpInner};
use super::post::{Bufs, SEND_ONLY_FLAGS};
use crate::base::ffi::{self, Error};
use crate::base::guard::ffi_guard_or;
use unimem_proto::iov::total_len;
use unimem_proto::matching::IovList;
use unimem_proto::{RmaKind, RmaReq};

pub static RMA_OPS: ffi::fi_ops_rma = ffi::fi_ops_rma {
    size: size_of::<ffi::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

/// Flags an RMA call may carry that we accept (see the module doc).
const RMA_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_INJECT
    | ffi::FI_INJECT_COMPLETE
    | ffi::FI_TRANSMIT_COMPLETE
    | ffi::FI_DELIVERY_COMPLETE
    | ffi::FI_REMOTE_CQ_DATA
    | ffi::FI_RMA
    | ffi::FI_READ
    | ffi::FI_WRITE;

/// What an RMA call asks for.
#[derive(Clone, Copy)]
struct RmaCall {
    kind: RmaKind,
    bufs: Bufs,
    peer: ffi::fi_addr_t,
    /// The target range: its address (or offset) and key; with its length
    /// for a `msg` call, which must match the local buffers.
    addr: u64,
    key: u64,
    remote_len: Option<usize>,
    context: *mut c_void,
    data: Option<u64>,
    /// The flags of a `msg` call; None: the endpoint's default op_flags.
    flags: Option<u64>,
    /// `FI_INJECT` in the flags of `fi_writemsg`: the buffer is the
    /// caller's again on return, the protocol copies it. (The write still
    /// completes, fi_rma(3); the inject calls, which do not, go
    /// [`inject`].)
    inject: bool,
}

impl RmaCall {
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: RmaKind,
        bufs: Bufs,
        peer: ffi::fi_addr_t,
        addr: u64,
        key: u64,
        context: *mut c_void,
    ) -> Self {
        RmaCall {
            kind,
            bufs,
            peer,
            addr,
            key,
            remote_len: None,
            context,
            data: None,
            flags: None,
            inject: false,
        }
    }

    /// An `fi_msg_rma`: one target range (`rma_iov_limit` is 1).
    ///
    /// # Safety
    /// `m.rma_iov` must be NULL or hold `m.rma_iov_count` entries.
    unsafe fn msg(kind: RmaKind, m: &ffi::fi_msg_rma, flags: u64) -> Result<Self, &'static str> {
        if m.rma_iov_count != 1 || m.rma_iov.is_null() {
            return Err("one target range (rma_iov_count 1) is supported");
        }
        // SAFETY: rma_iov holds one entry (checked, and the caller).
        let range = unsafe { &*m.rma_iov };
        Ok(RmaCall {
            remote_len: Some(range.len),
            data: (flags & ffi::FI_REMOTE_CQ_DATA != 0).then_some(m.data),
            flags: Some(flags),
            inject: flags & ffi::FI_INJECT != 0,
            ..RmaCall::new(
                kind,
                Bufs::Iov(m.msg_iov, m.iov_count),
                m.addr,
                range.addr,
                range.key,
                m.context,
            )
        })
    }
}

/// Posts `call` on `ep` with local buffers `iov`.
fn post_rma(ep: &EpInner, op: &str, iov: IovList, call: &RmaCall) -> Result<(), Error> {
    let b = ep.enabled(op)?;
    let flags = call.flags.unwrap_or(ep.tx_op_flags & !SEND_ONLY_FLAGS);
    if flags & !RMA_FLAGS != 0 {
        tracing::warn!("{op}: unsupported flags {:#x}", flags & !RMA_FLAGS);
        return Err(Error::EBADFLAGS);
    }
    if ep.caps & ffi::FI_RMA == 0 {
        return Err(no_rma(ep, op));
    }
    let len = total_len(&iov);
    if call.remote_len.is_some_and(|remote| remote != len) {
        tracing::warn!(
            "{op}: {len} local bytes for a target range of {:?}",
            call.remote_len
        );
        return Err(Error::EINVAL);
    }
    if iov.iter().any(|&(addr, len)| addr == 0 && len > 0) {
        tracing::warn!("{op}: NULL buffer");
        return Err(Error::EINVAL);
    }
    let inject = call.inject;
    if inject && (call.kind == RmaKind::Read || len > ep.inject_size) {
        tracing::warn!(
            "{op}: inject of {len} bytes (a write of at most {} bytes)",
            ep.inject_size
        );
        return Err(Error::EINVAL);
    }
    let dest = b.peer(op, call.peer)?;
    let completion = !b.tx_selective || flags & ffi::FI_COMPLETION != 0;
    let req = RmaReq {
        dest,
        iov,
        addr: call.addr,
        key: call.key,
        context: call.context as usize,
        completion,
        inject,
        data: call.data,
    };
    // SAFETY: libfabric's contract: the buffers stay valid until the
    // operation completes (until return for an inject, which the protocol
    // copies).
    ep.post(op, |messenger| unsafe { messenger.rma(call.kind, req) })
}

/// The refusal of an RMA call on an endpoint opened without `FI_RMA`.
#[cold]
fn no_rma(ep: &EpInner, op: &str) -> Error {
    // Once per endpoint: an application that ignores the error must not
    // flood the log.
    if !ep.warned_no_rma.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{op}: the endpoint was opened without FI_RMA (refused from now on without a word)"
        );
    }
    Error::EOPNOTSUPP
}

/// `fi_inject_write` and `fi_inject_writedata`: a write of at most the
/// inject size with no completion, the path of MPI's small puts. The same
/// checks as [`post_rma`]'s for an inject, with nothing to gather first:
/// the buffer goes to the protocol as it is.
///
/// # Safety
/// `ep` must be NULL or a live `struct fid_ep`; `buf` must hold `len`
/// readable bytes (libfabric's contract).
unsafe fn inject(
    op: &'static str,
    ep: *mut ffi::fid_ep,
    (buf, len): (*const c_void, usize),
    dest: ffi::fi_addr_t,
    target: (u64, u64),
    data: Option<u64>,
) -> isize {
    ffi_guard_or(op, Error::EOTHER.ssize(), || {
        // SAFETY: libfabric hands us an endpoint the application got from us.
        let Some(ep) = (unsafe { Ep::from_ptr(ep, op) }) else {
            return Error::EINVAL.ssize();
        };
        let ep = &*ep.inner;
        let b = match ep.enabled(op) {
            Ok(b) => b,
            Err(e) => return e.ssize(),
        };
        if ep.caps & ffi::FI_RMA == 0 {
            return no_rma(ep, op).ssize();
        }
        if len > ep.inject_size {
            let most = ep.inject_size;
            let why = format_args!("{op}: inject of {len} bytes (a write of at most {most})");
            return ep.refuse(op, Error::EINVAL, why).ssize();
        }
        if buf.is_null() && len > 0 {
            let why = format_args!("{op}: NULL buffer of {len} bytes");
            return ep.refuse(op, Error::EINVAL, why).ssize();
        }
        let dest = match b.peer(op, dest) {
            Ok(dest) => dest,
            Err(e) => return e.ssize(),
        };
        // SAFETY: buf holds len readable bytes during the call (caller),
        // which the protocol writes or copies before it returns.
        let posted = ep.post(op, |messenger| unsafe {
            messenger.inject_write(dest, (buf.cast(), len), target, data)
        });
        ffi::error::ssize_of(posted)
    })
}

/// Every RMA entry point: find our endpoint, read the local buffers,
/// post, under the panic guard.
///
/// # Safety
/// `ep` must be NULL or a live `struct fid_ep`; the call's iov array must
/// hold its count of iovecs.
unsafe fn rma(
    op: &'static str,
    ep: *mut ffi::fid_ep,
    call: Result<RmaCall, &'static str>,
) -> isize {
    ffi_guard_or(op, Error::EOTHER.ssize(), || {
        // SAFETY: libfabric hands us an endpoint the application got from us.
        let Some(ep) = (unsafe { Ep::from_ptr(ep, op) }) else {
            return Error::EINVAL.ssize();
        };
        let ep = &*ep.inner;
        let call = match call {
            Ok(call) => call,
            Err(why) => {
                tracing::warn!("{op}: {why}");
                return Error::EINVAL.ssize();
            }
        };
        // SAFETY: an iov array holds its count (caller).
        let posted = unsafe { call.bufs.read(ep, op) }.and_then(|iov| post_rma(ep, op, iov, &call));
        ffi::error::ssize_of(posted)
    })
}

// Each entry point below: its arguments into an RmaCall.

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_read(
    ep: *mut ffi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    let call = RmaCall::new(RmaKind::Read, Bufs::One(buf, len), src, addr, key, context);
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_read", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_readv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    let call = RmaCall::new(
        RmaKind::Read,
        Bufs::Iov(iov, count),
        src,
        addr,
        key,
        context,
    );
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_readv", ep, Ok(call)) }
}

unsafe extern "C" fn rma_readmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_rma,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_rma (API contract).
    let call = match unsafe { msg.as_ref() } {
        // SAFETY: as above.
        Some(m) => unsafe { RmaCall::msg(RmaKind::Read, m, flags) },
        None => Err("NULL msg"),
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_readmsg", ep, call) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_write(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    let call = RmaCall::new(
        RmaKind::Write,
        Bufs::One(buf, len),
        dest,
        addr,
        key,
        context,
    );
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_write", ep, Ok(call)) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_writev(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    let call = RmaCall::new(
        RmaKind::Write,
        Bufs::Iov(iov, count),
        dest,
        addr,
        key,
        context,
    );
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_writev", ep, Ok(call)) }
}

unsafe extern "C" fn rma_writemsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_rma,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_rma (API contract).
    let call = match unsafe { msg.as_ref() } {
        // SAFETY: as above.
        Some(m) => unsafe { RmaCall::msg(RmaKind::Write, m, flags) },
        None => Err("NULL msg"),
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_writemsg", ep, call) }
}

unsafe extern "C" fn rma_inject(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: the application's arguments (API contract).
    unsafe { inject("fi_inject_write", ep, (buf, len), dest, (key, addr), None) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_writedata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    let call = RmaCall {
        data: Some(data),
        ..RmaCall::new(
            RmaKind::Write,
            Bufs::One(buf, len),
            dest,
            addr,
            key,
            context,
        )
    };
    // SAFETY: the application's arguments (API contract).
    unsafe { rma("fi_writedata", ep, Ok(call)) }
}

unsafe extern "C" fn rma_injectdata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: ffi::fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    let (op, target) = ("fi_inject_writedata", (key, addr));
    // SAFETY: the application's arguments (API contract).
    unsafe { inject(op, ep, (buf, len), dest, target, Some(data)) }
}
