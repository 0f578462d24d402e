//! The direct path of small one-sided operations: a write, read or atomic
//! of at most the inject size to dmable memory of a node of this host is
//! done inside its call by the CPU's own loads and stores on the mapping
//! the registration cache already holds (Unimem's unified addressing,
//! [`unimem_dma::DmaEngine::load_store`]), and completes there: no
//! operation object, no DMA waiter, nothing for the target to do.
//!
//! It checks what the general path checks, before a byte moves: the key in
//! the target's table (rights, range, alignment of atomics) and the page
//! generations of the registration. It takes only the case where nothing
//! is in doubt; anything else goes the general path untouched, which
//! refuses, renews or hands over as it always has: the target's node not
//! yet known, a refused key, memory that is not dmable (served by the
//! target), a stale registration (renewed there after the key is asked
//! again), a node of another host, an atomic behind atomics the target
//! still has to apply (`FI_ORDER_ATOMIC_*`) or behind writes of ours not
//! yet finished (a signal after a put).
//!
//! A run of operations to one peer under one key checks less each time:
//! the peer's [`Lane`] keeps the key as resolved (a lease whose slot in the
//! owner's table is one load to check again) and the registration used
//! with it. The key's range and rights are still checked on every
//! operation, and the registration and page generations by the engine
//! (`load_store`); a lane whose key changed is not used, and one whose
//! registration was dropped or went stale is replaced, by one resolved and
//! registered afresh, before anything moves.
//!
//! Completion: on return the bytes are in the target's memory (a write,
//! an atomic) or here (a read, an atomic's old values), which is delivery
//! complete, so every completion level holds. RMA writes and reads are not
//! ordered with each other (`fi_info` says so), so one done at once may
//! pass an earlier one of the general path still in flight; an atomic may
//! not pass a write.

use unimem_dma::{Access, DmaEngine, DmaError, RegId};

use super::atomic::{update, AtomicReq};
use super::{resolve_access, RmaReq};
use crate::atomic::{set_element, AtomicCall, AtomicOp, ATOMIC_MAX_BYTES};
use crate::dma::DmaSession;
use crate::iov::{gather, scatter};
use crate::matching::IovList;
use crate::messenger::peers::Lane;
use crate::messenger::{Addr, Backend, Messenger, PeerIdx};
use crate::{PostError, RmaKind};

/// What the target's key granted a direct operation.
struct Granted {
    /// The target's address of byte 0.
    target: u64,
    reg: RegId,
    /// The key counts remote accesses: tell the target once done.
    notify: bool,
}

impl<B: Backend> Messenger<B> {
    /// Does write or read `req` of `len` bytes with `peer` at once, if it
    /// may go the direct path; false (nothing done) if not.
    ///
    /// # Safety
    /// `req.iov` must be valid for `len` bytes during the call.
    pub(crate) unsafe fn rma_direct(
        &mut self,
        kind: RmaKind,
        peer: PeerIdx,
        req: &RmaReq<Addr<B>>,
        len: usize,
    ) -> bool {
        let store = kind == RmaKind::Write;
        let mut access = |at: *mut u8| {
            // SAFETY: `at` reaches `len` bytes of the target's range (the
            // engine checked it against the registration and the pages'
            // generations); the iov holds `len` bytes (caller).
            unsafe {
                if store {
                    gather(&req.iov, 0, at, len)
                } else {
                    scatter(&req.iov, 0, at, len)
                }
            }
        };
        let range = (req.key, req.addr, len);
        let data = req.data.filter(|_| store);
        if !self.direct_rw(peer, range, store, data, &mut access) {
            return false;
        }
        self.report_rma(req.context, kind, req.completion);
        true
    }

    /// `fi_inject_write`: the write of `src` to `(key, addr)` at `dest`,
    /// done at once by the direct path when it may go there (MPI's small
    /// puts come this way, so it takes the bytes as they are, with no
    /// request to build), else posted as an inject on the general path.
    /// No completion; a counter counts it.
    ///
    /// # Safety
    /// `src` must point to `len` readable bytes during the call.
    pub unsafe fn inject_write(
        &mut self,
        dest: Addr<B>,
        (src, len): (*const u8, usize),
        (key, addr): (u64, u64),
        data: Option<u64>,
    ) -> Result<(), PostError> {
        let peer = self.admit_rma(&dest, len, true)?;
        if len > 0 {
            let mut access = |at: *mut u8| {
                // SAFETY: `at` reaches `len` bytes of the target's range
                // (checked by the engine); `src` holds `len` (caller).
                unsafe { std::ptr::copy_nonoverlapping(src, at, len) }
            };
            if self.direct_rw(peer, (key, addr, len), true, data, &mut access) {
                self.report_rma(0, RmaKind::Write, false);
                return Ok(());
            }
        }
        let req = RmaReq {
            dest,
            iov: IovList::One((src as usize, len)),
            addr,
            key,
            context: 0,
            completion: false,
            inject: true,
            data,
        };
        // SAFETY: the bytes are valid during this call (caller), and an
        // inject is copied within it.
        unsafe { self.post_rma(RmaKind::Write, peer, req, len) };
        Ok(())
    }

    /// Runs `access` on the `range` (key, address, length) of a `store`
    /// (a write) or a read with `peer` at once, if it may go the direct
    /// path, and tells the target what it must hear (`data` of a write);
    /// false (nothing done) if not.
    fn direct_rw(
        &mut self,
        peer: PeerIdx,
        range: (u64, u64, usize),
        store: bool,
        data: Option<u64>,
        access: &mut dyn FnMut(*mut u8),
    ) -> bool {
        let (key, _, len) = range;
        if len == 0 || len > self.cfg.eager_size {
            return false;
        }
        let Some(node) = self.peers[peer].node else {
            return false;
        };
        let need = if store {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let granted = match lane_leased(&self.peers[peer].lane, (range, need, 1), store, access) {
            Some(granted) => granted,
            None => {
                let mut dma = self.dma.lock();
                // Another host: its key is a question over the network,
                // which the general path asks once.
                if !dma.loads_reach(node) {
                    return false;
                }
                let lane = &mut self.peers[peer].lane;
                let granted = lane_access(&mut dma, lane, node, (range, need, 1), store, access);
                drop(dma);
                let Some(granted) = granted else {
                    return false;
                };
                granted
            }
        };
        self.direct_done(peer, key, granted.notify, (!store, store));
        self.tell_target(peer, key, None, data, len);
        true
    }

    /// Applies atomic `req` (`count` elements, `len` bytes, already checked
    /// against the call's limits) with `peer` at once, if it may go the
    /// direct path; false (nothing done) if not.
    ///
    /// # Safety
    /// The operand and compare iovs must be readable, the result iov
    /// writable, for their lengths during the call.
    pub(crate) unsafe fn atomic_direct(
        &mut self,
        peer: PeerIdx,
        req: &AtomicReq<Addr<B>>,
        len: usize,
    ) -> bool {
        let Some(node) = self.peers[peer].node else {
            return false;
        };
        // Behind atomics of ours that the target still has to apply or
        // that still wait to start, and behind our writes not finished,
        // this one waits too (their order).
        if self.atomic_must_wait(peer, true) {
            return false;
        }
        let (size, count) = (req.datatype.size(), req.count);
        let fetch = req.call != AtomicCall::Write;
        let writes = req.op.writes();
        let mut need = Access::empty();
        if writes {
            need = need.union(Access::REMOTE_WRITE);
        }
        if fetch {
            need = need.union(Access::REMOTE_READ);
        }
        // The operands, then the compare operands, as the general path
        // keeps them; on the stack (at most 64 bytes each).
        let mut operands = [0u8; 2 * ATOMIC_MAX_BYTES];
        let operand_len = if req.op == AtomicOp::Read { 0 } else { len };
        let compare_len = if req.call == AtomicCall::Compare {
            len
        } else {
            0
        };
        // SAFETY: the operand iovs hold these lengths (checked by the
        // caller) and are readable during the call.
        unsafe {
            gather(&req.operand, 0, operands.as_mut_ptr(), operand_len);
            gather(&req.compare, 0, operands[len..].as_mut_ptr(), compare_len);
        }
        let mut old = [0u8; ATOMIC_MAX_BYTES];
        let what = (req.call, req.op, req.datatype);
        let mut applied = Err(DmaError::Invalid);
        // Only a plain write goes one way; every other update reads first.
        let one_way = req.call == AtomicCall::Write && req.op == AtomicOp::Write;
        let mut access = |at: *mut u8| {
            // SAFETY: `at` reaches the `len` bytes of the target's range
            // (checked by the engine), aligned to the element (checked by
            // `grant`; update_elements checks it again).
            applied = unsafe {
                unimem_dma::update_elements(
                    at,
                    size,
                    count,
                    &mut |i, bits| update(what, count, &operands, i, bits),
                    &mut |i, bits| set_element(&mut old, size, i, bits),
                )
            };
        };
        let range = (req.key, req.addr, len);
        let ask = (range, need, size);
        let lane = &mut self.peers[peer].lane;
        // Only a lane whose node the atomic unit reaches: nothing may run
        // before that is known.
        let leased = match lane {
            Some(l) if l.atomics => lane_leased(lane, ask, one_way, &mut access),
            _ => None,
        };
        let granted = match leased {
            Some(granted) => Some(granted),
            None => {
                let mut dma = self.dma.lock();
                if !dma.loads_reach(node) || !dma.atomics_reach(node) {
                    return false;
                }
                lane_access(&mut dma, lane, node, ask, one_way, &mut access)
            }
        };
        let Some(granted) = granted.filter(|_| applied.is_ok()) else {
            return false;
        };
        if fetch {
            // SAFETY: the result iov is writable and holds len bytes
            // (caller).
            unsafe { scatter(&req.result, 0, old.as_ptr(), len) };
        }
        self.stats.atomics += 1;
        self.direct_done(peer, req.key, granted.notify, (fetch, writes));
        let kind = if fetch {
            RmaKind::AtomicFetch
        } else {
            RmaKind::Atomic
        };
        self.report_rma(req.context, kind, req.completion);
        true
    }

    /// Counts a direct operation, and tells the target of the access
    /// (`read`, `write`) if its key counts them.
    fn direct_done(&mut self, peer: PeerIdx, key: u64, notify: bool, (read, write): (bool, bool)) {
        self.stats.one_sided += 1;
        self.stats.direct += 1;
        self.tell_target(peer, key, notify.then_some((read, write)), None, 0);
    }
}

/// Runs `access` (a `store` or not) on where the key grants the range
/// (`need`, elements of `align` bytes) is mapped, and what it granted;
/// `None`, with nothing run, for anything the general path must decide.
/// The grant comes from the peer's lane if it holds that key and the owner
/// did not change it since; else, or if the engine refuses the lane's
/// registration (gone or stale: nothing ran), it is resolved and
/// registered afresh and kept in the lane.
fn lane_access<D: DmaEngine>(
    dma: &mut DmaSession<'_, D>,
    lane: &mut Option<Lane>,
    node: D::Node,
    (range, need, align): ((u64, u64, usize), Access, usize),
    store: bool,
    access: &mut dyn FnMut(*mut u8),
) -> Option<Granted> {
    let (_, _, len) = range;
    if let Some(granted) = lane.as_ref().and_then(|l| l.grant(range, need, align)) {
        if dma
            .load_store(granted.reg, granted.target, len, store, access)
            .is_ok()
        {
            // The engine still serves the registration its lease gave up
            // on (taken again elsewhere): the next operations lease it
            // afresh, for the lane's way.
            if let Some(lane) = lane
                .as_mut()
                .filter(|l| l.mapped.as_ref().is_none_or(|m| m.revoked()))
            {
                lane.mapped = dma.lease_registration(granted.reg);
            }
            return Some(granted);
        }
    }
    let granted = grant(dma, node, range, need, align);
    *lane = granted.as_ref().and_then(|granted| {
        dma.lease_key(node, range.0).map(|lease| Lane {
            lease,
            reg: granted.reg,
            mapped: dma.lease_registration(granted.reg),
            atomics: dma.atomics_reach(node),
        })
    });
    let granted = granted?;
    dma.load_store(granted.reg, granted.target, len, store, access)
        .ok()
        .map(|()| granted)
}

/// Runs `access` as [`lane_access`] does, through the lane's leased
/// registration alone (no engine, no DMA lock), if the lane holds the key,
/// grants the range and its registration is leased and still holds; `None`,
/// with nothing run, otherwise (the caller goes [`lane_access`]'s way).
#[inline]
fn lane_leased(
    lane: &Option<Lane>,
    (range, need, align): ((u64, u64, usize), Access, usize),
    store: bool,
    access: &mut dyn FnMut(*mut u8),
) -> Option<Granted> {
    let lane = lane.as_ref()?;
    let mapped = lane.mapped.as_ref()?;
    let granted = lane.grant(range, need, align)?;
    mapped
        .access(granted.target, range.2, store, access)
        .then_some(granted)
}

impl Lane {
    /// What the lane's key grants, if it is `key` and still holds: its
    /// range and rights checked as [`grant`] checks them.
    fn grant(
        &self,
        (key, addr, len): (u64, u64, usize),
        need: Access,
        align: usize,
    ) -> Option<Granted> {
        if self.lease.key() != key || !self.lease.still() {
            return None;
        }
        let exposure = self.lease.exposure();
        let target = exposure.translate(addr, len as u64, need).ok()?;
        target.is_multiple_of(align as u64).then_some(Granted {
            target,
            reg: self.reg,
            notify: exposure.access.counts(need),
        })
    }
}

/// What `node`'s key grants an access `need` of `len` bytes at `addr`
/// (elements of `align` bytes), with a cached registration of dmable
/// memory that covers it; `None` for anything the general path must
/// decide (refusal, misalignment, memory not dmable, no cached
/// registration to be had).
fn grant<D: DmaEngine>(
    dma: &mut DmaSession<'_, D>,
    node: D::Node,
    (key, addr, len): (u64, u64, usize),
    need: Access,
    align: usize,
) -> Option<Granted> {
    let (target, notify) = resolve_access(dma, node, (key, addr, len), need).ok()?;
    if !target.is_multiple_of(align as u64) {
        return None;
    }
    let (reg, stale) = dma.cached_registration(node, target, len).ok()?;
    // A registration made for this range alone (not inside one segment)
    // comes back among those to release: not the direct path's case.
    let kept = !stale.contains(&reg);
    dma.release(stale);
    kept.then_some(Granted {
        target,
        reg,
        notify,
    })
}
