//! The eager announcement (`Eager`, the `EAGER` op): the message's data is
//! in the receiver's next eager slot for this sender. Every eager message
//! that is sent or arrives goes through here.

use unimem_mailbox::{Message, MESSAGE_LEN};

use super::{info_flags, op, read_info, Layout, MatchInfo, Wire};
use crate::codec::Reader;

/// Eager sequence numbers count modulo this.
pub const EAGER_SEQ_MOD: u8 = 32;
/// Bits of an eager announcement's length field that hold the length; the
/// rest hold the sequence number. Eager messages are shorter than this.
const EAGER_LEN_BITS: u32 = 27;
/// Longest eager message the wire can announce.
pub const MAX_EAGER_LEN: usize = (1 << EAGER_LEN_BITS) - 1;

/// On the `EAGER` op: the sender waits for a `Fin` (its send id is in the
/// last two bytes).
const ACK: u8 = 0x40;
/// Where an acknowledged eager message keeps its send id.
const ACK_AT: usize = MESSAGE_LEN - 2;

pub(super) const LAYOUTS: &[Layout] = &[Layout {
    name: "Eager",
    op: ("EAGER", op::EAGER),
    flags: &[],
    fields: "credits u8, len u32 (low 27 bits; high 5: sequence), [tag u64], [data u64], [.., send id u16 at 22]",
    note: "flags `TAGGED`, `DATA`: tag, CQ data; `ACK`: the send id",
}];

/// An `Eager` of `len` bytes (at most [`MAX_EAGER_LEN`]), the `seq`th
/// (modulo [`EAGER_SEQ_MOD`]) to this receiver, giving back `credits`.
#[inline(always)]
pub(super) fn encode(
    info: &MatchInfo,
    len: u32,
    seq: u8,
    credits: u8,
    ack: Option<u16>,
) -> Message {
    debug_assert!(len as usize <= MAX_EAGER_LEN && seq < EAGER_SEQ_MOD);
    let field = len | u32::from(seq) << EAGER_LEN_BITS;
    let flags = info_flags(info) | if ack.is_some() { ACK } else { 0 };
    // Every eager message is encoded here: the message is three words, put
    // together by shifts (header: 6 bytes, then tag and data as there are,
    // then the send id at byte 22), not a writer's checked puts.
    let header = u64::from(op::EAGER | flags) | u64::from(credits) << 8 | u64::from(field) << 16;
    let (first, second) = match (info.tag, info.data) {
        (Some(tag), Some(data)) => (tag, data),
        (Some(value), None) | (None, Some(value)) => (value, 0),
        (None, None) => (0, 0),
    };
    let low = u128::from(header) | u128::from(first) << 48 | u128::from(second) << 112;
    let high = second >> 16 | u64::from(ack.unwrap_or(0)) << 48;
    debug_assert_eq!(ACK_AT, 22);
    let mut buf = [0u8; MESSAGE_LEN];
    buf[..16].copy_from_slice(&low.to_le_bytes());
    buf[16..].copy_from_slice(&high.to_le_bytes());
    buf
}

/// An `Eager`'s fields, read in place ([`Wire::eager_view`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerView {
    pub info: MatchInfo,
    pub len: u32,
    pub seq: u8,
    pub credits: u8,
    pub ack: Option<u16>,
}

/// The `EAGER` op's fields.
#[inline]
fn view(buf: &Message, flags: u8) -> Option<EagerView> {
    let mut r = Reader::new(&buf[1..]);
    let credits = r.u8()?;
    let field = r.u32()?;
    Some(EagerView {
        info: read_info(&mut r, flags)?,
        len: field & ((1 << EAGER_LEN_BITS) - 1),
        seq: (field >> EAGER_LEN_BITS) as u8,
        credits,
        ack: (flags & ACK != 0).then(|| u16::from_le_bytes([buf[ACK_AT], buf[ACK_AT + 1]])),
    })
}

/// The `EAGER` op.
#[inline]
pub(super) fn decode(buf: &Message, flags: u8) -> Option<Wire> {
    let e = view(buf, flags)?;
    Some(Wire::Eager {
        info: e.info,
        len: e.len,
        seq: e.seq,
        credits: e.credits,
        ack: e.ack,
    })
}

impl Wire {
    /// An eager announcement's fields, read in place; `None` for any other
    /// message (the answer of [`Wire::decode`], without building a
    /// `Wire`): the receive path's shortcut for its commonest message
    /// after a whole inline one.
    #[inline]
    pub fn eager_view(buf: &Message) -> Option<EagerView> {
        if buf[0] & 0x0f != op::EAGER {
            return None;
        }
        view(buf, buf[0] & 0xf0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An eager message that asks for no acknowledgement is byte for byte
    /// what it was before acknowledgements existed; one that asks differs
    /// only in the flag and its last two bytes.
    #[test]
    fn eager_acknowledgement_keeps_the_plain_bytes() {
        let info = MatchInfo {
            tag: Some(0x0102_0304_0506_0708),
            data: Some(0x1112_1314_1516_1718),
        };
        let plain = Wire::Eager {
            info,
            len: 0x0a0b,
            seq: 0,
            credits: 2,
            ack: None,
        };
        let mut expected = [0u8; MESSAGE_LEN];
        expected[..22].copy_from_slice(&[
            3 | 0x10 | 0x20,
            2,
            0x0b,
            0x0a,
            0,
            0,
            8,
            7,
            6,
            5,
            4,
            3,
            2,
            1,
            0x18,
            0x17,
            0x16,
            0x15,
            0x14,
            0x13,
            0x12,
            0x11,
        ]);
        assert_eq!(plain.encode(), expected);
        let acked = Wire::Eager {
            info,
            len: 0x0a0b,
            seq: 0,
            credits: 2,
            ack: Some(0x0c0d),
        };
        expected[0] |= 0x40;
        expected[22..].copy_from_slice(&[0x0d, 0x0c]);
        assert_eq!(acked.encode(), expected);
    }

    /// The receive path's shortcut reads an eager announcement as decode
    /// does, and nothing else: every flag combination, fields that differ
    /// from one message to the next, and other ops.
    #[test]
    fn the_eager_view_agrees_with_decode() {
        let mut eager = 0;
        for first in 0..=255u8 {
            for fill in 0..8u8 {
                let mut buf = [0u8; MESSAGE_LEN];
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(53) ^ fill.wrapping_mul(29);
                }
                buf[0] = first;
                let view = Wire::eager_view(&buf);
                match Wire::decode(&buf) {
                    Some(Wire::Eager {
                        info,
                        len,
                        seq,
                        credits,
                        ack,
                    }) => {
                        let fields = EagerView {
                            info,
                            len,
                            seq,
                            credits,
                            ack,
                        };
                        assert_eq!(view, Some(fields), "{buf:?}");
                        eager += 1;
                    }
                    _ => assert_eq!(view, None, "{buf:?}"),
                }
            }
        }
        assert_eq!(eager, 16 * 8, "every flag of the EAGER op");
    }
}
