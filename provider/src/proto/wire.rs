//! The provider's messages, each exactly one 192-bit mailbox message.
//!
//! Byte 0 holds the operation in its low nibble and flags in its high one.
//! Every field is little-endian. Optional fields (tag, CQ data) are present
//! only when their flag is set, so a tiny untagged message keeps 22 of the
//! 24 bytes for its payload.
//!
//! | op      | layout after byte 0                                          |
//! |---------|--------------------------------------------------------------|
//! | Hello   | slot shift u8, slots u16, node [u8; 12], ring address u64     |
//! | Inline  | len u8, [tag u64], [data u64], payload                        |
//! | Eager   | credits u8, len u32, [tag u64], [data u64]                    |
//! | Rts     | credits u8, send id u16, len u32, [tag u64], [data u64]       |
//! | Grant   | pad u8, send id u16, segment u32, address u64, len u32, recv id u16 |
//! | SegDone | pad u8, send id u16, segment u32, recv id u16                 |
//! | Fin     | pad u8, send id u16                                           |
//! | Credit  | credits u8                                                    |
//!
//! Eager data sits in the next slot of the receiver's ring for this sender,
//! so it needs no address: the mailbox keeps each sender's messages in order.

use unimem_mailbox::{Message, MESSAGE_LEN};

/// Size of a node identity on the wire.
pub const NODE_LEN: usize = 12;

const TAGGED: u8 = 0x10;
const DATA: u8 = 0x20;

/// Largest inline payload for each combination of tag and CQ data.
pub const fn inline_capacity(tagged: bool, data: bool) -> usize {
    MESSAGE_LEN - 2 - if tagged { 8 } else { 0 } - if data { 8 } else { 0 }
}

/// An inline payload, kept by value: decoding a message must not allocate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InlineBytes {
    len: u8,
    bytes: [u8; MESSAGE_LEN - 2],
}

impl InlineBytes {
    /// `data` must fit the largest inline capacity (22 bytes).
    pub fn new(data: &[u8]) -> InlineBytes {
        let mut bytes = [0u8; MESSAGE_LEN - 2];
        bytes[..data.len()].copy_from_slice(data);
        InlineBytes {
            len: data.len() as u8,
            bytes,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Matching information carried by every message that starts a receive.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MatchInfo {
    pub tag: Option<u64>,
    pub data: Option<u64>,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Wire {
    /// First message to a peer: where our eager ring for it lies.
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
    /// A message whose data was put into the next eager slot.
    Eager {
        info: MatchInfo,
        len: u32,
        credits: u8,
    },
    /// Request to send a large message.
    Rts {
        info: MatchInfo,
        send_id: u16,
        len: u32,
        credits: u8,
    },
    /// Receiver to sender: put segment `segment` of `send_id` at `addr`.
    Grant {
        send_id: u16,
        segment: u32,
        addr: u64,
        len: u32,
        recv_id: u16,
    },
    /// Sender to receiver: segment `segment` is in place.
    SegDone {
        send_id: u16,
        segment: u32,
        recv_id: u16,
    },
    /// Receiver to sender: the large message is delivered.
    Fin { send_id: u16 },
    /// Eager slots handed back.
    Credit { credits: u8 },
}

mod op {
    pub const HELLO: u8 = 1;
    pub const INLINE: u8 = 2;
    pub const EAGER: u8 = 3;
    pub const RTS: u8 = 4;
    pub const GRANT: u8 = 5;
    pub const SEGDONE: u8 = 6;
    pub const FIN: u8 = 7;
    pub const CREDIT: u8 = 8;
}

/// A cursor writing fields into one message.
struct Writer {
    buf: Message,
    at: usize,
}

impl Writer {
    fn new(op: u8, info: Option<&MatchInfo>) -> Writer {
        let flags = info.map_or(0, |i| {
            (if i.tag.is_some() { TAGGED } else { 0 }) | if i.data.is_some() { DATA } else { 0 }
        });
        let mut buf = [0u8; MESSAGE_LEN];
        buf[0] = op | flags;
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
                let payload = payload.as_slice();
                assert!(payload.len() <= inline_capacity(info.tag.is_some(), info.data.is_some()));
                w = Writer::new(op::INLINE, Some(info));
                w.put(&[payload.len() as u8]).info(info).put(payload);
            }
            Wire::Eager { info, len, credits } => {
                w = Writer::new(op::EAGER, Some(info));
                w.put(&[*credits]).put(&len.to_le_bytes()).info(info);
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
                segment,
                addr,
                len,
                recv_id,
            } => {
                w = Writer::new(op::GRANT, None);
                w.put(&[0])
                    .put(&send_id.to_le_bytes())
                    .put(&segment.to_le_bytes())
                    .put(&addr.to_le_bytes())
                    .put(&len.to_le_bytes())
                    .put(&recv_id.to_le_bytes());
            }
            Wire::SegDone {
                send_id,
                segment,
                recv_id,
            } => {
                w = Writer::new(op::SEGDONE, None);
                w.put(&[0])
                    .put(&send_id.to_le_bytes())
                    .put(&segment.to_le_bytes())
                    .put(&recv_id.to_le_bytes());
            }
            Wire::Fin { send_id } => {
                w = Writer::new(op::FIN, None);
                w.put(&[0]).put(&send_id.to_le_bytes());
            }
            Wire::Credit { credits } => {
                w = Writer::new(op::CREDIT, None);
                w.put(&[*credits]);
            }
        }
        w.buf
    }

    /// Decodes a mailbox message; `None` for anything malformed.
    pub fn decode(buf: &Message) -> Option<Wire> {
        let flags = buf[0] & 0xf0;
        let mut r = Reader { buf, at: 1 };
        Some(match buf[0] & 0x0f {
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
            op::INLINE => {
                let len = r.u8() as usize;
                let info = r.info(flags);
                if len > inline_capacity(info.tag.is_some(), info.data.is_some()) {
                    return None;
                }
                Wire::Inline {
                    info,
                    payload: InlineBytes::new(&buf[r.at..r.at + len]),
                }
            }
            op::EAGER => {
                let credits = r.u8();
                let len = r.u32();
                Wire::Eager {
                    info: r.info(flags),
                    len,
                    credits,
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
                r.u8();
                Wire::Grant {
                    send_id: r.u16(),
                    segment: r.u32(),
                    addr: r.u64(),
                    len: r.u32(),
                    recv_id: r.u16(),
                }
            }
            op::SEGDONE => {
                r.u8();
                Wire::SegDone {
                    send_id: r.u16(),
                    segment: r.u32(),
                    recv_id: r.u16(),
                }
            }
            op::FIN => {
                r.u8();
                Wire::Fin { send_id: r.u16() }
            }
            op::CREDIT => Wire::Credit { credits: r.u8() },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos() -> [MatchInfo; 4] {
        [
            MatchInfo::default(),
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
            Wire::Hello {
                node: [9; NODE_LEN],
                ring: 0x7f00_dead_beef,
                slot_shift: 14,
                slots: 16,
            },
            Wire::Grant {
                send_id: 65535,
                segment: 1 << 20,
                addr: u64::MAX - 1,
                len: 262_144,
                recv_id: 9,
            },
            Wire::SegDone {
                send_id: 3,
                segment: 4,
                recv_id: 5,
            },
            Wire::Fin { send_id: 42 },
            Wire::Credit { credits: 255 },
        ];
        for info in infos() {
            let cap = inline_capacity(info.tag.is_some(), info.data.is_some());
            for len in [0, 1, cap] {
                all.push(Wire::Inline {
                    info,
                    payload: InlineBytes::new(&(0..len as u8).collect::<Vec<_>>()),
                });
            }
            all.push(Wire::Eager {
                info,
                len: 16384,
                credits: 3,
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

    #[test]
    fn inline_capacities() {
        assert_eq!(inline_capacity(false, false), 22);
        assert_eq!(inline_capacity(true, false), 14);
        assert_eq!(inline_capacity(false, true), 14);
        assert_eq!(inline_capacity(true, true), 6);
    }

    #[test]
    fn malformed_is_rejected() {
        assert_eq!(Wire::decode(&[0; MESSAGE_LEN]), None);
        assert_eq!(Wire::decode(&[0x0f; MESSAGE_LEN]), None);
        let mut bad_len = [0u8; MESSAGE_LEN];
        bad_len[0] = op::INLINE;
        bad_len[1] = 23;
        assert_eq!(Wire::decode(&bad_len), None);
    }
}
