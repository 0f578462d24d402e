//! First contact: sizes adapted to, versions refused, a second hello
//! dropped; violations fence a peer, which is told.

use super::*;

/// Two endpoints configured with other eager and fragment sizes (as when
/// ranks read different configuration files) adapt to each other at first
/// contact: every size around both sides' thresholds arrives intact both
/// ways, and nothing is dropped as invalid.
#[test]
fn peers_with_other_sizes_adapt_at_first_contact() {
    let small = config();
    let large = ProtoConfig {
        eager_size: 4 * EAGER,
        fragment_size: 4 * FRAGMENT,
        ..config()
    };
    for (cfg_a, cfg_b) in [(small.clone(), large.clone()), (large, small)] {
        let mut a = messenger_with(64, cfg_a);
        let mut b = messenger_with(64, cfg_b);
        let sizes = [
            EAGER - 1,
            EAGER,
            EAGER + 1,
            4 * EAGER,
            4 * EAGER + 1,
            FRAGMENT + 3,
            4 * FRAGMENT + 1,
            9 * FRAGMENT + 7,
        ];
        // The first sends leave before either side heard of the other.
        for (round, &len) in sizes.iter().enumerate() {
            for (from_a, seed) in [(true, round as u8), (false, round as u8 + 100)] {
                let data = pattern(len, seed);
                let mut buf = vec![0u8; len];
                let (tx, rx) = if from_a {
                    (&mut a, &mut b)
                } else {
                    (&mut b, &mut a)
                };
                send(tx, rx.addr(), &data, Some(len as u64), 1).unwrap();
                post(rx, true, recv_spec(&mut buf, 2, None, len as u64, 0));
                let (t, r) = if from_a { (0, 1) } else { (1, 0) };
                let got = collect(&mut [&mut a, &mut b], r, 1);
                assert_eq!(recv_done(&got[0]).len, len, "{len} from_a={from_a}");
                assert!(buf == data, "{len} bytes from_a={from_a}: data differs");
                collect(&mut [&mut a, &mut b], t, 1);
            }
        }
        assert_eq!((a.dropped_messages(), b.dropped_messages()), (0, 0));
        assert_eq!((a.peers_lost(), b.peers_lost()), (0, 0));
    }
}

/// A peer of another protocol version, or one that says hello without its
/// parameters (version 1), is refused: what we post to it fails with an
/// error, a directed receive from it fails, its messages are dropped; other
/// peers are untouched.
#[test]
fn a_peer_of_another_version_is_refused() {
    let mut a = messenger();
    let mut b = messenger();
    for params in [true, false] {
        let mut first = Vec::new();
        if params {
            first.push(Wire::Params {
                version: crate::wire::PROTOCOL_VERSION + 1,
                id_bits: crate::wire::ID_BITS,
                fragment_size: FRAGMENT as u32,
                eager_size: EAGER as u32,
            });
        }
        first.push(Wire::Hello {
            node: [0; crate::wire::NODE_LEN],
            ring: 0,
            slot_shift: 10,
            slots: 0,
        });
        first.push(Wire::Inline {
            info: MatchInfo::default(),
            payload: crate::wire::InlineBytes::new(b"not for you"),
        });
        let rogue = forge(a.addr(), &first);
        let rogue_addr = {
            use unimem_mailbox::Mailbox as _;
            rogue.addr()
        };
        let mut buf = [0u8; 64];
        post(
            &mut a,
            false,
            recv_spec(&mut buf, 9, Some(rogue_addr), 0, 0),
        );
        let lost = a.peers_lost();
        let got = collect(&mut [&mut a], 0, 1);
        let error = error_of(&got[0]);
        assert_eq!((error.context, error.kind), (9, ErrorKind::PeerUnreachable));
        assert_eq!(a.peers_lost(), lost + 1);
        assert_eq!(
            send(&mut a, rogue_addr, &[1; 100], None, 3),
            Err(PostError::Unreachable)
        );
        // Its inline message was not delivered; b still talks to a.
        let mut any = [0u8; 100];
        post(&mut a, false, recv_spec(&mut any, 10, None, 0, 0));
        let data = pattern(100, 3);
        send(&mut b, a.addr(), &data, None, 4).unwrap();
        let got = collect(&mut [&mut a, &mut b], 0, 1);
        assert_eq!(recv_done(&got[0]).context, 10);
        assert!(any[..] == data[..]);
        collect(&mut [&mut a, &mut b], 1, 1);
    }
}

/// An eager announcement that names no slot we expect (out of sequence),
/// or claims more than an eager message holds, is dropped: the ring does
/// not shift, and every later eager message of that peer arrives intact.
#[test]
fn a_stray_eager_announcement_does_not_shift_the_ring() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let a_addr = a.addr();
    for round in 0..20u8 {
        // As if a had sent it: the source the mailbox reports.
        let seq = (round + 7) % crate::wire::EAGER_SEQ_MOD;
        let stray = Wire::Eager {
            info: MatchInfo::default(),
            len: if round % 2 == 0 {
                64
            } else {
                10 * EAGER as u32
            },
            seq,
            credits: 0,
            ack: None,
        };
        if round % 4 == 1 {
            b.dispatch(a_addr, &stray.encode());
        }
        let len = EAGER - round as usize;
        let data = pattern(len, round);
        let mut buf = vec![0u8; len];
        post(&mut b, false, recv_spec(&mut buf, 1, None, 0, 0));
        send(&mut a, b.addr(), &data, None, 2).unwrap();
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        assert_eq!(recv_done(&got[0]).len, len);
        assert!(buf == data, "round {round}: data differs");
        collect(&mut [&mut a, &mut b], 0, 1);
    }
    assert_eq!(b.dropped_messages(), 5);
    assert_eq!(b.peers_lost(), 0, "a few strays do not fence the peer");
}

/// A second Hello or a second set of parameters from a peer that already
/// made first contact is dropped: its node and ring stay what they were.
#[test]
fn a_second_hello_is_dropped() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let a_addr = a.addr();
    b.dispatch(
        a_addr,
        &Wire::Hello {
            node: [7; crate::wire::NODE_LEN],
            ring: 0x1000,
            slot_shift: 10,
            slots: 4,
        }
        .encode(),
    );
    b.dispatch(
        a_addr,
        &Wire::Params {
            version: crate::wire::PROTOCOL_VERSION,
            id_bits: crate::wire::ID_BITS,
            fragment_size: 1 << 20,
            eager_size: 1 << 20,
        }
        .encode(),
    );
    assert_eq!(b.dropped_messages(), 2);
    // Eager and rendezvous from b to a still use a's real ring and node.
    for len in [EAGER, 3 * FRAGMENT + 1] {
        let data = pattern(len, 9);
        let mut buf = vec![0u8; len];
        post(&mut a, false, recv_spec(&mut buf, 1, None, 0, 0));
        send(&mut b, a_addr, &data, None, 2).unwrap();
        let got = collect(&mut [&mut a, &mut b], 0, 1);
        assert_eq!(recv_done(&got[0]).len, len);
        assert!(buf == data);
        collect(&mut [&mut a, &mut b], 1, 1);
    }
}

/// A peer that keeps sending invalid messages is fenced: after
/// `FENCE_AFTER` of them its operations fail and its messages are dropped;
/// other peers are untouched.
#[test]
fn repeated_violations_fence_the_peer() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let forged: Vec<Wire> = (0..FENCE_AFTER as u16)
        .map(|id| Wire::Fin { send_id: 100 + id })
        .collect();
    let rogue = forge(a.addr(), &forged);
    let rogue_addr = {
        use unimem_mailbox::Mailbox as _;
        rogue.addr()
    };
    let mut buf = [0u8; 8];
    post(
        &mut a,
        false,
        recv_spec(&mut buf, 5, Some(rogue_addr), 0, 0),
    );
    let got = collect(&mut [&mut a], 0, 1);
    assert_eq!(error_of(&got[0]).context, 5);
    assert_eq!(a.dropped_messages(), u64::from(FENCE_AFTER));
    assert_eq!(
        send(&mut a, rogue_addr, b"x", None, 1),
        Err(PostError::Unreachable)
    );
    first_contact(&mut a, &mut b);
}

/// A fenced peer may be innocent (another process broke its memory): the
/// fencing side tells it with one `Cut`, and what it waits for from that
/// side (a directed receive, a rendezvous send the other never matched)
/// fails instead of waiting for ever; so do its later operations.
#[test]
fn a_fenced_peer_is_told_and_stops_waiting() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let (a_addr, b_addr) = (a.addr(), b.addr());
    let mut buf = [0u8; 8];
    post(&mut b, false, recv_spec(&mut buf, 1, Some(a_addr), 0, 0));
    let big = pattern(3 * FRAGMENT, 5);
    send(&mut b, a_addr, &big, None, 2).unwrap();
    for _ in 0..50 {
        a.progress();
        b.progress();
    }
    assert!(b.next_event().is_none(), "b waits on a");

    let peer = a.known_peer(&b_addr).expect("a knows b");
    a.fence(peer);
    let got = collect(&mut [&mut b, &mut a], 0, 2);
    let mut failed: Vec<_> = got
        .iter()
        .map(|e| (error_of(e).context, error_of(e).kind))
        .collect();
    failed.sort_unstable_by_key(|&(c, _)| c);
    assert_eq!(
        failed,
        [
            (1, ErrorKind::PeerUnreachable),
            (2, ErrorKind::PeerUnreachable)
        ]
    );
    assert!(b.lost(&a_addr) && a.lost(&b_addr));
    assert_eq!(
        send(&mut b, a_addr, b"x", None, 3),
        Err(PostError::Unreachable)
    );
}

/// A `Cut` from a process never spoken to fails nothing and adds no peer;
/// stray bytes do not make one (its body is a fixed mark).
#[test]
fn a_cut_from_a_stranger_or_with_a_wrong_mark_is_ignored() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let stranger = forge(a.addr(), &[Wire::Cut]);
    let stranger_addr = {
        use unimem_mailbox::Mailbox as _;
        stranger.addr()
    };
    for _ in 0..10 {
        a.progress();
    }
    assert!(a.known_peer(&stranger_addr).is_none());
    assert_eq!(a.peers_lost(), 0);

    let mut wrong = Wire::Cut.encode();
    wrong[5] ^= 1;
    assert_eq!(Wire::decode(&wrong), None);
    a.dispatch(b.addr(), &wrong);
    assert_eq!((a.peers_lost(), a.dropped_messages()), (0, 1));
    first_contact(&mut a, &mut b);
}

/// Malformed messages alone (no operation decodes) count as violations
/// too: the peer that sends only those is fenced after `FENCE_AFTER`.
#[test]
fn a_peer_sending_only_malformed_messages_is_fenced() {
    let mut a = messenger();
    let rogue = forge(a.addr(), &[]);
    let rogue_addr = {
        use unimem_mailbox::Mailbox as _;
        rogue.addr()
    };
    for _ in 0..FENCE_AFTER - 1 {
        a.dispatch(rogue_addr, &[0; 24]);
    }
    assert!(!a.lost(&rogue_addr));
    a.dispatch(rogue_addr, &[0; 24]);
    assert!(a.lost(&rogue_addr));
    assert_eq!(a.dropped_messages(), u64::from(FENCE_AFTER));
}
