//! One-sided operations the target helps with, and their notices: a
//! write or read of a range that is not dmable (`RmaWrite`, `RmaRead`,
//! served through the rendezvous), the target's answers (`ReadReady`,
//! `RmaNack`), a write's CQ data (`RemoteData`) and the notice of
//! one-sided accesses to a counted key (`RemoteNotice`).

use super::{op, Layout, Wire};
use crate::codec::{Put, Reader};
use crate::AccessCounts;

/// On the `RMA_NACK` op: the refused id is a recv id (of a read).
const NACK_READ: u8 = 0x10;
/// On the `REMOTE_DATA` op: the message is a `RemoteNotice`.
const NOTICE: u8 = 0x10;

pub(super) const LAYOUTS: &[Layout] = &[
    Layout {
        name: "RmaWrite",
        op: ("RMA_WRITE", op::RMA_WRITE),
        flags: &[],
        fields: "key u64, address u64, len u32, send id u16",
        note: "",
    },
    Layout {
        name: "RmaRead",
        op: ("RMA_READ", op::RMA_READ),
        flags: &[],
        fields: "key u64, address u64, len u32, recv id u16",
        note: "",
    },
    Layout {
        name: "ReadReady",
        op: ("READ_READY", op::READ_READY),
        flags: &[],
        fields: "send id u16, recv id u16",
        note: "",
    },
    Layout {
        name: "RmaNack",
        op: ("RMA_NACK", op::RMA_NACK),
        flags: &[],
        fields: "id u16, error u8",
        note: "flag `NACK_READ`: the id is a recv id",
    },
    Layout {
        name: "RemoteData",
        op: ("REMOTE_DATA", op::REMOTE_DATA),
        flags: &[],
        fields: "data u64, len u64",
        note: "",
    },
    Layout {
        name: "RemoteNotice",
        op: ("REMOTE_DATA", op::REMOTE_DATA),
        flags: &[("NOTICE", NOTICE)],
        fields: "key u64, reads u32, writes u32, updates u32",
        note: "never all 0",
    },
];

/// Why a target refused an RMA operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RmaRefusal {
    /// No such key.
    NoKey = 1,
    /// The key does not grant the access, or the range is outside it.
    Denied = 2,
    /// The target is out of resources (no longer sent: a read waits for
    /// room at the target; still understood).
    Busy = 3,
    /// The request is malformed or unsupported (an atomic operation the
    /// target does not have, an element not aligned to its size).
    Invalid = 4,
}

impl RmaRefusal {
    pub(super) fn from_u8(value: u8) -> Option<RmaRefusal> {
        Some(match value {
            1 => RmaRefusal::NoKey,
            2 => RmaRefusal::Denied,
            3 => RmaRefusal::Busy,
            4 => RmaRefusal::Invalid,
            _ => return None,
        })
    }
}

#[inline]
pub(super) fn put<W: Put>(message: &Wire, w: &mut W) {
    match message {
        Wire::RmaWrite {
            key,
            addr,
            len,
            send_id,
        } => {
            w.put_u8(op::RMA_WRITE)
                .put_u64(*key)
                .put_u64(*addr)
                .put_u32(*len)
                .put_u16(*send_id);
        }
        Wire::RmaRead {
            key,
            addr,
            len,
            recv_id,
        } => {
            w.put_u8(op::RMA_READ)
                .put_u64(*key)
                .put_u64(*addr)
                .put_u32(*len)
                .put_u16(*recv_id);
        }
        Wire::ReadReady { send_id, recv_id } => {
            w.put_u8(op::READ_READY).put_u16(*send_id).put_u16(*recv_id);
        }
        Wire::RmaNack { id, read, error } => {
            let read = if *read { NACK_READ } else { 0 };
            w.put_u8(op::RMA_NACK | read)
                .put_u16(*id)
                .put_u8(*error as u8);
        }
        Wire::RemoteData { data, len } => {
            w.put_u8(op::REMOTE_DATA).put_u64(*data).put_u64(*len);
        }
        Wire::RemoteNotice(counts) => {
            w.put_u8(op::REMOTE_DATA | NOTICE)
                .put_u64(counts.key)
                .put_u32(counts.reads)
                .put_u32(counts.writes)
                .put_u32(counts.updates);
        }
        _ => unreachable!("not an RMA message"),
    }
}

/// The `RMA_WRITE` op.
#[inline]
pub(super) fn decode_write(r: &mut Reader) -> Option<Wire> {
    Some(Wire::RmaWrite {
        key: r.u64()?,
        addr: r.u64()?,
        len: r.u32()?,
        send_id: r.u16()?,
    })
}

/// The `RMA_READ` op.
#[inline]
pub(super) fn decode_read(r: &mut Reader) -> Option<Wire> {
    Some(Wire::RmaRead {
        key: r.u64()?,
        addr: r.u64()?,
        len: r.u32()?,
        recv_id: r.u16()?,
    })
}

/// The `READ_READY` op.
#[inline]
pub(super) fn decode_read_ready(r: &mut Reader) -> Option<Wire> {
    Some(Wire::ReadReady {
        send_id: r.u16()?,
        recv_id: r.u16()?,
    })
}

/// The `RMA_NACK` op: the refusal must be one of [`RmaRefusal`].
#[inline]
pub(super) fn decode_nack(flags: u8, r: &mut Reader) -> Option<Wire> {
    Some(Wire::RmaNack {
        id: r.u16()?,
        read: flags & NACK_READ != 0,
        error: RmaRefusal::from_u8(r.u8()?)?,
    })
}

/// The `REMOTE_DATA` op: a `RemoteNotice` (flag `NOTICE`; it must count
/// something), else a `RemoteData`.
#[inline]
pub(super) fn decode_remote_data(flags: u8, r: &mut Reader) -> Option<Wire> {
    if flags & NOTICE != 0 {
        let counts = AccessCounts {
            key: r.u64()?,
            reads: r.u32()?,
            writes: r.u32()?,
            updates: r.u32()?,
        };
        if counts.all() == 0 {
            return None;
        }
        return Some(Wire::RemoteNotice(counts));
    }
    Some(Wire::RemoteData {
        data: r.u64()?,
        len: r.u64()?,
    })
}

#[cfg(test)]
mod tests {
    use unimem_mailbox::MESSAGE_LEN;

    use super::*;

    #[test]
    fn a_refusal_needs_a_known_reason() {
        let mut nack = [0u8; MESSAGE_LEN];
        nack[0] = op::RMA_NACK;
        nack[3] = 0;
        assert_eq!(Wire::decode(&nack), None, "a refusal without a reason");
        nack[3] = 5;
        assert_eq!(Wire::decode(&nack), None);
    }
}
