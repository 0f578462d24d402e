//! The shared-memory emulation of the DMA engine.
//!
//! A registration maps the registered part of the remote node's segment into
//! this process (populating its page tables now, so that later transfers do
//! not fault): that is the route Unimem's engine prepares, and it is what
//! makes registration costly. A transfer is then one copy between our
//! dmable memory and that mapping, done when it is submitted, or, with
//! asynchronous copies on, by the mover thread (`copier.rs`) while the
//! caller goes on; its completion is reported by `poll` once the copy is
//! done and the timing model says so.
//!
//! Here: the engine, its completions and the [`DmaEngine`] calls.
//! `remote.rs` holds what the engine keeps of each peer (its directory,
//! segments, generation and key tables), `registration.rs` the making of
//! a registration and the check of every access to it, `transfer.rs` the
//! copies of puts and gets, inline or by the mover.

mod registration;
mod remote;
mod transfer;

use std::collections::VecDeque;
use std::sync::Arc;

use unimem_mailbox::node::monotonic_ns;
use unimem_mailbox::profile::spin_until;
use unimem_mailbox::{IdMap, NodeId, Profile, TimingModel};

use crate::copier::AsyncCopy;
use crate::error::DmaError;
use crate::keys::{Exposure, KeyLease};
use crate::region::{DmaBuf, DmaRegion};
use crate::{DmaEngine, DmaId, ElementRange, RegId};
pub use registration::RegLease;
use registration::Registration;
use remote::RemoteNode;
use transfer::Direction;

const PAGE_SIZE: u64 = 4096;

/// The emulated engine of one user (one provider domain, say).
pub struct ShmDmaEngine {
    region: Arc<DmaRegion>,
    timing: TimingModel,
    nodes: IdMap<NodeId, RemoteNode>,
    registrations: IdMap<u64, Registration>,
    next_reg: u64,
    next_id: u64,
    /// When the modeled engine finishes its last queued transfer.
    busy_until: u64,
    /// Submitted transfers with their modeled completion time, in order,
    /// and, for a copy the mover thread does, the copy.
    in_flight: VecDeque<(u64, DmaId, Option<Arc<AsyncCopy>>)>,
    /// Transfers of at least this many bytes, other than granted ones, are
    /// copied by the mover thread (0: none).
    async_min: usize,
    /// Of them, how many so far.
    moved_async: u64,
}

impl ShmDmaEngine {
    pub fn new(region: Arc<DmaRegion>, profile: Profile) -> ShmDmaEngine {
        ShmDmaEngine {
            region,
            timing: profile.timing(),
            nodes: IdMap::default(),
            registrations: IdMap::default(),
            next_reg: 1,
            next_id: 1,
            busy_until: 0,
            in_flight: VecDeque::new(),
            async_min: 0,
            moved_async: 0,
        }
    }

    /// From now on, transfers of at least `min_len` bytes are copied by the
    /// mover thread while the caller goes on (0: every copy inline, done
    /// when submitted); granted ones never are (see
    /// [`DmaEngine::put_granted`]). For a user with a core to spare for them: the
    /// provider turns it on with its progress agent.
    pub fn set_async_copies(&mut self, min_len: usize) {
        self.async_min = min_len;
    }

    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    /// The modeled costs this engine enforces.
    pub fn timing(&self) -> TimingModel {
        self.timing
    }

    /// Live registrations (for tests and statistics).
    pub fn registrations(&self) -> usize {
        self.registrations.len()
    }

    /// Queues the completion of a transfer of `len` bytes at its modeled
    /// time (and, for `copy`, once the mover has copied it).
    #[inline]
    fn complete_after(&mut self, len: usize, copy: Option<Arc<AsyncCopy>>) -> DmaId {
        let id = DmaId(self.next_id);
        self.next_id += 1;
        let done_at = self
            .timing
            .queue_transfer(&mut self.busy_until, len, monotonic_ns)
            .unwrap_or(0);
        self.in_flight.push_back((done_at, id, copy));
        id
    }
}

impl DmaEngine for ShmDmaEngine {
    type Node = NodeId;

    fn local_node(&self) -> NodeId {
        self.region.node()
    }

    fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError> {
        self.region.alloc(len)
    }

    fn is_dmable(&self, addr: *const u8, len: usize) -> bool {
        self.region.contains(addr as usize, len)
    }

    fn grant_token(&self, addr: *const u8, len: usize) -> Option<u16> {
        self.region.grant_token(addr as usize, len)
    }

    fn register(&mut self, node: NodeId, addr: u64, len: usize) -> Result<RegId, DmaError> {
        let started = monotonic_ns();
        if len == 0 {
            return Err(DmaError::Invalid);
        }
        let end = addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        let registration = self.map_range(node, addr, end)?;
        let id = self.next_reg;
        self.next_reg += 1;
        self.registrations.insert(id, registration);
        spin_until(started + self.timing.registration_ns);
        Ok(RegId(id))
    }

    fn register_window(
        &mut self,
        node: NodeId,
        addr: u64,
        len: usize,
        window: usize,
    ) -> Result<(RegId, u64, usize), DmaError> {
        let end = addr
            .checked_add(len.max(1) as u64)
            .ok_or(DmaError::LengthOverflow)?;
        let (_, base, seg_end) = self.segment_of(node, addr, end)?;
        let window = (window.max(PAGE_SIZE as usize) as u64).next_power_of_two();
        let start = (addr & !(window - 1)).max(base);
        let stop = end
            .checked_next_multiple_of(window)
            .map_or(seg_end, |e| e.min(seg_end));
        let covered = (stop - start) as usize;
        Ok((self.register(node, start, covered)?, start, covered))
    }

    /// The segment's mapping stays valid while its owner lives (segments
    /// never shrink): the route is taken again from the generations, at
    /// the model's registration cost.
    fn revalidate(&mut self, reg: RegId) -> Result<(), DmaError> {
        let started = monotonic_ns();
        self.registrations
            .get_mut(&reg.0)
            .ok_or(DmaError::NotRegistered)?
            .take_snapshot()?;
        spin_until(started + self.timing.registration_ns);
        Ok(())
    }

    fn deregister(&mut self, reg: RegId) -> Result<(), DmaError> {
        self.registrations
            .remove(&reg.0)
            .map(drop)
            .ok_or(DmaError::NotRegistered)
    }

    fn forget_node(&mut self, node: NodeId) {
        self.registrations.retain(|_, r| r.node != node);
        self.nodes.remove(&node);
    }

    fn put(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError> {
        self.transfer(
            Direction::Put,
            local as usize,
            len,
            (reg, remote_addr, None),
        )
    }

    fn put_granted(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: u16,
    ) -> Result<DmaId, DmaError> {
        let remote = (reg, remote_addr, Some(token));
        self.transfer(Direction::Put, local as usize, len, remote)
    }

    fn get_granted(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: u16,
    ) -> Result<DmaId, DmaError> {
        let remote = (reg, remote_addr, Some(token));
        self.transfer(Direction::Get, local as usize, len, remote)
    }

    fn get(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError> {
        self.transfer(
            Direction::Get,
            local as usize,
            len,
            (reg, remote_addr, None),
        )
    }

    fn resolve_key(&mut self, node: NodeId, key: u64) -> Result<Exposure, DmaError> {
        self.find_key(node, key).map(|found| found.exposure)
    }

    fn lease_key(&mut self, node: NodeId, key: u64) -> Option<KeyLease> {
        let found = self.find_key(node, key).ok()?;
        let table = self.nodes.get(&node)?.keys.clone()?;
        Some(KeyLease::new(table, found))
    }

    fn atomic(
        &mut self,
        target: ElementRange,
        update: &mut dyn FnMut(usize, u64) -> Option<u64>,
        old: &mut dyn FnMut(usize, u64),
    ) -> Result<DmaId, DmaError> {
        let ElementRange {
            reg,
            remote_addr,
            width,
            count,
        } = target;
        let len = width.checked_mul(count).ok_or(DmaError::LengthOverflow)?;
        let remote_end = remote_addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        self.pinned(reg, remote_addr, remote_end, None, |at| {
            // SAFETY: `[at, at + len)` lies inside the registration's mapping
            // (`pinned`); update_elements checks the alignment.
            unsafe { crate::atomic::update_elements(at, width, count, update, old) }
        })?;
        Ok(self.complete_after(len, None))
    }

    fn loads_reach(&self, _node: NodeId) -> bool {
        true
    }

    fn load_store(
        &mut self,
        reg: RegId,
        remote_addr: u64,
        len: usize,
        store: bool,
        access: &mut dyn FnMut(*mut u8),
    ) -> Result<(), DmaError> {
        // The native profile models nothing: no clock read.
        let cost = self.timing.load_store_ns(len, store);
        let started = if cost > 0 { monotonic_ns() } else { 0 };
        let remote_end = remote_addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        self.pinned(reg, remote_addr, remote_end, None, |at| {
            access(at);
            Ok(())
        })?;
        if cost > 0 {
            spin_until(started + cost);
        }
        Ok(())
    }

    fn lease_registration(&mut self, reg: RegId) -> Option<RegLease> {
        self.lease(reg)
    }

    fn moved_async(&self) -> u64 {
        self.moved_async
    }

    fn poll(&mut self) -> Option<DmaId> {
        let (done_at, id, copy) = self.in_flight.front()?;
        if let Some(copy) = copy.as_ref().filter(|c| !c.done()) {
            // Waited for: help the mover.
            if !copy.wanted() {
                return None;
            }
            copy.work();
            if !copy.done() {
                return None;
            }
        }
        if *done_at != 0 && monotonic_ns() < *done_at {
            return None;
        }
        let id = *id;
        self.in_flight.pop_front();
        Some(id)
    }
}
