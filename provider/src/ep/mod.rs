//! The endpoint object (`fi_endpoint`, `FI_EP_RDM`): the libfabric face of
//! one [`proto::Endpoint`] over the emulated hardware.
//!
//! The protocol state sits behind one lock; every call that touches it
//! (posting, `fi_cancel`, progress from a CQ or counter read) turns the
//! protocol's finished operations into CQ entries and counter events before
//! it lets go, honouring selective completion.

mod data;

use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use unimem_dma::{DmaRegion, RegionConfig, ShmDmaEngine};
use unimem_mailbox::{JobId, MailboxAddr, Profile, ShmMailbox, ShmMailboxConfig};

use crate::av::{Av, AvInner};
use crate::base::config::Config;
use crate::base::ffi::{self, ret};
use crate::base::fid::{self, Bind, Control, FiObject, FidObject, ParentRef};
use crate::base::guard::ffi_guard;
use crate::base::unsupported;
use crate::cntr::{Cntr, CntrInner};
use crate::cq::{Completion, CompletionError, Cq, CqInner};
use crate::eq::{Eq, EqInner};
use crate::state::progress::Progress;
use crate::state::DomainState;
use unimem_proto::{self as proto, ErrorKind, Event, ProtoConfig};

/// The protocol over the shared-memory emulation.
pub type Core = proto::Endpoint<ShmMailbox, ShmDmaEngine>;

/// Our `struct fid_ep`.
pub type Ep = FidObject<EpInner>;

/// What the endpoint is bound to.
#[derive(Default)]
struct Bindings {
    av: Option<ParentRef<AvInner>>,
    tx_cq: Option<ParentRef<CqInner>>,
    rx_cq: Option<ParentRef<CqInner>>,
    /// FI_SELECTIVE_COMPLETION on the CQ binding: only operations flagged
    /// FI_COMPLETION produce an entry.
    tx_selective: bool,
    rx_selective: bool,
    send_cntr: Option<ParentRef<CntrInner>>,
    recv_cntr: Option<ParentRef<CntrInner>>,
    eq: Option<ParentRef<EqInner>>,
}

pub struct EpInner {
    /// Held, not read: the domain cannot close while the endpoint is open.
    _domain: ParentRef<DomainState>,
    caps: u64,
    tx_op_flags: u64,
    rx_op_flags: u64,
    inject_size: usize,
    iov_limit: usize,
    core: Mutex<Core>,
    /// Bindings while the endpoint is being set up.
    bindings: RwLock<Bindings>,
    /// The bindings, frozen by fi_enable (binding is refused afterwards):
    /// the data path reads them without a lock. Set means enabled.
    active: OnceLock<Bindings>,
    /// Dead peers whose shared objects were already reclaimed.
    peers_reclaimed: AtomicUsize,
}

static EP_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    bind: Some(fid::bind::<EpInner>),
    control: Some(fid::control::<EpInner>),
    ..fid::fi_ops::<EpInner>()
};

static EP_OPS: ffi::fi_ops_ep = ffi::fi_ops_ep {
    size: size_of::<ffi::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(unsupported::fi_tx_context),
    rx_ctx: Some(unsupported::fi_rx_context),
    rx_size_left: Some(unsupported::fi_rx_size_left),
    tx_size_left: Some(unsupported::fi_tx_size_left),
};

static EP_CM_OPS: ffi::fi_ops_cm = ffi::fi_ops_cm {
    size: size_of::<ffi::fi_ops_cm>(),
    setname: Some(unsupported::fi_setname),
    getname: Some(cm_getname),
    getpeer: Some(unsupported::fi_getpeer),
    connect: Some(unsupported::fi_connect),
    listen: Some(unsupported::fi_listen),
    accept: Some(unsupported::fi_accept),
    reject: Some(unsupported::fi_reject),
    shutdown: Some(unsupported::fi_shutdown),
    join: Some(unsupported::fi_join),
};

/// Protocol tunables from the provider configuration.
fn proto_config(cfg: &Config) -> ProtoConfig {
    ProtoConfig {
        eager_size: cfg.eager_size,
        eager_credits: cfg.eager_credits,
        bounce_buffers: cfg.bounce_buffers,
        segment_size: cfg.segment_size,
        rendezvous_window: cfg.rendezvous_window,
        staging_segments: cfg.staging_segments,
        tx_size: cfg.tx_size,
        peer_check: (cfg.peer_check_ms > 0)
            .then(|| std::time::Duration::from_millis(cfg.peer_check_ms as u64)),
        regcache: unimem_regcache::Config {
            max_entries: cfg.regcache_max_entries,
            max_bytes: cfg.regcache_max_size,
            enabled: cfg.regcache_enable,
            ..unimem_regcache::Config::default()
        },
        ..ProtoConfig::default()
    }
}

fn profile(cfg: &Config) -> Profile {
    cfg.profile.parse().unwrap_or_default()
}

/// Opens the mailbox an endpoint created from `info` listens on: the
/// service named by its `src_addr`, or a new address of its own. The
/// default `src_addr` of `fi_getinfo` (a service named after this process)
/// only says "here": such endpoints get an address of their own, so that a
/// process may open many.
fn open_mailbox(cfg: &Config, src: Option<MailboxAddr>) -> Result<ShmMailbox, c_int> {
    let job = JobId::from_name(&cfg.job);
    let config = ShmMailboxConfig {
        job,
        depth: cfg.mbx_depth,
        profile: profile(cfg),
    };
    let placeholder = MailboxAddr::for_service(job, &format!("pid{}", std::process::id()));
    let opened = match src {
        Some(addr) if addr.is_service() && addr != placeholder => {
            ShmMailbox::open_service(&config, &addr.index.to_string())
        }
        _ => ShmMailbox::open(&config),
    };
    opened.map_err(|e| match e {
        unimem_mailbox::Error::Io(io) if io.kind() == std::io::ErrorKind::AlreadyExists => {
            tracing::warn!("fi_endpoint: address {src:?} is already in use by a live process");
            -(ffi::FI_EADDRINUSE as c_int)
        }
        e => {
            tracing::warn!("fi_endpoint: cannot open a mailbox: {e}");
            ret::ENOMEM
        }
    })
}

/// The region kept for the life of the process (until the provider's
/// cleanup), once an endpoint has needed it.
static PROCESS_REGION: std::sync::Mutex<Option<Arc<DmaRegion>>> = std::sync::Mutex::new(None);

/// This process's dmable region, kept alive from the first endpoint to the
/// provider's cleanup. A node's memory must not come and go while the node
/// lives: peers identify it by the node id (pid and start time) alone, and
/// cache their mappings of it. Dropping it with the last endpoint and
/// creating it again for the next one (fi_rdm_multi_client's clients,
/// one after another in one process) would give the same node id to new
/// memory: peers would find their cached node closed ("dead") or, worse,
/// put data through stale mappings into the old segments.
fn process_region(cfg: &Config) -> Result<Arc<DmaRegion>, unimem_dma::DmaError> {
    let region = DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(&cfg.job),
        segment_size: cfg.dma_segment_size,
        max_size: cfg.dma_max_size,
    })?;
    let mut kept = PROCESS_REGION.lock().unwrap_or_else(|e| e.into_inner());
    // After a fork, for_process made a new region: it replaces the parent's.
    if let Some(old) = kept.replace(Arc::clone(&region)) {
        let_go(old);
    }
    Ok(region)
}

/// Lets the process's region go (provider cleanup): it is removed once the
/// last endpoint using it closes.
pub fn release_process_region() {
    let kept = PROCESS_REGION
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(region) = kept {
        let_go(region);
    }
}

/// Drops our reference to a region, unless it is a forked child's copy of
/// its parent's: dropping that one would remove the parent's objects from
/// /dev/shm while the parent still uses them, so it is leaked instead (a
/// mapping, gone when the child exits).
fn let_go(region: Arc<DmaRegion>) {
    if region.node().pid == std::process::id() {
        drop(region);
    } else {
        std::mem::forget(region);
    }
}

/// `fi_endpoint` on one of our domains.
///
/// # Safety
/// `info` must be NULL or a valid `fi_info`; `ep` NULL or writable.
pub unsafe fn open(
    domain: &Arc<DomainState>,
    info: *mut ffi::fi_info,
    ep: *mut *mut ffi::fid_ep,
    context: *mut c_void,
) -> c_int {
    if info.is_null() || ep.is_null() {
        tracing::warn!("fi_endpoint: NULL info or endpoint pointer");
        return ret::EINVAL;
    }
    // SAFETY: non-NULL info is a valid fi_info from the application.
    let info = unsafe { &*info };
    // SAFETY: attribute pointers of a valid fi_info are NULL or valid.
    let (ep_attr, tx_attr, rx_attr) = unsafe {
        (
            info.ep_attr.as_ref(),
            info.tx_attr.as_ref(),
            info.rx_attr.as_ref(),
        )
    };
    if ep_attr.is_some_and(|a| a.type_ != ffi::FI_EP_RDM && a.type_ != ffi::FI_EP_UNSPEC) {
        tracing::warn!("fi_endpoint: only FI_EP_RDM endpoints are supported");
        return ret::EINVAL;
    }
    let src = if info.src_addr.is_null() || info.src_addrlen == 0 {
        None
    } else {
        // SAFETY: src_addr holds src_addrlen bytes (libfabric contract).
        let bytes =
            unsafe { std::slice::from_raw_parts(info.src_addr as *const u8, info.src_addrlen) };
        let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
        match crate::info::addr::parse(text) {
            Some(addr) => Some(addr),
            None => {
                tracing::warn!("fi_endpoint: src_addr is not a unimem address");
                return ret::EINVAL;
            }
        }
    };
    let cfg = domain.config();
    let mailbox = match open_mailbox(cfg, src) {
        Ok(mailbox) => mailbox,
        Err(code) => return code,
    };
    let region = match process_region(cfg) {
        Ok(region) => region,
        Err(e) => {
            tracing::warn!("fi_endpoint: no dmable memory: {e}");
            return ret::ENOMEM;
        }
    };
    let core = match Core::new(
        mailbox,
        ShmDmaEngine::new(region, profile(cfg)),
        proto_config(cfg),
    ) {
        Ok(core) => core,
        Err(e) => {
            tracing::warn!("fi_endpoint: cannot set up the endpoint's buffers: {e}");
            return ret::ENOMEM;
        }
    };
    let resolved = &domain.info;
    let obj = Box::new(Ep {
        fid: ffi::fid_ep {
            fid: Ep::header(context),
            ops: fid::ops_ptr(&EP_OPS),
            cm: fid::ops_ptr(&EP_CM_OPS),
            msg: fid::ops_ptr(&data::MSG_OPS),
            rma: fid::ops_ptr(&unsupported::RMA_OPS),
            tagged: fid::ops_ptr(&data::TAGGED_OPS),
            atomic: fid::ops_ptr(&unsupported::ATOMIC_OPS),
            collective: fid::ops_ptr(&unsupported::COLLECTIVE_OPS),
        },
        inner: Arc::new(EpInner {
            _domain: ParentRef::new(domain),
            caps: if info.caps != 0 {
                info.caps
            } else {
                resolved.caps
            },
            tx_op_flags: tx_attr.map_or(0, |a| a.op_flags),
            rx_op_flags: rx_attr.map_or(0, |a| a.op_flags),
            inject_size: cfg.eager_size,
            iov_limit: resolved.tx.iov_limit.max(1),
            core: Mutex::new(core),
            bindings: RwLock::new(Bindings::default()),
            active: OnceLock::new(),
            peers_reclaimed: AtomicUsize::new(0),
        }),
    });
    tracing::info!(
        "endpoint {:p} opened at {}",
        &*obj,
        obj.inner.core.lock().addr()
    );
    // SAFETY: ep is non-NULL (checked).
    unsafe { obj.install(ep) };
    ret::SUCCESS
}

// SAFETY: fid_ep starts with its struct fid.
unsafe impl FiObject for EpInner {
    type Fid = ffi::fid_ep;
    const CLASS: u32 = ffi::FI_CLASS_EP;
    const KIND: &'static str = "endpoint";
    const FI_OPS: &'static ffi::fi_ops = &EP_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    /// Leaves the progress lists of the CQs and counters it is bound to
    /// (they hold the endpoint, which holds them: a cycle to break).
    fn on_close(ep: &Ep) -> Result<(), c_int> {
        let me: Arc<dyn Progress> = ep.inner.clone();
        let setup = ep.inner.bindings.read();
        let bindings = ep.inner.active.get().unwrap_or(&setup);
        for cq in [&bindings.tx_cq, &bindings.rx_cq].into_iter().flatten() {
            cq.progress().remove(&me);
        }
        for cntr in [&bindings.send_cntr, &bindings.recv_cntr]
            .into_iter()
            .flatten()
        {
            cntr.progress().remove(&me);
        }
        drop(setup);
        tracing::info!("endpoint {:p} closed", ep);
        Ok(())
    }
}

impl Progress for EpInner {
    fn progress(&self) {
        let mut core = self.core.lock();
        core.progress();
        self.drain(&mut core);
        let lost = core.peers_lost();
        drop(core);
        // A load first: a swap on every progress call would be a locked
        // instruction on the polling path.
        if self.peers_reclaimed.load(Ordering::Relaxed) != lost
            && self.peers_reclaimed.swap(lost, Ordering::Relaxed) != lost
        {
            // A killed process cannot remove its mailbox and memory: the
            // peers that find it dead do.
            let removed = unimem_mailbox::shm::reclaim_dead_objects();
            tracing::info!(removed, "reclaimed the shared objects of dead peers");
        }
    }
}

fn kind_flag(tagged: bool) -> u64 {
    if tagged {
        ffi::FI_TAGGED
    } else {
        ffi::FI_MSG
    }
}

impl EpInner {
    /// Turns the protocol's finished operations into CQ entries and counter
    /// events.
    fn drain(&self, core: &mut Core) {
        let setup;
        let bindings = match self.active.get() {
            Some(active) => active,
            None => {
                setup = self.bindings.read();
                &*setup
            }
        };
        while let Some(event) = core.next_event() {
            match event {
                Event::Send {
                    context,
                    tagged,
                    completion,
                } => {
                    if completion {
                        if let Some(cq) = &bindings.tx_cq {
                            cq.write(Completion::new(
                                context as *mut c_void,
                                ffi::FI_SEND | kind_flag(tagged),
                            ));
                        }
                    }
                    if let Some(cntr) = &bindings.send_cntr {
                        cntr.inc();
                    }
                }
                Event::Recv(done) => {
                    let mut flags = ffi::FI_RECV | kind_flag(done.tagged);
                    if done.data.is_some() {
                        flags |= ffi::FI_REMOTE_CQ_DATA;
                    }
                    if done.multi_released {
                        flags |= ffi::FI_MULTI_RECV;
                    }
                    if done.completion || done.multi_released {
                        if let Some(cq) = &bindings.rx_cq {
                            cq.write(Completion {
                                op_context: done.context as *mut c_void,
                                flags,
                                len: done.len,
                                buf: done.buf as *mut c_void,
                                data: done.data.unwrap_or(0),
                                tag: done.tag,
                                src_addr: source_fi_addr(self.caps, bindings, &done.src),
                            });
                        }
                    }
                    if let Some(cntr) = &bindings.recv_cntr {
                        cntr.inc();
                    }
                }
                Event::Error(e) => {
                    let (cq, cntr, direction) = if e.send {
                        (&bindings.tx_cq, &bindings.send_cntr, ffi::FI_SEND)
                    } else {
                        (&bindings.rx_cq, &bindings.recv_cntr, ffi::FI_RECV)
                    };
                    let mut flags = direction | kind_flag(e.tagged);
                    if e.multi_released {
                        flags |= ffi::FI_MULTI_RECV;
                    }
                    if e.data.is_some() {
                        flags |= ffi::FI_REMOTE_CQ_DATA;
                    }
                    let err = match e.kind {
                        ErrorKind::Truncated => ffi::FI_ETRUNC as i32,
                        ErrorKind::Canceled => ffi::FI_ECANCELED,
                        ErrorKind::PeerUnreachable => ffi::FI_EHOSTUNREACH,
                        ErrorKind::NoMessage => ffi::FI_ENOMSG,
                    };
                    if let Some(cq) = cq {
                        cq.write_error(CompletionError {
                            completion: Completion {
                                op_context: e.context as *mut c_void,
                                flags,
                                len: e.len,
                                buf: e.buf as *mut c_void,
                                data: e.data.unwrap_or(0),
                                tag: e.tag,
                                src_addr: e.src.map_or(ffi::FI_ADDR_NOTAVAIL, |src| {
                                    source_fi_addr(self.caps, bindings, &src)
                                }),
                            },
                            err,
                            prov_errno: err,
                            olen: e.olen,
                            err_data: Vec::new(),
                        });
                    }
                    if let Some(cntr) = cntr {
                        cntr.inc_err();
                    }
                }
            }
        }
    }
}

/// A completion's source address: an AV lookup (hashing the address) that
/// only endpoints with FI_SOURCE pay for; MPI does without (it sends its rank
/// as CQ data).
fn source_fi_addr(caps: u64, bindings: &Bindings, src: &MailboxAddr) -> ffi::fi_addr_t {
    if caps & ffi::FI_SOURCE == 0 {
        return ffi::FI_ADDR_NOTAVAIL;
    }
    bindings
        .av
        .as_ref()
        .and_then(|av| av.reverse_lookup(src))
        .unwrap_or(ffi::FI_ADDR_NOTAVAIL)
}

// --- fi_ops -------------------------------------------------------------------------

impl Bind for EpInner {
    unsafe fn bind(ep: &Ep, bfid: *mut ffi::fid, flags: u64) -> c_int {
        // SAFETY: bfid is NULL or a live fid (libfabric contract).
        let Some(class) = (unsafe { bfid.as_ref() }).map(|f| f.fclass as u32) else {
            tracing::warn!("fi_ep_bind: NULL object");
            return ret::EINVAL;
        };
        let inner = &ep.inner;
        let me: Arc<dyn Progress> = inner.clone();
        let mut b = inner.bindings.write();
        // Checked under the lock fi_enable takes to freeze the bindings.
        if inner.active.get().is_some() {
            tracing::warn!("fi_ep_bind: the endpoint is already enabled");
            return -(ffi::FI_EOPBADSTATE as c_int);
        }
        match class {
            ffi::FI_CLASS_AV => {
                // SAFETY: bfid is a live fid of class AV.
                let Some(av) = (unsafe { Av::state_of(bfid) }) else {
                    return ret::EINVAL;
                };
                if b.av.is_some() {
                    tracing::warn!("fi_ep_bind: an AV is already bound");
                    return ret::EINVAL;
                }
                b.av = Some(ParentRef::new(&av));
            }
            ffi::FI_CLASS_CQ => {
                // SAFETY: bfid is a live fid of class CQ.
                let Some(cq) = (unsafe { Cq::state_of(bfid) }) else {
                    return ret::EINVAL;
                };
                let known = ffi::FI_TRANSMIT | ffi::FI_RECV | ffi::FI_SELECTIVE_COMPLETION;
                if flags & !known != 0 || flags & (ffi::FI_TRANSMIT | ffi::FI_RECV) == 0 {
                    tracing::warn!("fi_ep_bind: CQ flags {flags:#x} are not FI_TRANSMIT/FI_RECV[/FI_SELECTIVE_COMPLETION]");
                    return ret::EBADFLAGS;
                }
                let selective = flags & ffi::FI_SELECTIVE_COMPLETION != 0;
                if flags & ffi::FI_TRANSMIT != 0 {
                    b.tx_cq = Some(ParentRef::new(&cq));
                    b.tx_selective = selective;
                }
                if flags & ffi::FI_RECV != 0 {
                    b.rx_cq = Some(ParentRef::new(&cq));
                    b.rx_selective = selective;
                }
                cq.progress().add(&me);
            }
            ffi::FI_CLASS_CNTR => {
                // SAFETY: bfid is a live fid of class CNTR.
                let Some(cntr) = (unsafe { Cntr::state_of(bfid) }) else {
                    return ret::EINVAL;
                };
                if flags & ffi::FI_SEND != 0 {
                    b.send_cntr = Some(ParentRef::new(&cntr));
                }
                if flags & ffi::FI_RECV != 0 {
                    b.recv_cntr = Some(ParentRef::new(&cntr));
                }
                // RMA counters (FI_READ/FI_WRITE...) never count (no RMA),
                // and the endpoint keeps no reference to them: it joins
                // the progress list only of counters it can leave at close.
                if flags & (ffi::FI_SEND | ffi::FI_RECV) != 0 {
                    cntr.progress().add(&me);
                }
            }
            ffi::FI_CLASS_EQ => {
                // SAFETY: bfid is a live fid of class EQ.
                let Some(eq) = (unsafe { Eq::state_of(bfid) }) else {
                    return ret::EINVAL;
                };
                b.eq = Some(ParentRef::new(&eq));
            }
            other => {
                tracing::warn!("fi_ep_bind: cannot bind an object of class {other}");
                return ret::EINVAL;
            }
        }
        ret::SUCCESS
    }
}

impl Control for EpInner {
    unsafe fn control(ep: &Ep, command: c_int, _arg: *mut c_void) -> c_int {
        match command as u32 {
            ffi::FI_ENABLE => {
                let mut b = ep.inner.bindings.write();
                if ep.inner.active.get().is_some() {
                    return ret::SUCCESS;
                }
                if b.av.is_none() {
                    tracing::warn!("fi_enable: no AV bound to the endpoint");
                    return -(ffi::FI_ENOAV as c_int);
                }
                if b.tx_cq.is_none()
                    && b.rx_cq.is_none()
                    && b.send_cntr.is_none()
                    && b.recv_cntr.is_none()
                {
                    tracing::warn!("fi_enable: no CQ or counter bound to the endpoint");
                    return -(ffi::FI_ENOCQ as c_int);
                }
                // Binding is refused from now on, so the bindings freeze.
                let _ = ep.inner.active.set(std::mem::take(&mut *b));
                ret::SUCCESS
            }
            other => {
                tracing::info!("fi_control(ep): command {other} is not supported");
                ret::ENOSYS
            }
        }
    }
}

// --- fi_ops_ep --------------------------------------------------------------------

unsafe extern "C" fn ep_cancel(fid: *mut ffi::fid, context: *mut c_void) -> isize {
    ffi_guard("fi_cancel", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_cancel") }) else {
            return ret::EINVAL;
        };
        let mut core = ep.inner.core.lock();
        let found = core.cancel(context as usize);
        ep.inner.drain(&mut core);
        if found {
            ret::SUCCESS
        } else {
            -(ffi::FI_ENOENT as c_int)
        }
    }) as isize
}

unsafe extern "C" fn ep_getopt(
    fid: *mut ffi::fid,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut usize,
) -> c_int {
    ffi_guard("fi_getopt", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_getopt") }) else {
            return ret::EINVAL;
        };
        if level as u32 != ffi::FI_OPT_ENDPOINT || optname as u32 != ffi::FI_OPT_MIN_MULTI_RECV {
            return -(ffi::FI_ENOPROTOOPT as c_int);
        }
        if optval.is_null() || optlen.is_null() {
            return ret::EINVAL;
        }
        // SAFETY: optlen is non-NULL and points to the caller's size.
        if unsafe { *optlen } < size_of::<usize>() {
            return ret::ETOOSMALL;
        }
        let min = ep.inner.core.lock().min_multi_recv();
        // SAFETY: optval holds at least size_of::<usize>() bytes (checked).
        unsafe {
            (optval as *mut usize).write_unaligned(min);
            *optlen = size_of::<usize>();
        }
        ret::SUCCESS
    })
}

unsafe extern "C" fn ep_setopt(
    fid: *mut ffi::fid,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    ffi_guard("fi_setopt", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_setopt") }) else {
            return ret::EINVAL;
        };
        if level as u32 != ffi::FI_OPT_ENDPOINT || optname as u32 != ffi::FI_OPT_MIN_MULTI_RECV {
            tracing::info!("fi_setopt: option {level}/{optname} is not supported");
            return -(ffi::FI_ENOPROTOOPT as c_int);
        }
        if optval.is_null() || optlen != size_of::<usize>() {
            tracing::warn!("fi_setopt(FI_OPT_MIN_MULTI_RECV): the value must be a size_t");
            return ret::EINVAL;
        }
        // SAFETY: optval points to a size_t (checked length).
        let min = unsafe { (optval as *const usize).read_unaligned() };
        ep.inner.core.lock().set_min_multi_recv(min);
        ret::SUCCESS
    })
}

// --- fi_ops_cm ----------------------------------------------------------------------

unsafe extern "C" fn cm_getname(
    fid: *mut ffi::fid,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    ffi_guard("fi_getname", || {
        // SAFETY: libfabric hands us a fid the application got from us.
        let Some(ep) = (unsafe { Ep::from_fid(fid, "fi_getname") }) else {
            return ret::EINVAL;
        };
        if addrlen.is_null() {
            return ret::EINVAL;
        }
        let name = ep.inner.core.lock().addr().to_string();
        let needed = name.len() + 1;
        // SAFETY: addrlen is non-NULL and holds the buffer's size.
        let room = unsafe { *addrlen };
        // SAFETY: as above; the caller learns the size it needs.
        unsafe { *addrlen = needed };
        if addr.is_null() || room < needed {
            return ret::ETOOSMALL;
        }
        // SAFETY: addr holds `room >= needed` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), addr as *mut u8, name.len());
            *(addr as *mut u8).add(name.len()) = 0;
        }
        ret::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Weak;

    /// The dmable region is not dropped with the last endpoint: opening
    /// the next one finds the same region (same node, same memory).
    #[test]
    fn the_process_region_outlives_its_endpoints() {
        let mut cfg = Config::defaults();
        // The job of the crate's other unit tests: one process, one job.
        cfg.job = format!("provider-unit-{}", std::process::id());
        let first = process_region(&cfg).unwrap();
        let node = first.node();
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(weak.upgrade().is_some(), "kept after the last user");
        let again = process_region(&cfg).unwrap();
        assert!(Weak::ptr_eq(&weak, &Arc::downgrade(&again)));
        assert_eq!(again.node(), node);
        drop(again);
        release_process_region();
    }
}
