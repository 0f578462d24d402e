//! Atomic operations (`fi_atomic`, `fi_fetch_atomic`, `fi_compare_atomic`)
//! on a range a peer exposed under a key.
//!
//! They resolve and check the key as every RMA operation does (see the
//! parent module), then:
//! - on dmable target memory, the initiator applies them itself, one-sided,
//!   with the engine's atomic unit on its route to the target;
//! - on any other, the target's progress applies them: the request and its
//!   operands go by mailbox (`AtomicReq`, `AtomicData`), the old values and
//!   the outcome come back the same way (`AtomicResult`, `AtomicReply`).
//!
//! Both paths update each element with one atomic step of the CPU, so
//! atomicity holds across every initiator and the target's own atomics,
//! whichever path each takes. Order (`FI_ORDER_ATOMIC_*`): a one-sided
//! atomic is applied when posted; one to a peer with atomics still waiting
//! for its progress waits behind them.
//!
//! Owns: `atomic_rx` (the target's atomics whose operands are still
//! arriving). An initiator's atomics live in `rma_ops` like every RMA
//! operation.

use std::hash::Hash;

use unimem_dma::{Access, DmaEngine, DmaError, RegId};
use unimem_mailbox::Mailbox;

use super::{RmaOp, RmaState};
use crate::atomic::{self, element, set_element, AtomicCall, AtomicOp, Datatype, ATOMIC_MAX_BYTES};
use crate::iov::{gather, scatter, total_len};
use crate::matching::IovList;
use crate::messenger::{Messenger, PeerIdx};
use crate::wire::{Chunk, RmaRefusal, Wire, CHUNK_LEN};
use crate::{ErrorKind, PostError, RmaKind, WireNode};

/// An atomic request. The result iov stays valid until the operation
/// completes; operands are copied within the call.
#[derive(Clone, Debug)]
pub struct AtomicReq<A> {
    pub dest: A,
    pub call: AtomicCall,
    pub op: AtomicOp,
    pub datatype: Datatype,
    /// Elements.
    pub count: usize,
    /// `count` operand elements (none for `AtomicOp::Read`).
    pub operand: IovList,
    /// `count` compare elements (for `AtomicCall::Compare`).
    pub compare: IovList,
    /// Where the old values go (for `Fetch` and `Compare`).
    pub result: IovList,
    pub addr: u64,
    pub key: u64,
    pub context: usize,
    pub completion: bool,
}

/// What an atomic operation of ours carries besides an RMA operation's
/// fields.
pub(crate) struct AtomicArgs {
    call: AtomicCall,
    op: AtomicOp,
    datatype: Datatype,
    count: usize,
    /// The operands, then the compare operands.
    operands: Vec<u8>,
    /// Old values received from the target's progress.
    old: Vec<u8>,
}

impl AtomicArgs {
    /// Rights the operation needs from the key.
    pub(crate) fn needs(&self) -> Access {
        let mut need = Access::empty();
        if self.op.writes() {
            need = need.union(Access::REMOTE_WRITE);
        }
        if self.call != AtomicCall::Write {
            need = need.union(Access::REMOTE_READ);
        }
        need
    }

    /// The new bits of element `index`, which holds `old`.
    fn update(&self, index: usize, old: u64) -> Option<u64> {
        update(
            (self.call, self.op, self.datatype),
            self.count,
            &self.operands,
            index,
            old,
        )
    }

    pub(crate) fn op_writes(&self) -> bool {
        self.op.writes()
    }

    pub(crate) fn element_size(&self) -> usize {
        self.datatype.size()
    }

    pub(crate) fn wants_old(&self) -> bool {
        self.call != AtomicCall::Write
    }
}

/// The new bits of element `index` (holding `old`) of an atomic `call`
/// with `count` elements whose operands, then compare operands, are
/// `operands`; `None`: it stays as is.
pub(crate) fn update(
    (call, op, datatype): (AtomicCall, AtomicOp, Datatype),
    count: usize,
    operands: &[u8],
    index: usize,
    old: u64,
) -> Option<u64> {
    let size = datatype.size();
    let operand = if op == AtomicOp::Read {
        0
    } else {
        element(operands, size, index)
    };
    let compare = if call == AtomicCall::Compare {
        element(&operands[count * size..], size, index)
    } else {
        0
    };
    atomic::apply(op, datatype, old, operand, compare)
}

/// A peer's atomic whose operands are still arriving.
pub(crate) struct PendingAtomic {
    key: u64,
    addr: u64,
    call: AtomicCall,
    op: AtomicOp,
    datatype: Datatype,
    count: usize,
    operands: Vec<u8>,
    expected: usize,
}

/// Most atomics of peers whose operands are still arriving.
pub(crate) const MAX_PENDING_ATOMICS: usize = 4096;
/// Most of them of one peer: a peer that asks and never sends the
/// operands must not leave the others' atomics refused.
pub(crate) const MAX_PENDING_ATOMICS_PER_PEER: usize = MAX_PENDING_ATOMICS * 3 / 4;

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode<M::Addr>,
{
    /// Posts an atomic operation. Refused at once only for a full transmit
    /// queue, an unsupported operation (`PostError::BadAddress` is not
    /// used: see [`PostError::Unsupported`]) or too many elements; key,
    /// range and right errors come as an [`crate::Event::RmaError`].
    ///
    /// # Safety
    /// The operand and compare iovs must be readable during the call; the
    /// result iov writable until the operation completes.
    pub unsafe fn atomic(&mut self, req: AtomicReq<M::Addr>) -> Result<(), PostError> {
        let Some(max) = atomic::valid(req.call, req.op, req.datatype) else {
            return Err(PostError::Unsupported);
        };
        if req.count > max {
            return Err(PostError::TooLong);
        }
        let size = req.datatype.size();
        let len = req.count * size;
        let operand_len = if req.op == AtomicOp::Read { 0 } else { len };
        let compare_len = if req.call == AtomicCall::Compare {
            len
        } else {
            0
        };
        let result_len = if req.call == AtomicCall::Write {
            0
        } else {
            len
        };
        if total_len(&req.operand) < operand_len
            || total_len(&req.compare) < compare_len
            || total_len(&req.result) < result_len
        {
            return Err(PostError::TooShort);
        }
        if self.outstanding_sends >= self.cfg.tx_size {
            return Err(PostError::Again);
        }
        let peer = self.peer_index(&req.dest)?;
        if self.peers[peer].dead {
            return Err(PostError::Unreachable);
        }
        // SAFETY: the iovs are valid for their lengths (caller, checked).
        if unsafe { self.atomic_direct(peer, &req, len) } {
            return Ok(());
        }
        let mut operands = vec![0u8; operand_len + compare_len];
        // SAFETY: the operands are readable during this call (caller), and
        // hold at least these lengths (checked).
        unsafe {
            gather(&req.operand, 0, operands.as_mut_ptr(), operand_len);
            gather(
                &req.compare,
                0,
                operands[operand_len..].as_mut_ptr(),
                compare_len,
            );
        }
        let kind = if req.call == AtomicCall::Write {
            RmaKind::Atomic
        } else {
            RmaKind::AtomicFetch
        };
        self.outstanding_sends += 1;
        let op = self.rma_ops.insert(RmaOp {
            peer,
            kind,
            context: req.context,
            completion: req.completion,
            local: req.result,
            _copy: None,
            key: req.key,
            addr: req.addr,
            len,
            data: None,
            state: RmaState::Resolving,
            notify: false,
            atomic: Some(Box::new(AtomicArgs {
                call: req.call,
                op: req.op,
                datatype: req.datatype,
                count: req.count,
                operands,
                old: Vec::new(),
            })),
        });
        self.start_rma(op);
        Ok(())
    }

    /// Whether an atomic to `peer` must wait: behind atomics of ours that
    /// its progress still has to apply (`FI_ORDER_ATOMIC_*`), and, with
    /// `not_started`, those still waiting to start (an atomic that is not
    /// one of them itself); and behind our RMA writes to it not yet
    /// finished, so that a flag or signal set after a put is never seen
    /// before the put's data (what `shm` does, and OpenSHMEM programs rely
    /// on: see fi_unimem(7)). Writes posted after the atomic may make it
    /// wait too; they never wait for it, so it waits only as long as writes
    /// are in flight.
    pub(crate) fn atomic_must_wait(&self, peer: PeerIdx, not_started: bool) -> bool {
        self.peers[peer].writes_assisted > 0
            || self.rma_ops.any(|r| {
                r.peer == peer
                    && (r.kind == RmaKind::Write
                        || matches!(r.state, RmaState::Assisted)
                        || not_started
                            && r.atomic.is_some()
                            && matches!(r.state, RmaState::Resolving))
            })
    }

    /// Applies atomic `op` one-sided at `target` of `node` (dmable memory,
    /// registration `reg`). False if the engine refused it.
    pub(crate) fn atomic_one_sided(
        &mut self,
        op: usize,
        node: D::Node,
        target: u64,
        probed: Option<RegId>,
    ) -> bool {
        let rma = self.rma_ops.get(op).expect("checked by the caller");
        let args = rma.atomic.as_deref().expect("an atomic operation");
        let (size, count, len) = (args.datatype.size(), args.count, rma.len);
        let mut old = vec![0u8; if args.wants_old() { len } else { 0 }];
        let token = self.dma_waiters.next_id();
        let mut dma = self.dma.lock();
        let done = dma.with_registration(
            probed,
            (node, target, len),
            |dma| rma.still_allowed(dma, node),
            |dma, reg| {
                let elements = unimem_dma::ElementRange {
                    reg,
                    remote_addr: target,
                    width: size,
                    count,
                };
                dma.atomic(
                    elements,
                    &mut |i, bits| args.update(i, bits),
                    &mut |i, bits| {
                        if !old.is_empty() {
                            set_element(&mut old, size, i, bits)
                        }
                    },
                    token,
                )
            },
        );
        drop(dma);
        if let Err(e) = done {
            tracing::warn!(%node, "atomic refused by the engine: {e}");
            return false;
        }
        if !old.is_empty() {
            // SAFETY: the result iov is writable until the operation
            // completes and holds len bytes (checked when posted).
            unsafe { scatter(&rma.local, 0, old.as_ptr(), len) };
        }
        let id = self.dma_waiters.insert(super::super::send::Waiter::Rma {
            op,
            offset: 0,
            len,
            staging: None,
        });
        debug_assert_eq!(id, token);
        let rma = self.rma_ops.get_mut(op).expect("checked above");
        rma.state = RmaState::Direct {
            target,
            next: len,
            in_flight: 1,
            failed: false,
        };
        true
    }

    /// Turns small write or read `op` (at most [`ATOMIC_MAX_BYTES`], no CQ
    /// data) into an atomic write or read of bytes, so that it goes to the
    /// target in a few mailbox messages and is answered in one round trip
    /// (see `atomic_assisted`), where the rendezvous would take three. The
    /// target copies the bytes (`run_atomic`). False if it is not one.
    pub(crate) fn rma_as_bytes(&mut self, op: usize) -> bool {
        let rma = self.rma_ops.get_mut(op).expect("checked by the caller");
        if rma.atomic.is_some() || rma.data.is_some() || rma.len > ATOMIC_MAX_BYTES {
            return false;
        }
        let (call, atomic_op) = match rma.kind {
            RmaKind::Write => (AtomicCall::Write, AtomicOp::Write),
            RmaKind::Read => (AtomicCall::Fetch, AtomicOp::Read),
            RmaKind::Atomic | RmaKind::AtomicFetch => return false,
        };
        let mut operands = vec![
            0u8;
            if call == AtomicCall::Write {
                rma.len
            } else {
                0
            }
        ];
        // SAFETY: the local iov is valid until the operation completes
        // (an inject's names its own copy) and holds len bytes.
        unsafe { gather(&rma.local, 0, operands.as_mut_ptr(), operands.len()) };
        rma.atomic = Some(Box::new(AtomicArgs {
            call,
            op: atomic_op,
            datatype: Datatype::U8,
            count: rma.len,
            operands,
            old: Vec::new(),
        }));
        true
    }

    /// Hands atomic `op` to the target's progress: its request and
    /// operands go by mailbox.
    pub(crate) fn atomic_assisted(&mut self, op: usize, target: u64) {
        let rma = self.rma_ops.get_mut(op).expect("checked by the caller");
        rma.state = RmaState::Assisted;
        let (peer, key) = (rma.peer, rma.key);
        let args = rma.atomic.as_deref().expect("an atomic operation");
        let request = Wire::AtomicReq {
            key,
            addr: target,
            op: args.op as u8,
            datatype: args.datatype as u8,
            count: args.count as u8,
            id: op as u16,
            fetch: args.wants_old(),
        };
        let chunks: Vec<Wire> = args
            .operands
            .chunks(CHUNK_LEN)
            .map(|bytes| Wire::AtomicData {
                id: op as u16,
                bytes: Chunk::new(bytes),
            })
            .collect();
        self.queue_control(peer, request.encode());
        for chunk in chunks {
            self.queue_control(peer, chunk.encode());
        }
    }

    /// Old values of our atomic `id` from the target.
    pub(crate) fn on_atomic_result(&mut self, peer: PeerIdx, id: u16, bytes: &[u8]) {
        let rma = self.rma_ops.get_mut(id as usize);
        let Some(args) = rma
            .filter(|r| r.peer == peer && matches!(r.state, RmaState::Assisted))
            .and_then(|r| r.atomic.as_deref_mut())
        else {
            self.drop_invalid(peer, "atomic result for an unknown operation");
            return;
        };
        let room = (args.count * args.datatype.size()).saturating_sub(args.old.len());
        args.old.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The target finished (or refused) our atomic `id`.
    pub(crate) fn on_atomic_reply(&mut self, peer: PeerIdx, id: u16, refusal: Option<RmaRefusal>) {
        let op = id as usize;
        let Some(rma) = self
            .rma_ops
            .get(op)
            .filter(|r| r.peer == peer && matches!(r.state, RmaState::Assisted))
        else {
            self.drop_invalid(peer, "atomic answer for an unknown operation");
            return;
        };
        let args = rma.atomic.as_deref().expect("an atomic operation");
        let error = match refusal {
            Some(refusal) => Some(super::refusal_error(refusal)),
            None if args.wants_old() && args.old.len() != rma.len => {
                self.drop_invalid(peer, "atomic answer with short old values");
                Some(ErrorKind::Invalid)
            }
            None => {
                if args.wants_old() {
                    // SAFETY: the result iov is writable until the
                    // operation completes and holds len bytes.
                    unsafe { scatter(&rma.local, 0, args.old.as_ptr(), rma.len) };
                }
                None
            }
        };
        self.end_rma(op, error);
        // A one-sided atomic may have waited behind this one.
        self.retry_rma();
    }

    /// A peer asks us to apply an atomic; its operands follow.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_atomic_req(
        &mut self,
        peer: PeerIdx,
        key: u64,
        addr: u64,
        op: u8,
        datatype: u8,
        count: u8,
        id: u16,
        fetch: bool,
    ) {
        let call = match (fetch, AtomicOp::from_u32(u32::from(op))) {
            (_, Some(op)) if op.call_is_compare() => AtomicCall::Compare,
            (true, _) => AtomicCall::Fetch,
            (false, _) => AtomicCall::Write,
        };
        let parsed = AtomicOp::from_u32(u32::from(op))
            .zip(Datatype::from_u32(u32::from(datatype)))
            .filter(|&(op, dt)| {
                atomic::valid(call, op, dt).is_some_and(|max| count as usize <= max)
            });
        let Some((op, datatype)) = parsed else {
            tracing::debug!(op, datatype, count, "unsupported atomic refused");
            self.reply_atomic(peer, id, Some(RmaRefusal::Invalid));
            return;
        };
        let replaces = self.atomic_rx.contains_key(&(peer, id));
        if !replaces
            && (self.atomic_rx.len() >= MAX_PENDING_ATOMICS
                || self.peers[peer].atomics_pending >= MAX_PENDING_ATOMICS_PER_PEER)
        {
            self.reply_atomic(peer, id, Some(RmaRefusal::Busy));
            return;
        }
        let len = count as usize * datatype.size();
        let expected = match call {
            AtomicCall::Compare => 2 * len,
            _ if op == AtomicOp::Read => 0,
            _ => len,
        };
        debug_assert!(expected <= 2 * ATOMIC_MAX_BYTES);
        let pending = PendingAtomic {
            key,
            addr,
            call,
            op,
            datatype,
            count: count as usize,
            operands: Vec::with_capacity(expected),
            expected,
        };
        if !replaces {
            self.peers[peer].atomics_pending += 1;
        }
        if self.atomic_rx.insert((peer, id), pending).is_some() {
            self.drop_invalid(
                peer,
                "atomic request replacing one still waiting for its operands",
            );
        }
        if expected == 0 {
            self.run_atomic(peer, id);
        }
    }

    /// Operand bytes of a peer's atomic `id`.
    pub(crate) fn on_atomic_data(&mut self, peer: PeerIdx, id: u16, bytes: &[u8]) {
        let Some(pending) = self.atomic_rx.get_mut(&(peer, id)) else {
            tracing::debug!(id, "atomic operands without a request dropped");
            return;
        };
        let room = pending.expected - pending.operands.len();
        pending
            .operands
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        if pending.operands.len() == pending.expected {
            self.run_atomic(peer, id);
        }
    }

    /// Applies a peer's atomic `id`, all its operands in, to our memory,
    /// and answers.
    fn run_atomic(&mut self, peer: PeerIdx, id: u16) {
        let pending = self
            .atomic_rx
            .remove(&(peer, id))
            .expect("checked by the caller");
        self.peers[peer].atomics_pending -= 1;
        let args = AtomicArgs {
            call: pending.call,
            op: pending.op,
            datatype: pending.datatype,
            count: pending.count,
            operands: pending.operands,
            old: Vec::new(),
        };
        let size = args.datatype.size();
        let len = args.count * size;
        let checked = self.check_own_range(pending.key, pending.addr, len as u64, args.needs());
        let notify = match checked {
            Ok(notify) => notify,
            Err(refusal) => {
                self.reply_atomic(peer, id, Some(refusal));
                return;
            }
        };
        let mut old = vec![0u8; if args.wants_old() { len } else { 0 }];
        // Bytes written or read whole (what a small write or read to
        // ordinary memory becomes, see `rma_as_bytes`): plain copies, as
        // every byte store and load is one atomic step already.
        let copy = args.datatype == Datatype::U8
            && matches!(
                (args.call, args.op),
                (AtomicCall::Write, AtomicOp::Write) | (AtomicCall::Fetch, AtomicOp::Read)
            );
        let applied = if copy {
            let at = pending.addr as *mut u8;
            // SAFETY: the range lies inside a range of ours exposed for
            // this access (checked), which the application keeps valid
            // while it is registered; `old` and the operands hold len bytes.
            unsafe {
                if args.op == AtomicOp::Write {
                    std::ptr::copy_nonoverlapping(args.operands.as_ptr(), at, len)
                } else {
                    std::ptr::copy_nonoverlapping(at, old.as_mut_ptr(), len)
                }
            }
            Ok(())
        } else {
            // SAFETY: as above; update_elements checks the alignment.
            unsafe {
                unimem_dma::update_elements(
                    pending.addr as *mut u8,
                    size,
                    args.count,
                    &mut |i, bits| args.update(i, bits),
                    &mut |i, bits| {
                        if !old.is_empty() {
                            set_element(&mut old, size, i, bits)
                        }
                    },
                )
            }
        };
        match applied {
            Ok(()) => {
                for bytes in old.chunks(CHUNK_LEN) {
                    let result = Wire::AtomicResult {
                        id,
                        bytes: Chunk::new(bytes),
                    };
                    self.queue_control(peer, result.encode());
                }
                self.reply_atomic(peer, id, None);
                if notify {
                    self.events
                        .push_back(crate::Event::RemoteAccess(crate::AccessCounts::one(
                            pending.key,
                            args.wants_old(),
                            args.op.writes(),
                        )));
                }
            }
            Err(DmaError::Invalid) => self.reply_atomic(peer, id, Some(RmaRefusal::Invalid)),
            Err(_) => self.reply_atomic(peer, id, Some(RmaRefusal::Denied)),
        }
    }

    fn reply_atomic(&mut self, peer: PeerIdx, id: u16, refusal: Option<RmaRefusal>) {
        self.queue_control(peer, Wire::AtomicReply { id, refusal }.encode());
    }

    /// A dead peer's atomics still waiting for operands are dropped.
    pub(crate) fn forget_atomics_of(&mut self, peer: PeerIdx) {
        self.atomic_rx.retain(|&(p, _), _| p != peer);
        self.peers[peer].atomics_pending = 0;
    }
}

impl AtomicOp {
    /// Whether it is one of the compare calls' operations.
    fn call_is_compare(self) -> bool {
        matches!(
            self,
            AtomicOp::Cswap
                | AtomicOp::CswapNe
                | AtomicOp::CswapLe
                | AtomicOp::CswapLt
                | AtomicOp::CswapGe
                | AtomicOp::CswapGt
                | AtomicOp::Mswap
        )
    }
}
