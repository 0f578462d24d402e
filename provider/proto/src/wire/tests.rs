//! The wire module's tests across families: every message round trips,
//! the doc table is the declarations, and each declaration is what its
//! encoder writes. Each family's own tests sit in its file.

use super::*;

/// Match information of every shape: none, zeros, every byte, sparse.
pub(super) fn infos() -> [MatchInfo; 7] {
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

/// One message or more of every kind, with every flag combination in
/// use and field values at their ends.
pub(super) fn samples() -> Vec<Wire> {
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
    all
}

#[test]
fn every_message_round_trips() {
    for message in samples() {
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
        5, 2, 2, 1, 7, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 9, 0, 0, 3, 10, 0,
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

#[test]
fn no_op_is_refused() {
    assert_eq!(Wire::decode(&[0; MESSAGE_LEN]), None);
    // An `AtomicReply` of refusal 0x0f, which is none.
    assert_eq!(Wire::decode(&[0x0f; MESSAGE_LEN]), None);
}

/// The module doc's table, rendered from the declarations.
fn rendered_table() -> Vec<String> {
    let mut lines = vec![
        "| message | op + flags | fields after byte 0 |".to_string(),
        "|---------|------------|---------------------|".to_string(),
    ];
    for layout in LAYOUTS.iter().copied().flatten() {
        let mut op = format!("`{}` ({})", layout.op.0, layout.op.1);
        for (name, bit) in layout.flags {
            op += &format!(" + `{name}` ({bit:#04x})");
        }
        let note = match layout.note {
            "" => String::new(),
            note => format!(" ({note})"),
        };
        lines.push(format!(
            "| {} | {op} | {}{note} |",
            layout.name, layout.fields
        ));
    }
    lines
}

#[test]
fn the_doc_table_is_the_declarations() {
    let doc: Vec<String> = include_str!("mod.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! |"))
        .map(|row| format!("|{row}"))
        .collect();
    let rendered = rendered_table();
    assert!(
        doc == rendered,
        "the table of wire/mod.rs should read:\n{}",
        rendered
            .iter()
            .map(|row| format!("//! {row}\n"))
            .collect::<String>()
    );
}

/// Records the width of each field an encoder writes.
struct Widths(Vec<usize>);

impl Put for Widths {
    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.push(bytes.len());
        self
    }
}

/// A declaration's fields: the width of each (`None`: it varies), and
/// whether it is optional (in brackets).
fn declared_widths(fields: &str) -> Vec<(Option<usize>, bool)> {
    let width = |part: &str| match part.rsplit(' ').next().unwrap() {
        "u8" => Some(1),
        "u16" => Some(2),
        "u24" => Some(3),
        "u32" => Some(4),
        "u64" => Some(8),
        array => {
            let n = part.split("[u8; ").nth(1).map(|n| n.trim_end_matches(']'));
            assert!(array.ends_with(']') && n.is_some(), "{part}: which type?");
            n.unwrap().parse().ok()
        }
    };
    fields
        .split(", ")
        .map(|field| {
            let optional = field.starts_with('[');
            let field = if optional {
                &field[1..field.len() - 1]
            } else {
                field
            };
            let parts: Option<Vec<usize>> = field.split(" + ").map(width).collect();
            (parts.map(|p| p.iter().sum()), optional)
        })
        .collect()
}

/// Whether `written` (widths, byte 0 first) follows `declared`.
fn follows(declared: &[(Option<usize>, bool)], written: &[usize]) -> bool {
    let Some((1, mut written)) = written.split_first().map(|(op, rest)| (*op, rest)) else {
        return false;
    };
    for (width, optional) in declared {
        match written.split_first() {
            Some((w, rest)) if width.is_none_or(|width| width == *w) => written = rest,
            _ if *optional => {}
            _ => return false,
        }
    }
    written.is_empty()
}

/// Every sample message: its byte 0 carries its declaration's op and
/// flags, and (but for those `encode` writes by hand, pinned by their own
/// tests) its encoder writes the declared fields, width by width.
#[test]
fn every_encoder_follows_its_layout() {
    let layouts: Vec<&Layout> = LAYOUTS.iter().copied().flatten().collect();
    let mut seen = std::collections::HashSet::new();
    for message in samples() {
        let debug = format!("{message:?}");
        let name: String = debug
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        let layout = layouts
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no declaration of {name}"));
        seen.insert(layout.name);
        let first = message.encode()[0];
        assert_eq!(first & 0x0f, layout.op.1, "{debug}");
        for (flag, bit) in layout.flags {
            assert_eq!(first & bit, *bit, "{debug}: flag {flag}");
        }
        if matches!(
            message,
            Wire::Inline { .. } | Wire::InlineFirst { .. } | Wire::Eager { .. }
        ) {
            continue;
        }
        let mut written = Widths(Vec::new());
        message.put(&mut written);
        let declared = declared_widths(layout.fields);
        assert!(
            follows(&declared, &written.0),
            "{debug}: wrote {:?}, declared {}",
            written.0,
            layout.fields
        );
    }
    assert_eq!(seen.len(), layouts.len(), "a sample of every message");
}

/// The send path's encoders write what `Wire::encode` writes.
#[test]
fn send_path_encoders_match_encode() {
    let mut more = [0u8; MORE_LEN];
    for (i, b) in more.iter_mut().enumerate() {
        *b = i as u8 ^ 0x5a;
    }
    assert_eq!(
        Wire::encode_inline_more(&more),
        Wire::InlineMore { payload: more }.encode()
    );
    for info in infos() {
        let first = inline_capacity(&info);
        let bytes: Vec<u8> = (0..first as u8).collect();
        let payload = InlineBytes::new(&bytes);
        let len = (first + 10) as u8;
        assert_eq!(
            Wire::encode_inline_first(&info, len, &payload),
            Wire::InlineFirst { info, len, payload }.encode()
        );
        let whole = InlineBytes::new(&bytes[..first.min(3)]);
        assert_eq!(
            Wire::encode_inline(&info, &whole),
            Wire::Inline {
                info,
                payload: whole
            }
            .encode()
        );
        for ack in [None, Some(0x0102)] {
            assert_eq!(
                Wire::encode_eager(&info, 77, 5, 3, ack),
                Wire::Eager {
                    info,
                    len: 77,
                    seq: 5,
                    credits: 3,
                    ack
                }
                .encode()
            );
        }
    }
}
