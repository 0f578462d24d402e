//! The fabric, the domain and the objects a domain opens besides endpoints
//! and CQs: counters, memory regions, the address vector.

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use unimem_fi_sys as ffi;

use super::{check, rc, Av, Cntr, Cq, Domain, Ep, Fabric, Info, Mr, Object, FI_ADDR_NOTAVAIL};

impl Fabric {
    /// `fi_fabric` for the first entry of `info`.
    pub fn open(info: &Info) -> Result<Fabric, i32> {
        let mut ptr = null_mut();
        // SAFETY: fabric_attr of a live fi_info; ptr is a live local.
        check(unsafe { (info.api.fabric)(info.first().fabric_attr, &mut ptr, null_mut()) })?;
        Ok(Fabric { ptr })
    }

    /// `fi_domain`.
    pub fn domain(&self, info: &Info) -> Result<Domain, i32> {
        let mut ptr = null_mut();
        // SAFETY: self is live, every fid_fabric has ops.domain; info is live.
        check(unsafe {
            ((*(*self.ptr).ops).domain.expect("fi_ops_fabric.domain"))(
                self.ptr,
                info.ptr,
                &mut ptr,
                null_mut(),
            )
        })?;
        Ok(Domain { ptr })
    }
}

impl Domain {
    fn ops(&self) -> &ffi::fi_ops_domain {
        // SAFETY: a live domain has its ops table.
        unsafe { &*(*self.ptr).ops }
    }

    /// `fi_av_open`: an `FI_AV_TABLE` AV.
    pub fn av(&self) -> Result<Av, i32> {
        let mut attr = ffi::fi_av_attr {
            type_: ffi::FI_AV_TABLE,
            ..Default::default()
        };
        let mut ptr = null_mut();
        // SAFETY: self is live; attr and ptr are live locals.
        check(unsafe {
            self.ops().av_open.expect("av_open")(self.ptr, &mut attr, &mut ptr, null_mut())
        })?;
        Ok(Av { ptr })
    }

    /// `fi_cq_open`: a CQ of `FI_CQ_FORMAT_TAGGED` entries, no wait object.
    pub fn cq(&self) -> Result<Cq, i32> {
        self.cq_waiting_on(ffi::FI_WAIT_NONE)
    }

    /// `fi_cq_open`: a CQ of `FI_CQ_FORMAT_TAGGED` entries with `wait_obj`.
    pub fn cq_waiting_on(&self, wait_obj: ffi::fi_wait_obj) -> Result<Cq, i32> {
        let mut attr = ffi::fi_cq_attr {
            format: ffi::FI_CQ_FORMAT_TAGGED,
            wait_obj,
            ..Default::default()
        };
        let mut ptr = null_mut();
        // SAFETY: self is live; attr and ptr are live locals.
        check(unsafe {
            self.ops().cq_open.expect("cq_open")(self.ptr, &mut attr, &mut ptr, null_mut())
        })?;
        Ok(Cq { ptr })
    }

    /// `fi_cntr_open`: a counter of completions, no wait object.
    pub fn cntr(&self) -> Result<Cntr, i32> {
        self.cntr_waiting_on(ffi::FI_WAIT_NONE)
    }

    /// `fi_cntr_open`: a counter of completions with `wait_obj`.
    pub fn cntr_waiting_on(&self, wait_obj: ffi::fi_wait_obj) -> Result<Cntr, i32> {
        let mut attr = ffi::fi_cntr_attr {
            events: ffi::FI_CNTR_EVENTS_COMP,
            wait_obj,
            ..Default::default()
        };
        let mut ptr = null_mut();
        // SAFETY: self is live; attr and ptr are live locals.
        check(unsafe {
            self.ops().cntr_open.expect("cntr_open")(self.ptr, &mut attr, &mut ptr, null_mut())
        })?;
        Ok(Cntr { ptr })
    }

    /// `fi_mr_reg` of `len` bytes at `buf` with `access` and
    /// `requested_key` (offset 0, no flags).
    ///
    /// # Safety
    /// The `len` bytes at `buf` must stay valid until the region closes
    /// (peers may read and write them while it is open).
    pub unsafe fn mr_reg(
        &self,
        buf: *mut u8,
        len: usize,
        access: u64,
        requested_key: u64,
    ) -> Result<Mr, i32> {
        let mut ptr = null_mut();
        // SAFETY: self is live and has its MR ops table; ptr is a live
        // local; buf is the caller's business.
        check(unsafe {
            ((*(*self.ptr).mr).reg.expect("fi_ops_mr.reg"))(
                self.fid(),
                buf as *const c_void,
                len,
                access,
                0,
                requested_key,
                0,
                &mut ptr,
                null_mut(),
            )
        })?;
        Ok(Mr { ptr })
    }

    /// `fi_query_atomic` of `op` on `datatype` with `flags` (0,
    /// `FI_FETCH_ATOMIC` or `FI_COMPARE_ATOMIC`): `(rc, count, size)`.
    pub fn query_atomic(&self, datatype: u32, op: u32, flags: u64) -> (i32, usize, usize) {
        let mut attr = ffi::fi_atomic_attr { count: 0, size: 0 };
        // SAFETY: self is live; attr is a live local.
        let rc = unsafe {
            self.ops().query_atomic.expect("query_atomic")(self.ptr, datatype, op, &mut attr, flags)
        };
        (rc, attr.count, attr.size)
    }

    /// `fi_endpoint` for the first entry of `info`.
    pub fn endpoint(&self, info: &Info) -> Result<Ep, i32> {
        let mut ptr = null_mut();
        // SAFETY: self and info are live; ptr is a live local.
        check(unsafe {
            self.ops().endpoint.expect("endpoint")(self.ptr, info.ptr, &mut ptr, null_mut())
        })?;
        Ok(Ep { ptr })
    }
}

impl Cntr {
    fn ops(&self) -> &ffi::fi_ops_cntr {
        // SAFETY: a live counter has its ops table.
        unsafe { &*(*self.ptr).ops }
    }

    /// `fi_cntr_read` (which also progresses the domain's endpoints).
    pub fn read(&self) -> u64 {
        // SAFETY: the counter is live.
        unsafe { self.ops().read.expect("fi_ops_cntr.read")(self.ptr) }
    }

    /// `fi_cntr_readerr`.
    pub fn read_err(&self) -> u64 {
        // SAFETY: the counter is live.
        unsafe { self.ops().readerr.expect("fi_ops_cntr.readerr")(self.ptr) }
    }

    /// `fi_cntr_wait` for `threshold`, `timeout_ms` at most (< 0: forever):
    /// its return code.
    pub fn wait(&self, threshold: u64, timeout_ms: i32) -> i32 {
        // SAFETY: the counter is live.
        unsafe { self.ops().wait.expect("fi_ops_cntr.wait")(self.ptr, threshold, timeout_ms) }
    }
}

impl Mr {
    /// `fi_mr_bind` of a counter (`FI_REMOTE_READ`, `FI_REMOTE_WRITE`).
    pub fn bind(&self, cntr: &Cntr, flags: u64) -> Result<(), i32> {
        let fid = self.fid();
        // SAFETY: both objects are live.
        check(unsafe { ((*(*fid).ops).bind.expect("fi_ops.bind"))(fid, cntr.fid(), flags) })
    }

    /// `fi_mr_key`: the key peers name the region with.
    pub fn key(&self) -> u64 {
        // SAFETY: the region is live.
        unsafe { (*self.ptr).key }
    }
}

impl Av {
    /// `fi_av_insert` of one `FI_ADDR_STR` address.
    pub fn insert(&self, addr: &str) -> Result<u64, i32> {
        let c = CString::new(addr).map_err(|_| rc::EINVAL)?;
        let mut fi_addr = FI_ADDR_NOTAVAIL;
        // SAFETY: self is live; c is one NUL-terminated address; fi_addr
        // has room for one result.
        let n = unsafe {
            ((*(*self.ptr).ops).insert.expect("fi_ops_av.insert"))(
                self.ptr,
                c.as_ptr().cast(),
                1,
                &mut fi_addr,
                0,
                null_mut(),
            )
        };
        match n {
            1 => Ok(fi_addr),
            0 => Err(rc::EINVAL),
            n => Err(n),
        }
    }

    /// `fi_av_remove` of one entry.
    pub fn remove(&self, fi_addr: u64) -> Result<(), i32> {
        let mut one = [fi_addr];
        // SAFETY: self is live; `one` holds the one address passed.
        check(unsafe {
            ((*(*self.ptr).ops).remove.expect("fi_ops_av.remove"))(self.ptr, one.as_mut_ptr(), 1, 0)
        })
    }
}
