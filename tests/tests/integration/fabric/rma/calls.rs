//! Every RMA call, size and place, checked byte for byte: writes and reads
//! of every call form, 64 MiB, `fi_writedata`'s remote completion, two
//! initiators into one region, and `fi_writemsg` with `FI_INJECT`.

use super::*;

#[test]
fn writes_of_every_call_size_and_place() {
    let mut c = cluster("rma-writes");
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0x5eed, REGION, 1, "rw");
    let mut counts = Counts::default();
    let mut seed = 100;
    for call in WRITE_CALLS {
        for len in sizes() {
            if call.inject() && len > EAGER {
                continue;
            }
            for off in places(len) {
                seed += 1;
                write(&mut c, 0, &mut r, &mut counts, call, off, len, seed, seed);
            }
        }
    }
    let cntr = c.cmd(0, "cntr");
    assert_eq!(cntr.field("write") as u64, counts.writes, "{}", cntr.ok);
    assert_eq!(cntr.field("read"), 0, "{}", cntr.ok);
    // A target counts nothing (no FI_RMA_EVENT).
    assert_eq!(c.cmd(1, "cntr").ok, "write=0 write-err=0 read=0 read-err=0");
    c.finish();
}

#[test]
fn reads_of_every_call_size_and_place() {
    let mut c = cluster("rma-reads");
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0x5eed, REGION, 2, "rw");
    let mut counts = Counts::default();
    let mut ctx = 0;
    for call in READ_CALLS {
        for len in sizes() {
            for off in places(len) {
                ctx += 1;
                read(&mut c, 0, &r, &mut counts, call, off, len, ctx);
            }
        }
    }
    // After writes by the initiator, reads see them (through each call).
    for (i, call) in READ_CALLS.into_iter().enumerate() {
        let (off, len) = (1000 * i + 3, SEGMENT + 1);
        write(
            &mut c,
            0,
            &mut r,
            &mut counts,
            WriteCall::Write,
            off,
            len,
            77 + i as u64,
            7,
        );
        read(&mut c, 0, &r, &mut counts, call, off - 3, len + 6, 8);
    }
    // A region of a process reads and writes itself (fi_addr 1 is p1).
    write(
        &mut c,
        1,
        &mut r,
        &mut Counts::default(),
        WriteCall::Writev,
        9,
        EAGER + 1,
        88,
        9,
    );
    read(
        &mut c,
        1,
        &r,
        &mut Counts::default(),
        ReadCall::Readmsg,
        0,
        3 * SEGMENT,
        10,
    );
    let cntr = c.cmd(0, "cntr");
    assert_eq!(cntr.field("read") as u64, counts.reads, "{}", cntr.ok);
    assert_eq!(cntr.field("write") as u64, counts.writes, "{}", cntr.ok);
    r.check(&mut c, "in the end");
    c.finish();
}

#[test]
fn sixty_four_mib_write_and_read_back() {
    let mut c = cluster("rma-64m");
    c.spawn(2).connect_all();
    const BIG: usize = 64 << 20;
    let mut r = Region::new(&mut c, 1, 64, BIG + 100, 3, "rw");
    let mut counts = Counts::default();
    write(
        &mut c,
        0,
        &mut r,
        &mut counts,
        WriteCall::Write,
        100,
        BIG,
        640,
        1,
    );
    c.cmd(1, format!("check-mr 64 100 {BIG} 640"));
    c.cmd(1, "check-mr 64 0 100 3");
    read(&mut c, 0, &r, &mut counts, ReadCall::Readv, 0, BIG + 100, 2);
    c.finish();
}

#[test]
fn writedata_reports_once_at_the_target_after_the_bytes() {
    let mut c = cluster("rma-writedata");
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0xd, REGION, 4, "rw");
    let mut counts = Counts::default();
    // Several writes with data in flight at once: one entry each, each
    // after its bytes (the watched range covers all of them).
    let writes = [
        (0usize, 0usize),
        (100, 22),
        (200, EAGER + 1),
        (EAGER + 300, 3 * SEGMENT),
    ];
    let end = writes.iter().map(|&(off, len)| off + len).max().unwrap();
    c.cmd(1, format!("watch 0xd 0 {end}"));
    for (i, &(off, len)) in writes.iter().enumerate() {
        let data = 0x1000 + i as u64;
        c.cmd(
            0,
            format!("write 1 0xd {off} {len} {} {i} data={data:#x}", 50 + i),
        );
    }
    let done = c
        .cmd(0, format!("wait writes={}", writes.len()))
        .completions();
    let mut ctxs: Vec<u64> = done.iter().map(|w| w.ctx).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, (0..writes.len() as u64).collect::<Vec<_>>());
    for (i, &(off, len)) in writes.iter().enumerate() {
        r.written(off, len, 50 + i as u64);
    }
    let remote = c
        .cmd(1, format!("wait remote={}", writes.len()))
        .completions();
    for e in &remote {
        let i = (e.data - 0x1000) as usize;
        let len = writes
            .get(i)
            .unwrap_or_else(|| panic!("unknown data: {e}"))
            .1;
        // Each entry was read after its own bytes landed: the range then
        // held at least them. When the last entry was read, all were there.
        assert_eq!(
            (e.kind, e.flags, e.len, e.ctx),
            (Kind::Remote, REMOTE_FLAGS, len, 0),
            "{e}"
        );
        assert!(e.guard, "{e}");
    }
    let mut data: Vec<u64> = remote.iter().map(|e| e.data).collect();
    data.sort_unstable();
    assert_eq!(
        data,
        (0x1000..0x1000 + writes.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        remote.last().unwrap().sum,
        r.sum(0, end),
        "bytes in place at the last entry"
    );
    // Exactly one each: nothing more comes.
    c.cmd(1, "quiet 100");
    r.check(&mut c, "after the writes with data");
    // One at a time, every call that carries data, each entry checked
    // against exactly its own bytes.
    for (i, call) in [
        WriteCall::Writedata,
        WriteCall::InjectWritedata,
        WriteCall::WritemsgData,
    ]
    .into_iter()
    .enumerate()
    {
        for (j, len) in [0, 1, EAGER, EAGER + 1, 2 * SEGMENT + 3]
            .into_iter()
            .enumerate()
        {
            if call.inject() && len > EAGER {
                continue;
            }
            let seed = 1000 + 10 * i as u64 + j as u64;
            write(
                &mut c,
                0,
                &mut r,
                &mut counts,
                call,
                11 * j,
                len,
                seed,
                seed,
            );
        }
    }
    c.cmd(1, "quiet 100");
    c.finish();
}

#[test]
fn two_initiators_write_halves_of_one_region_at_once() {
    let mut c = cluster("rma-three");
    c.spawn(3).connect_all();
    const HALF: usize = 2 * 1024 * 1024 + 3;
    let mut r = Region::new(&mut c, 0, 0x3, 2 * HALF, 30, "rw");
    // Each initiator writes its half in pieces of every protocol, all
    // posted before any is waited for, both at once.
    let pieces = [
        1,
        22,
        EAGER,
        EAGER + 1,
        SEGMENT - 1,
        SEGMENT + 1,
        3 * SEGMENT,
    ];
    let mut off = [0, HALF];
    for (i, &len) in pieces.iter().chain(&[0]).enumerate() {
        let cmds: Vec<(usize, String)> = (1..=2)
            .map(|p| {
                let at = off[p - 1];
                let len = if len == 0 { p * HALF - at } else { len };
                off[p - 1] += len;
                let seed = 100 * p as u64 + i as u64;
                r.written(at, len, seed);
                (p, format!("write 0 3 {at} {len} {seed} {i}"))
            })
            .collect();
        c.all(&cmds);
    }
    assert_eq!(off, [HALF, 2 * HALF]);
    let n = pieces.len() + 1;
    c.all(&[
        (1, format!("wait writes={n}")),
        (2, format!("wait writes={n}")),
    ]);
    r.check(&mut c, "after both halves");
    // Both read the whole region back, at once.
    c.all(&[
        (1, format!("read 0 3 0 {} 1", 2 * HALF)),
        (2, format!("read 0 3 0 {} 1 v", 2 * HALF)),
    ]);
    let done = c.all(&[(1, "wait reads=1".into()), (2, "wait reads=1".into())]);
    for reply in done {
        let e = &reply.completions()[0];
        assert!(e.guard, "{e}");
        assert_eq!(e.sum, r.sum(0, 2 * HALF), "{e}");
    }
    c.finish();
}

/// `FI_INJECT` in the flags of `fi_writemsg` only returns the buffer at
/// once (fi_rma(3)); without `FI_SELECTIVE_COMPLETION` the write still
/// completes on the CQ (only `fi_inject_write` has no completion).
#[test]
fn writemsg_with_fi_inject_still_completes() {
    let mut c = cluster("rma-msg-inject");
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0x1, 2 * EAGER, 1, "rw");
    for (i, len) in [1, 100, EAGER].into_iter().enumerate() {
        let ctx = 10 + i as u64;
        c.cmd(0, format!("write 1 1 0 {len} {ctx} {ctx} msg=inject"));
        let w = c.cmd(0, "wait writes=1").completions().remove(0);
        assert_eq!((w.kind, w.ctx), (Kind::Write, ctx), "{len} bytes: {w}");
        r.written(0, len, ctx);
    }
    let cntr = c.cmd(0, "cntr-wait write=3");
    assert_eq!(cntr.field("write"), 3, "{}", cntr.ok);
    r.check(&mut c, "after the writes");
    c.finish();
}
