//! What the network backend's processes say to each other over the
//! transport, in plain Rust: every packet starts with its kind and the
//! sender's network address, and is checked in full before it is used
//! (a peer is untrusted input: a packet that does not parse is dropped).

use unimem_mailbox::codec::{Put, Reader};
use unimem_mailbox::{JobId, Message, NicAddr, MESSAGE_LEN};

/// Bytes of the header every packet starts with.
pub const HEADER_LEN: usize = 8;
/// Most mailbox messages one packet carries: one sender's messages to one
/// mailbox, sent in a row (a message in parts takes up to four), go in one
/// packet, as a network pays per packet what shared memory pays per byte.
pub const MAX_BATCH: usize = 8;
/// Longest write that travels in a packet (see [`Write`]).
pub const WRITE_MAX: usize = 16 << 10;
/// A write packet's fields before its bytes: key, address, length.
const WRITE_FIELDS: usize = 8 + 8 + 4;
/// What a write packet adds to its bytes, with a full batch behind it.
pub const WRITE_OVERHEAD: usize = HEADER_LEN + WRITE_FIELDS + MAILBOX_MAX;
const MAILBOX_MAX: usize = HEADER_LEN + 20 + MAX_BATCH * MESSAGE_LEN;
const DIR_REPLY_MAX: usize = HEADER_LEN + 8 + 24 * unimem_dma::MAX_SEGMENTS;
/// Largest packet when writes carry at most `write_max` bytes (a write
/// with the mailbox messages behind it, or a directory reply of every
/// segment a region can have): what a receive buffer must hold.
pub const fn max_packet(write_max: usize) -> usize {
    let write_packet = WRITE_OVERHEAD + write_max;
    if write_packet > DIR_REPLY_MAX {
        write_packet
    } else {
        DIR_REPLY_MAX
    }
}

/// A short put carried by a packet of its own kind rather than by the
/// transport's RMA: `bytes` for the receiver's memory at `addr` (a virtual
/// address of the receiver), inside the segment it opened to the network
/// under `key`. The mailbox messages its sender sent after it may follow in
/// the same transport message, as one mailbox packet: an eager message and
/// its announcement are then one message on the network, not two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write<'a> {
    pub key: u64,
    pub addr: u64,
    pub bytes: &'a [u8],
}

impl Write<'_> {
    /// Encodes the write from `from` into `out` (cleared first); the
    /// mailbox packet behind it, if any, is appended by the caller.
    pub fn encode(&self, from: NicAddr, out: &mut Vec<u8>) {
        debug_assert!(self.bytes.len() <= WRITE_MAX);
        put_header(out, WRITE, from);
        out.put_u64(self.key)
            .put_u64(self.addr)
            .put_u32(self.bytes.len() as u32)
            .put(self.bytes);
    }

    /// If `bytes` is a write packet: its sender, the write, and the mailbox
    /// packet behind it (which must be whole and from the same sender).
    /// `None` for any other kind; `Some(Err)` for a write that does not
    /// parse.
    #[allow(clippy::type_complexity)]
    pub fn decode(bytes: &[u8]) -> Option<Result<(NicAddr, Write<'_>, Option<Packet>), ()>> {
        if bytes.first() != Some(&WRITE) {
            return None;
        }
        Some(Self::decode_whole(bytes).ok_or(()))
    }

    fn decode_whole(bytes: &[u8]) -> Option<(NicAddr, Write<'_>, Option<Packet>)> {
        let mut r = Reader::new(bytes);
        let from = header_sender(r.take(HEADER_LEN)?)?;
        let (key, addr, len) = (r.u64()?, r.u64()?, r.u32()? as usize);
        if len > WRITE_MAX {
            return None;
        }
        let write = Write {
            key,
            addr,
            bytes: r.take(len)?,
        };
        if r.is_empty() {
            return Some((from, write, None));
        }
        match Packet::decode(r.rest())? {
            (sender, packet @ Packet::Mailbox { .. }) if sender == from => {
                Some((from, write, Some(packet)))
            }
            _ => None,
        }
    }
}

/// Where in `segments` (ours, opened to the network) a write of `len`
/// bytes under `key` at `addr` lands: the segment's index, if the whole
/// range lies inside the one segment of that key.
pub fn write_target<'a>(
    segments: impl IntoIterator<Item = &'a Segment>,
    key: u64,
    addr: u64,
    len: usize,
) -> Option<usize> {
    let end = addr.checked_add(len as u64)?;
    segments
        .into_iter()
        .position(|s| s.key == key && addr >= s.base && end <= s.base.saturating_add(s.len))
}

/// One registered range of a process's dmable memory, as its peers use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub base: u64,
    pub len: u64,
    pub key: u64,
}

/// A packet's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// Mailbox messages from mailbox `src_index` of process (job, pid,
    /// nonce) to our mailbox `dst_index`, in the order sent: the first
    /// `count` (1 to [`MAX_BATCH`]) of `messages`.
    Mailbox {
        dst_index: u32,
        src_index: u32,
        job: JobId,
        pid: u32,
        nonce: u32,
        count: usize,
        messages: [Message; MAX_BATCH],
    },
    /// "Still here."
    Alive,
    /// Which of your memory may I write and read (request `req`)?
    DirQuery { req: u32 },
    /// The answer: these segments, by virtual address or by offset.
    DirReply {
        req: u32,
        virt_addr: bool,
        segments: Vec<Segment>,
    },
    /// What do you expose under `key`?
    KeyQuery { req: u32, key: u64 },
    /// The answer: the exposure's address, length and access bits, or
    /// `found: false`.
    KeyReply {
        req: u32,
        found: bool,
        addr: u64,
        len: u64,
        access: u32,
    },
    /// No mailbox `index` here (closed, or never was).
    Gone { index: u32 },
}

const MAILBOX: u8 = 1;
const ALIVE: u8 = 2;
const DIR_QUERY: u8 = 3;
const DIR_REPLY: u8 = 4;
const KEY_QUERY: u8 = 5;
const KEY_REPLY: u8 = 6;
const GONE: u8 = 7;
const WRITE: u8 = 8;

/// Starts `out` (cleared first) with the header of a packet of `kind` from
/// `from`; [`header_sender`] reads it back.
fn put_header(out: &mut Vec<u8>, kind: u8, from: NicAddr) {
    out.clear();
    out.put_u8(kind).put_u8(0).put_u16(from.port).put(&from.ip);
}

/// The sender a packet's header names, if the header is well formed.
fn header_sender(head: &[u8]) -> Option<NicAddr> {
    let from = NicAddr {
        port: u16::from_le_bytes([head[2], head[3]]),
        ip: head[4..8].try_into().ok()?,
    };
    (from.port != 0 && head[1] == 0).then_some(from)
}

impl Packet {
    /// The packet from `from`, encoded into `out` (cleared first).
    pub fn encode(&self, from: NicAddr, out: &mut Vec<u8>) {
        let kind = match self {
            Packet::Mailbox { .. } => MAILBOX,
            Packet::Alive => ALIVE,
            Packet::DirQuery { .. } => DIR_QUERY,
            Packet::DirReply { .. } => DIR_REPLY,
            Packet::KeyQuery { .. } => KEY_QUERY,
            Packet::KeyReply { .. } => KEY_REPLY,
            Packet::Gone { .. } => GONE,
        };
        put_header(out, kind, from);
        match self {
            Packet::Mailbox {
                dst_index,
                src_index,
                job,
                pid,
                nonce,
                count,
                messages,
            } => {
                out.put_u32(*dst_index)
                    .put_u32(*src_index)
                    .put_u32(job.0)
                    .put_u32(*pid)
                    .put_u32(*nonce);
                for message in &messages[..(*count).min(MAX_BATCH)] {
                    out.put(message);
                }
            }
            Packet::Alive => {}
            Packet::DirQuery { req } => {
                out.put_u32(*req);
            }
            Packet::DirReply {
                req,
                virt_addr,
                segments,
            } => {
                out.put_u32(*req)
                    .put_u32((segments.len() as u32) << 1 | u32::from(*virt_addr));
                for s in segments {
                    out.put_u64(s.base).put_u64(s.len).put_u64(s.key);
                }
            }
            Packet::KeyQuery { req, key } => {
                out.put_u32(*req).put_u64(*key);
            }
            Packet::KeyReply {
                req,
                found,
                addr,
                len,
                access,
            } => {
                out.put_u32(*req)
                    .put_u32(u32::from(*found))
                    .put_u64(*addr)
                    .put_u64(*len)
                    .put_u32(*access);
            }
            Packet::Gone { index } => {
                out.put_u32(*index);
            }
        }
    }

    /// The sender and the packet, if `bytes` is one, whole and nothing
    /// more.
    pub fn decode(bytes: &[u8]) -> Option<(NicAddr, Packet)> {
        let mut r = Reader::new(bytes);
        let head = r.take(HEADER_LEN)?;
        let from = header_sender(head)?;
        let packet = match head[0] {
            MAILBOX => {
                let (dst_index, src_index) = (r.u32()?, r.u32()?);
                let (job, pid, nonce) = (JobId(r.u32()?), r.u32()?, r.u32()?);
                let left = r.rest().len();
                let count = left / MESSAGE_LEN;
                if count == 0 || count > MAX_BATCH || !left.is_multiple_of(MESSAGE_LEN) {
                    return None;
                }
                let mut messages = [[0u8; MESSAGE_LEN]; MAX_BATCH];
                for message in &mut messages[..count] {
                    *message = r.array()?;
                }
                Packet::Mailbox {
                    dst_index,
                    src_index,
                    job,
                    pid,
                    nonce,
                    count,
                    messages,
                }
            }
            ALIVE => Packet::Alive,
            DIR_QUERY => Packet::DirQuery { req: r.u32()? },
            DIR_REPLY => {
                let req = r.u32()?;
                let word = r.u32()?;
                let count = (word >> 1) as usize;
                if count > unimem_dma::MAX_SEGMENTS {
                    return None;
                }
                let mut segments = Vec::with_capacity(count);
                for _ in 0..count {
                    segments.push(Segment {
                        base: r.u64()?,
                        len: r.u64()?,
                        key: r.u64()?,
                    });
                }
                Packet::DirReply {
                    req,
                    virt_addr: word & 1 != 0,
                    segments,
                }
            }
            KEY_QUERY => Packet::KeyQuery {
                req: r.u32()?,
                key: r.u64()?,
            },
            KEY_REPLY => Packet::KeyReply {
                req: r.u32()?,
                found: match r.u32()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                addr: r.u64()?,
                len: r.u64()?,
                access: r.u32()?,
            },
            GONE => Packet::Gone { index: r.u32()? },
            _ => return None,
        };
        r.is_empty().then_some((from, packet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from() -> NicAddr {
        "198.18.0.11:4000".parse().unwrap()
    }

    fn every_kind() -> Vec<Packet> {
        vec![
            Packet::Mailbox {
                dst_index: 3,
                src_index: 9,
                job: JobId(0xabcd),
                pid: 77,
                nonce: 0x1234,
                count: 1,
                messages: std::array::from_fn(|i| [if i == 0 { 7 } else { 0 }; MESSAGE_LEN]),
            },
            Packet::Mailbox {
                dst_index: 3,
                src_index: 9,
                job: JobId(0xabcd),
                pid: 77,
                nonce: 0x1234,
                count: MAX_BATCH,
                messages: std::array::from_fn(|i| [i as u8; MESSAGE_LEN]),
            },
            Packet::Alive,
            Packet::DirQuery { req: 5 },
            Packet::DirReply {
                req: 5,
                virt_addr: true,
                segments: vec![
                    Segment {
                        base: 0x7f00_0000_0000,
                        len: 64 << 20,
                        key: 1,
                    };
                    unimem_dma::MAX_SEGMENTS
                ],
            },
            Packet::KeyQuery { req: 6, key: 42 },
            Packet::KeyReply {
                req: 6,
                found: true,
                addr: 0x1000,
                len: 0x100,
                access: 3,
            },
            Packet::Gone { index: 4 },
        ]
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Every packet kind, and a write, encodes to exactly these bytes
    /// (written from the codec as it stood before it moved to
    /// `unimem_mailbox::codec`): header, then the fields little-endian.
    #[test]
    fn every_kind_keeps_its_bytes() {
        let header = |kind: &str| format!("{kind}00a00fc612000b");
        let mut one = [[0u8; MESSAGE_LEN]; MAX_BATCH];
        one[0] = std::array::from_fn(|i| 0x40 + i as u8);
        one[1] = [0xee; MESSAGE_LEN];
        let cases = [
            (
                Packet::Mailbox {
                    dst_index: 0x0403_0201,
                    src_index: 0x1413_1211,
                    job: JobId(0x2423_2221),
                    pid: 0x3433_3231,
                    nonce: 0x4443_4241,
                    count: 1,
                    messages: one,
                },
                format!(
                    "{}0102030411121314212223243132333441424344{}",
                    header("01"),
                    "404142434445464748494a4b4c4d4e4f5051525354555657"
                ),
            ),
            (Packet::Alive, header("02")),
            (
                Packet::DirQuery { req: 0x0403_0201 },
                format!("{}01020304", header("03")),
            ),
            (
                Packet::DirReply {
                    req: 0x0403_0201,
                    virt_addr: true,
                    segments: vec![Segment {
                        base: 0x1817_1615_1413_1211,
                        len: 0x2827_2625_2423_2221,
                        key: 0x3837_3635_3433_3231,
                    }],
                },
                format!(
                    "{}0102030403000000{}",
                    header("04"),
                    "111213141516171821222324252627283132333435363738"
                ),
            ),
            (
                Packet::DirReply {
                    req: 1,
                    virt_addr: false,
                    segments: vec![],
                },
                format!("{}0100000000000000", header("04")),
            ),
            (
                Packet::KeyQuery {
                    req: 0x0403_0201,
                    key: 0x1817_1615_1413_1211,
                },
                format!("{}010203041112131415161718", header("05")),
            ),
            (
                Packet::KeyReply {
                    req: 0x0403_0201,
                    found: true,
                    addr: 0x1817_1615_1413_1211,
                    len: 0x2827_2625_2423_2221,
                    access: 0x3433_3231,
                },
                format!(
                    "{}0102030401000000{}",
                    header("06"),
                    "1112131415161718212223242526272831323334"
                ),
            ),
            (
                Packet::Gone { index: 0x0403_0201 },
                format!("{}01020304", header("07")),
            ),
        ];
        let mut out = Vec::new();
        for (packet, bytes) in cases {
            packet.encode(from(), &mut out);
            assert_eq!(hex(&out), bytes, "{packet:?}");
            let (sender, back) = Packet::decode(&out).expect("decodes");
            let mut again = Vec::new();
            back.encode(sender, &mut again);
            assert_eq!(hex(&again), bytes, "{packet:?}");
            if let Packet::KeyReply { .. } = back {
                // `found` is 0 or 1, nothing else.
                out[HEADER_LEN + 4] = 2;
                assert_eq!(Packet::decode(&out), None);
            }
        }
        // A header's second byte is 0, its port not.
        Packet::Alive.encode(from(), &mut out);
        out[1] = 1;
        assert_eq!(Packet::decode(&out), None);
        out[1] = 0;
        out[2..4].fill(0);
        assert_eq!(Packet::decode(&out), None);
        let write = Write {
            key: 0x0807_0605_0403_0201,
            addr: 0x1817_1615_1413_1211,
            bytes: &[0xa1, 0xa2, 0xa3],
        };
        write.encode(from(), &mut out);
        assert_eq!(
            hex(&out),
            format!(
                "{}01020304050607081112131415161718{}",
                header("08"),
                "03000000a1a2a3"
            )
        );
    }

    #[test]
    fn every_kind_round_trips() {
        let mut out = Vec::new();
        for packet in every_kind() {
            packet.encode(from(), &mut out);
            assert!(out.len() <= max_packet(WRITE_MAX));
            assert_eq!(Packet::decode(&out), Some((from(), packet)));
        }
    }

    #[test]
    fn a_batch_keeps_only_its_messages() {
        let mut out = Vec::new();
        let mut packet = every_kind()[1].clone();
        if let Packet::Mailbox { count, .. } = &mut packet {
            *count = 3;
        }
        packet.encode(from(), &mut out);
        let Some((
            _,
            Packet::Mailbox {
                count, messages, ..
            },
        )) = Packet::decode(&out)
        else {
            panic!("a mailbox packet");
        };
        assert_eq!(count, 3);
        assert_eq!(messages[2], [2; MESSAGE_LEN]);
        assert_eq!(messages[3], [0; MESSAGE_LEN], "nothing past the count");
    }

    #[test]
    fn a_write_round_trips_alone_and_with_its_announcement() {
        let data: Vec<u8> = (0..WRITE_MAX).map(|i| i as u8).collect();
        let write = Write {
            key: 7,
            addr: 0x7f00_0000_1000,
            bytes: &data,
        };
        let mut out = Vec::new();
        write.encode(from(), &mut out);
        assert_eq!(Write::decode(&out), Some(Ok((from(), write, None))));
        let mut mailbox = Vec::new();
        let announcement = every_kind()[1].clone();
        announcement.encode(from(), &mut mailbox);
        out.extend_from_slice(&mailbox);
        assert!(out.len() <= max_packet(WRITE_MAX));
        assert_eq!(
            Write::decode(&out),
            Some(Ok((from(), write, Some(announcement))))
        );
        // Not a write: for Packet::decode.
        assert_eq!(Write::decode(&mailbox), None);
    }

    #[test]
    fn bad_writes_are_refused() {
        let data = [5u8; 100];
        let write = Write {
            key: 1,
            addr: 0x1000,
            bytes: &data,
        };
        let mut out = Vec::new();
        write.encode(from(), &mut out);
        // Cut anywhere: refused, never a shorter write.
        for cut in 1..out.len() {
            assert_eq!(Write::decode(&out[..cut]), Some(Err(())), "cut at {cut}");
        }
        // A length past the packet, or past the limit.
        let mut long = out.clone();
        long[HEADER_LEN + 16..HEADER_LEN + 20].copy_from_slice(&(101u32).to_le_bytes());
        assert_eq!(Write::decode(&long), Some(Err(())));
        let mut huge = out.clone();
        huge[HEADER_LEN + 16..HEADER_LEN + 20]
            .copy_from_slice(&((WRITE_MAX + 1) as u32).to_le_bytes());
        huge.resize(HEADER_LEN + WRITE_FIELDS + WRITE_MAX + 1, 0);
        assert_eq!(Write::decode(&huge), Some(Err(())));
        // Followed by anything but a whole mailbox packet of its sender.
        let mut trailing = out.clone();
        trailing.push(0);
        assert_eq!(Write::decode(&trailing), Some(Err(())));
        let mut other = Vec::new();
        every_kind()[0].encode("198.18.0.12:4000".parse().unwrap(), &mut other);
        let mut foreign = out.clone();
        foreign.extend_from_slice(&other);
        assert_eq!(Write::decode(&foreign), Some(Err(())));
        let mut alive = Vec::new();
        Packet::Alive.encode(from(), &mut alive);
        let mut not_mailbox = out.clone();
        not_mailbox.extend_from_slice(&alive);
        assert_eq!(Write::decode(&not_mailbox), Some(Err(())));
        // Packet::decode knows no write.
        assert_eq!(Packet::decode(&out), None);
    }

    #[test]
    fn a_write_lands_only_inside_the_segment_of_its_key() {
        let segments = [
            Segment {
                base: 0x1000,
                len: 0x1000,
                key: 1,
            },
            Segment {
                base: 0x4000,
                len: 0x1000,
                key: 2,
            },
        ];
        assert_eq!(write_target(&segments, 1, 0x1000, 0x1000), Some(0));
        assert_eq!(write_target(&segments, 2, 0x4ff0, 0x10), Some(1));
        assert_eq!(
            write_target(&segments, 2, 0x4ff0, 0x11),
            None,
            "past the end"
        );
        assert_eq!(write_target(&segments, 1, 0x4000, 1), None, "another key's");
        assert_eq!(
            write_target(&segments, 1, 0xfff, 2),
            None,
            "before the start"
        );
        assert_eq!(write_target(&segments, 3, 0x1000, 1), None, "no such key");
        assert_eq!(write_target(&segments, 1, u64::MAX, 2), None, "wraps");
    }

    #[test]
    fn a_mailbox_message_fits_an_inject() {
        let mut out = Vec::new();
        every_kind()[0].encode(from(), &mut out);
        assert!(out.len() <= 64, "{} bytes", out.len());
    }

    #[test]
    fn truncated_padded_or_unknown_packets_are_refused() {
        let mut out = Vec::new();
        for packet in every_kind() {
            packet.encode(from(), &mut out);
            let batch_start = HEADER_LEN + 20;
            for cut in 0..out.len() {
                let decoded = Packet::decode(&out[..cut]);
                let whole_messages = matches!(packet, Packet::Mailbox { .. })
                    && cut > batch_start
                    && (cut - batch_start).is_multiple_of(MESSAGE_LEN);
                if whole_messages {
                    // A shorter batch: what it has of the messages.
                    let Some((_, Packet::Mailbox { count, .. })) = decoded else {
                        panic!("{packet:?} cut at {cut}: a shorter batch");
                    };
                    assert_eq!(count, (cut - batch_start) / MESSAGE_LEN);
                } else {
                    assert_eq!(decoded, None, "{packet:?} cut at {cut}");
                }
            }
            let mut longer = out.clone();
            longer.push(0);
            assert_eq!(Packet::decode(&longer), None);
        }
        let mut unknown = out.clone();
        unknown[0] = 99;
        assert_eq!(Packet::decode(&unknown), None);
        // A directory longer than any region.
        let mut huge = Vec::new();
        Packet::DirQuery { req: 1 }.encode(from(), &mut huge);
        huge[0] = DIR_REPLY;
        huge.extend_from_slice(&(((unimem_dma::MAX_SEGMENTS as u32) + 1) << 1).to_le_bytes());
        assert_eq!(Packet::decode(&huge), None);
    }
}
