//! The completion queue: entries, error entries, reads and waits.

use std::ptr::{null, null_mut};

use unimem_fi_sys as ffi;

use super::{rc, Cq, FI_ADDR_NOTAVAIL};

/// One successful completion (`struct fi_cq_tagged_entry` plus the source
/// from `fi_cq_readfrom`).
#[derive(Clone, Copy, Debug)]
pub struct CqEntry {
    pub context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    pub src: u64,
}

impl CqEntry {
    fn from(e: &ffi::fi_cq_tagged_entry, src: ffi::fi_addr_t) -> CqEntry {
        CqEntry {
            context: e.op_context as usize,
            flags: e.flags,
            len: e.len,
            buf: e.buf as usize,
            data: e.data,
            tag: e.tag,
            src,
        }
    }
}

/// One error completion (`struct fi_cq_err_entry`).
#[derive(Clone, Copy, Debug)]
pub struct CqError {
    pub context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: i32,
}

impl Cq {
    fn ops(&self) -> &ffi::fi_ops_cq {
        // SAFETY: a live CQ has its ops table.
        unsafe { &*(*self.ptr).ops }
    }

    /// `fi_cq_readfrom` of up to 64 entries, appended to `out`. Returns how
    /// many, 0 when the CQ is empty, `Err(-FI_EAVAIL)` when an error entry
    /// comes next, other negative codes as they are.
    pub fn read_from(&self, out: &mut Vec<CqEntry>) -> Result<usize, isize> {
        const BATCH: usize = 64;
        let mut entries = [ffi::fi_cq_tagged_entry::default(); BATCH];
        let mut src = [FI_ADDR_NOTAVAIL; BATCH];
        // SAFETY: the CQ is live and of the tagged format; both arrays hold
        // BATCH entries.
        let n = unsafe {
            self.ops().readfrom.expect("readfrom")(
                self.ptr,
                entries.as_mut_ptr().cast(),
                BATCH,
                src.as_mut_ptr(),
            )
        };
        if n == rc::EAGAIN as isize {
            return Ok(0);
        }
        if n < 0 {
            return Err(n);
        }
        let n = n as usize;
        out.extend(
            entries[..n]
                .iter()
                .zip(&src[..n])
                .map(|(e, &src)| CqEntry::from(e, src)),
        );
        Ok(n)
    }

    /// `fi_cq_sreadfrom` of one entry, waiting at most `timeout_ms`:
    /// `Ok(1)` with the entry appended to `out`, or the negative code.
    pub fn sread(&self, out: &mut Vec<CqEntry>, timeout_ms: i32) -> Result<usize, isize> {
        let mut e = ffi::fi_cq_tagged_entry::default();
        let mut src = FI_ADDR_NOTAVAIL;
        // SAFETY: the CQ is live and of the tagged format; one entry and
        // one address of room.
        let n = unsafe {
            self.ops().sreadfrom.expect("sreadfrom")(
                self.ptr,
                (&mut e as *mut ffi::fi_cq_tagged_entry).cast(),
                1,
                &mut src,
                null(),
                timeout_ms,
            )
        };
        if n < 0 {
            return Err(n);
        }
        out.push(CqEntry::from(&e, src));
        Ok(n as usize)
    }

    /// `fi_cq_readerr`.
    pub fn read_err(&self) -> Result<CqError, isize> {
        let mut e = ffi::fi_cq_err_entry {
            op_context: null_mut(),
            flags: 0,
            len: 0,
            buf: null_mut(),
            data: 0,
            tag: 0,
            olen: 0,
            err: 0,
            prov_errno: 0,
            err_data: null_mut(),
            err_data_size: 0,
        };
        // SAFETY: the CQ is live; e is a live local of the 1.17 layout.
        let n = unsafe { self.ops().readerr.expect("readerr")(self.ptr, &mut e, 0) };
        if n < 0 {
            return Err(n);
        }
        Ok(CqError {
            context: e.op_context as usize,
            flags: e.flags,
            len: e.len,
            buf: e.buf as usize,
            data: e.data,
            tag: e.tag,
            olen: e.olen,
            err: e.err,
        })
    }
}
