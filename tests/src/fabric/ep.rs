//! The endpoint: binding, enabling, its name, messages (untagged and
//! tagged, posted and injected, `msg` forms, multi-receive), cancellation
//! and options.

use std::ffi::{c_void, CStr};
use std::os::raw::c_int;
use std::ptr::null_mut;

use unimem_fi_sys as ffi;

use super::{check, rc, Ep, Object};

/// Matching information of a send: tag (tagged interface) and remote CQ
/// data (`fi_senddata` and friends).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Match {
    pub tag: Option<u64>,
    pub data: Option<u64>,
}

/// What a receive accepts from the tagged interface: `(tag, ignore)`, or
/// `None` for the untagged one.
pub type TagMatch = Option<(u64, u64)>;

impl Ep {
    pub(super) fn get(&self) -> &ffi::fid_ep {
        // SAFETY: the endpoint is live.
        unsafe { &*self.ptr }
    }

    pub(super) fn msg(&self) -> &ffi::fi_ops_msg {
        // SAFETY: a live endpoint has its message ops table.
        unsafe { &*self.get().msg }
    }

    pub(super) fn tagged(&self) -> &ffi::fi_ops_tagged {
        // SAFETY: a live endpoint has its tagged ops table.
        unsafe { &*self.get().tagged }
    }

    pub(super) fn ops(&self) -> &ffi::fi_ops_ep {
        // SAFETY: a live endpoint has its endpoint ops table.
        unsafe { &*self.get().ops }
    }

    /// `fi_ep_bind`.
    pub fn bind(&self, obj: &impl Object, flags: u64) -> Result<(), i32> {
        let fid = self.fid();
        // SAFETY: both objects are live.
        check(unsafe { ((*(*fid).ops).bind.expect("fi_ops.bind"))(fid, obj.fid(), flags) })
    }

    /// `fi_enable`.
    pub fn enable(&self) -> Result<(), i32> {
        let fid = self.fid();
        // SAFETY: the endpoint is live; FI_ENABLE takes no argument.
        check(unsafe {
            ((*(*fid).ops).control.expect("fi_ops.control"))(
                fid,
                ffi::FI_ENABLE as c_int,
                null_mut(),
            )
        })
    }

    /// `fi_getname`, as the address string (`FI_ADDR_STR`).
    pub fn name(&self) -> Result<String, i32> {
        let mut buf = [0u8; 256];
        let mut len = buf.len();
        // SAFETY: the endpoint is live; buf holds len bytes.
        check(unsafe {
            ((*self.get().cm).getname.expect("getname"))(
                self.fid(),
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        })?;
        let text =
            CStr::from_bytes_until_nul(&buf[..len.min(buf.len())]).map_err(|_| rc::EINVAL)?;
        Ok(text.to_string_lossy().into_owned())
    }

    /// `fi_send`, `fi_senddata`, `fi_tsend` or `fi_tsenddata`, after `m`.
    ///
    /// # Safety
    /// `len` bytes at `buf` must stay readable until the send completes
    /// (the provider may also refuse without reading them).
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        dest: u64,
        m: Match,
        context: usize,
    ) -> isize {
        let (ep, buf, desc, ctx) = (self.ptr, buf.cast::<c_void>(), null_mut(), context as _);
        // SAFETY: the endpoint is live; buf is the caller's business.
        unsafe {
            match (m.tag, m.data) {
                (None, None) => self.msg().send.expect("send")(ep, buf, len, desc, dest, ctx),
                (None, Some(d)) => {
                    self.msg().senddata.expect("senddata")(ep, buf, len, desc, d, dest, ctx)
                }
                (Some(t), None) => {
                    self.tagged().send.expect("tsend")(ep, buf, len, desc, dest, t, ctx)
                }
                (Some(t), Some(d)) => {
                    self.tagged().senddata.expect("tsenddata")(ep, buf, len, desc, d, dest, t, ctx)
                }
            }
        }
    }

    /// `fi_sendv` of `bufs` (untagged, no descriptors).
    ///
    /// # Safety
    /// The buffers must stay readable until the send completes (the
    /// provider may also refuse without reading them).
    pub unsafe fn sendv(&self, bufs: &[(*const u8, usize)], dest: u64, context: usize) -> isize {
        let iov: Vec<ffi::iovec> = bufs
            .iter()
            .map(|&(base, len)| ffi::iovec {
                iov_base: base as *mut c_void,
                iov_len: len,
            })
            .collect();
        let mut desc: Vec<*mut c_void> = vec![null_mut(); iov.len()];
        // SAFETY: the endpoint is live; iov and desc are live locals of
        // iov.len() entries; the buffers are the caller's business.
        unsafe {
            self.msg().sendv.expect("sendv")(
                self.ptr,
                iov.as_ptr(),
                desc.as_mut_ptr(),
                iov.len(),
                dest,
                context as _,
            )
        }
    }

    /// `fi_sendmsg`, or `fi_tsendmsg` with a tag, of one buffer with
    /// `flags` (`FI_REMOTE_CQ_DATA` is added with CQ data).
    ///
    /// # Safety
    /// As for [`Ep::send`].
    pub unsafe fn sendmsg(
        &self,
        buf: *const u8,
        len: usize,
        dest: u64,
        m: Match,
        context: usize,
        flags: u64,
    ) -> isize {
        let iov = ffi::iovec {
            iov_base: buf as *mut c_void,
            iov_len: len,
        };
        let flags = flags | m.data.map_or(0, |_| ffi::FI_REMOTE_CQ_DATA);
        let mut desc = null_mut();
        // SAFETY (both arms): the endpoint is live; the message, its iov and
        // desc are live locals (the provider copies them); buf is the
        // caller's business.
        match m.tag {
            None => {
                let msg = ffi::fi_msg {
                    msg_iov: &iov,
                    desc: &mut desc,
                    iov_count: 1,
                    addr: dest,
                    context: context as _,
                    data: m.data.unwrap_or(0),
                };
                // SAFETY: see above.
                unsafe { self.msg().sendmsg.expect("sendmsg")(self.ptr, &msg, flags) }
            }
            Some(tag) => {
                let msg = ffi::fi_msg_tagged {
                    msg_iov: &iov,
                    desc: &mut desc,
                    iov_count: 1,
                    addr: dest,
                    tag,
                    ignore: 0,
                    context: context as _,
                    data: m.data.unwrap_or(0),
                };
                // SAFETY: see above.
                unsafe { self.tagged().sendmsg.expect("tsendmsg")(self.ptr, &msg, flags) }
            }
        }
    }

    /// `fi_inject`, `fi_injectdata`, `fi_tinject` or `fi_tinjectdata` of
    /// `len` bytes at `buf`.
    ///
    /// # Safety
    /// `len` bytes at `buf` must be readable during the call (the provider
    /// may refuse without reading them).
    pub unsafe fn inject(&self, buf: *const u8, len: usize, dest: u64, m: Match) -> isize {
        let (ep, buf) = (self.ptr, buf.cast::<c_void>());
        // SAFETY: the endpoint is live; buf is the caller's business.
        unsafe {
            match (m.tag, m.data) {
                (None, None) => self.msg().inject.expect("inject")(ep, buf, len, dest),
                (None, Some(d)) => {
                    self.msg().injectdata.expect("injectdata")(ep, buf, len, d, dest)
                }
                (Some(t), None) => self.tagged().inject.expect("tinject")(ep, buf, len, dest, t),
                (Some(t), Some(d)) => {
                    self.tagged().injectdata.expect("tinjectdata")(ep, buf, len, d, dest, t)
                }
            }
        }
    }

    /// `fi_recv`, or `fi_trecv` with `tag`.
    ///
    /// # Safety
    /// `len` bytes at `buf` must stay writable until the receive completes.
    pub unsafe fn recv(
        &self,
        buf: *mut u8,
        len: usize,
        src: u64,
        tag: TagMatch,
        context: usize,
    ) -> isize {
        let (ep, buf, desc, ctx) = (self.ptr, buf.cast::<c_void>(), null_mut(), context as _);
        // SAFETY: the endpoint is live; buf is the caller's business.
        unsafe {
            match tag {
                None => self.msg().recv.expect("recv")(ep, buf, len, desc, src, ctx),
                Some((t, ignore)) => {
                    self.tagged().recv.expect("trecv")(ep, buf, len, desc, src, t, ignore, ctx)
                }
            }
        }
    }

    /// `fi_recvmsg` with `FI_MULTI_RECV`: one buffer for many messages.
    ///
    /// # Safety
    /// `len` bytes at `buf` must stay writable until the buffer's release
    /// (the completion flagged `FI_MULTI_RECV`).
    pub unsafe fn recv_multi(&self, buf: *mut u8, len: usize, src: u64, context: usize) -> isize {
        let iov = ffi::iovec {
            iov_base: buf.cast(),
            iov_len: len,
        };
        let msg = ffi::fi_msg {
            msg_iov: &iov,
            desc: null_mut(),
            iov_count: 1,
            addr: src,
            context: context as _,
            data: 0,
        };
        // SAFETY: the endpoint is live; msg and iov are live locals (the
        // provider copies them); buf is the caller's business.
        unsafe { self.msg().recvmsg.expect("recvmsg")(self.ptr, &msg, ffi::FI_MULTI_RECV) }
    }

    /// `fi_cancel` of the operation posted with `context`.
    pub fn cancel(&self, context: usize) -> isize {
        // SAFETY: the endpoint is live; the context is only compared.
        unsafe { self.ops().cancel.expect("cancel")(self.fid(), context as _) }
    }

    /// `fi_setopt(FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV)`.
    pub fn set_min_multi_recv(&self, min: usize) -> Result<(), i32> {
        // SAFETY: the endpoint is live; the value is a live size_t.
        check(unsafe {
            self.ops().setopt.expect("setopt")(
                self.fid(),
                ffi::FI_OPT_ENDPOINT as c_int,
                ffi::FI_OPT_MIN_MULTI_RECV as c_int,
                (&min as *const usize).cast(),
                size_of::<usize>(),
            )
        })
    }

    /// `fi_getopt(FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV)`.
    pub fn min_multi_recv(&self) -> Result<usize, i32> {
        let mut min = 0usize;
        let mut len = size_of::<usize>();
        // SAFETY: the endpoint is live; min and len are live locals.
        check(unsafe {
            self.ops().getopt.expect("getopt")(
                self.fid(),
                ffi::FI_OPT_ENDPOINT as c_int,
                ffi::FI_OPT_MIN_MULTI_RECV as c_int,
                (&mut min as *mut usize).cast(),
                &mut len,
            )
        })?;
        Ok(min)
    }
}
