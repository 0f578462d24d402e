//! The atomic data path: `fi_atomic`, `fi_fetch_atomic`,
//! `fi_compare_atomic`, their `v`, `msg` and inject forms, and the three
//! `*valid` queries. Each entry point turns its arguments into one
//! [`Call`] and hands it to [`post_atomic`], which posts it to the
//! protocol ([`unimem_proto::Messenger::atomic`]).
//!
//! What is supported, per operation and datatype, is the protocol's
//! [`unimem_proto::atomic::valid`]: the queries report exactly that (and
//! `fi_query_atomic`, in `domain.rs`, too). An atomic completes once it is
//! applied at the target (and its old values are in the result buffer).
//!
//! Here: the call, its checks and its post; the entry points, their
//! operation table and the queries are in `calls.rs`.

mod calls;

use std::os::raw::c_void;

use super::inner::{Ep, EpInner};
use super::post::SEND_ONLY_FLAGS;
use crate::base::ffi::{self, Error};
use crate::base::guard::ffi_guard_or;
use unimem_proto::atomic::{AtomicCall, AtomicOp, Datatype};
use unimem_proto::matching::{Iov, IovList};
use unimem_proto::AtomicReq;

pub use calls::ATOMIC_OPS;

/// Flags an atomic call may carry that we accept: every completion level
/// holds once the operation is applied at the target.
const ATOMIC_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_INJECT
    | ffi::FI_INJECT_COMPLETE
    | ffi::FI_TRANSMIT_COMPLETE
    | ffi::FI_DELIVERY_COMPLETE
    | ffi::FI_ATOMIC
    | ffi::FI_READ
    | ffi::FI_WRITE;

/// Local buffers of a call, in elements.
#[derive(Clone, Copy)]
enum Elems {
    None,
    One(*const c_void, usize),
    Ioc(*const ffi::fi_ioc, usize),
}

/// What an atomic call asks for.
#[derive(Clone, Copy)]
struct Call {
    call: AtomicCall,
    operand: Elems,
    compare: Elems,
    result: Elems,
    peer: ffi::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    context: *mut c_void,
    /// The flags of a `msg` call; None: the endpoint's default op_flags.
    flags: Option<u64>,
    /// `fi_inject_atomic`: no completion.
    inject: bool,
}

impl Call {
    #[allow(clippy::too_many_arguments)]
    fn new(
        call: AtomicCall,
        operand: Elems,
        peer: ffi::fi_addr_t,
        addr: u64,
        key: u64,
        datatype: ffi::fi_datatype,
        op: ffi::fi_op,
        context: *mut c_void,
    ) -> Self {
        Call {
            call,
            operand,
            compare: Elems::None,
            result: Elems::None,
            peer,
            addr,
            key,
            datatype,
            op,
            context,
            flags: None,
            inject: false,
        }
    }

    /// An `fi_msg_atomic`: one target range (`rma_iov_limit` is 1).
    ///
    /// # Safety
    /// `m.rma_iov` must be NULL or hold `m.rma_iov_count` entries.
    unsafe fn msg(
        call: AtomicCall,
        m: &ffi::fi_msg_atomic,
        flags: u64,
    ) -> Result<Self, &'static str> {
        if m.rma_iov_count != 1 || m.rma_iov.is_null() {
            return Err("one target range (rma_iov_count 1) is supported");
        }
        // SAFETY: rma_iov holds one entry (checked, and the caller).
        let range = unsafe { &*m.rma_iov };
        // FI_INJECT needs nothing more (operands are copied when posted)
        // and keeps the completion (fi_atomic(3)), unlike fi_inject_atomic.
        Ok(Call {
            flags: Some(flags),
            ..Call::new(
                call,
                Elems::Ioc(m.msg_iov, m.iov_count),
                m.addr,
                range.addr,
                range.key,
                m.datatype,
                m.op,
                m.context,
            )
        })
    }
}

/// The bytes `elems` names, elements of `size` bytes. With `ignored` (the
/// operand of `FI_ATOMIC_READ`, which fi_atomic(3) lets be NULL) only the
/// element count matters: NULL buffers are accepted.
///
/// # Safety
/// An ioc array must hold its count of entries.
unsafe fn bytes_of(
    elems: Elems,
    size: usize,
    ignored: bool,
) -> Result<(IovList, usize), &'static str> {
    let bytes = |count: usize| count.checked_mul(size).ok_or("element count overflows");
    Ok(match elems {
        Elems::None => (IovList::Many(Vec::new()), 0),
        Elems::One(buf, count) => {
            let len = bytes(count)?;
            if buf.is_null() && len > 0 && !ignored {
                return Err("NULL buffer");
            }
            (IovList::One((buf as usize, len)), count)
        }
        Elems::Ioc(ioc, n) => {
            if n > 0 && ioc.is_null() {
                return Err("NULL ioc array");
            }
            if n == 0 {
                return Ok((IovList::Many(Vec::new()), 0));
            }
            // SAFETY: ioc holds n entries (caller).
            let slice = unsafe { std::slice::from_raw_parts(ioc, n) };
            let mut iov: Vec<Iov> = Vec::with_capacity(n);
            let mut count = 0usize;
            for entry in slice {
                let len = bytes(entry.count)?;
                if entry.addr.is_null() && len > 0 && !ignored {
                    return Err("NULL buffer");
                }
                iov.push((entry.addr as usize, len));
                count = count
                    .checked_add(entry.count)
                    .ok_or("element count overflows")?;
            }
            (iov.into(), count)
        }
    })
}

/// Posts `call` on `ep`.
fn post_atomic(ep: &EpInner, op_name: &str, call: &Call) -> Result<(), Error> {
    let b = ep.enabled(op_name)?;
    let flags = call.flags.unwrap_or(ep.tx_op_flags & !SEND_ONLY_FLAGS);
    if flags & !ATOMIC_FLAGS != 0 {
        tracing::warn!("{op_name}: unsupported flags {:#x}", flags & !ATOMIC_FLAGS);
        return Err(Error::EBADFLAGS);
    }
    if ep.caps & ffi::FI_ATOMIC == 0 {
        tracing::warn!("{op_name}: the endpoint was opened without FI_ATOMIC");
        return Err(Error::EOPNOTSUPP);
    }
    let (Some(op), Some(datatype)) = (
        AtomicOp::from_u32(call.op),
        Datatype::from_u32(call.datatype),
    ) else {
        tracing::warn!(
            "{op_name}: operation {} on datatype {} is not supported",
            call.op,
            call.datatype
        );
        return Err(Error::EOPNOTSUPP);
    };
    let size = datatype.size();
    // SAFETY: ioc arrays hold their counts (libfabric's contract).
    let parts = unsafe {
        (
            bytes_of(call.operand, size, op == AtomicOp::Read),
            bytes_of(call.compare, size, false),
            bytes_of(call.result, size, false),
        )
    };
    let ((operand, count), (compare, compares), (result, results)) = match parts {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
            tracing::warn!("{op_name}: {why}");
            return Err(Error::EINVAL);
        }
    };
    // fi_fetch_atomic with FI_ATOMIC_READ names its count in the (ignored)
    // operand all the same.
    if (call.call == AtomicCall::Compare && compares != count)
        || (call.call != AtomicCall::Write && results != count)
    {
        tracing::warn!(
            "{op_name}: {count} operands, {compares} compare and {results} result elements"
        );
        return Err(Error::EINVAL);
    }
    let dest = b.peer(op_name, call.peer)?;
    let completion = !call.inject && (!b.tx_selective || flags & ffi::FI_COMPLETION != 0);
    let req = AtomicReq {
        dest,
        call: call.call,
        op,
        datatype,
        count,
        operand: if op == AtomicOp::Read {
            IovList::Many(Vec::new())
        } else {
            operand
        },
        compare,
        result,
        addr: call.addr,
        key: call.key,
        context: call.context as usize,
        completion,
    };
    // SAFETY: libfabric's contract: operands readable during the call (the
    // protocol copies them), the result buffer valid until completion.
    ep.post(op_name, |messenger| unsafe { messenger.atomic(req) })
}

/// Every atomic entry point: find our endpoint and post, under the panic
/// guard.
///
/// # Safety
/// `ep` must be NULL or a live `struct fid_ep`; the call's ioc arrays must
/// hold their counts.
unsafe fn atomic(
    op: &'static str,
    ep: *mut ffi::fid_ep,
    call: Result<Call, &'static str>,
) -> isize {
    ffi_guard_or(op, Error::EOTHER.ssize(), || {
        // SAFETY: libfabric hands us an endpoint the application got from us.
        let Some(ep) = (unsafe { Ep::from_ptr(ep, op) }) else {
            return Error::EINVAL.ssize();
        };
        match call {
            Ok(call) => ffi::error::ssize_of(post_atomic(&ep.inner, op, &call)),
            Err(why) => {
                tracing::warn!("{op}: {why}");
                Error::EINVAL.ssize()
            }
        }
    })
}
