//! A registration: made by mapping the registered part of a peer's
//! segment, with the generations of its pages then, and checked against
//! them (and a grant's token) at every access.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use unimem_mailbox::profile::spin_until;
use unimem_mailbox::shm::{SharedRange, HEADER_SIZE};
use unimem_mailbox::{NodeId, TimingModel};

use super::{ShmDmaEngine, PAGE_SIZE};
use crate::error::DmaError;
use crate::gens::{page_span, GenTable, Pin, GEN_PAGE};
use crate::region::segment_name;
use crate::RegId;
use unimem_mailbox::node::monotonic_ns;

/// A registered remote range and the local mapping that reaches it.
pub(super) struct Registration {
    pub(super) node: NodeId,
    /// Registered range in the remote node's address space.
    start: u64,
    end: u64,
    /// Page-aligned mapping that covers `[start, end)`.
    /// Shared with copies the mover thread has not finished.
    pub(super) mapping: Arc<SharedRange>,
    mapping_start: u64,
    /// The segment's generation table, the segment's first data address
    /// (page 0 of the table), and the generations of the registration's
    /// pages when it was made: a transfer checks the pages it touches.
    pub(super) gens: Arc<GenTable>,
    segment_base: u64,
    snapshot: Vec<u32>,
    /// Set when the registration goes (deregistered, its node forgotten)
    /// or is taken again (revalidated): its leases no longer hold.
    revoked: Arc<AtomicBool>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.revoked.store(true, Ordering::Release);
    }
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
    pub(super) fn take_snapshot(&mut self) -> Result<(), DmaError> {
        // Leases carry the snapshot they were given: a new one ends them.
        self.revoked.store(true, Ordering::Release);
        self.revoked = Arc::new(AtomicBool::new(false));
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

impl ShmDmaEngine {
    pub(super) fn map_range(
        &mut self,
        node: NodeId,
        addr: u64,
        end: u64,
    ) -> Result<Registration, DmaError> {
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
            revoked: Arc::new(AtomicBool::new(false)),
        };
        registration.take_snapshot()?;
        Ok(registration)
    }

    /// Runs `access` on where `[remote_addr, remote_end)` of registration
    /// `reg` is mapped here, if the range lies inside the registration and
    /// its owner freed none of it since the registration was made (and,
    /// with `granted`, since it granted it), with the owner's frees held
    /// off until `access` is done (`gens.rs`).
    pub(super) fn pinned(
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

    /// Where `[remote_addr, remote_end)` of registration `reg` is mapped
    /// here, pinned, if the range lies inside the registration and its
    /// owner freed none of it since it was made (and, with `granted`,
    /// since it granted it).
    #[inline]
    pub(super) fn pin_range(
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
}

/// A registration resolved once for a run of loads and stores by the CPU
/// (a peer's eager ring, stored into for every small message): what
/// [`ShmDmaEngine::load_store`](crate::DmaEngine::load_store) finds by
/// looking the registration up, kept, so that each access is the checks
/// alone, without the engine or its lock. Each access checks what the
/// engine's checks: the range inside the registration, and, under a pin of
/// the generation table, the pages' generations against the registration's
/// snapshot (a ring its owner freed is not written). A lease whose
/// registration went (deregistered, its node forgotten) or was taken again
/// refuses every access: the caller goes the engine's way, which says why.
pub struct RegLease {
    mapping: Arc<SharedRange>,
    gens: Arc<GenTable>,
    start: u64,
    end: u64,
    mapping_start: u64,
    /// The segment's page of `start`, its address, and the snapshot from
    /// it on.
    first_page: usize,
    pages_at: u64,
    snapshot: Box<[u32]>,
    revoked: Arc<AtomicBool>,
    /// The engine's model, unless it models nothing (native).
    timed: Option<TimingModel>,
}

impl std::fmt::Debug for RegLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegLease")
            .field("start", &self.start)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl RegLease {
    /// Its registration went or was taken again: every access refuses
    /// (a holder leases the registration afresh).
    #[inline]
    pub fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Runs `access` on where `[remote_addr, remote_addr + len)` is mapped
    /// here, as [`crate::DmaEngine::load_store`] does (the same checks, the
    /// owner's frees held off until `access` returns, the same modeled
    /// cost); false, with nothing run, if any check fails or the lease no
    /// longer holds.
    #[inline(always)]
    pub fn access(
        &self,
        remote_addr: u64,
        len: usize,
        store: bool,
        access: impl FnOnce(*mut u8),
    ) -> bool {
        let Some(remote_end) = remote_addr.checked_add(len as u64) else {
            return false;
        };
        if remote_addr < self.start || remote_end > self.end || self.revoked.load(Ordering::Acquire)
        {
            return false;
        }
        // Inside the registration: its pages are the snapshot's, from the
        // page at `pages_at` on (shifts, not `page_span`'s general case).
        let from = (remote_addr - self.pages_at) as usize;
        let to = (remote_end - self.pages_at) as usize;
        let rel = from / GEN_PAGE;
        let Some(expected) = self.snapshot.get(rel..to.div_ceil(GEN_PAGE)) else {
            return false;
        };
        let first = self.first_page + rel;
        // The native profile models nothing: no clock read.
        if let Some(timing) = self.timed {
            let started = monotonic_ns();
            if !self.pinned_access(remote_addr, first, expected, access) {
                return false;
            }
            spin_until(started + timing.load_store_ns(len, store));
            return true;
        }
        self.pinned_access(remote_addr, first, expected, access)
    }

    /// The access under a pin, if pages `first..` still have the
    /// generations `expected`.
    #[inline(always)]
    fn pinned_access(
        &self,
        remote_addr: u64,
        first: usize,
        expected: &[u32],
        access: impl FnOnce(*mut u8),
    ) -> bool {
        {
            let _pin = self.gens.pin();
            if !self.gens.holds(first, expected) {
                return false;
            }
            let offset = (remote_addr - self.mapping_start) as usize;
            // SAFETY: the range lies inside the registration, hence inside
            // the mapping, which starts at mapping_start.
            access(unsafe { self.mapping.base().add(offset) });
        }
        true
    }
}

impl ShmDmaEngine {
    /// See [`crate::DmaEngine::lease_registration`].
    pub(super) fn lease(&self, reg: RegId) -> Option<RegLease> {
        let r = self.registrations.get(&reg.0)?;
        let (first_page, _) = r.pages(r.start, r.end);
        Some(RegLease {
            mapping: Arc::clone(&r.mapping),
            gens: Arc::clone(&r.gens),
            start: r.start,
            end: r.end,
            mapping_start: r.mapping_start,
            first_page,
            pages_at: r.segment_base + (first_page * GEN_PAGE) as u64,
            snapshot: r.snapshot.clone().into_boxed_slice(),
            revoked: Arc::clone(&r.revoked),
            // What `load_store_ns` reads: either makes accesses cost.
            timed: (self.timing.mailbox_latency_ns > 0 || self.timing.dma_bytes_per_sec > 0)
                .then_some(self.timing),
        })
    }
}
