//! The progress agent (`FI_PROGRESS_AUTO`, `FI_UNIMEM_ASYNC_PROGRESS`)
//! between separate `fabric-peer` processes through the real libfabric
//! core: a process that makes no libfabric call (`sleep-no-progress`) still
//! has its receives filled, its peers' sends completed and its memory
//! served to their RMA and atomics; the same steps without the agent are
//! shown to wait for the sleeper, so that each check can fail. And a
//! blocking CQ read sleeps on the mailbox's doorbell instead of polling.

use std::time::{Duration, Instant};

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{carried, Cluster, Kind, Msg, Order, Region, Reply, EAGER, SEGMENT};
use unimem_tests::payload;

/// Every process with the agent (the tunable), or without (`None`).
fn cluster(test: &str, agent: Option<&str>) -> Cluster {
    let mut c = super::cluster(test);
    c.env("FABRIC_PEER_CNTR", "1");
    c.env("FI_LOG_LEVEL", "info");
    match agent {
        Some("tunable") => {
            c.env("FI_UNIMEM_ASYNC_PROGRESS", "1");
        }
        Some("auto") => {
            c.env("FABRIC_PEER_PROGRESS", "auto");
        }
        _ => {}
    }
    c
}

/// Sizes of every protocol: inline, eager, rendezvous of one and of many
/// fragments.
const SIZES: [usize; 6] = [8, 1000, EAGER, EAGER + 1, SEGMENT + 3, 3 * SEGMENT + 5];

/// Every process's log (`FI_LOG_LEVEL=info`) says its agent started.
fn every_agent_started(stderr: &[String]) {
    assert!(
        stderr.iter().all(|e| e.contains("progress agent started")),
        "{stderr:?}"
    );
}

/// Asks the sleeping process `i` for `command` (one that makes no libfabric
/// call) until `done` holds for its answer, for at most 10 s.
fn poll_asleep(c: &mut Cluster, i: usize, command: &str, done: impl Fn(&Reply) -> bool) -> Reply {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        c.begin(i, command);
        let reply = Reply {
            lines: Vec::new(),
            ok: c.next_line(i),
        };
        if done(&reply) || Instant::now() >= until {
            return reply;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_receiver_that_computes_has_its_data_in_place_and_its_sender_completes() {
    for agent in ["tunable", "auto"] {
        let mut c = cluster(&format!("agent-recv-{agent}"), Some(agent));
        c.spawn(2).connect_all();
        for (n, &len) in SIZES.iter().enumerate() {
            let (ctx, seed) = (100 + n as u64, 7 + n as u64);
            let what = format!("{len} bytes, agent by {agent}");
            c.cmd(1, format!("recv 0 {len} {ctx}"));
            let sleep = c.begin(1, "sleep-no-progress wake");
            assert_eq!(c.next_line(1), "sleeping");
            c.cmd(0, format!("send 1 {len} {seed} {ctx}"));
            // The sender's completion needs the receiver's side of the
            // protocol (its grants, its acknowledgement): the agent's.
            let sent = c.cmd(0, "wait sends=1 within=10000").completions();
            assert_eq!((sent[0].kind, sent[0].ctx), (Kind::Send, ctx), "{what}");
            let want = payload::checksum(&payload::pattern(seed, len));
            let sum = poll_asleep(&mut c, 1, &format!("recv-sum {ctx} {len}"), |r| {
                r.field("sum") as u64 == want
            });
            assert_eq!(
                sum.field("sum") as u64,
                want,
                "data of {what} while the receiver computes"
            );
            c.begin(1, "wake");
            c.answers(&[(1, sleep)]);
            let got = c.cmd(1, "wait recvs=1").completions();
            assert_eq!(
                (got[0].kind, got[0].ctx, got[0].len),
                (Kind::Recv, ctx, len),
                "{what}"
            );
            assert_eq!(got[0].sum, want, "{what}");
        }
        let stderr = c.finish();
        every_agent_started(&stderr);
    }
}

#[test]
fn without_the_agent_a_rendezvous_waits_for_the_receiver() {
    // What the test above relies on the agent for: without it, a send above
    // the eager size to a receiver that makes no call does not complete.
    let mut c = cluster("agent-none", None);
    c.spawn(2).connect_all();
    let len = 3 * SEGMENT + 5;
    c.cmd(1, format!("recv 0 {len} 1"));
    let sleep = c.begin(1, "sleep-no-progress wake");
    assert_eq!(c.next_line(1), "sleeping");
    c.cmd(0, format!("send 1 {len} 9 1"));
    c.cmd(0, "quiet 500");
    let sum = poll_asleep(&mut c, 1, &format!("recv-sum 1 {len}"), |_| true);
    assert_ne!(
        sum.field("sum") as u64,
        payload::checksum(&payload::pattern(9, len))
    );
    c.begin(1, "wake");
    c.answers(&[(1, sleep)]);
    c.cmd(0, "wait sends=1");
    c.cmd(1, "wait recvs=1");
    let stderr = c.finish();
    assert!(
        stderr.iter().all(|e| !e.contains("progress agent started")),
        "{stderr:?}"
    );
}

#[test]
fn a_target_that_computes_serves_rma_and_atomics_on_ordinary_memory() {
    // No dmable heap: the region is ordinary memory, so every operation
    // needs the target's progress.
    const REGION: usize = 4 * SEGMENT;
    for agent in [Some("tunable"), None] {
        let mut c = cluster(&format!("agent-rma-{agent:?}"), agent);
        c.spawn(2).connect_all();
        let mut r = Region::new(&mut c, 1, 0x21, REGION, 3, "rw");
        let sleep = c.begin(1, "sleep-no-progress wake");
        assert_eq!(c.next_line(1), "sleeping");
        let mut seed = 40;
        let mut writes = 0;
        for len in [8, 1000, EAGER + 1, 2 * SEGMENT + 7] {
            seed += 1;
            let off = (len * 3) % (REGION - len);
            c.cmd(0, format!("write 1 {} {off} {len} {seed} {seed}", r.key));
            r.written(off, len, seed);
            writes += 1;
        }
        if agent.is_none() {
            // Without the agent nothing completes while the target sleeps.
            c.cmd(0, "quiet 300");
            c.begin(1, "wake");
            c.answers(&[(1, sleep)]);
            c.cmd(0, format!("wait writes={writes}"));
            c.finish();
            continue;
        }
        c.cmd(0, format!("wait writes={writes} within=10000"));
        // A read after the writes completed sees them all.
        c.cmd(0, format!("read 1 {} 100 5000 77", r.key));
        c.cmd(
            0,
            format!("atomic 1 {} 64 fetch u64 sum 1 ops=5 ctx=78 nowait", r.key),
        );
        let done = c.cmd(0, "wait reads=1 within=10000").completions();
        let read = done
            .iter()
            .find(|d| d.kind == Kind::Read)
            .expect("the read");
        // Every write before the read: what it read is the model's bytes.
        assert_eq!(read.sum, r.sum(100, 5000), "the read, target computing");
        let fetched = c.cmd(0, "atomic-wait 78");
        assert_eq!(fetched.field("err"), 0, "{fetched:?}");
        // The atomic added 5 to the u64 at 64 (little-endian).
        let old = u64::from_le_bytes(r.bytes[64..72].try_into().unwrap());
        assert_eq!(fetched.field("old") as u64, old, "{fetched:?}");
        r.bytes[64..72].copy_from_slice(&old.wrapping_add(5).to_le_bytes());
        r.check_asleep(&mut c, "after the writes and the atomic, target computing");
        c.begin(1, "wake");
        c.answers(&[(1, sleep)]);
        r.check(&mut c, "awake");
        c.finish();
    }
}

#[test]
fn a_blocking_read_sleeps_until_its_completion_comes() {
    for agent in [None, Some("tunable")] {
        let mut c = cluster(&format!("agent-sread-{agent:?}"), agent);
        c.env("FABRIC_PEER_CQ_WAIT", "unspec");
        c.spawn(2).connect_all();
        // Nothing comes: the read times out, asleep.
        let idle = c.cmd(1, "sread 400");
        assert_eq!(idle.field("rc"), -11, "{idle:?}");
        // A message comes 400 ms into the read: it returns with it.
        c.cmd(1, "recv 0 100 5");
        let reading = c.begin(1, "sread 5000");
        std::thread::sleep(Duration::from_millis(400));
        c.cmd(0, "send 1 100 6 5");
        let woke = c.answers(&[(1, reading)]).remove(0);
        assert_eq!(woke.field("rc"), 1, "{woke:?}");
        let wall = woke.float("wall_ms");
        assert!((300.0..4000.0).contains(&wall), "{woke:?}");
        for reply in [&idle, &woke] {
            // Asleep, not polling: a few percent of the wait at most.
            let (cpu, wall) = (reply.float("cpu_ms"), reply.float("wall_ms"));
            assert!(cpu < 0.05 * wall + 5.0, "agent {agent:?}: {reply:?}");
        }
        let got = c.cmd(1, "wait recvs=1").completions();
        assert_eq!((got[0].ctx, got[0].len), (5, 100));
        c.cmd(0, "wait sends=1");
        c.finish();
    }
}

/// `fi_cntr_wait` on a counter with a wait object sleeps on the doorbells
/// as `fi_cq_sread` does: a wait that times out and one ended by a read the
/// target serves when it wakes 400 ms later (its memory is ordinary and it
/// makes no call meanwhile; with the agent, its agent serves it earlier)
/// each cost the waiting process a few percent of the wait.
#[test]
fn a_counter_wait_sleeps_until_its_count_comes() {
    for agent in [None, Some("tunable")] {
        let mut c = cluster(&format!("agent-cntr-wait-{agent:?}"), agent);
        c.env("FABRIC_PEER_CNTR_WAIT", "unspec");
        c.spawn(2).connect_all();
        assert_eq!(c.cmd(1, "mr 0x77 4096 access=rw seed=9").num(), 0);
        let idle = c.cmd(0, "cntr-sleep read 1 400");
        assert_eq!(idle.field("rc"), -i64::from(ffi::FI_ETIMEDOUT), "{idle:?}");
        // The target sleeps: the read is served when it wakes.
        let asleep = c.begin(1, "sleep-no-progress 400");
        assert_eq!(c.next_line(1), "sleeping");
        c.cmd(0, "read 1 0x77 0 4096 3");
        let woke = c.cmd(0, "cntr-sleep read 1 5000");
        assert_eq!(woke.field("rc"), 0, "{woke:?}");
        // Served when the target wakes, or by its agent while it sleeps.
        let wall = woke.float("wall_ms");
        let earliest = if agent.is_none() { 200.0 } else { 0.0 };
        assert!((earliest..4000.0).contains(&wall), "{woke:?}");
        c.answers(&[(1, asleep)]);
        let read = c.cmd(0, "wait reads=1").completions();
        assert_eq!(read[0].sum, payload::checksum(&payload::pattern(9, 4096)));
        for reply in [&idle, &woke] {
            let (cpu, wall) = (reply.float("cpu_ms"), reply.float("wall_ms"));
            assert!(cpu < 0.05 * wall + 5.0, "agent {agent:?}: {reply:?}");
        }
        c.finish();
    }
}

/// The DMA engine's own thread (`async_copy_min`): with the agent, a large
/// put and get of dmable memory are copied on it while the initiator goes
/// on (here: computes without a call), land intact and complete; without
/// the agent every copy is done inside its call. The close line counts
/// the copies the thread did, so each half can fail.
#[test]
fn large_transfers_move_on_the_engines_thread_with_the_agent() {
    const LEN: usize = 4 * SEGMENT + 3;
    for agent in [Some("tunable"), None] {
        let mut c = cluster(&format!("agent-copies-{agent:?}"), agent);
        c.preload_heap();
        c.spawn(2).connect_all();
        let mut r = Region::new(&mut c, 1, 0x31, 2 * LEN, 5, "rw");
        c.cmd(0, format!("write 1 {} 0 {LEN} 61 1", r.key));
        r.written(0, LEN, 61);
        c.cmd(0, format!("read 1 {} {LEN} {LEN} 2", r.key));
        // The initiator computes: its copies go on without it.
        let sleep = c.begin(0, "sleep-no-progress wake");
        assert_eq!(c.next_line(0), "sleeping");
        std::thread::sleep(Duration::from_millis(50));
        c.begin(0, "wake");
        c.answers(&[(0, sleep)]);
        let done = c.cmd(0, "wait writes=1 reads=1 within=10000").completions();
        let read = done
            .iter()
            .find(|d| d.kind == Kind::Read)
            .expect("the read");
        assert_eq!(
            read.sum,
            r.sum(LEN, LEN),
            "the get's bytes, agent {agent:?}"
        );
        r.check(&mut c, &format!("the put's bytes, agent {agent:?}"));
        let stderr = c.finish();
        let moved = stderr[0]
            .lines()
            .find(|l| l.contains("copied by the DMA engine's thread"))
            .map(|l| {
                let head = l.split(" transfers of its domain").next().expect("split");
                head.rsplit(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .expect("count")
            })
            .unwrap_or(0);
        if agent.is_some() {
            assert!(moved >= 2, "put and get on the engine's thread: {moved}");
        } else {
            assert_eq!(moved, 0, "no engine thread without the agent");
        }
    }
}

/// A process that exits on the agent's own thread (a library's signal
/// handler that calls exit ran there) ends with its status: the provider's
/// cleanup does not try to join the thread it runs on (it panicked with
/// "failed to join thread: Resource deadlock avoided").
#[test]
fn a_process_exiting_on_the_agents_thread_ends_cleanly() {
    let mut c = cluster("exit-on-agent", Some("auto"));
    c.spawn(2).connect_all();
    c.transfer(0, 1, &[Msg::new(100, 1)], Order::Posted);
    c.begin(1, "exit-on-agent");
    let status = c.wait_death(1);
    let stderr = c.peers[1].stderr();
    assert_eq!(status.code(), Some(3), "{status:?}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    c.cmd(0, "quiet 10");
    c.finish_with_warnings();
}

/// The agent and the application's own calls take turns on one endpoint
/// (the hand-over), over and over, on every path: in each round one
/// process computes (no libfabric call) while the other sends it messages
/// of every protocol size, tagged with CQ data (half to receives it posted
/// before, half arriving unexpected), writes (some injected) and reads its
/// regions in dmable memory (one-sided, the heap's threshold at 64 KiB)
/// and in ordinary memory (served by the target: by its agent), and adds
/// to a word of each with a fetching atomic; that side's operations must
/// complete while it computes. Then it calls again, taking the endpoint
/// back from its agent, and takes the unexpected messages; the roles swap
/// every round. With `FI_THREAD_DOMAIN` the endpoint's locks are elided
/// and only the hand-over keeps the agent and the application apart (an
/// overlap panics on the lock's busy flag); with `FI_THREAD_SAFE` they
/// lock. Every byte, every atomic's old value and every region is checked
/// against a model.
#[test]
fn the_agent_and_the_application_take_turns_on_every_path() {
    const SMALL: usize = 16 << 10; // below the heap's threshold: ordinary memory
    const LARGE: usize = 4 * SEGMENT; // dmable
    const BURST: usize = 40;
    for threading in ["domain", "safe"] {
        let mut c = cluster(&format!("agent-turns-{threading}"), Some("tunable"));
        c.env("FABRIC_PEER_THREADING", threading);
        c.preload_heap();
        c.env("FI_UNIMEM_HEAP_THRESHOLD", "64k");
        c.spawn(2).connect_all();
        let mut regions = [
            [
                Region::new(&mut c, 0, 0x41, SMALL, 11, "rw"),
                Region::new(&mut c, 0, 0x42, LARGE, 12, "rw"),
            ],
            [
                Region::new(&mut c, 1, 0x43, SMALL, 13, "rw"),
                Region::new(&mut c, 1, 0x44, LARGE, 14, "rw"),
            ],
        ];
        let mut seed = 100;
        for round in 0..10u64 {
            let (rx, tx) = ((round % 2) as usize, 1 - (round % 2) as usize);
            let what = |w: &str| format!("round {round}, p{rx} computing, {threading}: {w}");
            let sends: Vec<(usize, u64, u64)> = SIZES
                .iter()
                .chain(SIZES.iter())
                .enumerate()
                .map(|(i, &len)| (len, seed + i as u64, round << 8 | i as u64))
                .collect();
            seed += sends.len() as u64;
            // Even ones posted before, odd ones unexpected.
            for (i, &(len, _, tag)) in sends.iter().enumerate().step_by(2) {
                c.cmd(rx, format!("recv {tx} {len} {i} tag={tag}"));
            }
            let sleep = c.begin(rx, "sleep-no-progress wake");
            assert_eq!(c.next_line(rx), "sleeping");
            for (i, &(len, s, tag)) in sends.iter().enumerate() {
                c.cmd(
                    tx,
                    format!("send {rx} {len} {s} {i} tag={tag} data={round}"),
                );
            }
            let mut writes = 0;
            for r in regions[rx].iter_mut() {
                let len = r.bytes.len();
                for (n, size) in [8, 100, 1000, len / 3].into_iter().enumerate() {
                    seed += 1;
                    let off = (size * (n + 1) + round as usize * 64) % (len - size);
                    let inject = if size <= 1000 && n % 2 == 0 {
                        " inject"
                    } else {
                        ""
                    };
                    c.cmd(
                        tx,
                        format!("write {rx} {} {off} {size} {seed} {seed}{inject}", r.key),
                    );
                    r.written(off, size, seed);
                    writes += usize::from(inject.is_empty());
                }
            }
            // All but the unexpected rendezvous, which wait for a receive.
            let early = sends
                .iter()
                .enumerate()
                .filter(|&(i, &(len, _, _))| i % 2 == 0 || len <= EAGER)
                .count();
            c.cmd(
                tx,
                format!("wait sends={early} writes={writes} within=10000"),
            );
            for r in regions[rx].iter_mut() {
                let ctx = 1000 + seed;
                seed += 1;
                let reply = c.cmd(
                    tx,
                    format!("atomic {rx} {} 0 fetch u64 sum 1 ops=3 ctx={ctx}", r.key),
                );
                assert_eq!(reply.field("err"), 0, "{reply:?}");
                let old = r.u64_at(0);
                assert_eq!(reply.field("old") as u64, old, "{}", what("atomic"));
                r.bytes[0..8].copy_from_slice(&old.wrapping_add(3).to_le_bytes());
                let (off, size) = (r.bytes.len() / 4, r.bytes.len() / 2);
                c.cmd(tx, format!("read {rx} {} {off} {size} {ctx}", r.key));
                let done = c.cmd(tx, "wait reads=1 within=10000").completions();
                assert_eq!(done[0].sum, r.sum(off, size), "{}", what("read"));
                r.check_asleep(&mut c, &what("region"));
            }
            // Back in while the agent serves a burst of writes into
            // ordinary memory: the endpoint comes back from the agent,
            // mid-pass as often as not.
            let r = &mut regions[rx][0];
            for n in 0..BURST {
                seed += 1;
                let off = (n * 1000 + round as usize * 8) % (SMALL - 1000);
                c.cmd(tx, format!("write {rx} {} {off} 1000 {seed} {seed}", r.key));
                r.written(off, 1000, seed);
            }
            c.begin(rx, "wake");
            c.answers(&[(rx, sleep)]);
            c.cmd(tx, format!("wait writes={BURST} within=10000"));
            r.check(&mut c, &what("region after the burst"));
            for (i, &(len, _, tag)) in sends.iter().enumerate().skip(1).step_by(2) {
                c.cmd(rx, format!("recv {tx} {len} {i} tag={tag}"));
            }
            let got = c
                .cmd(rx, format!("wait recvs={}", sends.len()))
                .completions();
            c.cmd(tx, format!("wait sends={}", sends.len() - early));
            for done in &got {
                let (len, s, tag) = sends[done.ctx as usize];
                assert_eq!(
                    (done.len, done.tag, done.data),
                    (len, tag, round),
                    "{}",
                    what("receive")
                );
                let want = payload::checksum(&payload::pattern(s, len));
                assert_eq!(done.sum, want, "{}", what("receive's data"));
            }
        }
        let stderr = c.finish();
        every_agent_started(&stderr);
        // An agent's pass that met the application's call inside the
        // endpoint panics on the elided lock (and logs it).
        assert!(stderr.iter().all(|e| !e.contains("panicked")), "{stderr:?}");
        // Both ways of RMA ran: one-sided into dmable memory, through the
        // target into ordinary memory.
        for (p, e) in stderr.iter().enumerate() {
            let (one_sided, assisted, atomics) = carried(e);
            assert!(
                one_sided > 0 && assisted > 0 && atomics > 0,
                "p{p}, {threading}: {one_sided} one-sided, {assisted} assisted, {atomics} atomics"
            );
        }
    }
}

/// 2, 4 and 16 processes with their agents on this host's cores (2 in
/// CI): pairs exchange messages of each protocol both ways, all pairs at
/// once, and every message arrives in order and intact. A process's agent
/// must not take the CPU its application (or another process) needs: a
/// starved application shows as a pair that does not finish within the
/// children's wait limit. The latency itself is measured by
/// `scripts/bench-pingpong --pairs N --agent`.
#[test]
fn many_processes_with_their_agents_share_the_cores() {
    for n in [2, 4, 16] {
        let mut c = cluster(&format!("agent-many-{n}"), Some("tunable"));
        c.spawn(n);
        c.connect_all();
        let commands: Vec<(usize, String)> = (0..n)
            .map(|me| {
                let peer = me ^ 1;
                (
                    me,
                    format!(
                        "traffic rank={me} to={peer} from=1 count=300 lens=16,5000,70000 window=4"
                    ),
                )
            })
            .collect();
        for (me, reply) in c.all(&commands).iter().enumerate() {
            assert_eq!(reply.field("sent"), 300, "p{me} of {n}");
            assert_eq!(reply.field("received"), 300, "p{me} of {n}");
        }
        let stderr = c.finish();
        every_agent_started(&stderr);
    }
}
