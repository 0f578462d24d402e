//! RMA on an endpoint: writes and reads in each call form.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use unimem_fi_sys as ffi;

use super::Ep;

/// Where an RMA operation goes: the peer's `fi_addr`, and the range there
/// under `key` (`addr` is an offset into the region unless the domain
/// has `FI_MR_VIRT_ADDR`).
#[derive(Clone, Copy, Debug)]
pub struct RmaTarget {
    pub peer: u64,
    pub addr: u64,
    pub key: u64,
}

/// Which entry point an RMA write or read is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaCall {
    /// `fi_write` (`fi_writedata` with CQ data) or `fi_read`, of one buffer.
    Plain,
    /// `fi_writev` or `fi_readv`.
    Vector,
    /// `fi_writemsg` or `fi_readmsg` with these flags (`FI_REMOTE_CQ_DATA`
    /// is added with CQ data); the target range split into `rma_iovs`
    /// consecutive pieces (1 is the only count the provider supports).
    Msg { flags: u64, rma_iovs: usize },
}

/// The target range of an RMA `msg` call: `len` bytes at `t` in `count`
/// consecutive pieces (the last takes the remainder).
fn rma_iovs(t: RmaTarget, len: usize, count: usize) -> Vec<ffi::fi_rma_iov> {
    let count = count.max(1);
    let piece = len / count;
    (0..count)
        .map(|i| ffi::fi_rma_iov {
            addr: t.addr + (i * piece) as u64,
            len: if i + 1 == count {
                len - i * piece
            } else {
                piece
            },
            key: t.key,
        })
        .collect()
}

impl Ep {
    fn rma(&self) -> &ffi::fi_ops_rma {
        // SAFETY: a live endpoint has its RMA ops table.
        unsafe { &*self.get().rma }
    }

    /// An RMA write of the buffers `bufs` (gathered in order) to `t`, made
    /// with `call`; with `data`, `fi_writedata` (for [`RmaCall::Plain`],
    /// which takes `bufs[0]` only) or `FI_REMOTE_CQ_DATA` (for
    /// [`RmaCall::Msg`]); `fi_writev` has no CQ data and ignores it.
    ///
    /// # Safety
    /// The buffers must stay readable until the write completes (the
    /// provider may also refuse without reading them).
    pub unsafe fn write(
        &self,
        bufs: &[(*const u8, usize)],
        t: RmaTarget,
        data: Option<u64>,
        call: RmaCall,
        context: usize,
    ) -> isize {
        let iov: Vec<ffi::iovec> = bufs
            .iter()
            .map(|&(base, len)| ffi::iovec {
                iov_base: base as *mut c_void,
                iov_len: len,
            })
            .collect();
        let (ep, ctx) = (self.ptr, context as *mut c_void);
        let (buf, len) = bufs.first().copied().unwrap_or((null(), 0));
        let rma = self.rma();
        // SAFETY (every arm): the endpoint is live; the iov and rma_iov
        // arrays and the message are live locals (the provider copies
        // them); the buffers are the caller's business.
        match call {
            RmaCall::Plain => match data {
                // SAFETY: see above.
                None => unsafe {
                    rma.write.expect("write")(
                        ep,
                        buf.cast(),
                        len,
                        null_mut(),
                        t.peer,
                        t.addr,
                        t.key,
                        ctx,
                    )
                },
                // SAFETY: see above.
                Some(d) => unsafe {
                    rma.writedata.expect("writedata")(
                        ep,
                        buf.cast(),
                        len,
                        null_mut(),
                        d,
                        t.peer,
                        t.addr,
                        t.key,
                        ctx,
                    )
                },
            },
            // SAFETY: see above.
            RmaCall::Vector => unsafe {
                rma.writev.expect("writev")(
                    ep,
                    iov.as_ptr(),
                    null_mut(),
                    iov.len(),
                    t.peer,
                    t.addr,
                    t.key,
                    ctx,
                )
            },
            RmaCall::Msg { flags, rma_iovs: n } => {
                let total = bufs.iter().map(|b| b.1).sum();
                let ranges = rma_iovs(t, total, n);
                let msg = ffi::fi_msg_rma {
                    msg_iov: iov.as_ptr(),
                    desc: null_mut(),
                    iov_count: iov.len(),
                    addr: t.peer,
                    rma_iov: ranges.as_ptr(),
                    rma_iov_count: n,
                    context: ctx,
                    data: data.unwrap_or(0),
                };
                let flags = flags | data.map_or(0, |_| ffi::FI_REMOTE_CQ_DATA);
                // SAFETY: see above.
                unsafe { rma.writemsg.expect("writemsg")(ep, &msg, flags) }
            }
        }
    }

    /// `fi_inject_write`, or `fi_inject_writedata` with `data`, of `len`
    /// bytes at `buf` to `t`.
    ///
    /// # Safety
    /// `len` bytes at `buf` must be readable during the call (the provider
    /// may refuse without reading them).
    pub unsafe fn inject_write(
        &self,
        buf: *const u8,
        len: usize,
        t: RmaTarget,
        data: Option<u64>,
    ) -> isize {
        let (ep, buf, rma) = (self.ptr, buf.cast::<c_void>(), self.rma());
        // SAFETY (both arms): the endpoint is live; buf is the caller's
        // business.
        match data {
            // SAFETY: see above.
            None => unsafe { rma.inject.expect("inject")(ep, buf, len, t.peer, t.addr, t.key) },
            // SAFETY: see above.
            Some(d) => unsafe {
                rma.injectdata.expect("injectdata")(ep, buf, len, d, t.peer, t.addr, t.key)
            },
        }
    }

    /// An RMA read from `t` into the buffers `bufs` (scattered in order),
    /// made with `call` (`fi_read` takes `bufs[0]` only).
    ///
    /// # Safety
    /// The buffers must stay writable until the read completes.
    pub unsafe fn read(
        &self,
        bufs: &[(*mut u8, usize)],
        t: RmaTarget,
        call: RmaCall,
        context: usize,
    ) -> isize {
        let iov: Vec<ffi::iovec> = bufs
            .iter()
            .map(|&(base, len)| ffi::iovec {
                iov_base: base.cast(),
                iov_len: len,
            })
            .collect();
        let (ep, ctx) = (self.ptr, context as *mut c_void);
        let (buf, len) = bufs.first().copied().unwrap_or((null_mut(), 0));
        let rma = self.rma();
        // SAFETY (every arm): the endpoint is live; the iov and rma_iov
        // arrays and the message are live locals (the provider copies
        // them); the buffers are the caller's business.
        match call {
            // SAFETY: see above.
            RmaCall::Plain => unsafe {
                rma.read.expect("read")(ep, buf.cast(), len, null_mut(), t.peer, t.addr, t.key, ctx)
            },
            // SAFETY: see above.
            RmaCall::Vector => unsafe {
                rma.readv.expect("readv")(
                    ep,
                    iov.as_ptr(),
                    null_mut(),
                    iov.len(),
                    t.peer,
                    t.addr,
                    t.key,
                    ctx,
                )
            },
            RmaCall::Msg { flags, rma_iovs: n } => {
                let total = bufs.iter().map(|b| b.1).sum();
                let ranges = rma_iovs(t, total, n);
                let msg = ffi::fi_msg_rma {
                    msg_iov: iov.as_ptr(),
                    desc: null_mut(),
                    iov_count: iov.len(),
                    addr: t.peer,
                    rma_iov: ranges.as_ptr(),
                    rma_iov_count: n,
                    context: ctx,
                    data: 0,
                };
                // SAFETY: see above.
                unsafe { rma.readmsg.expect("readmsg")(ep, &msg, flags) }
            }
        }
    }
}
