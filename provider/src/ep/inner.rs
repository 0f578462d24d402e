//! The endpoint's state, held by its domain's progress list (which every
//! CQ and counter read of the domain runs), and how it is recognised and
//! closed as a libfabric object.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use unimem_mailbox::doorbell::Doorbell;
use unimem_mailbox::MailboxAddr;

use crate::av::AvInner;
use crate::base::ffi::{self, Error};
use crate::base::fid::{self, FiObject, FidObject, ParentRef};
use crate::base::lock::{DomainMutex, DomainMutexGuard};
use crate::cntr::CntrInner;
use crate::cq::CqInner;
use crate::eq::EqInner;
use crate::state::agent;
use crate::state::progress::Progress;
use crate::state::DomainState;
use unimem_net::{NodeDma, NodeMailbox};
use unimem_proto as proto;
use unimem_proto::messenger::KnownPeer;

/// The protocol over the node's hardware: the shared-memory emulation for
/// peers of this host, the network backend for peers of others.
pub type Messenger = proto::Messenger<(NodeMailbox, NodeDma)>;

/// The endpoint's messenger, with what the endpoint keeps beside it under
/// the same lock: the answer of its last source lookup. It derefs to the
/// [`Messenger`].
pub struct EpMessenger {
    messenger: Messenger,
    /// The AV's answer for the last source address (FI_SOURCE): MPI
    /// receives from few peers, and a hit spares the reverse map's hash
    /// and lock on every completion.
    pub(super) last_source: Option<SourceHit>,
    /// The peers of sends' destinations and directed receives' sources,
    /// by fi_addr.
    peers: PeersByFiAddr,
}

/// Sends' destinations and directed receives' sources: fi_addr → the
/// messenger's peer, so that a send to or a receive from a peer seen before
/// reads neither the AV nor the messenger's peer map. Direct-mapped (a
/// peer takes the slot of its fi_addr modulo [`PeersByFiAddr::SLOTS`]; two
/// that share one take turns),
/// right while the AV has had no removal since `removals`: an AV index is
/// never reused nor its address rewritten, and the messenger never
/// forgets a peer.
struct PeersByFiAddr {
    removals: u64,
    slots: Box<[Option<(ffi::fi_addr_t, KnownPeer)>; PeersByFiAddr::SLOTS]>,
}

impl PeersByFiAddr {
    const SLOTS: usize = 64;

    fn new() -> Self {
        PeersByFiAddr {
            removals: 0,
            slots: Box::new([None; PeersByFiAddr::SLOTS]),
        }
    }
}

/// A reverse lookup's answer, right while the AV has had no removal since.
#[derive(Clone, Copy)]
pub(super) struct SourceHit {
    pub(super) addr: MailboxAddr,
    pub(super) fi_addr: ffi::fi_addr_t,
    pub(super) removals: u64,
}

impl EpMessenger {
    pub(super) fn new(messenger: Messenger) -> Self {
        EpMessenger {
            messenger,
            last_source: None,
            peers: PeersByFiAddr::new(),
        }
    }

    /// The peer at `fi_addr` (not `FI_ADDR_UNSPEC`) of `av`, a send's
    /// destination or a directed receive's source: the peer, or its address
    /// while the messenger has never heard of it; None if the AV has no
    /// such entry.
    #[inline(always)]
    pub(super) fn peer_of_fi_addr(
        &mut self,
        av: Option<&AvInner>,
        fi_addr: ffi::fi_addr_t,
    ) -> Option<Result<KnownPeer, MailboxAddr>> {
        let av = av?;
        let removals = av.removals();
        let slot = fi_addr as usize % PeersByFiAddr::SLOTS;
        if let Some((at, peer)) = self.peers.slots[slot] {
            if at == fi_addr && removals == self.peers.removals {
                return Some(Ok(peer));
            }
        }
        self.peer_of_fi_addr_miss(av, fi_addr, removals)
    }

    /// [`Self::peer_of_fi_addr`] not in the cache; `removals` is the AV's
    /// count read before the lookup.
    #[cold]
    #[inline(never)]
    fn peer_of_fi_addr_miss(
        &mut self,
        av: &AvInner,
        fi_addr: ffi::fi_addr_t,
        removals: u64,
    ) -> Option<Result<KnownPeer, MailboxAddr>> {
        let peers = &mut self.peers;
        if removals != peers.removals {
            // An entry may be gone: forget them all.
            peers.slots.fill(None);
            peers.removals = removals;
        }
        let addr = av.lookup(fi_addr)?;
        let Some(peer) = self.messenger.known_peer_of(&addr) else {
            return Some(Err(addr));
        };
        self.peers.slots[fi_addr as usize % PeersByFiAddr::SLOTS] = Some((fi_addr, peer));
        Some(Ok(peer))
    }
}

impl std::ops::Deref for EpMessenger {
    type Target = Messenger;

    fn deref(&self) -> &Messenger {
        &self.messenger
    }
}

impl std::ops::DerefMut for EpMessenger {
    fn deref_mut(&mut self) -> &mut Messenger {
        &mut self.messenger
    }
}

/// Our `struct fid_ep`.
pub type Ep = FidObject<EpInner>;

/// What the endpoint is bound to.
#[derive(Default)]
pub(super) struct Bindings {
    pub(super) av: Option<ParentRef<AvInner>>,
    pub(super) tx_cq: Option<ParentRef<CqInner>>,
    pub(super) rx_cq: Option<ParentRef<CqInner>>,
    /// FI_SELECTIVE_COMPLETION on the CQ binding: only operations flagged
    /// FI_COMPLETION produce an entry.
    pub(super) tx_selective: bool,
    pub(super) rx_selective: bool,
    pub(super) send_cntr: Option<ParentRef<CntrInner>>,
    pub(super) recv_cntr: Option<ParentRef<CntrInner>>,
    /// Counters of our RMA reads and writes (`FI_READ`, `FI_WRITE`).
    pub(super) read_cntr: Option<ParentRef<CntrInner>>,
    pub(super) write_cntr: Option<ParentRef<CntrInner>>,
    /// Counters of peers' accesses to our memory (`FI_REMOTE_READ`,
    /// `FI_REMOTE_WRITE`; they count with `FI_RMA_EVENT`).
    pub(super) remote_read_cntr: Option<ParentRef<CntrInner>>,
    pub(super) remote_write_cntr: Option<ParentRef<CntrInner>>,
    pub(super) eq: Option<ParentRef<EqInner>>,
}

impl Bindings {
    /// The address of AV entry `fi_addr`, for call `op`; refused with a
    /// warning if the AV has none.
    #[inline(always)]
    pub(super) fn peer(&self, op: &str, fi_addr: u64) -> Result<MailboxAddr, Error> {
        self.av
            .as_ref()
            .and_then(|av| av.lookup(fi_addr))
            .ok_or_else(|| {
                tracing::warn!("{op}: fi_addr {fi_addr:#x} is not in the endpoint's AV");
                Error::EINVAL
            })
    }

    /// The CQs bound (transmit, receive).
    pub(super) fn cqs(&self) -> impl Iterator<Item = &ParentRef<CqInner>> {
        [&self.tx_cq, &self.rx_cq].into_iter().flatten()
    }

    /// The counters bound, of every kind.
    pub(super) fn cntrs(&self) -> impl Iterator<Item = &ParentRef<CntrInner>> {
        [
            &self.send_cntr,
            &self.recv_cntr,
            &self.read_cntr,
            &self.write_cntr,
            &self.remote_read_cntr,
            &self.remote_write_cntr,
        ]
        .into_iter()
        .flatten()
    }
}

/// What the domain's progress list holds of the endpoint (to progress it)
/// and its calls work on.
pub struct EpInner {
    /// Its domain: held open while the endpoint is, and the owner of the
    /// progress list the endpoint joins when enabled.
    pub(super) domain: ParentRef<DomainState>,
    pub(super) caps: u64,
    pub(super) tx_op_flags: u64,
    pub(super) rx_op_flags: u64,
    pub(super) inject_size: usize,
    pub(super) iov_limit: usize,
    /// The protocol; its lock is elided under `FI_THREAD_DOMAIN`.
    pub(super) messenger: DomainMutex<EpMessenger>,
    /// Bindings while the endpoint is being set up.
    pub(super) bindings: RwLock<Bindings>,
    /// The bindings, frozen by fi_enable (binding is refused afterwards):
    /// the data path reads them without a lock. Set means enabled.
    pub(super) active: OnceLock<Bindings>,
    /// Dead peers whose shared objects were already reclaimed.
    pub(super) peers_reclaimed: AtomicUsize,
    /// An RMA call on an endpoint opened without FI_RMA was refused with a
    /// warning: later ones are refused quietly.
    pub(super) warned_no_rma: AtomicBool,
    /// Warnings of refused posts, rate-limited for this endpoint.
    pub(super) post_warnings: PostWarnings,
    /// The doorbell of its mailbox: rung by senders once the mailbox is
    /// wakeable (an agent domain, or a CQ with a wait object).
    pub(super) bell: Doorbell,
    /// The progress agent serves it (an agent domain).
    pub(super) agent: bool,
}

impl EpInner {
    /// The bindings of an enabled endpoint, for call `op`; refused with a
    /// warning if it is not enabled.
    #[inline]
    pub(super) fn enabled(&self, op: &str) -> Result<&Bindings, Error> {
        self.active.get().ok_or_else(|| {
            tracing::warn!("{op}: the endpoint is not enabled");
            Error::EOPBADSTATE
        })
    }

    /// The messenger, for a call of the application: counted for the
    /// progress agent, which leaves the endpoint to it (see
    /// `state/agent.rs`).
    #[inline]
    pub(super) fn enter(&self) -> DomainMutexGuard<'_, EpMessenger> {
        if self.agent {
            agent::entered(&self.bell);
        }
        self.messenger.lock()
    }
}

/// A rate limit on the warnings of one endpoint's refused posts: an
/// application that retries a failing call in a loop must not flood the
/// log. At most [`PostWarnings::PER_SECOND`] a second for each entry point
/// (`fi_send`, `fi_read`, ...); the next one says how many were left out.
#[derive(Default)]
pub(super) struct PostWarnings {
    /// By entry point: (start of the current second, warned in it, left
    /// out since the last warning).
    state: std::sync::Mutex<HashMap<String, (std::time::Instant, u32, u64)>>,
}

impl PostWarnings {
    pub(super) const PER_SECOND: u32 = 5;

    /// Logs `args` for entry point `op` unless this second's share is used
    /// up.
    pub(super) fn warn(&self, op: &str, args: fmt::Arguments<'_>) {
        let now = std::time::Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.contains_key(op) {
            state.insert(op.to_owned(), (now, 0, 0));
        }
        let (start, warned, left_out) = state.get_mut(op).expect("inserted above");
        if now.duration_since(*start).as_secs() >= 1 {
            (*start, *warned) = (now, 0);
        }
        if *warned >= Self::PER_SECOND {
            *left_out += 1;
            return;
        }
        *warned += 1;
        match std::mem::take(left_out) {
            0 => tracing::warn!("{args}"),
            n => tracing::warn!("{args} ({n} similar warnings of this endpoint left out)"),
        }
    }
}

/// `fi_close` below, `fi_ep_bind` and `fi_enable` (bind.rs).
pub(super) static EP_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    bind: Some(fid::bind::<EpInner>),
    control: Some(fid::control::<EpInner>),
    ..fid::fi_ops::<EpInner>()
};

// SAFETY: fid_ep starts with its struct fid.
unsafe impl FiObject for EpInner {
    type Fid = ffi::fid_ep;
    const CLASS: u32 = ffi::FI_CLASS_EP;
    const KIND: &'static str = "endpoint";
    const FI_OPS: &'static ffi::fi_ops = &EP_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    /// Leaves its domain's progress list (the domain holds the endpoint,
    /// which holds the domain: a cycle to break).
    fn on_close(ep: &Ep) -> Result<(), Error> {
        let me: Arc<dyn Progress> = ep.inner.clone();
        ep.inner.domain.progress().remove(&me);
        if ep.inner.agent {
            agent::leave(&me);
        }
        drop(me);
        // A thread asleep in fi_cq_sread or fi_cntr_wait holds the domain's
        // endpoints, and with them the CQs and counters bound to this one
        // (which an application closes next): woken, it lets go, and sleeps
        // on without this endpoint. Bounded: a poll set may still hold it.
        if ep.inner.bell.is_wakeable() {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
            while Arc::strong_count(&ep.inner) > 1 && std::time::Instant::now() < until {
                ep.inner.bell.wake_all();
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        let carried = {
            let mut messenger = ep.inner.messenger.lock();
            // What peers still wait for from us goes first (bounded: a
            // peer that is gone or never reads cannot hold the close).
            // Closing: what finishes while it lingers is reported to
            // nobody (the application is done with its contexts), receives
            // included.
            messenger.drop_recv_sink();
            messenger.linger(std::time::Duration::from_millis(500));
            messenger.stats()
        };
        // The line the MPI jobs' checks look for: what unimem carried.
        tracing::info!(
            "endpoint {:p} closed: {} sends, {} receives; RMA and atomics: {} one-sided, {} through the target ({} atomics)",
            ep,
            carried.sends,
            carried.receives,
            carried.one_sided,
            carried.assisted,
            carried.atomics
        );
        tracing::info!(
            "endpoint {:p}: {} of the one-sided operations done inside their call (direct path); {} eager messages stored into their slot; {} access notices to targets that count them; {} rendezvous receives read from the sender's buffer",
            ep,
            carried.direct,
            carried.stored,
            carried.notices,
            carried.pulls
        );
        tracing::info!(
            "endpoint {:p}: {} peers; dmable memory of its own: {} bytes of buffers, {} bytes of eager rings for its peers",
            ep,
            carried.peers,
            carried.buffer_bytes,
            carried.ring_bytes
        );
        if let Some(nic) = unimem_net::current() {
            let net = nic.counters();
            tracing::info!(
                "endpoint {:p}: network backend of its process ({} at {}): {} packets out, {} in; {} transfers, {} bytes",
                ep,
                nic.provider,
                nic.name,
                net.packets_out,
                net.packets_in,
                net.transfers,
                net.transfer_bytes
            );
        }
        if carried.moved_async > 0 {
            tracing::info!(
                "endpoint {:p}: {} transfers of its domain copied by the DMA engine's thread while the application went on",
                ep,
                carried.moved_async
            );
        }
        if carried.regcache_hits + carried.regcache_misses > 0 {
            tracing::info!(
                "endpoint {:p}: registration cache of its domain: {} hits, {} misses, {} found stale (memory its owner freed since) and made again",
                ep,
                carried.regcache_hits,
                carried.regcache_misses,
                carried.stale_registrations
            );
        }
        if carried.unexpected_peak > 0 {
            tracing::info!(
                "endpoint {:p}: unexpected messages held at most {} bytes from one sender; senders throttled {} times",
                ep,
                carried.unexpected_peak,
                carried.throttles
            );
        }
        Ok(())
    }
}
