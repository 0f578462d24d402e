//! Atomics (`fi_atomic`, `fi_fetch_atomic`, `fi_compare_atomic`, their `v`,
//! `msg` and inject forms, and the `*valid` queries) through the real
//! libfabric core and the unimem provider, between separate `fabric-peer`
//! processes.
//!
//! Each test runs on ordinary target memory (the target's progress applies
//! the atomics) and on dmable target memory (every process preloads the
//! dmable heap, and regions are far above its threshold: the initiator
//! applies them one-sided). Which path ran is read from the line each
//! endpoint logs when it closes (`RMA and atomics: X one-sided, Y through
//! the target (Z atomics)`).
//!
//! Data checks are exact: the old values an operation returns, the new
//! values of its elements (against a model of each operation written here,
//! independently of the provider's), and a checksum of the whole target
//! region (so that a byte moved where it should not be is caught too); the
//! result buffer's guard bytes must stay untouched.

use unimem_fi::base::ffi;
use unimem_tests::cluster::{carried, Cluster, Reply};
use unimem_tests::payload;

/// Largest operand of one atomic, in bytes (`fi_atomicvalid`'s count is
/// this over the element size).
const MAX_BYTES: usize = 64;
/// The target regions: far above the heap's threshold (64 KiB), so dmable
/// when the heap is preloaded.
const REGION: usize = 256 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    /// Ordinary target memory: the target's progress applies atomics.
    Ordinary,
    /// The dmable heap preloaded: atomics are one-sided.
    Dmable,
}

fn cluster(test: &str, memory: Memory) -> Cluster {
    let mut c = Cluster::new(env!("CARGO_BIN_EXE_fabric-peer"), test);
    // Counters bound with FI_WRITE and FI_READ (how a test learns that an
    // inject is done); the endpoints' close lines (info level).
    c.env("FABRIC_PEER_CNTR", "1");
    c.env("FI_LOG_LEVEL", "info");
    if memory == Memory::Dmable {
        c.preload_heap();
    }
    c
}

/// Checks that an initiator's atomics (`n`, all applied) took the path of
/// `memory`.
fn check_path(stderr: &str, memory: Memory, n: u64, who: &str) {
    let (one_sided, assisted, atomics) = carried(stderr);
    let expected = match memory {
        Memory::Ordinary => (0, n, n),
        Memory::Dmable => (n, 0, n),
    };
    assert_eq!(
        (one_sided, assisted, atomics),
        expected,
        "{who}: (one-sided, through the target, atomics) for {memory:?} memory"
    );
}

// --- Datatypes, operations and a model of them ------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int { signed: bool },
    F32,
    F64,
    C32,
}

#[derive(Clone, Copy, Debug)]
struct Dt {
    name: &'static str,
    size: usize,
    kind: Kind,
}

const fn int(name: &'static str, size: usize, signed: bool) -> Dt {
    Dt {
        name,
        size,
        kind: Kind::Int { signed },
    }
}

const I8: Dt = int("i8", 1, true);
const U8: Dt = int("u8", 1, false);
const I16: Dt = int("i16", 2, true);
const U16: Dt = int("u16", 2, false);
const I32: Dt = int("i32", 4, true);
const U32: Dt = int("u32", 4, false);
const I64: Dt = int("i64", 8, true);
const U64: Dt = int("u64", 8, false);
const FLOAT: Dt = Dt {
    name: "float",
    size: 4,
    kind: Kind::F32,
};
const DOUBLE: Dt = Dt {
    name: "double",
    size: 8,
    kind: Kind::F64,
};
const FCOMPLEX: Dt = Dt {
    name: "fcomplex",
    size: 8,
    kind: Kind::C32,
};
const INTS: [Dt; 8] = [I8, U8, I16, U16, I32, U32, I64, U64];

impl Dt {
    fn mask(self) -> u64 {
        if self.size >= 8 {
            u64::MAX
        } else {
            (1 << (8 * self.size)) - 1
        }
    }

    fn max_count(self) -> usize {
        MAX_BYTES / self.size
    }

    /// An integer element as a number of its type.
    fn int(self, bits: u64) -> i128 {
        let bits = bits & self.mask();
        match self.kind {
            Kind::Int { signed: true } => {
                let shift = 64 - 8 * self.size as u32;
                i128::from(((bits << shift) as i64) >> shift)
            }
            _ => i128::from(bits),
        }
    }

    fn f32(bits: u64) -> f32 {
        f32::from_bits(bits as u32)
    }

    fn c32(bits: u64) -> (f32, f32) {
        (Self::f32(bits), Self::f32(bits >> 32))
    }

    fn c32_bits(re: f32, im: f32) -> u64 {
        u64::from(re.to_bits()) | u64::from(im.to_bits()) << 32
    }

    /// An element of value `x` (a small number, exact in every type).
    fn of(self, x: f64) -> u64 {
        match self.kind {
            Kind::Int { .. } => (x as i64 as u64) & self.mask(),
            Kind::F32 => u64::from((x as f32).to_bits()),
            Kind::F64 => x.to_bits(),
            Kind::C32 => Self::c32_bits(x as f32, (x * 0.5 - 1.0) as f32),
        }
    }

    /// How `a` compares with `b`.
    fn cmp(self, a: u64, b: u64) -> Option<std::cmp::Ordering> {
        match self.kind {
            Kind::Int { .. } => Some(self.int(a).cmp(&self.int(b))),
            Kind::F32 => Self::f32(a).partial_cmp(&Self::f32(b)),
            Kind::F64 => f64::from_bits(a).partial_cmp(&f64::from_bits(b)),
            Kind::C32 => None,
        }
    }

    fn is_zero(self, a: u64) -> bool {
        match self.kind {
            Kind::Int { .. } => a & self.mask() == 0,
            Kind::F32 => Self::f32(a) == 0.0,
            Kind::F64 => f64::from_bits(a) == 0.0,
            Kind::C32 => Self::c32(a) == (0.0, 0.0),
        }
    }

    /// 1 or 0 in the type (logical operations).
    fn truth(self, t: bool) -> u64 {
        let x = if t { 1.0 } else { 0.0 };
        match self.kind {
            Kind::C32 => Self::c32_bits(x as f32, 0.0),
            _ => self.of(x),
        }
    }

    fn equal(self, a: u64, b: u64) -> bool {
        match self.kind {
            Kind::Int { .. } => (a ^ b) & self.mask() == 0,
            Kind::F32 => Self::f32(a) == Self::f32(b),
            Kind::F64 => f64::from_bits(a) == f64::from_bits(b),
            Kind::C32 => Self::c32(a) == Self::c32(b),
        }
    }
}

/// The new bits of an element holding `old` after `op` with `x` (operand)
/// and `c` (compare), as libfabric's man page fi_atomic(3) defines them.
fn model(dt: Dt, op: &str, old: u64, x: u64, c: u64) -> u64 {
    use std::cmp::Ordering::*;
    let m = dt.mask();
    let arith = |product: bool| match dt.kind {
        Kind::Int { .. } => {
            let (a, b) = (dt.int(old), dt.int(x));
            (if product { a.wrapping_mul(b) } else { a + b }) as u64 & m
        }
        Kind::F32 => {
            let (a, b) = (Dt::f32(old), Dt::f32(x));
            u64::from((if product { a * b } else { a + b }).to_bits())
        }
        Kind::F64 => {
            let (a, b) = (f64::from_bits(old), f64::from_bits(x));
            (if product { a * b } else { a + b }).to_bits()
        }
        Kind::C32 => {
            let ((ar, ai), (br, bi)) = (Dt::c32(old), Dt::c32(x));
            if product {
                Dt::c32_bits(ar * br - ai * bi, ar * bi + ai * br)
            } else {
                Dt::c32_bits(ar + br, ai + bi)
            }
        }
    };
    let swap_if = |swap: bool| if swap { x } else { old };
    match op {
        "min" => swap_if(dt.cmp(x, old) == Some(Less)),
        "max" => swap_if(dt.cmp(x, old) == Some(Greater)),
        "sum" => arith(false),
        "prod" => arith(true),
        "lor" => dt.truth(!dt.is_zero(old) || !dt.is_zero(x)),
        "land" => dt.truth(!dt.is_zero(old) && !dt.is_zero(x)),
        "lxor" => dt.truth(dt.is_zero(old) != dt.is_zero(x)),
        "bor" => (old | x) & m,
        "band" => old & x & m,
        "bxor" => (old ^ x) & m,
        "read" => old,
        "write" => x,
        "cswap" => swap_if(dt.equal(c, old)),
        "cswap-ne" => swap_if(!dt.equal(c, old)),
        "cswap-le" => swap_if(matches!(dt.cmp(c, old), Some(Less | Equal))),
        "cswap-lt" => swap_if(dt.cmp(c, old) == Some(Less)),
        "cswap-ge" => swap_if(matches!(dt.cmp(c, old), Some(Greater | Equal))),
        "cswap-gt" => swap_if(dt.cmp(c, old) == Some(Greater)),
        "mswap" => ((x & c) | (old & !c)) & m,
        other => panic!("no model of {other}"),
    }
}

/// The call family an operation belongs to in a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Write,
    Fetch,
    Compare,
}

impl Family {
    fn word(self) -> &'static str {
        match self {
            Family::Write => "write",
            Family::Fetch => "fetch",
            Family::Compare => "compare",
        }
    }

    /// The completion's flags.
    fn flags(self) -> u64 {
        match self {
            Family::Write => ffi::FI_ATOMIC | ffi::FI_WRITE,
            _ => ffi::FI_ATOMIC | ffi::FI_READ,
        }
    }
}

const COMPARE_OPS: [&str; 7] = [
    "cswap", "cswap-ne", "cswap-le", "cswap-lt", "cswap-ge", "cswap-gt", "mswap",
];
const UPDATE_OPS: [&str; 11] = [
    "min", "max", "sum", "prod", "lor", "land", "bor", "band", "lxor", "bxor", "write",
];

/// The representative cases: (datatype, operation, family).
fn cases() -> Vec<(Dt, &'static str, Family)> {
    let mut cases = Vec::new();
    let update = |dt: Dt, ops: &[&'static str], cases: &mut Vec<_>| {
        for &op in ops {
            cases.push((dt, op, Family::Write));
            cases.push((dt, op, Family::Fetch));
        }
        cases.push((dt, "read", Family::Fetch));
    };
    // Every integer type: arithmetic and order (sign matters).
    for dt in INTS {
        update(dt, &["sum", "min", "max"], &mut cases);
    }
    // Every operation on three integer widths.
    for dt in [U8, I32, U64] {
        update(dt, &UPDATE_OPS, &mut cases);
        for op in COMPARE_OPS {
            cases.push((dt, op, Family::Compare));
        }
    }
    for dt in [FLOAT, DOUBLE] {
        update(dt, &["sum", "prod", "min", "max", "write"], &mut cases);
        for op in [
            "cswap", "cswap-ne", "cswap-le", "cswap-lt", "cswap-ge", "cswap-gt",
        ] {
            cases.push((dt, op, Family::Compare));
        }
    }
    update(FCOMPLEX, &["sum", "prod", "write"], &mut cases);
    for op in ["cswap", "cswap-ne"] {
        cases.push((FCOMPLEX, op, Family::Compare));
    }
    cases
}

/// A pseudo-random 64-bit value.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of the initial values, operands or compares (`which`) of
/// case `k`: random bits for integers (every third one zero, for the
/// logical operations), small exact numbers for floats.
fn value(dt: Dt, k: u64, which: u64, i: usize) -> u64 {
    let r = mix(k << 20 | which << 10 | i as u64);
    match dt.kind {
        Kind::Int { .. } if (i + which as usize).is_multiple_of(3) => 0,
        Kind::Int { .. } => r & dt.mask(),
        _ => dt.of((r % 17) as f64 * 0.5 - 4.0),
    }
}

/// The compares of case `k`: equal to, below or above the initial value,
/// in turn (for mswap: a random mask).
fn compare(dt: Dt, op: &str, k: u64, i: usize, init: u64) -> u64 {
    if op == "mswap" {
        return value(dt, k, 3, i);
    }
    let delta = match i % 3 {
        0 => return init,
        1 => -1.0,
        _ => 1.0,
    };
    match dt.kind {
        Kind::Int { .. } => (init as i128 + delta as i128) as u64 & dt.mask(),
        Kind::F32 => u64::from((Dt::f32(init) + delta as f32).to_bits()),
        Kind::F64 => (f64::from_bits(init) + delta).to_bits(),
        // Complex values have no order: another value.
        Kind::C32 => {
            let (re, im) = Dt::c32(init);
            Dt::c32_bits(re + delta as f32, im)
        }
    }
}

fn list(values: &[u64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:#x}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_list(text: &str) -> Vec<u64> {
    text.split(',')
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap_or_else(|_| panic!("bad number {w}")))
        .collect()
}

/// One answer of `atomic` / `atomic-wait`.
#[derive(Debug)]
struct Done {
    rc: i64,
    flags: u64,
    err: i32,
    old: Vec<u64>,
    guard: bool,
}

fn done(reply: &Reply) -> Done {
    let old = reply
        .ok
        .split_whitespace()
        .find_map(|w| w.strip_prefix("old="))
        .map(parse_list)
        .unwrap_or_default();
    let rc = reply.field("rc");
    if rc != 0 {
        return Done {
            rc,
            flags: 0,
            err: 0,
            old,
            guard: true,
        };
    }
    let has = |k: &str| reply.ok.split_whitespace().any(|w| w.starts_with(k));
    Done {
        rc,
        flags: if has("flags=") {
            reply.field("flags") as u64
        } else {
            0
        },
        err: if has("err=") {
            reply.field("err") as i32
        } else {
            0
        },
        old,
        guard: !has("guard=") || reply.field("guard") == 1,
    }
}

/// A region at `target` and the test's model of its bytes.
struct Region {
    target: usize,
    key: u64,
    bytes: Vec<u8>,
}

impl Region {
    fn new(c: &mut Cluster, target: usize, key: u64, seed: u64, access: &str) -> Region {
        let rc = c
            .cmd(
                target,
                format!("mr {key} {REGION} access={access} seed={seed}"),
            )
            .num();
        assert_eq!(rc, 0, "fi_mr_reg of key {key} at p{target}");
        Region {
            target,
            key,
            bytes: payload::pattern(seed, REGION),
        }
    }

    fn store(&mut self, off: usize, dt: Dt, values: &[u64]) {
        for (i, v) in values.iter().enumerate() {
            let at = off + i * dt.size;
            self.bytes[at..at + dt.size].copy_from_slice(&v.to_le_bytes()[..dt.size]);
        }
    }

    /// Stores `values` at the target (plain stores) and in the model.
    fn set(&mut self, c: &mut Cluster, off: usize, dt: Dt, values: &[u64]) {
        c.cmd(
            self.target,
            format!("set {} {off} {} {}", self.key, dt.name, list(values)),
        );
        self.store(off, dt, values);
    }

    fn get(&self, c: &mut Cluster, off: usize, dt: Dt, count: usize) -> Vec<u64> {
        let reply = c.cmd(
            self.target,
            format!("get {} {off} {} {count}", self.key, dt.name),
        );
        parse_list(&reply.ok)
    }

    /// The whole region is exactly the model, guards intact.
    fn check(&self, c: &mut Cluster, what: &str) {
        let reply = c.cmd(self.target, format!("mr-sum {}", self.key));
        assert_eq!(
            reply.field("guard"),
            1,
            "guards of region {}: {what}",
            self.key
        );
        assert_eq!(
            reply.field("sum") as u64,
            payload::checksum(&self.bytes),
            "contents of region {} at p{}: {what}",
            self.key,
            self.target
        );
    }
}

/// Counts of the initiator's counters (atomics count as writes or reads).
#[derive(Default, Debug)]
struct Counts {
    write: u64,
    read: u64,
}

// --- Every call form over the representative cases --------------------------

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

// --- What the queries say is what the calls accept --------------------------

/// `enum fi_datatype` up to `FI_LONG_DOUBLE_COMPLEX`, then one beyond.
const DATATYPES: [(&str, usize); 15] = [
    ("i8", 1),
    ("u8", 1),
    ("i16", 2),
    ("u16", 2),
    ("i32", 4),
    ("u32", 4),
    ("i64", 8),
    ("u64", 8),
    ("float", 4),
    ("double", 8),
    ("fcomplex", 8),
    ("dcomplex", 16),
    ("ldouble", 16),
    ("ldcomplex", 32),
    ("14", 8),
];
/// `enum fi_op`, then one beyond.
const OPS: [&str; 20] = [
    "min", "max", "sum", "prod", "lor", "land", "bor", "band", "lxor", "bxor", "read", "write",
    "cswap", "cswap-ne", "cswap-le", "cswap-lt", "cswap-ge", "cswap-gt", "mswap", "19",
];

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
    for (dt, &(dt_name, size)) in DATATYPES.iter().enumerate() {
        for op in OPS {
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

// --- Bad input: its error, and no byte moved --------------------------------

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

// --- Four processes and the target on one counter ---------------------------

/// Fetch-adds per process per round.
const TICKETS: u64 = 300;

fn tickets(reply: &Reply) -> Vec<u64> {
    let text = reply
        .ok
        .strip_prefix("tickets=")
        .unwrap_or_else(|| panic!("no tickets: {}", reply.ok));
    parse_list(text)
}

fn four_initiators_and_the_target(test: &str, memory: Memory) {
    let mut c = cluster(test, memory);
    c.spawn(5).connect_all();
    let mut r = Region::new(&mut c, 0, 0xc0, 21, "rw");
    const AT: usize = 4096;
    r.set(&mut c, AT, U64, &[0]);
    let mut all = Vec::new();
    // Round 1: the target fetch-adds through libfabric (to itself); round
    // 2: with CPU atomics on its own memory.
    for own in ["", " local"] {
        let commands: Vec<(usize, String)> = (0..5)
            .map(|p| {
                let window = 1 + p % 4;
                let extra = if p == 0 { own } else { "" };
                (
                    p,
                    format!("fetch-add-loop 0 0xc0 {AT} {TICKETS} window={window}{extra}"),
                )
            })
            .collect();
        for (p, reply) in c.all(&commands).iter().enumerate() {
            let got = tickets(reply);
            assert_eq!(got.len() as u64, TICKETS, "p{p}");
            all.extend(got);
        }
    }
    let total = 2 * 5 * TICKETS;
    assert_eq!(r.get(&mut c, AT, U64, 1), [total], "the final count");
    all.sort_unstable();
    let missing: Vec<u64> = (0..total)
        .filter(|t| all.binary_search(t).is_err())
        .collect();
    let twice: Vec<u64> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        missing.is_empty() && twice.is_empty() && all.len() as u64 == total,
        "tickets missing {missing:?}, given twice {twice:?}"
    );
    r.store(AT, U64, &[total]);
    r.check(&mut c, "after the tickets");
    let logs = c.finish();
    for (p, log) in logs.iter().enumerate().skip(1) {
        check_path(log, memory, 2 * TICKETS, &format!("p{p}"));
    }
    check_path(&logs[0], memory, TICKETS, "p0");
}

#[test]
fn four_processes_and_the_target_fetch_add_one_counter_in_ordinary_memory() {
    four_initiators_and_the_target("atomic-tickets", Memory::Ordinary);
}

#[test]
fn four_processes_and_the_target_fetch_add_one_counter_in_dmable_memory() {
    four_initiators_and_the_target("atomic-tickets-dmable", Memory::Dmable);
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

/// A put and then an atomic that sets a flag at the same target (the
/// put-then-signal of OpenSHMEM programs, with no fence between them):
/// a target that waits for the flag and then reads the put's range finds
/// all of the put's data, for every path the put takes (bytes, the
/// rendezvous, the direct path, DMA) and both of the atomic's. fi_unimem(7)
/// promises it: an atomic is applied after the writes posted before it to
/// the same target.
fn a_signal_after_a_put(test: &str, memory: Memory) {
    let mut c = cluster(test, memory);
    c.spawn(2).connect_all();
    let key = 0x516;
    assert_eq!(c.cmd(1, format!("mr {key} {REGION} access=rw")).num(), 0);
    let flag = REGION - 8;
    let mut round = 0u64;
    for len in [8, 64, 65, 80, 4096, 16384, 16385, 100_000] {
        for form in ["", " inject"] {
            if form == " inject" && len > 16384 {
                continue;
            }
            round += 1;
            let seed = 0x5e0 + round;
            c.begin(1, format!("flag-wait {key} {flag} {round} 0 {len}"));
            c.cmd(0, format!("write 1 {key} 0 {len} {seed} {round}"));
            c.cmd(
                0,
                format!("atomic 1 {key} {flag} write u64 write 1 ops={round}{form}"),
            );
            let seen = c.next_line(1);
            let sum = seen
                .split_whitespace()
                .find_map(|w| w.strip_prefix("sum="))
                .and_then(unimem_tests::cluster::parse_num)
                .unwrap_or_else(|| panic!("flag-wait answered {seen:?}"));
            assert_eq!(
                sum,
                payload::checksum(&payload::pattern(seed, len)),
                "{memory:?} memory, {len}-byte put then atomic{form}: the flag came before the data"
            );
            c.cmd(0, "wait writes=1");
        }
    }
    c.finish();
}

#[test]
fn a_signal_after_a_put_to_ordinary_memory_comes_after_its_data() {
    a_signal_after_a_put("signal-after-put", Memory::Ordinary);
}

#[test]
fn a_signal_after_a_put_to_dmable_memory_comes_after_its_data() {
    a_signal_after_a_put("signal-after-put-dmable", Memory::Dmable);
}
