//! The direct path of small one-sided operations, through the real
//! libfabric core between separate `fabric-peer` processes with the dmable
//! heap preloaded: a write, read or atomic of at most the inject size to
//! dmable memory is done inside its call by loads and stores. Every test
//! checks the bytes (the target region's checksum against a model, guard
//! bytes around it) and the path each operation took (the endpoints'
//! close lines), so that an operation that silently took another path, or
//! moved a byte it should not have, fails.

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{carried, carried_direct, Cluster, Kind, Msg, Order, Region, EAGER};
use unimem_tests::payload;

/// Every process preloads the dmable heap with a threshold of 64 KiB
/// (the default makes every block dmable): a region of at least that is
/// dmable, a smaller one is ordinary memory.
fn cluster(test: &str) -> Cluster {
    let mut c = super::cluster(test);
    c.env("FABRIC_PEER_CNTR", "1");
    c.preload_heap();
    c.env("FI_UNIMEM_HEAP_THRESHOLD", "64k");
    c.env("FI_LOG_LEVEL", "info");
    c
}

/// Registrations a process found stale and renewed, from its endpoints'
/// close lines ("... N misses, S stale ...").
fn renewals(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split(" misses, ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A dmable region (far above the heap's threshold).
const DMABLE: usize = 1 << 20;
/// An ordinary one (below it).
const ORDINARY: usize = 20_000;

/// Sizes around the inject limit (the direct path's bound) and the inline
/// one, within `max`.
fn sizes(max: usize) -> Vec<usize> {
    [1, 7, 8, 22, 23, 64, 4096, EAGER - 1, EAGER, EAGER + 1]
        .into_iter()
        .filter(|&l| l <= max)
        .collect()
}

/// Writes by every call form and reads by every form at sizes around the
/// inject limit, at the start, an odd middle and the end of `r`; returns
/// how many operations were posted and how many of them fit the direct
/// path (at most the inject size).
fn writes_and_reads(c: &mut Cluster, r: &mut Region, seed: &mut u64) -> (u64, u64) {
    let (t, key, len_r) = (r.target, r.key, r.bytes.len());
    let (mut ops, mut small) = (0, 0);
    for len in sizes(len_r) {
        for off in [0, ((len_r - len) / 2) | 1, len_r - len] {
            for call in ["", " v", " msg=delivery-complete", " inject"] {
                if call == " inject" && len > EAGER {
                    continue;
                }
                *seed += 1;
                let what = format!("write{call} of {len} bytes at {off} of {key:#x}");
                // The write counter counts atomics that write as well.
                let before = c.cmd(0, "cntr").field("write");
                c.cmd(
                    0,
                    format!("write {t} {key} {off} {len} {seed} {seed}{call}"),
                );
                if call == " inject" {
                    c.cmd(0, format!("cntr-wait write={}", before + 1));
                } else {
                    let w = c.cmd(0, "wait writes=1").completions().remove(0);
                    assert_eq!((w.kind, w.ctx), (Kind::Write, *seed), "{what}: {w}");
                }
                r.bytes[off..off + len].copy_from_slice(&payload::pattern(*seed, len));
                r.check(c, &what);
                ops += 1;
                small += u64::from(len <= EAGER);
            }
            for call in ["", " v", " msg"] {
                *seed += 1;
                let what = format!("read{call} of {len} bytes at {off} of {key:#x}");
                c.cmd(0, format!("read {t} {key} {off} {len} {seed}{call}"));
                let e = c.cmd(0, "wait reads=1").completions().remove(0);
                assert_eq!(
                    (e.kind, e.ctx, e.len),
                    (Kind::Read, *seed, len),
                    "{what}: {e}"
                );
                assert!(e.guard, "{what}: wrote past the read buffer: {e}");
                let want = payload::checksum(&r.bytes[off..off + len]);
                assert_eq!(e.sum, want, "{what}: data read");
                ops += 1;
                small += u64::from(len <= EAGER);
            }
        }
    }
    (ops, small)
}

/// Atomics of each native width (fetch-add, compare-swap, an update
/// without fetch, an atomic read) at the end of `r`, checked against the
/// model through their old values and the region's bytes; returns how
/// many were posted.
fn native_atomics(c: &mut Cluster, r: &mut Region, seed: u64) -> u64 {
    let (t, key) = (r.target, r.key);
    let at = r.bytes.len() - 64;
    let mut ops = 0;
    for (dt, width) in [("u8", 1usize), ("u16", 2), ("u32", 4), ("u64", 8)] {
        let mask = if width == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * width)) - 1
        };
        let off = at + width * 2;
        let element = |r: &Region| r.u64_at(off - off % 8) >> (8 * (off % 8)) & mask;
        let set = |r: &mut Region, v: u64| {
            r.bytes[off..off + width].copy_from_slice(&v.to_le_bytes()[..width])
        };
        let what = format!("{dt} atomics at {off} of {key:#x}");
        let old = element(r);
        let add = (seed & mask) | 1;
        let d = c.cmd(
            0,
            format!("atomic {t} {key} {off} fetch {dt} sum 1 ops={add} ctx=1"),
        );
        assert!(
            d.ok.contains(&format!("err=0 old={old} ")),
            "{what}: {}",
            d.ok
        );
        set(r, old.wrapping_add(add) & mask);
        let cur = element(r);
        let d = c.cmd(
            0,
            format!("atomic {t} {key} {off} compare {dt} cswap 1 ops=5 cmp={cur} ctx=2"),
        );
        assert!(
            d.ok.contains(&format!("err=0 old={cur} ")),
            "{what}: {}",
            d.ok
        );
        set(r, 5);
        // A compare that does not match leaves it.
        let d = c.cmd(
            0,
            format!("atomic {t} {key} {off} compare {dt} cswap 1 ops=9 cmp=6 ctx=3"),
        );
        assert!(d.ok.contains("err=0 old=5 "), "{what}: {}", d.ok);
        let d = c.cmd(
            0,
            format!("atomic {t} {key} {off} write {dt} bxor 1 ops=3 ctx=4"),
        );
        assert!(d.ok.contains("err=0"), "{what}: {}", d.ok);
        set(r, 5 ^ 3);
        let d = c.cmd(
            0,
            format!("atomic {t} {key} {off} fetch {dt} read 1 null-ops ctx=5"),
        );
        assert!(d.ok.contains("err=0 old=6 "), "{what}: {}", d.ok);
        r.check(c, &what);
        ops += 5;
    }
    ops
}

/// Writes, reads and atomics at every size around the inject limit, by
/// every call form, to dmable memory (the direct path up to the inject
/// size, DMA beyond) and to ordinary memory (the target's progress), with
/// two-sided traffic in windows of 64 small messages before and after.
#[test]
fn small_operations_go_direct_to_dmable_memory_only() {
    let mut c = cluster("direct-sizes");
    c.spawn(2).connect_all();
    let window: Vec<Msg> = (0..64)
        .map(|i| Msg::new(i * 37 % 300, 500 + i as u64))
        .collect();
    c.transfer(0, 1, &window, Order::Posted);
    c.transfer(0, 1, &window, Order::Unexpected);
    let mut dmable = Region::new(&mut c, 1, 0xd1, DMABLE, 3, "rw");
    let mut ordinary = Region::new(&mut c, 1, 0x0d, ORDINARY, 4, "rw");
    let mut seed = 1000;
    let (d_ops, d_small) = writes_and_reads(&mut c, &mut dmable, &mut seed);
    let d_atomics = native_atomics(&mut c, &mut dmable, 77);
    let (o_ops, _) = writes_and_reads(&mut c, &mut ordinary, &mut seed);
    let o_atomics = native_atomics(&mut c, &mut ordinary, 99);
    // Matching and order of two-sided traffic, both ways, after it all.
    c.transfer(0, 1, &window, Order::Unexpected);
    c.transfer(1, 0, &window, Order::Posted);
    let logs = c.finish();
    assert_eq!(
        carried(&logs[0]),
        (d_ops + d_atomics, o_ops + o_atomics, d_atomics + o_atomics),
        "p0: dmable memory one-sided, ordinary memory through the target"
    );
    assert_eq!(
        carried_direct(&logs[0]),
        d_small + d_atomics,
        "p0: every operation of at most the inject size to dmable memory went direct"
    );
    assert_eq!(carried_direct(&logs[1]), 0, "p1 posted nothing one-sided");
}

/// Four initiators fetch-add one counter in the target's dmable memory
/// through the direct path while the target adds to it with the CPU:
/// every ticket is given once and the final value is exact.
#[test]
fn four_initiators_and_the_target_add_to_one_counter_directly() {
    const N: u64 = 3000;
    let mut c = cluster("direct-counter");
    c.spawn(5).connect_all();
    // Zeros: no seed.
    assert_eq!(c.cmd(0, format!("mr 0xc0 {DMABLE}")).num(), 0);
    for i in 1..=4 {
        c.begin(i, format!("fetch-add-loop 0 0xc0 64 {N} window=4"));
    }
    c.begin(0, format!("fetch-add-loop 0 0xc0 64 {N} local"));
    let mut tickets = Vec::new();
    for i in 0..=4 {
        let ok = c.next_line(i);
        let list = ok
            .strip_prefix("ok tickets=")
            .unwrap_or_else(|| panic!("p{i}: {ok}"));
        tickets.extend(list.split(',').map(|t| t.parse::<u64>().expect("ticket")));
    }
    tickets.sort_unstable();
    tickets.dedup();
    assert_eq!(tickets.len() as u64, 5 * N, "a ticket given twice");
    assert_eq!(tickets.last(), Some(&(5 * N - 1)), "every ticket once");
    let total = c.cmd(0, "get 0xc0 64 u64 1");
    assert_eq!(total.ok, (5 * N).to_string(), "the counter's final value");
    let logs = c.finish();
    // All but the first window (posted before the target's node was
    // known: first contact) went direct.
    for (i, log) in logs.iter().enumerate().skip(1) {
        let direct = carried_direct(log);
        assert!(
            (N - 4..=N).contains(&direct),
            "p{i}: {direct} of {N} fetch-adds went direct"
        );
    }
}

/// Expects one error completion of `ctx` at p0 with `err`, and no byte
/// moved (the read buffer untouched).
fn expect_error(c: &mut Cluster, ctx: u64, err: i32, what: &str) {
    let e = c.cmd(0, "wait errors=1").completions().remove(0);
    assert_eq!(
        (e.kind, e.ctx, e.err),
        (Kind::Error, ctx, err),
        "{what}: {e}"
    );
    assert!(e.guard, "{what}: bytes landed: {e}");
}

/// A key withdrawn, memory freed and allocated again under the same key
/// or another, forged keys, ranges and rights: what the general path
/// refuses, the direct path refuses too, and no byte moves where it
/// should not. A registration of memory freed since is renewed, and the
/// direct path then serves the new memory.
#[test]
fn stale_revoked_and_forged_accesses_move_no_byte() {
    let mut c = cluster("direct-refusals");
    c.spawn(2).connect_all();
    let (ekey, eacces) = (ffi::FI_EKEYREJECTED, ffi::FI_EACCES);
    let mut r = Region::new(&mut c, 1, 0x51, DMABLE, 5, "rw");
    let ro = Region::new(&mut c, 1, 0x52, DMABLE, 6, "read");
    let wo = Region::new(&mut c, 1, 0x53, DMABLE, 7, "write");
    // Warm: the initiator resolves the key and caches the registration
    // (this first write may go the general path: the target's node is
    // learnt from its first message).
    c.cmd(0, "write 1 0x51 100 8 11 1");
    c.cmd(0, "wait writes=1");
    r.bytes[100..108].copy_from_slice(&payload::pattern(11, 8));
    r.check(&mut c, "warm-up write");
    let direct = 1;

    // Forged: unknown key, range beyond the region, missing rights.
    c.cmd(0, "write 1 0x999 0 8 1 20");
    expect_error(&mut c, 20, ekey, "write under an unknown key");
    c.cmd(0, "read 1 0x999 0 8 21");
    expect_error(&mut c, 21, ekey, "read under an unknown key");
    for (off, len) in [(DMABLE - 4, 8), (DMABLE, 1), (u64::MAX as usize - 3, 8)] {
        c.cmd(0, format!("write 1 0x51 {off} {len} 1 22"));
        expect_error(&mut c, 22, eacces, &format!("write of {len} at {off}"));
        c.cmd(0, format!("read 1 0x51 {off} {len} 23"));
        expect_error(&mut c, 23, eacces, &format!("read of {len} at {off}"));
    }
    c.cmd(0, "write 1 0x52 0 8 1 24");
    expect_error(&mut c, 24, eacces, "write to a read-only region");
    c.cmd(0, "read 1 0x53 0 8 25");
    expect_error(&mut c, 25, eacces, "read of a write-only region");
    let d = c.cmd(0, "atomic 1 0x52 0 write u64 sum 1 ops=1 ctx=26");
    assert!(
        d.ok.contains(&format!("err={eacces} ")),
        "atomic to read-only: {}",
        d.ok
    );
    let d = c.cmd(0, "atomic 1 0x51 3 write u64 sum 1 ops=1 ctx=27");
    assert!(
        d.ok.contains(&format!("err={} ", ffi::FI_EINVAL)),
        "misaligned atomic: {}",
        d.ok
    );
    r.check(&mut c, "after the forged accesses");
    ro.check(&mut c, "read-only region after the forged accesses");
    wo.check(&mut c, "write-only region after the forged accesses");

    // Withdrawn: the target closes the region (its memory is freed); the
    // key no longer grants anything.
    assert_eq!(c.cmd(1, "unreg 0x51").num(), 0);
    c.cmd(0, "write 1 0x51 100 8 12 30");
    expect_error(&mut c, 30, ekey, "write under a withdrawn key");
    c.cmd(0, "read 1 0x51 100 8 31");
    expect_error(&mut c, 31, ekey, "read under a withdrawn key");
    // The memory again, under another key, then under the old one: the
    // cached registration is stale, found so, and renewed; each write
    // lands in the new region alone.
    for (key, seed) in [(0x54u64, 40u64), (0x51, 50)] {
        let mut fresh = Region::new(&mut c, 1, key, DMABLE, seed, "rw");
        for k in 0..3u64 {
            let off = 100 + 8 * k as usize;
            c.cmd(0, format!("write 1 {key} {off} 8 {} 40", seed + k));
            c.cmd(0, "wait writes=1");
            fresh.bytes[off..off + 8].copy_from_slice(&payload::pattern(seed + k, 8));
            fresh.check(
                &mut c,
                &format!("write {k} to the memory again under {key:#x}"),
            );
        }
        assert_eq!(c.cmd(1, format!("unreg {key}")).num(), 0);
    }
    ro.check(&mut c, "read-only region at the end");
    wo.check(&mut c, "write-only region at the end");
    let logs = c.finish();
    // The heap gives the freed memory back to the next region of its size:
    // the initiator's cached registration of it went stale, and the first
    // write there renewed it by the general path (the direct path never
    // renews); the rest went direct.
    let stale = renewals(&logs[0]);
    assert!(stale >= 1, "no registration was found stale:\n{}", logs[0]);
    let direct_done = carried_direct(&logs[0]);
    assert!(
        (direct + 5 - stale..=direct + 6 - stale).contains(&direct_done),
        "p0's direct operations: {direct_done}, with {stale} renewals"
    );
}

/// With the heap's default every block is dmable, a small region too: it
/// shares its pages with the target's other small blocks. Their frees
/// must not make the initiator's registration of the region stale (only
/// the free of a block once exposed retires its pages), or every write
/// after one would leave the direct path, and MPI's own small
/// allocations beside a window would make each put renew. A neighbour
/// that was exposed, then closed and freed, does retire the pages: the
/// next write renews once, and still lands in the region alone.
#[test]
fn a_small_region_stays_direct_while_its_neighbours_come_and_go() {
    let mut c = super::cluster("direct-churn");
    c.env("FABRIC_PEER_CNTR", "1");
    c.preload_heap();
    c.env("FI_LOG_LEVEL", "info");
    c.spawn(2).connect_all();
    // 64 bytes with its guards: a block of 192, as the churn's are.
    let mut r = Region::new(&mut c, 1, 0x61, 64, 7, "rw");
    let mut writes = 0u64;
    let mut write = |c: &mut Cluster, r: &mut Region, round: u64| {
        let off = (round as usize * 8) % 64;
        c.cmd(0, format!("write 1 0x61 {off} 8 {} 70", 100 + round));
        c.cmd(0, "wait writes=1");
        r.bytes[off..off + 8].copy_from_slice(&payload::pattern(100 + round, 8));
        writes += 1;
    };
    for round in 0..20 {
        write(&mut c, &mut r, round);
        c.cmd(1, "churn 300 129 192");
    }
    r.check(&mut c, "after writes between the target's allocations");
    // An exposed neighbour, closed and freed: its pages are retired.
    let neighbour = Region::new(&mut c, 1, 0x62, 64, 9, "rw");
    drop(neighbour);
    assert_eq!(c.cmd(1, "unreg 0x62").num(), 0);
    c.cmd(1, "churn 300 129 192");
    for round in 20..25 {
        write(&mut c, &mut r, round);
    }
    r.check(&mut c, "after a neighbour's exposed free");
    let logs = c.finish();
    let stale = renewals(&logs[0]);
    assert!(stale <= 1, "{stale} renewals:\n{}", logs[0]);
    // The first write meets the target (its node is not known yet) and
    // goes the general path.
    assert!(
        carried_direct(&logs[0]) >= writes - 1 - stale,
        "p0 went direct {} times of {writes} writes ({stale} renewals)",
        carried_direct(&logs[0])
    );
}
