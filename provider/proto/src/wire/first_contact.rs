//! First contact: every endpoint's first two messages to a peer, `Params`
//! then `Hello`, both of the `HELLO` op.

use super::{op, Layout, Wire};
use crate::codec::{Put, Reader};

/// Size of a node identity on the wire.
pub const NODE_LEN: usize = 12;

/// The protocol version a `Params` message carries. Version 1 had no
/// `Params` (a `Hello` came first); 2 added it, and eager sequence numbers;
/// 3 the grant token; 4 counts in a `RemoteNotice`; 5 the `Offer`; 6 the
/// `Cut`.
pub const PROTOCOL_VERSION: u16 = 6;

/// Width of the send and receive ids on the wire, in bits.
pub const ID_BITS: u8 = 16;

/// On the `HELLO` op: the message is a `Params`.
const PARAMS: u8 = 0x10;

pub(super) const LAYOUTS: &[Layout] = &[
    Layout {
        name: "Params",
        op: ("HELLO", op::HELLO),
        flags: &[("PARAMS", PARAMS)],
        fields: "version u16, id bits u8, fragment size u32, eager size u32",
        note: "",
    },
    Layout {
        name: "Hello",
        op: ("HELLO", op::HELLO),
        flags: &[],
        fields: "slot shift u8, slots u16, node [u8; 12], ring address u64",
        note: "",
    },
];

#[inline]
pub(super) fn put<W: Put>(message: &Wire, w: &mut W) {
    match message {
        Wire::Params {
            version,
            id_bits,
            fragment_size,
            eager_size,
        } => {
            w.put_u8(op::HELLO | PARAMS)
                .put_u16(*version)
                .put_u8(*id_bits)
                .put_u32(*fragment_size)
                .put_u32(*eager_size);
        }
        Wire::Hello {
            node,
            ring,
            slot_shift,
            slots,
        } => {
            w.put_u8(op::HELLO)
                .put_u8(*slot_shift)
                .put_u16(*slots)
                .put(node)
                .put_u64(*ring);
        }
        _ => unreachable!("not a first-contact message"),
    }
}

/// The `HELLO` op: a `Params` (flag `PARAMS`) or a `Hello`.
#[inline]
pub(super) fn decode(flags: u8, r: &mut Reader) -> Option<Wire> {
    if flags & PARAMS != 0 {
        return Some(Wire::Params {
            version: r.u16()?,
            id_bits: r.u8()?,
            fragment_size: r.u32()?,
            eager_size: r.u32()?,
        });
    }
    let slot_shift = r.u8()?;
    let slots = r.u16()?;
    let node = r.array()?;
    Some(Wire::Hello {
        node,
        ring: r.u64()?,
        slot_shift,
        slots,
    })
}
