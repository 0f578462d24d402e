//! Memory regions (`fi_mr_reg`, `fi_mr_regv`, `fi_mr_regattr`).
//!
//! An MR records its buffers, access and key, and its descriptor lets the
//! endpoint recognise the region a transfer names ([`from_desc`]). A region
//! with remote access (`FI_REMOTE_READ`, `FI_REMOTE_WRITE`) is also
//! *exposed*: its key, range and rights go into the process's key table in
//! shared memory ([`unimem_dma::KeyTable`]), where an initiator resolves
//! and checks them before it moves a byte, with no action of ours. The
//! key is withdrawn when the MR closes. Nothing is pinned: a dmable range
//! is reached by DMA directly, any other through our progress.
//!
//! Which `mr_mode` bits, and why: none is required. Keys: the
//! application's `requested_key` is used as is (any 64-bit value: Open MPI
//! passes pointers), unique per process (the table is the process's, as a
//! Unimem node's engine is): a key in use gives -FI_ENOKEY. With
//! FI_MR_BASIC (API < 1.5) or FI_MR_PROV_KEY in the domain's mr_mode we
//! choose a process-unique key instead. Addresses: an initiator names the
//! target's bytes by offset from the start of the region, unless the domain
//! has FI_MR_VIRT_ADDR (or FI_MR_BASIC), then by virtual address; the
//! region records which, so the initiator needs no agreement. FI_MR_LOCAL
//! and FI_MR_ALLOCATED are not needed: any memory can be registered and
//! local buffers need no descriptor, since the data path looks at the
//! memory itself (dmable or not). A region of several buffers cannot be
//! exposed (remote access names one contiguous range): -FI_ENOSYS.

use std::collections::HashMap;
use std::fmt;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use unimem_dma::{Access, DmaError, Exposure, KeyHandle, KeyTable};
use unimem_mailbox::JobId;
use unimem_proto::AccessCounts;

use crate::base::ffi::{self, Error};
use crate::base::fid::{self, Bind, FiObject, FidObject, ParentRef};
use crate::cntr::{Cntr, CntrInner};
use crate::state::DomainState;

/// Access bits a registration may ask for.
const ACCESS: u64 = ffi::FI_SEND
    | ffi::FI_RECV
    | ffi::FI_READ
    | ffi::FI_WRITE
    | ffi::FI_REMOTE_READ
    | ffi::FI_REMOTE_WRITE;

const V1_5: u32 = ffi::fi_version(1, 5);
const V1_10: u32 = ffi::fi_version(1, 10);

/// Next provider-chosen key (shared by all domains: unique per process).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// Our `struct fid_mr`. Its `mem_desc` is the address of the object.
pub type Mr = FidObject<MrInner>;

/// What a registration recorded.
#[derive(Debug)]
pub struct MrInner {
    domain: ParentRef<DomainState>,
    /// (address, length) of each registered buffer, in order.
    ranges: Vec<(usize, usize)>,
    access: u64,
    offset: u64,
    key: u64,
    /// The key in the process's key table and the rights it grants, for a
    /// region with remote access; withdrawn when the region closes.
    exposed: Option<(KeyHandle, Access)>,
    /// Counters bound with `fi_mr_bind` (`FI_REMOTE_READ`,
    /// `FI_REMOTE_WRITE`): they count remote accesses (`FI_RMA_EVENT`).
    counters: Mutex<Vec<(u64, ParentRef<CntrInner>)>>,
}

/// Exposed regions by key (keys are unique per process): where a remote
/// access reported to an endpoint finds the region's counters.
static EXPOSED: Mutex<Option<HashMap<u64, Weak<MrInner>>>> = Mutex::new(None);

/// An endpoint of `domain` bound a counter of remote accesses: its exposed
/// regions ask initiators to report their one-sided accesses from now on.
pub fn remote_counter_bound(domain: &DomainState, flags: u64) {
    domain.note_remote_counter(flags);
    let regions: Vec<Arc<MrInner>> = EXPOSED
        .lock()
        .as_ref()
        .map(|map| map.values().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    for region in regions {
        if std::ptr::eq(&*region.domain, domain) {
            region.refresh_exposure();
        }
    }
}

/// The notices a region of `domain` asks for, with counters bound to it
/// for `bound` (`FI_REMOTE_READ`, `FI_REMOTE_WRITE`): none without
/// `FI_RMA_EVENT`.
fn notified(domain: &DomainState, bound: u64) -> Access {
    if domain.info.caps & ffi::FI_RMA_EVENT == 0 {
        return Access::empty();
    }
    let counted = bound | domain.remote_accesses_counted();
    let mut notify = Access::empty();
    if counted & ffi::FI_REMOTE_READ != 0 {
        notify = notify.union(Access::NOTIFY_READ);
    }
    if counted & ffi::FI_REMOTE_WRITE != 0 {
        notify = notify.union(Access::NOTIFY_WRITE);
    }
    notify
}

/// Counts a peer's completed access to our region `key` on the counters
/// bound to the region.
pub fn count_remote_access(counts: &AccessCounts) {
    let key = counts.key;
    let region = EXPOSED
        .lock()
        .as_ref()
        .and_then(|map| map.get(&key))
        .and_then(Weak::upgrade);
    let Some(region) = region else {
        return;
    };
    // Each access counts once on a counter bound for both.
    for (flags, cntr) in region.counters.lock().iter() {
        let read = flags & ffi::FI_REMOTE_READ != 0;
        let write = flags & ffi::FI_REMOTE_WRITE != 0;
        let n = match (read, write) {
            (true, true) => counts.all(),
            (true, false) => counts.read(),
            (false, true) => counts.written(),
            (false, false) => 0,
        };
        if n > 0 {
            cntr.add_successes(n);
        }
    }
}

impl MrInner {
    /// Which one-sided accesses to this region must be reported to us:
    /// with `FI_RMA_EVENT`, those a counter would count (one bound to the
    /// region or to an endpoint). Initiators spare the mailbox message of
    /// the others (MPI asks for `FI_RMA_EVENT` and binds no such counter;
    /// OpenSHMEM's counter of its heap counts writes, not gets).
    fn notify(&self) -> Access {
        let bound = self
            .counters
            .lock()
            .iter()
            .fold(0, |all, (flags, _)| all | flags);
        notified(&self.domain, bound)
    }

    /// Brings the exposed rights in line with [`notify`](Self::notify):
    /// initiators see it from their next operation on.
    fn refresh_exposure(&self) {
        if let Some((handle, rights)) = &self.exposed {
            handle.set_access(rights.union(self.notify()));
        }
    }

    /// (address, length) of each registered buffer, in order.
    pub fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges
    }

    /// Whether `[addr, addr + len)` lies inside one registered buffer.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.ranges
            .iter()
            .any(|&(base, size)| addr >= base && end <= base + size)
    }

    pub fn access(&self) -> u64 {
        self.access
    }

    /// The `offset` given at registration (FI_MR_VIRT_ADDR-less RMA).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn key(&self) -> u64 {
        self.key
    }

    /// The domain the region belongs to.
    pub fn domain(&self) -> &DomainState {
        &self.domain
    }
}

// fi_mr_bind takes counters (FI_RMA_EVENT); FI_ENABLE is for
// FI_MR_ENDPOINT and FI_MR_RMA_EVENT, which we never require.
static MR_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    bind: Some(fid::bind::<MrInner>),
    ..fid::fi_ops::<MrInner>()
};

impl Bind for MrInner {
    unsafe fn bind(mr: &Mr, bfid: *mut ffi::fid, flags: u64) -> Result<(), Error> {
        // SAFETY: bfid is NULL or a live fid (libfabric contract).
        let Some(cntr) = (unsafe { Cntr::state_of(bfid) }) else {
            tracing::warn!("fi_mr_bind: only a counter can be bound to a memory region");
            return Err(Error::EINVAL);
        };
        let known = ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE;
        if flags & !known != 0 || flags == 0 {
            tracing::warn!("fi_mr_bind: flags {flags:#x} are not FI_REMOTE_READ/FI_REMOTE_WRITE");
            return Err(Error::EBADFLAGS);
        }
        mr.inner
            .counters
            .lock()
            .push((flags, ParentRef::new(&cntr)));
        mr.inner.refresh_exposure();
        Ok(())
    }
}

// SAFETY: fid_mr starts with its struct fid.
unsafe impl FiObject for MrInner {
    type Fid = ffi::fid_mr;
    const CLASS: u32 = ffi::FI_CLASS_MR;
    const KIND: &'static str = "memory region";
    const FI_OPS: &'static ffi::fi_ops = &MR_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(mr: &Mr) -> Result<(), Error> {
        if let Some(map) = EXPOSED.lock().as_mut() {
            if map
                .get(&mr.inner.key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&mr.inner)))
            {
                map.remove(&mr.inner.key);
            }
        }
        // Releases its counters.
        mr.inner.counters.lock().clear();
        // Dropping it releases the domain.
        tracing::debug!("mr {mr:p} closed");
        Ok(())
    }
}

/// One registration request, whichever call it came from.
pub struct Request<'a> {
    pub iov: &'a [ffi::iovec],
    pub access: u64,
    pub offset: u64,
    pub requested_key: u64,
    pub flags: u64,
    pub context: *mut c_void,
}

/// Register `req` in `domain`; `op` names the call in warnings.
///
/// # Safety
/// `mr` must be NULL or writable.
pub unsafe fn register(
    domain: &Arc<DomainState>,
    req: &Request<'_>,
    mr: *mut *mut ffi::fid_mr,
    op: &str,
) -> Result<(), Error> {
    if mr.is_null() {
        tracing::warn!("{op}: NULL mr pointer");
        return Err(Error::EINVAL);
    }
    let limit = domain.info.domain.mr_iov_limit;
    if req.iov.is_empty() || req.iov.len() > limit {
        tracing::warn!(
            "{op}: {} buffers (1 to mr_iov_limit = {limit} allowed)",
            req.iov.len()
        );
        return Err(Error::EINVAL);
    }
    let mut ranges = Vec::with_capacity(req.iov.len());
    for (i, v) in req.iov.iter().enumerate() {
        let base = v.iov_base as usize;
        if (base == 0 && v.iov_len > 0) || base.checked_add(v.iov_len).is_none() {
            tracing::warn!(
                "{op}: buffer {i} ({:p}, {} bytes) is invalid",
                v.iov_base,
                v.iov_len
            );
            return Err(Error::EINVAL);
        }
        ranges.push((base, v.iov_len));
    }
    let unknown = req.access & !ACCESS;
    if unknown != 0 {
        tracing::warn!("{op}: unknown access bits {unknown:#x}");
        return Err(Error::EINVAL);
    }
    if req.flags != 0 {
        tracing::warn!("{op}: unsupported flags {:#x}", req.flags);
        return Err(Error::EBADFLAGS);
    }
    let mode = domain.info.domain.mr_mode as u64;
    let basic = u64::from(ffi::FI_MR_BASIC);
    let key = if mode & (ffi::FI_MR_PROV_KEY | basic) != 0 {
        NEXT_KEY.fetch_add(1, Ordering::Relaxed)
    } else {
        req.requested_key
    };
    let exposed = expose(
        domain,
        &ranges,
        req.access,
        key,
        mode & (ffi::FI_MR_VIRT_ADDR | basic) != 0,
        op,
    )?;
    let obj = Box::new(Mr {
        fid: ffi::fid_mr {
            fid: Mr::header(req.context),
            mem_desc: ptr::null_mut(),
            key,
        },
        inner: Arc::new(MrInner {
            domain: ParentRef::new(domain),
            ranges,
            access: req.access,
            offset: req.offset,
            key,
            exposed,
            counters: Mutex::new(Vec::new()),
        }),
    });
    // SAFETY: mr is writable (checked); obj is the live object just made,
    // not yet used by anyone else.
    let obj = unsafe {
        let obj = obj.install(mr);
        (*obj).fid.mem_desc = obj as *mut c_void;
        obj
    };
    // SAFETY: obj is the live object just installed.
    let inner = unsafe { &(*obj).inner };
    if inner.exposed.is_some() {
        EXPOSED
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert(key, Arc::downgrade(inner));
    }
    tracing::debug!(
        "mr {obj:p} registered: key {key:#x}, access {:#x}",
        req.access
    );
    Ok(())
}

/// Puts `key` in the process's key table if the region has remote access.
fn expose(
    domain: &DomainState,
    ranges: &[(usize, usize)],
    access: u64,
    key: u64,
    virtual_address: bool,
    op: &str,
) -> Result<Option<(KeyHandle, Access)>, Error> {
    let mut rights = Access::empty();
    if access & ffi::FI_REMOTE_READ != 0 {
        rights = rights.union(Access::REMOTE_READ);
    }
    if access & ffi::FI_REMOTE_WRITE != 0 {
        rights = rights.union(Access::REMOTE_WRITE);
    }
    if rights == Access::empty() {
        return Ok(None);
    }
    if virtual_address {
        rights = rights.union(Access::VIRTUAL_ADDRESS);
    }
    let &[(addr, len)] = ranges else {
        tracing::warn!(
            "{op}: remote access to a region of {} buffers is not supported",
            ranges.len()
        );
        return Err(Error::ENOSYS);
    };
    // FI_RMA_EVENT with an endpoint's counter of remote accesses:
    // initiators tell us of those one-sided accesses (see MrInner::notify).
    let notify = notified(domain, 0);
    let exposure = Exposure {
        addr: addr as u64,
        len: len as u64,
        access: rights.union(notify),
    };
    let table = KeyTable::for_process(JobId::from_name(&domain.config().job));
    match table.and_then(|t| t.expose(key, exposure)) {
        Ok(handle) => {
            // The heap retires the pages of exposed small blocks when they
            // are freed (peers may hold registrations of them).
            unimem_dma::heap_abi::exposed(addr, len);
            Ok(Some((handle, rights)))
        }
        Err(DmaError::KeyInUse) => {
            tracing::warn!("{op}: key {key:#x} is already in use in this process");
            Err(Error::ENOKEY)
        }
        Err(e) => {
            tracing::warn!("{op}: cannot expose the region for remote access: {e}");
            Err(Error::ENOMEM)
        }
    }
}

/// `fi_mr_regattr`: the `fi_mr_attr` fields the application's API version
/// defines, nothing beyond.
///
/// # Safety
/// `attr` must be NULL or a valid `fi_mr_attr` of API `domain.api_version`;
/// its `mr_iov` valid for `iov_count` entries; `mr` NULL or writable.
pub unsafe fn register_attr(
    domain: &Arc<DomainState>,
    attr: *const ffi::fi_mr_attr,
    flags: u64,
    mr: *mut *mut ffi::fid_mr,
) -> Result<(), Error> {
    // SAFETY: non-NULL attr is valid (caller).
    let Some(a) = (unsafe { attr.as_ref() }) else {
        tracing::warn!("fi_mr_regattr: NULL attr");
        return Err(Error::EINVAL);
    };
    let api = domain.api_version;
    if !ffi::fi_version_lt(api, V1_5) && a.auth_key_size != 0 {
        tracing::warn!("fi_mr_regattr: authorization keys are not supported");
        return Err(Error::ENOSYS);
    }
    if !ffi::fi_version_lt(api, V1_10) && a.iface != ffi::FI_HMEM_SYSTEM {
        tracing::warn!(
            "fi_mr_regattr: device memory (iface {}) is not supported",
            a.iface
        );
        return Err(Error::ENOSYS);
    }
    // SAFETY: mr_iov holds iov_count entries (caller).
    let Some(iov) = (unsafe { iov_slice(a.mr_iov, a.iov_count) }) else {
        tracing::warn!("fi_mr_regattr: NULL mr_iov");
        return Err(Error::EINVAL);
    };
    let req = Request {
        iov,
        access: a.access,
        offset: a.offset,
        requested_key: a.requested_key,
        flags,
        context: a.context,
    };
    // SAFETY: mr as the caller promised.
    unsafe { register(domain, &req, mr, "fi_mr_regattr") }
}

/// `iov[..count]`, or None for a NULL array with a count.
///
/// # Safety
/// `iov` must be NULL or valid for `count` entries for `'a`.
pub unsafe fn iov_slice<'a>(iov: *const ffi::iovec, count: usize) -> Option<&'a [ffi::iovec]> {
    if count == 0 {
        return Some(&[]);
    }
    // SAFETY: non-NULL iov holds count entries (caller).
    (!iov.is_null()).then(|| unsafe { std::slice::from_raw_parts(iov, count) })
}

/// The region behind a descriptor from `fi_mr_desc` (as passed to a data
/// transfer), or None for NULL or anything that is not one of our MRs.
///
/// # Safety
/// `desc` must be NULL or a descriptor of a live MR (of any provider);
/// the region must stay registered for `'a`.
pub unsafe fn from_desc<'a>(desc: *mut c_void) -> Option<&'a MrInner> {
    // SAFETY: a descriptor of ours is the address of our Mr (its fid
    // first); it stays registered for 'a (caller).
    unsafe { Mr::find(desc as *const ffi::fid) }.map(|mr| &*mr.inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ffi::ret;
    use crate::cq::tests::{close, fabric_domain};

    /// # Safety
    /// `dom` must be a live domain of ours.
    unsafe fn reg(
        dom: *mut ffi::fid_domain,
        buf: &mut [u8],
        access: u64,
        key: u64,
    ) -> Result<*mut ffi::fid_mr, Error> {
        let mut mr: *mut ffi::fid_mr = ptr::null_mut();
        // SAFETY: dom is live (caller); buf and mr are live locals.
        let rc = unsafe {
            ((*(*dom).mr).reg.unwrap())(
                dom as *mut ffi::fid,
                buf.as_ptr() as *const c_void,
                buf.len(),
                access,
                0,
                key,
                0,
                &mut mr,
                7 as *mut c_void,
            )
        };
        crate::base::result_of(rc).map(|()| mr)
    }

    #[test]
    fn reg_desc_key_close() {
        let (fab, dom) = fabric_domain();
        let mut buf = vec![0u8; 4096];
        // SAFETY: live objects of ours.
        unsafe {
            let mr = reg(dom, &mut buf, ffi::FI_SEND | ffi::FI_RECV, 0xc0de).unwrap();
            assert_eq!((*mr).key, 0xc0de, "requested key kept (mr_mode 0)");
            assert_eq!((*mr).fid.context as usize, 7);
            let desc = (*mr).mem_desc;
            let inner = from_desc(desc).unwrap();
            assert_eq!(inner.ranges(), &[(buf.as_ptr() as usize, 4096)]);
            assert!(inner.contains(buf.as_ptr() as usize + 100, 100));
            assert!(!inner.contains(buf.as_ptr() as usize + 4000, 100));
            assert!(!inner.contains(usize::MAX, 2));
            assert_eq!(inner.access(), ffi::FI_SEND | ffi::FI_RECV);
            assert!(from_desc(ptr::null_mut()).is_none());
            assert!(from_desc(dom as *mut c_void).is_none());
            assert!(Mr::state_of(mr as *const ffi::fid).is_some());

            assert_eq!(reg(dom, &mut buf, 1 << 62, 0).err(), Some(Error::EINVAL));
            assert_eq!(close(dom as *mut ffi::fid), ret::EBUSY);
            assert_eq!(close(mr as *mut ffi::fid), 0);
            assert_eq!(fid::close::<MrInner>(ptr::null_mut()), ret::EINVAL);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn regv_and_regattr_limits() {
        let (fab, dom) = fabric_domain();
        let mut buf = vec![0u8; 8192];
        let iov: Vec<ffi::iovec> = (0..9)
            .map(|i| ffi::iovec {
                iov_base: buf[i * 512..].as_mut_ptr() as *mut c_void,
                iov_len: 512,
            })
            .collect();
        // SAFETY: live objects of ours; iov entries point into buf.
        unsafe {
            let ops = &*(*dom).mr;
            let regv = ops.regv.unwrap();
            let mut mr: *mut ffi::fid_mr = ptr::null_mut();
            let d = dom as *mut ffi::fid;
            assert_eq!(
                regv(
                    d,
                    iov.as_ptr(),
                    8,
                    ffi::FI_SEND,
                    0,
                    1,
                    0,
                    &mut mr,
                    ptr::null_mut()
                ),
                0
            );
            assert_eq!(from_desc((*mr).mem_desc).unwrap().ranges().len(), 8);
            assert_eq!(close(mr as *mut ffi::fid), 0);
            assert_eq!(
                regv(
                    d,
                    iov.as_ptr(),
                    9,
                    ffi::FI_SEND,
                    0,
                    1,
                    0,
                    &mut mr,
                    ptr::null_mut()
                ),
                ret::EINVAL,
                "above mr_iov_limit"
            );
            assert_eq!(
                regv(
                    d,
                    iov.as_ptr(),
                    0,
                    ffi::FI_SEND,
                    0,
                    1,
                    0,
                    &mut mr,
                    ptr::null_mut()
                ),
                ret::EINVAL
            );
            assert_eq!(
                regv(
                    d,
                    iov.as_ptr(),
                    1,
                    0,
                    0,
                    1,
                    ffi::FI_RMA_EVENT,
                    &mut mr,
                    ptr::null_mut()
                ),
                ret::EBADFLAGS
            );

            let attr = ffi::fi_mr_attr {
                mr_iov: iov.as_ptr(),
                iov_count: 2,
                access: ffi::FI_RECV,
                requested_key: 5,
                context: 3 as *mut c_void,
                ..Default::default()
            };
            let regattr = ops.regattr.unwrap();
            assert_eq!(regattr(d, &attr, 0, &mut mr), 0);
            assert_eq!(((*mr).key, (*mr).fid.context as usize), (5, 3));
            assert_eq!(close(mr as *mut ffi::fid), 0);
            let cuda = ffi::fi_mr_attr {
                iface: ffi::FI_HMEM_CUDA,
                ..attr
            };
            assert_eq!(regattr(d, &cuda, 0, &mut mr), ret::ENOSYS);
            assert_eq!(regattr(d, ptr::null(), 0, &mut mr), ret::EINVAL);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }
}
