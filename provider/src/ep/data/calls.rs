//! The eighteen entry points of `fi_ops_msg` and `fi_ops_tagged`: each
//! turns its arguments into a [`Request`] and hands it to [`send`] or
//! [`recv`] (mod.rs).

use std::mem::size_of;
use std::os::raw::c_void;

use super::{recv, send, Request};
use crate::base::ffi;

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
    use std::ptr;

    use super::*;
    use crate::base::ffi::Error;

    #[test]
    fn entry_points_refuse_what_is_not_an_endpoint() {
        let einval = Error::EINVAL.ssize();
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
