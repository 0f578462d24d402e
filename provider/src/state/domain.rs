//! The state of one `fi_domain` that its children (AVs, CQs, counters,
//! memory regions, poll sets, endpoints) hold: the attributes resolved
//! against the application's info, the tunables, the EQ bound to it, and
//! what its endpoints share, as libfabric has it: one DMA engine with one
//! registration cache over the process's dmable region, and one progress
//! list of its endpoints, which every read of its CQs and counters runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use unimem_dma::{DmaError, ShmDmaEngine};
use unimem_proto::DomainDma;

use crate::base::config::Config;
use crate::base::ffi;
use crate::base::fid::{Children, Parent, ParentRef};
use crate::base::lock::Locking;
use crate::info::attr::Info;
use crate::state::fabric::FabricState;
use crate::state::memory;
use crate::state::progress::ProgressList;
use unimem_net::NodeDma;

/// The DMA engine and registration cache a domain's endpoints share.
pub type SharedDma = DomainDma<NodeDma>;

/// State shared with the domain's children.
#[derive(Debug)]
pub struct DomainState {
    fabric: ParentRef<FabricState>,
    /// API version the application opened the fabric with.
    pub api_version: u32,
    /// The attributes resolved against the application's info: threading
    /// (FI_THREAD_DOMAIN lets the data path skip locks), progress, sizes,
    /// caps, mr_mode...
    pub info: Info,
    /// EQ bound with `fi_domain_bind` (at most one), held open while bound.
    eq: Mutex<Option<ParentRef<dyn Parent>>>,
    /// Made for the first endpoint (a domain without endpoints needs no
    /// dmable memory), then shared by all.
    dma: Mutex<Option<SharedDma>>,
    /// The domain's enabled endpoints: what a CQ or counter read advances.
    progress: ProgressList,
    children: Children,
    /// What endpoints' counters of remote accesses count (`FI_REMOTE_READ`,
    /// `FI_REMOTE_WRITE`): initiators must tell of such one-sided accesses.
    remote_counters: AtomicU64,
    /// The progress agent serves the domain's endpoints
    /// (`FI_PROGRESS_AUTO`, or the `async_progress` tunable).
    agent: bool,
}

impl DomainState {
    pub fn new(fabric: &Arc<FabricState>, api_version: u32, info: Info) -> Self {
        let agent = fabric.config.async_progress
            || info.domain.data_progress == ffi::FI_PROGRESS_AUTO
            || info.domain.control_progress == ffi::FI_PROGRESS_AUTO;
        // The agent never runs beside an application call
        // (`base/handover.rs`): the threading model alone decides.
        let locking = Locking::for_threading(info.domain.threading);
        DomainState {
            fabric: ParentRef::new(fabric),
            api_version,
            info,
            eq: Mutex::new(None),
            dma: Mutex::new(None),
            progress: ProgressList::new(locking),
            children: Children::default(),
            remote_counters: AtomicU64::new(0),
            agent,
        }
    }

    /// Whether the progress agent serves the domain's endpoints.
    pub fn has_agent(&self) -> bool {
        self.agent
    }

    /// An endpoint bound a counter of remote accesses: `flags` of
    /// `FI_REMOTE_READ` and `FI_REMOTE_WRITE`, what it counts.
    pub fn note_remote_counter(&self, flags: u64) {
        let counted = flags & (ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE);
        self.remote_counters.fetch_or(counted, Ordering::Relaxed);
    }

    /// The remote accesses (`FI_REMOTE_READ`, `FI_REMOTE_WRITE`) that an
    /// endpoint's counter counts.
    pub fn remote_accesses_counted(&self) -> u64 {
        self.remote_counters.load(Ordering::Relaxed)
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.fabric.config
    }

    /// Binds an EQ; `false` if one is bound already.
    pub fn bind_eq(&self, eq: ParentRef<dyn Parent>) -> bool {
        let mut slot = self.eq.lock();
        if slot.is_some() {
            return false;
        }
        *slot = Some(eq);
        true
    }

    /// The DMA engine and registration cache of the domain's endpoints,
    /// made on first use. A forked child that opens an endpoint on a domain
    /// it inherited gets an engine over its own region (the parent's is
    /// not its memory).
    pub fn dma(&self) -> Result<SharedDma, DmaError> {
        let mut slot = self.dma.lock();
        let pid = std::process::id();
        if let Some(dma) = slot
            .as_ref()
            .filter(|d| d.with_engine(|e| e.shm().region().node().pid) == pid)
        {
            return Ok(dma.clone());
        }
        let cfg = self.config();
        let region = memory::process_region(cfg)?;
        let nic = unimem_net::interface(&crate::base::net_settings(cfg), &region);
        let mut engine = ShmDmaEngine::new(region, cfg.timing_profile());
        // With the progress agent, large copies move while the application
        // computes (the agent's domain asked for a core's help already).
        if self.agent {
            engine.set_async_copies(cfg.async_copy_min);
            // The agent reaps a copy's completion as soon as it is done.
            unimem_dma::on_copy_done(crate::state::agent::kick);
        }
        let dma = SharedDma::new(
            NodeDma::new(engine, nic),
            unimem_regcache::Config {
                max_entries: cfg.regcache_max_entries,
                max_bytes: cfg.regcache_max_size,
                enabled: cfg.regcache_enable,
                ..unimem_regcache::Config::default()
            },
        );
        *slot = Some(dma.clone());
        Ok(dma)
    }

    /// Whether the locks of the domain's objects lock: not when the
    /// application serializes its calls on them (`FI_THREAD_DOMAIN`).
    pub fn locking(&self) -> Locking {
        Locking::for_threading(self.info.domain.threading)
    }

    /// The domain's enabled endpoints, run by every CQ and counter read.
    pub fn progress(&self) -> &ProgressList {
        &self.progress
    }

    /// Whether an EQ is bound.
    pub fn has_eq(&self) -> bool {
        self.eq.lock().is_some()
    }
}

impl Parent for DomainState {
    fn children(&self) -> &Children {
        &self.children
    }
}
