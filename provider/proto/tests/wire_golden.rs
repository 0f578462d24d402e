//! The wire format, pinned: every mailbox message kind (and every flag
//! combination in use) encodes to exactly these 24 bytes and decodes back,
//! and decoding accepts and refuses exactly these inputs. The bytes were
//! written from the codec as it stood before the wire module was split
//! (commit e37d76a): a change to any of them is a change of protocol, which
//! needs a new `PROTOCOL_VERSION`, not a refactoring.
//!
//! Only the crate's public API is used, so the test holds whatever the
//! module's insides become.

use unimem_mailbox::{Message, MESSAGE_LEN};
use unimem_proto::testing::Rng;
use unimem_proto::wire::{Chunk, InlineBytes, MatchInfo, RmaRefusal, Wire, CHUNK_LEN, NODE_LEN};
use unimem_proto::AccessCounts;

/// The message whose bytes are `hex` (spaces ignored; 48 digits).
fn message(hex: &str) -> Message {
    let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len(), 2 * MESSAGE_LEN, "{hex}");
    std::array::from_fn(|i| {
        u8::from_str_radix(std::str::from_utf8(&digits[2 * i..2 * i + 2]).unwrap(), 16).unwrap()
    })
}

fn hex(message: &Message) -> String {
    message
        .chunks(8)
        .map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

fn tag_data(tag: Option<u64>, data: Option<u64>) -> MatchInfo {
    MatchInfo { tag, data }
}

/// Checks each message encodes to its bytes and decodes back; reports
/// every mismatch at once (with the bytes the codec gave).
fn check(cases: &[(Wire, &str)]) {
    let mut wrong = Vec::new();
    for (wire, bytes) in cases {
        let encoded = wire.encode();
        if hex(&encoded) != hex(&message(bytes)) {
            wrong.push(format!("{wire:?}\n    => \"{}\"", hex(&encoded)));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for (wire, bytes) in cases {
        assert_eq!(
            Wire::decode(&message(bytes)).as_ref(),
            Some(wire),
            "{bytes}"
        );
    }
}

const TAG: u64 = 0x0807_0605_0403_0201;
const DATA: u64 = 0x1817_1615_1413_1211;

#[test]
fn first_contact_keeps_its_bytes() {
    check(&[
        (
            Wire::Params {
                version: 6,
                id_bits: 16,
                fragment_size: 0x0403_0201,
                eager_size: 0x1413_1211,
            },
            "11060010 01020304 11121314 00000000 00000000 00000000",
        ),
        (
            Wire::Hello {
                node: std::array::from_fn(|i| 0xa0 + i as u8),
                ring: 0x1817_1615_1413_1211,
                slot_shift: 14,
                slots: 0x0201,
            },
            "010e0102 a0a1a2a3 a4a5a6a7 a8a9aaab 11121314 15161718",
        ),
    ]);
}

#[test]
fn inline_messages_keep_their_bytes() {
    let payload = |n: usize| InlineBytes::new(&(0..n as u8).map(|i| 0x30 + i).collect::<Vec<_>>());
    check(&[
        (
            Wire::Inline {
                info: MatchInfo::default(),
                payload: payload(0),
            },
            "02000000 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Inline {
                info: MatchInfo::default(),
                payload: payload(22),
            },
            "02163031 32333435 36373839 3a3b3c3d 3e3f4041 42434445",
        ),
        (
            Wire::Inline {
                info: tag_data(Some(TAG), None),
                payload: payload(3),
            },
            "12030801 02030405 06070830 31320000 00000000 00000000",
        ),
        (
            Wire::Inline {
                info: tag_data(Some(0), None),
                payload: payload(1),
            },
            "12010030 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Inline {
                info: tag_data(None, Some(0x0201)),
                payload: payload(2),
            },
            "22022001 02303100 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Inline {
                info: tag_data(Some(0x8000_0000_0000_0001), Some(3)),
                payload: payload(12),
            },
            "320c1801 00000000 00008003 30313233 34353637 38393a3b",
        ),
        (
            Wire::Inline {
                info: tag_data(Some(u64::MAX), Some(u64::MAX)),
                payload: payload(5),
            },
            "320588ff ffffffff ffffffff ffffffff ffffff30 31323334",
        ),
        (
            Wire::InlineFirst {
                info: MatchInfo::default(),
                len: 91,
                payload: payload(22),
            },
            "825b3031 32333435 36373839 3a3b3c3d 3e3f4041 42434445",
        ),
        (
            Wire::InlineFirst {
                info: tag_data(Some(TAG), Some(3)),
                len: 30,
                payload: payload(12),
            },
            "b21e1801 02030405 06070803 30313233 34353637 38393a3b",
        ),
        (
            Wire::InlineFirst {
                info: tag_data(None, Some(7)),
                len: 21,
                payload: payload(20),
            },
            "a2151007 30313233 34353637 38393a3b 3c3d3e3f 40414243",
        ),
        (
            Wire::InlineMore {
                payload: std::array::from_fn(|i| 0x40 + i as u8),
            },
            "c2404142 43444546 4748494a 4b4c4d4e 4f505152 53545556",
        ),
    ]);
}

#[test]
fn eager_messages_keep_their_bytes() {
    let eager = |info, ack| Wire::Eager {
        info,
        len: 0x0403_0201 & ((1 << 27) - 1),
        seq: 0x15,
        credits: 9,
        ack,
    };
    check(&[
        (
            eager(MatchInfo::default(), None),
            "03090102 03ac0000 00000000 00000000 00000000 00000000",
        ),
        (
            eager(tag_data(Some(TAG), None), None),
            "13090102 03ac0102 03040506 07080000 00000000 00000000",
        ),
        (
            eager(tag_data(None, Some(DATA)), None),
            "23090102 03ac1112 13141516 17180000 00000000 00000000",
        ),
        (
            eager(tag_data(Some(TAG), Some(DATA)), None),
            "33090102 03ac0102 03040506 07081112 13141516 17180000",
        ),
        (
            eager(MatchInfo::default(), Some(0x0201)),
            "43090102 03ac0000 00000000 00000000 00000000 00000102",
        ),
        (
            eager(tag_data(Some(TAG), Some(DATA)), Some(0xfffe)),
            "73090102 03ac0102 03040506 07081112 13141516 1718feff",
        ),
        (
            Wire::Eager {
                info: MatchInfo::default(),
                len: (1 << 27) - 1,
                seq: 31,
                credits: 0,
                ack: None,
            },
            "0300ffff ffff0000 00000000 00000000 00000000 00000000",
        ),
    ]);
}

#[test]
fn rendezvous_messages_keep_their_bytes() {
    let rts = |info| Wire::Rts {
        info,
        send_id: 0x0201,
        len: 0x1413_1211,
        credits: 5,
    };
    check(&[
        (
            rts(MatchInfo::default()),
            "04050102 11121314 00000000 00000000 00000000 00000000",
        ),
        (
            rts(tag_data(Some(TAG), None)),
            "14050102 11121314 01020304 05060708 00000000 00000000",
        ),
        (
            rts(tag_data(None, Some(DATA))),
            "24050102 11121314 11121314 15161718 00000000 00000000",
        ),
        (
            rts(tag_data(Some(TAG), Some(DATA))),
            "34050102 11121314 01020304 05060708 11121314 15161718",
        ),
        (
            Wire::Grant {
                send_id: 0x0201,
                fragment: 0x1413_1211,
                addr: 0x2827_2625_2423_2221,
                len: 0x0033_3231,
                recv_id: 0x4241,
                recv_gen: 0x5251,
                token: 0x6261,
            },
            "05610102 11121314 21222324 25262728 31323362 41425152",
        ),
        (
            Wire::FragDone {
                send_id: 0x0201,
                fragment: 0x1413_1211,
                recv_id: 0x2221,
                recv_gen: 0x3231,
            },
            "06000102 11121314 21223132 00000000 00000000 00000000",
        ),
        (
            Wire::Fin { send_id: 0x0201 },
            "07000102 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::LenHigh {
                id: 0x0201,
                read: false,
                high: 0x1413_1211,
            },
            "27000102 11121314 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::LenHigh {
                id: 0x0201,
                read: true,
                high: 0x1413_1211,
            },
            "37000102 11121314 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Offer {
                send_id: 0x0201,
                token: 0x1211,
                addr: 0x2827_2625_2423_2221,
            },
            "47000102 11122122 23242526 27280000 00000000 00000000",
        ),
    ]);
}

#[test]
fn credit_messages_keep_their_bytes() {
    check(&[
        (
            Wire::Credit { credits: 0xfe },
            "08fe0000 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Throttle { on: false },
            "18000000 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Throttle { on: true },
            "18010000 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::Cut,
            "28756e69 6d435554 21000000 00000000 00000000 00000000",
        ),
    ]);
}

#[test]
fn rma_messages_keep_their_bytes() {
    let mut cases = vec![
        (
            Wire::RmaWrite {
                key: TAG,
                addr: DATA,
                len: 0x2423_2221,
                send_id: 0x3231,
            },
            "09010203 04050607 08111213 14151617 18212223 24313200",
        ),
        (
            Wire::RmaRead {
                key: TAG,
                addr: DATA,
                len: 0x2423_2221,
                recv_id: 0x3231,
            },
            "0a010203 04050607 08111213 14151617 18212223 24313200",
        ),
        (
            Wire::ReadReady {
                send_id: 0x0201,
                recv_id: 0x1211,
            },
            "0b010211 12000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::RemoteData {
                data: TAG,
                len: DATA,
            },
            "0d010203 04050607 08111213 14151617 18000000 00000000",
        ),
        (
            Wire::RemoteNotice(AccessCounts {
                key: TAG,
                reads: 0x1413_1211,
                writes: 0x2423_2221,
                updates: 0x3433_3231,
            }),
            "1d010203 04050607 08111213 14212223 24313233 34000000",
        ),
        (
            Wire::RemoteNotice(AccessCounts {
                key: 0,
                reads: 0,
                writes: 0,
                updates: 1,
            }),
            "1d000000 00000000 00000000 00000000 00010000 00000000",
        ),
    ];
    let nacks = [
        (RmaRefusal::NoKey, false, "0c010201 00000000"),
        (RmaRefusal::Denied, true, "1c010202 00000000"),
        (RmaRefusal::Busy, false, "0c010203 00000000"),
        (RmaRefusal::Invalid, true, "1c010204 00000000"),
    ];
    let rest = " 00000000 00000000 00000000 00000000";
    let nacks: Vec<(Wire, String)> = nacks
        .into_iter()
        .map(|(error, read, head)| {
            (
                Wire::RmaNack {
                    id: 0x0201,
                    read,
                    error,
                },
                format!("{head}{rest}"),
            )
        })
        .collect();
    cases.extend(nacks.iter().map(|(w, s)| (w.clone(), s.as_str())));
    check(&cases);
}

#[test]
fn atomic_messages_keep_their_bytes() {
    let request = |fetch| Wire::AtomicReq {
        key: TAG,
        addr: DATA,
        op: 0x21,
        datatype: 0x22,
        count: 0x23,
        id: 0x3231,
        fetch,
    };
    let full: Vec<u8> = (0..CHUNK_LEN as u8).map(|i| 0x50 + i).collect();
    check(&[
        (
            request(false),
            "0e010203 04050607 08111213 14151617 18212223 31320000",
        ),
        (
            request(true),
            "4e010203 04050607 08111213 14151617 18212223 31320000",
        ),
        (
            Wire::AtomicData {
                id: 0x0201,
                bytes: Chunk::new(&full),
            },
            "1e010214 50515253 54555657 58595a5b 5c5d5e5f 60616263",
        ),
        (
            Wire::AtomicData {
                id: 0x0201,
                bytes: Chunk::new(&[]),
            },
            "1e010200 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::AtomicResult {
                id: 0x0201,
                bytes: Chunk::new(&full[..3]),
            },
            "1f010203 50515200 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::AtomicReply {
                id: 0x0201,
                refusal: None,
            },
            "0f010200 00000000 00000000 00000000 00000000 00000000",
        ),
        (
            Wire::AtomicReply {
                id: 0x0201,
                refusal: Some(RmaRefusal::Invalid),
            },
            "0f010204 00000000 00000000 00000000 00000000 00000000",
        ),
    ]);
}

/// Bits a message does not use are ignored, not refused (a peer may set
/// them): these inputs decode, to what the codec has always made of them.
#[test]
fn unused_bits_are_ignored_as_before() {
    let cases: &[(&str, Wire)] = &[
        // A Hello with the high flags set.
        (
            "e1000000 00000000 00000000 00000000 00000000 00000000",
            Wire::Hello {
                node: [0; NODE_LEN],
                ring: 0,
                slot_shift: 0,
                slots: 0,
            },
        ),
        // A Params with every flag.
        (
            "f1010002 00000000 00000000 00000000 00000000 000000ff",
            Wire::Params {
                version: 1,
                id_bits: 2,
                fragment_size: 0,
                eager_size: 0,
            },
        ),
        // An InlineMore with tag and data flags too.
        (
            "f2404142 43444546 4748494a 4b4c4d4e 4f505152 53545556",
            Wire::InlineMore {
                payload: std::array::from_fn(|i| 0x40 + i as u8),
            },
        ),
        // A whole inline message's unused bytes past its payload.
        (
            "02013031 32333435 36373839 3a3b3c3d 3e3f4041 42434445",
            Wire::Inline {
                info: MatchInfo::default(),
                payload: InlineBytes::new(&[0x30]),
            },
        ),
        // An untagged inline message with a sizes byte: payload from byte 2.
        (
            "02021100 00000000 00000000 00000000 00000000 00000000",
            Wire::Inline {
                info: MatchInfo::default(),
                payload: InlineBytes::new(&[0x11, 0]),
            },
        ),
        // A tag of more bytes than its value needs.
        (
            "12000200 00000000 00000000 00000000 00000000 00000000",
            Wire::Inline {
                info: tag_data(Some(0), None),
                payload: InlineBytes::new(&[]),
            },
        ),
        // An Eager with flag 0x80, and bytes past its fields.
        (
            "83010200 0000ffff ffffffff ffffffff ffffffff ffffffff",
            Wire::Eager {
                info: MatchInfo::default(),
                len: 2,
                seq: 0,
                credits: 1,
                ack: None,
            },
        ),
        // An Rts with flags 0x40 and 0x80.
        (
            "c4000100 02000000 00000000 00000000 00000000 00000000",
            Wire::Rts {
                info: MatchInfo::default(),
                send_id: 1,
                len: 2,
                credits: 0,
            },
        ),
        // A Grant whose length has its token's bits: the token keeps them.
        (
            "05000100 00000000 00000000 00000000 ffffffff 00000000",
            Wire::Grant {
                send_id: 1,
                fragment: 0,
                addr: 0,
                len: (1 << 24) - 1,
                recv_id: 0,
                recv_gen: 0,
                token: 0xff00,
            },
        ),
        // A FragDone and a Fin with a non-zero pad byte.
        (
            "06ff0100 00000000 00000000 00000000 00000000 00000000",
            Wire::FragDone {
                send_id: 1,
                fragment: 0,
                recv_id: 0,
                recv_gen: 0,
            },
        ),
        (
            "97ff0100 00000000 00000000 00000000 00000000 00000000",
            Wire::Fin { send_id: 1 },
        ),
        // A Fin op with both LEN_HIGH and OFFER: a LenHigh.
        (
            "67000100 02000000 00000000 00000000 00000000 00000000",
            Wire::LenHigh {
                id: 1,
                read: false,
                high: 2,
            },
        ),
        // An Offer with the READ bit.
        (
            "57000100 02000300 00000000 00000000 00000000 00000000",
            Wire::Offer {
                send_id: 1,
                token: 2,
                addr: 3,
            },
        ),
        // A Credit with the high flags.
        (
            "c8050000 00000000 00000000 00000000 00000000 00000000",
            Wire::Credit { credits: 5 },
        ),
        // A Throttle with flag 0x40.
        (
            "58010000 00000000 00000000 00000000 00000000 00000000",
            Wire::Throttle { on: true },
        ),
        // RMA and atomic messages with flags they do not use.
        (
            "f9010000 00000000 00000000 00000000 00000000 00000000",
            Wire::RmaWrite {
                key: 1,
                addr: 0,
                len: 0,
                send_id: 0,
            },
        ),
        (
            "fb010002 00000000 00000000 00000000 00000000 00000000",
            Wire::ReadReady {
                send_id: 1,
                recv_id: 2,
            },
        ),
        (
            "ec010003 00000000 00000000 00000000 00000000 00000000",
            Wire::RmaNack {
                id: 1,
                read: false,
                error: RmaRefusal::Busy,
            },
        ),
        (
            "fd010000 00000000 00010000 00000000 00000000 00000000",
            Wire::RemoteNotice(AccessCounts {
                key: 1,
                reads: 1,
                writes: 0,
                updates: 0,
            }),
        ),
        (
            "ae000000 00000000 00000000 00000000 00000000 00000000",
            Wire::AtomicReq {
                key: 0,
                addr: 0,
                op: 0,
                datatype: 0,
                count: 0,
                id: 0,
                fetch: false,
            },
        ),
        (
            "fe010201 aaffffff ffffffff ffffffff ffffffff ffffffff",
            Wire::AtomicData {
                id: 0x0201,
                bytes: Chunk::new(&[0xaa]),
            },
        ),
        (
            "ef010203 00000000 00000000 00000000 00000000 000000ff",
            Wire::AtomicReply {
                id: 0x0201,
                refusal: Some(RmaRefusal::Busy),
            },
        ),
    ];
    for (bytes, wire) in cases {
        assert_eq!(
            Wire::decode(&message(bytes)).as_ref(),
            Some(wire),
            "{bytes}"
        );
    }
}

/// Inputs a peer may send that decode refuses.
#[test]
fn malformed_messages_are_refused_as_before() {
    let refused = [
        // No op, and op 0 with every flag.
        "00000000 00000000 00000000 00000000 00000000 00000000",
        "f0ffffff ffffffff ffffffff ffffffff ffffffff ffffffff",
        // Inline: longer than a message holds.
        "02170000 00000000 00000000 00000000 00000000 00000000",
        // Inline: a tag of nine bytes, data of nine.
        "12000900 00000000 00000000 00000000 00000000 00000000",
        "22009000 00000000 00000000 00000000 00000000 00000000",
        // Inline: tag and data that leave less room than the payload claims.
        "32068800 00000000 00000000 00000000 00000000 00000000",
        // Inline: a payload one byte past the capacity of its tag.
        "12150100 00000000 00000000 00000000 00000000 00000000",
        // InlineFirst: a length that fits one message, and one more than
        // its parts can carry.
        "82160000 00000000 00000000 00000000 00000000 00000000",
        "825c0000 00000000 00000000 00000000 00000000 00000000",
        // InlineFirst: tagged, no longer than its capacity.
        "92150100 00000000 00000000 00000000 00000000 00000000",
        // Cut: a wrong mark, and the right mark with another flag.
        "28756e69 6d435554 22000000 00000000 00000000 00000000",
        "38756e69 6d435554 21000000 00000000 00000000 00000000",
        "a8756e69 6d435554 21000000 00000000 00000000 00000000",
        // Throttle: neither 0 nor 1.
        "18020000 00000000 00000000 00000000 00000000 00000000",
        // RmaNack: no reason, and an unknown one.
        "0c010200 00000000 00000000 00000000 00000000 00000000",
        "1c010205 00000000 00000000 00000000 00000000 00000000",
        // RemoteNotice counting nothing.
        "1d010203 04050607 08000000 00000000 00000000 00000000",
        // Atomic chunks longer than a message holds.
        "1e010215 00000000 00000000 00000000 00000000 00000000",
        "1f0102ff 00000000 00000000 00000000 00000000 00000000",
        // AtomicReply: an unknown refusal.
        "0f010205 00000000 00000000 00000000 00000000 00000000",
    ];
    for bytes in refused {
        assert_eq!(Wire::decode(&message(bytes)), None, "{bytes}");
    }
}

/// Every first byte (op and flags) with bodies of random and of small
/// bytes (which make valid lengths, sizes and codes likely): what decode
/// makes of each, folded into one digest. It changes if decode accepts or
/// refuses one input differently, or reads a field differently.
#[test]
fn decode_of_many_inputs_is_unchanged() {
    let mut rng = Rng(0x756e_696d_656d_u64);
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut accepted = 0u32;
    for first in 0..=255u8 {
        for _ in 0..400 {
            let mut buf = [0u8; MESSAGE_LEN];
            buf[0] = first;
            for b in &mut buf[1..] {
                let r = rng.next_u64();
                *b = if r & 1 == 0 {
                    (r >> 8) as u8 % 9
                } else {
                    (r >> 8) as u8
                };
            }
            let decoded = Wire::decode(&buf);
            accepted += u32::from(decoded.is_some());
            for b in format!("{decoded:?}").bytes() {
                digest = (digest ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    assert_eq!((accepted, digest), (77781, 11035450832230816952));
}
