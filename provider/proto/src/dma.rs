//! One DMA engine and one registration cache per domain, shared by the
//! domain's messengers.
//!
//! A [`DomainDma`] owns the engine and the cache behind one lock; each
//! messenger works through a [`DmaView`] of it, which names it to the
//! domain. Transfers are submitted with a *token*, the submitter's name for
//! what the transfer is for; whichever view polls the engine, each
//! completion's token goes back to the view that submitted it (to it
//! straight away, or through its queue in the domain for the next time it
//! looks). Registrations cached by one messenger are hits for the others,
//! and a node dropped from the cache (its peer died) is dropped for all.
//!
//! The lock is taken only by operations that carry DMA (allocation of
//! dmable memory, registration, transfers and their completions); a
//! [`DmaSession`] holds it for a sequence of them. The messenger takes it
//! once to start an eager flush's DMAs and reap, once per rendezvous
//! fragment (plus one look whether the source is dmable), and once per reap
//! of completions while a DMA of its own is in flight: never for inline
//! messages, which only use the mailbox, nor for an idle progress call.
//!
//! A domain's messengers also share the engine's modeled time: transfers of
//! all of them queue on the one engine, as on one node's hardware.
//!
//! Owns: the engine, the cache, the routing of completions
//! (`owners`, `routed`), and the registrations a view made for itself (its
//! peers' eager rings), released when the view goes.

use std::collections::VecDeque;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use unimem_dma::{DmaBuf, DmaEngine, DmaError, DmaId, Exposure, KeyLease, RegId, RegLease};
use unimem_mailbox::IdHasher;
use unimem_regcache::{Config as RegCacheConfig, RegCache, Stats};

/// What a cache miss registers: the aligned stretch of this many bytes
/// around the range asked for (within its segment).
pub const REGISTRATION_WINDOW: usize = 2 << 20;

/// What a submitter calls one of its transfers; handed back when the
/// transfer completes.
pub type Token = usize;

/// The view slot of transfers whose view went away: their completions are
/// dropped.
const ORPHAN: u32 = u32::MAX;

struct Shared<D: DmaEngine> {
    engine: D,
    regcache: RegCache<D::Node, RegId, BuildHasherDefault<IdHasher>>,
    /// Each transfer in flight: its id, view slot and token, in submission
    /// order. Engines complete mostly in that order, so the owner of a
    /// completion is found at the front, without hashing.
    owners: VecDeque<(DmaId, u32, Token)>,
    /// Per view slot: the tokens of its transfers that another view polled,
    /// waiting for it to look. `None`: no view in that slot.
    routed: Vec<Option<Vec<Token>>>,
    /// Registrations found stale (their owner freed the memory) and made
    /// again.
    stale: u64,
}

impl<D: DmaEngine> Shared<D> {
    fn submitted(&mut self, id: DmaId, slot: u32, token: Token) {
        self.owners.push_back((id, slot, token));
    }

    /// The view slot and token of transfer `id`, forgotten.
    fn take_owner(&mut self, id: DmaId) -> Option<(u32, Token)> {
        let at = match self.owners.front() {
            Some(&(first, _, _)) if first == id => 0,
            _ => self.owners.iter().position(|&(each, _, _)| each == id)?,
        };
        self.owners.remove(at).map(|(_, slot, token)| (slot, token))
    }

    /// Drops the cached registrations of `node` and releases them.
    fn invalidate_node(&mut self, node: D::Node) {
        for reg in self.regcache.invalidate_node(node) {
            let _ = self.engine.deregister(reg);
        }
    }
}

/// The DMA engine and registration cache of one domain. Cloning gives
/// another handle to the same ones.
pub struct DomainDma<D: DmaEngine> {
    shared: Arc<Mutex<Shared<D>>>,
    local_node: D::Node,
}

impl<D: DmaEngine> Clone for DomainDma<D> {
    fn clone(&self) -> Self {
        DomainDma {
            shared: Arc::clone(&self.shared),
            local_node: self.local_node,
        }
    }
}

impl<D: DmaEngine> fmt::Debug for DomainDma<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainDma")
            .field("local_node", &self.local_node)
            .finish_non_exhaustive()
    }
}

impl<D: DmaEngine> DomainDma<D> {
    /// Takes `engine` for the domain, with a registration cache sized by
    /// `regcache`.
    pub fn new(engine: D, regcache: RegCacheConfig) -> Self {
        DomainDma {
            local_node: engine.local_node(),
            shared: Arc::new(Mutex::new(Shared {
                engine,
                regcache: RegCache::new(regcache),
                owners: VecDeque::new(),
                routed: Vec::new(),
                stale: 0,
            })),
        }
    }

    /// A view for one more user (a messenger), with a slot of its own.
    pub fn view(&self) -> DmaView<D> {
        let mut shared = self.shared.lock();
        let slot = match shared.routed.iter().position(Option::is_none) {
            Some(free) => {
                shared.routed[free] = Some(Vec::new());
                free
            }
            None => {
                shared.routed.push(Some(Vec::new()));
                shared.routed.len() - 1
            }
        };
        drop(shared);
        DmaView {
            domain: self.clone(),
            slot: slot as u32,
            owned: Vec::new(),
        }
    }

    /// The engine's node: what peers register against.
    pub fn local_node(&self) -> D::Node {
        self.local_node
    }

    /// Allocates dmable memory.
    pub fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError> {
        self.shared.lock().engine.alloc(len)
    }

    /// Whether `[addr, addr + len)` is dmable memory of this node.
    pub fn is_dmable(&self, addr: *const u8, len: usize) -> bool {
        self.shared.lock().engine.is_dmable(addr, len)
    }

    /// See [`DmaEngine::grant_token`].
    pub fn grant_token(&self, addr: *const u8, len: usize) -> Option<u16> {
        self.shared.lock().engine.grant_token(addr, len)
    }

    /// Drops (and deregisters) the cached registrations of `node`, for
    /// every view: its memory went away or changed. Transfers in flight
    /// keep theirs until they complete.
    pub fn invalidate_node(&self, node: D::Node) {
        self.shared.lock().invalidate_node(node);
    }

    /// `node` is gone for good (its process ended): drops its cached
    /// registrations, then everything the engine keeps of it, the views'
    /// own registrations there included.
    pub fn forget_node(&self, node: D::Node) {
        let mut shared = self.shared.lock();
        shared.invalidate_node(node);
        shared.engine.forget_node(node);
    }

    /// The registration cache's counters.
    pub fn regcache_stats(&self) -> Stats {
        self.shared.lock().regcache.stats()
    }

    /// Transfers the engine copied on its own thread so far.
    pub fn moved_async(&self) -> u64 {
        self.shared.lock().engine.moved_async()
    }

    /// Registrations found stale so far (see
    /// [`DmaSession::with_registration`]).
    pub fn stale_registrations(&self) -> u64 {
        self.shared.lock().stale
    }

    /// Views attached now.
    pub fn views(&self) -> usize {
        self.shared.lock().routed.iter().flatten().count()
    }

    /// Runs `f` on the engine, under the lock (statistics, tests).
    pub fn with_engine<R>(&self, f: impl FnOnce(&D) -> R) -> R {
        f(&self.shared.lock().engine)
    }
}

/// One messenger's view of its domain's DMA: transfers it submits come
/// back to it, and the registrations it makes for itself (not cached) are
/// released when it goes.
pub struct DmaView<D: DmaEngine> {
    domain: DomainDma<D>,
    slot: u32,
    owned: Vec<RegId>,
}

impl<D: DmaEngine> DmaView<D> {
    pub fn domain(&self) -> &DomainDma<D> {
        &self.domain
    }

    /// The engine's node (no lock).
    pub fn local_node(&self) -> D::Node {
        self.domain.local_node
    }

    /// Allocates dmable memory.
    pub fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError> {
        self.domain.alloc(len)
    }

    /// Whether `[addr, addr + len)` is dmable memory of this node.
    pub fn is_dmable(&self, addr: *const u8, len: usize) -> bool {
        self.domain.is_dmable(addr, len)
    }

    /// See [`DmaEngine::grant_token`].
    pub fn grant_token(&self, addr: *const u8, len: usize) -> Option<u16> {
        self.domain.grant_token(addr, len)
    }

    /// Registers `[addr, addr + len)` of `node` for this view alone, outside
    /// the cache (a peer's eager ring): released when the view goes.
    pub fn register(&mut self, node: D::Node, addr: u64, len: usize) -> Result<RegId, DmaError> {
        let reg = self.domain.shared.lock().engine.register(node, addr, len)?;
        self.owned.push(reg);
        Ok(reg)
    }

    /// See [`DmaEngine::lease_registration`].
    pub fn lease_registration(&mut self, reg: RegId) -> Option<RegLease> {
        self.domain.shared.lock().engine.lease_registration(reg)
    }

    /// See [`DomainDma::invalidate_node`].
    pub fn invalidate_node(&self, node: D::Node) {
        self.domain.invalidate_node(node);
    }

    /// Takes the domain's lock for a sequence of DMA operations.
    pub fn lock(&mut self) -> DmaSession<'_, D> {
        DmaSession {
            shared: self.domain.shared.lock(),
            slot: self.slot,
        }
    }

    /// See [`DmaSession::completed`].
    pub fn completed(&mut self, done: &mut Vec<Token>) {
        self.lock().completed(done);
    }
}

impl<D: DmaEngine> Drop for DmaView<D> {
    fn drop(&mut self) {
        let mut shared = self.domain.shared.lock();
        for reg in self.owned.drain(..) {
            // The node may have been forgotten meanwhile, and the
            // registration with it.
            let _ = shared.engine.deregister(reg);
        }
        for owner in shared.owners.iter_mut() {
            if owner.1 == self.slot {
                owner.1 = ORPHAN;
            }
        }
        shared.routed[self.slot as usize] = None;
    }
}

/// The domain's DMA, locked for one view: a sequence of operations under
/// one lock. Do not hold it across anything slow that needs no DMA.
pub struct DmaSession<'a, D: DmaEngine> {
    shared: MutexGuard<'a, Shared<D>>,
    slot: u32,
}

impl<D: DmaEngine> DmaSession<'_, D> {
    /// Starts putting `len` bytes from local `local` to `remote_addr` in
    /// `reg`; its completion hands `token` back to this view.
    pub fn put(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: Token,
    ) -> Result<(), DmaError> {
        let id = self.shared.engine.put(local, len, reg, remote_addr)?;
        self.shared.submitted(id, self.slot, token);
        Ok(())
    }

    /// [`Self::put`] into memory the owner granted with `grant` (see
    /// [`DmaEngine::put_granted`]).
    pub fn put_granted(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        grant: u16,
        token: Token,
    ) -> Result<(), DmaError> {
        let id = self
            .shared
            .engine
            .put_granted(local, len, reg, remote_addr, grant)?;
        self.shared.submitted(id, self.slot, token);
        Ok(())
    }

    /// Starts getting `len` bytes from `remote_addr` in `reg` to `local`;
    /// its completion hands `token` back to this view.
    pub fn get(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: Token,
    ) -> Result<(), DmaError> {
        let id = self.shared.engine.get(local, len, reg, remote_addr)?;
        self.shared.submitted(id, self.slot, token);
        Ok(())
    }

    /// [`Self::get`] from memory the owner offered with `offer` (see
    /// [`DmaEngine::get_granted`]).
    pub fn get_granted(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        offer: u16,
        token: Token,
    ) -> Result<(), DmaError> {
        let id = self
            .shared
            .engine
            .get_granted(local, len, reg, remote_addr, offer)?;
        self.shared.submitted(id, self.slot, token);
        Ok(())
    }

    /// Updates the elements of `target` with the engine's atomic unit (see
    /// [`DmaEngine::atomic`]); its completion hands `token` back to this
    /// view.
    pub fn atomic(
        &mut self,
        target: unimem_dma::ElementRange,
        update: &mut dyn FnMut(usize, u64) -> Option<u64>,
        old: &mut dyn FnMut(usize, u64),
        token: Token,
    ) -> Result<(), DmaError> {
        let id = self.shared.engine.atomic(target, update, old)?;
        self.shared.submitted(id, self.slot, token);
        Ok(())
    }

    /// See [`DmaEngine::loads_reach`].
    pub fn loads_reach(&self, node: D::Node) -> bool {
        self.shared.engine.loads_reach(node)
    }

    /// Reaches `[remote_addr, remote_addr + len)` in `reg` with loads and
    /// stores (see [`DmaEngine::load_store`]): done on return, with no
    /// completion to reap.
    pub fn load_store(
        &mut self,
        reg: RegId,
        remote_addr: u64,
        len: usize,
        store: bool,
        access: &mut dyn FnMut(*mut u8),
    ) -> Result<(), DmaError> {
        self.shared
            .engine
            .load_store(reg, remote_addr, len, store, access)
    }

    /// Appends to `done` the tokens of this view's completed transfers:
    /// those another view polled for it first, then those it polls now.
    /// Completions of other views' transfers go to their queues.
    pub fn completed(&mut self, done: &mut Vec<Token>) {
        let shared = &mut *self.shared;
        if let Some(mine) = shared.routed[self.slot as usize].as_mut() {
            done.append(mine);
        }
        while let Some(id) = shared.engine.poll() {
            match shared.take_owner(id) {
                Some((slot, token)) if slot == self.slot => done.push(token),
                Some((ORPHAN, _)) => {}
                Some((slot, token)) => shared.routed[slot as usize]
                    .as_mut()
                    .expect("a view with transfers in flight is attached")
                    .push(token),
                None => tracing::warn!(?id, "completion of an unknown DMA"),
            }
        }
    }

    /// Runs `transfer` with a registration of `[addr, addr + len)` of
    /// `node`: `probed` (see [`Self::registration_or`]) or the cache's. If
    /// the owner freed memory of the range since that registration was
    /// made ([`DmaError::Stale`]), the transfer is asked `still_allowed`
    /// (the owner may have allocated the memory anew for the transfer, or
    /// have taken away the right to it), and if so the registration is
    /// made current ([`DmaEngine::revalidate`]) and `transfer` runs once
    /// more.
    pub fn with_registration(
        &mut self,
        probed: Option<RegId>,
        (node, addr, len): (D::Node, u64, usize),
        still_allowed: impl FnOnce(&mut Self) -> Result<(), DmaError>,
        mut transfer: impl FnMut(&mut Self, RegId) -> Result<(), DmaError>,
    ) -> Result<(), DmaError> {
        let (reg, stale) = self.registration_or(probed, node, addr, len)?;
        let mut result = transfer(self, reg);
        if matches!(result, Err(DmaError::Stale)) {
            tracing::debug!(%node, addr, len, "stale registration: the owner freed that memory; registering again");
            self.shared.stale += 1;
            result = still_allowed(self)
                .and_then(|()| self.shared.engine.revalidate(reg))
                .and_then(|()| transfer(self, reg));
        }
        self.release(stale);
        result
    }

    /// `probed`, a registration the caller holds of a range covering this
    /// one (looked up moments before, under this lock), or the cache's.
    pub fn registration_or(
        &mut self,
        probed: Option<RegId>,
        node: D::Node,
        addr: u64,
        len: usize,
    ) -> Result<(RegId, Vec<RegId>), DmaError> {
        match probed {
            Some(reg) => Ok((reg, Vec::new())),
            None => self.cached_registration(node, addr, len),
        }
    }

    /// A registration covering `[addr, addr + len)` of `node`, from the
    /// domain's cache if it can, with the registrations to [`release`] once
    /// the caller's transfer has been submitted.
    ///
    /// [`release`]: Self::release
    pub fn cached_registration(
        &mut self,
        node: D::Node,
        addr: u64,
        len: usize,
    ) -> Result<(RegId, Vec<RegId>), DmaError> {
        let Shared {
            engine, regcache, ..
        } = &mut *self.shared;
        let ticket = match regcache.lookup(node, addr, len as u64) {
            Ok(&reg) => return Ok((reg, Vec::new())),
            Err(ticket) => ticket,
        };
        // The stretch around the range: a large buffer's next fragments
        // hit (one map of REGISTRATION_WINDOW instead of one per fragment).
        let (reg, start, covered) =
            match engine.register_window(node, addr, len, REGISTRATION_WINDOW) {
                Ok(done) => done,
                // Not inside one segment of the node's dmable memory.
                Err(DmaError::OutOfBounds) => {
                    let reg = engine.register(node, addr, len)?;
                    return Ok((reg, vec![reg]));
                }
                Err(e) => return Err(e),
            };
        Ok((
            reg,
            regcache.insert(ticket, node, start, covered as u64, reg),
        ))
    }

    /// See [`DmaEngine::atomics_reach`].
    pub fn atomics_reach(&self, node: D::Node) -> bool {
        self.shared.engine.atomics_reach(node)
    }

    /// What `node` exposes under `key` (see [`DmaEngine::resolve_key`]).
    pub fn resolve_key(&mut self, node: D::Node, key: u64) -> Result<Exposure, DmaError> {
        self.shared.engine.resolve_key(node, key)
    }

    /// See [`DmaEngine::lease_registration`].
    pub fn lease_registration(&mut self, reg: RegId) -> Option<RegLease> {
        self.shared.engine.lease_registration(reg)
    }

    /// See [`DmaEngine::lease_key`].
    pub fn lease_key(&mut self, node: D::Node, key: u64) -> Option<KeyLease> {
        self.shared.engine.lease_key(node, key)
    }

    /// Releases registrations [`cached_registration`] handed back.
    ///
    /// [`cached_registration`]: Self::cached_registration
    pub fn release(&mut self, regs: Vec<RegId>) {
        for reg in regs {
            let _ = self.shared.engine.deregister(reg);
        }
    }
}

#[cfg(test)]
mod tests;
