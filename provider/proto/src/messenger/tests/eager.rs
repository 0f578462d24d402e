//! Inline and eager messages: injects, messages in inline parts, eager
//! data stored into the receiver's slot within the call, and the small
//! paths' allocations.

use super::*;

/// An inject reports a send event without a CQ entry (`completion` false),
/// so that send counters count it (fabtests' fi_rdm_cntr_pingpong waits for
/// the tx counter to include its injects), and rejects what exceeds the
/// inject size.
#[test]
fn inject_counts_without_a_completion_and_rejects_large() {
    let mut a = messenger();
    let mut b = messenger();
    let data = pattern(500, 1);
    inject(&mut a, &mut b, &data);
    let big = pattern(EAGER + 1, 1);
    let req_big = SendReq {
        inject: true,
        ..send_req(b.addr(), big.as_ptr(), big.len())
    };
    // SAFETY: as above.
    assert_eq!(unsafe { a.send(req_big) }, Err(PostError::TooLong));
    let mut buf = vec![0u8; 500];
    post(&mut b, false, recv_spec(&mut buf, 1, None, 0, 0));
    collect(&mut [&mut a, &mut b], 1, 1);
    assert!(buf == data);
    let sent = collect(&mut [&mut a, &mut b], 0, 1);
    assert!(
        matches!(
            sent[0],
            Event::Send {
                completion: false,
                ..
            }
        ),
        "{sent:?}"
    );
    for _ in 0..10 {
        a.progress();
    }
    assert!(a.next_event().is_none());
}

/// Injects of every path (inline, inline refused while the mailbox is full
/// and retried, eager) each report exactly one send event, in order, with
/// no CQ entry.
#[test]
fn every_inject_is_counted_once() {
    let mut a = messenger();
    let mut b = messenger_with(4, config());
    let small = pattern(8, 2);
    let medium = pattern(500, 3);
    let n = 12;
    for i in 0..n {
        let data = if i % 3 == 2 { &medium } else { &small };
        inject(&mut a, &mut b, data);
    }
    let mut bufs = vec![vec![0u8; 500]; n];
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    collect(&mut [&mut a, &mut b], 1, n);
    let sent = collect(&mut [&mut a, &mut b], 0, n);
    assert!(sent.iter().all(|e| matches!(
        e,
        Event::Send {
            completion: false,
            ..
        }
    )));
    for _ in 0..10 {
        a.progress();
        b.progress();
    }
    assert!(a.next_event().is_none());
    assert!(!a.busy());
}

/// An inject has no completion to wait for, so the sender may never call in
/// again after it: with the paper model's DMA still "in flight" when the
/// call returns, the message must leave within the call all the same.
#[test]
fn injects_leave_within_the_call_even_with_modeled_dma() {
    let mut a = messenger_profile(64, config(), Profile::Paper);
    let mut b = messenger_profile(64, config(), Profile::Paper);
    // First contact: hellos both ways, with both progressing.
    let first = pattern(100, 1);
    let mut buf = vec![0u8; 100];
    post(&mut b, false, recv_spec(&mut buf, 0, None, 0, 0));
    send(&mut a, b.addr(), &first, None, 0).unwrap();
    collect(&mut [&mut a, &mut b], 1, 1);
    collect(&mut [&mut a, &mut b], 0, 1);

    let lens = [10, 64, 1000, EAGER];
    let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, 10 + i, None, 0, 0));
    }
    for (i, &len) in lens.iter().enumerate() {
        let data = pattern(len, 20 + i as u8);
        let req = SendReq {
            inject: true,
            ..send_req(b.addr(), data.as_ptr(), len)
        };
        // SAFETY: data is live during the call; inject copies it.
        unsafe { a.send(req) }.unwrap();
    }
    // Only the receiver progresses from here on.
    let got = collect(&mut [&mut b], 0, lens.len());
    assert_eq!(got.len(), lens.len());
    for (i, buf) in bufs.iter().enumerate() {
        assert!(
            *buf == pattern(lens[i], 20 + i as u8),
            "inject {i} of {} bytes",
            lens[i]
        );
    }
}

#[test]
fn tag_and_data_arrive_intact_around_the_inline_limit() {
    let mut a = messenger();
    let mut b = messenger();
    // MPICH's shape: protocol bits at the top of the tag, the rank as data.
    let info = MatchInfo {
        tag: Some(0x8000_0000_0012_3456),
        data: Some(3),
    };
    let limit = inline_capacity(&info);
    for (i, len) in [0, limit - 1, limit, limit + 1, limit + 9]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        let mut buf = vec![0u8; len];
        post(
            &mut b,
            true,
            recv_spec(&mut buf, 200 + i, None, info.tag.unwrap(), 0),
        );
        let req = SendReq {
            info,
            context: i,
            ..send_req(b.addr(), data.as_ptr(), data.len())
        };
        // SAFETY: `data` outlives the send, which completes below.
        unsafe { a.send(req) }.unwrap();
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        let done = recv_done(&got[0]);
        assert_eq!(
            (done.len, done.tag, done.data),
            (len, info.tag.unwrap(), info.data),
            "size {len}"
        );
        assert!(buf == data, "data of a {len}-byte message differs");
        collect(&mut [&mut a, &mut b], 0, 1);
    }
}

/// Messages in parts: every length a tag and CQ data leave them, sent
/// while the receiver's mailbox is full (so parts wait in the queue, the
/// rest of the traffic behind them), arrive whole and in order; parts that
/// fit no message are dropped.
#[test]
fn messages_in_parts_arrive_whole_and_in_order() {
    let mut a = messenger();
    let mut b = messenger_with(4, config());
    let infos = [
        MatchInfo::default(),
        MatchInfo {
            tag: Some(0x1234_5678_9abc),
            data: Some(7),
        },
    ];
    let mut expected = Vec::new();
    let mut context = 0;
    for info in infos {
        let cap = inline_capacity(&info);
        for len in [
            cap + 1,
            cap + MORE_LEN,
            cap + MORE_LEN + 1,
            a.parted_capacity(&info),
        ] {
            let data = pattern(len, context as u8);
            let req = SendReq {
                info,
                context,
                inject: true,
                ..send_req(b.addr(), data.as_ptr(), len)
            };
            // SAFETY: an inject copies its data.
            unsafe { a.send(req) }.unwrap();
            expected.push((context, info, data));
            context += 1;
        }
    }
    for (context, info, data) in &expected {
        let mut buf = vec![0u8; data.len() + 3];
        post(
            &mut b,
            info.tag.is_some(),
            recv_spec(
                &mut buf,
                100 + context,
                Some(a.addr()),
                info.tag.unwrap_or(0),
                0,
            ),
        );
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        let done = recv_done(&got[0]);
        assert_eq!(
            (done.context, done.len, done.data),
            (100 + context, data.len(), info.data)
        );
        assert!(buf[..data.len()] == data[..], "message {context}");
    }
    assert_eq!(b.dropped_messages(), 0);

    // A continuation with no first part, a first part left unfinished and
    // a continuation too many: dropped, and the next message is whole.
    let more = Wire::InlineMore {
        payload: [9; MORE_LEN],
    };
    let first = Wire::InlineFirst {
        info: MatchInfo::default(),
        len: 40,
        payload: crate::wire::InlineBytes::new(&[1; 22]),
    };
    let mut c = messenger();
    let rogue = forge(c.addr(), &rogue_first_contact());
    for _ in 0..100 {
        c.progress();
    }
    let before = c.dropped_messages();
    {
        use unimem_mailbox::Mailbox as _;
        let route = rogue.connect(&c.addr()).unwrap();
        for m in [more.clone(), first.clone(), first, more.clone(), more] {
            rogue.send(&route, &m.encode()).unwrap();
        }
    }
    for _ in 0..100 {
        c.progress();
    }
    // The stray continuation, the unfinished first part, and the
    // continuation after the second message was whole; the second first
    // part replaced the first and was finished by one continuation.
    assert_eq!(c.dropped_messages(), before + 3);
    let mut buf = vec![0u8; 40];
    post(&mut c, false, recv_spec(&mut buf, 1, None, 0, 0));
    let got = collect(&mut [&mut c], 0, 1);
    assert_eq!(recv_done(&got[0]).len, 40);
    assert!(buf[..22].iter().all(|&x| x == 1) && buf[22..].iter().all(|&x| x == 9));
}

/// Once the peers know each other and the queues have grown to their
/// working size, a message allocates nothing on either side: tagged
/// inline injects and sends with CQ data (what MPI sends for small
/// messages), eager sends and FI_INJECT eager sends, their receives, the
/// progress that carries them and the events that complete them.
/// Eager data to a peer of this host is stored into its slot by the CPU,
/// not put by DMA: when the send call returns, no DMA of ours is in
/// flight, no bounce buffer is held, and the message (data and
/// announcement) is at the receiver, whose next progress delivers it.
#[test]
fn eager_data_is_stored_into_the_slot_within_the_call() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let bounce = a.bounce_pool.available();
    let stored = a.stats.stored;
    let eager = a.cfg.eager_size;
    for (len, inject, copy) in [
        (100, true, false),
        (eager, true, false),
        (eager / 2, false, true),
        (eager - 1, false, false),
    ] {
        let data = pattern(len, len as u8);
        let mut buf = vec![0u8; len];
        post(&mut b, false, recv_spec(&mut buf, 7, None, 0, 0));
        let req = SendReq {
            inject,
            copy,
            ..send_req(b.addr(), data.as_ptr(), len)
        };
        // SAFETY: data outlives the send, which completes below.
        unsafe { a.send(req) }.unwrap();
        assert!(a.dma_waiters.is_empty(), "{len}: a DMA in flight");
        assert_eq!(
            a.bounce_pool.available(),
            bounce,
            "{len}: a bounce buffer held"
        );
        b.progress();
        let got = b.next_event();
        assert!(
            matches!(&got, Some(Event::Recv(done)) if done.len == len),
            "{len}: delivered on the receiver's first progress: {got:?}"
        );
        assert_eq!(buf, data, "{len}: data");
        a.progress();
    }
    assert_eq!(a.stats.stored - stored, 4, "every message's data stored");
}

/// A message that fits a few mailbox messages is stored into its eager
/// slot once the peers know each other and a slot is free (one message,
/// not the parts), and goes in parts otherwise: before first contact,
/// with every credit spent, or where stores are not preferred (the paper
/// profile). Each arrives whole.
#[test]
fn a_message_that_fits_in_parts_is_stored_where_a_slot_is_free() {
    let check = |store_before_parts: bool| {
        let cfg = ProtoConfig {
            store_before_parts,
            ..config()
        };
        let mut a = messenger_with(64, cfg.clone());
        let mut b = messenger_with(64, cfg);
        let len = a.parted_capacity(&MatchInfo::default());
        assert!(len > inline_capacity(&MatchInfo::default()) + MORE_LEN);
        // Before first contact: in parts (no ring to store into).
        let stored = a.stats.stored;
        let data = pattern(len, 1);
        let mut buf = vec![0u8; len];
        post(&mut b, false, recv_spec(&mut buf, 1, None, 0, 0));
        send(&mut a, b.addr(), &data, None, 1).unwrap();
        collect(&mut [&mut a, &mut b], 1, 1);
        assert_eq!(buf, data);
        assert_eq!(a.stats.stored, stored, "stored before first contact");
        first_contact(&mut b, &mut a);
        // Contact made: stored while credits last (4), then in parts; the
        // receiver takes nothing meanwhile.
        let stored = a.stats.stored;
        let data: Vec<Vec<u8>> = (0..6).map(|i| pattern(len, 10 + i)).collect();
        let mut bufs: Vec<Vec<u8>> = data.iter().map(|_| vec![0u8; len]).collect();
        for (i, d) in data.iter().enumerate() {
            let req = SendReq {
                inject: true,
                context: 20 + i,
                ..send_req(b.addr(), d.as_ptr(), len)
            };
            // SAFETY: an inject's data is copied within the call.
            unsafe { a.send(req) }.unwrap();
        }
        for (i, buf) in bufs.iter_mut().enumerate() {
            post(&mut b, false, recv_spec(buf, 30 + i, None, 0, 0));
        }
        let got = collect(&mut [&mut a, &mut b], 1, data.len());
        let mut order: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
        order.sort_unstable();
        assert_eq!(order, (30..36).collect::<Vec<_>>());
        assert_eq!(bufs, data);
        a.stats.stored - stored
    };
    assert_eq!(check(true), 4, "stored while a slot was free");
    assert_eq!(check(false), 0, "stored where parts are preferred");
}

/// An inject stored into its slot sends its announcement at once; when
/// the receiver's mailbox is full, the announcement waits in order behind
/// nothing else and leaves with the next progress, carrying the slot's
/// sequence number it was given: every message arrives whole and in order.
#[test]
fn stored_injects_wait_for_a_full_mailbox_in_order() {
    let mut a = messenger();
    let mut b = messenger_with(2, config());
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let len = 100;
    let stored = a.stats.stored;
    let data: Vec<Vec<u8>> = (0..4).map(|i| pattern(len, 40 + i)).collect();
    for (i, d) in data.iter().enumerate() {
        let req = SendReq {
            inject: true,
            context: 50 + i,
            info: MatchInfo {
                tag: Some(7),
                ..MatchInfo::default()
            },
            ..send_req(b.addr(), d.as_ptr(), len)
        };
        // SAFETY: an inject's data is copied within the call.
        unsafe { a.send(req) }.unwrap();
    }
    assert_eq!(a.stats.stored - stored, 4, "every inject stored at once");
    // Two announcements fit b's mailbox; two wait at a.
    let peer = a.known_peer(&b.addr()).expect("b is a's peer");
    assert_eq!(a.peers[peer].data.len(), 2, "announcements waiting");
    let mut bufs: Vec<Vec<u8>> = data.iter().map(|_| vec![0u8; len]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, true, recv_spec(buf, 60 + i, Some(a.addr()), 7, 0));
    }
    let got = collect(&mut [&mut a, &mut b], 1, data.len());
    let order: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
    assert_eq!(order, vec![60, 61, 62, 63]);
    assert_eq!(bufs, data);
}

#[test]
fn small_and_eager_messages_allocate_nothing() {
    use crate::counting_alloc::allocations;

    // Peers checked at every look: the check is on the same polls.
    let cfg = ProtoConfig {
        peer_check: Some(Duration::ZERO),
        ..config()
    };
    let mut a = messenger_with(64, cfg.clone());
    let mut b = messenger_with(64, cfg);
    first_contact(&mut a, &mut b);
    let data = pattern(EAGER, 3);
    let mut buf = vec![0u8; EAGER];
    let info = MatchInfo {
        tag: Some(0x1234_5678_9abc),
        data: Some(1),
    };
    let mut round = |a: &mut Shm, b: &mut Shm| {
        for (len, inject, copy) in [
            (8, true, false),
            (8, false, false),
            // In parts.
            (72, true, false),
            (500, false, false),
            (500, false, true),
        ] {
            post(b, true, recv_spec(&mut buf, 1, None, info.tag.unwrap(), 0));
            let req = SendReq {
                info,
                inject,
                copy,
                ..send_req(b.addr(), data.as_ptr(), len)
            };
            // SAFETY: data outlives the send, which completes below.
            unsafe { a.send(req) }.unwrap();
            let (mut sent, mut received) = (0, 0);
            let deadline = Instant::now() + HANG_GUARD;
            while sent == 0 || received == 0 {
                assert!(Instant::now() < deadline, "message {len} never completed");
                a.progress();
                b.progress();
                while let Some(event) = a.next_event() {
                    assert!(matches!(event, Event::Send { .. }), "{event:?}");
                    sent += 1;
                }
                while let Some(event) = b.next_event() {
                    assert_eq!(recv_done(&event).len, len);
                    received += 1;
                }
            }
        }
    };
    for _ in 0..100 {
        round(&mut a, &mut b);
    }
    let probe = allocations();
    drop(std::hint::black_box(vec![0u8; 16]));
    assert_eq!(allocations(), probe + 1, "the count works");
    let before = allocations();
    for _ in 0..1000 {
        round(&mut a, &mut b);
    }
    assert_eq!(allocations() - before, 0, "allocations in 4000 messages");
}

/// Injects that wait for a credit keep their data in spare copies, reused
/// from one round to the next: each arrives whole and exactly as long as it
/// was, though the copy it waited in held a longer message before.
#[test]
fn queued_injects_reuse_their_copies_and_arrive_whole() {
    let mut a = messenger();
    let mut b = messenger();
    let mut sent = Vec::new();
    // Longer than any inline message, no longer than a spare copy; each
    // round shorter than the last, and more than the credits (4) per round.
    for (round, len) in [250usize, 200, 120, 60].into_iter().enumerate() {
        for i in 0..8 {
            let data = pattern(len - i, (round * 8 + i) as u8);
            inject(&mut a, &mut b, &data);
            sent.push(data);
        }
        for _ in 0..20 {
            a.progress();
            b.progress();
        }
    }
    let mut bufs = vec![vec![0u8; 300]; sent.len()];
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    for event in collect(&mut [&mut a, &mut b], 1, sent.len()) {
        let done = recv_done(&event);
        assert_eq!(
            done.len,
            sent[done.context].len(),
            "message {}",
            done.context
        );
        assert_eq!(bufs[done.context][..done.len], sent[done.context][..]);
        assert!(bufs[done.context][done.len..].iter().all(|&x| x == 0));
    }
}

/// A send that is not an inject, stored into the receiver's slot within its
/// call, completes there: its event waits before any progress, its buffer
/// may be overwritten at once, and the receiver gets the data as it was.
/// One asking for delivery completion is stored too, but waits for the
/// receiver's acknowledgement.
#[test]
fn sends_stored_within_their_call_complete_there() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let len = 100;
    let data = pattern(len, 9);
    let mut user = data.clone();
    let stored = a.stats.stored;
    let req = SendReq {
        context: 5,
        ..send_req(b.addr(), user.as_ptr(), len)
    };
    // SAFETY: user is live during the call, and (the send being complete
    // when it returns, as checked next) no longer read after it.
    unsafe { a.send(req) }.unwrap();
    assert_eq!(a.stats.stored - stored, 1, "stored within the call");
    assert!(
        matches!(
            a.next_event(),
            Some(Event::Send {
                context: 5,
                completion: true,
                ..
            })
        ),
        "complete before any progress"
    );
    user.fill(0xee);
    let ack_data = pattern(len, 10);
    let ack_req = SendReq {
        context: 6,
        delivery_complete: true,
        ..send_req(b.addr(), ack_data.as_ptr(), len)
    };
    // SAFETY: ack_data outlives the send's completion, collected below.
    unsafe { a.send(ack_req) }.unwrap();
    assert_eq!(a.stats.stored - stored, 2, "stored within the call");
    assert!(a.next_event().is_none(), "waits for the acknowledgement");
    let mut bufs = [vec![0u8; len], vec![0u8; len]];
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    collect(&mut [&mut a, &mut b], 1, 2);
    assert_eq!(bufs[0], data, "the data as it was at the call");
    assert_eq!(bufs[1], ack_data);
    let sent = collect(&mut [&mut a, &mut b], 0, 1);
    assert!(
        matches!(sent[0], Event::Send { context: 6, .. }),
        "{sent:?}"
    );
}
