//! RMA when a process dies: the operations with it fail, the rest carry on,
//! and a dead reader's waiting reads are forgotten.

use super::*;

#[test]
fn rma_with_a_target_that_dies_fails_and_the_rest_carries_on() {
    let mut c = cluster("rma-dead-target");
    c.spawn(3).connect_all();
    let mut r1 = Region::new(&mut c, 1, 0x1, REGION, 1, "rw");
    let mut r2 = Region::new(&mut c, 2, 0x2, REGION, 2, "rw");
    let mut counts = Counts::default();
    write(
        &mut c,
        0,
        &mut r1,
        &mut counts,
        WriteCall::Write,
        0,
        10,
        3,
        1,
    );
    // p1 sleeps with RMA of every kind in flight to it, then dies.
    let _sleep = c.begin(1, "sleep-no-progress wake");
    assert_eq!(c.next_line(1), "sleeping");
    c.cmd(0, format!("write 1 1 0 {} 5 10", 3 * SEGMENT + 5));
    c.cmd(0, format!("write 1 1 {} 100 6 11 data=7", 4 * SEGMENT));
    c.cmd(0, format!("read 1 1 {} {} 12 v", 5 * SEGMENT, 2 * SEGMENT));
    c.cmd(0, format!("read 1 1 {} 10 13", 8 * SEGMENT));
    c.kill(1);
    let errors = c.cmd(0, "wait errors=4").completions();
    let mut ctxs: Vec<u64> = errors.iter().map(|e| e.ctx).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, [10, 11, 12, 13]);
    for e in &errors {
        let flags = if e.ctx < 12 { WRITE_FLAGS } else { READ_FLAGS };
        assert_eq!(e.flags & flags, flags, "{e}");
        assert_eq!(e.err, ffi::FI_EHOSTUNREACH, "{e}");
        assert!(e.guard, "a failed read's buffer is untouched: {e}");
    }
    // New RMA to the dead peer is refused; the others carry on.
    let unreachable = -i64::from(ffi::FI_EHOSTUNREACH);
    for call in ["", " inject", " msg"] {
        let command = format!("write 1 1 0 10 5 14{call} try");
        assert_eq!(c.cmd(0, &command).num(), unreachable, "{command}");
    }
    assert_eq!(c.cmd(0, "read 1 1 0 10 14 try").num(), unreachable);
    write(
        &mut c,
        0,
        &mut r2,
        &mut counts,
        WriteCall::Writev,
        7,
        SEGMENT + 1,
        8,
        15,
    );
    read(
        &mut c,
        0,
        &r2,
        &mut counts,
        ReadCall::Readmsg,
        0,
        3 * SEGMENT,
        16,
    );
    write(
        &mut c,
        2,
        &mut r2,
        &mut Counts::default(),
        WriteCall::Write,
        9,
        22,
        9,
        17,
    );
    c.cmd(0, "quiet 50");
    c.finish_with_warnings();
}

#[test]
fn a_reader_that_dies_while_its_reads_wait_at_the_target_is_forgotten() {
    let mut c = cluster("rma-dead-reader");
    c.env("FI_UNIMEM_TX_SIZE", "4");
    c.spawn(3).connect_all();
    let r = Region::new(&mut c, 1, 0x1, 4 * SEGMENT, 1, "rw");
    // p1's queue is full of sends to p2, which receives nothing yet...
    for i in 0..4 {
        c.cmd(1, format!("send 2 {} {i} {i}", SEGMENT + 1));
    }
    // ...so p0's reads wait at p1, and p0 dies meanwhile.
    c.cmd(0, format!("read 1 1 0 {} 1", SEGMENT + 1));
    c.cmd(0, format!("read 1 1 7 {} 2 v", 2 * SEGMENT));
    c.cmd(0, "quiet 100");
    c.kill(0);
    // p1 finds p0 dead (peer_check_ms), then its queue empties.
    c.cmd(1, "quiet 300");
    for i in 0..4 {
        c.cmd(2, format!("recv 1 {} {i}", SEGMENT + 1));
    }
    c.cmd(2, "wait recvs=4");
    c.cmd(1, "wait sends=4");
    // p1 serves the living.
    let mut counts = Counts::default();
    read(
        &mut c,
        2,
        &r,
        &mut counts,
        ReadCall::Read,
        3,
        3 * SEGMENT,
        5,
    );
    c.cmd(1, "quiet 100");
    c.finish_with_warnings();
}
