//! Hostile input: what H feeds A, mutated, forged, random, or written
//! into shared memory H can reach.

use super::*;

impl World {
    // --- hostile input -------------------------------------------------------------

    /// Sends one message from H's mailbox, past its messenger.
    pub(crate) fn inject(&mut self, mut message: Message) {
        self.sanitize(&mut message);
        let h = self.h.as_ref().unwrap();
        let state = h.tap.lock();
        if let Some(mbx) = state.mbx.as_ref() {
            // A full mailbox drops it: the input still happened (a send).
            let _ = mbx.send(&h.route, &message);
        }
    }

    /// Keeps H's forgeries to what would reach H's own memory on real
    /// nodes (see the module docs): a grant, an offer or a ring outside
    /// H's memory that lies in this process's dmable memory is moved into
    /// H's, or out of any; a key of A's or B's exposures to each other
    /// becomes H's.
    fn sanitize(&mut self, message: &mut Message) {
        let arena = self.h.as_ref().unwrap().arena.as_ptr() as usize;
        let fix_range = |this: &mut World, addr: u64, len: usize| -> Option<u64> {
            let start = addr as usize;
            let end = start.checked_add(len.max(1));
            let inside = end.is_some_and(|end| start >= arena && end <= arena + H_ARENA);
            let touches = this
                .region
                .segment_ranges()
                .iter()
                .any(|&(base, size)| end.is_none_or(|end| start < base + size && end > base));
            if inside || !touches {
                return None;
            }
            Some(if this.rng.percent(50) && len <= H_ARENA {
                (arena + this.rng.below(H_ARENA - len)) as u64
            } else {
                0x1000 + (addr & 0xfff)
            })
        };
        match Wire::decode(message) {
            Some(Wire::Grant { addr, len, .. }) => {
                let len = (len as usize).max(FRAGMENT);
                if let Some(fixed) = fix_range(self, addr, len) {
                    message[8..16].copy_from_slice(&fixed.to_le_bytes());
                }
            }
            Some(Wire::Hello {
                ring,
                slot_shift,
                slots,
                ..
            }) => {
                let len = (slots as usize)
                    .checked_shl(slot_shift.into())
                    .unwrap_or(usize::MAX);
                if let Some(fixed) = fix_range(self, ring, len.min(1 << 40)) {
                    message[16..24].copy_from_slice(&fixed.to_le_bytes());
                }
            }
            // An offer to read H's own memory: its arena, never freed
            // (token 0), or wherever the fix puts it.
            Some(Wire::Offer { addr, .. }) => {
                if let Some(fixed) = fix_range(self, addr, FRAGMENT) {
                    message[6..14].copy_from_slice(&fixed.to_le_bytes());
                }
            }
            Some(Wire::RmaWrite { key, .. } | Wire::AtomicReq { key, .. })
                if self.private_keys.contains(&key) || (!self.polite && key == self.h_heap_key) =>
            {
                message[1..9].copy_from_slice(&self.h_key.to_le_bytes());
            }
            _ => {}
        }
    }

    /// A message H, A or B sent lately, or none yet.
    pub(crate) fn pick_history(&mut self) -> Option<Message> {
        let source = match self.rng.below(3) {
            0 => self.h.as_ref().unwrap().tap.clone(),
            1 => self.eps[0].tap.clone(),
            _ => self.eps[1].tap.clone(),
        };
        let state = source.lock();
        if state.sent.is_empty() {
            return None;
        }
        // Half of the time one of the last few: those name live transfers.
        let back = if self.rng.percent(50) {
            self.rng.below(4)
        } else {
            self.rng.below(state.sent.len())
        };
        Some(state.recent(back))
    }

    /// What a peer would answer to `message` of A (or B), forged by H with
    /// the ids it names: a fragment report for a grant, a FIN for a
    /// request to send or an acknowledged eager message, a refusal or a
    /// grant for an RMA request, a reply or result for an atomic one.
    pub(crate) fn answer(&mut self, message: &Message) -> Option<Message> {
        let some_gen = |this: &mut World| this.rng.below(4) as u16;
        let wire = match Wire::decode(message)? {
            Wire::Grant {
                send_id,
                fragment,
                recv_id,
                recv_gen,
                ..
            } => Wire::FragDone {
                send_id,
                fragment,
                recv_id,
                recv_gen,
            },
            Wire::Rts { send_id, len, .. } | Wire::RmaWrite { send_id, len, .. } => {
                match self.rng.below(3) {
                    0 => Wire::Fin { send_id },
                    1 => Wire::RmaNack {
                        id: send_id,
                        read: false,
                        error: unimem_proto::wire::RmaRefusal::Denied,
                    },
                    _ => Wire::Grant {
                        send_id,
                        fragment: self.rng.below(2) as u32,
                        addr: self.h.as_ref().unwrap().arena.as_ptr() as u64,
                        len: len.min(FRAGMENT as u32),
                        recv_id: self.some_id(),
                        recv_gen: some_gen(self),
                        // The arena was never freed: 0 is its token.
                        token: self.rng.below(2) as u16,
                    },
                }
            }
            Wire::Eager {
                ack: Some(send_id), ..
            } => Wire::Fin { send_id },
            Wire::RmaRead { recv_id, .. } => {
                if self.rng.percent(50) {
                    Wire::RmaNack {
                        id: recv_id,
                        read: true,
                        error: unimem_proto::wire::RmaRefusal::NoKey,
                    }
                } else {
                    Wire::ReadReady {
                        send_id: self.some_id(),
                        recv_id,
                    }
                }
            }
            Wire::ReadReady { send_id, .. } => Wire::Grant {
                send_id,
                fragment: 0,
                addr: self.h.as_ref().unwrap().arena.as_ptr() as u64,
                len: FRAGMENT as u32,
                recv_id: self.some_id(),
                recv_gen: some_gen(self),
                token: self.rng.below(2) as u16,
            },
            Wire::AtomicReq { id, .. } => {
                if self.rng.percent(50) {
                    Wire::AtomicReply { id, refusal: None }
                } else {
                    let bytes = self.rng.next_u64().to_le_bytes();
                    Wire::AtomicResult {
                        id,
                        bytes: unimem_proto::wire::Chunk::new(&bytes[..self.rng.range(1, 8)]),
                    }
                }
            }
            Wire::FragDone { send_id, .. } => Wire::Fin { send_id },
            _ => return None,
        };
        Some(wire.encode())
    }

    /// An id seen on the wire lately (a send or receive id, a generation),
    /// or an interesting one.
    fn some_id(&mut self) -> u16 {
        if self.rng.percent(30) {
            return [0, 1, 2, 0xffff, 0x8000][self.rng.below(5)];
        }
        match self.pick_history() {
            Some(m) => u16::from_le_bytes([m[2 + self.rng.below(20)], m[3 + self.rng.below(20)]]),
            None => self.rng.next_u64() as u16,
        }
    }

    pub(crate) fn mutate(&mut self, message: &mut Message) {
        for _ in 0..self.rng.range(1, 3) {
            let at = self.rng.below(MESSAGE_LEN);
            match self.rng.below(11) {
                0 | 1 => message[at] ^= 1 << self.rng.below(8),
                2 => message[at] = self.rng.next_u64() as u8,
                3 => message[at] = [0, 1, 0x7f, 0x80, 0xff][self.rng.below(5)],
                4 => {
                    let id = self.some_id().to_le_bytes();
                    let at = self.rng.below(MESSAGE_LEN - 1);
                    message[at..at + 2].copy_from_slice(&id);
                }
                5 => {
                    let value: u32 =
                        [0, 1, u32::MAX, 0x7fff_ffff, FRAGMENT as u32, 1 << 27][self.rng.below(6)];
                    let at = self.rng.below(MESSAGE_LEN - 3);
                    message[at..at + 4].copy_from_slice(&value.to_le_bytes());
                }
                6 => {
                    let value = match self.rng.below(4) {
                        0 => 0,
                        1 => u64::MAX,
                        2 => self.h_key,
                        _ => self.rng.next_u64(),
                    };
                    let at = self.rng.below(MESSAGE_LEN - 7);
                    message[at..at + 8].copy_from_slice(&value.to_le_bytes());
                }
                7 => message[0] = (message[0] & 0xf0) | self.rng.below(16) as u8,
                8 => message[0] = (message[0] & 0x0f) | (self.rng.below(16) as u8) << 4,
                9 => {
                    if let Some(other) = self.pick_history() {
                        let len = self.rng.range(1, MESSAGE_LEN - at);
                        message[at..at + len].copy_from_slice(&other[at..at + len]);
                    }
                }
                _ => {
                    let other = self.rng.below(MESSAGE_LEN);
                    message.swap(at, other);
                }
            }
        }
    }

    /// A request H may send: a write, read or atomic on its own range,
    /// with a fresh id. A serves it (and waits for H's part, which may
    /// never come).
    pub(crate) fn valid_request(&mut self) -> Message {
        let (key, base) = if self.polite && self.rng.percent(50) {
            (self.h_heap_key, self.h_heap.addr())
        } else {
            (self.h_key, self.h_range.addr())
        };
        let at = self.rng.below(H_RANGE - 8);
        let len = self.rng.range(1, H_RANGE - at) as u32;
        // The target's own address, as initiators send it.
        let addr = (base + at) as u64;
        let id = self.rng.next_u64() as u16;
        let wire = match self.rng.below(3) {
            0 => Wire::RmaWrite {
                key,
                addr,
                len,
                send_id: id,
            },
            1 => Wire::RmaRead {
                key,
                addr,
                len,
                recv_id: id,
            },
            _ => Wire::AtomicReq {
                key,
                addr: addr & !7,
                op: AtomicOp::Sum as u8,
                datatype: Datatype::U64 as u8,
                count: 1,
                id,
                fetch: self.rng.percent(50),
            },
        };
        wire.encode()
    }

    pub(crate) fn random_message(&mut self) -> Message {
        let mut message = [0u8; MESSAGE_LEN];
        for chunk in message.chunks_mut(8) {
            let bytes = self.rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        if self.rng.percent(50) {
            // A valid op, so that it gets past decoding more often.
            message[0] = (message[0] & 0xf0) | self.rng.range(1, 15) as u8;
        }
        message
    }

    /// A write into memory H may reach: A's eager ring for it, A's receive
    /// buffers for it, or the range A exposes to it.
    pub(crate) fn shm_write(&mut self) {
        let ring = self.h.as_ref().unwrap().tap.lock().peer_ring;
        let (base, len) = match self.rng.below(3) {
            0 if ring.is_some() && !self.h_fenced() => ring.unwrap(),
            1 => {
                let slot = self.rng.below(H_RECV_SLOTS);
                (self.h_slots[slot].0.addr(), H_RECV_LEN)
            }
            _ => (self.h_range.addr(), H_RANGE),
        };
        let at = self.rng.below(len);
        let n = self.rng.range(1, 64).min(len - at);
        let value = self.rng.next_u64();
        let mode = self.rng.below(4);
        // SAFETY: `[base, base + len)` is memory A handed H (its ring for
        // H, receive buffers directed at H, H's exposed range), alive as
        // long as A is; nothing else reads it during this call.
        let bytes = unsafe { std::slice::from_raw_parts_mut((base + at) as *mut u8, n) };
        match mode {
            0 => bytes[0] ^= 1 << (value % 8),
            1 => bytes.fill(value as u8),
            2 => {
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = (value >> (8 * (i % 8))) as u8;
                }
            }
            _ => bytes.fill(0xff),
        }
        self.stats.shm_writes += 1;
    }
}
