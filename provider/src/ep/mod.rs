//! The endpoint object (`fi_endpoint`, `FI_EP_RDM`): the libfabric face of
//! one [`unimem_proto::Messenger`] over the emulated hardware.
//!
//! The protocol state sits behind one lock; every call that touches it
//! (posting, `fi_cancel`, progress from a CQ or counter read) turns the
//! protocol's finished operations into CQ entries and counter events before
//! it lets go, honouring selective completion.
//!
//! Here: opening an endpoint and the process-wide resources it needs. The
//! rest, each importing only `inner` and `post` of its siblings:
//! - `inner`: the endpoint's state (its messenger, bindings, warnings) and
//!   its identity as a libfabric object;
//! - `bind`: `fi_ep_bind`, `fi_enable`;
//! - `completion`: protocol events → CQ entries and counters, progress;
//! - `post`: what every post shares: reading its buffers, running it on
//!   the messenger, refusing it with a rate-limited warning;
//! - `data/`: the data path (`fi_send`, `fi_recv` and their kin; the entry
//!   points in `calls.rs`);
//! - `rma`: the RMA data path (`fi_read`, `fi_write` and their kin);
//! - `atomic/`: the atomic data path (`fi_atomic` and its kin, `*valid`;
//!   the entry points in `calls.rs`);
//! - `options`: `fi_cancel`, `fi_getopt`/`fi_setopt`, `fi_getname`.

mod atomic;
mod bind;
mod completion;
mod data;
mod inner;
mod options;
mod post;
mod rma;

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use unimem_mailbox::{JobId, MailboxAddr, ShmMailbox, ShmMailboxConfig};

use unimem_net::NodeMailbox;

use crate::base::config::Config;
use crate::base::ffi::{self, Error};
use crate::base::fid::{self, ParentRef};
use crate::base::lock::DomainMutex;
use crate::base::unsupported;
use crate::state::DomainState;
use inner::{Bindings, Ep, EpInner, EpMessenger, Messenger};
use options::{EP_CM_OPS, EP_OPS};
use unimem_proto::ProtoConfig;

/// Protocol tunables from the provider configuration.
fn proto_config(cfg: &Config) -> ProtoConfig {
    ProtoConfig {
        eager_size: cfg.eager_size,
        eager_credits: cfg.eager_credits,
        bounce_buffers: cfg.bounce_buffers,
        fragment_size: cfg.segment_size,
        rendezvous_window: cfg.rendezvous_window,
        staging_buffers: cfg.staging_segments,
        tx_size: cfg.tx_size,
        max_msg_size: cfg.message_limit(),
        unexpected_limit: cfg.unexpected_per_peer,
        inline_parts: cfg.inline_parts,
        // The paper profile charges a store a mailbox trip of its own.
        store_before_parts: cfg.timing_profile().timing().load_store_ns(1, true) == 0,
        peer_check: (cfg.peer_check_ms > 0)
            .then(|| std::time::Duration::from_millis(cfg.peer_check_ms as u64)),
        ..ProtoConfig::default()
    }
}

/// Opens the mailbox an endpoint created from `info` listens on: the
/// service named by its `src_addr`, or a new address of its own. The
/// default `src_addr` of `fi_getinfo` (a service named after this process)
/// only says "here": such endpoints get an address of their own, so that a
/// process may open many.
fn open_mailbox(cfg: &Config, src: Option<MailboxAddr>) -> Result<ShmMailbox, Error> {
    let job = JobId::from_name(&cfg.job);
    let config = ShmMailboxConfig {
        job,
        depth: cfg.mbx_depth,
        profile: cfg.timing_profile(),
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
            Error::EADDRINUSE
        }
        e => {
            tracing::warn!("fi_endpoint: cannot open a mailbox: {e}");
            Error::ENOMEM
        }
    })
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
) -> Result<(), Error> {
    if info.is_null() || ep.is_null() {
        tracing::warn!("fi_endpoint: NULL info or endpoint pointer");
        return Err(Error::EINVAL);
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
        return Err(Error::EINVAL);
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
                return Err(Error::EINVAL);
            }
        }
    };
    let cfg = domain.config();
    let mailbox = open_mailbox(cfg, src)?;
    let dma = match domain.dma() {
        Ok(dma) => dma,
        Err(e) => {
            tracing::warn!("fi_endpoint: no dmable memory: {e}");
            return Err(Error::ENOMEM);
        }
    };
    // In an agent domain the agent sleeps on the mailbox's doorbell.
    let agent = domain.has_agent();
    let bell = mailbox.doorbell();
    if agent {
        bell.make_wakeable();
    }
    // The domain's DMA opened the process's network interface, if any.
    let mailbox = NodeMailbox::new(mailbox, unimem_net::current());
    let messenger = match Messenger::new(mailbox, &dma, proto_config(cfg)) {
        Ok(messenger) => messenger,
        Err(e) => {
            tracing::warn!("fi_endpoint: cannot set up the endpoint's buffers: {e}");
            return Err(Error::ENOMEM);
        }
    };
    let resolved = &domain.info;
    let obj = Box::new(Ep {
        fid: ffi::fid_ep {
            fid: Ep::header(context),
            ops: fid::ops_ptr(&EP_OPS),
            cm: fid::ops_ptr(&EP_CM_OPS),
            msg: fid::ops_ptr(&data::MSG_OPS),
            rma: fid::ops_ptr(&rma::RMA_OPS),
            tagged: fid::ops_ptr(&data::TAGGED_OPS),
            atomic: fid::ops_ptr(&atomic::ATOMIC_OPS),
            collective: fid::ops_ptr(&unsupported::COLLECTIVE_OPS),
        },
        inner: Arc::new(EpInner {
            domain: ParentRef::new(domain),
            caps: if info.caps != 0 {
                info.caps
            } else {
                resolved.caps
            },
            tx_op_flags: tx_attr.map_or(0, |a| a.op_flags),
            rx_op_flags: rx_attr.map_or(0, |a| a.op_flags),
            inject_size: cfg.eager_size,
            iov_limit: resolved.tx.iov_limit.max(1),
            messenger: DomainMutex::new(EpMessenger::new(messenger), domain.locking()),
            bindings: RwLock::new(Bindings::default()),
            active: OnceLock::new(),
            peers_reclaimed: AtomicUsize::new(0),
            warned_no_rma: AtomicBool::new(false),
            post_warnings: Default::default(),
            bell,
            agent,
        }),
    });
    tracing::info!(
        "endpoint {:p} opened at {}, tx op_flags {:#x}",
        &*obj,
        obj.inner.messenger.lock().addr(),
        obj.inner.tx_op_flags
    );
    // SAFETY: ep is non-NULL (checked).
    unsafe { obj.install(ep) };
    Ok(())
}
