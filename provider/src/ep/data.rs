//! The data path: `fi_send`/`fi_recv` and their tagged twins. Each of the
//! eighteen entry points states what is particular to it, the [`Request`]
//! its arguments describe, and hands it to [`send`] or [`recv`]: one way
//! to find the endpoint, read the buffers and default the flags, then
//! [`post_send`] or [`post_recv`]. That common path inlines into each
//! entry point and calls the two directly: a single-buffer call neither
//! allocates nor dispatches dynamically.

use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::ptr;

use super::inner::{Ep, EpInner, EpMessenger};
use crate::base::ffi::{self, ret};
use crate::base::guard::ffi_guard_or;
use unimem_proto::iov::total_len;
use unimem_proto::matching::{Iov, IovList, PostedRecv};
use unimem_proto::messenger::SendReq;
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

/// Flags a send or receive may carry that we accept.
///
/// The completion levels of a send (fi_cq(3)), per call or as the
/// endpoint's tx op_flags (`tx_attr.op_flags` at `fi_endpoint`):
/// - `FI_INJECT_COMPLETE` (the buffer may be reused) and
///   `FI_TRANSMIT_COMPLETE` (for a reliable endpoint: the message is at the
///   target) are what every send gets: an inline or eager send completes
///   when its message is in the target's mailbox, its data in the target's
///   eager ring;
/// - `FI_MATCH_COMPLETE` (matched, or queued as unexpected) and
///   `FI_DELIVERY_COMPLETE` (the data where the target reads it: the
///   receive buffer, or the target's memory as an unexpected message) are
///   one condition here, since the target matches or queues and copies in
///   one step: an inline or eager send that asks for either goes eager and
///   completes on the target's acknowledgement
///   (`SendReq::delivery_complete`). A rendezvous send completes on the
///   target's FIN, sent once the data is in the matched buffer, which
///   meets every level anyway.
/// - `FI_COMMIT_COMPLETE` is about persistent memory, which we do not
///   have: refused (`-FI_EBADFLAGS`), as fi_getinfo refuses it in hints.
const SEND_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_INJECT
    | ffi::FI_INJECT_COMPLETE
    | ffi::FI_TRANSMIT_COMPLETE
    | ffi::FI_MATCH_COMPLETE
    | ffi::FI_DELIVERY_COMPLETE
    | ffi::FI_REMOTE_CQ_DATA
    | ffi::FI_MSG
    | ffi::FI_TAGGED
    | ffi::FI_SEND;
/// Send-side op_flags that mean nothing to RMA and atomics (MPI sets them
/// as the endpoint's defaults for its sends): left out of their checks.
pub(super) const SEND_ONLY_FLAGS: u64 =
    ffi::FI_MATCH_COMPLETE | ffi::FI_MSG | ffi::FI_TAGGED | ffi::FI_SEND;
const RECV_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_MULTI_RECV
    | ffi::FI_PEEK
    | ffi::FI_CLAIM
    | ffi::FI_DISCARD
    | ffi::FI_MSG
    | ffi::FI_TAGGED
    | ffi::FI_RECV;

impl EpInner {
    /// Runs `post` (one operation of call `op`) on the messenger, then
    /// reports what it finished at once; its refusal as libfabric's code.
    #[inline(always)]
    pub(super) fn post(
        &self,
        op: &str,
        post: impl FnOnce(&mut EpMessenger) -> Result<(), PostError>,
    ) -> isize {
        let mut messenger = self.enter();
        let result = post(&mut messenger);
        self.drain(&mut messenger);
        match result {
            Ok(()) => 0,
            Err(e) => map_post_error(self, e, op),
        }
    }
}

pub(super) fn map_post_error(ep: &EpInner, e: PostError, op: &str) -> isize {
    let code = match e {
        PostError::Again => return ret::EAGAIN as isize,
        PostError::TooLong => -(ffi::FI_EMSGSIZE as c_int),
        PostError::BadAddress => ret::EINVAL,
        PostError::Unreachable => -(ffi::FI_EHOSTUNREACH as c_int),
        PostError::NoMemory => ret::ENOMEM,
        PostError::Unsupported => -(ffi::FI_EOPNOTSUPP as c_int),
        PostError::TooShort => ret::EINVAL,
    };
    ep.post_warnings.warn(op, format_args!("{op}: {e:?}"));
    code as isize
}

/// The buffers a call names (sends, receives and RMA alike).
#[derive(Clone, Copy)]
pub(super) enum Bufs {
    /// `buf, len`.
    One(*const c_void, usize),
    /// `iov, count` (the `v` and `msg` calls).
    Iov(*const ffi::iovec, usize),
}

impl Bufs {
    /// The buffers as (address, length) pairs, or the code to return.
    ///
    /// # Safety
    /// An iov array must hold its count of iovecs (libfabric's contract).
    #[inline(always)]
    pub(super) unsafe fn read(self, ep: &EpInner, op: &str) -> Result<IovList, isize> {
        match self {
            Bufs::One(buf, len) => {
                if buf.is_null() && len > 0 {
                    ep.post_warnings
                        .warn(op, format_args!("{op}: NULL buffer of {len} bytes"));
                    return Err(ret::EINVAL as isize);
                }
                Ok(IovList::One((buf as usize, len)))
            }
            // SAFETY: iov holds count iovecs (caller).
            Bufs::Iov(iov, count) => unsafe { iovs(ep, op, iov, count) },
        }
    }
}

/// What a data call asks for, in its own terms (before its endpoint is
/// known).
#[derive(Clone, Copy)]
struct Request {
    bufs: Bufs,
    /// A send's destination; a receive's source (FI_ADDR_UNSPEC: anyone).
    addr: ffi::fi_addr_t,
    /// The tag of a tagged call (None: untagged).
    tag: Option<u64>,
    /// Tag bits a tagged receive ignores.
    ignore: u64,
    /// Remote CQ data a send carries.
    data: Option<u64>,
    context: *mut c_void,
    /// The flags of a `msg` call; None: the endpoint's default op_flags.
    flags: Option<u64>,
    /// `fi_inject*`: copied before return, never completed.
    inject: bool,
}

impl Request {
    #[inline(always)]
    fn buf(buf: *const c_void, len: usize, addr: ffi::fi_addr_t, context: *mut c_void) -> Self {
        Request {
            bufs: Bufs::One(buf, len),
            addr,
            tag: None,
            ignore: 0,
            data: None,
            context,
            flags: None,
            inject: false,
        }
    }

    #[inline(always)]
    fn iov(
        iov: *const ffi::iovec,
        count: usize,
        addr: ffi::fi_addr_t,
        context: *mut c_void,
    ) -> Self {
        Request {
            bufs: Bufs::Iov(iov, count),
            ..Request::buf(ptr::null(), 0, addr, context)
        }
    }

    /// No context and no flags: an inject has no completion to ask for.
    #[inline(always)]
    fn inject(buf: *const c_void, len: usize, addr: ffi::fi_addr_t) -> Self {
        Request {
            flags: Some(0),
            inject: true,
            ..Request::buf(buf, len, addr, ptr::null_mut())
        }
    }

    /// An `fi_msg`; its data travels only with FI_REMOTE_CQ_DATA.
    #[inline(always)]
    fn msg(m: &ffi::fi_msg, flags: u64) -> Self {
        Request {
            data: (flags & ffi::FI_REMOTE_CQ_DATA != 0).then_some(m.data),
            flags: Some(flags),
            ..Request::iov(m.msg_iov, m.iov_count, m.addr, m.context)
        }
    }

    #[inline(always)]
    fn tagged_msg(m: &ffi::fi_msg_tagged, flags: u64) -> Self {
        Request {
            tag: Some(m.tag),
            ignore: m.ignore,
            data: (flags & ffi::FI_REMOTE_CQ_DATA != 0).then_some(m.data),
            flags: Some(flags),
            ..Request::iov(m.msg_iov, m.iov_count, m.addr, m.context)
        }
    }

    #[inline(always)]
    fn tagged(self, tag: u64, ignore: u64) -> Self {
        Request {
            tag: Some(tag),
            ignore,
            ..self
        }
    }

    #[inline(always)]
    fn with_data(self, data: u64) -> Self {
        Request {
            data: Some(data),
            ..self
        }
    }
}

/// A send of `iov` as `req` asks.
///
/// Out of line on purpose, like [`post_recv`]: inlined into the shared
/// entry path it pushed the AV lookup and the protocol's send out of line
/// instead, and an inject with a receive took some 5 ns more.
#[inline(never)]
fn post_send(ep: &EpInner, op: &str, iov: IovList, req: &Request) -> isize {
    let flags = req.flags.unwrap_or(ep.tx_op_flags);
    let Some(b) = ep.active.get() else {
        ep.post_warnings
            .warn(op, format_args!("{op}: the endpoint is not enabled"));
        return -(ffi::FI_EOPBADSTATE as c_int) as isize;
    };
    if flags & !SEND_FLAGS != 0 {
        ep.post_warnings.warn(
            op,
            format_args!("{op}: unsupported flags {:#x}", flags & !SEND_FLAGS),
        );
        return ret::EBADFLAGS as isize;
    }
    let len = total_len(&iov);
    if (req.inject || flags & ffi::FI_INJECT != 0) && len > ep.inject_size {
        ep.post_warnings.warn(
            op,
            format_args!(
                "{op}: {len} bytes exceed the inject size {}",
                ep.inject_size
            ),
        );
        return ret::EINVAL as isize;
    }
    let Some(dest) = b.av.as_ref().and_then(|av| av.lookup(req.addr)) else {
        ep.post_warnings.warn(
            op,
            format_args!("{op}: fi_addr {:#x} is not in the endpoint's AV", req.addr),
        );
        return ret::EINVAL as isize;
    };
    let completion = !b.tx_selective || flags & ffi::FI_COMPLETION != 0;
    let req = SendReq {
        dest,
        iov,
        info: MatchInfo {
            tag: req.tag,
            data: req.data,
        },
        context: req.context as usize,
        completion,
        inject: req.inject,
        copy: flags & ffi::FI_INJECT != 0,
        delivery_complete: flags & (ffi::FI_MATCH_COMPLETE | ffi::FI_DELIVERY_COMPLETE) != 0,
    };
    // SAFETY: libfabric's contract: the buffers stay valid until the send
    // completes (until return for an inject or with FI_INJECT, which the
    // protocol copies).
    ep.post(op, |messenger| unsafe { messenger.send(req) })
}

/// A receive into `iov` as `req` asks.
#[inline(never)]
fn post_recv(ep: &EpInner, op: &str, iov: IovList, req: &Request) -> isize {
    let flags = req.flags.unwrap_or(ep.rx_op_flags);
    let tagged = req.tag.is_some();
    let Some(b) = ep.active.get() else {
        ep.post_warnings
            .warn(op, format_args!("{op}: the endpoint is not enabled"));
        return -(ffi::FI_EOPBADSTATE as c_int) as isize;
    };
    if flags & !RECV_FLAGS != 0 {
        ep.post_warnings.warn(
            op,
            format_args!("{op}: unsupported flags {:#x}", flags & !RECV_FLAGS),
        );
        return ret::EBADFLAGS as isize;
    }
    let multi_recv = flags & ffi::FI_MULTI_RECV != 0;
    if multi_recv && (tagged || iov.len() != 1) {
        ep.post_warnings.warn(
            op,
            format_args!("{op}: FI_MULTI_RECV takes one untagged buffer"),
        );
        return ret::EINVAL as isize;
    }
    let src = req.addr;
    let (src, completion) = {
        let directed = ep.caps & ffi::FI_DIRECTED_RECV != 0 && src != FI_ADDR_UNSPEC;
        let src = if directed {
            match b.av.as_ref().and_then(|av| av.lookup(src)) {
                Some(addr) => Some(addr),
                None => {
                    ep.post_warnings.warn(
                        op,
                        format_args!("{op}: fi_addr {src:#x} is not in the endpoint's AV"),
                    );
                    return ret::EINVAL as isize;
                }
            }
        } else {
            None
        };
        (src, !b.rx_selective || flags & ffi::FI_COMPLETION != 0)
    };
    let recv = PostedRecv {
        context: req.context as usize,
        iov,
        src,
        tag: req.tag.unwrap_or(0),
        ignore: req.ignore,
        completion,
        multi_recv,
    };
    let mut messenger = ep.enter();
    let result = if flags & ffi::FI_PEEK != 0 {
        // A peek must see what has arrived by now.
        messenger.progress();
        messenger.peek(
            tagged,
            recv,
            flags & ffi::FI_CLAIM != 0,
            flags & ffi::FI_DISCARD != 0,
        );
        0
    } else if flags & ffi::FI_CLAIM != 0 {
        // SAFETY: libfabric's contract: the buffer stays valid until the
        // receive completes.
        if unsafe { messenger.claim(tagged, recv, flags & ffi::FI_DISCARD != 0) } {
            0
        } else {
            ep.post_warnings.warn(
                op,
                format_args!(
                    "{op}: FI_CLAIM without a message claimed by FI_PEEK for this context"
                ),
            );
            ret::EINVAL as isize
        }
    } else {
        // No limit but memory: rx_size is what we advertise, not a cap. MPI
        // posts thousands of receives, and a peer that floods us the same
        // way could only wait for us if we refused (both sides spinning on
        // -FI_EAGAIN with nothing sent).
        // SAFETY: as above.
        unsafe { messenger.post_recv(tagged, recv) };
        0
    };
    ep.drain(&mut messenger);
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
        ep.post_warnings.warn(
            op,
            format_args!("{op}: {count} iovs exceed the limit of {}", ep.iov_limit),
        );
        return Err(ret::EINVAL as isize);
    }
    if count > 0 && iov.is_null() {
        ep.post_warnings.warn(op, format_args!("{op}: NULL iov"));
        return Err(ret::EINVAL as isize);
    }
    if count == 0 {
        return Ok(IovList::Many(Vec::new()));
    }
    // SAFETY: iov points to count iovecs (caller).
    let slice = unsafe { std::slice::from_raw_parts(iov, count) };
    // Lengths are added up all along the protocol: their sum must fit.
    let mut total = 0usize;
    for v in slice {
        if v.iov_base.is_null() && v.iov_len > 0 {
            ep.post_warnings.warn(
                op,
                format_args!("{op}: NULL iov_base of {} bytes", v.iov_len),
            );
            return Err(ret::EINVAL as isize);
        }
        let Some(sum) = total.checked_add(v.iov_len) else {
            ep.post_warnings
                .warn(op, format_args!("{op}: iov lengths add up past SIZE_MAX"));
            return Err(ret::EINVAL as isize);
        };
        total = sum;
    }
    if let [v] = slice {
        // What collecting one piece would give, without the Vec.
        return Ok(IovList::One((v.iov_base as usize, v.iov_len)));
    }
    Ok(slice
        .iter()
        .map(|v| (v.iov_base as usize, v.iov_len))
        .collect::<Vec<Iov>>()
        .into())
}

/// Every send entry point: [`post`] then [`post_send`].
///
/// # Safety
/// As [`post`].
#[inline(always)]
unsafe fn send(op: &'static str, ep: *mut ffi::fid_ep, req: impl Into<Option<Request>>) -> isize {
    // SAFETY: forwarded from the caller.
    unsafe { post(op, ep, req.into(), post_send) }
}

/// Every receive entry point: [`post`] then [`post_recv`].
///
/// # Safety
/// As [`post`].
#[inline(always)]
unsafe fn recv(op: &'static str, ep: *mut ffi::fid_ep, req: impl Into<Option<Request>>) -> isize {
    // SAFETY: forwarded from the caller.
    unsafe { post(op, ep, req.into(), post_recv) }
}

/// What every data entry point does: find our endpoint (-FI_EINVAL if it
/// is not one, or `req` is None: a NULL `msg`), read the call's buffers,
/// then `post` them, all under the panic guard.
///
/// # Safety
/// `ep` must be NULL or a live `struct fid_ep`; the request's iov array
/// must hold its count of iovecs (libfabric's contract for the call).
#[inline(always)]
unsafe fn post(
    op: &'static str,
    ep: *mut ffi::fid_ep,
    req: Option<Request>,
    post: impl FnOnce(&EpInner, &str, IovList, &Request) -> isize,
) -> isize {
    // The guard's closure takes the request by reference: moving it in
    // would copy it twice more on every call.
    let req = req.as_ref();
    ffi_guard_or(op, ret::EOTHER as isize, || {
        // SAFETY: libfabric hands us an endpoint the application got from us.
        let Some(ep) = (unsafe { Ep::from_ptr(ep, op) }) else {
            return ret::EINVAL as isize;
        };
        let ep = &*ep.inner;
        let Some(req) = req else {
            return ret::EINVAL as isize;
        };
        // SAFETY: an iov array holds its count (caller).
        match unsafe { req.bufs.read(ep, op) } {
            Ok(iov) => post(ep, op, iov, req),
            Err(code) => code,
        }
    })
}

// Each entry point below: its arguments into a Request, to send or recv.

// --- fi_ops_msg --------------------------------------------------------------------

unsafe extern "C" fn msg_recv(
    ep: *mut ffi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's arguments (API contract).
    unsafe { recv("fi_recv", ep, Request::buf(buf, len, src, context)) }
}

unsafe extern "C" fn msg_recvv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's arguments (API contract).
    unsafe { recv("fi_recvv", ep, Request::iov(iov, count, src, context)) }
}

unsafe extern "C" fn msg_recvmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg (API contract).
    let req = unsafe { msg.as_ref() }.map(|m| Request::msg(m, flags));
    // SAFETY: the application's arguments (API contract).
    unsafe { recv("fi_recvmsg", ep, req) }
}

unsafe extern "C" fn msg_send(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_send", ep, Request::buf(buf, len, dest, context)) }
}

unsafe extern "C" fn msg_sendv(
    ep: *mut ffi::fid_ep,
    iov: *const ffi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: ffi::fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_sendv", ep, Request::iov(iov, count, dest, context)) }
}

unsafe extern "C" fn msg_sendmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg (API contract).
    let req = unsafe { msg.as_ref() }.map(|m| Request::msg(m, flags));
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_sendmsg", ep, req) }
}

unsafe extern "C" fn msg_inject(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: ffi::fi_addr_t,
) -> isize {
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_inject", ep, Request::inject(buf, len, dest)) }
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
    let req = Request::buf(buf, len, dest, context).with_data(data);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_senddata", ep, req) }
}

unsafe extern "C" fn msg_injectdata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: ffi::fi_addr_t,
) -> isize {
    let req = Request::inject(buf, len, dest).with_data(data);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_injectdata", ep, req) }
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
    let req = Request::buf(buf, len, src, context).tagged(tag, ignore);
    // SAFETY: the application's arguments (API contract).
    unsafe { recv("fi_trecv", ep, req) }
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
    let req = Request::iov(iov, count, src, context).tagged(tag, ignore);
    // SAFETY: the application's arguments (API contract).
    unsafe { recv("fi_trecvv", ep, req) }
}

unsafe extern "C" fn tagged_recvmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_tagged,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_tagged (API contract).
    let req = unsafe { msg.as_ref() }.map(|m| Request::tagged_msg(m, flags));
    // SAFETY: the application's arguments (API contract).
    unsafe { recv("fi_trecvmsg", ep, req) }
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
    let req = Request::buf(buf, len, dest, context).tagged(tag, 0);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_tsend", ep, req) }
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
    let req = Request::iov(iov, count, dest, context).tagged(tag, 0);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_tsendv", ep, req) }
}

unsafe extern "C" fn tagged_sendmsg(
    ep: *mut ffi::fid_ep,
    msg: *const ffi::fi_msg_tagged,
    flags: u64,
) -> isize {
    // SAFETY: msg is NULL or a valid fi_msg_tagged (API contract).
    let req = unsafe { msg.as_ref() }.map(|m| Request::tagged_msg(m, flags));
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_tsendmsg", ep, req) }
}

unsafe extern "C" fn tagged_inject(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: ffi::fi_addr_t,
    tag: u64,
) -> isize {
    let req = Request::inject(buf, len, dest).tagged(tag, 0);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_tinject", ep, req) }
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
    let req = Request::buf(buf, len, dest, context)
        .tagged(tag, 0)
        .with_data(data);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_tsenddata", ep, req) }
}

unsafe extern "C" fn tagged_injectdata(
    ep: *mut ffi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: ffi::fi_addr_t,
    tag: u64,
) -> isize {
    let req = Request::inject(buf, len, dest)
        .tagged(tag, 0)
        .with_data(data);
    // SAFETY: the application's arguments (API contract).
    unsafe { send("fi_tinjectdata", ep, req) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_say_what_each_call_asks() {
        let (buf, ctx) = (0x1000 as *const c_void, 7 as *mut c_void);
        let r = Request::buf(buf, 5, 3, ctx);
        assert!(matches!(r.bufs, Bufs::One(b, 5) if b == buf));
        assert_eq!((r.addr, r.tag, r.data, r.flags), (3, None, None, None));
        assert!(r.context == ctx && !r.inject);

        let r = Request::inject(buf, 5, 3).tagged(9, 0).with_data(4);
        assert_eq!((r.tag, r.data, r.flags), (Some(9), Some(4), Some(0)));
        assert!(r.inject && r.context.is_null());

        let iov = [ffi::iovec::default(); 2];
        let m = ffi::fi_msg {
            msg_iov: iov.as_ptr(),
            iov_count: 2,
            addr: 3,
            context: ctx,
            data: 11,
            ..Default::default()
        };
        let r = Request::msg(&m, ffi::FI_COMPLETION);
        assert!(matches!(r.bufs, Bufs::Iov(p, 2) if p == iov.as_ptr()));
        assert_eq!(
            (r.addr, r.tag, r.data),
            (3, None, None),
            "no FI_REMOTE_CQ_DATA"
        );
        assert_eq!(r.flags, Some(ffi::FI_COMPLETION));
        let r = Request::msg(&m, ffi::FI_REMOTE_CQ_DATA);
        assert_eq!(r.data, Some(11));

        let t = ffi::fi_msg_tagged {
            msg_iov: iov.as_ptr(),
            iov_count: 1,
            tag: 0xab,
            ignore: 0xf,
            ..Default::default()
        };
        let r = Request::tagged_msg(&t, 0);
        assert_eq!((r.tag, r.ignore, r.flags), (Some(0xab), 0xf, Some(0)));
    }

    #[test]
    fn entry_points_refuse_what_is_not_an_endpoint() {
        let einval = ret::EINVAL as isize;
        let mut not_ep = ffi::fid_ep::default();
        let not_ep: *mut ffi::fid_ep = &mut not_ep;
        // SAFETY: NULL or a zeroed fid_ep, which no entry point takes for ours.
        unsafe {
            for ep in [ptr::null_mut(), not_ep] {
                assert_eq!(msg_inject(ep, ptr::null(), 0, 0), einval);
                assert_eq!(msg_sendmsg(ep, ptr::null(), 0), einval);
                assert_eq!(tagged_recvmsg(ep, ptr::null(), 0), einval);
                let recv = TAGGED_OPS.recv.unwrap();
                let r = recv(
                    ep,
                    ptr::null_mut(),
                    0,
                    ptr::null_mut(),
                    0,
                    1,
                    0,
                    ptr::null_mut(),
                );
                assert_eq!(r, einval);
            }
        }
    }
}
