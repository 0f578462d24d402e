//! Bad RMA: each mistake gives its error code, in the call or its
//! completion, and moves no byte; a closed region's key is refused, then free
//! again.

use super::*;

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
