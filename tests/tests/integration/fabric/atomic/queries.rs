//! What the queries say is what the calls accept: the three `*valid`
//! queries and `fi_query_atomic` against the calls, for every datatype and
//! operation.

use unimem_tests::fabric::{DATATYPE_NAMES, OP_NAMES};

use super::*;

/// `enum fi_datatype` up to `FI_LONG_DOUBLE_COMPLEX` (the names
/// `fabric-peer` knows), then one beyond.
fn datatypes() -> impl Iterator<Item = (&'static str, usize)> {
    DATATYPE_NAMES.into_iter().chain([("14", 8)])
}

/// `enum fi_op`, then one beyond.
fn ops() -> impl Iterator<Item = &'static str> {
    OP_NAMES.into_iter().chain(["19"])
}

/// Whether the provider supports `op` on datatype number `dt` in `family`
/// (what its documentation promises: every operation on the integers;
/// all but the bitwise ones on float and double; sum, product, read, write
/// and the equality swaps on float complex; nothing wider than 8 bytes).
fn supported(family: Family, dt: usize, op: &str) -> bool {
    let in_family = match op {
        "read" => family == Family::Fetch,
        o if COMPARE_OPS.contains(&o) => family == Family::Compare,
        "19" => false,
        _ => family != Family::Compare,
    };
    in_family
        && match dt {
            0..=7 => true,
            8 | 9 => !matches!(op, "bor" | "band" | "bxor" | "mswap"),
            10 => matches!(op, "sum" | "prod" | "read" | "write" | "cswap" | "cswap-ne"),
            _ => false,
        }
}

#[test]
fn the_queries_answer_what_the_calls_accept() {
    let mut c = cluster("atomic-valid", Memory::Ordinary);
    c.spawn(2).connect_all();
    let r = Region::new(&mut c, 1, 0x7a, 9, "rw");
    let eopnotsupp = -i64::from(ffi::FI_EOPNOTSUPP);
    let emsgsize = -i64::from(ffi::FI_EMSGSIZE);
    let mut ctx = 0u64;
    let (mut accepted, mut refused) = (0, 0);
    // Completed fi_atomic calls (an inject has no completion: its counter
    // says when it is done).
    let mut writes = 0u64;
    for (dt, (dt_name, size)) in datatypes().enumerate() {
        for op in ops() {
            let v = c.cmd(0, format!("valid {dt_name} {op}"));
            for (family, name, qname) in [
                (Family::Write, "write", "qwrite"),
                (Family::Fetch, "fetch", "qfetch"),
                (Family::Compare, "compare", "qcompare"),
            ] {
                let what = format!("{} {op} on {dt_name}", family.word());
                let answer = |key: &str| -> Vec<i64> {
                    let w =
                        v.ok.split_whitespace()
                            .find_map(|w| w.strip_prefix(&format!("{key}=")))
                            .unwrap_or_else(|| panic!("no {key} in {}", v.ok));
                    w.split('/').map(|n| n.parse().expect("number")).collect()
                };
                let (q, aq) = (answer(name), answer(qname));
                let ok = supported(family, dt, op);
                if ok {
                    let max = (MAX_BYTES / size) as i64;
                    assert_eq!(q, [0, max], "{what}: *valid");
                    assert_eq!(aq, [0, max, size as i64], "{what}: fi_query_atomic");
                } else {
                    assert_eq!(q[0], eopnotsupp, "{what}: *valid");
                    assert_eq!(aq[0], eopnotsupp, "{what}: fi_query_atomic");
                }
                // The call: accepted and applied, or refused the same way.
                let mut forms = vec![""];
                if family == Family::Write {
                    forms.push(" inject");
                }
                for form in forms {
                    ctx += 1;
                    let call = format!("atomic 1 {:#x} 0 {} {dt_name} {op}", r.key, family.word());
                    let d = done(&c.cmd(0, format!("{call} 1 ctx={ctx} try{form}")));
                    if ok {
                        assert_eq!((d.rc, d.err), (0, 0), "{what}{form}: {d:?}");
                        accepted += 1;
                        if family == Family::Write {
                            writes += 1;
                            c.cmd(0, format!("cntr-wait write={writes}"));
                        }
                        // One element more than the queries allow: refused.
                        let over = MAX_BYTES / size + 1;
                        let d = done(&c.cmd(0, format!("{call} {over} ctx={ctx} try{form}")));
                        assert_eq!(d.rc, emsgsize, "{what}{form}: {over} elements");
                    } else {
                        assert_eq!(d.rc, eopnotsupp, "{what}{form}: the call");
                        refused += 1;
                    }
                }
            }
        }
    }
    // The table is not trivially one-sided.
    assert!(accepted > 300 && refused > 300, "{accepted} {refused}");
    c.cmd(0, "quiet 50");
    c.finish_with_warnings();
}
