//! Two-sided messages: every size around every threshold, order of
//! unexpected messages, tags, credits, posting that never waits for the
//! peer, truncation, multi-receive buffers, cancel, peek.

use super::*;

#[test]
fn every_size_around_every_threshold_arrives_intact() {
    let mut a = messenger();
    let mut b = messenger();
    let inline = inline_capacity(&MatchInfo::default());
    let parted = a.parted_capacity(&MatchInfo::default());
    assert!(parted > inline);
    let mut sizes = vec![0, 1, 72, 80, 100_000, 3 * FRAGMENT + 5];
    for limit in [
        inline,
        inline + MORE_LEN,
        parted,
        EAGER,
        FRAGMENT,
        2 * FRAGMENT,
    ] {
        sizes.extend([limit - 1, limit, limit + 1]);
    }
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(len, i as u8);
        let mut buf = vec![0u8; len];
        post(&mut b, false, recv_spec(&mut buf, 100 + i, None, 0, 0));
        send(&mut a, b.addr(), &data, None, i).unwrap();
        let sent = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(
            matches!(sent[0], Event::Send { context, .. } if context == i),
            "{len}: {sent:?}"
        );
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        let done = recv_done(&got[0]);
        assert_eq!(
            (done.context, done.len, done.src),
            (100 + i, len, a.addr()),
            "size {len}"
        );
        assert!(buf == data, "data of a {len}-byte message differs");
    }
    assert!(!a.busy() && !b.busy());
}

#[test]
fn unexpected_messages_wait_for_their_receives_in_order() {
    let mut a = messenger();
    let mut b = messenger();
    let messages: Vec<Vec<u8>> = [5, 700, 9000, 12, 3000]
        .iter()
        .map(|&n| pattern(n, n as u8))
        .collect();
    for (i, m) in messages.iter().enumerate() {
        send(&mut a, b.addr(), m, Some(7), i).unwrap();
    }
    // Let everything arrive (rendezvous requests wait) before any receive.
    for _ in 0..100 {
        a.progress();
        b.progress();
    }
    let mut bufs: Vec<Vec<u8>> = messages.iter().map(|m| vec![0u8; m.len()]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, true, recv_spec(buf, 10 + i, Some(a.addr()), 7, 0));
    }
    let got = collect(&mut [&mut a, &mut b], 1, messages.len());
    let mut contexts: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, vec![10, 11, 12, 13, 14]);
    for (buf, m) in bufs.iter().zip(&messages) {
        assert!(buf == m);
    }
    collect(&mut [&mut a, &mut b], 0, messages.len());
}

#[test]
fn tags_ignore_masks_and_directed_receives() {
    let mut a = messenger();
    let mut b = messenger();
    let mut c = messenger();
    let mut from_c = [0u8; 4];
    let mut masked = [0u8; 4];
    let mut any = [0u8; 4];
    post(
        &mut b,
        true,
        recv_spec(&mut from_c, 1, Some(c.addr()), 0x500, 0),
    );
    post(&mut b, true, recv_spec(&mut masked, 2, None, 0x100, 0x0ff));
    post(&mut b, true, recv_spec(&mut any, 3, None, 0, u64::MAX));
    send(&mut a, b.addr(), b"a500", Some(0x500), 0).unwrap(); // not from c: masked? no, 0x500 | 0xff != 0x1ff
    send(&mut a, b.addr(), b"a1ab", Some(0x1ab), 1).unwrap();
    send(&mut c, b.addr(), b"c500", Some(0x500), 2).unwrap();
    let got = collect(&mut [&mut a, &mut b, &mut c], 1, 3);
    let by_context = |ctx: usize| {
        got.iter()
            .map(recv_done)
            .find(|d| d.context == ctx)
            .unwrap()
            .clone()
    };
    assert_eq!((by_context(3).tag, &any), (0x500, b"a500"));
    assert_eq!((by_context(2).tag, &masked), (0x1ab, b"a1ab"));
    assert_eq!((by_context(1).src, &from_c), (c.addr(), b"c500"));
}

#[test]
fn fast_sender_never_overruns_a_slow_receiver() {
    let mut a = messenger();
    // A shallow mailbox and 4 eager credits: the sender must queue.
    let mut b = messenger_with(8, config());
    let count = 200;
    let messages: Vec<Vec<u8>> = (0..count)
        .map(|i| pattern(40 + (i * 97) % 3000, i as u8))
        .collect();
    // While the receiver sleeps, the sender posts everything (within
    // tx_size, nothing is refused) and keeps progressing: what the
    // receiver's ring and mailbox cannot take waits in the sender.
    for (i, m) in messages.iter().enumerate() {
        send(&mut a, b.addr(), m, None, i).unwrap();
        a.progress();
    }
    for _ in 0..100 {
        a.progress();
    }
    // Then both run: everything queued must arrive, in order.
    let mut bufs: Vec<Vec<u8>> = messages.iter().map(|m| vec![0u8; m.len()]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    // Rendezvous receives finish after later eager ones; what must hold is
    // that receive i matched message i, which the data shows.
    let got = collect(&mut [&mut a, &mut b], 1, count);
    let mut contexts: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, (0..count).collect::<Vec<_>>());
    for (i, (buf, m)) in bufs.iter().zip(&messages).enumerate() {
        assert!(buf == m, "receive {i} got another message's data");
    }
}

/// One raw inject call, no retry.
fn try_inject(
    a: &mut Shm,
    dest: MailboxAddr,
    data: &[u8],
    context: usize,
) -> Result<(), PostError> {
    try_copied(a, dest, data, context, true)
}

/// One raw call of a send whose buffer may be reused once it returns: an
/// inject, or a send with `FI_INJECT` (`copy`), which still completes.
fn try_copied(
    a: &mut Shm,
    dest: MailboxAddr,
    data: &[u8],
    context: usize,
    inject: bool,
) -> Result<(), PostError> {
    let req = SendReq {
        context,
        inject,
        copy: !inject,
        ..send_req(dest, data.as_ptr(), data.len())
    };
    // SAFETY: data is live during the call, which copies it.
    unsafe { a.send(req) }
}

/// A sender posts 200 eager sends (some with `FI_INJECT`) and 50 injects
/// (inline and eager) to a receiver that neither progresses nor has
/// receives posted: every post is accepted at once, however few credits,
/// bounce buffers and mailbox slots there are; the sends waiting for the
/// peer hold no bounce buffer. Then the receiver posts its receives and
/// runs: everything arrives in order, intact (the buffers of injects and
/// `FI_INJECT` sends were overwritten right after each call), and the sends
/// complete in order.
fn posts_never_wait(first: bool) {
    let mut a = messenger();
    // 4 credits, 8 bounce buffers, 8 mailbox slots, tx_size 256.
    let mut b = messenger_with(8, config());
    if first {
        first_contact(&mut a, &mut b);
    }
    let count = 250;
    let inline = inline_capacity(&MatchInfo::default());
    let len_of = |i: usize| match i % 5 {
        4 if i.is_multiple_of(2) => 1 + i % inline,
        4 => inline + 1 + (i * 53) % (EAGER - inline),
        _ => inline + 1 + (i * 37) % (EAGER - inline),
    };
    let messages: Vec<Vec<u8>> = (0..count).map(|i| pattern(len_of(i), i as u8)).collect();
    let mut scratch = vec![0u8; EAGER];
    for (i, m) in messages.iter().enumerate() {
        if i % 5 == 4 || i % 7 == 3 {
            scratch[..m.len()].copy_from_slice(m);
            let inject = i % 5 == 4;
            let posted = try_copied(&mut a, b.addr(), &scratch[..m.len()], i, inject);
            assert_eq!(posted, Ok(()), "{i} of {} bytes", m.len());
            // The application may reuse its buffer at once.
            scratch.fill(0xee);
        } else {
            let posted = send(&mut a, b.addr(), m, None, i);
            assert_eq!(posted, Ok(()), "send {i} of {} bytes", m.len());
        }
        a.progress();
    }
    for _ in 0..100 {
        a.progress();
    }
    assert!(a.busy(), "the sends wait for the receiver");
    assert_eq!(
        a.bounce_pool.available(),
        config().bounce_buffers,
        "sends waiting for a peer hold no bounce buffer"
    );
    let mut bufs: Vec<Vec<u8>> = messages.iter().map(|m| vec![0u8; m.len()]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    let got = collect(&mut [&mut a, &mut b], 1, count);
    let contexts: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
    assert_eq!(
        contexts,
        (0..count).collect::<Vec<_>>(),
        "receives in order"
    );
    for (i, (buf, m)) in bufs.iter().zip(&messages).enumerate() {
        assert!(buf == m, "message {i} of {} bytes differs", m.len());
    }
    let sent = collect(&mut [&mut a, &mut b], 0, count);
    let contexts: Vec<usize> = sent
        .iter()
        .map(|e| match *e {
            Event::Send {
                context,
                completion,
                ..
            } => {
                assert_eq!(completion, context % 5 != 4, "{e:?}");
                context
            }
            ref other => panic!("expected a send completion, got {other:?}"),
        })
        .collect();
    // An inline send leaves within its call only when nothing is queued
    // ahead of it: sends complete in send order, whatever way they went.
    assert_eq!(contexts, (0..count).collect::<Vec<_>>(), "sends in order");
    assert!(!a.busy() && !b.busy());
    assert_eq!(a.bounce_pool.available(), config().bounce_buffers);
}

#[test]
fn posts_never_wait_for_a_slow_receiver() {
    posts_never_wait(true);
}

/// The same before first contact: the receiver has not even answered the
/// hello, so no message can leave yet.
#[test]
fn posts_never_wait_for_a_receiver_that_never_answered() {
    posts_never_wait(false);
}

/// The transmit queue (`tx_size`) is the one limit on posting: once that
/// many sends wait for a stalled receiver, sends and injects alike are
/// refused with `Again`; they all complete once it runs, and posting works
/// again.
#[test]
fn only_a_full_transmit_queue_refuses_a_send() {
    let tx_size = 16;
    let cfg = ProtoConfig {
        tx_size,
        ..config()
    };
    let mut a = messenger_with(64, cfg.clone());
    let mut b = messenger_with(64, cfg);
    first_contact(&mut a, &mut b);
    let messages: Vec<Vec<u8>> = (0..100).map(|i| pattern(200 + i, i as u8)).collect();
    let mut accepted = 0;
    loop {
        match send(&mut a, b.addr(), &messages[accepted], None, accepted) {
            Ok(()) => accepted += 1,
            Err(PostError::Again) => break,
            Err(e) => panic!("send: {e:?}"),
        }
        a.progress();
        assert!(accepted < messages.len(), "the transmit queue never filled");
    }
    // The 4 with credits may have left and completed; tx_size wait.
    assert!(
        (tx_size..=tx_size + 4).contains(&accepted),
        "{accepted} sends accepted with tx_size {tx_size} and 4 credits"
    );
    let small = pattern(4, 1);
    assert_eq!(
        try_inject(&mut a, b.addr(), &small, 1000),
        Err(PostError::Again)
    );
    assert_eq!(
        try_inject(&mut a, b.addr(), &messages[0], 1000),
        Err(PostError::Again)
    );
    let mut bufs: Vec<Vec<u8>> = messages.iter().map(|m| vec![0u8; m.len()]).collect();
    for (i, buf) in bufs.iter_mut().enumerate().take(accepted + 1) {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    let sent = collect(&mut [&mut a, &mut b], 0, accepted);
    assert!(sent
        .iter()
        .enumerate()
        .all(|(i, e)| matches!(*e, Event::Send { context, .. } if context == i)));
    // Room again.
    send(&mut a, b.addr(), &messages[accepted], None, accepted).unwrap();
    let got = collect(&mut [&mut a, &mut b], 1, accepted + 1);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(recv_done(e).context, i);
        assert!(bufs[i] == messages[i], "message {i}");
    }
    collect(&mut [&mut a, &mut b], 0, 1);
    assert!(!a.busy());
}

#[test]
fn truncation_reports_the_overflow() {
    let mut a = messenger();
    let mut b = messenger();
    for (len, cap) in [(20, 8), (900, 100), (3 * FRAGMENT, FRAGMENT + 1)] {
        let data = pattern(len, 3);
        let mut buf = vec![0u8; cap];
        post(&mut b, false, recv_spec(&mut buf, 9, None, 0, 0));
        send(&mut a, b.addr(), &data, None, 1).unwrap();
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        match &got[0] {
            Event::Error(e) => {
                assert_eq!(
                    (e.kind, e.len, e.olen),
                    (ErrorKind::Truncated, cap, len - cap)
                );
            }
            other => panic!("expected truncation, got {other:?}"),
        }
        assert_eq!(&buf[..], &data[..cap]);
        collect(&mut [&mut a, &mut b], 0, 1);
    }
}

#[test]
fn multi_receive_buffer_fills_in_order_and_is_released_last() {
    let mut a = messenger();
    let mut b = messenger();
    b.set_min_multi_recv(1000);
    let mut buf = vec![0u8; 4000];
    let mut spec = recv_spec(&mut buf, 77, None, 0, 0);
    spec.multi_recv = true;
    post(&mut b, false, spec);
    let messages: Vec<Vec<u8>> = [600, 10, 1500, 800, 300]
        .iter()
        .map(|&n| pattern(n, n as u8))
        .collect();
    for (i, m) in messages.iter().enumerate() {
        send(&mut a, b.addr(), m, None, i).unwrap();
    }
    // 600 + 10 + 1500 + 800 = 2910: 1090 left, still >= 1000; + 300 = 3210:
    // 790 left, retired with the fifth message.
    let got = collect(&mut [&mut a, &mut b], 1, 5);
    // The release comes with the last completion, whatever finished last
    // (here the 1500-byte rendezvous).
    let released: Vec<bool> = got.iter().map(|e| recv_done(e).multi_released).collect();
    assert_eq!(released, vec![false, false, false, false, true]);
    // The pieces were carved in arrival order.
    let base = buf.as_ptr() as usize;
    let mut offset = 0;
    for m in &messages {
        let done = got
            .iter()
            .map(recv_done)
            .find(|d| d.buf == base + offset)
            .expect("a piece at this offset");
        assert_eq!((done.context, done.len), (77, m.len()));
        assert!(done.multi);
        assert!(buf[offset..offset + m.len()] == m[..]);
        offset += m.len();
    }
}

#[test]
fn cancel_completes_with_canceled() {
    let mut a = messenger();
    let mut b = messenger();
    let mut x = [0u8; 8];
    let mut y = [0u8; 8];
    post(&mut b, true, recv_spec(&mut x, 1, None, 5, 0));
    post(&mut b, true, recv_spec(&mut y, 2, None, 5, 0));
    assert!(b.cancel(1));
    assert!(!b.cancel(1));
    match b.next_event() {
        Some(Event::Error(e)) => assert_eq!((e.context, e.kind), (1, ErrorKind::Canceled)),
        other => panic!("{other:?}"),
    }
    send(&mut a, b.addr(), b"12345678", Some(5), 0).unwrap();
    let got = collect(&mut [&mut a, &mut b], 1, 1);
    assert_eq!(recv_done(&got[0]).context, 2);
    assert_eq!(&y, b"12345678");
}

#[test]
fn peek_claim_and_discard() {
    let mut a = messenger();
    let mut b = messenger();
    let (small, large) = (pattern(500, 1), pattern(5000, 2));
    send(&mut a, b.addr(), &small, Some(1), 0).unwrap();
    send(&mut a, b.addr(), &large, Some(2), 1).unwrap();
    for _ in 0..50 {
        a.progress();
        b.progress();
    }
    let mut none = [0u8; 0];
    b.peek(true, recv_spec(&mut none, 9, None, 3, 0), false, false);
    assert!(matches!(
        b.next_event(),
        Some(Event::Error(OpError {
            kind: ErrorKind::NoMessage,
            ..
        }))
    ));
    b.peek(true, recv_spec(&mut none, 10, None, 2, 0), true, false);
    let peeked = b.next_event().unwrap();
    assert_eq!((recv_done(&peeked).len, recv_done(&peeked).tag), (5000, 2));
    // Claimed: a plain receive for tag 2 does not see it.
    let mut other = vec![0u8; 5000];
    post(&mut b, true, recv_spec(&mut other, 11, None, 2, 0));
    assert!(b.next_event().is_none());
    let mut claimed = vec![0u8; 5000];
    // SAFETY: `claimed` outlives the transfer below.
    assert!(unsafe { b.claim(true, recv_spec(&mut claimed, 10, None, 0, 0), false) });
    let got = collect(&mut [&mut a, &mut b], 1, 1);
    assert_eq!(recv_done(&got[0]).context, 10);
    assert!(claimed == large);
    // Peek and discard the other one.
    b.peek(true, recv_spec(&mut none, 12, None, 1, 0), false, true);
    assert_eq!(recv_done(&b.next_event().unwrap()).len, 500);
    b.peek(true, recv_spec(&mut none, 13, None, 1, 0), false, false);
    assert!(matches!(b.next_event(), Some(Event::Error(_))));
    assert!(b.cancel(11));
}

#[test]
fn sends_to_oneself() {
    let mut a = messenger();
    for len in [3, 500, 20_000] {
        let data = pattern(len, 4);
        let mut buf = vec![0u8; len];
        let me = a.addr();
        post(&mut a, false, recv_spec(&mut buf, 1, Some(me), 0, 0));
        send(&mut a, me, &data, None, 2).unwrap();
        let got = collect(&mut [&mut a], 0, 2);
        assert!(got
            .iter()
            .any(|e| matches!(e, Event::Recv(d) if d.src == a.addr())));
        assert!(buf == data);
    }
}

/// `fi_cancel` of a multi-receive buffer while a rendezvous piece is being
/// transferred into it: the cancel entry does not release the buffer; the
/// piece completes, whole, and releases it (FI_MULTI_RECV exactly once,
/// with the last completion that touches the buffer).
#[test]
fn cancel_of_a_multi_recv_buffer_in_use_releases_it_after_the_piece() {
    let mut a = messenger();
    let mut b = messenger();
    b.set_min_multi_recv(64);
    let mut buf = vec![0u8; 8 * FRAGMENT];
    let spec = PostedRecv {
        multi_recv: true,
        ..recv_spec(&mut buf, 80, None, 0, 0)
    };
    post(&mut b, false, spec);
    let data = pattern(3 * FRAGMENT + 5, 6);
    send(&mut a, b.addr(), &data, None, 1).unwrap();
    // The receiver matches the request and grants; the sender does not run.
    let deadline = Instant::now() + HANG_GUARD;
    while !b.busy() {
        assert!(Instant::now() < deadline, "no transfer started");
        b.progress();
    }
    assert!(b.cancel(80));
    let cancelled = b.next_event().unwrap();
    assert!(
        matches!(
            cancelled,
            Event::Error(OpError {
                kind: ErrorKind::Canceled,
                multi_released: false,
                ..
            })
        ),
        "{cancelled:?}"
    );
    let got = collect(&mut [&mut a, &mut b], 1, 1);
    let done = recv_done(&got[0]);
    assert_eq!((done.context, done.len), (80, data.len()));
    assert!(done.multi_released, "the piece releases the buffer");
    assert!(buf[..data.len()] == data[..]);
    collect(&mut [&mut a, &mut b], 0, 1);
    for _ in 0..10 {
        a.progress();
        b.progress();
    }
    assert!(b.next_event().is_none());
}

/// What a test sink was given: the contexts of the receives, in order.
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<usize>>>);

impl crate::RecvSink<MailboxAddr> for Recorder {
    fn received(&mut self, done: &RecvDone<MailboxAddr>) {
        self.0.lock().unwrap().push(done.context);
    }
}

#[test]
fn receives_go_to_the_sink_unless_an_event_waits_before_them() {
    let mut a = messenger();
    let mut b = messenger();
    let sunk = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    b.set_recv_sink(Box::new(Recorder(sunk.clone())));
    let (mut x, mut y, mut z) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    post(&mut b, false, recv_spec(&mut x, 1, None, 0, 0));
    post(&mut b, true, recv_spec(&mut y, 2, None, 9, 0));
    // An event waits (the cancel's): the receive queues behind it.
    assert!(b.cancel(2));
    send(&mut a, b.addr(), b"first", None, 0).unwrap();
    let deadline = Instant::now() + HANG_GUARD;
    while b.stats().receives < 1 {
        assert!(Instant::now() < deadline, "the first message never came");
        a.progress();
        b.progress();
    }
    assert!(sunk.lock().unwrap().is_empty());
    let queued: Vec<_> = std::iter::from_fn(|| b.next_event()).collect();
    assert!(
        matches!(&queued[0], Event::Error(e) if e.context == 2),
        "{queued:?}"
    );
    assert_eq!(recv_done(&queued[1]).context, 1);
    assert_eq!(&x[..5], b"first");
    // Nothing waits now: the next one goes straight to the sink.
    post(&mut b, false, recv_spec(&mut z, 3, None, 0, 0));
    send(&mut a, b.addr(), b"second", None, 1).unwrap();
    while b.stats().receives < 2 {
        assert!(Instant::now() < deadline, "the second message never came");
        a.progress();
        b.progress();
    }
    assert_eq!(*sunk.lock().unwrap(), vec![3]);
    assert!(b.next_event().is_none());
    assert_eq!(&z[..6], b"second");
    collect(&mut [&mut a, &mut b], 0, 2);
}
