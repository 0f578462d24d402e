//! Counters of RMA: the initiator's (`FI_WRITE`, `FI_READ`, errors), the
//! target's `FI_RMA_EVENT` counters, and counters bound to regions late.

use super::*;

#[test]
fn counters_count_writes_reads_and_errors() {
    let mut c = cluster("rma-cntr");
    c.spawn(2).connect_all();
    Region::new(&mut c, 1, 1, 4096, 5, "rw");
    for (i, opts) in ["", " v", " msg", " inject", " data=3"].iter().enumerate() {
        c.cmd(0, format!("write 1 1 {} 100 {i} {i}{opts}", 100 * i));
    }
    c.cmd(0, "read 1 1 0 4096 10");
    c.cmd(0, "read 1 1 7 0 11 v");
    c.cmd(0, "write 1 999 0 8 1 12"); // unknown key
    c.cmd(0, "read 1 1 4000 97 13"); // beyond the region
    let cntr = c.cmd(0, "cntr-wait write=5 read=2 write-err=1 read-err=1");
    c.cmd(0, "wait writes=4 reads=2 errors=2");
    c.cmd(0, "quiet 50");
    assert_eq!(
        c.cmd(0, "cntr").ok,
        "write=5 write-err=1 read=2 read-err=1",
        "after {}",
        cntr.ok
    );
    c.cmd(1, "wait remote=1");
    assert_eq!(c.cmd(1, "cntr").ok, "write=0 write-err=0 read=0 read-err=0");
    c.finish_with_warnings();
}

/// FI_RMA_EVENT: the target's counters of remote accesses (bound to the
/// endpoint with `FI_REMOTE_WRITE` and `FI_REMOTE_READ`, and to regions
/// with `fi_mr_bind`) count every write, read and atomic that reached its
/// memory, once, and nothing that failed. One-sided accesses (dmable
/// memory) are reported by a notice the initiator sends once done: the
/// target sees them when it progresses.
fn remote_counters(test: &str, dmable: bool) {
    let mut c = if dmable {
        dmable_cluster(test)
    } else {
        let mut c = cluster(test);
        c.env("FI_LOG_LEVEL", "info");
        c
    };
    c.env("FABRIC_PEER_RMA_EVENT", "1");
    c.spawn(2).connect_all();
    // Region A counts writes (mr0), region B reads (mr1).
    Region::new(&mut c, 1, 0xa, REGION, 1, "rw");
    Region::new(&mut c, 1, 0xb, REGION, 2, "rw");
    c.cmd(1, "mr-cntr 0xa write");
    c.cmd(1, "mr-cntr 0xb read");
    assert_eq!(
        c.cmd(1, "rcntr").ok,
        "remote-write=0 remote-read=0 mr0=0 mr1=0"
    );
    let mut counts = Counts::default();
    // Writes of every protocol (inline, eager, rendezvous) and an inject.
    let writes = [
        (0xa, 10, ""),
        (0xa, EAGER + 1, " v"),
        (0xa, SEGMENT + 1, " msg"),
        (0xa, 7, " inject"),
        (0xb, 22, " data=9"),
        (0xb, 3 * SEGMENT, ""),
    ];
    for (i, &(key, len, opts)) in writes.iter().enumerate() {
        c.cmd(0, format!("write 1 {key} {} {len} {i} {i}{opts}", 100 * i));
    }
    // Reads of every size.
    let reads = [
        (0xa, 10),
        (0xa, 2 * SEGMENT),
        (0xb, 1),
        (0xb, EAGER),
        (0xb, SEGMENT + 7),
    ];
    for (i, &(key, len)) in reads.iter().enumerate() {
        c.cmd(0, format!("read 1 {key} {} {len} {}", 1000 * i, 10 + i));
    }
    c.cmd(0, "wait writes=5 reads=5");
    counts.writes += 6;
    c.cmd(0, format!("cntr-wait write={}", counts.writes));
    // Atomics: (command, to A, writes, reads).
    const AT: usize = 4 * 1024 * 1024;
    let atomics = [
        (
            format!("1 0xa {AT} write u64 sum 1 ops=1"),
            true,
            true,
            false,
        ),
        (
            format!("1 0xa {} write u32 bor 16 ops=1 v", AT + 8),
            true,
            true,
            false,
        ),
        (
            format!("1 0xa {} fetch u64 sum 1 ops=1", AT + 72),
            true,
            true,
            true,
        ),
        (
            format!("1 0xa {} compare u64 cswap 1 ops=1 cmp=0 msg", AT + 80),
            true,
            true,
            true,
        ),
        (
            format!("1 0xb {AT} fetch u64 sum 2 ops=1 v"),
            false,
            true,
            true,
        ),
        (
            format!("1 0xb {} fetch u64 read 1", AT + 16),
            false,
            false,
            true,
        ),
    ];
    // So far: 6 writes (4 to A), 5 reads (3 of B).
    let (mut ep_w, mut ep_r, mut mr_a, mut mr_b) = (6u64, 5u64, 4u64, 3u64);
    for (i, (cmd, to_a, w, rd)) in atomics.iter().enumerate() {
        let d = c.cmd(0, format!("atomic {cmd} ctx={}", 50 + i));
        assert!(d.ok.contains(" err=0 "), "{cmd}: {}", d.ok);
        ep_w += u64::from(*w);
        ep_r += u64::from(*rd);
        if *to_a {
            mr_a += u64::from(*w);
        } else {
            mr_b += u64::from(*rd);
        }
    }
    // Failures count nothing: a key nobody has, beyond the region, a
    // misaligned atomic.
    c.cmd(0, "write 1 0x99 0 8 1 60");
    c.cmd(0, format!("read 1 0xb {} 100 61", REGION - 10));
    c.cmd(0, "wait errors=2");
    let d = c.cmd(0, "atomic 1 0xa 3 fetch u64 sum 1 ctx=62");
    assert!(
        d.ok.contains(&format!(" err={} ", ffi::FI_EINVAL)),
        "{}",
        d.ok
    );
    // The target progresses: every access is counted, once (and the
    // write with data reports).
    c.cmd(1, "wait remote=1");
    let expect = format!("remote-write={ep_w} remote-read={ep_r} mr0={mr_a} mr1={mr_b}");
    let got = c.cmd(
        1,
        format!("rcntr-wait remote-write={ep_w} remote-read={ep_r} mr0={mr_a} mr1={mr_b}"),
    );
    c.cmd(1, "quiet 200");
    assert_eq!(c.cmd(1, "rcntr").ok, expect, "(first reached: {})", got.ok);
    // The initiator counts no remote access.
    assert_eq!(
        c.cmd(0, "rcntr").ok,
        "remote-write=0 remote-read=0",
        "the initiator"
    );
    let logs = c.finish_with_warnings();
    let n = (writes.len() + reads.len() + atomics.len()) as u64;
    let expected = if dmable {
        (n, 0, atomics.len() as u64)
    } else {
        (0, n, atomics.len() as u64)
    };
    assert_eq!(carried(&logs[0]), expected, "p0's path");
}

#[test]
fn remote_counters_count_writes_reads_and_atomics_in_ordinary_memory() {
    remote_counters("rma-event", false);
}

#[test]
fn remote_counters_count_writes_reads_and_atomics_in_dmable_memory() {
    remote_counters("rma-event-dmable", true);
}

/// FI_RMA_EVENT with counters on regions only, bound after the regions
/// exist (MPI asks for FI_RMA_EVENT and binds none: initiators then send
/// no notices). One-sided writes and reads into dmable memory count on the
/// region's counter from the binding on; a region without one counts
/// nothing, and before the binding nothing is counted. Initiators tell
/// only of the accesses a counter counts: none before the binding, then
/// writes to A and reads of B (not the write to B: OpenSHMEM's counter of
/// its heap counts writes, and a get need not wake the target).
#[test]
fn region_counters_bound_late_count_one_sided_accesses() {
    let mut c = dmable_cluster("rma-event-mr");
    c.env("FABRIC_PEER_RMA_EVENT", "mr");
    c.spawn(2).connect_all();
    Region::new(&mut c, 1, 0xa, REGION, 1, "rw");
    Region::new(&mut c, 1, 0xb, REGION, 2, "rw");
    // Before any counter: accesses are not reported.
    c.cmd(0, "write 1 0xa 0 64 1 1");
    c.cmd(0, "read 1 0xa 0 64 2");
    c.cmd(0, "wait writes=1 reads=1");
    c.cmd(1, "mr-cntr 0xa write");
    c.cmd(1, "mr-cntr 0xb read");
    for i in 0..3 {
        c.cmd(0, format!("write 1 0xa {} 100 {i} {}", 200 * i, 10 + i));
    }
    c.cmd(0, format!("write 1 0xb 0 {} 7 20", 2 * SEGMENT));
    c.cmd(0, "read 1 0xb 8 16 21");
    c.cmd(0, "read 1 0xb 4096 1 22");
    c.cmd(0, "wait writes=4 reads=2");
    let got = c.cmd(1, "rcntr-wait mr0=3 mr1=2");
    c.cmd(1, "quiet 200");
    assert_eq!(
        c.cmd(1, "rcntr").ok,
        "mr0=3 mr1=2",
        "(first reached: {})",
        got.ok
    );
    let logs = c.finish_with_warnings();
    assert_eq!(carried(&logs[0]).1, 0, "every access one-sided");
    assert_eq!(
        carried_notices(&logs[0]),
        3 + 2,
        "notices of counted accesses only"
    );
}
