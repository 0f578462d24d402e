//! Traffic between A and B, and the checks of its events: every
//! operation completes, once, with its exact bytes.

use super::*;

impl World {
    // --- traffic between A and B ---------------------------------------------

    /// Posts a send from `eps[from]` to the other, its receive to be posted
    /// by the other after a random delay.
    fn post_send(&mut self, from: usize) {
        let to = 1 - from;
        let rng = &mut self.rng;
        let len = match rng.below(10) {
            0..=2 => rng.below(23),
            // In parts (up to four mailbox messages).
            3 => rng.range(23, 92),
            4..=5 => rng.range(23, EAGER),
            _ => rng.range(EAGER + 1, MAX_MSG),
        };
        let seed = rng.next_u64();
        let tag = rng.percent(60).then(|| rng.next_u64() >> 1);
        let copied = len <= EAGER && rng.percent(25);
        let inject = copied && rng.percent(50);
        let dmable = rng.percent(50);
        let delivery_complete = rng.percent(20);
        let delay = if rng.percent(30) {
            rng.below(50) as u64
        } else {
            0
        };
        let dest = self.eps[to].m.addr();
        let ep = &mut self.eps[from];
        let mut mem = Mem::new(&self.region, dmable, len, 0xc0 | from as u8);
        fill_pattern(mem.bytes_mut(), seed);
        let context = ep.context();
        let req = SendReq {
            dest,
            iov: mem.iov(len),
            info: MatchInfo { tag, data: None },
            context,
            completion: !inject,
            inject,
            copy: copied,
            delivery_complete,
        };
        // SAFETY: `mem` lives in the operation until its completion.
        match unsafe { ep.m.send(req) } {
            Ok(()) => {}
            Err(unimem_proto::PostError::Again) => return,
            Err(e) => {
                let what = format!("{:?} refused a send to its peer: {e:?}", ep.who);
                self.fail(&what)
            }
        }
        let mem = if copied {
            // The call copied it: the buffer is the caller's again.
            mem.bytes_mut().fill(0x11);
            None
        } else {
            Some(mem)
        };
        let peer = self.eps[to].who;
        let step = self.step;
        let ep = &mut self.eps[from];
        ep.ops.insert(
            context,
            Op {
                peer,
                kind: OpKind::Send { mem, seed, len },
                step,
                at: Instant::now(),
            },
        );
        self.eps[to]
            .incoming
            .push_back((seed, len, tag, step + delay));
        self.stats.sends += 1;
    }

    /// Posts the receives whose time has come, in send order (untagged
    /// ones match in that order).
    fn post_receives(&mut self, at: usize) {
        let src = self.eps[1 - at].m.addr();
        let peer = self.eps[1 - at].who;
        while let Some(&(seed, len, tag, from_step)) = self.eps[at].incoming.front() {
            if from_step > self.step {
                break;
            }
            self.eps[at].incoming.pop_front();
            let dmable = self.rng.percent(50);
            let spare = self.rng.below(64);
            let mem = Mem::new(&self.region, dmable, len + spare, 0xd0 | at as u8);
            let ep = &mut self.eps[at];
            let context = ep.context();
            let recv = PostedRecv {
                context,
                iov: mem.iov(len + spare),
                src: Some(src),
                tag: tag.unwrap_or(0),
                ignore: 0,
                completion: true,
                multi_recv: false,
            };
            // SAFETY: `mem` lives in the operation until its completion.
            unsafe { ep.m.post_recv(tag.is_some(), recv) };
            ep.ops.insert(
                context,
                Op {
                    peer,
                    kind: OpKind::Recv { mem, seed, len },
                    step: self.step,
                    at: Instant::now(),
                },
            );
        }
    }

    /// An RMA write or read from `eps[from]` into a free slot of one of the
    /// other's ranges.
    fn post_rma(&mut self, from: usize) {
        let to = 1 - from;
        let range = self.rng.below(2);
        let Some(slot) = (0..RMA_SLOTS).find(|&s| !self.eps[to].ranges[range].busy[s]) else {
            return;
        };
        let at = self.rng.below(RMA_SLOT);
        let len = self.rng.below(RMA_SLOT - at + 1);
        let write = self.rng.percent(50);
        let dmable = self.rng.percent(50);
        let seed = self.rng.next_u64();
        let inject = write && len <= EAGER && self.rng.percent(20);
        let data = (write && self.rng.percent(20)).then(|| self.rng.next_u64());
        let mut local = Mem::new(&self.region, dmable, len, 0xe0 | from as u8);
        if write {
            fill_pattern(local.bytes_mut(), seed);
        }
        let dest = self.eps[to].m.addr();
        let key = self.eps[to].ranges[range].key;
        let ep = &mut self.eps[from];
        let context = ep.context();
        let req = RmaReq {
            dest,
            iov: local.iov(len),
            addr: (slot * RMA_SLOT + at) as u64,
            key,
            context,
            completion: !inject,
            inject,
            data,
        };
        let kind = if write { RmaKind::Write } else { RmaKind::Read };
        // SAFETY: `local` lives in the operation until its completion.
        match unsafe { ep.m.rma(kind, req) } {
            Ok(()) => {}
            Err(unimem_proto::PostError::Again) => return,
            Err(e) => {
                let what = format!("{:?} refused an RMA to its peer: {e:?}", ep.who);
                self.fail(&what)
            }
        }
        let kind = if write {
            OpKind::Write {
                local,
                range,
                slot,
                at,
                len,
            }
        } else {
            OpKind::Read {
                local,
                range,
                slot,
                at,
                len,
            }
        };
        let peer = self.eps[to].who;
        let step = self.step;
        self.eps[from].ops.insert(
            context,
            Op {
                peer,
                kind,
                step,
                at: Instant::now(),
            },
        );
        self.eps[to].ranges[range].busy[slot] = true;
        self.stats.rma += 1;
    }

    /// An atomic from `eps[from]` on free words of the other.
    fn post_atomic(&mut self, from: usize) {
        let to = 1 - from;
        let which = self.rng.below(2);
        let count = self.rng.range(1, 4);
        let first = self.rng.below(WORDS - count + 1);
        if self.eps[to].words[which].busy[first..first + count]
            .iter()
            .any(|&b| b)
        {
            return;
        }
        let (call, op) = match self.rng.below(3) {
            0 => (AtomicCall::Write, AtomicOp::Sum),
            1 => (AtomicCall::Fetch, AtomicOp::Sum),
            _ => (AtomicCall::Compare, AtomicOp::Cswap),
        };
        let old: Vec<u64> = self.eps[to].words[which].values[first..first + count].to_vec();
        let operands: Vec<u64> = (0..count).map(|_| self.rng.next_u64()).collect();
        let compares: Vec<u64> = old
            .iter()
            .map(|&v| if self.rng.percent(70) { v } else { v ^ 1 })
            .collect();
        let new: Vec<u64> = (0..count)
            .map(|i| match op {
                AtomicOp::Sum => old[i].wrapping_add(operands[i]),
                _ if compares[i] == old[i] => operands[i],
                _ => old[i],
            })
            .collect();
        let dmable = self.rng.percent(50);
        let guard = 0xf0 | from as u8;
        let mut operand = Mem::new(&self.region, dmable, count * 8, guard);
        let mut compare = Mem::new(&self.region, dmable, count * 8, guard);
        for i in 0..count {
            operand.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&operands[i].to_le_bytes());
            compare.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&compares[i].to_le_bytes());
        }
        let result = (call != AtomicCall::Write)
            .then(|| Mem::new(&self.region, self.rng.percent(50), count * 8, guard));
        let dest = self.eps[to].m.addr();
        let key = self.eps[to].words[which].key;
        let ep = &mut self.eps[from];
        let context = ep.context();
        let req = AtomicReq {
            dest,
            call,
            op,
            datatype: Datatype::U64,
            count,
            operand: operand.iov(count * 8),
            compare: compare.iov(if call == AtomicCall::Compare {
                count * 8
            } else {
                0
            }),
            result: result
                .as_ref()
                .map_or(IovList::One((0, 0)), |r| r.iov(count * 8)),
            addr: (first * 8) as u64,
            key,
            context,
            completion: true,
        };
        // SAFETY: the buffers live in the operation until its completion.
        match unsafe { ep.m.atomic(req) } {
            Ok(()) => {}
            Err(unimem_proto::PostError::Again) => return,
            Err(e) => {
                let what = format!("{:?} refused an atomic to its peer: {e:?}", ep.who);
                self.fail(&what)
            }
        }
        let peer = self.eps[to].who;
        let step = self.step;
        self.eps[from].ops.insert(
            context,
            Op {
                peer,
                kind: OpKind::Atomic {
                    words: which,
                    first,
                    old,
                    new,
                    result,
                    _operand: operand,
                    _compare: compare,
                },
                step,
                at: Instant::now(),
            },
        );
        for b in &mut self.eps[to].words[which].busy[first..first + count] {
            *b = true;
        }
        self.stats.atomics += 1;
    }

    /// Keeps traffic going: new operations while few are open.
    pub(crate) fn traffic(&mut self, quiet: bool) {
        for from in 0..2 {
            self.post_receives(from);
            if quiet {
                continue;
            }
            let peer = self.eps[1 - from].who;
            let open = self.eps[from].open_ops(peer);
            if open < 12 && self.rng.percent(30) {
                self.post_send(from);
            }
            if open < 12 && self.rng.percent(8) {
                self.post_rma(from);
            }
            if open < 12 && self.rng.percent(8) {
                self.post_atomic(from);
            }
        }
        if !quiet {
            self.h_traffic();
        }
    }

    // --- events and their checks -----------------------------------------------

    pub(crate) fn drain_events(&mut self) {
        for at in 0..2 {
            while let Some(event) = self.eps[at].m.next_event() {
                self.on_event(at, event);
            }
        }
        if let Some(h) = self.h.as_mut() {
            while let Some(event) = h.m.next_event() {
                let context = match event {
                    Event::Send { context, .. } | Event::Rma { context, .. } => context,
                    Event::RmaError { context, .. } => context,
                    Event::Recv(done) => {
                        h.recvs = h.recvs.saturating_sub(1);
                        done.context
                    }
                    Event::Error(e) => {
                        if !e.send {
                            h.recvs = h.recvs.saturating_sub(1);
                        }
                        e.context
                    }
                    _ => continue,
                };
                h.ops.remove(&context);
            }
        }
    }

    fn on_event(&mut self, at: usize, event: Event<MailboxAddr>) {
        let who = self.eps[at].who;
        let context = match &event {
            Event::Send { context, .. }
            | Event::Rma { context, .. }
            | Event::RmaError { context, .. } => *context,
            Event::Recv(done) => done.context,
            Event::Error(e) => e.context,
            Event::RemoteWrite { .. } | Event::RemoteAccess { .. } => return,
        };
        let Some(op) = self.eps[at].ops.remove(&context) else {
            self.fail(&format!(
                "{who:?} reported an operation it does not have (or a second time): {event:?}"
            ));
        };
        if op.peer == Who::H {
            return self.on_h_event(op, &event);
        }
        let ok = match (&op.kind, &event) {
            (OpKind::Send { mem, seed, len }, Event::Send { .. }) => mem
                .as_ref()
                .is_none_or(|m| m.guards_intact() && is_pattern(&m.bytes()[..*len], *seed)),
            (OpKind::Recv { mem, seed, len }, Event::Recv(done)) => {
                done.len == *len
                    && done.buf == mem.addr()
                    && mem.guards_intact()
                    && is_pattern(&mem.bytes()[..*len], *seed)
                    && mem.bytes()[*len..].iter().all(|&b| b == FILL)
            }
            (
                OpKind::Write {
                    local,
                    range,
                    slot,
                    at: off,
                    len,
                },
                Event::Rma {
                    kind: RmaKind::Write,
                    ..
                },
            ) => {
                let target = &mut self.eps[1 - at].ranges[*range];
                let start = slot * RMA_SLOT + off;
                target.shadow[start..start + len].copy_from_slice(local.bytes());
                target.busy[*slot] = false;
                local.guards_intact()
            }
            (
                OpKind::Read {
                    local,
                    range,
                    slot,
                    at: off,
                    len,
                },
                Event::Rma {
                    kind: RmaKind::Read,
                    ..
                },
            ) => {
                let target = &mut self.eps[1 - at].ranges[*range];
                let start = slot * RMA_SLOT + off;
                target.busy[*slot] = false;
                local.guards_intact() && local.bytes() == &target.shadow[start..start + len]
            }
            (
                OpKind::Atomic {
                    words,
                    first,
                    old,
                    new,
                    result,
                    ..
                },
                Event::Rma {
                    kind: RmaKind::Atomic | RmaKind::AtomicFetch,
                    ..
                },
            ) => {
                let target = &mut self.eps[1 - at].words[*words];
                let count = old.len();
                let mut ok = true;
                for i in 0..count {
                    let w = first + i;
                    let now = u64::from_le_bytes(
                        target.mem.bytes()[w * 8..w * 8 + 8].try_into().unwrap(),
                    );
                    ok &= now == new[i];
                    target.values[w] = new[i];
                    target.busy[w] = false;
                    if let Some(r) = result {
                        let got =
                            u64::from_le_bytes(r.bytes()[i * 8..i * 8 + 8].try_into().unwrap());
                        ok &= got == old[i] && r.guards_intact();
                    }
                }
                ok
            }
            _ => false,
        };
        if !ok {
            self.fail(&format!(
                "{who:?}: operation with {:?} ended wrong or with wrong data: {event:?}",
                op.peer
            ));
        }
        // The target's range must hold its shadow outside the slots in use.
        if let OpKind::Write { range, .. } | OpKind::Read { range, .. } = op.kind {
            self.check_range(1 - at, range);
        }
    }

    pub(crate) fn check_ranges(&self, at: usize) {
        for i in 0..self.eps[at].ranges.len() {
            self.check_range(at, i);
        }
    }

    fn check_range(&self, at: usize, i: usize) {
        let range = &self.eps[at].ranges[i];
        for slot in 0..RMA_SLOTS {
            let span = slot * RMA_SLOT..(slot + 1) * RMA_SLOT;
            if !range.busy[slot] && range.mem.bytes()[span.clone()] != range.shadow[span] {
                self.fail(&format!(
                    "{:?}: exposed range {i}, slot {slot}, changed outside any RMA",
                    self.eps[at].who
                ));
            }
        }
    }

    fn on_h_event(&mut self, op: Op, event: &Event<MailboxAddr>) {
        match (op.kind, event) {
            (OpKind::HRecv { slot }, Event::Recv(done)) => {
                let (mem, posted) = &mut self.h_slots[slot];
                if done.buf != mem.addr() || done.len > H_RECV_LEN {
                    self.fail(&format!("A: receive from H ended wrong: {event:?}"));
                }
                *posted = false;
                self.stats.h_recvs += 1;
            }
            (OpKind::HRecv { slot }, Event::Error(e)) if !e.send => {
                self.h_slots[slot].1 = false;
            }
            (OpKind::Send { mem, seed, len }, Event::Send { .. } | Event::Error(_)) => {
                if mem
                    .as_ref()
                    .is_some_and(|m| !m.guards_intact() || !is_pattern(&m.bytes()[..len], seed))
                {
                    self.fail("A: a send buffer of a send to H changed");
                }
            }
            _ => self.fail(&format!("A: operation with H ended wrong: {event:?}")),
        }
    }
}
