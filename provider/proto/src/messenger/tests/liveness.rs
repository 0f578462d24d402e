//! Liveness: operations with a peer that dies fail, receives from anyone
//! fail when every peer is lost; and what is in flight is reported.

use super::*;

#[test]
fn receives_directed_at_a_peer_that_dies_fail() {
    let mut a = messenger_with(64, quick_peer_check());
    let mut b = messenger();
    let b_addr = b.addr();
    let mut first = [0u8; 4];
    post(&mut a, true, recv_spec(&mut first, 1, Some(b_addr), 7, 0));
    send(&mut b, a.addr(), b"knew", Some(7), 0).unwrap();
    assert_eq!(
        recv_done(&collect(&mut [&mut a, &mut b], 0, 1)[0]).context,
        1
    );

    let mut from_b = [0u8; 4];
    let mut from_any = [0u8; 4];
    post(&mut a, true, recv_spec(&mut from_b, 2, Some(b_addr), 8, 0));
    post(&mut a, true, recv_spec(&mut from_any, 3, None, 8, 0));
    drop(b);
    let failed = collect(&mut [&mut a], 0, 1);
    let error = error_of(&failed[0]);
    assert_eq!((error.context, error.kind), (2, ErrorKind::PeerUnreachable));
    assert_eq!(error.src, Some(b_addr));
    // A receive from any source may still be satisfied by someone else.
    assert_eq!(a.posted_receives(), 1);
    assert_eq!(a.peers_lost(), 1);

    // Later receives directed at the dead peer fail at once.
    let mut late = [0u8; 4];
    post(&mut a, false, recv_spec(&mut late, 4, Some(b_addr), 0, 0));
    let error = error_of(&a.next_event().expect("fails when posted")).clone();
    assert_eq!((error.context, error.kind), (4, ErrorKind::PeerUnreachable));
}

/// The same through a source found once (`known_peer_of`, then
/// `post_recv_from`), as the provider posts directed receives: unknown
/// until the peer is heard of, then good for every receive, the one that
/// waits when its peer dies and the one posted after.
#[test]
fn receives_from_a_source_found_once_fail_when_it_dies() {
    let mut a = messenger_with(64, quick_peer_check());
    let mut b = messenger();
    let b_addr = b.addr();
    assert_eq!(a.known_peer_of(&b_addr), None, "never heard of");
    let mut first = [0u8; 4];
    post(&mut a, true, recv_spec(&mut first, 1, Some(b_addr), 7, 0));
    let b_peer = a.known_peer_of(&b_addr).expect("looked up for the receive");
    let post_from = |a: &mut Shm, tagged, recv| {
        // SAFETY: the buffers outlive the receives (they complete or fail
        // below).
        unsafe { a.post_recv_from(tagged, recv, b_peer) }
    };
    let mut second = [0u8; 4];
    post_from(&mut a, true, recv_spec(&mut second, 2, None, 7, 0));
    for data in [b"one!", b"two!"] {
        send(&mut b, a.addr(), data, Some(7), 0).unwrap();
    }
    let got = collect(&mut [&mut a, &mut b], 0, 2);
    let done: Vec<_> = got
        .iter()
        .map(|e| (recv_done(e).context, recv_done(e).src))
        .collect();
    assert_eq!(done, [(1, b_addr), (2, b_addr)]);
    assert_eq!((&first, &second), (b"one!", b"two!"));

    let mut waiting = [0u8; 4];
    post_from(&mut a, true, recv_spec(&mut waiting, 3, None, 8, 0));
    drop(b);
    let error = error_of(&collect(&mut [&mut a], 0, 1)[0]).clone();
    assert_eq!((error.context, error.kind), (3, ErrorKind::PeerUnreachable));
    assert_eq!(error.src, Some(b_addr));
    let mut late = [0u8; 4];
    post_from(&mut a, false, recv_spec(&mut late, 4, None, 0, 0));
    let error = error_of(&a.next_event().expect("fails when posted")).clone();
    assert_eq!((error.context, error.kind), (4, ErrorKind::PeerUnreachable));
    assert_eq!(a.posted_receives(), 0);
}

#[test]
fn a_rendezvous_from_a_peer_that_died_fails_when_matched() {
    let mut a = messenger();
    let mut b = messenger_with(64, quick_peer_check());
    let big = pattern(4 * FRAGMENT, 3);
    send(&mut a, b.addr(), &big, Some(9), 1).unwrap();
    // The request arrives unexpected, then its sender dies.
    let deadline = Instant::now() + HANG_GUARD;
    let mut probe_buf = [0u8; 0];
    loop {
        a.progress();
        b.progress();
        b.peek(true, recv_spec(&mut probe_buf, 5, None, 9, 0), false, false);
        if matches!(b.next_event(), Some(Event::Recv(_))) {
            break;
        }
        assert!(Instant::now() < deadline, "the request never arrived");
    }
    drop(a);
    let deadline = Instant::now() + HANG_GUARD;
    while b.peers_lost() == 0 {
        b.progress();
        assert!(
            Instant::now() < deadline,
            "the dead sender was never noticed"
        );
    }
    let mut sink = vec![0u8; big.len()];
    post(&mut b, true, recv_spec(&mut sink, 6, None, 9, 0));
    let error = error_of(&b.next_event().expect("fails when matched")).clone();
    assert_eq!((error.context, error.kind), (6, ErrorKind::PeerUnreachable));
}

/// A receive directed at a peer that never sent anything fails once that
/// peer is gone: at once when it is gone before the receive is posted,
/// within the peer check when it dies after.
#[test]
fn a_directed_receive_from_a_silent_peer_that_dies_fails() {
    let mut a = messenger_with(64, quick_peer_check());
    let mut buf = [0u8; 16];

    let b = messenger();
    let b_addr = b.addr();
    drop(b);
    post(&mut a, false, recv_spec(&mut buf, 1, Some(b_addr), 0, 0));
    let error = error_of(&a.next_event().expect("fails when posted")).clone();
    assert_eq!((error.context, error.kind), (1, ErrorKind::PeerUnreachable));

    let c = messenger();
    let c_addr = c.addr();
    post(&mut a, true, recv_spec(&mut buf, 2, Some(c_addr), 5, 0));
    for _ in 0..100 {
        a.progress();
    }
    assert!(a.next_event().is_none(), "a live silent peer is not dead");
    let posted = Instant::now();
    drop(c);
    let got = collect(&mut [&mut a], 0, 1);
    let error = error_of(&got[0]);
    assert_eq!((error.context, error.kind), (2, ErrorKind::PeerUnreachable));
    assert!(posted.elapsed() < Duration::from_secs(5));
}

/// Once the provider finds nobody left who could send (`left_alone`),
/// receives from any source fail, posted before or after; a directed one
/// at a live peer does not exist then. A new peer ends it.
#[test]
fn receives_from_anyone_fail_when_every_peer_is_lost() {
    let mut a = messenger_with(64, quick_peer_check());
    assert_eq!(a.known_peers_lost(), None, "no peer yet");
    let mut b = messenger();
    let b_addr = b.addr();
    send(&mut b, a.addr(), b"hi", Some(1), 0).unwrap();
    let mut first = [0u8; 2];
    post(&mut a, true, recv_spec(&mut first, 1, None, 1, 0));
    collect(&mut [&mut a, &mut b], 0, 1);
    assert!(a.known_peers_lost() == Some(false) && !a.lost(&b_addr));

    let mut waiting = [0u8; 4];
    post(&mut a, true, recv_spec(&mut waiting, 2, None, 2, 0));
    drop(b);
    let deadline = Instant::now() + HANG_GUARD;
    while a.peers_lost() == 0 {
        assert!(Instant::now() < deadline, "b not found dead");
        a.progress();
    }
    assert!(a.lost(&b_addr) && a.known_peers_lost() == Some(true));
    assert_eq!(
        a.posted_receives(),
        1,
        "lost peers alone fail nothing from anyone"
    );
    a.left_alone();
    let error = error_of(&a.next_event().expect("failed")).clone();
    assert_eq!((error.context, error.kind), (2, ErrorKind::PeerUnreachable));
    assert_eq!(error.src, None);
    let mut late = [0u8; 4];
    post(&mut a, false, recv_spec(&mut late, 3, None, 0, 0));
    let error = error_of(&a.next_event().expect("fails when posted")).clone();
    assert_eq!((error.context, error.kind), (3, ErrorKind::PeerUnreachable));

    // Someone new can send again: receives wait for it.
    let mut c = messenger();
    send(&mut c, a.addr(), b"new", None, 0).unwrap();
    c.progress();
    let mut from_c = [0u8; 3];
    post(&mut a, false, recv_spec(&mut from_c, 4, None, 0, 0));
    let got = collect(&mut [&mut a, &mut c], 0, 1);
    assert_eq!(recv_done(&got[0]).context, 4);
    assert_eq!(&from_c, b"new");
    assert_eq!(a.known_peers_lost(), Some(false));
}

/// The peer check asks the provider to look for an audience only while a
/// receive from any source waits and no known peer lives.
#[test]
fn the_audience_check_is_due_only_for_a_receive_from_anyone_without_live_peers() {
    let mut a = messenger_with(64, quick_peer_check());
    let due_within = |a: &mut Shm| {
        let deadline = Instant::now() + Duration::from_millis(50);
        let mut due = false;
        while Instant::now() < deadline {
            a.progress();
            due |= a.audience_check_due();
        }
        due
    };
    assert!(!due_within(&mut a), "nothing posted");
    let mut buf = [0u8; 4];
    post(&mut a, false, recv_spec(&mut buf, 1, None, 0, 0));
    assert!(due_within(&mut a), "a receive from anyone, no peer");
    let mut b = messenger();
    send(&mut b, a.addr(), b"hi", Some(3), 0).unwrap();
    collect(&mut [&mut a, &mut b], 0, 0);
    for _ in 0..100 {
        a.progress();
        b.progress();
    }
    assert_eq!(a.known_peers_lost(), Some(false));
    assert!(!due_within(&mut a), "a live peer");
    a.left_alone();
    assert!(matches!(a.next_event(), Some(Event::Error(_))));
    assert!(!due_within(&mut a), "nothing posted from anyone any more");
}

/// What a messenger has in flight names the waiting send, its kind and
/// its peer, and the receiver's held message; nothing once both are done.
#[test]
fn in_flight_names_what_waits_and_nothing_after() {
    let mut a = messenger();
    let mut b = messenger();
    assert_eq!(a.in_flight(), None);
    let len = 3 * FRAGMENT;
    let data = pattern(len, 4);
    send(&mut a, b.addr(), &data, None, 7).unwrap();
    a.progress();
    let sender = a.in_flight().expect("a send in flight");
    assert!(sender.starts_with("1 sends"), "{sender}");
    assert!(
        sender.contains(&format!("message of {len} B to {}", b.addr())),
        "{sender}"
    );
    assert!(sender.contains("rendezvous"), "{sender}");
    let deadline = Instant::now() + HANG_GUARD;
    while b.matcher.unexpected_len() == 0 {
        assert!(Instant::now() < deadline, "the request never came");
        a.progress();
        b.progress();
    }
    let receiver = b.in_flight().expect("a message held");
    assert!(
        receiver.contains("1 unexpected messages held"),
        "{receiver}"
    );
    let mut buf = vec![0u8; len];
    post(&mut b, false, recv_spec(&mut buf, 8, None, 0, 0));
    collect(&mut [&mut a, &mut b], 1, 1);
    collect(&mut [&mut a, &mut b], 0, 1);
    assert!(buf == data);
    assert_eq!(a.in_flight(), None);
    assert_eq!(b.in_flight(), None);
}
