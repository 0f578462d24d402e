//! H: a hostile endpoint that did first contact with A like any peer,
//! its own honest traffic with A, and its end.

use super::*;

impl World {
    // --- H ---------------------------------------------------------------------------

    /// A new hostile endpoint that does first contact with A.
    pub(crate) fn new_hostile(&mut self) {
        let tap = Tap::open(self.job);
        let state = tap.state.clone();
        let route = tap.connect(&self.eps[0].m.addr()).expect("route to A");
        let m = Messenger::with_private_dma(tap, engine(&self.region), config()).expect("H");
        let arena = self.region.alloc(H_ARENA).expect("H's memory");
        self.h = Some(Hostile {
            m,
            tap: state,
            route,
            arena,
            ops: HashSet::new(),
            next_context: 0,
            recvs: 0,
            next_send: 0,
        });
        self.lost_before = self.eps[0].m.peers_lost();
        self.polite = self.rng.percent(20);
        // First contact both ways: A posts its receives for H (and greets
        // it), H sends and A answers.
        self.h_post_receives();
        self.h_send();
        self.a_send_to_h();
        let deadline = Instant::now() + DRAIN_TIME;
        while self.h.as_ref().unwrap().tap.lock().peer_ring.is_none() {
            if Instant::now() > deadline {
                self.fail("first contact of A and a new H never completed");
            }
            self.step_all();
        }
        // H's hello is in A's mailbox before A's reached H: a few steps
        // more and A has taken it.
        for _ in 0..8 {
            self.step_all();
        }
        self.stats.rounds += 1;
    }

    pub(crate) fn h_fenced(&self) -> bool {
        self.eps[0].m.peers_lost() > self.lost_before
    }

    /// A keeps its receives for H posted (while it still listens to H).
    fn h_post_receives(&mut self) {
        if self.h_fenced() {
            return;
        }
        let src = self.addr_of(Who::H);
        for slot in 0..H_RECV_SLOTS {
            if self.h_slots[slot].1 {
                continue;
            }
            let ep = &mut self.eps[0];
            let context = ep.context();
            let mem = &self.h_slots[slot].0;
            let recv = PostedRecv {
                context,
                iov: mem.iov(H_RECV_LEN),
                src: Some(src),
                tag: 0,
                ignore: u64::MAX,
                completion: true,
                multi_recv: false,
            };
            ep.ops.insert(
                context,
                Op {
                    peer: Who::H,
                    kind: OpKind::HRecv { slot },
                    step: self.step,
                    at: Instant::now(),
                },
            );
            self.h_slots[slot].1 = true;
            // SAFETY: the slots live as long as the world.
            unsafe { self.eps[0].m.post_recv(self.rng.percent(50), recv) };
        }
    }

    /// H's messenger sends A a message from its memory.
    fn h_send(&mut self) {
        let dest = self.eps[0].m.addr();
        let len = match self.rng.below(3) {
            0 => self.rng.below(23),
            1 => self.rng.range(23, EAGER),
            _ => self.rng.range(EAGER + 1, 4 * FRAGMENT),
        };
        let tag = self.rng.percent(50).then(|| self.rng.next_u64());
        let delivery_complete = self.rng.percent(20);
        let h = self.h.as_mut().unwrap();
        // Round-robin over the first half of its arena.
        let at = h.next_send % (H_ARENA / 2 - 4 * FRAGMENT);
        h.next_send = h.next_send.wrapping_add(len + 64);
        h.next_context += 1;
        let context = h.next_context;
        let req = SendReq {
            dest,
            iov: IovList::One((h.arena.as_ptr() as usize + at, len)),
            info: MatchInfo { tag, data: None },
            context,
            completion: true,
            inject: false,
            copy: false,
            delivery_complete,
        };
        // SAFETY: the arena outlives H's messenger's use of it.
        if unsafe { h.m.send(req) }.is_ok() {
            h.ops.insert(context);
        }
    }

    /// A sends H a message; H keeps receives posted for them.
    fn a_send_to_h(&mut self) {
        let dest = self.addr_of(Who::H);
        let len = match self.rng.below(3) {
            0 => self.rng.below(23),
            1 => self.rng.range(23, EAGER),
            _ => self.rng.range(EAGER + 1, 4 * FRAGMENT),
        };
        let seed = self.rng.next_u64();
        let dmable = self.rng.percent(50);
        let mut mem = Mem::new(&self.region, dmable, len, 0xa8);
        fill_pattern(mem.bytes_mut(), seed);
        let ep = &mut self.eps[0];
        let context = ep.context();
        let req = SendReq {
            dest,
            iov: mem.iov(len),
            info: MatchInfo::default(),
            context,
            completion: true,
            inject: false,
            copy: false,
            delivery_complete: self.rng.percent(20),
        };
        // SAFETY: `mem` lives in the operation until its completion.
        if unsafe { ep.m.send(req) }.is_ok() {
            ep.ops.insert(
                context,
                Op {
                    peer: Who::H,
                    kind: OpKind::Send {
                        mem: Some(mem),
                        seed,
                        len,
                    },
                    step: self.step,
                    at: Instant::now(),
                },
            );
            self.stats.a_sends_to_h += 1;
        }
        let a = self.eps[0].m.addr();
        let h = self.h.as_mut().unwrap();
        while h.recvs < 4 {
            h.next_context += 1;
            let context = h.next_context;
            let at = H_ARENA / 2 + h.recvs * 4 * FRAGMENT;
            let recv = PostedRecv {
                context,
                iov: IovList::One((h.arena.as_ptr() as usize + at, 4 * FRAGMENT)),
                src: Some(a),
                tag: 0,
                ignore: 0,
                completion: true,
                multi_recv: false,
            };
            // SAFETY: the arena outlives H's messenger's use of it.
            unsafe { h.m.post_recv(false, recv) };
            h.recvs += 1;
        }
    }

    /// H's RMA and atomics on the range A exposes to it.
    fn h_rma(&mut self) {
        let dest = self.eps[0].m.addr();
        let key = self.h_key;
        let at = self.rng.below(H_RANGE);
        let len = self.rng.below((H_RANGE - at).min(3 * FRAGMENT) + 1);
        let kind = if self.rng.percent(50) {
            RmaKind::Write
        } else {
            RmaKind::Read
        };
        let atomic = self.rng.percent(30);
        let h = self.h.as_mut().unwrap();
        h.next_context += 1;
        let context = h.next_context;
        let local = h.arena.as_ptr() as usize + H_ARENA - 4 * FRAGMENT;
        let posted = if atomic {
            let req = AtomicReq {
                dest,
                call: AtomicCall::Fetch,
                op: AtomicOp::Sum,
                datatype: Datatype::U64,
                count: 2,
                operand: IovList::One((local, 16)),
                compare: IovList::One((local, 0)),
                result: IovList::One((local + 16, 16)),
                addr: (at & !7).min(H_RANGE - 16) as u64,
                key,
                context,
                completion: true,
            };
            // SAFETY: the arena outlives H's messenger's use of it.
            unsafe { h.m.atomic(req) }
        } else {
            let req = RmaReq {
                dest,
                iov: IovList::One((local, len)),
                addr: at as u64,
                key,
                context,
                completion: true,
                inject: false,
                data: None,
            };
            // SAFETY: as above.
            unsafe { h.m.rma(kind, req) }
        };
        if posted.is_ok() {
            h.ops.insert(context);
        }
    }

    pub(crate) fn h_traffic(&mut self) {
        let Some(h) = self.h.as_ref() else {
            return;
        };
        let h_open = h.ops.len();
        self.h_post_receives();
        if h_open < 6 && self.rng.percent(15) {
            self.h_send();
        }
        if h_open < 6 && self.rng.percent(5) {
            self.h_rma();
        }
        if self.eps[0].open_ops(Who::H) < H_RECV_SLOTS + 3 && self.rng.percent(8) {
            self.a_send_to_h();
        }
    }

    /// H's round is over: its mailbox closes, A must end everything it had
    /// with H, then H's memory goes.
    pub(crate) fn end_hostile(&mut self) {
        // Out of the world (no more traffic with it), alive until A is
        // done with it.
        let h = self.h.take().unwrap();
        h.tap.lock().mbx = None;
        if self.h_fenced() {
            self.stats.fenced += 1;
        }
        let deadline = Instant::now() + DRAIN_TIME;
        while self.eps[0].open_ops(Who::H) > 0 {
            if Instant::now() > deadline {
                let open: Vec<_> = self.eps[0]
                    .ops
                    .iter()
                    .filter(|(_, o)| o.peer == Who::H)
                    .map(|(c, o)| (*c, matches!(o.kind, OpKind::HRecv { .. })))
                    .collect();
                self.fail(&format!(
                    "A's operations with a gone H never ended: {open:?} (context, is a receive)"
                ));
            }
            self.step_all();
            self.check_memory();
        }
        // Nothing of A refers to H's memory any more.
        drop(h);
    }
}
