//! The provider's messages, each exactly one 192-bit mailbox message.
//!
//! Byte 0 holds the operation in its low nibble and flags in its high one.
//! Every field is little-endian. Optional fields (tag, CQ data) are present
//! only when their flag is set, so a tiny untagged message keeps 22 of the
//! 24 bytes for its payload. An inline message carries only the significant
//! bytes of its tag and CQ data (their counts in one byte, `sizes`): MPI
//! sends a 64-bit tag and its rank as CQ data, and an 8-byte MPI message
//! still fits.
//!
//! # Where each message is declared
//!
//! One file per family of messages: `first_contact.rs`, `inline.rs`
//! (two-sided inline, whole or in parts), `eager.rs`, `rendezvous.rs`,
//! `credits.rs`, `rma.rs` and `atomics.rs`. In its family's file each
//! message has one declaration, a [`Layout`] (its op, the flags that tell
//! it from the op's other messages, its fields in order), its flags as
//! constants of its own (a bit of byte 0 means what that op's messages say
//! it means, nothing more), and beside them its encoder (`put`, through
//! [`crate::codec`]) and its decoder (one function per op, with every
//! check a peer's bytes must pass). The table below is rendered from the
//! declarations (`tests::the_doc_table_is_the_declarations`), and each
//! declaration is checked against its encoder, field by field
//! (`tests::every_encoder_follows_its_layout`): the three cannot drift.
//! The bytes themselves are pinned by `tests/wire_golden.rs`.
//!
//! Why blocks of plain code rather than one declarative macro: the messages
//! are irregular (optional match information, a token split around a
//! length, values checked as they are read, flags that choose a message)
//! and the hottest ones (`Inline`, `Eager`) are written by hand with moves
//! of fixed size; a macro able to say all that would be harder to read than
//! the code it would write.
//!
//! | message | op + flags | fields after byte 0 |
//! |---------|------------|---------------------|
//! | Params | `HELLO` (1) + `PARAMS` (0x10) | version u16, id bits u8, fragment size u32, eager size u32 |
//! | Hello | `HELLO` (1) | slot shift u8, slots u16, node [u8; 12], ring address u64 |
//! | Inline | `INLINE` (2) | len u8, [sizes u8, tag bytes, data bytes], payload (flags `TAGGED`, `DATA`: the significant bytes of tag and CQ data, counted in `sizes`) |
//! | InlineFirst | `INLINE` (2) + `PARTS` (0x80) | total len u8, [sizes u8, tag bytes, data bytes], first payload bytes (all that fit) (flags `TAGGED`, `DATA` as in an `Inline`) |
//! | InlineMore | `INLINE` (2) + `PARTS` (0x80) + `MORE` (0x40) | payload [u8; 23] (the next 23 payload bytes, fewer in the last) |
//! | Eager | `EAGER` (3) | credits u8, len u32 (low 27 bits; high 5: sequence), [tag u64], [data u64], [.., send id u16 at 22] (flags `TAGGED`, `DATA`: tag, CQ data; `ACK`: the send id) |
//! | Rts | `RTS` (4) | credits u8, send id u16, len u32, [tag u64], [data u64] (flags `TAGGED`, `DATA`: tag, CQ data) |
//! | Grant | `GRANT` (5) | token low u8, send id u16, fragment u32, address u64, len u24 + token high u8, recv id u16, recv generation u16 |
//! | FragDone | `FRAGDONE` (6) | pad u8, send id u16, fragment u32, recv id u16, recv generation u16 |
//! | Fin | `FIN` (7) | pad u8, send id u16 |
//! | LenHigh | `FIN` (7) + `LEN_HIGH` (0x20) | pad u8, id u16, high u32 (flag `LEN_HIGH_READ`: the id is a recv id) |
//! | Offer | `FIN` (7) + `OFFER` (0x40) | pad u8, send id u16, token u16, address u64 |
//! | Credit | `CREDIT` (8) | credits u8 |
//! | Throttle | `CREDIT` (8) + `THROTTLE` (0x10) | on u8 (0 or 1) |
//! | Cut | `CREDIT` (8) + `CUT` (0x20) | mark u64 (the 8 bytes `CUT_MARK`, and no other flag) |
//! | RmaWrite | `RMA_WRITE` (9) | key u64, address u64, len u32, send id u16 |
//! | RmaRead | `RMA_READ` (10) | key u64, address u64, len u32, recv id u16 |
//! | ReadReady | `READ_READY` (11) | send id u16, recv id u16 |
//! | RmaNack | `RMA_NACK` (12) | id u16, error u8 (flag `NACK_READ`: the id is a recv id) |
//! | RemoteData | `REMOTE_DATA` (13) | data u64, len u64 |
//! | RemoteNotice | `REMOTE_DATA` (13) + `NOTICE` (0x10) | key u64, reads u32, writes u32, updates u32 (never all 0) |
//! | AtomicReq | `ATOMIC` (14) | key u64, address u64, op u8, datatype u8, count u8, id u16 (flag `FETCH`: the old values are wanted) |
//! | AtomicData | `ATOMIC` (14) + `CHUNK` (0x10) | id u16, len u8, bytes [u8; len] (len <= 20) |
//! | AtomicReply | `ATOMIC_ANSWER` (15) | id u16, status u8 (0, or an `RmaRefusal`) |
//! | AtomicResult | `ATOMIC_ANSWER` (15) + `CHUNK` (0x10) | id u16, len u8, bytes [u8; len] (len <= 20) |
//!
//! A message a little too long for one mailbox message (MPICH's
//! active-message headers are 72 bytes) goes as an `InlineFirst` and up
//! to [`MAX_INLINE_PARTS`]` - 1` `InlineMore`, back to back in the
//! sender's queue: one sender's messages arrive in order, so the parts need
//! no numbers, and several mailbox messages in a row cost less than a DMA
//! and its announcement (on the modeled board, about one mailbox latency
//! instead of two).
//!
//! An eager message that asks to be acknowledged (flag `ACK`, for a send
//! with `FI_MATCH_COMPLETE` or `FI_DELIVERY_COMPLETE`) carries its send id
//! in the last two bytes, 22 and 23, which its longest layout (tag and
//! data) leaves free; the receiver answers with a `Fin` for that id once
//! it has matched the message or queued it as unexpected. Without the
//! flag those bytes stay zero: the message is byte for byte what it was
//! before acknowledgements existed.
//!
//! Eager data sits in the next slot of the receiver's ring for this sender,
//! so it needs no address: the mailbox keeps each sender's messages in order.
//! Each announcement still names its slot by a sequence number (the count
//! of eager messages to that receiver, modulo [`EAGER_SEQ_MOD`], in the 5
//! high bits of its length field): a stray announcement does not shift the
//! ring, its receiver drops it.
//!
//! First contact: every endpoint's first two messages to a peer are
//! `Params` (the protocol version and what the wire depends on) then
//! `Hello` (its node and the eager ring it set aside). A peer whose
//! parameters cannot be adapted to is refused (see `messenger/peers.rs`).
//! A rendezvous message moves in *fragments*, one DMA each: a Grant says
//! where fragment `n` goes, a FragDone that it is there.
//!
//! A rendezvous send whose buffer is dmable and contiguous is preceded by
//! an `Offer` of its buffer (address and grant token): a receiver of the
//! same host that matches it while it polls, and so waits, reads the
//! message itself and ends with the `Fin`, no grant sent; one that matches
//! it later, whose progress agent does, or whose loads do not reach the
//! sender (another host), grants as above, and the sender, then the one
//! waiting, puts.
//!
//! Lengths are 64-bit; a message that starts a transfer (`Rts`, `RmaWrite`,
//! `RmaRead`) has room for the low 32 bits only, so a transfer of 4 GiB or
//! more is preceded, in the same queue, by a `LenHigh` naming it (by send
//! id, or recv id for a read) with the high 32 bits.
//!
//! RMA to a target range that is not dmable needs the target's help, and
//! reuses the rendezvous: an `RmaWrite` stands for a request to send that
//! the target matches to the range its key names (it grants, the initiator
//! puts, the target's Fin completes the write); an `RmaRead` makes the
//! target the sender of that range to the initiator, which names its
//! transfer (recv id) and learns the target's send id from `ReadReady`.
//! `RmaNack` refuses either (bad key, range or rights); `RemoteData`
//! delivers the CQ data of a write with data once the write is done.
//!
//! An atomic operation on target memory that is not dmable is carried out
//! by the target's progress: an `AtomicReq` names it, `AtomicData` chunks
//! carry its operands (then its compare operands) in order, and the target
//! answers with `AtomicResult` chunks (the old values, if asked for) and
//! an `AtomicReply`. One sender's messages arrive in order, so chunks need
//! no sequence numbers.

mod atomics;
mod credits;
mod eager;
mod first_contact;
mod inline;
mod rendezvous;
mod rma;

pub use atomics::{Chunk, CHUNK_LEN};
pub use eager::{EagerView, EAGER_SEQ_MOD, MAX_EAGER_LEN};
pub use first_contact::{ID_BITS, NODE_LEN, PROTOCOL_VERSION};
pub use inline::{
    inline_capacity, InlineBytes, INLINE_MAX, MAX_INLINE_PARTS, MAX_PARTED_LEN, MORE_LEN,
};
pub use rendezvous::MAX_FRAGMENT_LEN;
pub use rma::RmaRefusal;

use unimem_mailbox::{Message, MESSAGE_LEN};

use crate::codec::{ArrayWriter, Put, Reader};
use crate::AccessCounts;

/// One message's declaration, as the table of the module doc shows it.
#[derive(Debug)]
pub struct Layout {
    pub name: &'static str,
    /// Its op (byte 0's low nibble), by name and value.
    pub op: (&'static str, u8),
    /// The flags that make the op's byte this message (all of them set).
    pub flags: &'static [(&'static str, u8)],
    /// Its fields after byte 0, in order: name and type each (`u24`: three
    /// bytes; `+`: parts of one field), in brackets those only some of its
    /// flags bring.
    pub fields: &'static str,
    /// Its optional flags, and anything else worth a word.
    pub note: &'static str,
}

/// Every message's declaration, family by family.
pub const LAYOUTS: [&[Layout]; 7] = [
    first_contact::LAYOUTS,
    inline::LAYOUTS,
    eager::LAYOUTS,
    rendezvous::LAYOUTS,
    credits::LAYOUTS,
    rma::LAYOUTS,
    atomics::LAYOUTS,
];

/// The ops, byte 0's low nibble (0 is none).
mod op {
    pub const HELLO: u8 = 1;
    pub const INLINE: u8 = 2;
    pub const EAGER: u8 = 3;
    pub const RTS: u8 = 4;
    pub const GRANT: u8 = 5;
    pub const FRAGDONE: u8 = 6;
    pub const FIN: u8 = 7;
    pub const CREDIT: u8 = 8;
    pub const RMA_WRITE: u8 = 9;
    pub const RMA_READ: u8 = 10;
    pub const READ_READY: u8 = 11;
    pub const RMA_NACK: u8 = 12;
    pub const REMOTE_DATA: u8 = 13;
    pub const ATOMIC: u8 = 14;
    pub const ATOMIC_ANSWER: u8 = 15;
}

/// Flag of the messages that carry match information (`Inline`,
/// `InlineFirst`, `Eager`, `Rts`): a tag is there.
const TAGGED: u8 = 0x10;
/// Flag of the same messages: CQ data is there.
const DATA: u8 = 0x20;

/// Matching information carried by every message that starts a receive.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MatchInfo {
    pub tag: Option<u64>,
    pub data: Option<u64>,
}

/// The flags of a message's first byte that say which of tag and CQ data
/// it carries.
#[inline]
fn info_flags(info: &MatchInfo) -> u8 {
    (if info.tag.is_some() { TAGGED } else { 0 }) | if info.data.is_some() { DATA } else { 0 }
}

/// Writes the tag and CQ data that are there, whole (`Eager`, `Rts`).
#[inline]
fn put_info<W: Put>(w: &mut W, info: &MatchInfo) {
    if let Some(tag) = info.tag {
        w.put_u64(tag);
    }
    if let Some(data) = info.data {
        w.put_u64(data);
    }
}

/// Reads the tag and CQ data that `flags` say are there.
#[inline]
fn read_info(r: &mut Reader, flags: u8) -> Option<MatchInfo> {
    Some(MatchInfo {
        tag: if flags & TAGGED != 0 {
            Some(r.u64()?)
        } else {
            None
        },
        data: if flags & DATA != 0 {
            Some(r.u64()?)
        } else {
            None
        },
    })
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Wire {
    /// First message to a peer, before the Hello: the protocol version and
    /// the parameters the wire depends on.
    Params {
        version: u16,
        id_bits: u8,
        fragment_size: u32,
        eager_size: u32,
    },
    /// Second message to a peer: where our eager ring for it lies.
    Hello {
        node: [u8; NODE_LEN],
        ring: u64,
        slot_shift: u8,
        slots: u16,
    },
    /// A whole message inside the mailbox message.
    Inline {
        info: MatchInfo,
        payload: InlineBytes,
    },
    /// The first part of a message of `len` bytes sent in parts: its match
    /// information and its first bytes (as many as fit, fewer than `len`).
    InlineFirst {
        info: MatchInfo,
        len: u8,
        payload: InlineBytes,
    },
    /// The next bytes of the message an `InlineFirst` started (the
    /// receiver takes as many as the message still lacks).
    InlineMore { payload: [u8; MORE_LEN] },
    /// A message whose data was put into the next eager slot, the `seq`th
    /// (modulo [`EAGER_SEQ_MOD`]) eager message to this receiver. With
    /// `ack`, the sender waits for a `Fin { send_id: ack }` once the
    /// message is matched or queued as unexpected.
    Eager {
        info: MatchInfo,
        /// At most [`MAX_EAGER_LEN`].
        len: u32,
        seq: u8,
        credits: u8,
        ack: Option<u16>,
    },
    /// Request to send a large message.
    Rts {
        info: MatchInfo,
        send_id: u16,
        len: u32,
        credits: u8,
    },
    /// Receiver to sender: put fragment `fragment` of `send_id` at `addr`.
    Grant {
        send_id: u16,
        fragment: u32,
        addr: u64,
        len: u32,
        recv_id: u16,
        /// The generation of `recv_id`: the report names it too.
        recv_gen: u16,
        /// The receiver's grant token of the range (`DmaEngine::grant_token`):
        /// a put into it after the receiver freed that memory is refused.
        token: u16,
    },
    /// Sender to receiver: fragment `fragment` is in place.
    FragDone {
        send_id: u16,
        fragment: u32,
        recv_id: u16,
        recv_gen: u16,
    },
    /// Receiver to sender: the large message is delivered.
    Fin { send_id: u16 },
    /// The high 32 bits of the length of the transfer that follows: the
    /// send `id`'s `Rts` or `RmaWrite`, or (with `read`) the read `id`'s
    /// `RmaRead`.
    LenHigh { id: u16, read: bool, high: u32 },
    /// Sender to receiver, just before send `send_id`'s `Rts`: its data
    /// lies at `addr` (dmable memory of the sender's, contiguous), granted
    /// with `token` (the sender's `DmaEngine::grant_token` of it): the
    /// receiver may get it instead of granting.
    Offer { send_id: u16, token: u16, addr: u64 },
    /// Eager slots handed back.
    Credit { credits: u8 },
    /// The receiver holds too much of our unexpected data (`on`), or no
    /// longer: while on, our messages go by rendezvous, their data staying
    /// with us until a receive matches.
    Throttle { on: bool },
    /// The sender has cut the receiver off (fenced it for invalid
    /// messages): it drops the receiver's messages, so the receiver's
    /// operations with it can only fail.
    Cut,
    /// Initiator to target: write `len` bytes at `addr` of `key` (a range
    /// that is not dmable); the target grants them to `send_id`.
    RmaWrite {
        key: u64,
        addr: u64,
        len: u32,
        send_id: u16,
    },
    /// Initiator to target: read `len` bytes at `addr` of `key` into the
    /// initiator's transfer `recv_id`.
    RmaRead {
        key: u64,
        addr: u64,
        len: u32,
        recv_id: u16,
    },
    /// Target to initiator: the read `recv_id` is served by send `send_id`.
    ReadReady { send_id: u16, recv_id: u16 },
    /// Target to initiator: the write `id` (a send id) or read `id` (a recv
    /// id, with `read`) is refused for `error`.
    RmaNack {
        id: u16,
        read: bool,
        error: RmaRefusal,
    },
    /// Initiator to target: a write with CQ data `data` of `len` bytes is
    /// complete.
    RemoteData { data: u64, len: u64 },
    /// Initiator to target: one-sided accesses to the target's `key`, which
    /// counts them, are complete: `reads` that only read, `writes` that
    /// only wrote, `updates` that did both (atomics that fetched); never
    /// all 0. Back-to-back notices of one key are summed before they leave.
    RemoteNotice(AccessCounts),
    /// Initiator to target: apply atomic `op` on `count` elements of
    /// `datatype` at `addr` of `key`; its operands follow as `AtomicData`.
    /// With `fetch`, the target returns the old values.
    AtomicReq {
        key: u64,
        addr: u64,
        op: u8,
        datatype: u8,
        count: u8,
        id: u16,
        fetch: bool,
    },
    /// Initiator to target: the next operand bytes of atomic `id`.
    AtomicData { id: u16, bytes: Chunk },
    /// Target to initiator: the next old-value bytes of atomic `id`.
    AtomicResult { id: u16, bytes: Chunk },
    /// Target to initiator: atomic `id` is done (`None`) or refused.
    AtomicReply {
        id: u16,
        refusal: Option<RmaRefusal>,
    },
}

impl Wire {
    /// `Wire::Eager { .. }.encode()`, for the send path: without building
    /// the enum and going through the match of every kind of message.
    #[inline]
    pub fn encode_eager(
        info: &MatchInfo,
        len: u32,
        seq: u8,
        credits: u8,
        ack: Option<u16>,
    ) -> Message {
        eager::encode(info, len, seq, credits, ack)
    }

    /// `Wire::Inline { .. }.encode()`, for the send path (as
    /// [`Self::encode_eager`]), whose caller has checked that `payload`
    /// fits [`inline_capacity`] (else the message cuts it short).
    #[inline]
    pub fn encode_inline(info: &MatchInfo, payload: &InlineBytes) -> Message {
        inline::encode_checked(info, payload)
    }

    /// `Wire::InlineFirst { .. }.encode()` and `Wire::InlineMore { .. }
    /// .encode()`, for the send path (as [`Self::encode_eager`]).
    #[inline]
    pub fn encode_inline_first(info: &MatchInfo, len: u8, payload: &InlineBytes) -> Message {
        inline::encode_first(info, len, payload)
    }

    /// See [`Self::encode_inline_first`].
    #[inline]
    pub fn encode_inline_more(payload: &[u8; MORE_LEN]) -> Message {
        inline::encode_more(payload)
    }

    /// Encodes into one mailbox message. An inline payload must fit
    /// [`inline_capacity`].
    pub fn encode(&self) -> Message {
        match self {
            // The data path: written by hand, with moves of fixed size.
            Wire::Inline { info, payload } => inline::encode_whole(info, payload),
            Wire::InlineFirst { info, len, payload } => inline::encode_first(info, *len, payload),
            Wire::Eager {
                info,
                len,
                seq,
                credits,
                ack,
            } => eager::encode(info, *len, *seq, *credits, *ack),
            _ => {
                let mut w = ArrayWriter::<MESSAGE_LEN>::new();
                self.put(&mut w);
                w.finish()
            }
        }
    }

    /// Writes a message of every kind but those `encode` writes by hand:
    /// byte 0 (op and flags), then its fields in order.
    #[inline]
    fn put<W: Put>(&self, w: &mut W) {
        match self {
            Wire::Params { .. } | Wire::Hello { .. } => first_contact::put(self, w),
            Wire::InlineMore { payload } => inline::put_more(payload, w),
            Wire::Rts { .. }
            | Wire::Grant { .. }
            | Wire::FragDone { .. }
            | Wire::Fin { .. }
            | Wire::LenHigh { .. }
            | Wire::Offer { .. } => rendezvous::put(self, w),
            Wire::Credit { .. } | Wire::Throttle { .. } | Wire::Cut => credits::put(self, w),
            Wire::RmaWrite { .. }
            | Wire::RmaRead { .. }
            | Wire::ReadReady { .. }
            | Wire::RmaNack { .. }
            | Wire::RemoteData { .. }
            | Wire::RemoteNotice(_) => rma::put(self, w),
            Wire::AtomicReq { .. }
            | Wire::AtomicData { .. }
            | Wire::AtomicResult { .. }
            | Wire::AtomicReply { .. } => atomics::put(self, w),
            Wire::Inline { .. } | Wire::InlineFirst { .. } | Wire::Eager { .. } => {
                unreachable!("written by Wire::encode")
            }
        }
    }

    /// Decodes a mailbox message; `None` for anything malformed. Each op's
    /// decoder tells its messages apart by their flags. The decoders (and
    /// the encoders `put` calls) are `#[inline]`: in one function, where
    /// the message's length is known, the reader's bounds checks fold away
    /// (callgrind: fewer instructions than before the split for most kinds,
    /// four more for an `Inline`, which whole ones skip: `inline_view`).
    pub fn decode(buf: &Message) -> Option<Wire> {
        let flags = buf[0] & 0xf0;
        let r = &mut Reader::new(&buf[1..]);
        match buf[0] & 0x0f {
            op::HELLO => first_contact::decode(flags, r),
            op::INLINE => inline::decode(buf, flags),
            op::EAGER => eager::decode(buf, flags),
            op::RTS => rendezvous::decode_rts(flags, r),
            op::GRANT => rendezvous::decode_grant(r),
            op::FRAGDONE => rendezvous::decode_frag_done(r),
            op::FIN => rendezvous::decode_fin(flags, r),
            op::CREDIT => credits::decode(flags, r),
            op::RMA_WRITE => rma::decode_write(r),
            op::RMA_READ => rma::decode_read(r),
            op::READ_READY => rma::decode_read_ready(r),
            op::RMA_NACK => rma::decode_nack(flags, r),
            op::REMOTE_DATA => rma::decode_remote_data(flags, r),
            op::ATOMIC => atomics::decode_request(flags, r),
            op::ATOMIC_ANSWER => atomics::decode_answer(flags, r),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
