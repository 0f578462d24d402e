//! The DMA engine of a node that has peers on this host and on others: the
//! emulation's for memory of this host, the network interface's RMA for
//! memory of other hosts.
//!
//! A registration of another host's memory is checked against the segments
//! its owner opened to the network (its directory): a put or get moves
//! bytes only inside one of them. What the network does not carry: the
//! emulation's check of a grant's token at the moment of the put (the
//! owner's page generations are in its host's shared memory), and the
//! atomic unit, so atomics on another host's memory go to the owner's
//! progress, as on memory that is not dmable.
//!
//! A put of at most `net_write_max` bytes (16 KiB by default and at most,
//! less over a transport that keeps only shorter messages in order; 0:
//! none) travels in a write packet rather
//! than as the transport's RMA: it is copied, done at once, and leaves in
//! one transport message with the mailbox messages sent after it (the
//! protocol announces data it put: an eager message is then one message
//! on the network). The receiver checks it as the transport checks a
//! write: inside a segment it opened, under that segment's key.
//!
//! Under a timing profile (`paper`) the board's figures are a floor: a
//! transfer over the network completes no earlier than the modeled engine
//! would have finished it (transfers queue behind each other, as on the
//! emulation), and a registration returns no earlier than its modeled
//! cost. The network may only make them slower.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use unimem_dma::{DmaBuf, DmaEngine, DmaError, DmaId, Exposure, RegId, ShmDmaEngine};
use unimem_mailbox::node::monotonic_ns;
use unimem_mailbox::profile::spin_until;
use unimem_mailbox::{NicAddr, NodeId, TimingModel};

use super::nic::Nic;

/// Registrations and transfers of the network half carry this bit.
const NET_REG: u64 = 1 << 63;
const NET_DMA: u64 = 1 << 39;

/// A registration of another host's memory.
#[derive(Clone, Copy)]
struct NetRegistration {
    node: NodeId,
    nic: NicAddr,
    start: u64,
    end: u64,
}

struct NetHalf {
    nic: Arc<Nic>,
    /// Our slot at the interface: where our completions wait.
    slot: u16,
    registrations: HashMap<u64, NetRegistration>,
    next_reg: u64,
    next_id: u64,
    done: VecDeque<DmaId>,
    /// Transfers in flight: polling the interface is needed only then.
    in_flight: usize,
    /// The board's modeled engine, a floor under the network's.
    floor: ModeledEngine,
}

impl NetHalf {
    /// The first completed transfer whose modeled time has come.
    #[inline]
    fn pop_done(&mut self) -> Option<DmaId> {
        let at = self.floor.first_due(&self.done, monotonic_ns())?;
        let id = self.done.remove(at)?;
        self.floor.forget(id);
        self.in_flight = self.in_flight.saturating_sub(1);
        Some(id)
    }
}

/// When the modeled engine of a timing profile would finish the transfers
/// it was given: one after the other, each its start-up cost plus its
/// length at the modeled bandwidth. Under `native` it models nothing.
struct ModeledEngine {
    timing: TimingModel,
    /// When it finishes its last queued transfer (ns, monotonic clock).
    busy_until: u64,
    /// Modeled completion time of each transfer in flight.
    due: HashMap<u64, u64>,
}

impl ModeledEngine {
    fn new(timing: TimingModel) -> ModeledEngine {
        ModeledEngine {
            timing,
            busy_until: 0,
            due: HashMap::new(),
        }
    }

    /// Transfers done but not yet due wait; under `native` none are.
    fn holds_any(&self) -> bool {
        !self.due.is_empty()
    }

    /// `id`, of `len` bytes, was submitted at `now` (read only under a
    /// profile).
    fn submit(&mut self, id: DmaId, len: usize, now: impl FnOnce() -> u64) {
        if let Some(due) = self.timing.queue_transfer(&mut self.busy_until, len, now) {
            self.due.insert(id.0, due);
        }
    }

    /// Where in `done` (transfers the network finished) the first one is
    /// whose modeled time has come by `now`.
    fn first_due(&self, done: &VecDeque<DmaId>, now: u64) -> Option<usize> {
        if self.due.is_empty() {
            return (!done.is_empty()).then_some(0);
        }
        done.iter()
            .position(|id| self.due.get(&id.0).is_none_or(|&t| t <= now))
    }

    fn forget(&mut self, id: DmaId) {
        self.due.remove(&id.0);
    }
}

/// The DMA engine of this process's node.
pub struct NodeDma {
    shm: ShmDmaEngine,
    net: Option<NetHalf>,
}

impl NodeDma {
    pub fn new(shm: ShmDmaEngine, nic: Option<Arc<Nic>>) -> NodeDma {
        let timing = shm.timing();
        NodeDma {
            shm,
            net: nic.map(|nic| NetHalf {
                slot: nic.engine_slot(),
                nic,
                registrations: HashMap::new(),
                next_reg: 0,
                next_id: 0,
                done: VecDeque::new(),
                in_flight: 0,
                floor: ModeledEngine::new(timing),
            }),
        }
    }

    /// The emulated engine (its region).
    pub fn shm(&self) -> &ShmDmaEngine {
        &self.shm
    }

    fn net(&mut self) -> Result<&mut NetHalf, DmaError> {
        self.net.as_mut().ok_or(DmaError::NoSuchNode)
    }

    /// Registers `[start, end)` of `node` (of another host) once it lies in
    /// one of the segments it opened to the network.
    fn register_net(&mut self, node: NodeId, start: u64, end: u64) -> Result<RegId, DmaError> {
        let nic = node.nic.ok_or(DmaError::NoSuchNode)?;
        let started = monotonic_ns();
        let net = self.net()?;
        net.nic.segment(nic, start, end - start)?;
        spin_until(started + net.floor.timing.registration_ns);
        net.next_reg += 1;
        let id = NET_REG | net.next_reg;
        net.registrations.insert(
            id,
            NetRegistration {
                node,
                nic,
                start,
                end,
            },
        );
        Ok(RegId(id))
    }

    #[inline]
    fn transfer(
        &mut self,
        write: bool,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError> {
        if !self.shm.is_dmable(local, len) {
            return Err(DmaError::LocalNotDmable);
        }
        let net = self.net()?;
        let r = *net
            .registrations
            .get(&reg.0)
            .ok_or(DmaError::NotRegistered)?;
        let end = remote_addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        if remote_addr < r.start || end > r.end {
            return Err(DmaError::OutOfBounds);
        }
        let (segment, virt_addr) = net.nic.segment(r.nic, remote_addr, len as u64)?;
        let addr = if virt_addr {
            remote_addr
        } else {
            remote_addr - segment.base
        };
        net.next_id = (net.next_id + 1) % NET_DMA;
        let id = DmaId(NET_DMA | net.next_id);
        if write && len <= net.nic.write_max && net.nic.write_max > 0 {
            // SAFETY: `local` is `len` bytes of our dmable memory (checked
            // above), valid for this call (the engine's contract).
            let bytes = unsafe { std::slice::from_raw_parts(local, len) };
            // Copied into the packet: done for the protocol now, and its
            // announcement will travel in the same transport message.
            net.nic
                .write_in_packet(r.nic, segment.key, remote_addr, bytes)?;
            net.done.push_back(id);
        } else {
            net.nic
                .rma(write, net.slot, id, local, len, r.nic, addr, segment.key)?;
        }
        net.in_flight += 1;
        net.floor.submit(id, len, monotonic_ns);
        Ok(id)
    }
}

impl DmaEngine for NodeDma {
    type Node = NodeId;

    #[inline]
    fn local_node(&self) -> NodeId {
        self.shm.local_node()
    }

    fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError> {
        self.shm.alloc(len)
    }

    #[inline]
    fn is_dmable(&self, addr: *const u8, len: usize) -> bool {
        self.shm.is_dmable(addr, len)
    }

    fn register(&mut self, node: NodeId, addr: u64, len: usize) -> Result<RegId, DmaError> {
        if !node.is_remote() {
            return self.shm.register(node, addr, len);
        }
        if len == 0 {
            return Err(DmaError::Invalid);
        }
        let end = addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        self.register_net(node, addr, end)
    }

    fn register_window(
        &mut self,
        node: NodeId,
        addr: u64,
        len: usize,
        window: usize,
    ) -> Result<(RegId, u64, usize), DmaError> {
        if !node.is_remote() {
            return self.shm.register_window(node, addr, len, window);
        }
        let end = addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        let nic = node.nic.ok_or(DmaError::NoSuchNode)?;
        let (segment, _) = self.net()?.nic.segment(nic, addr, len as u64)?;
        // The window's stretch, within the segment that holds the range.
        let window = window.max(1) as u64;
        let start = (addr - addr % window).max(segment.base);
        let stretch_end = end
            .div_ceil(window)
            .saturating_mul(window)
            .min(segment.base + segment.len)
            .max(end);
        let reg = self.register_net(node, start, stretch_end)?;
        Ok((reg, start, (stretch_end - start) as usize))
    }

    fn revalidate(&mut self, reg: RegId) -> Result<(), DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.revalidate(reg);
        }
        // Network registrations are never found stale (see the module).
        Ok(())
    }

    fn deregister(&mut self, reg: RegId) -> Result<(), DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.deregister(reg);
        }
        self.net()?
            .registrations
            .remove(&reg.0)
            .map(drop)
            .ok_or(DmaError::NotRegistered)
    }

    fn forget_node(&mut self, node: NodeId) {
        if !node.is_remote() {
            return self.shm.forget_node(node);
        }
        if let Some(net) = self.net.as_mut() {
            net.registrations.retain(|_, r| r.node != node);
            if let Some(nic) = node.nic {
                if !net.registrations.values().any(|r| r.nic == nic) {
                    net.nic.forget(nic);
                }
            }
        }
    }

    #[inline]
    fn put(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.put(local, len, reg, remote_addr);
        }
        self.transfer(true, local.cast_mut(), len, reg, remote_addr)
    }

    #[inline]
    fn put_granted(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: u16,
    ) -> Result<DmaId, DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.put_granted(local, len, reg, remote_addr, token);
        }
        self.transfer(true, local.cast_mut(), len, reg, remote_addr)
    }

    #[inline]
    fn grant_token(&self, addr: *const u8, len: usize) -> Option<u16> {
        self.shm.grant_token(addr, len)
    }

    #[inline]
    fn get(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.get(local, len, reg, remote_addr);
        }
        self.transfer(false, local, len, reg, remote_addr)
    }

    #[inline]
    fn get_granted(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: u16,
    ) -> Result<DmaId, DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.get_granted(local, len, reg, remote_addr, token);
        }
        // Offers are made to peers of this host only (their memory is one
        // load away): across hosts the transfer goes by grants.
        Err(DmaError::NoLoadStore)
    }

    #[inline]
    fn poll(&mut self) -> Option<DmaId> {
        if let Some(id) = self.shm.poll() {
            return Some(id);
        }
        let net = self.net.as_mut()?;
        // Under a profile, transfers done but not yet due wait in `done`
        // while the others are polled for.
        let waiting = net.done.is_empty() || net.floor.holds_any();
        if waiting && net.done.len() < net.in_flight {
            net.nic.progress();
            net.nic.take_done(net.slot, &mut net.done);
        }
        net.pop_done()
    }

    #[inline]
    fn atomic(
        &mut self,
        target: unimem_dma::ElementRange,
        update: &mut dyn FnMut(usize, u64) -> Option<u64>,
        old: &mut dyn FnMut(usize, u64),
    ) -> Result<DmaId, DmaError> {
        if target.reg.0 & NET_REG == 0 {
            return self.shm.atomic(target, update, old);
        }
        Err(DmaError::OutOfBounds)
    }

    #[inline]
    fn loads_reach(&self, node: NodeId) -> bool {
        !node.is_remote()
    }

    #[inline]
    fn moved_async(&self) -> u64 {
        self.shm.moved_async()
    }

    #[inline]
    fn load_store(
        &mut self,
        reg: RegId,
        remote_addr: u64,
        len: usize,
        store: bool,
        access: &mut dyn FnMut(*mut u8),
    ) -> Result<(), DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.load_store(reg, remote_addr, len, store, access);
        }
        Err(DmaError::NoLoadStore)
    }

    #[inline]
    fn lease_registration(&mut self, reg: RegId) -> Option<unimem_dma::RegLease> {
        if reg.0 & NET_REG == 0 {
            return self.shm.lease_registration(reg);
        }
        None
    }

    #[inline]
    fn atomics_reach(&self, node: NodeId) -> bool {
        !node.is_remote()
    }

    #[inline]
    fn resolve_key(&mut self, node: NodeId, key: u64) -> Result<Exposure, DmaError> {
        if !node.is_remote() {
            return self.shm.resolve_key(node, key);
        }
        let nic = node.nic.ok_or(DmaError::NoSuchNode)?;
        self.net()?.nic.key(nic, key)
    }

    #[inline]
    fn lease_key(&mut self, node: NodeId, key: u64) -> Option<unimem_dma::KeyLease> {
        // A node of another host has no table here to look at.
        if node.is_remote() {
            return None;
        }
        self.shm.lease_key(node, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unimem_mailbox::Profile;

    #[test]
    fn native_models_nothing() {
        let mut floor = ModeledEngine::new(Profile::Native.timing());
        floor.submit(DmaId(1), 1 << 20, || 0);
        assert!(!floor.holds_any());
        let done = VecDeque::from([DmaId(1)]);
        assert_eq!(floor.first_due(&done, 0), Some(0));
        assert_eq!(floor.first_due(&VecDeque::new(), 0), None);
    }

    #[test]
    fn paper_transfers_are_due_at_the_boards_time_one_after_the_other() {
        let mut floor = ModeledEngine::new(Profile::Paper.timing());
        // 1 MB at 1 GB/s: 1 ms plus 1 us of start-up, then the same again
        // behind it.
        floor.submit(DmaId(1), 1_000_000, || 5_000);
        floor.submit(DmaId(2), 1_000_000, || 5_000);
        let (first, second) = (5_000 + 1_001_000, 5_000 + 2_002_000);
        // The network finished both at once, long before the board would.
        let done = VecDeque::from([DmaId(1), DmaId(2)]);
        assert_eq!(floor.first_due(&done, 10_000), None);
        assert_eq!(floor.first_due(&done, first - 1), None);
        assert_eq!(floor.first_due(&done, first), Some(0));
        floor.forget(DmaId(1));
        let done = VecDeque::from([DmaId(2)]);
        assert_eq!(floor.first_due(&done, second - 1), None);
        assert_eq!(floor.first_due(&done, second), Some(0));
        floor.forget(DmaId(2));
        assert!(!floor.holds_any());
    }

    #[test]
    fn a_transfer_after_an_idle_engine_starts_when_submitted() {
        let mut floor = ModeledEngine::new(Profile::Paper.timing());
        floor.submit(DmaId(1), 1_000, || 0);
        floor.forget(DmaId(1));
        floor.submit(DmaId(2), 1_000, || 1_000_000);
        let done = VecDeque::from([DmaId(2)]);
        // 1 us of start-up and 1 us for 1000 bytes, from its submission.
        assert_eq!(floor.first_due(&done, 1_001_999), None);
        assert_eq!(floor.first_due(&done, 1_002_000), Some(0));
    }
}
