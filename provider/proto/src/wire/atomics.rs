//! Atomics the target carries out (on memory that is not dmable): the
//! request (`AtomicReq`) and its operands in chunks (`AtomicData`), both of
//! the `ATOMIC` op; the old values in chunks (`AtomicResult`) and the end
//! (`AtomicReply`), both of the `ATOMIC_ANSWER` op.

use super::{op, Layout, RmaRefusal, Wire};
use crate::codec::{Put, Reader};

/// On the `ATOMIC` op: the request wants the old values back.
const FETCH: u8 = 0x40;
/// On the `ATOMIC` and `ATOMIC_ANSWER` ops: the message is a chunk
/// (`AtomicData`, `AtomicResult`).
const CHUNK: u8 = 0x10;

pub(super) const LAYOUTS: &[Layout] = &[
    Layout {
        name: "AtomicReq",
        op: ("ATOMIC", op::ATOMIC),
        flags: &[],
        fields: "key u64, address u64, op u8, datatype u8, count u8, id u16",
        note: "flag `FETCH`: the old values are wanted",
    },
    Layout {
        name: "AtomicData",
        op: ("ATOMIC", op::ATOMIC),
        flags: &[("CHUNK", CHUNK)],
        fields: "id u16, len u8, bytes [u8; len]",
        note: "len <= 20",
    },
    Layout {
        name: "AtomicReply",
        op: ("ATOMIC_ANSWER", op::ATOMIC_ANSWER),
        flags: &[],
        fields: "id u16, status u8",
        note: "0, or an `RmaRefusal`",
    },
    Layout {
        name: "AtomicResult",
        op: ("ATOMIC_ANSWER", op::ATOMIC_ANSWER),
        flags: &[("CHUNK", CHUNK)],
        fields: "id u16, len u8, bytes [u8; len]",
        note: "len <= 20",
    },
];

/// Bytes one atomic chunk carries at most.
pub const CHUNK_LEN: usize = 20;

/// Up to [`CHUNK_LEN`] bytes, kept by value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Chunk {
    len: u8,
    bytes: [u8; CHUNK_LEN],
}

impl Chunk {
    /// `data` must hold at most [`CHUNK_LEN`] bytes.
    pub fn new(data: &[u8]) -> Chunk {
        let mut bytes = [0u8; CHUNK_LEN];
        bytes[..data.len()].copy_from_slice(data);
        Chunk {
            len: data.len() as u8,
            bytes,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

#[inline]
pub(super) fn put<W: Put>(message: &Wire, w: &mut W) {
    match message {
        Wire::AtomicReq {
            key,
            addr,
            op,
            datatype,
            count,
            id,
            fetch,
        } => {
            let fetch = if *fetch { FETCH } else { 0 };
            w.put_u8(op::ATOMIC | fetch)
                .put_u64(*key)
                .put_u64(*addr)
                .put_u8(*op)
                .put_u8(*datatype)
                .put_u8(*count)
                .put_u16(*id);
        }
        Wire::AtomicData { id, bytes } => put_chunk(w, op::ATOMIC, *id, bytes),
        Wire::AtomicResult { id, bytes } => put_chunk(w, op::ATOMIC_ANSWER, *id, bytes),
        Wire::AtomicReply { id, refusal } => {
            w.put_u8(op::ATOMIC_ANSWER)
                .put_u16(*id)
                .put_u8(refusal.map_or(0, |r| r as u8));
        }
        _ => unreachable!("not an atomic message"),
    }
}

#[inline]
fn put_chunk<W: Put>(w: &mut W, op: u8, id: u16, bytes: &Chunk) {
    w.put_u8(op | CHUNK)
        .put_u16(id)
        .put_u8(bytes.len)
        .put(bytes.as_slice());
}

/// The chunk after a chunk message's op: its id and bytes, no more than
/// [`CHUNK_LEN`].
#[inline]
fn read_chunk(r: &mut Reader) -> Option<(u16, Chunk)> {
    let id = r.u16()?;
    let len = r.u8()? as usize;
    if len > CHUNK_LEN {
        return None;
    }
    Some((id, Chunk::new(r.take(len)?)))
}

/// The `ATOMIC` op: an `AtomicData` (flag `CHUNK`), else an `AtomicReq`.
#[inline]
pub(super) fn decode_request(flags: u8, r: &mut Reader) -> Option<Wire> {
    if flags & CHUNK != 0 {
        let (id, bytes) = read_chunk(r)?;
        return Some(Wire::AtomicData { id, bytes });
    }
    Some(Wire::AtomicReq {
        key: r.u64()?,
        addr: r.u64()?,
        op: r.u8()?,
        datatype: r.u8()?,
        count: r.u8()?,
        id: r.u16()?,
        fetch: flags & FETCH != 0,
    })
}

/// The `ATOMIC_ANSWER` op: an `AtomicResult` (flag `CHUNK`), else an
/// `AtomicReply` (status 0 or an [`RmaRefusal`]).
#[inline]
pub(super) fn decode_answer(flags: u8, r: &mut Reader) -> Option<Wire> {
    if flags & CHUNK != 0 {
        let (id, bytes) = read_chunk(r)?;
        return Some(Wire::AtomicResult { id, bytes });
    }
    let id = r.u16()?;
    let refusal = match r.u8()? {
        0 => None,
        code => Some(RmaRefusal::from_u8(code)?),
    };
    Some(Wire::AtomicReply { id, refusal })
}

#[cfg(test)]
mod tests {
    use unimem_mailbox::MESSAGE_LEN;

    use super::*;

    #[test]
    fn a_chunk_fits_its_message() {
        let mut chunk = [0u8; MESSAGE_LEN];
        chunk[0] = op::ATOMIC | CHUNK;
        chunk[3] = CHUNK_LEN as u8 + 1;
        assert_eq!(
            Wire::decode(&chunk),
            None,
            "a chunk longer than a message holds"
        );
    }
}
