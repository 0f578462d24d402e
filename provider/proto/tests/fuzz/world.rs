//! The world's making: A's and B's endpoints with their exposed ranges,
//! words and canaries, and the world around them.

use super::*;

impl Endpoint {
    fn new(who: Who, job: JobId, region: &Arc<DmaRegion>, keys: &Arc<KeyTable>) -> Endpoint {
        let tap = Tap::open(job);
        let state = tap.state.clone();
        let mut m = Messenger::with_private_dma(tap, engine(region), config()).expect("messenger");
        m.limit_rx_ids(RX_IDS);
        let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        let guard = if who == Who::A { 0xa5 } else { 0xb5 };
        let ranges = [true, false]
            .into_iter()
            .map(|dmable| {
                let mem = Mem::new(region, dmable, RMA_SLOTS * RMA_SLOT, guard);
                let key = fresh_key();
                let _handle = expose(keys, key, &mem, rw);
                let shadow = mem.bytes().to_vec();
                Range {
                    mem,
                    key,
                    _handle,
                    shadow,
                    busy: [false; RMA_SLOTS],
                }
            })
            .collect();
        let words = [true, false]
            .into_iter()
            .map(|dmable| {
                let mut mem = Mem::new(region, dmable, WORDS * 8, guard);
                mem.bytes_mut().fill(0);
                let key = fresh_key();
                let _handle = expose(keys, key, &mem, rw);
                Words {
                    mem,
                    key,
                    _handle,
                    values: [0; WORDS],
                    busy: [false; WORDS],
                }
            })
            .collect();
        let canaries = vec![
            Mem::new(region, true, 4096, guard),
            Mem::new(region, false, 4096, guard),
        ];
        Endpoint {
            who,
            m,
            tap: state,
            ops: HashMap::new(),
            next_context: 0,
            ranges,
            words,
            canaries,
            incoming: VecDeque::new(),
        }
    }
}

impl World {
    pub(crate) fn new(seed: u64) -> World {
        let job = JobId::from_name(&format!("proto-fuzz-{}", std::process::id()));
        let region = testing::region(job, 1 << 30);
        let keys = KeyTable::for_process(job).expect("key table");
        let a = Endpoint::new(Who::A, job, &region, &keys);
        let b = Endpoint::new(Who::B, job, &region, &keys);
        let h_slots = (0..H_RECV_SLOTS)
            .map(|_| (Mem::new(&region, true, H_RECV_LEN, 0xa6), false))
            .collect();
        let h_range = Mem::new(&region, true, H_RANGE, 0xa7);
        let h_key = fresh_key();
        let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        let _h_handle = expose(&keys, h_key, &h_range, rw);
        let h_heap = Mem::new(&region, false, H_RANGE, 0xa9);
        let h_heap_key = fresh_key();
        let _h_heap_handle = expose(&keys, h_heap_key, &h_heap, rw);
        let private_keys = [&a, &b]
            .into_iter()
            .flat_map(|e| {
                e.ranges
                    .iter()
                    .map(|r| r.key)
                    .chain(e.words.iter().map(|w| w.key))
            })
            .collect();
        World {
            job,
            region,
            _keys: keys,
            eps: [a, b],
            h: None,
            h_slots,
            h_range,
            h_key,
            _h_handle,
            h_heap,
            h_heap_key,
            _h_heap_handle,
            private_keys,
            step: 0,
            rng: Rng(seed),
            seed,
            stats: Stats::default(),
            lost_before: 0,
            polite: false,
        }
    }

    pub(crate) fn fail(&self, what: &str) -> ! {
        panic!(
            "fuzz invariant broken at execution {} (step {}, seed {:#x}): {what}\nreplay: UNIMEM_FUZZ_SEED={:#x} UNIMEM_FUZZ_EXECS={}",
            self.stats.execs,
            self.step,
            self.seed,
            self.seed,
            self.stats.execs + 1
        )
    }

    pub(crate) fn addr_of(&self, who: Who) -> MailboxAddr {
        match who {
            Who::A => self.eps[0].m.addr(),
            Who::B => self.eps[1].m.addr(),
            Who::H => self.h.as_ref().expect("H").m.addr(),
        }
    }
}
