//! Every call form of the atomics over the representative cases (plain,
//! `v`, `msg`, inject), on ordinary and dmable memory; `FI_ATOMIC_READ` with
//! a NULL operand; `fi_atomicmsg` with `FI_INJECT`.

use super::*;

/// The forms, in turn: plain, `v`, `msg`, and for `fi_atomic` the inject.
const FORMS: [&str; 4] = ["", " v", " msg", " msg=completion|delivery-complete"];

fn every_call_form(test: &str, memory: Memory) {
    let mut c = cluster(test, memory);
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0xa7, 5, "rw");
    let mut counts = Counts::default();
    let mut applied = 0u64;
    let mut k = 0u64;
    for (dt, op, family) in cases() {
        for count in [1, dt.max_count()] {
            k += 1;
            // A fresh place in the region for each (aligned to 64 bytes),
            // between bytes that must not change.
            let off = 64 * (k as usize % (REGION / 64 - 2) + 1);
            let init: Vec<u64> = (0..count).map(|i| value(dt, k, 0, i)).collect();
            let ops: Vec<u64> = (0..count).map(|i| value(dt, k, 1, i)).collect();
            let cmps: Vec<u64> = (0..count).map(|i| compare(dt, op, k, i, init[i])).collect();
            r.set(&mut c, off, dt, &init);
            let inject = family == Family::Write && k % 5 == 4;
            let form = if inject {
                " inject"
            } else {
                FORMS[k as usize % FORMS.len()]
            };
            let what = format!("{family:?} {op} on {count} {} ({form})", dt.name);
            let command = format!(
                "atomic 1 {:#x} {off} {} {} {op} {count} ops={} cmp={} ctx={k}{form}",
                r.key,
                family.word(),
                dt.name,
                list(&ops),
                list(&cmps),
            );
            let d = done(&c.cmd(0, command));
            match family {
                Family::Write => counts.write += 1,
                _ => counts.read += 1,
            }
            applied += 1;
            assert_eq!(d.rc, 0, "{what}: {d:?}");
            if inject {
                c.cmd(0, format!("cntr-wait write={}", counts.write));
            } else {
                assert_eq!(d.err, 0, "{what}: {d:?}");
                assert_eq!(
                    d.flags & (ffi::FI_ATOMIC | ffi::FI_READ | ffi::FI_WRITE | ffi::FI_RMA),
                    family.flags(),
                    "{what}: flags {:#x}",
                    d.flags
                );
                assert!(d.guard, "{what}: wrote past the result: {d:?}");
            }
            if family != Family::Write {
                assert_eq!(d.old, init, "{what}: old values");
            }
            let new: Vec<u64> = (0..count)
                .map(|i| model(dt, op, init[i], ops[i], cmps[i]))
                .collect();
            assert_eq!(r.get(&mut c, off, dt, count), new, "{what}: new values");
            r.store(off, dt, &new);
            r.check(&mut c, &what);
        }
    }
    let cntr = c.cmd(0, "cntr");
    assert_eq!(
        (cntr.field("write") as u64, cntr.field("read") as u64),
        (counts.write, counts.read),
        "{}",
        cntr.ok
    );
    assert_eq!((cntr.field("write-err"), cntr.field("read-err")), (0, 0));
    let logs = c.finish();
    check_path(&logs[0], memory, applied, "p0");
}

#[test]
fn every_call_form_on_ordinary_memory() {
    every_call_form("atomic-forms", Memory::Ordinary);
}

#[test]
fn every_call_form_on_dmable_memory() {
    every_call_form("atomic-forms-dmable", Memory::Dmable);
}

/// fi_atomic(3): "For FI_ATOMIC_READ operations, the source buffer operand
/// (e.g. fi_fetch_atomic buf parameter) is ignored and may be NULL."
#[test]
fn an_atomic_read_takes_a_null_operand() {
    let mut c = cluster("atomic-read-null", Memory::Ordinary);
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0xd0, 31, "rw");
    let values: Vec<u64> = (0..8).map(|i| mix(i) & U32.mask()).collect();
    r.set(&mut c, 64, U32, &values);
    for (i, form) in ["", " v", " msg"].iter().enumerate() {
        let d = done(&c.cmd(
            0,
            format!("atomic 1 0xd0 64 fetch u32 read 8 null-ops ctx={i}{form}"),
        ));
        assert_eq!(
            (d.rc, d.err),
            (0, 0),
            "fetch read with a NULL operand{form}: {d:?}"
        );
        assert_eq!(d.old, values, "{form}");
        assert!(d.guard, "{form}: {d:?}");
    }
    // Any other operation needs its operand.
    let d = done(&c.cmd(0, "atomic 1 0xd0 64 fetch u32 sum 1 null-ops try"));
    assert_eq!(
        d.rc,
        -i64::from(ffi::FI_EINVAL),
        "fetch sum with a NULL operand"
    );
    r.check(&mut c, "after the reads");
    c.finish_with_warnings();
}

/// `FI_INJECT` in the flags of `fi_atomicmsg` and kin only returns the
/// operand buffers at once (fi_atomic(3)); without
/// `FI_SELECTIVE_COMPLETION` the operation still completes on the CQ
/// (only `fi_inject_atomic` has none), and a fetch's old values arrive
/// with it.
#[test]
fn atomicmsg_with_fi_inject_still_completes() {
    let mut c = cluster("atomic-msg-inject", Memory::Ordinary);
    c.spawn(2).connect_all();
    let mut r = Region::new(&mut c, 1, 0xe0, 41, "rw");
    r.set(&mut c, 0, U64, &[10, 20, 30]);
    for (i, (family, op, old, new)) in [
        (Family::Write, "sum", None, 11),
        (Family::Fetch, "sum", Some(20), 21),
        (Family::Compare, "cswap", Some(30), 1),
    ]
    .into_iter()
    .enumerate()
    {
        let command = format!(
            "atomic 1 0xe0 {} {} u64 {op} 1 ops=1 cmp=30 ctx={} msg=inject",
            8 * i,
            family.word(),
            i + 1
        );
        let d = done(&c.cmd(0, command));
        assert_eq!((d.rc, d.err), (0, 0), "{family:?} with FI_INJECT: {d:?}");
        assert_eq!(d.flags & family.flags(), family.flags(), "{d:?}");
        if let Some(old) = old {
            assert_eq!(d.old, [old], "{family:?} with FI_INJECT: old value");
        }
        assert_eq!(r.get(&mut c, 8 * i, U64, 1), [new], "{family:?}");
        r.store(8 * i, U64, &[new]);
    }
    r.check(&mut c, "after the atomics");
    c.finish();
}
