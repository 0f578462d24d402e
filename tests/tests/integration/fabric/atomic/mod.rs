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

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{carried, Cluster, Reply};
use unimem_tests::payload;

mod counter;
mod errors;
mod forms;
mod queries;
mod signal;

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
    let mut c = super::cluster(test);
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
