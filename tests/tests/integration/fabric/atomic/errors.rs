//! Bad atomics: each its error code, and no byte moved, on ordinary and
//! dmable memory.

use super::*;

/// A bad atomic: what, key, offset, family, datatype, operation, count,
/// form, and the error its completion reports.
type Bad = (
    &'static str,
    u64,
    u64,
    Family,
    &'static str,
    &'static str,
    usize,
    &'static str,
    i32,
);

fn bad_input(test: &str, memory: Memory) {
    let mut c = cluster(test, memory);
    c.spawn(2).connect_all();
    let rw = Region::new(&mut c, 1, 0xb1, 11, "rw");
    let ro = Region::new(&mut c, 1, 0xb2, 12, "read");
    let wo = Region::new(&mut c, 1, 0xb3, 13, "write");
    let (ekey, eacces, einval) = (ffi::FI_EKEYREJECTED, ffi::FI_EACCES, ffi::FI_EINVAL);
    let mut ctx = 100u64;
    let mut errors = Counts::default();
    let mut good = Counts::default();
    let end = REGION as u64;
    #[rustfmt::skip]
    let failing: Vec<Bad> = vec![
        ("unknown key", 0x999, 0, Family::Write, "u64", "sum", 1, "", ekey),
        ("unknown key", 0x999, 0, Family::Fetch, "u32", "sum", 16, " v", ekey),
        ("unknown key", 0x999, 0, Family::Compare, "u64", "cswap", 8, " msg", ekey),
        ("write to read-only", 0xb2, 0, Family::Write, "u64", "sum", 1, "", eacces),
        ("fetch-add on read-only", 0xb2, 8, Family::Fetch, "i32", "sum", 2, "", eacces),
        ("cswap on read-only", 0xb2, 8, Family::Compare, "u64", "cswap", 1, " v", eacces),
        ("read of write-only", 0xb3, 0, Family::Fetch, "u64", "read", 1, "", eacces),
        ("fetch-add on write-only", 0xb3, 0, Family::Fetch, "u8", "sum", 64, " msg", eacces),
        ("cswap on write-only", 0xb3, 0, Family::Compare, "double", "cswap", 1, "", eacces),
        ("past the end", 0xb1, end - 4, Family::Write, "u64", "sum", 1, "", eacces),
        ("at the end", 0xb1, end, Family::Fetch, "u8", "sum", 1, "", eacces),
        ("straddles the end", 0xb1, end - 56, Family::Fetch, "u64", "sum", 8, " v", eacces),
        ("wraps the address", 0xb1, u64::MAX - 7, Family::Compare, "u64", "cswap", 2, "", eacces),
        ("misaligned u32", 0xb1, 2, Family::Write, "u32", "sum", 1, "", einval),
        ("misaligned u64", 0xb1, 4, Family::Fetch, "u64", "sum", 8, " msg", einval),
        ("misaligned u16", 0xb1, 1, Family::Compare, "u16", "cswap", 3, " v", einval),
        ("misaligned double", 0xb1, 12, Family::Fetch, "double", "max", 1, "", einval),
    ];
    for (what, key, off, family, dt, op, count, form, err) in failing {
        ctx += 1;
        let d = done(&c.cmd(
            0,
            format!(
                "atomic 1 {key:#x} {off} {} {dt} {op} {count} ops=0x55 cmp=0x55 ctx={ctx}{form}",
                family.word()
            ),
        ));
        assert_eq!(d.rc, 0, "{what}: posted");
        assert_eq!(d.err, err, "{what}: {d:?}");
        assert_eq!(
            d.flags & (ffi::FI_ATOMIC | ffi::FI_READ | ffi::FI_WRITE),
            family.flags(),
            "{what}: {d:?}"
        );
        assert!(d.guard, "{what}: bytes landed in the result: {d:?}");
        match family {
            Family::Write => errors.write += 1,
            _ => errors.read += 1,
        }
    }
    // Injects that fail: reported with no context, counted as errors.
    for (what, key, off, err) in [
        ("unknown key", 0x999u64, 0u64, ekey),
        ("misaligned", 0xb1, 3, einval),
    ] {
        let d = done(&c.cmd(
            0,
            format!("atomic 1 {key:#x} {off} write u32 bor 1 ops=1 inject"),
        ));
        assert_eq!(d.rc, 0, "inject, {what}");
        errors.write += 1;
        c.cmd(0, format!("cntr-wait write-err={}", errors.write));
        let d = done(&c.cmd(0, "atomic-wait 0"));
        assert_eq!(d.err, err, "inject, {what}: {d:?}");
    }
    // Refused at the call, nothing posted.
    let emsgsize = -i64::from(ffi::FI_EMSGSIZE);
    let refused: Vec<(&str, String, i64)> = vec![
        ("65 u8", "write u8 sum 65".into(), emsgsize),
        ("9 u64", "fetch u64 sum 9 v".into(), emsgsize),
        (
            "9 fcomplex",
            "compare fcomplex cswap 9 msg".into(),
            emsgsize,
        ),
        (
            "17 float, inject",
            "write float sum 17 inject".into(),
            emsgsize,
        ),
        (
            "two target ranges",
            "fetch u64 sum 1 msg rma-iovs=2".into(),
            -i64::from(einval),
        ),
        (
            "no target range",
            "write u64 sum 1 msg rma-iovs=0".into(),
            -i64::from(einval),
        ),
        (
            "unsupported flags",
            "write u64 sum 1 msg=commit-complete".into(),
            -(ffi::FI_EBADFLAGS as i64),
        ),
        (
            "bor on double",
            "write double bor 1".into(),
            -i64::from(ffi::FI_EOPNOTSUPP),
        ),
        (
            "double complex",
            "fetch dcomplex sum 1".into(),
            -i64::from(ffi::FI_EOPNOTSUPP),
        ),
        (
            "read in fi_atomic",
            "write u64 read 1".into(),
            -i64::from(ffi::FI_EOPNOTSUPP),
        ),
    ];
    for (what, call, expected) in refused {
        let d = done(&c.cmd(0, format!("atomic 1 0xb1 0 {call} ops=7 try")));
        assert_eq!(d.rc, expected, "{what}");
    }
    for dest in [2, 77] {
        let d = done(&c.cmd(0, format!("atomic {dest} 0xb1 0 write u64 sum 1 try")));
        assert_eq!(d.rc, -i64::from(einval), "fi_addr {dest}");
        let d = done(&c.cmd(
            0,
            format!("atomic {dest} 0xb1 0 write u64 sum 1 inject try"),
        ));
        assert_eq!(d.rc, -i64::from(einval), "inject to fi_addr {dest}");
    }
    c.cmd(0, "quiet 50");
    // Nothing moved anywhere.
    for r in [&rw, &ro, &wo] {
        r.check(&mut c, "after the refused atomics");
    }
    let cntr = c.cmd(0, "cntr");
    assert_eq!(
        (
            cntr.field("write-err") as u64,
            cntr.field("read-err") as u64
        ),
        (errors.write, errors.read),
        "{}",
        cntr.ok
    );
    assert_eq!(
        (cntr.field("write"), cntr.field("read")),
        (0, 0),
        "{}",
        cntr.ok
    );
    // The allowed directions work: fetch-read of read-only, write to
    // write-only.
    let mut wo = wo;
    let d = done(&c.cmd(0, "atomic 1 0xb2 16 fetch u64 read 2 ctx=7"));
    assert_eq!((d.rc, d.err), (0, 0), "{d:?}");
    let expect: Vec<u64> = (0..2)
        .map(|i| {
            let at = 16 + 8 * i;
            u64::from_le_bytes(ro.bytes[at..at + 8].try_into().unwrap())
        })
        .collect();
    assert_eq!(d.old, expect, "read of read-only");
    good.read += 1;
    let d = done(&c.cmd(0, "atomic 1 0xb3 8 write u64 write 1 ops=0x1234 ctx=8"));
    assert_eq!((d.rc, d.err), (0, 0), "{d:?}");
    good.write += 1;
    wo.store(8, U64, &[0x1234]);
    wo.check(&mut c, "after an allowed write");
    ro.check(&mut c, "after an allowed read");
    let cntr = c.cmd(0, "cntr");
    assert_eq!(
        (cntr.field("write") as u64, cntr.field("read") as u64),
        (good.write, good.read),
        "{}",
        cntr.ok
    );
    let logs = c.finish_with_warnings();
    // Only the allowed atomics ran, on the path of the memory.
    check_path(&logs[0], memory, 2, "p0");
}

#[test]
fn bad_atomics_fail_with_their_code_and_move_nothing() {
    bad_input("atomic-bad", Memory::Ordinary);
}

#[test]
fn bad_atomics_on_dmable_memory_fail_with_their_code_and_move_nothing() {
    bad_input("atomic-bad-dmable", Memory::Dmable);
}
