//! The rendezvous: the request to send (`Rts`), the receiver's grants of
//! its fragments (`Grant`), the sender's reports (`FragDone`), the end
//! (`Fin`), and the two messages that go before a request (`Offer`,
//! `LenHigh`), which share the `FIN` op.

use super::{info_flags, op, put_info, read_info, Layout, Wire};
use crate::codec::{Put, Reader};

/// Longest fragment a `Grant` can name (its length has 24 bits).
pub const MAX_FRAGMENT_LEN: usize = (1 << 24) - 1;

/// On the `FIN` op: the message is a `LenHigh`.
const LEN_HIGH: u8 = 0x20;
/// On a `LenHigh`: its id is a recv id (of a read).
const LEN_HIGH_READ: u8 = 0x10;
/// On the `FIN` op: the message is an `Offer`.
const OFFER: u8 = 0x40;

pub(super) const LAYOUTS: &[Layout] = &[
    Layout {
        name: "Rts",
        op: ("RTS", op::RTS),
        flags: &[],
        fields: "credits u8, send id u16, len u32, [tag u64], [data u64]",
        note: "flags `TAGGED`, `DATA`: tag, CQ data",
    },
    Layout {
        name: "Grant",
        op: ("GRANT", op::GRANT),
        flags: &[],
        fields: "token low u8, send id u16, fragment u32, address u64, len u24 + token high u8, recv id u16, recv generation u16",
        note: "",
    },
    Layout {
        name: "FragDone",
        op: ("FRAGDONE", op::FRAGDONE),
        flags: &[],
        fields: "pad u8, send id u16, fragment u32, recv id u16, recv generation u16",
        note: "",
    },
    Layout {
        name: "Fin",
        op: ("FIN", op::FIN),
        flags: &[],
        fields: "pad u8, send id u16",
        note: "",
    },
    Layout {
        name: "LenHigh",
        op: ("FIN", op::FIN),
        flags: &[("LEN_HIGH", LEN_HIGH)],
        fields: "pad u8, id u16, high u32",
        note: "flag `LEN_HIGH_READ`: the id is a recv id",
    },
    Layout {
        name: "Offer",
        op: ("FIN", op::FIN),
        flags: &[("OFFER", OFFER)],
        fields: "pad u8, send id u16, token u16, address u64",
        note: "",
    },
];

#[inline]
pub(super) fn put<W: Put>(message: &Wire, w: &mut W) {
    match message {
        Wire::Rts {
            info,
            send_id,
            len,
            credits,
        } => {
            w.put_u8(op::RTS | info_flags(info))
                .put_u8(*credits)
                .put_u16(*send_id)
                .put_u32(*len);
            put_info(w, info);
        }
        Wire::Grant {
            send_id,
            fragment,
            addr,
            len,
            recv_id,
            recv_gen,
            token,
        } => {
            debug_assert!(*len as usize <= MAX_FRAGMENT_LEN);
            let [token_low, token_high] = token.to_le_bytes();
            w.put_u8(op::GRANT)
                .put_u8(token_low)
                .put_u16(*send_id)
                .put_u32(*fragment)
                .put_u64(*addr)
                .put_u32((len & MAX_FRAGMENT_LEN as u32) | u32::from(token_high) << 24)
                .put_u16(*recv_id)
                .put_u16(*recv_gen);
        }
        Wire::FragDone {
            send_id,
            fragment,
            recv_id,
            recv_gen,
        } => {
            w.put_u8(op::FRAGDONE)
                .put_u8(0)
                .put_u16(*send_id)
                .put_u32(*fragment)
                .put_u16(*recv_id)
                .put_u16(*recv_gen);
        }
        Wire::Fin { send_id } => {
            w.put_u8(op::FIN).put_u8(0).put_u16(*send_id);
        }
        Wire::LenHigh { id, read, high } => {
            let read = if *read { LEN_HIGH_READ } else { 0 };
            w.put_u8(op::FIN | LEN_HIGH | read)
                .put_u8(0)
                .put_u16(*id)
                .put_u32(*high);
        }
        Wire::Offer {
            send_id,
            token,
            addr,
        } => {
            w.put_u8(op::FIN | OFFER)
                .put_u8(0)
                .put_u16(*send_id)
                .put_u16(*token)
                .put_u64(*addr);
        }
        _ => unreachable!("not a rendezvous message"),
    }
}

/// The `RTS` op.
#[inline]
pub(super) fn decode_rts(flags: u8, r: &mut Reader) -> Option<Wire> {
    let credits = r.u8()?;
    let send_id = r.u16()?;
    let len = r.u32()?;
    Some(Wire::Rts {
        info: read_info(r, flags)?,
        send_id,
        len,
        credits,
    })
}

/// The `GRANT` op.
#[inline]
pub(super) fn decode_grant(r: &mut Reader) -> Option<Wire> {
    let token_low = r.u8()?;
    let (send_id, fragment, addr) = (r.u16()?, r.u32()?, r.u64()?);
    let len_and_token = r.u32()?;
    Some(Wire::Grant {
        send_id,
        fragment,
        addr,
        len: len_and_token & MAX_FRAGMENT_LEN as u32,
        recv_id: r.u16()?,
        recv_gen: r.u16()?,
        token: u16::from_le_bytes([token_low, (len_and_token >> 24) as u8]),
    })
}

/// The `FRAGDONE` op.
#[inline]
pub(super) fn decode_frag_done(r: &mut Reader) -> Option<Wire> {
    r.u8()?;
    Some(Wire::FragDone {
        send_id: r.u16()?,
        fragment: r.u32()?,
        recv_id: r.u16()?,
        recv_gen: r.u16()?,
    })
}

/// The `FIN` op: a `LenHigh` (flag `LEN_HIGH`), else an `Offer` (flag
/// `OFFER`), else a `Fin`.
#[inline]
pub(super) fn decode_fin(flags: u8, r: &mut Reader) -> Option<Wire> {
    r.u8()?;
    Some(if flags & LEN_HIGH != 0 {
        Wire::LenHigh {
            id: r.u16()?,
            read: flags & LEN_HIGH_READ != 0,
            high: r.u32()?,
        }
    } else if flags & OFFER != 0 {
        Wire::Offer {
            send_id: r.u16()?,
            token: r.u16()?,
            addr: r.u64()?,
        }
    } else {
        Wire::Fin { send_id: r.u16()? }
    })
}
