//! RMA and the target's progress: target-assisted RMA waits for the target
//! to progress, one-sided RMA (dmable memory) completes while it sleeps, and
//! full transmit queues on either side hold operations back, never lose them.

use super::*;

#[test]
fn write_to_a_target_that_does_not_progress_waits_for_it() {
    let mut c = cluster("rma-no-progress");
    c.spawn(3).connect_all();
    let mut r = Region::new(&mut c, 1, 0x11, REGION, 11, "rw");
    let mut fresh = Region::new(&mut c, 2, 0x12, REGION, 12, "rw");
    let mut counts = Counts::default();
    // p1 and p0 have met (first contact done); p2 has heard from nobody.
    write(
        &mut c,
        0,
        &mut r,
        &mut counts,
        WriteCall::Write,
        0,
        10,
        13,
        1,
    );

    // Disjoint ranges: concurrent writes to one byte have no order.
    const AT: usize = 4 * SEGMENT;
    let mut writes = 1;
    for (target, sizes) in [(1, [10, 3 * SEGMENT + 5]), (2, [EAGER + 1, 7])] {
        let key = [0, 0x11, 0x12][target];
        let sleep = c.begin(target, "sleep-no-progress wake");
        assert_eq!(c.next_line(target), "sleeping");
        // Posted while the target sleeps (ordinary memory: its progress
        // must move the bytes): nothing completes...
        c.cmd(0, format!("write {target} {key} {AT} {} 21 21", sizes[0]));
        c.cmd(
            0,
            format!("write {target} {key} 0 {} 22 22 data=0x22", sizes[1]),
        );
        c.cmd(
            0,
            format!("read {target} {key} {} 1000 23 v", REGION - 1000),
        );
        // An inject's copy waits too (its buffer is gone at once).
        c.cmd(
            0,
            format!("write {target} {key} {} 40 24 24 inject", REGION - 2000),
        );
        c.cmd(0, "quiet 300");
        let region = if target == 1 { &mut r } else { &mut fresh };
        // ...and nothing moved (asked while it still sleeps).
        region.check_asleep(&mut c, "while the target sleeps");
        c.begin(target, "wake");
        c.answers(&[(target, sleep)]);
        // Once it progresses, all of it completes, data in place.
        let done = c.cmd(0, "wait writes=2 reads=1").completions();
        writes += 3;
        c.cmd(0, format!("cntr-wait write={writes}"));
        region.written(AT, sizes[0], 21);
        region.written(0, sizes[1], 22);
        region.written(REGION - 2000, 40, 24);
        let read = done.iter().find(|e| e.kind == Kind::Read).unwrap();
        assert_eq!(read.sum, region.sum(REGION - 1000, 1000), "{read}");
        assert!(read.guard, "{read}");
        let remote = c.cmd(target, "wait remote=1").completions();
        assert_eq!(
            (remote[0].data, remote[0].len),
            (0x22, sizes[1]),
            "{}",
            remote[0]
        );
        region.check(&mut c, "after waking");
    }
    c.finish();
}

/// The little-endian u64 at `off` of the model.
fn model_u64(r: &Region, off: usize) -> u64 {
    u64::from_le_bytes(r.bytes[off..off + 8].try_into().expect("8 bytes"))
}

/// Runs `command` (answered with a data line while it sleeps) at the
/// sleeping target and returns that line.
fn ask_asleep(c: &mut Cluster, target: usize, command: &str) -> String {
    c.begin(target, command);
    c.next_line(target)
}

/// The one-sided path to dmable memory, with no action of the target:
/// writes and reads of every size and atomics complete at the initiator
/// while the target makes no libfabric call at all.
#[test]
fn one_sided_rma_completes_while_the_target_sleeps() {
    let mut c = dmable_cluster("rma-one-sided");
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0x1, REGION, 1, "rw");
    let mut counts = Counts::default();
    // First contact, while both progress.
    write(
        &mut c,
        0,
        &mut r,
        &mut counts,
        WriteCall::Write,
        0,
        10,
        2,
        1,
    );
    let mut ops = 1;
    let sleep = c.begin(1, "sleep-no-progress wake");
    assert_eq!(c.next_line(1), "sleeping");
    // Writes of every protocol size (and beyond the segment), by every
    // call, each complete while the target sleeps, bytes in place at once.
    let sizes = [
        1,
        22,
        EAGER + 1,
        SEGMENT,
        3 * SEGMENT + 5,
        3 * 1024 * 1024 + 7,
    ];
    let mut seed = 10;
    for (i, call) in WRITE_CALLS.into_iter().enumerate() {
        for &len in &sizes {
            if call.inject() && len > EAGER {
                continue;
            }
            seed += 1;
            let off = (i * 4099 + len) % (REGION - len - 4096);
            let what = format!("{call:?} of {len} bytes at {off}, target asleep");
            c.cmd(
                0,
                format!("write 1 1 {off} {len} {seed} {seed}{}", call.opts(seed)),
            );
            counts.writes += 1;
            ops += 1;
            if call.inject() {
                c.cmd(0, format!("cntr-wait write={}", counts.writes));
            } else {
                let w = c.cmd(0, "wait writes=1").completions().remove(0);
                assert_eq!((w.kind, w.ctx), (Kind::Write, seed), "{what}: {w}");
            }
            r.written(off, len, seed);
            r.check_asleep(&mut c, &what);
        }
    }
    // Reads of every size and call.
    for (i, call) in READ_CALLS.into_iter().enumerate() {
        for &len in &sizes {
            let off = (i * 7919 + 3 * len) % (REGION - len - 4096);
            let ctx = 100 + ops;
            c.cmd(0, format!("read 1 1 {off} {len} {ctx}{}", call.opts()));
            ops += 1;
            let e = c.cmd(0, "wait reads=1").completions().remove(0);
            let what = format!("{call:?} of {len} bytes at {off}, target asleep");
            assert_eq!(
                (e.kind, e.ctx, e.len),
                (Kind::Read, ctx, len),
                "{what}: {e}"
            );
            assert!(e.guard, "{what}: {e}");
            assert_eq!(e.sum, r.sum(off, len), "{what}: data read");
        }
    }
    // Atomics, in the last 1001 bytes (no write above touched them).
    const AT: usize = REGION - 1000 - 1;
    const AT8: usize = AT + 7 - (AT + 7) % 8;
    let old = model_u64(&r, AT8);
    let d = c.cmd(
        0,
        format!("atomic 1 1 {AT8} fetch u64 sum 1 ops=5 ctx=7001"),
    );
    assert!(d.ok.contains(&format!("err=0 old={old} ")), "{}", d.ok);
    r.bytes[AT8..AT8 + 8].copy_from_slice(&old.wrapping_add(5).to_le_bytes());
    let cur = model_u64(&r, AT8 + 8);
    let d = c.cmd(
        0,
        format!(
            "atomic 1 1 {} compare u64 cswap 1 ops=0x1234 cmp={cur} ctx=7002 v",
            AT8 + 8
        ),
    );
    assert!(d.ok.contains(&format!("err=0 old={cur} ")), "{}", d.ok);
    r.bytes[AT8 + 8..AT8 + 16].copy_from_slice(&0x1234u64.to_le_bytes());
    c.cmd(
        0,
        format!(
            "atomic 1 1 {} write u8 bxor 64 ops=0xff ctx=7003 msg",
            AT8 + 16
        ),
    );
    for b in &mut r.bytes[AT8 + 16..AT8 + 80] {
        *b ^= 0xff;
    }
    counts.writes += 2;
    c.cmd(
        0,
        format!("atomic 1 1 {} write u64 write 1 ops=77 inject", AT8 + 80),
    );
    c.cmd(0, format!("cntr-wait write={}", counts.writes));
    r.bytes[AT8 + 80..AT8 + 88].copy_from_slice(&77u64.to_le_bytes());
    ops += 4;
    let got = ask_asleep(&mut c, 1, &format!("get 1 {AT8} u64 2"));
    assert_eq!(
        got,
        format!("{},4660", old.wrapping_add(5)),
        "atomics, target asleep"
    );
    r.check_asleep(&mut c, "after the atomics, target asleep");
    c.cmd(0, "quiet 100");
    // Awake: all of it is there, and the writes with data report now.
    c.begin(1, "wake");
    c.answers(&[(1, sleep)]);
    r.check(&mut c, "after waking");
    let with_data = WRITE_CALLS
        .iter()
        .filter(|w| w.data())
        .map(|w| sizes.iter().filter(|&&l| !w.inject() || l <= EAGER).count())
        .sum::<usize>();
    let remote = c.cmd(1, format!("wait remote={with_data}")).completions();
    assert_eq!(remote.len(), with_data);
    c.cmd(1, "quiet 100");
    let logs = c.finish();
    // The path: every operation of p0 one-sided, none through the target.
    assert_eq!(carried(&logs[0]), (ops, 0, 4), "p0's operations");
}

#[test]
fn reads_wait_while_the_target_has_a_full_transmit_queue() {
    let mut c = cluster("rma-busy-target");
    // A small transmit queue, which the target's own sends fill.
    c.env("FI_UNIMEM_TX_SIZE", "4");
    c.spawn(2).connect_all();
    let r = Region::new(&mut c, 1, 0x7, 4 * SEGMENT, 7, "rw");
    // Rendezvous sends nobody receives yet: p1's queue is full.
    for i in 0..4 {
        c.cmd(1, format!("send 0 {} {i} {i}", SEGMENT + 1));
    }
    c.cmd(0, format!("read 1 7 0 {} 100", SEGMENT + 1));
    c.cmd(0, "quiet 200");
    for i in 0..4 {
        c.cmd(0, format!("recv 1 {} {i}", SEGMENT + 1));
    }
    c.cmd(0, "wait recvs=4");
    c.cmd(1, "wait sends=4");
    let e = c.cmd(0, "wait reads=1").completions().remove(0);
    assert_eq!(e.sum, r.sum(0, SEGMENT + 1), "{e}");
    // Two readers with more reads in flight than p1's queue holds.
    c.spawn(1);
    let p2 = c[2].addr.clone();
    for i in 0..2 {
        assert_eq!(c.cmd(i, format!("insert {p2}")).num(), 2);
    }
    for i in 0..3 {
        let addr = c[i].addr.clone();
        assert_eq!(c.cmd(2, format!("insert {addr}")).num(), i as i64);
    }
    for k in 0..6u64 {
        let off = 1000 * k as usize + 1;
        c.all(&[
            (0, format!("read 1 7 {off} {} {k}", SEGMENT + 1)),
            (2, format!("read 1 7 {} {} {k} v", off + 7, SEGMENT + 1)),
        ]);
    }
    let done = c.all(&[(0, "wait reads=6".into()), (2, "wait reads=6".into())]);
    for (reply, shift) in done.iter().zip([0, 7]) {
        for e in reply.completions() {
            let off = 1000 * e.ctx as usize + 1 + shift;
            assert_eq!(e.sum, r.sum(off, SEGMENT + 1), "{e}");
            assert!(e.guard, "{e}");
        }
    }
    c.finish();
}

#[test]
fn more_operations_in_flight_than_the_transmit_queue_holds() {
    let mut c = cluster("rma-many");
    c.env("FI_UNIMEM_TX_SIZE", "16");
    c.spawn(2).connect_all();
    const N: usize = 200;
    let mut r = Region::new(&mut c, 1, 0x9, N * 100 + 4 * SEGMENT, 9, "rw");
    // Posted without waiting: -FI_EAGAIN beyond 16 in flight, retried
    // while progressing (fabric-peer's write). Disjoint ranges: writes in
    // flight together have no order.
    for i in 0..N {
        let (off, len) = match i % 50 {
            7 => (N * 100 + i / 50 * SEGMENT, SEGMENT),
            _ => (i * 100, 100),
        };
        c.cmd(0, format!("write 1 9 {off} {len} {} {i}", 5000 + i));
        r.written(off, len, 5000 + i as u64);
    }
    let done = c.cmd(0, format!("wait writes={N}")).completions();
    let mut ctxs: Vec<u64> = done.iter().map(|e| e.ctx).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, (0..N as u64).collect::<Vec<_>>());
    r.check(&mut c, "after the writes");
    for i in 0..N {
        c.cmd(0, format!("read 1 9 {} 150 {i}", i * 100));
    }
    for e in c.cmd(0, format!("wait reads={N}")).completions() {
        assert_eq!(e.sum, r.sum(e.ctx as usize * 100, 150), "{e}");
    }
    c.finish();
}
