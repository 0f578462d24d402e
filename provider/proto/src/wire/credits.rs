//! Flow control, the `CREDIT` op: eager slots handed back (`Credit`), the
//! receiver's brake on unexpected data (`Throttle`), and the end of a
//! peer fenced for invalid messages (`Cut`).

use super::{op, Layout, Wire};
use crate::codec::{Put, Reader};

/// On the `CREDIT` op: the message is a `Throttle`.
const THROTTLE: u8 = 0x10;
/// On the `CREDIT` op: the message is a `Cut`, whose body is [`CUT_MARK`]
/// (so that stray bytes are not taken for one), and which has no other
/// flag.
const CUT: u8 = 0x20;
const CUT_MARK: u64 = u64::from_le_bytes(*b"unimCUT!");

pub(super) const LAYOUTS: &[Layout] = &[
    Layout {
        name: "Credit",
        op: ("CREDIT", op::CREDIT),
        flags: &[],
        fields: "credits u8",
        note: "",
    },
    Layout {
        name: "Throttle",
        op: ("CREDIT", op::CREDIT),
        flags: &[("THROTTLE", THROTTLE)],
        fields: "on u8",
        note: "0 or 1",
    },
    Layout {
        name: "Cut",
        op: ("CREDIT", op::CREDIT),
        flags: &[("CUT", CUT)],
        fields: "mark u64",
        note: "the 8 bytes `CUT_MARK`, and no other flag",
    },
];

#[inline]
pub(super) fn put<W: Put>(message: &Wire, w: &mut W) {
    match message {
        Wire::Credit { credits } => {
            w.put_u8(op::CREDIT).put_u8(*credits);
        }
        Wire::Throttle { on } => {
            w.put_u8(op::CREDIT | THROTTLE).put_u8(u8::from(*on));
        }
        Wire::Cut => {
            w.put_u8(op::CREDIT | CUT).put_u64(CUT_MARK);
        }
        _ => unreachable!("not a credit message"),
    }
}

/// The `CREDIT` op: a `Cut` (flag `CUT`, and only it), else a `Throttle`
/// (flag `THROTTLE`), else a `Credit`.
#[inline]
pub(super) fn decode(flags: u8, r: &mut Reader) -> Option<Wire> {
    if flags & CUT != 0 {
        return (flags == CUT && r.u64()? == CUT_MARK).then_some(Wire::Cut);
    }
    if flags & THROTTLE != 0 {
        return match r.u8()? {
            0 => Some(Wire::Throttle { on: false }),
            1 => Some(Wire::Throttle { on: true }),
            _ => None,
        };
    }
    Some(Wire::Credit { credits: r.u8()? })
}
