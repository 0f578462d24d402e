//! The target's side of atomics to its memory that is not dmable: a
//! peer's request (`AtomicReq`) and its operands (`AtomicData` chunks) are
//! gathered per request id, checked against our own key table, applied
//! with the same atomic unit a one-sided atomic uses, and answered
//! (`AtomicResult` chunks, then `AtomicReply`).
//!
//! Peers are untrusted: an unsupported operation is refused, and the
//! requests still waiting for their operands are bounded, in all and per
//! peer, so that one that asks and never sends them cannot hold the
//! others' atomics back.
//!
//! Owns: `atomic_rx`.

use unimem_dma::DmaError;

use super::AtomicArgs;
use crate::atomic::{self, set_element, AtomicCall, AtomicOp, Datatype, ATOMIC_MAX_BYTES};
use crate::messenger::{Backend, Messenger, PeerIdx};
use crate::wire::{Chunk, RmaRefusal, Wire, CHUNK_LEN};

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

impl<B: Backend> Messenger<B> {
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
