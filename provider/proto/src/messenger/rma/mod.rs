//! One-sided operations (RMA): writing to and reading from a range a peer
//! exposed under a key.
//!
//! The initiator resolves the key in the target's key table, which the
//! target keeps in shared memory ([`unimem_dma::KeyTable`]), and checks
//! range and rights there: a bad key or access fails the operation before
//! a byte moves. Then one of two paths:
//!
//! - **one-sided**, when the target range is dmable: the initiator puts or
//!   gets it by DMA with no action of the target (through staging buffers
//!   when the local buffer is not dmable itself), and the operation
//!   completes when its DMAs do;
//! - **target-assisted**, when it is not: the target's progress must move
//!   the bytes, and the rendezvous does it (see [`target`]): a write is a
//!   rendezvous send that the target grants into its range, a read a
//!   rendezvous in which the target sends its range to our transfer.
//!
//! Here: posting, resolving the key, and ending an operation. Its DMAs and
//! what the target is told afterwards are in [`one_sided`]; the hand-over
//! of a target-assisted one, and the target's side, in [`target`]; small
//! operations done within their call in `direct`; atomics in [`atomic`].
//!
//! Owns: `rma_ops` (one-sided operations and those waiting for the
//! target's node) and `rma_pending` (those with work left: resolving, or
//! pieces waiting for a staging buffer). Hands target-assisted operations
//! over to `tx_ops` (writes) and `rx_xfers` (reads).

pub(crate) mod atomic;
mod direct;
mod one_sided;
pub(crate) mod target;

use unimem_dma::{Access, DmaEngine, DmaError, RegId};

use super::{Addr, Backend, Messenger, Node, PeerIdx};
use crate::dma::DmaSession;
use crate::iov::{gather, total_len};
use crate::matching::IovList;
use crate::{ErrorKind, Event, PostError, RmaKind};

/// An RMA request. The local iov stays valid until the operation
/// completes (until the call returns for an inject).
#[derive(Clone, Debug)]
pub struct RmaReq<A> {
    pub dest: A,
    /// Local buffers: the source of a write, the destination of a read.
    pub iov: IovList,
    /// Where at the target: a virtual address or an offset into the key's
    /// range, as the target registered it.
    pub addr: u64,
    pub key: u64,
    pub context: usize,
    /// Whether the write or read reports a completion (`fi_inject_write`
    /// does not; `FI_INJECT` in the flags of `fi_writemsg` does).
    pub completion: bool,
    /// `fi_inject_write` or `FI_INJECT`: the data is copied within the
    /// call (the buffer is the caller's again on return).
    pub inject: bool,
    /// CQ data for the target (`fi_writedata`), delivered once the write
    /// is complete.
    pub data: Option<u64>,
}

/// Where a one-sided operation is.
enum RmaState {
    /// Waiting for the target's node (its first hello) to resolve the key.
    Resolving,
    /// Moving by DMA: `target` is the target's address of byte 0, pieces
    /// from `next` on are still to be submitted.
    Direct {
        target: u64,
        next: usize,
        in_flight: usize,
        /// The peer died with DMAs in flight: fails when they are done.
        failed: bool,
    },
    /// An atomic the target's progress applies: waiting for its answer.
    Assisted,
}

/// An RMA operation of ours, until it is one-sided in flight or handed
/// over to the rendezvous.
pub(crate) struct RmaOp {
    peer: PeerIdx,
    kind: RmaKind,
    context: usize,
    completion: bool,
    local: IovList,
    /// An inject's copy of its data, which `local` names.
    _copy: Option<Box<[u8]>>,
    key: u64,
    addr: u64,
    len: usize,
    data: Option<u64>,
    state: RmaState,
    /// An atomic operation's own arguments; `local` is its result iov.
    atomic: Option<Box<atomic::AtomicArgs>>,
    /// The target's key counts remote accesses: a one-sided operation
    /// tells it once done.
    notify: bool,
}

impl RmaOp {
    /// The rights the target's key must grant.
    fn access_needed(&self) -> Access {
        match &self.atomic {
            Some(args) => args.needs(),
            None if self.kind == RmaKind::Write => Access::REMOTE_WRITE,
            None => Access::REMOTE_READ,
        }
    }

    /// What `node`'s key grants this operation: its target address there,
    /// and whether the key counts this access (`Access::counts`).
    fn resolve<D: DmaEngine>(
        &self,
        dma: &mut DmaSession<'_, D>,
        node: D::Node,
    ) -> Result<(u64, bool), DmaError> {
        let range = (self.key, self.addr, self.len);
        resolve_access(dma, node, range, self.access_needed())
    }

    /// Whether `node`'s key still grants this operation (asked again when
    /// the target freed memory of its range since it was registered).
    pub(crate) fn still_allowed<D: DmaEngine>(
        &self,
        dma: &mut DmaSession<'_, D>,
        node: D::Node,
    ) -> Result<(), DmaError> {
        self.resolve(dma, node).map(drop)
    }
}

impl<B: Backend> Messenger<B> {
    /// Posts an RMA write (`kind` Write) or read. Never waits for the
    /// target; refused only when `tx_size` operations are outstanding.
    /// Errors the target's key gives (bad key, range, rights) come as an
    /// [`Event::RmaError`].
    ///
    /// # Safety
    /// `req.iov` must stay valid until the operation completes (until this
    /// call returns for an inject).
    pub unsafe fn rma(&mut self, kind: RmaKind, req: RmaReq<Addr<B>>) -> Result<(), PostError> {
        let len = total_len(&req.iov);
        let inject = req.inject && kind == RmaKind::Write;
        let peer = self.admit_rma(&req.dest, len, inject)?;
        // SAFETY: the iov is valid during this call (caller).
        if unsafe { self.rma_direct(kind, peer, &req, len) } {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { self.post_rma(kind, peer, req, len) };
        Ok(())
    }

    /// The peer an RMA operation of `len` bytes to `dest` (an `inject`
    /// or not) goes to, or why it is refused at once: too long, the
    /// transmit queue full, the peer unreachable.
    #[inline(always)]
    pub(crate) fn admit_rma(
        &mut self,
        dest: &Addr<B>,
        len: usize,
        inject: bool,
    ) -> Result<PeerIdx, PostError> {
        if len > self.cfg.max_msg_size {
            return Err(PostError::TooLong);
        }
        if inject && len > self.cfg.eager_size {
            return Err(PostError::TooLong);
        }
        if self.outstanding_sends >= self.cfg.tx_size {
            return Err(PostError::Again);
        }
        let peer = self.peer_index(dest)?;
        if self.peers[peer].dead {
            return Err(PostError::Unreachable);
        }
        Ok(peer)
    }

    /// Posts admitted RMA operation `req` of `len` bytes with `peer` on the
    /// general path (an operation object, resolved and moved from
    /// progress); an inject's data is copied first.
    ///
    /// # Safety
    /// As [`Self::rma`]'s.
    pub(crate) unsafe fn post_rma(
        &mut self,
        kind: RmaKind,
        peer: PeerIdx,
        req: RmaReq<Addr<B>>,
        len: usize,
    ) {
        let inject = req.inject && kind == RmaKind::Write;
        let (local, copy) = if inject {
            let mut bytes = vec![0u8; len].into_boxed_slice();
            // SAFETY: the iov holds len readable bytes during this call.
            unsafe { gather(&req.iov, 0, bytes.as_mut_ptr(), len) };
            (IovList::One((bytes.as_ptr() as usize, len)), Some(bytes))
        } else {
            (req.iov, None)
        };
        self.outstanding_sends += 1;
        let op = self.rma_ops.insert(RmaOp {
            peer,
            kind,
            context: req.context,
            completion: req.completion,
            local,
            _copy: copy,
            key: req.key,
            addr: req.addr,
            len,
            data: req.data.filter(|_| kind == RmaKind::Write),
            state: RmaState::Resolving,
            atomic: None,
            notify: false,
        });
        self.start_rma(op);
    }

    /// Starts a newly posted `op` as far as it goes now. What the engine
    /// finished at once (every DMA of the native profile) completes here:
    /// its completion is visible when the post returns, not one progress
    /// call later (MPI's flush reads the counter once and is done).
    pub(crate) fn start_rma(&mut self, op: usize) {
        if !self.advance_rma(op) {
            self.rma_pending.push_back(op);
        }
        self.reap_dma();
    }

    /// Moves operation `op` on as far as it can; false if it waits for
    /// something (the target's node, a staging buffer).
    pub(crate) fn advance_rma(&mut self, op: usize) -> bool {
        let Some(rma) = self.rma_ops.get(op) else {
            return true;
        };
        let mut probed = None;
        if let RmaState::Resolving = rma.state {
            let peer = rma.peer;
            if self.peers[peer].dead {
                self.end_rma(op, Some(ErrorKind::PeerUnreachable));
                return true;
            }
            let Some(node) = self.peers[peer].node else {
                return false;
            };
            // An atomic keeps its order behind our writes and atomics.
            if rma.atomic.is_some() && self.atomic_must_wait(peer, false) {
                return false;
            }
            match self.resolve_rma(op, node) {
                Some(reg) => probed = reg,
                None => return true,
            }
        }
        self.submit_pieces(op, probed)
    }

    /// Resolves the key of `op` at `node`: fails it, starts it one-sided,
    /// or hands it to the target-assisted path. `Some` if it is now
    /// one-sided, with the registration of its whole target range when the
    /// cache keeps it (so that its first DMA need not look it up again).
    fn resolve_rma(&mut self, op: usize, node: Node<B>) -> Option<Option<RegId>> {
        let rma = self.rma_ops.get(op).expect("checked by the caller");
        let (key, addr, len) = (rma.key, rma.addr, rma.len);
        let element = rma.atomic.as_ref().map(|a| a.element_size());
        let mut dma = self.dma.lock();
        let target = match rma.resolve(&mut dma, node) {
            Ok((target, notify)) => {
                self.rma_ops.get_mut(op).expect("checked above").notify = notify;
                target
            }
            Err(e) => {
                drop(dma);
                tracing::debug!(key, addr, len, "RMA refused: {e}");
                self.end_rma(op, Some(access_error(&e)));
                return None;
            }
        };
        if len == 0 {
            drop(dma);
            self.end_rma(op, None);
            return None;
        }
        if element.is_some_and(|size| !target.is_multiple_of(size as u64)) {
            drop(dma);
            tracing::debug!(target, "atomic target not aligned to its element");
            self.end_rma(op, Some(ErrorKind::Invalid));
            return None;
        }
        if element.is_some() {
            self.stats.atomics += 1;
        }
        let registration = if element.is_some() && !dma.atomics_reach(node) {
            // No atomic unit reaches it: the target applies it.
            Err(DmaError::OutOfBounds)
        } else {
            dma.cached_registration(node, target, len)
        };
        match registration {
            Ok((reg, stale)) => {
                // A registration made just for this range is released now.
                let kept = (!stale.contains(&reg)).then_some(reg);
                dma.release(stale);
                drop(dma);
                self.stats.one_sided += 1;
                if element.is_some() {
                    if !self.atomic_one_sided(op, node, target, kept) {
                        self.end_rma(op, Some(ErrorKind::PeerUnreachable));
                    }
                    return None;
                }
                let rma = self.rma_ops.get_mut(op).expect("checked above");
                rma.state = RmaState::Direct {
                    target,
                    next: 0,
                    in_flight: 0,
                    failed: false,
                };
                Some(kept)
            }
            // Not dmable: the target's progress moves it.
            Err(DmaError::OutOfBounds) => {
                drop(dma);
                self.stats.assisted += 1;
                if element.is_some() || self.rma_as_bytes(op) {
                    let peer = self.rma_ops.get(op).expect("checked above").peer;
                    self.atomic_assisted(op, target);
                    // Out now: the answer is a round trip away.
                    if self.flush_peer(peer) {
                        self.mark_active(peer);
                    }
                } else {
                    self.assist_rma(op, target);
                }
                None
            }
            Err(e) => {
                drop(dma);
                tracing::warn!(%node, "cannot register an RMA target: {e}");
                self.end_rma(op, Some(ErrorKind::PeerUnreachable));
                None
            }
        }
    }

    /// Ends `op`, done (with the target's CQ data on its way) or failed.
    fn end_rma(&mut self, op: usize, error: Option<ErrorKind>) {
        let Some(rma) = self.rma_ops.remove(op) else {
            return;
        };
        self.outstanding_sends -= 1;
        self.rma_pending.retain(|&o| o != op);
        let (context, kind) = (rma.context, rma.kind);
        match error {
            Some(error) => self.events.push_back(Event::RmaError {
                context,
                kind,
                error,
            }),
            None => {
                // A one-sided access the target did not see: tell it, if
                // its key counts accesses (an assisted one it saw itself).
                let notice =
                    (rma.notify && matches!(rma.state, RmaState::Direct { .. })).then(|| {
                        match (&rma.atomic, rma.kind) {
                            (Some(args), _) => (args.wants_old(), args.op_writes()),
                            (None, RmaKind::Read) => (true, false),
                            (None, _) => (false, true),
                        }
                    });
                self.tell_target(rma.peer, rma.key, notice, rma.data, rma.len);
                self.report_rma(context, kind, rma.completion);
            }
        }
    }

    /// Moves on the operations that waited (for a node, a staging buffer).
    pub(crate) fn retry_rma(&mut self) {
        for _ in 0..self.rma_pending.len() {
            let Some(op) = self.rma_pending.pop_front() else {
                break;
            };
            if !self.advance_rma(op) {
                self.rma_pending.push_back(op);
            }
        }
    }

    /// The peer is gone: its one-sided operations fail (those with DMAs in
    /// flight once they complete: their pieces name the operation).
    pub(crate) fn fail_rma_with(&mut self, peer: PeerIdx) {
        for op in self.rma_ops.ids_where(|r| r.peer == peer) {
            let rma = self.rma_ops.get_mut(op).expect("listed above");
            match &mut rma.state {
                RmaState::Direct {
                    in_flight, failed, ..
                } if *in_flight > 0 => *failed = true,
                _ => self.end_rma(op, Some(ErrorKind::PeerUnreachable)),
            }
        }
    }

    /// Operations still to move on.
    pub(crate) fn rma_waiting(&self) -> bool {
        !self.rma_pending.is_empty()
    }

    /// Operations still to move on that wait for something of ours (a
    /// staging buffer, our own earlier operations), not for the target's
    /// node, which its first message brings.
    pub(crate) fn rma_waiting_locally(&self) -> bool {
        self.rma_pending.iter().any(|&op| {
            self.rma_ops.get(op).is_some_and(|r| {
                !matches!(r.state, RmaState::Resolving) || self.peers[r.peer].node.is_some()
            })
        })
    }
}

/// What `node`'s key grants an access `need` of `len` bytes at `addr`: the
/// target address there, and whether the key counts such an access
/// (`Access::NOTIFY_READ`, `NOTIFY_WRITE`). The one check of a key, for
/// every path.
pub(crate) fn resolve_access<D: DmaEngine>(
    dma: &mut DmaSession<'_, D>,
    node: D::Node,
    (key, addr, len): (u64, u64, usize),
    need: Access,
) -> Result<(u64, bool), DmaError> {
    let exposure = dma.resolve_key(node, key)?;
    let target = exposure.translate(addr, len as u64, need)?;
    Ok((target, exposure.access.counts(need)))
}

/// The error an initiator reports for a target's refusal.
pub(crate) fn refusal_error(refusal: crate::wire::RmaRefusal) -> ErrorKind {
    use crate::wire::RmaRefusal;
    match refusal {
        RmaRefusal::NoKey => ErrorKind::BadKey,
        RmaRefusal::Denied => ErrorKind::AccessDenied,
        RmaRefusal::Busy => ErrorKind::PeerUnreachable,
        RmaRefusal::Invalid => ErrorKind::Invalid,
    }
}

/// The error an initiator reports for a refused key or access.
fn access_error(e: &DmaError) -> ErrorKind {
    match e {
        DmaError::NoSuchKey => ErrorKind::BadKey,
        DmaError::AccessDenied | DmaError::OutOfBounds => ErrorKind::AccessDenied,
        _ => ErrorKind::PeerUnreachable,
    }
}
