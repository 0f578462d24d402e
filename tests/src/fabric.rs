//! A thin wrapper over the real libfabric core (`libfabric.so.1`, loaded
//! with `dlopen`), for the `fabric-peer` helper: `fi_getinfo`, the fabric,
//! domain, AV, CQ, counter, memory region and endpoint objects, and the
//! data path (messages, RMA and atomics) through the ops tables (in C, `fi_send`,
//! `fi_write` and friends are `static inline` wrappers over exactly these
//! calls).
//!
//! Objects close on drop; [`Object::close`] closes explicitly and hands the
//! object back when the provider refuses (`-FI_EBUSY`). Posting operations
//! take raw buffers and are `unsafe`: libfabric reads or writes them until
//! the operation's completion, which no Rust lifetime can express here.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use unimem_fi::base::ffi;

/// `FI_ADDR_UNSPEC`: any source.
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub use unimem_fi::base::ffi::FI_ADDR_NOTAVAIL;

/// Negated libfabric error codes, as the calls return them.
pub mod rc {
    use unimem_fi::base::ffi;
    pub const EAGAIN: i32 = -ffi::FI_EAGAIN;
    pub const EAVAIL: i32 = -(ffi::FI_EAVAIL as i32);
    pub const EINVAL: i32 = -ffi::FI_EINVAL;
    pub const EBUSY: i32 = -ffi::FI_EBUSY;
    pub const ENODATA: i32 = -ffi::FI_ENODATA;
    pub const ENOENT: i32 = -ffi::FI_ENOENT;
    pub const EMSGSIZE: i32 = -ffi::FI_EMSGSIZE;
    pub const EOPBADSTATE: i32 = -(ffi::FI_EOPBADSTATE as i32);
    pub const ENOKEY: i32 = -(ffi::FI_ENOKEY as i32);
}

type GetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const ffi::fi_info,
    *mut *mut ffi::fi_info,
) -> c_int;
type DupinfoFn = unsafe extern "C" fn(*const ffi::fi_info) -> *mut ffi::fi_info;
type FreeinfoFn = unsafe extern "C" fn(*mut ffi::fi_info);
type FabricFn =
    unsafe extern "C" fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;
type VersionFn = unsafe extern "C" fn() -> u32;
type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The core functions an application links against.
pub struct Api {
    getinfo: GetinfoFn,
    dupinfo: DupinfoFn,
    freeinfo: FreeinfoFn,
    fabric: FabricFn,
    strerror: StrerrorFn,
    pub version: u32,
}

/// The core, loaded once per process (`RTLD_LOCAL`, like a private copy).
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    // SAFETY: plain dlopen of a C string literal.
    let h = unsafe {
        libc::dlopen(
            c"libfabric.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if h.is_null() {
        return Err("libfabric.so.1 is not loadable (apt-get install libfabric1)".into());
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c = CString::new(name).expect("no NUL in symbol names");
        // SAFETY: h is a live handle; c a valid C string.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        if p.is_null() {
            Err(format!("libfabric.so.1 has no {name}"))
        } else {
            Ok(p)
        }
    };
    // SAFETY: these are libfabric's functions (the default symbol versions)
    // with exactly these prototypes (rdma/fabric.h, rdma/fi_errno.h).
    unsafe {
        let version = std::mem::transmute::<*mut c_void, VersionFn>(sym("fi_version")?);
        Ok(Api {
            getinfo: std::mem::transmute::<*mut c_void, GetinfoFn>(sym("fi_getinfo")?),
            dupinfo: std::mem::transmute::<*mut c_void, DupinfoFn>(sym("fi_dupinfo")?),
            freeinfo: std::mem::transmute::<*mut c_void, FreeinfoFn>(sym("fi_freeinfo")?),
            fabric: std::mem::transmute::<*mut c_void, FabricFn>(sym("fi_fabric")?),
            strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(sym("fi_strerror")?),
            version: version(),
        })
    }
}

impl Api {
    /// `fi_strerror` of a (negated or not) return code.
    pub fn strerror(&self, code: isize) -> String {
        let code = code.unsigned_abs().min(c_int::MAX as usize) as c_int;
        // SAFETY: fi_strerror returns a static C string for any code.
        unsafe { CStr::from_ptr((self.strerror)(code)) }
            .to_string_lossy()
            .into_owned()
    }
}

/// What `fi_getinfo` is asked for.
#[derive(Clone, Debug)]
pub struct Hints {
    pub caps: u64,
    pub ep_type: ffi::fi_ep_type,
    pub prov_name: Option<String>,
    /// `tx_attr.op_flags`: the endpoint's default send flags.
    pub tx_op_flags: u64,
    /// `domain_attr.data_progress` and `control_progress` (UNSPEC: none).
    pub progress: ffi::fi_progress,
    /// `domain_attr.threading` (UNSPEC: none).
    pub threading: ffi::fi_threading,
}

impl Default for Hints {
    /// The unimem RDM endpoint with everything the fabric tests use.
    fn default() -> Self {
        Hints {
            caps: ffi::FI_MSG
                | ffi::FI_TAGGED
                | ffi::FI_SOURCE
                | ffi::FI_DIRECTED_RECV
                | ffi::FI_MULTI_RECV
                | ffi::FI_RMA
                | ffi::FI_ATOMIC,
            ep_type: ffi::FI_EP_RDM,
            prov_name: Some("unimem".into()),
            tx_op_flags: 0,
            progress: ffi::FI_PROGRESS_UNSPEC,
            threading: ffi::FI_THREAD_UNSPEC,
        }
    }
}

/// A list of `fi_info` from `fi_getinfo`; freed on drop.
pub struct Info {
    api: &'static Api,
    ptr: *mut ffi::fi_info,
}

impl Info {
    /// `fi_getinfo(version, NULL, NULL, 0, hints)`, or its negative code.
    pub fn get(api: &'static Api, hints: &Hints) -> Result<Info, i32> {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo(): every attribute
        // struct allocated and zeroed; the strdup'ed name is freed by
        // fi_freeinfo; every pointer passed is live.
        unsafe {
            let h = (api.dupinfo)(null());
            assert!(!h.is_null(), "fi_allocinfo failed");
            (*h).caps = hints.caps;
            (*(*h).ep_attr).type_ = hints.ep_type;
            (*(*h).tx_attr).op_flags = hints.tx_op_flags;
            (*(*h).domain_attr).data_progress = hints.progress;
            (*(*h).domain_attr).control_progress = hints.progress;
            (*(*h).domain_attr).threading = hints.threading;
            if let Some(name) = &hints.prov_name {
                let c = CString::new(name.as_str()).expect("no NUL in provider names");
                (*(*h).fabric_attr).prov_name = libc::strdup(c.as_ptr());
            }
            let mut info = null_mut();
            let rc = (api.getinfo)(api.version, null(), null(), 0, h, &mut info);
            (api.freeinfo)(h);
            if rc == 0 {
                Ok(Info { api, ptr: info })
            } else {
                Err(rc)
            }
        }
    }

    fn first(&self) -> &ffi::fi_info {
        // SAFETY: a successful fi_getinfo returns at least one entry, alive
        // until fi_freeinfo in drop.
        unsafe { &*self.ptr }
    }

    pub fn caps(&self) -> u64 {
        self.first().caps
    }

    pub fn inject_size(&self) -> usize {
        // SAFETY: tx_attr of an fi_getinfo answer is allocated.
        unsafe { (*self.first().tx_attr).inject_size }
    }

    pub fn max_msg_size(&self) -> usize {
        // SAFETY: ep_attr of an fi_getinfo answer is allocated.
        unsafe { (*self.first().ep_attr).max_msg_size }
    }

    pub fn prov_name(&self) -> String {
        // SAFETY: fabric_attr and its prov_name are set in an answer.
        unsafe { CStr::from_ptr((*self.first().fabric_attr).prov_name) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: ptr came from fi_getinfo and is freed once.
        unsafe { (self.api.freeinfo)(self.ptr) }
    }
}

/// A libfabric object: anything that starts with a `struct fid`.
pub trait Object: Sized {
    fn fid(&self) -> *mut ffi::fid;

    /// `fi_close`. On failure the object stays open and is handed back.
    fn close(self) -> Result<(), (Self, i32)> {
        // SAFETY: fid() is a live object we opened and have not closed.
        let rc = unsafe { raw_close(self.fid()) };
        if rc == 0 {
            std::mem::forget(self);
            Ok(())
        } else {
            Err((self, rc))
        }
    }
}

/// `fi_close`.
///
/// # Safety
/// `fid` must be a live object; on success it is gone.
unsafe fn raw_close(fid: *mut ffi::fid) -> c_int {
    // SAFETY: guaranteed by the caller; every object has fi_ops.close.
    unsafe { ((*(*fid).ops).close.expect("fi_ops.close"))(fid) }
}

/// Declares an owned handle of a libfabric object type, closed on drop.
macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $c:ty) => {
        $(#[$doc])*
        pub struct $name {
            ptr: *mut $c,
        }

        impl Object for $name {
            fn fid(&self) -> *mut ffi::fid {
                self.ptr.cast()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: ptr is live (close() forgets a closed handle).
                let rc = unsafe { raw_close(self.fid()) };
                if rc != 0 {
                    eprintln!("fi_close({}) on drop: {rc}", stringify!($name));
                }
            }
        }
    };
}

handle!(
    /// `struct fid_fabric`.
    Fabric,
    ffi::fid_fabric
);
handle!(
    /// `struct fid_domain`.
    Domain,
    ffi::fid_domain
);
handle!(
    /// `struct fid_av`.
    Av,
    ffi::fid_av
);
handle!(
    /// `struct fid_cq`.
    Cq,
    ffi::fid_cq
);
handle!(
    /// `struct fid_ep`.
    Ep,
    ffi::fid_ep
);
handle!(
    /// `struct fid_cntr`.
    Cntr,
    ffi::fid_cntr
);
handle!(
    /// `struct fid_mr`.
    Mr,
    ffi::fid_mr
);

fn check(rc: c_int) -> Result<(), i32> {
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}

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
}

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

/// Matching information of a send: tag (tagged interface) and remote CQ
/// data (`fi_senddata` and friends).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Match {
    pub tag: Option<u64>,
    pub data: Option<u64>,
}

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

/// What a receive accepts from the tagged interface: `(tag, ignore)`, or
/// `None` for the untagged one.
pub type TagMatch = Option<(u64, u64)>;

impl Ep {
    fn get(&self) -> &ffi::fid_ep {
        // SAFETY: the endpoint is live.
        unsafe { &*self.ptr }
    }

    fn msg(&self) -> &ffi::fi_ops_msg {
        // SAFETY: a live endpoint has its message ops table.
        unsafe { &*self.get().msg }
    }

    fn tagged(&self) -> &ffi::fi_ops_tagged {
        // SAFETY: a live endpoint has its tagged ops table.
        unsafe { &*self.get().tagged }
    }

    fn ops(&self) -> &ffi::fi_ops_ep {
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

/// Where an atomic operation goes and what it does: the peer's `fi_addr`,
/// the range under `key` at `addr` (an offset into the region), and
/// libfabric's `enum fi_datatype` and `enum fi_op`.
#[derive(Clone, Copy, Debug)]
pub struct AtomicTarget {
    pub peer: u64,
    pub addr: u64,
    pub key: u64,
    pub datatype: u32,
    pub op: u32,
}

/// Which entry point of its family an atomic is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicForm {
    /// `fi_atomic`, `fi_fetch_atomic`, `fi_compare_atomic`.
    Plain,
    /// `fi_atomicv` and kin: the local buffers in three pieces.
    Vector,
    /// `fi_atomicmsg` and kin with these flags: the local buffers in three
    /// pieces, the target range in `rma_iovs` entries (1 is what the
    /// provider supports).
    Msg { flags: u64, rma_iovs: usize },
    /// `fi_inject_atomic` (`fi_atomic` family only).
    Inject,
}

/// The local buffers of an atomic: `count` elements of `size` bytes each
/// at `operand`, `compare` (compare family) and `result` (fetch and
/// compare families); NULL where the family has none.
#[derive(Clone, Copy, Debug)]
pub struct AtomicBufs {
    pub operand: *const u8,
    pub compare: *const u8,
    pub result: *mut u8,
    pub count: usize,
    pub size: usize,
}

/// Three consecutive pieces (first element, elements) covering `count`
/// elements (some empty when `count` < 3).
fn element_pieces(count: usize) -> [(usize, usize); 3] {
    let cuts = [0, count / 3, 2 * count / 3, count];
    [0, 1, 2].map(|i| (cuts[i], cuts[i + 1] - cuts[i]))
}

/// `buf` (elements of `size` bytes) as three `fi_ioc` pieces (NULL
/// `buf`: every piece NULL).
fn iocs(buf: *const u8, count: usize, size: usize) -> Vec<ffi::fi_ioc> {
    element_pieces(count)
        .iter()
        .map(|&(first, n)| ffi::fi_ioc {
            addr: if buf.is_null() {
                null_mut()
            } else {
                buf.wrapping_add(first * size) as *mut c_void
            },
            count: n,
        })
        .collect()
}

/// The family of an atomic call (`*valid`: which query).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicFamily {
    /// `fi_atomic` and kin (`fi_atomicvalid`).
    Write,
    /// `fi_fetch_atomic` and kin (`fi_fetch_atomicvalid`).
    Fetch,
    /// `fi_compare_atomic` and kin (`fi_compare_atomicvalid`).
    Compare,
}

impl Ep {
    fn atomic_ops(&self) -> &ffi::fi_ops_atomic {
        // SAFETY: a live endpoint has its atomic ops table.
        unsafe { &*self.get().atomic }
    }

    /// An atomic operation of `family` with `form` on `t`.
    ///
    /// # Safety
    /// The operand and compare buffers must be readable during the call,
    /// the result buffer writable until the operation completes, each for
    /// `b.count` elements of `b.size` bytes (the provider may also refuse
    /// without touching them).
    pub unsafe fn atomic(
        &self,
        family: AtomicFamily,
        form: AtomicForm,
        b: AtomicBufs,
        t: AtomicTarget,
        context: usize,
    ) -> isize {
        let (ep, ctx, ops) = (self.ptr, context as *mut c_void, self.atomic_ops());
        let (dt, op) = (t.datatype, t.op);
        let operand = iocs(b.operand, b.count, b.size);
        let compare = iocs(b.compare, b.count, b.size);
        let result = iocs(b.result, b.count, b.size);
        let (buf, cmp, res) = (
            b.operand.cast::<c_void>(),
            b.compare.cast(),
            b.result.cast(),
        );
        let (peer, addr, key, n) = (t.peer, t.addr, t.key, b.count);
        let null = null_mut();
        // SAFETY (every arm): the endpoint is live; the ioc arrays, the
        // target ranges and the message are live locals (the provider
        // copies them); the buffers are the caller's business.
        match (family, form) {
            // SAFETY: see above.
            (AtomicFamily::Write, AtomicForm::Plain) => unsafe {
                ops.write.expect("write")(ep, buf, n, null, peer, addr, key, dt, op, ctx)
            },
            // SAFETY: see above.
            (AtomicFamily::Write, AtomicForm::Inject) => unsafe {
                ops.inject.expect("inject")(ep, buf, n, peer, addr, key, dt, op)
            },
            // SAFETY: see above.
            (AtomicFamily::Write, AtomicForm::Vector) => unsafe {
                ops.writev.expect("writev")(
                    ep,
                    operand.as_ptr(),
                    null_mut(),
                    operand.len(),
                    peer,
                    addr,
                    key,
                    dt,
                    op,
                    ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Fetch, AtomicForm::Plain) => unsafe {
                ops.readwrite.expect("readwrite")(
                    ep, buf, n, null, res, null, peer, addr, key, dt, op, ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Fetch, AtomicForm::Vector) => unsafe {
                ops.readwritev.expect("readwritev")(
                    ep,
                    operand.as_ptr(),
                    null_mut(),
                    operand.len(),
                    result.as_ptr().cast_mut(),
                    null_mut(),
                    result.len(),
                    peer,
                    addr,
                    key,
                    dt,
                    op,
                    ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Compare, AtomicForm::Plain) => unsafe {
                ops.compwrite.expect("compwrite")(
                    ep, buf, n, null, cmp, null, res, null, peer, addr, key, dt, op, ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Compare, AtomicForm::Vector) => unsafe {
                ops.compwritev.expect("compwritev")(
                    ep,
                    operand.as_ptr(),
                    null_mut(),
                    operand.len(),
                    compare.as_ptr(),
                    null_mut(),
                    compare.len(),
                    result.as_ptr().cast_mut(),
                    null_mut(),
                    result.len(),
                    peer,
                    addr,
                    key,
                    dt,
                    op,
                    ctx,
                )
            },
            (_, AtomicForm::Inject) => rc::EINVAL as isize,
            (family, AtomicForm::Msg { flags, rma_iovs }) => {
                let ranges: Vec<ffi::fi_rma_ioc> = (0..rma_iovs.max(1))
                    .map(|i| ffi::fi_rma_ioc {
                        addr: addr + (i * b.size) as u64,
                        count: if i == 0 { n } else { 0 },
                        key,
                    })
                    .collect();
                let msg = ffi::fi_msg_atomic {
                    msg_iov: operand.as_ptr(),
                    desc: null_mut(),
                    iov_count: operand.len(),
                    addr: peer,
                    rma_iov: ranges.as_ptr(),
                    rma_iov_count: rma_iovs,
                    datatype: dt,
                    op,
                    context: ctx,
                    data: 0,
                };
                match family {
                    // SAFETY: see above.
                    AtomicFamily::Write => unsafe {
                        ops.writemsg.expect("writemsg")(ep, &msg, flags)
                    },
                    // SAFETY: see above.
                    AtomicFamily::Fetch => unsafe {
                        ops.readwritemsg.expect("readwritemsg")(
                            ep,
                            &msg,
                            result.as_ptr().cast_mut(),
                            null_mut(),
                            result.len(),
                            flags,
                        )
                    },
                    // SAFETY: see above.
                    AtomicFamily::Compare => unsafe {
                        ops.compwritemsg.expect("compwritemsg")(
                            ep,
                            &msg,
                            compare.as_ptr(),
                            null_mut(),
                            compare.len(),
                            result.as_ptr().cast_mut(),
                            null_mut(),
                            result.len(),
                            flags,
                        )
                    },
                }
            }
        }
    }

    /// `fi_atomicvalid`, `fi_fetch_atomicvalid` or `fi_compare_atomicvalid`
    /// of `op` on `datatype`: `(rc, count)`.
    pub fn atomic_valid(&self, family: AtomicFamily, datatype: u32, op: u32) -> (i32, usize) {
        let ops = self.atomic_ops();
        let query = match family {
            AtomicFamily::Write => ops.writevalid,
            AtomicFamily::Fetch => ops.readwritevalid,
            AtomicFamily::Compare => ops.compwritevalid,
        };
        let mut count = 0usize;
        // SAFETY: the endpoint is live; count is a live local.
        let rc = unsafe { query.expect("*valid")(self.ptr, datatype, op, &mut count) };
        (rc, count)
    }
}
