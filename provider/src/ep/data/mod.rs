//! The data path: `fi_send`/`fi_recv` and their tagged twins. Each of the
//! eighteen entry points states what is particular to it, the [`Request`]
//! its arguments describe, and hands it to [`send`] or [`recv`]: one way
//! to find the endpoint, read the buffers and default the flags, then
//! [`post_send`] or [`post_recv`]. That common path inlines into each
//! entry point and calls the two directly: a single-buffer call neither
//! allocates nor dispatches dynamically.
//!
//! Here: the request, the common path and the two posts; the entry points
//! and their operation tables are in `calls.rs`.

mod calls;

use std::os::raw::c_void;
use std::ptr;

use super::inner::{Bindings, Ep, EpInner};
use super::post::{map_post_error, Bufs};
use crate::base::ffi::{self, Error};
use crate::base::guard::ffi_guard_or;
use unimem_proto::iov::total_len;
use unimem_proto::matching::{IovList, PostedRecv};
use unimem_proto::messenger::SendReq;
use unimem_proto::wire::MatchInfo;

pub use calls::{MSG_OPS, TAGGED_OPS};

/// `FI_ADDR_UNSPEC` (`(uint64_t) -1`, a cast bindgen does not translate).
const FI_ADDR_UNSPEC: ffi::fi_addr_t = u64::MAX;

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
const RECV_FLAGS: u64 = ffi::FI_COMPLETION
    | ffi::FI_MULTI_RECV
    | ffi::FI_PEEK
    | ffi::FI_CLAIM
    | ffi::FI_DISCARD
    | ffi::FI_MSG
    | ffi::FI_TAGGED
    | ffi::FI_RECV;

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
/// Out of line on purpose: inlined into the shared entry path it pushed
/// the AV lookup and the protocol's send out of line instead, and an
/// inject with a receive took some 5 ns more.
#[inline(never)]
fn post_send(ep: &EpInner, op: &str, iov: IovList, req: &Request) -> Result<(), Error> {
    let flags = req.flags.unwrap_or(ep.tx_op_flags);
    let Some(b) = ep.active.get() else {
        return Err(ep.refuse(
            op,
            Error::EOPBADSTATE,
            format_args!("{op}: the endpoint is not enabled"),
        ));
    };
    if flags & !SEND_FLAGS != 0 {
        let why = format_args!("{op}: unsupported flags {:#x}", flags & !SEND_FLAGS);
        return Err(ep.refuse(op, Error::EBADFLAGS, why));
    }
    let len = total_len(&iov);
    if (req.inject || flags & ffi::FI_INJECT != 0) && len > ep.inject_size {
        let most = ep.inject_size;
        let why = format_args!("{op}: {len} bytes exceed the inject size {most}");
        return Err(ep.refuse(op, Error::EINVAL, why));
    }
    let completion = !b.tx_selective || flags & ffi::FI_COMPLETION != 0;
    let mut messenger = ep.enter();
    // A destination sent to before is the endpoint's cache's (no AV
    // lookup, no peer lookup); else its address, which the messenger
    // looks up or connects to.
    let (peer, dest) = match messenger.peer_of_fi_addr(b.av.as_deref(), req.addr) {
        Some(Ok(peer)) => (Some(peer), messenger.addr_of(peer)),
        Some(Err(dest)) => (None, dest),
        None => {
            drop(messenger);
            return Err(not_in_av(ep, op, req.addr));
        }
    };
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
    let posted = unsafe {
        match peer {
            Some(peer) => messenger.send_to(peer, req),
            None => messenger.send(req),
        }
    };
    ep.drain(&mut messenger);
    drop(messenger);
    posted.map_err(|e| map_post_error(ep, e, op))
}

/// Receive flags that leave the common path for [`post_recv_special`]:
/// the refused ones, peeks, claims and multi-receive buffers.
const SPECIAL_RECV_FLAGS: u64 = !RECV_FLAGS | ffi::FI_MULTI_RECV | ffi::FI_PEEK | ffi::FI_CLAIM;

/// A receive into `iov` as `req` asks.
///
/// The common case (a plain receive, from anyone or from one source) is
/// here; a directed one finds its source through the endpoint's cache of
/// peers by fi_addr (`EpMessenger::peer_of_fi_addr`, as sends do) rather
/// than the AV and the messenger's peer table. Inlined into the entry path, unlike
/// [`post_send`]: a call cost a receive some 14 instructions more.
#[inline(always)]
fn post_recv(ep: &EpInner, op: &str, iov: IovList, req: &Request) -> Result<(), Error> {
    let flags = req.flags.unwrap_or(ep.rx_op_flags);
    let Some(b) = ep.active.get() else {
        return Err(not_enabled(ep, op));
    };
    if flags & SPECIAL_RECV_FLAGS != 0 {
        return post_recv_special(ep, b, op, iov, req, flags);
    }
    let tagged = req.tag.is_some();
    let recv = PostedRecv {
        context: req.context as usize,
        iov,
        src: None,
        tag: req.tag.unwrap_or(0),
        ignore: req.ignore,
        completion: !b.rx_selective || flags & ffi::FI_COMPLETION != 0,
        multi_recv: false,
    };
    let directed = ep.caps & ffi::FI_DIRECTED_RECV != 0 && req.addr != FI_ADDR_UNSPEC;
    let mut messenger = ep.enter();
    // No limit but memory: rx_size is what we advertise, not a cap. MPI
    // posts thousands of receives, and a peer that floods us the same way
    // could only wait for us if we refused (both sides spinning on
    // -FI_EAGAIN with nothing sent).
    if !directed {
        // SAFETY: libfabric's contract: the buffer stays valid until the
        // receive completes.
        unsafe { messenger.post_recv(tagged, recv) };
    } else {
        match messenger.peer_of_fi_addr(b.av.as_deref(), req.addr) {
            // SAFETY: as above.
            Some(Ok(peer)) => unsafe { messenger.post_recv_from(tagged, recv, peer) },
            Some(Err(src)) => {
                let recv = PostedRecv {
                    src: Some(src),
                    ..recv
                };
                // SAFETY: as above.
                unsafe { messenger.post_recv(tagged, recv) };
            }
            None => {
                drop(messenger);
                return Err(not_in_av(ep, op, req.addr));
            }
        }
    }
    ep.drain(&mut messenger);
    Ok(())
}

#[cold]
fn not_enabled(ep: &EpInner, op: &str) -> Error {
    let why = format_args!("{op}: the endpoint is not enabled");
    ep.refuse(op, Error::EOPBADSTATE, why)
}

#[cold]
fn not_in_av(ep: &EpInner, op: &str, addr: ffi::fi_addr_t) -> Error {
    let why = format_args!("{op}: fi_addr {addr:#x} is not in the endpoint's AV");
    ep.refuse(op, Error::EINVAL, why)
}

/// [`post_recv`] with one of [`SPECIAL_RECV_FLAGS`] (`flags`).
#[cold]
#[inline(never)]
fn post_recv_special(
    ep: &EpInner,
    b: &Bindings,
    op: &str,
    iov: IovList,
    req: &Request,
    flags: u64,
) -> Result<(), Error> {
    let tagged = req.tag.is_some();
    if flags & !RECV_FLAGS != 0 {
        let why = format_args!("{op}: unsupported flags {:#x}", flags & !RECV_FLAGS);
        return Err(ep.refuse(op, Error::EBADFLAGS, why));
    }
    let multi_recv = flags & ffi::FI_MULTI_RECV != 0;
    if multi_recv && (tagged || iov.len() != 1) {
        let why = format_args!("{op}: FI_MULTI_RECV takes one untagged buffer");
        return Err(ep.refuse(op, Error::EINVAL, why));
    }
    let src = req.addr;
    let directed = ep.caps & ffi::FI_DIRECTED_RECV != 0 && src != FI_ADDR_UNSPEC;
    let src = if directed {
        match b.av.as_ref().and_then(|av| av.lookup(src)) {
            Some(addr) => Some(addr),
            None => return Err(not_in_av(ep, op, src)),
        }
    } else {
        None
    };
    let recv = PostedRecv {
        context: req.context as usize,
        iov,
        src,
        tag: req.tag.unwrap_or(0),
        ignore: req.ignore,
        completion: !b.rx_selective || flags & ffi::FI_COMPLETION != 0,
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
        Ok(())
    } else if flags & ffi::FI_CLAIM != 0 {
        // SAFETY: libfabric's contract: the buffer stays valid until the
        // receive completes.
        if unsafe { messenger.claim(tagged, recv, flags & ffi::FI_DISCARD != 0) } {
            Ok(())
        } else {
            let why = format_args!(
                "{op}: FI_CLAIM without a message claimed by FI_PEEK for this context"
            );
            Err(ep.refuse(op, Error::EINVAL, why))
        }
    } else {
        // A multi-receive buffer (see post_recv on limits).
        // SAFETY: as above.
        unsafe { messenger.post_recv(tagged, recv) };
        Ok(())
    };
    ep.drain(&mut messenger);
    result
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
    post: impl FnOnce(&EpInner, &str, IovList, &Request) -> Result<(), Error>,
) -> isize {
    // The guard's closure takes the request by reference (moving it in
    // would copy it twice more on every call), and that reference, the
    // endpoint and the name by value: stored once, not each behind a
    // pointer of its own.
    let req = req.as_ref();
    ffi_guard_or(op, Error::EOTHER.ssize(), move || {
        // SAFETY: libfabric hands us an endpoint the application got from us.
        let Some(ep) = (unsafe { Ep::from_ptr(ep, op) }) else {
            return Error::EINVAL.ssize();
        };
        let ep = &*ep.inner;
        let Some(req) = req else {
            return Error::EINVAL.ssize();
        };
        // SAFETY: an iov array holds its count (caller).
        let posted = unsafe { req.bufs.read(ep, op) }.and_then(|iov| post(ep, op, iov, req));
        ffi::error::ssize_of(posted)
    })
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
}
