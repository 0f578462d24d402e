//! RMA (`fi_write`, `fi_read` and their kin) through the real libfabric
//! core and the unimem provider, between separate `fabric-peer` processes.
//!
//! Every operation is checked byte for byte: the test keeps a model of each
//! target region and compares checksums of the whole region (so a byte
//! moved where it should not be is caught too) and of what a read brought
//! back; the guard bytes around every region and read buffer must stay
//! untouched. Addresses are offsets into the region (mr_mode has no
//! `FI_MR_VIRT_ADDR`).
//!
//! The target regions here are ordinary (not dmable) memory, so RMA runs
//! the target-assisted path (the target's progress moves the bytes),
//! except in the tests that preload the dmable heap (`dmable_cluster`):
//! there a large region is dmable and RMA is one-sided (see
//! `one_sided_rma_completes_while_the_target_sleeps`).

use unimem_fi::base::ffi;
use unimem_tests::cluster::{
    carried, carried_notices, Cluster, Completion, Kind, Msg, Order, Region, EAGER, SEGMENT,
};
use unimem_tests::fabric::rc;

fn cluster(test: &str) -> Cluster {
    let mut c = Cluster::new(env!("CARGO_BIN_EXE_fabric-peer"), test);
    // Counters bound with FI_WRITE and FI_READ: how a test learns that an
    // inject (which has no completion) is done.
    c.env("FABRIC_PEER_CNTR", "1");
    c
}

const WRITE_FLAGS: u64 = ffi::FI_RMA | ffi::FI_WRITE;
const READ_FLAGS: u64 = ffi::FI_RMA | ffi::FI_READ;
const REMOTE_FLAGS: u64 = ffi::FI_RMA | ffi::FI_REMOTE_WRITE | ffi::FI_REMOTE_CQ_DATA;

/// A way of writing: the entry point `fabric-peer`'s `write` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteCall {
    Write,
    Writev,
    Writemsg,
    InjectWrite,
    Writedata,
    InjectWritedata,
    /// `fi_writemsg` with `FI_REMOTE_CQ_DATA`.
    WritemsgData,
}

const WRITE_CALLS: [WriteCall; 7] = [
    WriteCall::Write,
    WriteCall::Writev,
    WriteCall::Writemsg,
    WriteCall::InjectWrite,
    WriteCall::Writedata,
    WriteCall::InjectWritedata,
    WriteCall::WritemsgData,
];

impl WriteCall {
    fn inject(self) -> bool {
        matches!(self, WriteCall::InjectWrite | WriteCall::InjectWritedata)
    }

    fn data(self) -> bool {
        matches!(
            self,
            WriteCall::Writedata | WriteCall::InjectWritedata | WriteCall::WritemsgData
        )
    }

    /// Options of `write` for this call, with CQ data `data`.
    fn opts(self, data: u64) -> String {
        let call = match self {
            WriteCall::Write | WriteCall::Writedata => "",
            WriteCall::Writev => " v",
            WriteCall::Writemsg | WriteCall::WritemsgData => " msg=completion",
            WriteCall::InjectWrite | WriteCall::InjectWritedata => " inject",
        };
        if self.data() {
            format!("{call} data={data:#x}")
        } else {
            call.to_string()
        }
    }
}

/// A way of reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadCall {
    Read,
    Readv,
    Readmsg,
}

const READ_CALLS: [ReadCall; 3] = [ReadCall::Read, ReadCall::Readv, ReadCall::Readmsg];

impl ReadCall {
    fn opts(self) -> &'static str {
        match self {
            ReadCall::Read => "",
            ReadCall::Readv => " v",
            ReadCall::Readmsg => " msg",
        }
    }
}

/// Counts of the initiator's counters it expects (write, read).
#[derive(Default)]
struct Counts {
    writes: u64,
    reads: u64,
}

/// Writes `len` bytes of pattern `seed` from `ini` at `off` of `r` with
/// `call`, waits for it (its completion, or for an inject the write
/// counter) and checks the completion, the remote CQ entry of a write
/// with data (exactly one, with the bytes in place when it was read), and
/// the whole region.
#[allow(clippy::too_many_arguments)]
fn write(
    c: &mut Cluster,
    ini: usize,
    r: &mut Region,
    counts: &mut Counts,
    call: WriteCall,
    off: usize,
    len: usize,
    seed: u64,
    ctx: u64,
) {
    let what = format!("{call:?} of {len} bytes at {off} (seed {seed})");
    let data = 0xda7a_0000_0000_0000 | seed;
    if call.data() {
        c.cmd(r.target, format!("watch {} {off} {len}", r.key));
    }
    let (t, key) = (r.target, r.key);
    c.cmd(
        ini,
        format!(
            "write {t} {key} {off} {len} {seed} {ctx}{}",
            call.opts(data)
        ),
    );
    counts.writes += 1;
    if call.inject() {
        c.cmd(ini, format!("cntr-wait write={}", counts.writes));
    } else {
        let done = c.cmd(ini, "wait writes=1").completions();
        assert_eq!(done.len(), 1, "{what}");
        let w = &done[0];
        assert_eq!((w.kind, w.ctx), (Kind::Write, ctx), "{what}: {w}");
        assert_eq!(w.flags & WRITE_FLAGS, WRITE_FLAGS, "{what}: {w}");
        assert_eq!(
            w.flags & (ffi::FI_READ | ffi::FI_SEND | ffi::FI_RECV),
            0,
            "{what}: {w}"
        );
    }
    r.written(off, len, seed);
    if call.data() {
        let remote = c.cmd(r.target, "wait remote=1").completions();
        check_remote(&remote[0], data, len, r.sum(off, len), &what);
    }
    // No remote entry for a write without data, no second one with.
    let pending = c.cmd(r.target, "pending");
    assert_eq!(pending.field("remote"), 0, "{what}");
    r.check(c, &what);
}

/// A remote CQ entry: flags, data, length, no context, and the bytes
/// (`sum` of the watched range) in place when it was read.
fn check_remote(e: &Completion, data: u64, len: usize, sum: u64, what: &str) {
    assert_eq!(e.kind, Kind::Remote, "{what}: {e}");
    assert_eq!(e.flags, REMOTE_FLAGS, "{what}: {e}");
    assert_eq!((e.data, e.len, e.ctx), (data, len, 0), "{what}: {e}");
    assert_eq!(e.sum, sum, "{what}: the bytes were not in place: {e}");
    assert!(e.guard, "{what}: {e}");
}

/// Reads `len` bytes at `off` of `r` into `ini` with `call` and checks
/// what came back against the model.
#[allow(clippy::too_many_arguments)]
fn read(
    c: &mut Cluster,
    ini: usize,
    r: &Region,
    counts: &mut Counts,
    call: ReadCall,
    off: usize,
    len: usize,
    ctx: u64,
) {
    let what = format!("{call:?} of {len} bytes at {off}");
    let (t, key) = (r.target, r.key);
    c.cmd(
        ini,
        format!("read {t} {key} {off} {len} {ctx}{}", call.opts()),
    );
    counts.reads += 1;
    let done = c.cmd(ini, "wait reads=1").completions();
    let e = &done[0];
    assert_eq!(
        (e.kind, e.ctx, e.len),
        (Kind::Read, ctx, len),
        "{what}: {e}"
    );
    assert_eq!(e.flags & READ_FLAGS, READ_FLAGS, "{what}: {e}");
    assert_eq!(
        e.flags & (ffi::FI_WRITE | ffi::FI_SEND | ffi::FI_RECV),
        0,
        "{what}: {e}"
    );
    assert!(e.guard, "{what}: wrote past the read buffer: {e}");
    assert_eq!(e.sum, r.sum(off, len), "{what}: data read: {e}");
}

/// Sizes around every limit: 0, 1, the inline limit (22), eager and
/// segment -1/=/+1, and a few MiB.
fn sizes() -> Vec<usize> {
    let mut sizes = vec![0, 1, 22, 23];
    for limit in [EAGER, SEGMENT] {
        sizes.extend([limit - 1, limit, limit + 1]);
    }
    sizes.push(3 * 1024 * 1024 + 5);
    sizes
}

/// A region big enough for every size at its start, middle and end.
const REGION: usize = 4 * 1024 * 1024 + 1001;

/// Start, middle (odd, unaligned) and end of the region for `len` bytes.
fn places(len: usize) -> [usize; 3] {
    [0, ((REGION - len) / 2) | 1, REGION - len].map(|off| off.min(REGION - len))
}

/// The endpoints still carry messages of every protocol and RMA both ways.
fn still_works(c: &mut Cluster, r0: &mut Region, r1: &mut Region, counts: &mut [Counts; 2]) {
    let msgs = [0, 22, EAGER, 2 * SEGMENT + 1].map(|len| Msg::new(len, len as u64));
    c.transfer(0, 1, &msgs, Order::Posted);
    for (len, seed) in [(10, 901), (2 * SEGMENT + 7, 902)] {
        write(
            c,
            0,
            r1,
            &mut counts[0],
            WriteCall::Write,
            5,
            len,
            seed,
            4242,
        );
        read(c, 0, r1, &mut counts[0], ReadCall::Read, 5, len, 4243);
        write(
            c,
            1,
            r0,
            &mut counts[1],
            WriteCall::Writev,
            7,
            len,
            seed + 1,
            4244,
        );
        read(c, 1, r0, &mut counts[1], ReadCall::Readv, 7, len, 4245);
    }
}

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

/// Runs `command` on child `i` and checks the return code it reports.
fn expect_rc(c: &mut Cluster, i: usize, command: &str, expected: i32) {
    let got = c.cmd(i, command).num();
    assert_eq!(got, i64::from(expected), "{command}");
}

/// Waits for one error completion at `i` and checks it.
fn expect_error(c: &mut Cluster, i: usize, ctx: u64, flags: u64, err: i32, what: &str) {
    let e = c.cmd(i, "wait errors=1").completions().remove(0);
    assert_eq!((e.kind, e.ctx), (Kind::Error, ctx), "{what}: {e}");
    assert_eq!(e.flags & flags, flags, "{what}: {e}");
    assert_eq!(e.err, err, "{what}: {e}");
    // For a read: the whole buffer is untouched.
    assert!(e.guard, "{what}: bytes landed: {e}");
}

#[test]
fn bad_rma_fails_with_its_code_and_moves_nothing() {
    let mut c = cluster("rma-bad");
    c.spawn(2).connect_all();
    let mut r0 = Region::new(&mut c, 0, 0xa0, REGION, 6, "rw");
    let mut r1 = Region::new(&mut c, 1, 0xa1, REGION, 7, "rw");
    let ro = Region::new(&mut c, 1, 0xb0, 3 * SEGMENT, 8, "read");
    let wo = Region::new(&mut c, 1, 0xb1, 3 * SEGMENT, 9, "write");
    let none = Region::new(&mut c, 1, 0xb2, 1000, 10, "none");
    let ekey = ffi::FI_EKEYREJECTED;
    let eacces = ffi::FI_EACCES;

    // Unknown keys, a key only the other process has, a region without
    // remote access: FI_EKEYREJECTED, for writes and reads of every size.
    for (key, len) in [
        (0x999, 8),
        (0xa0, EAGER + 1),
        (0xb2, 10),
        (0x999, 2 * SEGMENT),
    ] {
        let what = format!("key {key:#x}, {len} bytes");
        c.cmd(0, format!("write 1 {key} 0 {len} 1 20"));
        expect_error(&mut c, 0, 20, WRITE_FLAGS, ekey, &what);
        c.cmd(0, format!("read 1 {key} 0 {len} 21"));
        expect_error(&mut c, 0, 21, READ_FLAGS, ekey, &what);
    }
    // Injects fail too: the counter counts it, and the provider reports
    // it on the CQ with no context (there is none to report).
    c.cmd(0, "write 1 0x999 0 8 1 22 inject");
    c.cmd(0, "cntr-wait write-err=5 read-err=4");
    expect_error(
        &mut c,
        0,
        0,
        WRITE_FLAGS,
        ekey,
        "inject with an unknown key",
    );

    // Beyond the region: FI_EACCES.
    let beyond = [
        (REGION - 10, 11),
        (REGION, 1),
        (REGION + 1, 0),
        (REGION - SEGMENT, SEGMENT + 1),
        (0, REGION + 1),
        (u64::MAX as usize - 15, 100),
    ];
    for (off, len) in beyond {
        let what = format!("{len} bytes at {off}");
        c.cmd(0, format!("write 1 0xa1 {off} {len} 1 30"));
        expect_error(&mut c, 0, 30, WRITE_FLAGS, eacces, &what);
        c.cmd(0, format!("read 1 0xa1 {off} {len} 31 v"));
        expect_error(&mut c, 0, 31, READ_FLAGS, eacces, &what);
    }
    // Rights: no write to a read-only region, no read of a write-only one.
    for len in [1, EAGER, SEGMENT + 1] {
        c.cmd(0, format!("write 1 0xb0 0 {len} 1 40"));
        expect_error(&mut c, 0, 40, WRITE_FLAGS, eacces, "write to read-only");
        c.cmd(0, format!("write 1 0xb0 0 {len} 1 40 msg data=5"));
        expect_error(&mut c, 0, 40, WRITE_FLAGS, eacces, "writemsg to read-only");
        c.cmd(0, format!("read 1 0xb1 0 {len} 41 msg"));
        expect_error(&mut c, 0, 41, READ_FLAGS, eacces, "read of write-only");
    }
    // ...while the allowed direction works.
    let mut counts = Counts::default();
    read(
        &mut c,
        0,
        &ro,
        &mut counts,
        ReadCall::Read,
        5,
        SEGMENT + 1,
        42,
    );
    let mut wo = wo;
    write(
        &mut c,
        0,
        &mut wo,
        &mut counts,
        WriteCall::Write,
        5,
        SEGMENT + 1,
        43,
        43,
    );
    // No remote entry for a refused write with data.
    assert_eq!(c.cmd(1, "pending").field("remote"), 0);

    // A key in use in the process: -FI_ENOKEY (the other process may use
    // it); the first region stays as it was.
    expect_rc(&mut c, 1, "mr 0xa1 64", rc::ENOKEY);
    expect_rc(&mut c, 1, "mr 0xb0 64 access=write", rc::ENOKEY);
    expect_rc(&mut c, 0, "mr 0xa1 64", 0);
    expect_rc(&mut c, 0, "unreg 0xa1", 0);

    // Refused at the call, nothing posted: an inject above inject_size,
    // two target ranges, an fi_addr not in the AV.
    let einval = rc::EINVAL;
    let big = EAGER + 1;
    expect_rc(
        &mut c,
        0,
        &format!("write 1 0xa1 0 {big} 1 50 inject try"),
        einval,
    );
    expect_rc(
        &mut c,
        0,
        &format!("write 1 0xa1 0 {big} 1 50 inject data=1 try"),
        einval,
    );
    expect_rc(
        &mut c,
        0,
        &format!("write 1 0xa1 0 {big} 1 50 msg=inject try"),
        einval,
    );
    expect_rc(
        &mut c,
        0,
        "write 1 0xa1 0 100 1 51 msg rma-iovs=2 try",
        einval,
    );
    expect_rc(
        &mut c,
        0,
        "write 1 0xa1 0 100 1 51 msg rma-iovs=0 try",
        einval,
    );
    expect_rc(&mut c, 0, "read 1 0xa1 0 100 52 msg rma-iovs=2 try", einval);
    expect_rc(&mut c, 0, "write 12345 0xa1 0 100 1 53 try", einval);
    expect_rc(&mut c, 0, "write 2 0xa1 0 100 1 53 v try", einval);
    expect_rc(&mut c, 0, "write 77 0xa1 0 10 1 53 inject try", einval);
    expect_rc(&mut c, 0, "read 9 0xa1 0 100 54 try", einval);
    c.cmd(0, "quiet 50");
    c.cmd(1, "quiet 50");

    // Nothing moved anywhere.
    for r in [&r0, &r1, &ro, &wo, &none] {
        r.check(&mut c, "after the refused operations");
    }
    let mut counts = [Counts::default(), Counts::default()];
    still_works(&mut c, &mut r0, &mut r1, &mut counts);
    let stderr = c.finish_with_warnings().swap_remove(0);
    let warned = |parts: &[&str]| {
        stderr.lines().any(|l| {
            unimem_tests::cluster::is_provider_warning(l) && parts.iter().all(|p| l.contains(p))
        })
    };
    assert!(
        warned(&["fi_inject_write", "inject of 16385 bytes"]),
        "{stderr}"
    );
    assert!(warned(&["fi_writemsg", "rma_iov_count 1"]), "{stderr}");
    assert!(
        warned(&["fi_write", "fi_addr 0x3039", "not in the endpoint's AV"]),
        "{stderr}"
    );
    assert!(
        warned(&["fi_read", "fi_addr 0x9", "not in the endpoint's AV"]),
        "{stderr}"
    );
}

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

/// Every process preloads the dmable heap (`LD_PRELOAD`): a region of
/// `REGION` bytes (far above the heap's threshold) is dmable.
fn dmable_cluster(test: &str) -> Cluster {
    let mut c = cluster(test);
    c.preload_heap();
    // The endpoints' close lines: which path each operation took.
    c.env("FI_LOG_LEVEL", "info");
    c
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
fn a_key_is_free_again_once_its_region_is_closed() {
    let mut c = cluster("rma-unreg");
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0x42, 1000, 1, "rw");
    let mut counts = Counts::default();
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
    expect_rc(&mut c, 1, "unreg 0x42", 0);
    let ekey = ffi::FI_EKEYREJECTED;
    c.cmd(0, "write 1 0x42 0 10 3 2");
    expect_error(&mut c, 0, 2, WRITE_FLAGS, ekey, "write to a closed region");
    c.cmd(0, format!("read 1 0x42 0 {} 3", SEGMENT + 1));
    expect_error(&mut c, 0, 3, READ_FLAGS, ekey, "read of a closed region");
    // The key again, for a bigger region elsewhere: its own size counts.
    let mut r = Region::new(&mut c, 1, 0x42, 3 * SEGMENT, 4, "rw");
    write(
        &mut c,
        0,
        &mut r,
        &mut counts,
        WriteCall::Writev,
        2000,
        SEGMENT,
        5,
        4,
    );
    read(
        &mut c,
        0,
        &r,
        &mut counts,
        ReadCall::Read,
        0,
        3 * SEGMENT,
        5,
    );
    c.cmd(0, format!("write 1 0x42 {} 2 6 6", 3 * SEGMENT - 1));
    expect_error(
        &mut c,
        0,
        6,
        WRITE_FLAGS,
        ffi::FI_EACCES,
        "beyond the new region",
    );
    r.check(&mut c, "in the end");
    c.finish_with_warnings();
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
