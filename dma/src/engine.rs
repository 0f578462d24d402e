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

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use unimem_mailbox::node::monotonic_ns;
use unimem_mailbox::profile::spin_until;
use unimem_mailbox::shm::{SharedObject, SharedRange, HEADER_SIZE};
use unimem_mailbox::{IdMap, NodeId, Profile, TimingModel};

use crate::copier::{self, AsyncCopy};
use crate::error::DmaError;
use crate::gens::{page_span, GenTable, Pin};
use crate::keys::{self, Exposure, KeyLease};
use crate::region::{directory, directory_name, gen_table_name, segment_name, DmaBuf, DmaRegion};
use crate::{DmaEngine, DmaId, RegId};

const PAGE_SIZE: u64 = 4096;

/// A registered remote range and the local mapping that reaches it.
struct Registration {
    node: NodeId,
    /// Registered range in the remote node's address space.
    start: u64,
    end: u64,
    /// Page-aligned mapping that covers `[start, end)`.
    /// Shared with copies the mover thread has not finished.
    mapping: Arc<SharedRange>,
    mapping_start: u64,
    /// The segment's generation table, the segment's first data address
    /// (page 0 of the table), and the generations of the registration's
    /// pages when it was made: a transfer checks the pages it touches.
    gens: Arc<GenTable>,
    segment_base: u64,
    snapshot: Vec<u32>,
}

impl Registration {
    /// The first page (of the segment) of `[addr, end)`, which lies in the
    /// registration, and the range's page count.
    fn pages(&self, addr: u64, end: u64) -> (usize, usize) {
        page_span(
            (addr - self.segment_base) as usize,
            (end - self.segment_base) as usize,
        )
    }

    /// Takes the generations of the registration's pages now.
    fn take_snapshot(&mut self) -> Result<(), DmaError> {
        let (first, count) = self.pages(self.start, self.end);
        self.snapshot = self
            .gens
            .snapshot(first, count)
            .ok_or(DmaError::OutOfBounds)?;
        Ok(())
    }

    /// The generations the snapshot holds for pages `[first, first + count)`.
    fn expected(&self, first: usize, count: usize) -> &[u32] {
        let (reg_first, _) = self.pages(self.start, self.end);
        self.snapshot
            .get(first - reg_first..)
            .and_then(|pages| pages.get(..count))
            .unwrap_or(&[])
    }
}

/// A peer's directory, kept mapped while we hold registrations there.
struct RemoteNode {
    directory: SharedObject,
    /// Its key table, once a key of it was resolved.
    keys: Option<Arc<SharedObject>>,
    /// The key resolved last in it: a run of operations under one key
    /// checks that its slot is unchanged instead of looking it up again.
    last_key: Option<keys::Found>,
    /// Generation tables of its segments, by index, once registered in.
    gens: Vec<Option<Arc<GenTable>>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Put,
    Get,
}

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

    fn remote_node(&mut self, node: NodeId) -> Result<&RemoteNode, DmaError> {
        self.remote_node_mut(node).map(|remote| &*remote)
    }

    /// `node`, opened on first use; one hash of its id when known (every
    /// small one-sided operation asks).
    fn remote_node_mut(&mut self, node: NodeId) -> Result<&mut RemoteNode, DmaError> {
        // Shared memory reaches this host only.
        if node.is_remote() {
            return Err(DmaError::NoSuchNode);
        }
        if node.job != self.region.node().job || node.pid == 0 {
            return Err(DmaError::NoSuchNode);
        }
        match self.nodes.entry(node) {
            Entry::Occupied(known) => {
                if known.get().directory.header().is_closed() {
                    known.remove();
                    return Err(DmaError::DeadNode);
                }
                Ok(known.into_mut())
            }
            Entry::Vacant(new) => {
                // The name holds a pid; the nonce tells which process of
                // that pid. A directory of another incarnation, or a
                // foreign object under the name, is passed over for the
                // node's own (which may have an alternative name, see
                // `SharedObject::create_avoiding`).
                let directory = SharedObject::open_checked(&directory_name(&node), |header| {
                    header.owner_pid() == node.pid && header.owner_start() as u32 == node.nonce
                })
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ECONNREFUSED) => DmaError::DeadNode,
                    Some(libc::ENOENT) | Some(libc::EAGAIN) => DmaError::NoSuchNode,
                    Some(libc::ESTALE) | Some(libc::EPERM) => {
                        if node.is_alive() {
                            DmaError::NoSuchNode
                        } else {
                            DmaError::DeadNode
                        }
                    }
                    _ => DmaError::Io(e),
                })?;
                Ok(new.insert(RemoteNode {
                    directory,
                    keys: None,
                    last_key: None,
                    gens: Vec::new(),
                }))
            }
        }
    }

    /// The segments of `node`'s dmable memory (its own node included), as
    /// its directory says: first data address and committed length of
    /// each, entries that cannot be a segment left out. The network
    /// backend registers its own with the transport from this.
    pub fn segments(&mut self, node: NodeId) -> Result<Vec<(u64, u64)>, DmaError> {
        let remote = self.remote_node(node)?;
        let dir = directory(&remote.directory);
        let count = dir.count.load(Ordering::Acquire) as usize;
        Ok(dir.segments[..count.min(dir.segments.len())]
            .iter()
            .map(|entry| {
                (
                    entry.base.load(Ordering::Relaxed),
                    entry.len.load(Ordering::Acquire),
                )
            })
            .filter(|&(base, len)| {
                base.is_multiple_of(PAGE_SIZE) && base.checked_add(len).is_some()
            })
            .collect())
    }

    /// The segment of `node` that holds `[addr, end)`: its index, first
    /// data address and committed end.
    fn segment_of(
        &mut self,
        node: NodeId,
        addr: u64,
        end: u64,
    ) -> Result<(usize, u64, u64), DmaError> {
        let remote = self.remote_node(node)?;
        // Everything in the directory is the peer's to write: a count past
        // the table, an entry that wraps or is not page-aligned, are ignored
        // (and what a sane entry claims is checked against the segment
        // object itself when it is mapped).
        let dir = directory(&remote.directory);
        let count = dir.count.load(Ordering::Acquire) as usize;
        (0..count.min(dir.segments.len()))
            .find_map(|index| {
                let entry = &dir.segments[index];
                let base = entry.base.load(Ordering::Relaxed);
                let len = entry.len.load(Ordering::Acquire);
                let seg_end = base.checked_add(len)?;
                (base.is_multiple_of(PAGE_SIZE) && addr >= base && end <= seg_end)
                    .then_some((index, base, seg_end))
            })
            .ok_or(DmaError::OutOfBounds)
    }

    fn map_range(&mut self, node: NodeId, addr: u64, end: u64) -> Result<Registration, DmaError> {
        let (index, base, _) = self.segment_of(node, addr, end)?;
        let remote = &self.nodes[&node];
        let owner = (
            remote.directory.header().owner_pid(),
            remote.directory.header().owner_start(),
        );
        let mapping_start = addr & !(PAGE_SIZE - 1);
        let mapping_end = end
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(DmaError::OutOfBounds)?
            .max(mapping_start + PAGE_SIZE);
        let file_offset = (mapping_start - base)
            .checked_add(HEADER_SIZE as u64)
            .and_then(|offset| usize::try_from(offset).ok())
            .ok_or(DmaError::OutOfBounds)?;
        let mapping_len =
            usize::try_from(mapping_end - mapping_start).map_err(|_| DmaError::OutOfBounds)?;
        let mapping =
            SharedRange::map(&segment_name(&node, index), owner, file_offset, mapping_len)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::ESTALE) => DmaError::DeadNode,
                    _ if e.kind() == std::io::ErrorKind::InvalidData => DmaError::OutOfBounds,
                    _ => DmaError::Io(e),
                })?;
        let gens = self.gen_table(node, index, owner)?;
        let mut registration = Registration {
            node,
            start: addr,
            end,
            mapping: Arc::new(mapping),
            mapping_start,
            gens,
            segment_base: base,
            snapshot: Vec::new(),
        };
        registration.take_snapshot()?;
        Ok(registration)
    }

    /// The generation table of `node`'s segment `index`, opened on first
    /// use (its owner must be the segment's).
    fn gen_table(
        &mut self,
        node: NodeId,
        index: usize,
        owner: (u32, u64),
    ) -> Result<Arc<GenTable>, DmaError> {
        let remote = self.nodes.get_mut(&node).ok_or(DmaError::NoSuchNode)?;
        if let Some(Some(table)) = remote.gens.get(index) {
            return Ok(Arc::clone(table));
        }
        let object = SharedObject::open_checked(&gen_table_name(&node, index), |header| {
            header.owner_pid() == owner.0 && header.owner_start() == owner.1
        })
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESTALE) => DmaError::DeadNode,
            _ => DmaError::Io(e),
        })?;
        let table = Arc::new(GenTable::from_peer(object).ok_or(DmaError::OutOfBounds)?);
        if remote.gens.len() <= index {
            remote.gens.resize(index + 1, None);
        }
        remote.gens[index] = Some(Arc::clone(&table));
        Ok(table)
    }

    /// A put or get of `len` bytes at `local` with `remote_addr` of `reg`
    /// (granted with a token, or not). A transfer granted is a
    /// rendezvous's, copied here by its caller; any other of at least
    /// `async_min` bytes goes to the mover (its caller computes on).
    fn transfer(
        &mut self,
        direction: Direction,
        local: usize,
        len: usize,
        (reg, remote_addr, granted): (RegId, u64, Option<u16>),
    ) -> Result<DmaId, DmaError> {
        let remote_end = remote_addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        local.checked_add(len).ok_or(DmaError::LengthOverflow)?;
        if len > 0 && !self.region.contains(local, len) {
            return Err(DmaError::LocalNotDmable);
        }
        if self.async_min > 0 && len >= self.async_min && granted.is_none() {
            return self.transfer_async(
                direction,
                local,
                len,
                reg,
                (remote_addr, remote_end),
                granted,
            );
        }
        self.pinned(reg, remote_addr, remote_end, granted, |remote| {
            // SAFETY: `[remote, remote + len)` lies inside the registration's
            // mapping (`pinned`) and `[local, local + len)` inside our dmable
            // region; the two never overlap, being different mappings, even
            // of the same node.
            unsafe {
                match direction {
                    Direction::Put => {
                        std::ptr::copy_nonoverlapping(local as *const u8, remote, len)
                    }
                    Direction::Get => std::ptr::copy_nonoverlapping(remote, local as *mut u8, len),
                }
            }
            Ok(())
        })?;
        Ok(self.complete_after(len, None))
    }

    /// `transfer` by the mover thread: checked and pinned now, copied
    /// there; `poll` reports it once copied.
    fn transfer_async(
        &mut self,
        direction: Direction,
        local: usize,
        len: usize,
        reg: RegId,
        (remote_addr, remote_end): (u64, u64),
        granted: Option<u16>,
    ) -> Result<DmaId, DmaError> {
        let (pin, remote, registration) = self.pin_range(reg, remote_addr, remote_end, granted)?;
        let pin = pin.detach(Arc::clone(&registration.gens));
        let hold = Box::new((
            pin,
            Arc::clone(&registration.mapping),
            Arc::clone(&self.region),
        ));
        let (src, dst) = match direction {
            Direction::Put => (local as *const u8, remote),
            Direction::Get => (remote as *const u8, local as *mut u8),
        };
        // SAFETY: our region and the remote mapping are different
        // mappings; `hold` keeps both mapped and the remote pages pinned,
        // the caller's buffer is valid until the completion (caller).
        let copy = unsafe { AsyncCopy::new(src, dst, len, hold) };
        if copier::submit(&copy) {
            self.moved_async += 1;
        } else {
            copy.work();
        }
        Ok(self.complete_after(len, Some(copy)))
    }

    /// Runs `access` on where `[remote_addr, remote_end)` of registration
    /// `reg` is mapped here, if the range lies inside the registration and
    /// its owner freed none of it since the registration was made (and,
    /// with `granted`, since it granted it), with the owner's frees held
    /// off until `access` is done (`gens.rs`).
    fn pinned(
        &self,
        reg: RegId,
        remote_addr: u64,
        remote_end: u64,
        granted: Option<u16>,
        access: impl FnOnce(*mut u8) -> Result<(), DmaError>,
    ) -> Result<(), DmaError> {
        let (_pin, at, _) = self.pin_range(reg, remote_addr, remote_end, granted)?;
        access(at)
    }

    /// `key` in `node`'s key table (see [`DmaEngine::resolve_key`]).
    fn find_key(&mut self, node: NodeId, key: u64) -> Result<keys::Found, DmaError> {
        let remote = self.remote_node_mut(node)?;
        // A table the owner dropped (its last key went) and made again
        // is a new object under the same name: look again.
        if remote.keys.as_ref().is_some_and(|t| t.header().is_closed()) {
            remote.keys = None;
            remote.last_key = None;
        }
        if remote.keys.is_none() {
            remote.keys = Some(Arc::new(keys::open_table(&node)?));
        }
        let table = remote.keys.as_ref().expect("opened above");
        if let Some(found) = remote.last_key.filter(|found| found.key == key) {
            if keys::still(table, &found) {
                return Ok(found);
            }
        }
        let found = keys::find(table, key);
        remote.last_key = found.as_ref().ok().copied();
        found
    }

    /// Where `[remote_addr, remote_end)` of registration `reg` is mapped
    /// here, pinned, if the range lies inside the registration and its
    /// owner freed none of it since it was made (and, with `granted`,
    /// since it granted it).
    fn pin_range(
        &self,
        reg: RegId,
        remote_addr: u64,
        remote_end: u64,
        granted: Option<u16>,
    ) -> Result<(Pin<'_>, *mut u8, &Registration), DmaError> {
        let registration = self
            .registrations
            .get(&reg.0)
            .ok_or(DmaError::NotRegistered)?;
        if remote_addr < registration.start || remote_end > registration.end {
            return Err(DmaError::OutOfBounds);
        }
        let (first, count) = registration.pages(remote_addr, remote_end);
        let expected = registration.expected(first, count);
        let pin = registration.gens.pin();
        let (current, token) = registration
            .gens
            .check(first, expected)
            .ok_or(DmaError::OutOfBounds)?;
        if !current {
            return Err(DmaError::Stale);
        }
        if granted.is_some_and(|granted| granted != token) {
            return Err(DmaError::Revoked);
        }
        let offset = (remote_addr - registration.mapping_start) as usize;
        // SAFETY: the registered range lies inside the mapping, which starts
        // at mapping_start: `offset` is inside it.
        let at = unsafe { registration.mapping.base().add(offset) };
        Ok((pin, at, registration))
    }

    /// Queues the completion of a transfer of `len` bytes at its modeled
    /// time (and, for `copy`, once the mover has copied it).
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
        reg: RegId,
        remote_addr: u64,
        width: usize,
        count: usize,
        update: &mut dyn FnMut(usize, u64) -> Option<u64>,
        old: &mut dyn FnMut(usize, u64),
    ) -> Result<DmaId, DmaError> {
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
