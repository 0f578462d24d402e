//! The data path: `fi_send`/`fi_recv` and their tagged twins. Every entry
//! point reduces to [`post_send`] or [`post_recv`].

use std::mem::size_of;
use std::os::raw::{c_int, c_void};

use super::inner::{Ep, EpInner};
use crate::base::ffi::{self, ret};
use crate::base::guard::ffi_guard_or;
use unimem_proto::endpoint::SendReq;
use unimem_proto::matching::{Iov, IovList, PostedRecv};
use unimem_proto::wire::MatchInfo;
use unimem_proto::PostError;

/// `FI_ADDR_UNSPEC` (`(uint64_t) -1`, a cast bindgen does not translate).
const FI_ADDR_UNSPEC: ffi::fi_addr_t = u64::MAX;

pub static MSG_OPS: ffi::fi_ops_msg = ffi::fi_ops_msg {
    size: size_of::<ffi::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

pub static TAGGED_OPS: ffi::fi_ops_tagged = ffi::fi_ops_tagged {
    size: size_of::<ffi::fi_ops_tagged>(),
    recv: Some(tagged_recv),
    recvv: Some(tagged_recvv),
    recvmsg: Some(tagged_recvmsg),
    send: Some(tagged_send),
    sendv: Some(tagged_sendv),
    sendmsg: Some(tagged_sendmsg),
    inject: Some(tagged_inject),
    senddata: Some(tagged_senddata),
    injectdata: Some(tagged_injectdata),
};

/// Flags a send or receive may carry that we accept (and mostly ignore:
/// completion levels are met by construction).
const SEND_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_INJECT
    | ffi::FI_INJECT_COMPLETE
    | ffi::FI_TRANSMIT_COMPLETE
    | ffi::FI_DELIVERY_COMPLETE
    | ffi::FI_REMOTE_CQ_DATA
    | ffi::FI_MSG
    | ffi::FI_TAGGED
    | ffi::FI_SEND;
const RECV_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_MULTI_RECV
    | ffi::FI_PEEK
    | ffi::FI_CLAIM
    | ffi::FI_DISCARD
    | ffi::FI_MSG
    | ffi::FI_TAGGED
    | ffi::FI_RECV;

fn map_post_error(e: PostError, op: &str) -> isize {
    let code = match e {
        PostError::Again => return ret::EAGAIN as isize,
        PostError::TooLong => -(ffi::FI_EMSGSIZE as c_int),
        PostError::BadAddress => ret::EINVAL,
        PostError::Unreachable => -(ffi::FI_EHOSTUNREACH as c_int),
        PostError::NoMemory => ret::ENOMEM,
    };
    tracing::warn!("{op}: {e:?}");
    code as isize
}

/// A send of `iov` to `dest`.
#[allow(clippy::too_many_arguments)]
fn post_send(
    ep: &EpInner,
    op: &str,
    iov: IovList,
    dest: ffi::fi_addr_t,
    info: MatchInfo,
    context: *mut c_void,
    flags: u64,
    inject_call: bool,
) -> isize {
    let Some(b) = ep.active.get() else {
        tracing::warn!("{op}: the endpoint is not enabled");
        return -(ffi::FI_EOPBADSTATE as c_int) as isize;
    };
    if flags & !SEND_FLAGS != 0 {
        tracing::warn!("{op}: unsupported flags {:#x}", flags & !SEND_FLAGS);
        return ret::EBADFLAGS as isize;
    }
    let len: usize = iov.iter().map(|&(_, len)| len).sum();
    if (inject_call || flags & ffi::FI_INJECT != 0) && len > ep.inject_size {
        tracing::warn!(
            "{op}: {len} bytes exceed the inject size {}",
            ep.inject_size
        );
        return ret::EINVAL as isize;
    }
    let (dest, completion) = {
        let Some(dest_addr) = b.av.as_ref().and_then(|av| av.lookup(dest)) else {
            tracing::warn!("{op}: fi_addr {dest:#x} is not in the endpoint's AV");
            return ret::EINVAL as isize;
        };
        (
            dest_addr,
            !b.tx_selective || flags & ffi::FI_COMPLETION != 0,
        )
    };
    let req = SendReq {
        dest,
        iov,
        info,
        context: context as usize,
        completion,
        inject: inject_call,
    };
    let mut core = ep.core.lock();
    // SAFETY: libfabric's contract: the buffers stay valid until the send
    // completes (until return for an inject, which the protocol copies).
    let result = unsafe { core.send(req) };
    ep.drain(&mut core);
    match result {
        Ok(()) => 0,
        Err(e) => map_post_error(e, op),
    }
}

/// A receive into `iov` from `src` (or from anyone).
#[allow(clippy::too_many_arguments)]
fn post_recv(
    ep: &EpInner,
    op: &str,
    iov: IovList,
    src: ffi::fi_addr_t,
    tagged: bool,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
    flags: u64,
) -> isize {
    let Some(b) = ep.active.get() else {
        tracing::warn!("{op}: the endpoint is not enabled");
        return -(ffi::FI_EOPBADSTATE as c_int) as isize;
    };
    if flags & !RECV_FLAGS != 0 {
        tracing::warn!("{op}: unsupported flags {:#x}", flags & !RECV_FLAGS);
        return ret::EBADFLAGS as isize;
    }
    let multi_recv = flags & ffi::FI_MULTI_RECV != 0;
    if multi_recv && (tagged || iov.len() != 1) {
        tracing::warn!("{op}: FI_MULTI_RECV takes one untagged buffer");
        return ret::EINVAL as isize;
    }
    let (src, completion) = {
        let directed = ep.caps & ffi::FI_DIRECTED_RECV != 0 && src != FI_ADDR_UNSPEC;
        let src = if directed {
            match b.av.as_ref().and_then(|av| av.lookup(src)) {
                Some(addr) => Some(addr),
                None => {
                    tracing::warn!("{op}: fi_addr {src:#x} is not in the endpoint's AV");
                    return ret::EINVAL as isize;
                }
            }
        } else {
            None
        };
        (src, !b.rx_selective || flags & ffi::FI_COMPLETION != 0)
    };
    let recv = PostedRecv {
        context: context as usize,
        iov,
        src,
        tag,
        ignore,
        completion,
        multi_recv,
    };
    let mut core = ep.core.lock();
    let result = if flags & ffi::FI_PEEK != 0 {
        // A peek must see what has arrived by now.
        core.progress();
        core.peek(
            tagged,
            recv,
            flags & ffi::FI_CLAIM != 0,
            flags & ffi::FI_DISCARD != 0,
        );
        0
    } else if flags & ffi::FI_CLAIM != 0 {
        // SAFETY: libfabric's contract: the buffer stays valid until the
        // receive completes.
        if unsafe { core.claim(tagged, recv, flags & ffi::FI_DISCARD != 0) } {
            0
        } else {
            tracing::warn!("{op}: FI_CLAIM without a message claimed by FI_PEEK for this context");
            ret::EINVAL as isize
        }
    } else {
        // No limit but memory: rx_size is what we advertise, not a cap. MPI
        // posts thousands of receives, and a peer that floods us the same
        // way could only wait for us if we refused (both sides spinning on
        // -FI_EAGAIN with nothing sent).
        // SAFETY: as above.
        unsafe { core.post_recv(tagged, recv) };
        0
    };
    ep.drain(&mut core);
    result
}

/// The iov array of a call, as (address, length) pairs.
///
/// # Safety
/// `iov` must be NULL (with `count` 0) or point to `count` iovecs.
unsafe fn iovs(
    ep: &EpInner,
    op: &str,
    iov: *const ffi::iovec,
    count: usize,
) -> Result<IovList, isize> {
    if count > ep.iov_limit {
        tracing::warn!("{op}: {count} iovs exceed the limit of {}", ep.iov_limit);
        return Err(ret::EINVAL as isize);
    }
    if count > 0 && iov.is_null() {
        tracing::warn!("{op}: NULL iov");
        return Err(ret::EINVAL as isize);
    }
    if count == 0 {
        return Ok(IovList::Many(Vec::new()));
    }
    // SAFETY: iov points to count iovecs (caller).
    let slice = unsafe { std::slice::from_raw_parts(iov, count) };
    Ok(slice
        .iter()
        .map(|v| (v.iov_base as usize, v.iov_len))
        .collect::<Vec<Iov>>()
        .into())
}

fn one(buf: *const c_void, len: usize) -> IovList {
    IovList::One((buf as usize, len))
}

/// Runs a data-path entry point on our endpoint, or fails it cleanly.
fn with_ep(op: &'static str, ep: *mut ffi::fid_ep, body: impl FnOnce(&EpInner) -> isize) -> isize {
    ffi_guard_or(op, ret::EOTHER as isize, || {
        // SAFETY: libfabric hands us an endpoint the application got from us.
        match unsafe { Ep::from_ptr(ep, op) } {
            Some(ep) => body(&ep.inner),
            None => ret::EINVAL as isize,
        }
    })
}

// --- fi_ops_msg --------------------------------------------------------------------

unsafe extern "C" fn msg_recv(
    ep: *mut ffi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    with_ep("fi_recv", ep, |ep| {
        post_recv(
            ep,
            "fi_recv",
            one(buf, len),
            src,
            false,
            0,
            0,
            context,
            ep.rx_op_flags,
        )
    })
}

unsafe extern "C" fn msg_recvv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    with_ep("fi_recvv", ep, |ep| {
        // SAFETY: iov holds count iovecs (libfabric contract).
        match unsafe { iovs(ep, "fi_recvv", iov, count) } {
            Ok(iov) => post_recv(
                ep,
                "fi_recvv",
                iov,
                src,
                false,
                0,
                0,
                context,
                ep.rx_op_flags,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn msg_recvmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg,
    flags: u64,
) -> isize {
    with_ep("fi_recvmsg", ep, |ep| {
        // SAFETY: msg is NULL or a valid fi_msg (libfabric contract).
        let Some(msg) = (unsafe { msg.as_ref() }) else {
            return ret::EINVAL as isize;
        };
        // SAFETY: msg_iov holds iov_count iovecs.
        match unsafe { iovs(ep, "fi_recvmsg", msg.msg_iov, msg.iov_count) } {
            Ok(iov) => post_recv(
                ep,
                "fi_recvmsg",
                iov,
                msg.addr,
                false,
                0,
                0,
                msg.context,
                flags,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn msg_send(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    with_ep("fi_send", ep, |ep| {
        post_send(
            ep,
            "fi_send",
            one(buf, len),
            dest,
            MatchInfo::default(),
            context,
            ep.tx_op_flags,
            false,
        )
    })
}

unsafe extern "C" fn msg_sendv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    with_ep("fi_sendv", ep, |ep| {
        // SAFETY: iov holds count iovecs (libfabric contract).
        match unsafe { iovs(ep, "fi_sendv", iov, count) } {
            Ok(iov) => post_send(
                ep,
                "fi_sendv",
                iov,
                dest,
                MatchInfo::default(),
                context,
                ep.tx_op_flags,
                false,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn msg_sendmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg,
    flags: u64,
) -> isize {
    with_ep("fi_sendmsg", ep, |ep| {
        // SAFETY: msg is NULL or a valid fi_msg (libfabric contract).
        let Some(msg) = (unsafe { msg.as_ref() }) else {
            return ret::EINVAL as isize;
        };
        let info = MatchInfo {
            tag: None,
            data: (flags & ffi::FI_REMOTE_CQ_DATA != 0).then_some(msg.data),
        };
        // SAFETY: msg_iov holds iov_count iovecs.
        match unsafe { iovs(ep, "fi_sendmsg", msg.msg_iov, msg.iov_count) } {
            Ok(iov) => post_send(
                ep,
                "fi_sendmsg",
                iov,
                msg.addr,
                info,
                msg.context,
                flags,
                false,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn msg_inject(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: ffi::fi_addr_t,
) -> isize {
    with_ep("fi_inject", ep, |ep| {
        post_send(
            ep,
            "fi_inject",
            one(buf, len),
            dest,
            MatchInfo::default(),
            std::ptr::null_mut(),
            0,
            true,
        )
    })
}

unsafe extern "C" fn msg_senddata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    with_ep("fi_senddata", ep, |ep| {
        let info = MatchInfo {
            tag: None,
            data: Some(data),
        };
        post_send(
            ep,
            "fi_senddata",
            one(buf, len),
            dest,
            info,
            context,
            ep.tx_op_flags,
            false,
        )
    })
}

unsafe extern "C" fn msg_injectdata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: ffi::fi_addr_t,
) -> isize {
    with_ep("fi_injectdata", ep, |ep| {
        let info = MatchInfo {
            tag: None,
            data: Some(data),
        };
        post_send(
            ep,
            "fi_injectdata",
            one(buf, len),
            dest,
            info,
            std::ptr::null_mut(),
            0,
            true,
        )
    })
}

// --- fi_ops_tagged -------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_recv(
    ep: *mut ffi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: ffi::fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    with_ep("fi_trecv", ep, |ep| {
        post_recv(
            ep,
            "fi_trecv",
            one(buf, len),
            src,
            true,
            tag,
            ignore,
            context,
            ep.rx_op_flags,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_recvv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: ffi::fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    with_ep("fi_trecvv", ep, |ep| {
        // SAFETY: iov holds count iovecs (libfabric contract).
        match unsafe { iovs(ep, "fi_trecvv", iov, count) } {
            Ok(iov) => post_recv(
                ep,
                "fi_trecvv",
                iov,
                src,
                true,
                tag,
                ignore,
                context,
                ep.rx_op_flags,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn tagged_recvmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_tagged,
    flags: u64,
) -> isize {
    with_ep("fi_trecvmsg", ep, |ep| {
        // SAFETY: msg is NULL or a valid fi_msg_tagged (libfabric contract).
        let Some(msg) = (unsafe { msg.as_ref() }) else {
            return ret::EINVAL as isize;
        };
        // SAFETY: msg_iov holds iov_count iovecs.
        match unsafe { iovs(ep, "fi_trecvmsg", msg.msg_iov, msg.iov_count) } {
            Ok(iov) => post_recv(
                ep,
                "fi_trecvmsg",
                iov,
                msg.addr,
                true,
                msg.tag,
                msg.ignore,
                msg.context,
                flags,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn tagged_send(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: ffi::fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    with_ep("fi_tsend", ep, |ep| {
        let info = MatchInfo {
            tag: Some(tag),
            data: None,
        };
        post_send(
            ep,
            "fi_tsend",
            one(buf, len),
            dest,
            info,
            context,
            ep.tx_op_flags,
            false,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_sendv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: ffi::fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    with_ep("fi_tsendv", ep, |ep| {
        let info = MatchInfo {
            tag: Some(tag),
            data: None,
        };
        // SAFETY: iov holds count iovecs (libfabric contract).
        match unsafe { iovs(ep, "fi_tsendv", iov, count) } {
            Ok(iov) => post_send(
                ep,
                "fi_tsendv",
                iov,
                dest,
                info,
                context,
                ep.tx_op_flags,
                false,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn tagged_sendmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_tagged,
    flags: u64,
) -> isize {
    with_ep("fi_tsendmsg", ep, |ep| {
        // SAFETY: msg is NULL or a valid fi_msg_tagged (libfabric contract).
        let Some(msg) = (unsafe { msg.as_ref() }) else {
            return ret::EINVAL as isize;
        };
        let info = MatchInfo {
            tag: Some(msg.tag),
            data: (flags & ffi::FI_REMOTE_CQ_DATA != 0).then_some(msg.data),
        };
        // SAFETY: msg_iov holds iov_count iovecs.
        match unsafe { iovs(ep, "fi_tsendmsg", msg.msg_iov, msg.iov_count) } {
            Ok(iov) => post_send(
                ep,
                "fi_tsendmsg",
                iov,
                msg.addr,
                info,
                msg.context,
                flags,
                false,
            ),
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn tagged_inject(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: ffi::fi_addr_t,
    tag: u64,
) -> isize {
    with_ep("fi_tinject", ep, |ep| {
        let info = MatchInfo {
            tag: Some(tag),
            data: None,
        };
        post_send(
            ep,
            "fi_tinject",
            one(buf, len),
            dest,
            info,
            std::ptr::null_mut(),
            0,
            true,
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_senddata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: ffi::fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    with_ep("fi_tsenddata", ep, |ep| {
        let info = MatchInfo {
            tag: Some(tag),
            data: Some(data),
        };
        post_send(
            ep,
            "fi_tsenddata",
            one(buf, len),
            dest,
            info,
            context,
            ep.tx_op_flags,
            false,
        )
    })
}

unsafe extern "C" fn tagged_injectdata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: ffi::fi_addr_t,
    tag: u64,
) -> isize {
    with_ep("fi_tinjectdata", ep, |ep| {
        let info = MatchInfo {
            tag: Some(tag),
            data: Some(data),
        };
        post_send(
            ep,
            "fi_tinjectdata",
            one(buf, len),
            dest,
            info,
            std::ptr::null_mut(),
            0,
            true,
        )
    })
}
