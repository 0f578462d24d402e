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
//! Here the initiator's side; the target's (applying a peer's atomics) is
//! in [`target`], which owns `atomic_rx` (the atomics whose operands are
//! still arriving). An initiator's atomics live in `rma_ops` like every
//! RMA operation.

pub(crate) mod target;

use unimem_dma::{Access, RegId};

use super::{RmaOp, RmaState};
use crate::atomic::{self, element, set_element, AtomicCall, AtomicOp, Datatype, ATOMIC_MAX_BYTES};
use crate::iov::{gather, scatter, total_len};
use crate::matching::IovList;
use crate::messenger::{Addr, Backend, Messenger, Node, PeerIdx};
use crate::wire::{Chunk, RmaRefusal, Wire, CHUNK_LEN};
use crate::{ErrorKind, PostError, RmaKind};

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

impl<B: Backend> Messenger<B> {
    /// Posts an atomic operation. Refused at once only for a full transmit
    /// queue, an unsupported operation (`PostError::BadAddress` is not
    /// used: see [`PostError::Unsupported`]) or too many elements; key,
    /// range and right errors come as an [`crate::Event::RmaError`].
    ///
    /// # Safety
    /// The operand and compare iovs must be readable during the call; the
    /// result iov writable until the operation completes.
    pub unsafe fn atomic(&mut self, req: AtomicReq<Addr<B>>) -> Result<(), PostError> {
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
        node: Node<B>,
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
}
