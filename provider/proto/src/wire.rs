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
//! | op       | layout after byte 0                                            |
//! |----------|----------------------------------------------------------------|
//! | Params   | (a `Hello` op, flag `PARAMS`) version u16, id bits u8, fragment size u32, eager size u32 |
//! | Hello    | slot shift u8, slots u16, node [u8; 12], ring address u64       |
//! | Inline   | len u8, [sizes u8, tag bytes, data bytes], payload              |
//! | InlineFirst | (an `Inline` op, flag `PARTS`) total len u8, [sizes u8, tag bytes, data bytes], first payload bytes (all that fit) |
//! | InlineMore  | (an `Inline` op, flags `PARTS`, `MORE`) the next 23 payload bytes (fewer in the last) |
//! | Eager    | credits u8, len u32 (low 27 bits; high 5: sequence), [tag u64], [data u64], [.., send id u16 at 22] |
//! | Rts      | credits u8, send id u16, len u32, [tag u64], [data u64]         |
//! | Grant    | token low u8, send id u16, fragment u32, address u64, len u24 + token high u8, recv id u16, recv generation u16 |
//! | FragDone | pad u8, send id u16, fragment u32, recv id u16, recv generation u16 |
//! | Fin      | pad u8, send id u16                                             |
//! | LenHigh  | (a `Fin` op, flag `LEN_HIGH`) pad u8, id u16, high u32 (flag `READ`: the id is a recv id) |
//! | Offer    | (a `Fin` op, flag `OFFER`) pad u8, send id u16, token u16, address u64 |
//! | Credit   | credits u8                                                      |
//! | Throttle | (a `Credit` op, flag `THROTTLE`) on u8 (0 or 1)                 |
//! | Cut      | (a `Credit` op, flag `CUT`) the 8 bytes `CUT_MARK`              |
//! | RmaWrite | key u64, address u64, len u32, send id u16                      |
//! | RmaRead  | key u64, address u64, len u32, recv id u16                      |
//! | ReadReady| send id u16, recv id u16                                        |
//! | RmaNack  | id u16, error u8 (flag `READ`: the id is a recv id)             |
//! | RemoteData | data u64, len u64                                             |
//! | RemoteNotice | key u64, reads u32, writes u32, updates u32 (flag `NOTICE`) |
//! | AtomicReq  | key u64, address u64, op u8, datatype u8, count u8, id u16 (flag `FETCH`) |
//! | AtomicData | id u16, len u8, bytes [u8; len <= 20] (flag `CHUNK`)       |
//! | AtomicReply| id u16, status u8                                          |
//! | AtomicResult | id u16, len u8, bytes [u8; len <= 20] (flag `CHUNK`)     |
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

use unimem_mailbox::{Message, MESSAGE_LEN};

use crate::AccessCounts;

/// Size of a node identity on the wire.
pub const NODE_LEN: usize = 12;

/// The protocol version a `Params` message carries. Version 1 had no
/// `Params` (a `Hello` came first); 2 added it, and eager sequence numbers;
/// 3 the grant token; 4 counts in a `RemoteNotice`; 5 the `Offer`; 6 the
/// `Cut`.
pub const PROTOCOL_VERSION: u16 = 6;

/// Most mailbox messages one inline message may take (`InlineFirst` and
/// its `InlineMore`s).
pub const MAX_INLINE_PARTS: usize = 4;
/// Payload bytes of an `InlineMore`.
pub const MORE_LEN: usize = MESSAGE_LEN - 1;
/// Longest message sent in parts: a first part without tag or data, and
/// the rest.
pub const MAX_PARTED_LEN: usize = MESSAGE_LEN - 2 + (MAX_INLINE_PARTS - 1) * MORE_LEN;

/// Longest fragment a `Grant` can name (its length has 24 bits).
pub const MAX_FRAGMENT_LEN: usize = (1 << 24) - 1;

/// Width of the send and receive ids on the wire, in bits.
pub const ID_BITS: u8 = 16;

/// Eager sequence numbers count modulo this.
pub const EAGER_SEQ_MOD: u8 = 32;
/// Bits of an eager announcement's length field that hold the length; the
/// rest hold the sequence number. Eager messages are shorter than this.
const EAGER_LEN_BITS: u32 = 27;
/// Longest eager message the wire can announce.
pub const MAX_EAGER_LEN: usize = (1 << EAGER_LEN_BITS) - 1;

const TAGGED: u8 = 0x10;
const DATA: u8 = 0x20;
/// On an `Inline` op: one part of a message sent in several; with `MORE`,
/// a continuation.
const PARTS: u8 = 0x80;
const MORE: u8 = 0x40;
/// An eager message whose sender waits for a `Fin` (its send id is in the
/// last two bytes).
const ACK: u8 = 0x40;
/// Where an acknowledged eager message keeps its send id.
const ACK_AT: usize = MESSAGE_LEN - 2;

/// Largest inline payload of a message with this tag and CQ data: 22 bytes
/// without either, else 21 less the significant bytes of both (at least 5).
pub fn inline_capacity(info: &MatchInfo) -> usize {
    if info.tag.is_none() && info.data.is_none() {
        return MESSAGE_LEN - 2;
    }
    MESSAGE_LEN - 3 - significant_bytes(info.tag) - significant_bytes(info.data)
}

/// Bytes needed for `value` without its leading zero bytes (0 for none or 0).
fn significant_bytes(value: Option<u64>) -> usize {
    value.map_or(0, |v| (64 - v.leading_zeros() as usize).div_ceil(8))
}

/// Largest inline payload (a message without tag or CQ data).
pub const INLINE_MAX: usize = MESSAGE_LEN - 2;

/// An inline payload, kept by value: decoding a message must not allocate.
/// Only its first `len` bytes mean anything: the rest are whatever the
/// fixed-size moves of the codec left there (zeros, when made by `new`).
#[derive(Clone, Copy)]
pub struct InlineBytes {
    len: u8,
    bytes: [u8; INLINE_MAX],
}

impl InlineBytes {
    /// `data` must fit the largest inline capacity (22 bytes).
    pub fn new(data: &[u8]) -> InlineBytes {
        let mut bytes = [0u8; INLINE_MAX];
        bytes[..data.len()].copy_from_slice(data);
        InlineBytes {
            len: data.len() as u8,
            bytes,
        }
    }

    /// The first `len` bytes of `bytes` (`len` <= 22), the rest zeros.
    /// The caller fills the bytes in place (`bytes_mut`): no second copy.
    pub fn zeroed(len: usize) -> InlineBytes {
        debug_assert!(len <= INLINE_MAX);
        InlineBytes {
            len: len as u8,
            bytes: [0; INLINE_MAX],
        }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8; INLINE_MAX] {
        &mut self.bytes
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl PartialEq for InlineBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for InlineBytes {}

impl std::fmt::Debug for InlineBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InlineBytes({:?})", self.as_slice())
    }
}

/// The `n` low bytes of a u64 (n <= 8).
fn low_bytes(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        u64::MAX >> (64 - 8 * n)
    }
}

/// What an `Inline` message's header says, checked: its matching
/// information, the message's length, and where and how many of its
/// payload bytes this mailbox message holds.
struct InlineFields {
    info: MatchInfo,
    len: usize,
    at: usize,
    take: usize,
}

/// Reads and checks the header of an `Inline` message with `flags` (a peer's
/// bytes: every count is checked before it is used).
#[inline]
fn inline_fields(buf: &Message, flags: u8) -> Option<InlineFields> {
    let len = buf[1] as usize;
    let mut at = 2;
    let mut info = MatchInfo::default();
    if flags & (TAGGED | DATA) != 0 {
        let sizes = buf[2];
        let (tag_len, data_len) = ((sizes & 0x0f) as usize, (sizes >> 4) as usize);
        if tag_len > 8 || data_len > 8 || tag_len + data_len > MESSAGE_LEN - 3 {
            return None;
        }
        at = 3;
        // Fixed-size reads of eight bytes (the data's may pass the
        // message's end: zeros there, masked off anyway).
        let mut line = [0u8; MESSAGE_LEN + 8];
        line[..MESSAGE_LEN].copy_from_slice(buf);
        let word = |at: usize| u64::from_le_bytes(line[at..at + 8].try_into().unwrap());
        let tag = word(at) & low_bytes(tag_len);
        at += tag_len;
        let data = word(at) & low_bytes(data_len);
        at += data_len;
        info.tag = (flags & TAGGED != 0).then_some(tag);
        info.data = (flags & DATA != 0).then_some(data);
    }
    let capacity = inline_capacity(&info);
    let take = if flags & PARTS != 0 {
        // A first part: longer than one message, no longer than its parts
        // can carry; the rest of this one is its first bytes.
        if len <= capacity || len > capacity + (MAX_INLINE_PARTS - 1) * MORE_LEN {
            return None;
        }
        capacity
    } else {
        len
    };
    if take > capacity || at + take > MESSAGE_LEN {
        return None;
    }
    Some(InlineFields {
        info,
        len,
        at,
        take,
    })
}

/// Matching information carried by every message that starts a receive.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MatchInfo {
    pub tag: Option<u64>,
    pub data: Option<u64>,
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
    fn from_u8(value: u8) -> Option<RmaRefusal> {
        Some(match value {
            1 => RmaRefusal::NoKey,
            2 => RmaRefusal::Denied,
            3 => RmaRefusal::Busy,
            4 => RmaRefusal::Invalid,
            _ => return None,
        })
    }
}

/// Flag of a `Hello` op that is a `Params`.
const PARAMS: u8 = 0x10;
/// Flag of an `RmaNack` (and a `LenHigh`) whose id is a recv id.
const READ: u8 = 0x10;
/// Flag of a `Fin` op that is a `LenHigh`.
const LEN_HIGH: u8 = 0x20;
/// Flag of a `Fin` op that is an `Offer`.
const OFFER: u8 = 0x40;
/// Flag of an `AtomicReq` that wants the old values back.
const FETCH: u8 = 0x40;
/// Flag of the chunk forms of the atomic messages.
const CHUNK: u8 = 0x10;
/// On a `Credit` op: a `Throttle`.
const THROTTLE: u8 = 0x10;
/// On a `Credit` op: a `Cut`, whose body is [`CUT_MARK`] (so that stray
/// bytes are not taken for one).
const CUT: u8 = 0x20;
const CUT_MARK: u64 = u64::from_le_bytes(*b"unimCUT!");
/// On a `RemoteData` op: a `RemoteNotice`.
const NOTICE: u8 = 0x10;

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

/// The flags of a message's first byte that say which of tag and CQ data
/// it carries.
fn info_flags(info: &MatchInfo) -> u8 {
    (if info.tag.is_some() { TAGGED } else { 0 }) | if info.data.is_some() { DATA } else { 0 }
}

/// An `Inline` (or with `PARTS`, an `InlineFirst`): op and flags, the
/// length, the tag and CQ data if any (their significant bytes, sized in
/// one byte), then the payload, cut at the message's end. Every small send
/// is encoded here, so it moves whole u64s and the whole payload array into
/// a scratch line, each field overwriting the zero bytes past the last,
/// instead of copies of variable length (a call to memcpy each).
fn encode_inline(parts: u8, len: u8, info: &MatchInfo, payload: &InlineBytes) -> Message {
    let mut line = [0u8; 64];
    line[0] = op::INLINE | parts | info_flags(info);
    line[1] = len;
    let mut at = 2;
    if info.tag.is_some() || info.data.is_some() {
        let tag_len = significant_bytes(info.tag);
        let data_len = significant_bytes(info.data);
        line[2] = (tag_len | data_len << 4) as u8;
        at = 3;
        line[at..at + 8].copy_from_slice(&info.tag.unwrap_or(0).to_le_bytes());
        at += tag_len;
        line[at..at + 8].copy_from_slice(&info.data.unwrap_or(0).to_le_bytes());
        at += data_len;
    }
    line[at..at + INLINE_MAX].copy_from_slice(&payload.bytes);
    line[..MESSAGE_LEN].try_into().unwrap()
}

/// A cursor writing fields into one message.
struct Writer {
    buf: Message,
    at: usize,
}

impl Writer {
    fn new(op: u8, info: Option<&MatchInfo>) -> Writer {
        let mut buf = [0u8; MESSAGE_LEN];
        buf[0] = op | info.map_or(0, info_flags);
        Writer { buf, at: 1 }
    }

    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
        self
    }

    fn info(&mut self, info: &MatchInfo) -> &mut Self {
        if let Some(tag) = info.tag {
            self.put(&tag.to_le_bytes());
        }
        if let Some(data) = info.data {
            self.put(&data.to_le_bytes());
        }
        self
    }
}

struct Reader<'a> {
    buf: &'a Message,
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let out = self.buf[self.at..self.at + N].try_into().unwrap();
        self.at += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn info(&mut self, flags: u8) -> MatchInfo {
        MatchInfo {
            tag: (flags & TAGGED != 0).then(|| self.u64()),
            data: (flags & DATA != 0).then(|| self.u64()),
        }
    }
}

impl Wire {
    /// Encodes into one mailbox message. An inline payload must fit
    /// [`inline_capacity`].
    pub fn encode(&self) -> Message {
        let mut w;
        match self {
            Wire::Params {
                version,
                id_bits,
                fragment_size,
                eager_size,
            } => {
                w = Writer::new(op::HELLO, None);
                w.buf[0] |= PARAMS;
                w.put(&version.to_le_bytes())
                    .put(&[*id_bits])
                    .put(&fragment_size.to_le_bytes())
                    .put(&eager_size.to_le_bytes());
            }
            Wire::Hello {
                node,
                ring,
                slot_shift,
                slots,
            } => {
                w = Writer::new(op::HELLO, None);
                w.put(&[*slot_shift])
                    .put(&slots.to_le_bytes())
                    .put(node)
                    .put(&ring.to_le_bytes());
            }
            Wire::Inline { info, payload } => {
                assert!(payload.len as usize <= inline_capacity(info));
                return encode_inline(0, payload.len, info, payload);
            }
            Wire::InlineFirst { info, len, payload } => {
                assert!(payload.len as usize == inline_capacity(info) && payload.len < *len);
                return encode_inline(PARTS, *len, info, payload);
            }
            Wire::InlineMore { payload } => {
                w = Writer::new(op::INLINE, None);
                w.buf[0] |= PARTS | MORE;
                w.put(payload);
            }
            Wire::Eager {
                info,
                len,
                seq,
                credits,
                ack,
            } => {
                debug_assert!(*len as usize <= MAX_EAGER_LEN && *seq < EAGER_SEQ_MOD);
                let field = len | u32::from(*seq) << EAGER_LEN_BITS;
                w = Writer::new(op::EAGER, Some(info));
                w.put(&[*credits]).put(&field.to_le_bytes()).info(info);
                if let Some(send_id) = ack {
                    // The longest layout ends at byte 22 (see the module doc).
                    debug_assert!(w.at <= ACK_AT);
                    w.buf[0] |= ACK;
                    w.buf[ACK_AT..].copy_from_slice(&send_id.to_le_bytes());
                }
            }
            Wire::Rts {
                info,
                send_id,
                len,
                credits,
            } => {
                w = Writer::new(op::RTS, Some(info));
                w.put(&[*credits])
                    .put(&send_id.to_le_bytes())
                    .put(&len.to_le_bytes())
                    .info(info);
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
                w = Writer::new(op::GRANT, None);
                w.put(&[token_low])
                    .put(&send_id.to_le_bytes())
                    .put(&fragment.to_le_bytes())
                    .put(&addr.to_le_bytes())
                    .put(
                        &((len & MAX_FRAGMENT_LEN as u32) | u32::from(token_high) << 24)
                            .to_le_bytes(),
                    )
                    .put(&recv_id.to_le_bytes())
                    .put(&recv_gen.to_le_bytes());
            }
            Wire::FragDone {
                send_id,
                fragment,
                recv_id,
                recv_gen,
            } => {
                w = Writer::new(op::FRAGDONE, None);
                w.put(&[0])
                    .put(&send_id.to_le_bytes())
                    .put(&fragment.to_le_bytes())
                    .put(&recv_id.to_le_bytes())
                    .put(&recv_gen.to_le_bytes());
            }
            Wire::Fin { send_id } => {
                w = Writer::new(op::FIN, None);
                w.put(&[0]).put(&send_id.to_le_bytes());
            }
            Wire::LenHigh { id, read, high } => {
                w = Writer::new(op::FIN, None);
                w.buf[0] |= LEN_HIGH | if *read { READ } else { 0 };
                w.put(&[0]).put(&id.to_le_bytes()).put(&high.to_le_bytes());
            }
            Wire::Offer {
                send_id,
                token,
                addr,
            } => {
                w = Writer::new(op::FIN, None);
                w.buf[0] |= OFFER;
                w.put(&[0])
                    .put(&send_id.to_le_bytes())
                    .put(&token.to_le_bytes())
                    .put(&addr.to_le_bytes());
            }
            Wire::Credit { credits } => {
                w = Writer::new(op::CREDIT, None);
                w.put(&[*credits]);
            }
            Wire::Throttle { on } => {
                w = Writer::new(op::CREDIT, None);
                w.buf[0] |= THROTTLE;
                w.put(&[u8::from(*on)]);
            }
            Wire::Cut => {
                w = Writer::new(op::CREDIT, None);
                w.buf[0] |= CUT;
                w.put(&CUT_MARK.to_le_bytes());
            }
            Wire::RmaWrite {
                key,
                addr,
                len,
                send_id,
            } => {
                w = Writer::new(op::RMA_WRITE, None);
                w.put(&key.to_le_bytes())
                    .put(&addr.to_le_bytes())
                    .put(&len.to_le_bytes())
                    .put(&send_id.to_le_bytes());
            }
            Wire::RmaRead {
                key,
                addr,
                len,
                recv_id,
            } => {
                w = Writer::new(op::RMA_READ, None);
                w.put(&key.to_le_bytes())
                    .put(&addr.to_le_bytes())
                    .put(&len.to_le_bytes())
                    .put(&recv_id.to_le_bytes());
            }
            Wire::ReadReady { send_id, recv_id } => {
                w = Writer::new(op::READ_READY, None);
                w.put(&send_id.to_le_bytes()).put(&recv_id.to_le_bytes());
            }
            Wire::RmaNack { id, read, error } => {
                w = Writer::new(op::RMA_NACK, None);
                if *read {
                    w.buf[0] |= READ;
                }
                w.put(&id.to_le_bytes()).put(&[*error as u8]);
            }
            Wire::RemoteData { data, len } => {
                w = Writer::new(op::REMOTE_DATA, None);
                w.put(&data.to_le_bytes()).put(&len.to_le_bytes());
            }
            Wire::RemoteNotice(counts) => {
                w = Writer::new(op::REMOTE_DATA, None);
                w.buf[0] |= NOTICE;
                w.put(&counts.key.to_le_bytes())
                    .put(&counts.reads.to_le_bytes())
                    .put(&counts.writes.to_le_bytes())
                    .put(&counts.updates.to_le_bytes());
            }
            Wire::AtomicReq {
                key,
                addr,
                op,
                datatype,
                count,
                id,
                fetch,
            } => {
                w = Writer::new(op::ATOMIC, None);
                if *fetch {
                    w.buf[0] |= FETCH;
                }
                w.put(&key.to_le_bytes())
                    .put(&addr.to_le_bytes())
                    .put(&[*op, *datatype, *count])
                    .put(&id.to_le_bytes());
            }
            Wire::AtomicData { id, bytes } | Wire::AtomicResult { id, bytes } => {
                let kind = match self {
                    Wire::AtomicData { .. } => op::ATOMIC,
                    _ => op::ATOMIC_ANSWER,
                };
                w = Writer::new(kind, None);
                w.buf[0] |= CHUNK;
                w.put(&id.to_le_bytes())
                    .put(&[bytes.len])
                    .put(bytes.as_slice());
            }
            Wire::AtomicReply { id, refusal } => {
                w = Writer::new(op::ATOMIC_ANSWER, None);
                w.put(&id.to_le_bytes())
                    .put(&[refusal.map_or(0, |r| r as u8)]);
            }
        }
        w.buf
    }

    /// An `Inline` or `InlineFirst` (every small message that arrives),
    /// read with moves of fixed size from a scratch line, as
    /// [`encode_inline`] writes them.
    fn decode_inline(buf: &Message, flags: u8) -> Option<Wire> {
        let fields = inline_fields(buf, flags)?;
        let mut payload = InlineBytes::zeroed(fields.take);
        // A fixed-size move: the bytes past `take` are whatever follows.
        let mut line = [0u8; MESSAGE_LEN + INLINE_MAX];
        line[..MESSAGE_LEN].copy_from_slice(buf);
        payload
            .bytes
            .copy_from_slice(&line[fields.at..fields.at + INLINE_MAX]);
        Some(Wire::inline(fields.info, fields.len, payload))
    }

    /// A whole inline message (not one of parts): its matching information
    /// and its payload, in place in `buf`. `None` for any other message,
    /// and for a malformed one (the checks of [`Wire::decode`], which gives
    /// the same answer). The receive path's shortcut: no `Wire` built and
    /// no payload copied before the bytes reach the receive buffer.
    #[inline]
    pub fn inline_view(buf: &Message) -> Option<(MatchInfo, &[u8])> {
        let flags = buf[0] & 0xf0;
        if buf[0] & 0x0f != op::INLINE || flags & PARTS != 0 {
            return None;
        }
        let fields = inline_fields(buf, flags)?;
        Some((fields.info, &buf[fields.at..fields.at + fields.take]))
    }

    /// A message of `len` bytes sent inline whose first bytes are
    /// `payload`: whole (`Inline`), or the first of its parts
    /// (`InlineFirst`) when it is longer.
    pub fn inline(info: MatchInfo, len: usize, payload: InlineBytes) -> Wire {
        if len > payload.len as usize {
            Wire::InlineFirst {
                info,
                len: len as u8,
                payload,
            }
        } else {
            Wire::Inline { info, payload }
        }
    }

    /// Decodes a mailbox message; `None` for anything malformed.
    pub fn decode(buf: &Message) -> Option<Wire> {
        let flags = buf[0] & 0xf0;
        let mut r = Reader { buf, at: 1 };
        Some(match buf[0] & 0x0f {
            op::HELLO if flags & PARAMS != 0 => Wire::Params {
                version: r.u16(),
                id_bits: r.u8(),
                fragment_size: r.u32(),
                eager_size: r.u32(),
            },
            op::HELLO => {
                let slot_shift = r.u8();
                let slots = r.u16();
                let node = r.take::<NODE_LEN>();
                Wire::Hello {
                    node,
                    ring: r.u64(),
                    slot_shift,
                    slots,
                }
            }
            op::INLINE if flags & (PARTS | MORE) == PARTS | MORE => {
                let mut payload = [0u8; MORE_LEN];
                payload.copy_from_slice(&buf[1..]);
                Wire::InlineMore { payload }
            }
            op::INLINE => return Self::decode_inline(buf, flags),
            op::EAGER => {
                let credits = r.u8();
                let field = r.u32();
                Wire::Eager {
                    info: r.info(flags),
                    len: field & ((1 << EAGER_LEN_BITS) - 1),
                    seq: (field >> EAGER_LEN_BITS) as u8,
                    credits,
                    ack: (flags & ACK != 0)
                        .then(|| u16::from_le_bytes([buf[ACK_AT], buf[ACK_AT + 1]])),
                }
            }
            op::RTS => {
                let credits = r.u8();
                let send_id = r.u16();
                let len = r.u32();
                Wire::Rts {
                    info: r.info(flags),
                    send_id,
                    len,
                    credits,
                }
            }
            op::GRANT => {
                let token_low = r.u8();
                let (send_id, fragment, addr) = (r.u16(), r.u32(), r.u64());
                let len_and_token = r.u32();
                Wire::Grant {
                    send_id,
                    fragment,
                    addr,
                    len: len_and_token & MAX_FRAGMENT_LEN as u32,
                    recv_id: r.u16(),
                    recv_gen: r.u16(),
                    token: u16::from_le_bytes([token_low, (len_and_token >> 24) as u8]),
                }
            }
            op::FRAGDONE => {
                r.u8();
                Wire::FragDone {
                    send_id: r.u16(),
                    fragment: r.u32(),
                    recv_id: r.u16(),
                    recv_gen: r.u16(),
                }
            }
            op::FIN if flags & LEN_HIGH != 0 => {
                r.u8();
                Wire::LenHigh {
                    id: r.u16(),
                    read: flags & READ != 0,
                    high: r.u32(),
                }
            }
            op::FIN if flags & OFFER != 0 => {
                r.u8();
                Wire::Offer {
                    send_id: r.u16(),
                    token: r.u16(),
                    addr: r.u64(),
                }
            }
            op::FIN => {
                r.u8();
                Wire::Fin { send_id: r.u16() }
            }
            op::CREDIT if flags & CUT != 0 => match (flags, r.u64()) {
                (CUT, CUT_MARK) => Wire::Cut,
                _ => return None,
            },
            op::CREDIT if flags & THROTTLE != 0 => match r.u8() {
                0 => Wire::Throttle { on: false },
                1 => Wire::Throttle { on: true },
                _ => return None,
            },
            op::CREDIT => Wire::Credit { credits: r.u8() },
            op::RMA_WRITE => Wire::RmaWrite {
                key: r.u64(),
                addr: r.u64(),
                len: r.u32(),
                send_id: r.u16(),
            },
            op::RMA_READ => Wire::RmaRead {
                key: r.u64(),
                addr: r.u64(),
                len: r.u32(),
                recv_id: r.u16(),
            },
            op::READ_READY => Wire::ReadReady {
                send_id: r.u16(),
                recv_id: r.u16(),
            },
            op::RMA_NACK => Wire::RmaNack {
                id: r.u16(),
                read: flags & READ != 0,
                error: RmaRefusal::from_u8(r.u8())?,
            },
            op::REMOTE_DATA if flags & NOTICE != 0 => {
                let counts = AccessCounts {
                    key: r.u64(),
                    reads: r.u32(),
                    writes: r.u32(),
                    updates: r.u32(),
                };
                if counts.all() == 0 {
                    return None;
                }
                Wire::RemoteNotice(counts)
            }
            op::REMOTE_DATA => Wire::RemoteData {
                data: r.u64(),
                len: r.u64(),
            },
            op::ATOMIC | op::ATOMIC_ANSWER if flags & CHUNK != 0 => {
                let id = r.u16();
                let len = r.u8() as usize;
                if len > CHUNK_LEN {
                    return None;
                }
                let bytes = Chunk::new(&buf[r.at..r.at + len]);
                if buf[0] & 0x0f == op::ATOMIC {
                    Wire::AtomicData { id, bytes }
                } else {
                    Wire::AtomicResult { id, bytes }
                }
            }
            op::ATOMIC => Wire::AtomicReq {
                key: r.u64(),
                addr: r.u64(),
                op: r.u8(),
                datatype: r.u8(),
                count: r.u8(),
                id: r.u16(),
                fetch: flags & FETCH != 0,
            },
            op::ATOMIC_ANSWER => {
                let id = r.u16();
                let refusal = match r.u8() {
                    0 => None,
                    code => Some(RmaRefusal::from_u8(code)?),
                };
                Wire::AtomicReply { id, refusal }
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos() -> [MatchInfo; 7] {
        [
            MatchInfo::default(),
            MatchInfo {
                tag: Some(0),
                data: Some(0),
            },
            MatchInfo {
                tag: Some(u64::MAX),
                data: Some(u64::MAX),
            },
            MatchInfo {
                tag: Some(0x8000_0000_0000_0001),
                data: Some(3),
            },
            MatchInfo {
                tag: Some(0x0123_4567_89ab_cdef),
                data: None,
            },
            MatchInfo {
                tag: None,
                data: Some(u64::MAX),
            },
            MatchInfo {
                tag: Some(7),
                data: Some(8),
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        let mut all = vec![
            Wire::Params {
                version: PROTOCOL_VERSION,
                id_bits: ID_BITS,
                fragment_size: u32::MAX,
                eager_size: 1 << 14,
            },
            Wire::Hello {
                node: [9; NODE_LEN],
                ring: 0x7f00_dead_beef,
                slot_shift: 14,
                slots: 16,
            },
            Wire::Grant {
                send_id: 65535,
                fragment: 1 << 20,
                addr: u64::MAX - 1,
                len: 262_144,
                recv_id: 9,
                recv_gen: 0xfffe,
                token: 0xa55a,
            },
            Wire::FragDone {
                send_id: 3,
                fragment: 4,
                recv_id: 5,
                recv_gen: 6,
            },
            Wire::Fin { send_id: 42 },
            Wire::LenHigh {
                id: 7,
                read: false,
                high: 1,
            },
            Wire::LenHigh {
                id: 0xffff,
                read: true,
                high: u32::MAX,
            },
            Wire::Offer {
                send_id: 0xfffe,
                token: 0xa55a,
                addr: u64::MAX - 7,
            },
            Wire::Credit { credits: 255 },
            Wire::Throttle { on: true },
            Wire::Throttle { on: false },
            Wire::Cut,
            Wire::RmaWrite {
                key: u64::MAX,
                addr: 0x7fff_0000_1234,
                len: u32::MAX,
                send_id: 0xffff,
            },
            Wire::RmaRead {
                key: 1,
                addr: u64::MAX,
                len: 0,
                recv_id: 7,
            },
            Wire::ReadReady {
                send_id: 3,
                recv_id: 0xfffe,
            },
            Wire::RmaNack {
                id: 9,
                read: true,
                error: RmaRefusal::Denied,
            },
            Wire::RmaNack {
                id: 9,
                read: false,
                error: RmaRefusal::NoKey,
            },
            Wire::RemoteData {
                data: u64::MAX - 1,
                len: 5 << 30,
            },
            Wire::RemoteNotice(AccessCounts {
                key: 77,
                reads: 1,
                writes: 0,
                updates: 0,
            }),
            Wire::RemoteNotice(AccessCounts {
                key: u64::MAX,
                reads: u32::MAX,
                writes: 3,
                updates: u32::MAX - 1,
            }),
            Wire::AtomicReq {
                key: u64::MAX,
                addr: 0x1234_5678_9abc,
                op: 18,
                datatype: 10,
                count: 64,
                id: 0xfffe,
                fetch: true,
            },
            Wire::AtomicReq {
                key: 0,
                addr: 8,
                op: 2,
                datatype: 7,
                count: 1,
                id: 0,
                fetch: false,
            },
            Wire::AtomicData {
                id: 3,
                bytes: Chunk::new(&[7; CHUNK_LEN]),
            },
            Wire::AtomicData {
                id: 3,
                bytes: Chunk::new(&[]),
            },
            Wire::AtomicResult {
                id: 0xffff,
                bytes: Chunk::new(&[1, 2, 3]),
            },
            Wire::AtomicReply {
                id: 9,
                refusal: None,
            },
            Wire::AtomicReply {
                id: 9,
                refusal: Some(RmaRefusal::Invalid),
            },
        ];
        for info in infos() {
            let cap = inline_capacity(&info);
            for len in [0, 1, cap] {
                all.push(Wire::Inline {
                    info,
                    payload: InlineBytes::new(&(0..len as u8).collect::<Vec<_>>()),
                });
            }
            for len in [cap + 1, cap + (MAX_INLINE_PARTS - 1) * MORE_LEN] {
                all.push(Wire::InlineFirst {
                    info,
                    len: len as u8,
                    payload: InlineBytes::new(&(0..cap as u8).collect::<Vec<_>>()),
                });
            }
            all.push(Wire::InlineMore {
                payload: std::array::from_fn(|i| i as u8 ^ 0x5a),
            });
            for (ack, seq) in [(None, 0), (Some(0), 31), (Some(0xbeef), 7)] {
                all.push(Wire::Eager {
                    info,
                    len: 16384,
                    seq,
                    credits: 3,
                    ack,
                });
            }
            all.push(Wire::Eager {
                info,
                len: MAX_EAGER_LEN as u32,
                seq: EAGER_SEQ_MOD - 1,
                credits: 0,
                ack: None,
            });
            all.push(Wire::Rts {
                info,
                send_id: 77,
                len: u32::MAX,
                credits: 1,
            });
        }
        for message in all {
            assert_eq!(
                Wire::decode(&message.encode()),
                Some(message.clone()),
                "{message:?}"
            );
        }
    }

    /// The fragment messages were called segment messages once: renaming
    /// them must not move a byte.
    #[test]
    fn fragment_messages_keep_their_bytes() {
        let grant = Wire::Grant {
            send_id: 0x0102,
            fragment: 7,
            addr: 0x1122_3344_5566_7788,
            len: 9,
            recv_id: 10,
            recv_gen: 0,
            token: 0x0302,
        };
        let mut expected = [0u8; MESSAGE_LEN];
        expected[..22].copy_from_slice(&[
            5, 2, 2, 1, 7, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 9, 0, 0, 3, 10,
            0,
        ]);
        assert_eq!(grant.encode(), expected);
        let done = Wire::FragDone {
            send_id: 3,
            fragment: 4,
            recv_id: 5,
            recv_gen: 0,
        };
        let mut expected = [0u8; MESSAGE_LEN];
        expected[..10].copy_from_slice(&[6, 0, 3, 0, 4, 0, 0, 0, 5, 0]);
        assert_eq!(done.encode(), expected);
    }

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

    /// The inline layout, byte by byte, as the fixed-size moves of the
    /// codec must keep it: op and flags, length, the sizes of tag and data
    /// and their significant bytes (if either is there), payload, zeros.
    #[test]
    fn inline_messages_keep_their_layout() {
        for info in infos() {
            let cap = inline_capacity(&info);
            for len in 0..=cap + (MAX_INLINE_PARTS - 1) * MORE_LEN {
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(37) ^ 0xa5)
                    .collect();
                let parts = len > cap;
                let first = len.min(cap);
                let mut expected = vec![
                    op::INLINE
                        | if info.tag.is_some() { TAGGED } else { 0 }
                        | if info.data.is_some() { DATA } else { 0 }
                        | if parts { PARTS } else { 0 },
                ];
                expected.push(len as u8);
                if info.tag.is_some() || info.data.is_some() {
                    let (t, d) = (significant_bytes(info.tag), significant_bytes(info.data));
                    expected.push((t | d << 4) as u8);
                    expected.extend_from_slice(&info.tag.unwrap_or(0).to_le_bytes()[..t]);
                    expected.extend_from_slice(&info.data.unwrap_or(0).to_le_bytes()[..d]);
                }
                expected.extend_from_slice(&data[..first]);
                expected.resize(MESSAGE_LEN, 0);
                let wire = Wire::inline(info, len, InlineBytes::new(&data[..first]));
                let message = wire.encode();
                assert_eq!(&message[..], &expected[..], "{info:?}, {len} bytes");
                let back = Wire::decode(&message).expect("decodes");
                assert_eq!(back, wire);
                let (Wire::Inline { payload, .. } | Wire::InlineFirst { payload, .. }) = back
                else {
                    unreachable!()
                };
                assert_eq!(payload.as_slice(), &data[..first]);
            }
        }
    }

    #[test]
    fn inline_capacities() {
        let info = |tag, data| MatchInfo { tag, data };
        assert_eq!(inline_capacity(&info(None, None)), 22);
        assert_eq!(inline_capacity(&info(Some(0), None)), 21);
        assert_eq!(inline_capacity(&info(Some(u64::MAX), None)), 13);
        assert_eq!(inline_capacity(&info(None, Some(255))), 20);
        assert_eq!(inline_capacity(&info(Some(u64::MAX), Some(u64::MAX))), 5);
        // MPICH: 64-bit tag, rank as CQ data: an 8-byte message fits.
        assert_eq!(inline_capacity(&info(Some(1 << 63), Some(3))), 12);
    }

    #[test]
    fn malformed_is_rejected() {
        assert_eq!(Wire::decode(&[0; MESSAGE_LEN]), None);
        assert_eq!(Wire::decode(&[0x0f; MESSAGE_LEN]), None);
        let mut bad_len = [0u8; MESSAGE_LEN];
        bad_len[0] = op::INLINE;
        bad_len[1] = 23;
        assert_eq!(Wire::decode(&bad_len), None);
        // A tag and data that leave less room than the payload claims.
        let mut crowded = [0u8; MESSAGE_LEN];
        crowded[0] = op::INLINE | TAGGED | DATA;
        crowded[1] = 6;
        crowded[2] = 0x88;
        assert_eq!(Wire::decode(&crowded), None);
        let mut oversized = [0u8; MESSAGE_LEN];
        oversized[0] = op::INLINE | TAGGED;
        oversized[2] = 0x09;
        assert_eq!(Wire::decode(&oversized), None);
        let mut nack = [0u8; MESSAGE_LEN];
        nack[0] = op::RMA_NACK;
        nack[3] = 0;
        assert_eq!(Wire::decode(&nack), None, "a refusal without a reason");
        nack[3] = 5;
        assert_eq!(Wire::decode(&nack), None);
        let mut chunk = [0u8; MESSAGE_LEN];
        chunk[0] = op::ATOMIC | CHUNK;
        chunk[3] = CHUNK_LEN as u8 + 1;
        assert_eq!(
            Wire::decode(&chunk),
            None,
            "a chunk longer than a message holds"
        );
    }

    /// The receive path's shortcut reads an inline message as decode does:
    /// the same information and bytes for a whole one, nothing for a part
    /// or any other message, nothing for a malformed one. Every flag and
    /// size byte, lengths around the capacity, bodies that differ from one
    /// message to the next.
    #[test]
    fn the_inline_view_agrees_with_decode() {
        let mut whole = 0;
        for flags in [
            0u8,
            TAGGED,
            DATA,
            TAGGED | DATA,
            PARTS,
            PARTS | TAGGED,
            PARTS | MORE,
        ] {
            for sizes in 0..=255u8 {
                for len in 0..=40u8 {
                    let mut buf = [0u8; MESSAGE_LEN];
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = (i as u8).wrapping_mul(37) ^ sizes.wrapping_add(len);
                    }
                    buf[0] = op::INLINE | flags;
                    buf[1] = len;
                    buf[2] = sizes;
                    let view = Wire::inline_view(&buf);
                    match Wire::decode(&buf) {
                        Some(Wire::Inline { info, payload }) => {
                            assert_eq!(view, Some((info, payload.as_slice())), "{buf:?}");
                            whole += 1;
                        }
                        _ => assert_eq!(view, None, "{buf:?}"),
                    }
                }
            }
        }
        assert!(whole > 1000, "only {whole} whole inline messages tried");
        let other = Wire::Credit { credits: 3 }.encode();
        assert_eq!(Wire::inline_view(&other), None);
    }
}
