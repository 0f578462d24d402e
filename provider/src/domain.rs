//! The domain object (`fi_domain`): owns the resources endpoints share.
//! It validates the info it is opened with, records the resolved
//! attributes (threading, progress, sizes...) for the objects that hang
//! off it, and hands their construction to their modules (av/, cq/,
//! cntr.rs, mr.rs, poll.rs; endpoints: ep/). An EQ may be bound to it
//! (`fi_domain_bind`) for domain-level events.

use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use crate::av;
use crate::base::core;
use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, Bind, FiObject, FidObject, Parent, ParentRef};
use crate::base::guard::ffi_guard;
use crate::base::unsupported;
use crate::cntr;
use crate::cq;
use crate::ep;
use crate::eq::Eq;
use crate::info::attr::{self, Hints};
use crate::mr;
use crate::poll;
use crate::state::DomainState;
use crate::state::FabricState;
use unimem_proto::atomic::AtomicCall;

/// Our `struct fid_domain`.
pub type Domain = FidObject<DomainState>;

static DOMAIN_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    bind: Some(fid::bind::<DomainState>),
    ..fid::fi_ops::<DomainState>()
};

// SAFETY: fid_domain starts with its struct fid.
unsafe impl FiObject for DomainState {
    type Fid = ffi::fid_domain;
    const CLASS: u32 = ffi::FI_CLASS_DOMAIN;
    const KIND: &'static str = "domain";
    const FI_OPS: &'static ffi::fi_ops = &DOMAIN_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(domain: &Domain) -> Result<(), Error> {
        if let Err(n) = fid::check_no_children(domain.inner.children()) {
            tracing::warn!("fi_close(domain): {n} child object(s) still open");
            return Err(Error::EBUSY);
        }
        // Dropping it releases our reference on the fabric.
        tracing::info!("domain {domain:p} closed");
        Ok(())
    }
}

static DOMAIN_OPS: ffi::fi_ops_domain = ffi::fi_ops_domain {
    size: size_of::<ffi::fi_ops_domain>(),
    av_open: Some(domain_av_open),
    cq_open: Some(domain_cq_open),
    endpoint: Some(domain_endpoint),
    scalable_ep: Some(unsupported::fi_scalable_ep),
    cntr_open: Some(domain_cntr_open),
    poll_open: Some(domain_poll_open),
    stx_ctx: Some(unsupported::fi_stx_context),
    srx_ctx: Some(unsupported::fi_srx_context),
    query_atomic: Some(domain_query_atomic),
    query_collective: Some(unsupported::fi_query_collective),
    endpoint2: Some(domain_endpoint2),
};

/// `fi_query_atomic`: what the atomic calls support (see `ep/atomic/`),
/// as `fi_atomicvalid` and its kin report it.
unsafe extern "C" fn domain_query_atomic(
    domain: *mut ffi::fid_domain,
    datatype: ffi::fi_datatype,
    op: ffi::fi_op,
    attr: *mut ffi::fi_atomic_attr,
    flags: u64,
) -> c_int {
    ffi_guard("fi_query_atomic", || {
        // SAFETY: libfabric hands us a domain the application got from us.
        if unsafe { Domain::from_ptr(domain, "fi_query_atomic") }.is_none() {
            return ret::EINVAL;
        }
        // SAFETY: attr is NULL or writable (API contract).
        let Some(attr) = (unsafe { attr.as_mut() }) else {
            tracing::warn!("fi_query_atomic: NULL attr");
            return ret::EINVAL;
        };
        let call = match flags & (ffi::FI_FETCH_ATOMIC | ffi::FI_COMPARE_ATOMIC) {
            0 => AtomicCall::Write,
            f if f == ffi::FI_FETCH_ATOMIC => AtomicCall::Fetch,
            f if f == ffi::FI_COMPARE_ATOMIC => AtomicCall::Compare,
            _ => {
                tracing::warn!("fi_query_atomic: FI_FETCH_ATOMIC and FI_COMPARE_ATOMIC together");
                return ret::EINVAL;
            }
        };
        match unimem_proto::atomic::max_count(call, datatype, op) {
            Some((count, size)) => {
                attr.count = count;
                attr.size = size;
                ret::SUCCESS
            }
            None => ret::EOPNOTSUPP,
        }
    })
}

static DOMAIN_MR_OPS: ffi::fi_ops_mr = ffi::fi_ops_mr {
    size: size_of::<ffi::fi_ops_mr>(),
    reg: Some(domain_mr_reg),
    regv: Some(domain_mr_regv),
    regattr: Some(domain_mr_regattr),
};

/// `fi_domain` on one of our fabrics.
///
/// # Safety
/// `info` must be NULL or a valid `fi_info` (as libfabric defines it);
/// `dom` NULL or writable.
pub unsafe fn open(
    fabric: &Arc<FabricState>,
    api_version: u32,
    info: *mut ffi::fi_info,
    dom: *mut *mut ffi::fid_domain,
    context: *mut c_void,
) -> Result<(), Error> {
    if info.is_null() || dom.is_null() {
        tracing::warn!("fi_domain: NULL info or domain pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL info is a valid fi_info from the application.
    let wanted = unsafe { Hints::from_c(&*info) };
    let ours = attr::template(&fabric.config);
    // The info normally comes from our fi_getinfo; anything we could not
    // have returned is an application error.
    if let Err(m) = attr::check(api_version, &ours, &wanted) {
        tracing::warn!("fi_domain: info does not describe a unimem domain: {m}");
        return Err(Error::EINVAL);
    }
    let resolved = attr::tailor(api_version, &ours, Some(&wanted));
    let obj = Box::new(Domain {
        fid: ffi::fid_domain {
            fid: Domain::header(context),
            ops: fid::ops_ptr(&DOMAIN_OPS),
            mr: fid::ops_ptr(&DOMAIN_MR_OPS),
        },
        inner: Arc::new(DomainState::new(fabric, api_version, resolved)),
    });
    let d = &obj.inner.info.domain;
    tracing::info!(
        "domain {:p} opened: {} (locks {:?}), control {}, data {}, {}",
        &*obj,
        core::tostr32(d.threading, ffi::FI_TYPE_THREADING),
        obj.inner.locking(),
        core::tostr32(d.control_progress, ffi::FI_TYPE_PROGRESS),
        core::tostr32(d.data_progress, ffi::FI_TYPE_PROGRESS),
        core::tostr32(d.av_type, ffi::FI_TYPE_AV_TYPE)
    );
    // SAFETY: dom is non-NULL (checked).
    unsafe { obj.install(dom) };
    Ok(())
}

impl Bind for DomainState {
    unsafe fn bind(domain: &Domain, bfid: *mut ffi::fid, flags: u64) -> Result<(), Error> {
        if flags != 0 {
            // FI_REG_MR: registrations are synchronous, never reported on an EQ.
            tracing::warn!("fi_domain_bind: unsupported flags {flags:#x}");
            return Err(Error::EBADFLAGS);
        }
        // SAFETY: bfid comes from the application.
        let Some(eq) = (unsafe { Eq::state_of(bfid) }) else {
            tracing::warn!("fi_domain_bind: only a unimem EQ can be bound to a domain");
            return Err(Error::EINVAL);
        };
        let eq: Arc<dyn Parent> = eq;
        if !domain.inner.bind_eq(ParentRef::new(&eq)) {
            tracing::warn!("fi_domain_bind: an EQ is already bound");
            return Err(Error::EINVAL);
        }
        Ok(())
    }
}

/// Run a constructor on our domain behind `domain`.
///
/// # Safety
/// `domain` must be NULL or a live `struct fid_domain`.
unsafe fn with_domain(
    op: &'static str,
    domain: *mut ffi::fid_domain,
    f: impl FnOnce(&Arc<DomainState>) -> Result<(), Error>,
) -> c_int {
    ffi_guard(op, || {
        // SAFETY: fid_domain starts with its fid (caller).
        match unsafe { Domain::from_ptr(domain, op) } {
            Some(d) => ffi::error::ret_of(f(&d.inner)),
            None => ret::EINVAL,
        }
    })
}

unsafe extern "C" fn domain_av_open(
    domain: *mut ffi::fid_domain,
    attr: *mut ffi::fi_av_attr,
    av: *mut *mut ffi::fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the arguments come from the application's fi_av_open.
    unsafe { with_domain("fi_av_open", domain, |d| av::open(d, attr, av, context)) }
}

unsafe extern "C" fn domain_cq_open(
    domain: *mut ffi::fid_domain,
    attr: *mut ffi::fi_cq_attr,
    cq: *mut *mut ffi::fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the arguments come from the application's fi_cq_open.
    unsafe { with_domain("fi_cq_open", domain, |d| cq::open(d, attr, cq, context)) }
}

unsafe extern "C" fn domain_endpoint(
    domain: *mut ffi::fid_domain,
    info: *mut ffi::fi_info,
    ep: *mut *mut ffi::fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the arguments come from the application's fi_endpoint.
    unsafe { with_domain("fi_endpoint", domain, |d| ep::open(d, info, ep, context)) }
}

unsafe extern "C" fn domain_endpoint2(
    domain: *mut ffi::fid_domain,
    info: *mut ffi::fi_info,
    ep: *mut *mut ffi::fid_ep,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    if flags != 0 {
        tracing::warn!("fi_endpoint2: flags {flags:#x} are not supported");
        return ret::EBADFLAGS;
    }
    // SAFETY: the arguments come from the application's fi_endpoint2.
    unsafe { with_domain("fi_endpoint2", domain, |d| ep::open(d, info, ep, context)) }
}

unsafe extern "C" fn domain_cntr_open(
    domain: *mut ffi::fid_domain,
    attr: *mut ffi::fi_cntr_attr,
    cntr: *mut *mut ffi::fid_cntr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the arguments come from the application's fi_cntr_open.
    unsafe {
        with_domain("fi_cntr_open", domain, |d| {
            cntr::open(d, attr, cntr, context)
        })
    }
}

unsafe extern "C" fn domain_poll_open(
    domain: *mut ffi::fid_domain,
    attr: *mut ffi::fi_poll_attr,
    pollset: *mut *mut ffi::fid_poll,
) -> c_int {
    // SAFETY: the arguments come from the application's fi_poll_open.
    unsafe { with_domain("fi_poll_open", domain, |d| poll::open(d, attr, pollset)) }
}

unsafe extern "C" fn domain_mr_reg(
    fid: *mut ffi::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut ffi::fid_mr,
    context: *mut c_void,
) -> c_int {
    let iov = [ffi::iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    }];
    let req = mr::Request {
        iov: &iov,
        access,
        offset,
        requested_key,
        flags,
        context,
    };
    // SAFETY: fid and mr come from the application's fi_mr_reg.
    unsafe {
        with_domain("fi_mr_reg", fid as *mut ffi::fid_domain, |d| {
            mr::register(d, &req, mr, "fi_mr_reg")
        })
    }
}

unsafe extern "C" fn domain_mr_regv(
    fid: *mut ffi::fid,
    iov: *const ffi::iovec,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut ffi::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: fid, iov and mr come from the application's fi_mr_regv.
    unsafe {
        with_domain("fi_mr_regv", fid as *mut ffi::fid_domain, |d| {
            let Some(iov) = mr::iov_slice(iov, count) else {
                tracing::warn!("fi_mr_regv: NULL iov");
                return Err(Error::EINVAL);
            };
            let req = mr::Request {
                iov,
                access,
                offset,
                requested_key,
                flags,
                context,
            };
            mr::register(d, &req, mr, "fi_mr_regv")
        })
    }
}

unsafe extern "C" fn domain_mr_regattr(
    fid: *mut ffi::fid,
    attr: *const ffi::fi_mr_attr,
    flags: u64,
    mr: *mut *mut ffi::fid_mr,
) -> c_int {
    // SAFETY: the arguments come from the application's fi_mr_regattr.
    unsafe {
        with_domain("fi_mr_regattr", fid as *mut ffi::fid_domain, |d| {
            mr::register_attr(d, attr, flags, mr)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::lock::Locking;
    use crate::fabric;
    use std::ptr;

    /// Open a fabric + domain with a minimal info; returns raw fids.
    fn open_both(
        info: &mut ffi::fi_info,
    ) -> (*mut ffi::fid_fabric, Result<*mut ffi::fid_domain, Error>) {
        let mut fattr = ffi::fi_fabric_attr::default();
        let mut fab: *mut ffi::fid_fabric = ptr::null_mut();
        let mut dom: *mut ffi::fid_domain = ptr::null_mut();
        // SAFETY: all pointers are live locals; fab is then a fabric of ours.
        let rc = unsafe {
            assert_eq!(fabric::open(&mut fattr, &mut fab, ptr::null_mut()), Ok(()));
            ((*(*fab).ops).domain.unwrap())(fab, info, &mut dom, ptr::null_mut())
        };
        (fab, crate::base::result_of(rc).map(|()| dom))
    }

    /// # Safety
    /// `fid` must be a live object of ours.
    unsafe fn close(fid: *mut ffi::fid) -> c_int {
        // SAFETY: guaranteed by the caller.
        unsafe { ((*(*fid).ops).close.unwrap())(fid) }
    }

    #[test]
    fn children_keep_parents_open() {
        let mut dattr = ffi::fi_domain_attr {
            threading: ffi::FI_THREAD_DOMAIN,
            ..Default::default()
        };
        let mut info = ffi::fi_info {
            domain_attr: &mut dattr,
            ..Default::default()
        };
        let (fab, dom) = open_both(&mut info);
        let dom = dom.expect("domain opens");
        // SAFETY: fab and dom are live objects of ours.
        unsafe {
            let d = Domain::from_ptr(dom, "test").unwrap();
            assert_eq!(d.inner.info.domain.threading, ffi::FI_THREAD_DOMAIN);
            assert_eq!(d.inner.locking(), Locking::Elided);
            assert_eq!((*(*dom).ops).size, size_of::<ffi::fi_ops_domain>());
            assert_eq!((*(*dom).mr).size, size_of::<ffi::fi_ops_mr>());
            let av_open = (*(*dom).ops).av_open.unwrap();
            assert_eq!(
                av_open(dom, ptr::null_mut(), ptr::null_mut(), ptr::null_mut()),
                ret::EINVAL
            );
            let endpoint = (*(*dom).ops).endpoint.unwrap();
            assert_eq!(
                endpoint(dom, ptr::null_mut(), ptr::null_mut(), ptr::null_mut()),
                ret::EINVAL
            );
            assert_eq!(close(fab as *mut ffi::fid), ret::EBUSY);
            assert_eq!(close(dom as *mut ffi::fid), ret::SUCCESS);
            assert_eq!(close(fab as *mut ffi::fid), ret::SUCCESS);
        }
    }

    #[test]
    fn a_bound_eq_stays_open_until_the_domain_closes() {
        let mut info = ffi::fi_info::default();
        let (fab, dom) = open_both(&mut info);
        let dom = dom.expect("domain opens");
        let mut attr = ffi::fi_eq_attr::default();
        let mut eq: *mut ffi::fid_eq = ptr::null_mut();
        // SAFETY: fab, dom and eq are live objects of ours.
        unsafe {
            let eq_open = (*(*fab).ops).eq_open.unwrap();
            assert_eq!(eq_open(fab, &mut attr, &mut eq, ptr::null_mut()), 0);
            let bind = (*(*dom).fid.ops).bind.unwrap();
            let (d, e) = (dom as *mut ffi::fid, eq as *mut ffi::fid);
            assert_eq!(bind(d, e, ffi::FI_REG_MR), ret::EBADFLAGS);
            assert_eq!(bind(d, fab as *mut ffi::fid, 0), ret::EINVAL);
            assert_eq!(bind(d, e, 0), 0);
            assert_eq!(bind(d, e, 0), ret::EINVAL, "one EQ per domain");
            let inner = &Domain::from_fid(d, "test").unwrap().inner;
            assert!(inner.has_eq());
            assert_eq!(close(e), ret::EBUSY);
            assert_eq!(close(d), 0);
            assert_eq!(close(e), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn wrong_info_is_einval() {
        let mut ep = ffi::fi_ep_attr {
            type_: ffi::FI_EP_MSG,
            ..Default::default()
        };
        let mut info = ffi::fi_info {
            ep_attr: &mut ep,
            ..Default::default()
        };
        let (fab, dom) = open_both(&mut info);
        assert_eq!(dom.err(), Some(Error::EINVAL));
        // SAFETY: fab is a live fabric of ours; passing NULL info is checked.
        unsafe {
            let mut d: *mut ffi::fid_domain = ptr::null_mut();
            let domain_fn = (*(*fab).ops).domain.unwrap();
            assert_eq!(
                domain_fn(fab, ptr::null_mut(), &mut d, ptr::null_mut()),
                ret::EINVAL
            );
            assert_eq!(close(fab as *mut ffi::fid), ret::SUCCESS);
        }
    }
}
