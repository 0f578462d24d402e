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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use unimem_dma::{DmaBuf, DmaEngine, DmaError, DmaId, Exposure, RegId, ShmDmaEngine};
use unimem_mailbox::{NicAddr, NodeId};

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
}

/// The DMA engine of this process's node.
pub struct NodeDma {
    shm: ShmDmaEngine,
    net: Option<NetHalf>,
}

impl NodeDma {
    pub fn new(shm: ShmDmaEngine, nic: Option<Arc<Nic>>) -> NodeDma {
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
        let net = self.net()?;
        net.nic.segment(nic, start, end - start)?;
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
        net.nic
            .rma(write, net.slot, id, local, len, r.nic, addr, segment.key)?;
        net.in_flight += 1;
        Ok(id)
    }
}

impl DmaEngine for NodeDma {
    type Node = NodeId;

    fn local_node(&self) -> NodeId {
        self.shm.local_node()
    }

    fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError> {
        self.shm.alloc(len)
    }

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

    fn grant_token(&self, addr: *const u8, len: usize) -> Option<u16> {
        self.shm.grant_token(addr, len)
    }

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

    fn poll(&mut self) -> Option<DmaId> {
        if let Some(id) = self.shm.poll() {
            return Some(id);
        }
        let net = self.net.as_mut()?;
        if net.done.is_empty() && net.in_flight > 0 {
            net.nic.progress();
            net.nic.take_done(net.slot, &mut net.done);
        }
        let id = net.done.pop_front()?;
        net.in_flight = net.in_flight.saturating_sub(1);
        Some(id)
    }

    fn atomic(
        &mut self,
        reg: RegId,
        remote_addr: u64,
        width: usize,
        count: usize,
        update: &mut dyn FnMut(usize, u64) -> Option<u64>,
        old: &mut dyn FnMut(usize, u64),
    ) -> Result<DmaId, DmaError> {
        if reg.0 & NET_REG == 0 {
            return self.shm.atomic(reg, remote_addr, width, count, update, old);
        }
        Err(DmaError::OutOfBounds)
    }

    fn atomics_reach(&self, node: NodeId) -> bool {
        !node.is_remote()
    }

    fn resolve_key(&mut self, node: NodeId, key: u64) -> Result<Exposure, DmaError> {
        if !node.is_remote() {
            return self.shm.resolve_key(node, key);
        }
        let nic = node.nic.ok_or(DmaError::NoSuchNode)?;
        self.net()?.nic.key(nic, key)
    }
}
