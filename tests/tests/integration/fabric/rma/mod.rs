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

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{
    carried, carried_notices, Cluster, Completion, Kind, Msg, Order, Region, EAGER, SEGMENT,
};
use unimem_tests::fabric::rc;

mod calls;
mod counters;
mod deaths;
mod errors;
mod progress;

fn cluster(test: &str) -> Cluster {
    let mut c = super::cluster(test);
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

/// Every process preloads the dmable heap (`LD_PRELOAD`): a region of
/// `REGION` bytes (far above the heap's threshold) is dmable.
fn dmable_cluster(test: &str) -> Cluster {
    let mut c = cluster(test);
    c.preload_heap();
    // The endpoints' close lines: which path each operation took.
    c.env("FI_LOG_LEVEL", "info");
    c
}
