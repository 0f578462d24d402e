//! Atomic operations: which operation applies to which datatype, and what
//! it does to one element. Plain values in, plain values out: the engine's
//! atomic unit ([`unimem_dma::update_elements`]) makes each element's
//! read-modify-write one atomic step.
//!
//! The numbering of operations and datatypes is libfabric's (`enum fi_op`,
//! `enum fi_datatype`), and is what travels on the wire.
//!
//! Supported: every operation on the eight integer types; on `float` and
//! `double` all but the bitwise ones (`BOR`, `BAND`, `BXOR`, `MSWAP`); on
//! `float complex` sum, product, read, write, and the equality swaps. Not
//! supported: 16-byte and wider elements (`double complex`, `long
//! double`, their complex, 128-bit integers): the atomic unit updates at
//! most 8 bytes in one step.

/// An element operation (libfabric's `enum fi_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AtomicOp {
    Min = 0,
    Max = 1,
    Sum = 2,
    Prod = 3,
    Lor = 4,
    Land = 5,
    Bor = 6,
    Band = 7,
    Lxor = 8,
    Bxor = 9,
    Read = 10,
    Write = 11,
    Cswap = 12,
    CswapNe = 13,
    CswapLe = 14,
    CswapLt = 15,
    CswapGe = 16,
    CswapGt = 17,
    Mswap = 18,
}

/// An element type (libfabric's `enum fi_datatype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Datatype {
    I8 = 0,
    U8 = 1,
    I16 = 2,
    U16 = 3,
    I32 = 4,
    U32 = 5,
    I64 = 6,
    U64 = 7,
    F32 = 8,
    F64 = 9,
    /// `float complex`: two `f32`, real part first.
    C32 = 10,
}

/// Which family of calls an operation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicCall {
    /// `fi_atomic`: updates, returns nothing.
    Write,
    /// `fi_fetch_atomic`: updates (or reads) and returns the old value.
    Fetch,
    /// `fi_compare_atomic`: a swap that depends on a compare operand.
    Compare,
}

/// Largest operand of one atomic operation, in bytes: what the target's
/// progress carries in a few mailbox messages when the target memory is
/// not dmable. `fi_atomicvalid` reports it as a count per datatype.
pub const ATOMIC_MAX_BYTES: usize = 64;

impl AtomicOp {
    pub fn from_u32(value: u32) -> Option<AtomicOp> {
        use AtomicOp::*;
        const ALL: [AtomicOp; 19] = [
            Min, Max, Sum, Prod, Lor, Land, Bor, Band, Lxor, Bxor, Read, Write, Cswap, CswapNe,
            CswapLe, CswapLt, CswapGe, CswapGt, Mswap,
        ];
        ALL.get(value as usize).copied()
    }

    /// The calls this operation belongs to.
    fn call(self) -> &'static [AtomicCall] {
        use AtomicOp::*;
        match self {
            Read => &[AtomicCall::Fetch],
            Cswap | CswapNe | CswapLe | CswapLt | CswapGe | CswapGt | Mswap => {
                &[AtomicCall::Compare]
            }
            _ => &[AtomicCall::Write, AtomicCall::Fetch],
        }
    }

    /// Whether it may change the target (a right to write is needed).
    pub fn writes(self) -> bool {
        self != AtomicOp::Read
    }
}

impl Datatype {
    pub fn from_u32(value: u32) -> Option<Datatype> {
        use Datatype::*;
        const ALL: [Datatype; 11] = [I8, U8, I16, U16, I32, U32, I64, U64, F32, F64, C32];
        ALL.get(value as usize).copied()
    }

    /// Bytes of one element.
    pub fn size(self) -> usize {
        use Datatype::*;
        match self {
            I8 | U8 => 1,
            I16 | U16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 | C32 => 8,
        }
    }

    fn is_integer(self) -> bool {
        !matches!(self, Datatype::F32 | Datatype::F64 | Datatype::C32)
    }
}

/// Whether `call` supports `op` on `datatype`, and with how many elements
/// at most.
pub fn valid(call: AtomicCall, op: AtomicOp, datatype: Datatype) -> Option<usize> {
    use AtomicOp::*;
    if !op.call().contains(&call) {
        return None;
    }
    let ok = match datatype {
        d if d.is_integer() => true,
        Datatype::C32 => matches!(op, Sum | Prod | Read | Write | Cswap | CswapNe),
        _ => !matches!(op, Bor | Band | Bxor | Mswap),
    };
    ok.then_some(ATOMIC_MAX_BYTES / datatype.size())
}

/// The largest count and the element size of `op` on `datatype` in
/// `call`, for libfabric's numbers of both (what `fi_atomicvalid` and
/// `fi_query_atomic` report); None if not supported.
pub fn max_count(call: AtomicCall, datatype: u32, op: u32) -> Option<(usize, usize)> {
    let (op, datatype) = AtomicOp::from_u32(op).zip(Datatype::from_u32(datatype))?;
    valid(call, op, datatype).map(|count| (count, datatype.size()))
}

/// An element value, as the bits of its datatype.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Int(i128),
    F32(f32),
    F64(f64),
    C32(f32, f32),
}

fn decode(datatype: Datatype, bits: u64) -> Value {
    use Datatype::*;
    match datatype {
        I8 => Value::Int(i128::from(bits as u8 as i8)),
        U8 => Value::Int(i128::from(bits as u8)),
        I16 => Value::Int(i128::from(bits as u16 as i16)),
        U16 => Value::Int(i128::from(bits as u16)),
        I32 => Value::Int(i128::from(bits as u32 as i32)),
        U32 => Value::Int(i128::from(bits as u32)),
        I64 => Value::Int(i128::from(bits as i64)),
        U64 => Value::Int(i128::from(bits)),
        F32 => Value::F32(f32::from_bits(bits as u32)),
        F64 => Value::F64(f64::from_bits(bits)),
        C32 => Value::C32(
            f32::from_bits(bits as u32),
            f32::from_bits((bits >> 32) as u32),
        ),
    }
}

fn encode(value: Value) -> u64 {
    match value {
        // Wraps to the element's width when stored.
        Value::Int(v) => v as u64,
        Value::F32(v) => u64::from(v.to_bits()),
        Value::F64(v) => v.to_bits(),
        Value::C32(re, im) => u64::from(re.to_bits()) | u64::from(im.to_bits()) << 32,
    }
}

fn truth(value: Value) -> bool {
    match value {
        Value::Int(v) => v != 0,
        Value::F32(v) => v != 0.0,
        Value::F64(v) => v != 0.0,
        Value::C32(re, im) => re != 0.0 || im != 0.0,
    }
}

fn logical(datatype: Datatype, value: bool) -> Value {
    match datatype {
        Datatype::F32 => Value::F32(value as u8 as f32),
        Datatype::F64 => Value::F64(value as u8 as f64),
        Datatype::C32 => Value::C32(value as u8 as f32, 0.0),
        _ => Value::Int(i128::from(value)),
    }
}

/// Orders two values of one datatype (complex values have no order).
fn order(a: Value, b: Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Int(a), Value::Int(b)) => Some(a.cmp(&b)),
        (Value::F32(a), Value::F32(b)) => a.partial_cmp(&b),
        (Value::F64(a), Value::F64(b)) => a.partial_cmp(&b),
        _ => None,
    }
}

fn arith(a: Value, b: Value, product: bool) -> Value {
    match (a, b) {
        (Value::Int(a), Value::Int(b)) if product => Value::Int(a.wrapping_mul(b)),
        (Value::Int(a), Value::Int(b)) => Value::Int(a.wrapping_add(b)),
        (Value::F32(a), Value::F32(b)) => Value::F32(if product { a * b } else { a + b }),
        (Value::F64(a), Value::F64(b)) => Value::F64(if product { a * b } else { a + b }),
        (Value::C32(ar, ai), Value::C32(br, bi)) if product => {
            Value::C32(ar * br - ai * bi, ar * bi + ai * br)
        }
        (Value::C32(ar, ai), Value::C32(br, bi)) => Value::C32(ar + br, ai + bi),
        (a, _) => a,
    }
}

/// The new bits of an element that holds `old` after `op` with `operand`
/// (and `compare`, for the compare calls), or `None` if it stays as is.
/// Sizes: the low `datatype.size()` bytes of each are the element.
pub fn apply(
    op: AtomicOp,
    datatype: Datatype,
    old: u64,
    operand: u64,
    compare: u64,
) -> Option<u64> {
    use AtomicOp::*;
    let width_mask = match datatype.size() {
        8 => u64::MAX,
        n => (1u64 << (8 * n)) - 1,
    };
    let (old, operand, compare) = (old & width_mask, operand & width_mask, compare & width_mask);
    let current = decode(datatype, old);
    let given = decode(datatype, operand);
    let against = decode(datatype, compare);
    let new = match op {
        Read => return None,
        Write => given,
        Min | Max => {
            let keep_current = match order(current, given)? {
                std::cmp::Ordering::Less => op == Min,
                std::cmp::Ordering::Greater => op == Max,
                std::cmp::Ordering::Equal => true,
            };
            if keep_current {
                return None;
            }
            given
        }
        Sum => arith(current, given, false),
        Prod => arith(current, given, true),
        Lor => logical(datatype, truth(current) || truth(given)),
        Land => logical(datatype, truth(current) && truth(given)),
        Lxor => logical(datatype, truth(current) != truth(given)),
        Bor => return Some((old | operand) & width_mask),
        Band => return Some(old & operand & width_mask),
        Bxor => return Some((old ^ operand) & width_mask),
        Mswap => return Some(((operand & compare) | (old & !compare)) & width_mask),
        Cswap | CswapNe | CswapLe | CswapLt | CswapGe | CswapGt => {
            use std::cmp::Ordering::*;
            let swap = match op {
                // Equality of the values (for floats: 0.0 == -0.0).
                Cswap => against == current,
                CswapNe => against != current,
                _ => {
                    let ord = order(against, current)?;
                    match op {
                        CswapLe => ord != Greater,
                        CswapLt => ord == Less,
                        CswapGe => ord != Less,
                        _ => ord == Greater,
                    }
                }
            };
            if !swap {
                return None;
            }
            given
        }
    };
    Some(encode(new) & width_mask)
}

/// Reads element `index` of `size`-byte elements from `bytes` (little-endian).
pub fn element(bytes: &[u8], size: usize, index: usize) -> u64 {
    let mut word = [0u8; 8];
    word[..size].copy_from_slice(&bytes[index * size..(index + 1) * size]);
    u64::from_le_bytes(word)
}

/// Writes element `index` of `size`-byte elements into `bytes`.
pub fn set_element(bytes: &mut [u8], size: usize, index: usize, value: u64) {
    bytes[index * size..(index + 1) * size].copy_from_slice(&value.to_le_bytes()[..size]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use AtomicOp::*;
    use Datatype::*;

    fn f64b(v: f64) -> u64 {
        v.to_bits()
    }

    #[test]
    fn integer_ops_wrap_at_their_width() {
        assert_eq!(apply(Sum, U8, 250, 10, 0), Some(4));
        assert_eq!(apply(Sum, I8, 0x7f, 1, 0), Some(0x80));
        assert_eq!(
            apply(Prod, I32, (-3i32) as u32 as u64, 5, 0),
            Some((-15i32) as u32 as u64)
        );
        assert_eq!(apply(Min, I16, (-5i16) as u16 as u64, 3, 0), None);
        assert_eq!(
            apply(Min, U16, 0xfffb, 3, 0),
            Some(3),
            "unsigned: 0xfffb is large"
        );
        assert_eq!(apply(Max, I64, 5, (-7i64) as u64, 0), None);
        assert_eq!(apply(Bor, U32, 0b1010, 0b0101, 0), Some(0b1111));
        assert_eq!(apply(Band, U32, 0b1010, 0b0110, 0), Some(0b0010));
        assert_eq!(apply(Bxor, U64, u64::MAX, 1, 0), Some(u64::MAX - 1));
        assert_eq!(apply(Lor, I32, 0, 7, 0), Some(1));
        assert_eq!(apply(Land, I32, 2, 0, 0), Some(0));
        assert_eq!(apply(Lxor, I32, 2, 3, 0), Some(0));
        assert_eq!(apply(Write, U8, 1, 0x1ff, 0), Some(0xff));
        assert_eq!(apply(Read, U64, 1, 2, 3), None);
    }

    #[test]
    fn swaps() {
        assert_eq!(apply(Cswap, U64, 5, 9, 5), Some(9));
        assert_eq!(apply(Cswap, U64, 5, 9, 4), None);
        assert_eq!(apply(CswapNe, U64, 5, 9, 4), Some(9));
        // The compare operand against the target: swap if compare <= target.
        assert_eq!(apply(CswapLe, I32, 5, 9, 5), Some(9));
        assert_eq!(apply(CswapLt, I32, 5, 9, 5), None);
        assert_eq!(apply(CswapGe, I32, 5, 9, 6), Some(9));
        assert_eq!(apply(CswapGt, I32, 5, 9, 5), None);
        assert_eq!(
            apply(Mswap, U8, 0b1111_0000, 0b1010_1010, 0b0000_1111),
            Some(0b1111_1010)
        );
    }

    #[test]
    fn floats_and_complex() {
        assert_eq!(apply(Sum, F64, f64b(1.5), f64b(2.25), 0), Some(f64b(3.75)));
        assert_eq!(apply(Max, F64, f64b(1.5), f64b(2.25), 0), Some(f64b(2.25)));
        assert_eq!(
            apply(
                Min,
                F32,
                u64::from(1.0f32.to_bits()),
                u64::from(2.0f32.to_bits()),
                0
            ),
            None
        );
        let c = |re: f32, im: f32| u64::from(re.to_bits()) | u64::from(im.to_bits()) << 32;
        assert_eq!(
            apply(Prod, C32, c(1.0, 2.0), c(3.0, 4.0), 0),
            Some(c(-5.0, 10.0))
        );
        assert_eq!(
            apply(Sum, C32, c(1.0, 2.0), c(3.0, 4.0), 0),
            Some(c(4.0, 6.0))
        );
    }

    #[test]
    fn validity_is_what_apply_does() {
        for op in (0..19).filter_map(AtomicOp::from_u32) {
            for dt in (0..11).filter_map(Datatype::from_u32) {
                let any = [AtomicCall::Write, AtomicCall::Fetch, AtomicCall::Compare]
                    .iter()
                    .any(|&call| valid(call, op, dt).is_some());
                if any && op != Read {
                    // Every supported pair computes something.
                    let one = match dt {
                        F32 => u64::from(1.0f32.to_bits()),
                        F64 => f64b(1.0),
                        C32 => u64::from(1.0f32.to_bits()),
                        _ => 1,
                    };
                    let _ = apply(op, dt, one, one, one);
                }
            }
        }
        assert_eq!(
            valid(AtomicCall::Write, Sum, U64),
            Some(ATOMIC_MAX_BYTES / 8)
        );
        assert_eq!(valid(AtomicCall::Write, Read, U64), None);
        assert_eq!(valid(AtomicCall::Fetch, Read, U8), Some(ATOMIC_MAX_BYTES));
        assert_eq!(valid(AtomicCall::Compare, Cswap, F64), Some(8));
        assert_eq!(valid(AtomicCall::Write, Bor, F64), None);
        assert_eq!(valid(AtomicCall::Compare, CswapLt, C32), None);
        assert_eq!(AtomicOp::from_u32(19), None);
        assert_eq!(
            Datatype::from_u32(11),
            None,
            "double complex and wider are not supported"
        );
    }

    #[test]
    fn elements_round_trip() {
        let mut bytes = [0u8; 8];
        set_element(&mut bytes, 2, 1, 0xbeef);
        assert_eq!(element(&bytes, 2, 1), 0xbeef);
        assert_eq!(bytes, [0, 0, 0xef, 0xbe, 0, 0, 0, 0]);
    }
}
