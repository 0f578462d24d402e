//! Two-sided inline messages: a whole message inside one mailbox message
//! (`Inline`), or one a little longer in parts (`InlineFirst` and its
//! `InlineMore`s), all of the `INLINE` op. Every small message that is sent
//! or arrives goes through here, so the codec moves whole words and arrays
//! through scratch lines rather than copies of variable length.

use unimem_mailbox::{Message, MESSAGE_LEN};

use super::{info_flags, op, Layout, MatchInfo, Wire, DATA, TAGGED};
use crate::codec::Put;

/// Most mailbox messages one inline message may take (`InlineFirst` and
/// its `InlineMore`s).
pub const MAX_INLINE_PARTS: usize = 4;
/// Payload bytes of an `InlineMore`.
pub const MORE_LEN: usize = MESSAGE_LEN - 1;
/// Longest message sent in parts: a first part without tag or data, and
/// the rest.
pub const MAX_PARTED_LEN: usize = MESSAGE_LEN - 2 + (MAX_INLINE_PARTS - 1) * MORE_LEN;

/// On the `INLINE` op: one part of a message sent in several (an
/// `InlineFirst`); with `MORE` too, a continuation (an `InlineMore`).
const PARTS: u8 = 0x80;
const MORE: u8 = 0x40;

pub(super) const LAYOUTS: &[Layout] = &[
    Layout {
        name: "Inline",
        op: ("INLINE", op::INLINE),
        flags: &[],
        fields: "len u8, [sizes u8, tag bytes, data bytes], payload",
        note:
            "flags `TAGGED`, `DATA`: the significant bytes of tag and CQ data, counted in `sizes`",
    },
    Layout {
        name: "InlineFirst",
        op: ("INLINE", op::INLINE),
        flags: &[("PARTS", PARTS)],
        fields:
            "total len u8, [sizes u8, tag bytes, data bytes], first payload bytes (all that fit)",
        note: "flags `TAGGED`, `DATA` as in an `Inline`",
    },
    Layout {
        name: "InlineMore",
        op: ("INLINE", op::INLINE),
        flags: &[("PARTS", PARTS), ("MORE", MORE)],
        fields: "payload [u8; 23]",
        note: "the next 23 payload bytes, fewer in the last",
    },
];

/// Largest inline payload of a message with this tag and CQ data: 22 bytes
/// without either, else 21 less the significant bytes of both (at least 5).
#[inline]
pub fn inline_capacity(info: &MatchInfo) -> usize {
    if info.tag.is_none() && info.data.is_none() {
        return MESSAGE_LEN - 2;
    }
    MESSAGE_LEN - 3 - significant_bytes(info.tag) - significant_bytes(info.data)
}

/// Bytes needed for `value` without its leading zero bytes (0 for none or 0).
#[inline]
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

/// An `Inline` of `payload`, which must fit [`inline_capacity`].
#[inline]
pub(super) fn encode_whole(info: &MatchInfo, payload: &InlineBytes) -> Message {
    assert!(payload.len as usize <= inline_capacity(info));
    encode_checked(info, payload)
}

/// [`encode_whole`] for a sender that has just checked the capacity
/// (`Messenger::send`): not twice on every inline send.
#[inline]
pub(super) fn encode_checked(info: &MatchInfo, payload: &InlineBytes) -> Message {
    debug_assert!(payload.len as usize <= inline_capacity(info));
    encode_inline(0, payload.len, info, payload)
}

/// An `InlineFirst` of a message of `len` bytes: `payload` fills its
/// capacity, and is shorter than `len`.
#[inline]
pub(super) fn encode_first(info: &MatchInfo, len: u8, payload: &InlineBytes) -> Message {
    assert!(payload.len as usize == inline_capacity(info) && payload.len < len);
    encode_inline(PARTS, len, info, payload)
}

/// An `InlineMore` of `payload`, as [`put_more`] writes it: by two moves,
/// for the sender's parts.
#[inline]
pub(super) fn encode_more(payload: &[u8; MORE_LEN]) -> Message {
    let mut message = [0u8; MESSAGE_LEN];
    message[0] = op::INLINE | PARTS | MORE;
    message[1..].copy_from_slice(payload);
    message
}

/// An `InlineMore`: its payload fills the message.
#[inline]
pub(super) fn put_more<W: Put>(payload: &[u8; MORE_LEN], w: &mut W) {
    w.put_u8(op::INLINE | PARTS | MORE).put(payload);
}

/// The `INLINE` op: an `InlineMore` (flags `PARTS` and `MORE`), else an
/// `Inline` or an `InlineFirst`.
#[inline]
pub(super) fn decode(buf: &Message, flags: u8) -> Option<Wire> {
    if flags & (PARTS | MORE) == PARTS | MORE {
        let mut payload = [0u8; MORE_LEN];
        payload.copy_from_slice(&buf[1..]);
        return Some(Wire::InlineMore { payload });
    }
    decode_inline(buf, flags)
}

/// An `Inline` or `InlineFirst` (every small message that arrives), read
/// with moves of fixed size from a scratch line, as [`encode_inline`]
/// writes them. Inlined into [`Wire::decode`], as it was before the
/// families had files of their own (17 instructions a message less).
#[inline]
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

impl Wire {
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::infos;
    use super::*;

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
