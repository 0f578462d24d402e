//! The protocol over the real emulation, messengers in one process. Small
//! thresholds (22-byte inline, 1 KiB eager, 4 KiB fragments) so that every
//! path and boundary is crossed with small buffers.

use std::time::{Duration, Instant};

use unimem_dma::{DmaBuf, DmaRegion, RegionConfig, ShmDmaEngine};
use unimem_mailbox::{MailboxAddr, Profile, ShmMailbox, ShmMailboxConfig};

use super::untrusted::FENCE_AFTER;
use super::*;
use crate::matching::PostedRecv;
use crate::test_job;
use crate::wire::{inline_capacity, Wire, MORE_LEN};
use crate::{AccessCounts, ErrorKind, OpError, RecvDone, RmaKind};

type Shm = Messenger<(ShmMailbox, ShmDmaEngine)>;

const EAGER: usize = 1024;
const FRAGMENT: usize = 4096;
/// How long a loop waits for something that must happen before it calls
/// it a hang (not a time requirement).
const HANG_GUARD: Duration = Duration::from_secs(60);

fn config() -> ProtoConfig {
    ProtoConfig {
        eager_size: EAGER,
        eager_credits: 4,
        bounce_buffers: 8,
        fragment_size: FRAGMENT,
        rendezvous_window: 2,
        staging_buffers: 3,
        tx_size: 256,
        ..ProtoConfig::default()
    }
}

fn messenger_with(depth: usize, cfg: ProtoConfig) -> Shm {
    messenger_profile(depth, cfg, Profile::Native)
}

fn messenger_profile(depth: usize, cfg: ProtoConfig, profile: Profile) -> Shm {
    Messenger::with_private_dma(mailbox(depth, profile), engine(profile), cfg).unwrap()
}

fn mailbox(depth: usize, profile: Profile) -> ShmMailbox {
    ShmMailbox::open(&ShmMailboxConfig {
        job: test_job(),
        depth,
        profile,
    })
    .unwrap()
}

fn engine(profile: Profile) -> ShmDmaEngine {
    let region = DmaRegion::for_process(&RegionConfig {
        job: test_job(),
        segment_size: 16 << 20,
        max_size: 256 << 20,
    })
    .unwrap();
    ShmDmaEngine::new(region, profile)
}

fn messenger() -> Shm {
    messenger_with(64, config())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A send of `len` bytes at `data` to `dest`: untagged, context 0, with a
/// completion, neither injected nor copied; tests override what they try.
fn send_req(dest: MailboxAddr, data: *const u8, len: usize) -> SendReq<MailboxAddr> {
    SendReq {
        dest,
        iov: IovList::One((data as usize, len)),
        info: MatchInfo::default(),
        context: 0,
        completion: true,
        inject: false,
        copy: false,
        delivery_complete: false,
    }
}

fn send(
    ep: &mut Shm,
    dest: MailboxAddr,
    data: &[u8],
    tag: Option<u64>,
    context: usize,
) -> Result<(), PostError> {
    let req = SendReq {
        info: MatchInfo { tag, data: None },
        context,
        ..send_req(dest, data.as_ptr(), data.len())
    };
    // SAFETY: the tests keep `data` alive until the send completes.
    unsafe { ep.send(req) }
}

/// Injects `data` from `a` to `b`, retrying while the provider says
/// -FI_EAGAIN and progressing both, as an application would.
fn inject(a: &mut Shm, b: &mut Shm, data: &[u8]) {
    let req = SendReq {
        inject: true,
        ..send_req(b.addr(), data.as_ptr(), data.len())
    };
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        // SAFETY: data is live during the call; inject copies it.
        match unsafe { a.send(req.clone()) } {
            Ok(()) => return,
            Err(PostError::Again) => {
                assert!(Instant::now() < deadline, "inject never accepted");
                a.progress();
                b.progress();
            }
            Err(e) => panic!("inject: {e:?}"),
        }
    }
}

fn recv_spec(
    buf: &mut [u8],
    context: usize,
    src: Option<MailboxAddr>,
    tag: u64,
    ignore: u64,
) -> PostedRecv<MailboxAddr> {
    PostedRecv {
        context,
        iov: IovList::One((buf.as_mut_ptr() as usize, buf.len())),
        src,
        tag,
        ignore,
        completion: true,
        multi_recv: false,
    }
}

/// An untagged receive of `len` bytes into dmable `target`, from anyone.
fn dmable_recv(target: &DmaBuf, len: usize, context: usize) -> PostedRecv<MailboxAddr> {
    PostedRecv {
        context,
        iov: IovList::One((target.as_ptr() as usize, len)),
        src: None,
        tag: 0,
        ignore: 0,
        completion: true,
        multi_recv: false,
    }
}

fn post(ep: &mut Shm, tagged: bool, recv: PostedRecv<MailboxAddr>) {
    // SAFETY: the tests keep the buffer alive until the receive completes.
    unsafe { ep.post_recv(tagged, recv) }
}

/// Progresses every messenger until `n` events are collected from `ep_index`.
fn collect(eps: &mut [&mut Shm], ep_index: usize, n: usize) -> Vec<Event<MailboxAddr>> {
    let deadline = Instant::now() + HANG_GUARD;
    let mut events = Vec::new();
    while events.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events: {events:?}",
            events.len()
        );
        for ep in eps.iter_mut() {
            ep.progress();
        }
        while let Some(e) = eps[ep_index].next_event() {
            events.push(e);
        }
        // Those without a completion are counts: as events with no context.
        if let Some(silent) = eps[ep_index].take_silent_rma() {
            for (kind, n) in RmaKind::ALL.into_iter().zip(silent) {
                events.extend((0..n).map(|_| Event::Rma {
                    context: 0,
                    kind,
                    completion: false,
                }));
            }
        }
    }
    events
}

fn recv_done(event: &Event<MailboxAddr>) -> &RecvDone<MailboxAddr> {
    match event {
        Event::Recv(done) => done,
        other => panic!("expected a receive completion, got {other:?}"),
    }
}

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

/// Sends `a` -> `b` and back once, both progressing: hellos exchanged,
/// each knows the other's eager ring.
fn first_contact(a: &mut Shm, b: &mut Shm) {
    let data = pattern(100, 0xfc);
    let mut buf = vec![0u8; 100];
    post(b, false, recv_spec(&mut buf, 0xfc, None, 0, 0));
    send(a, b.addr(), &data, None, 0xfc).unwrap();
    collect(&mut [&mut *a, &mut *b], 1, 1);
    collect(&mut [&mut *a, &mut *b], 0, 1);
    assert!(buf == data);
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
fn rendezvous_straight_into_dmable_receive_buffers() {
    let mut a = messenger();
    let mut b = messenger();
    let len = 10 * FRAGMENT + 3;
    let target = b.dma.alloc(len).unwrap();
    let source = a.dma.alloc(len).unwrap();
    let data = pattern(len, 9);
    source.write(0, &data);
    post(&mut b, false, dmable_recv(&target, len, 1));
    let req = SendReq {
        context: 2,
        ..send_req(b.addr(), source.as_ptr(), len)
    };
    // SAFETY: `source` outlives the send.
    unsafe { a.send(req) }.unwrap();
    collect(&mut [&mut a, &mut b], 1, 1);
    collect(&mut [&mut a, &mut b], 0, 1);
    let mut out = vec![0u8; len];
    target.read(0, &mut out);
    assert!(out == data);
    // No staging was needed on either side.
    assert_eq!(a.tx_staging.available(), 3);
    assert_eq!(b.rx_staging.available(), 3);
}

/// One rendezvous of `len` bytes from a dmable buffer of `a` into one of
/// `b`'s (`capacity` bytes), with the receive posted before the send
/// (`posted_first`) or after its request arrived; returns what was sent,
/// what landed and the length the receive reports.
fn rendezvous_between(
    a: &mut Shm,
    b: &mut Shm,
    len: usize,
    capacity: usize,
    posted_first: bool,
) -> (Vec<u8>, Vec<u8>, usize) {
    let source = a.dma.alloc(len).unwrap();
    let data = pattern(len, len as u8);
    source.write(0, &data);
    let target = b.dma.alloc(capacity).unwrap();
    let spec = dmable_recv(&target, capacity, 1);
    if posted_first {
        post(b, false, spec.clone());
    }
    let req = SendReq {
        context: 2,
        ..send_req(b.addr(), source.as_ptr(), len)
    };
    // SAFETY: `source` outlives the send.
    unsafe { a.send(req) }.unwrap();
    if !posted_first {
        let deadline = Instant::now() + HANG_GUARD;
        while b.matcher.unexpected_len() == 0 {
            assert!(Instant::now() < deadline, "the request never came");
            a.progress();
            b.progress();
        }
        post(b, false, spec);
    }
    // The length it reports (a truncated one reports an error).
    let landed = match &collect(&mut [&mut *a, &mut *b], 1, 1)[0] {
        Event::Error(e) if e.kind == ErrorKind::Truncated => e.len,
        other => recv_done(other).len,
    };
    collect(&mut [&mut *a, &mut *b], 0, 1);
    let mut out = vec![0u8; capacity];
    target.read(0, &mut out);
    (data, out, landed)
}

/// A receiver that matches a request while it polls reads the message
/// from the buffer the sender offered (the sender computes meanwhile, the
/// receiver waits): whole, truncated, across fragments; one that matches
/// it by a post, or whose progress agent does, grants it instead, and the
/// sender copies. Either way every byte lands once.
#[test]
fn a_polling_receiver_reads_the_offered_message_and_others_grant_it() {
    for (len, capacity) in [
        (EAGER + 1, EAGER + 1),
        (3 * FRAGMENT + 5, 3 * FRAGMENT + 5),
        (2 * FRAGMENT, FRAGMENT + 7),
    ] {
        for (posted_first, helping, pulls) in [(true, false, 1), (false, false, 0), (true, true, 0)]
        {
            let mut a = messenger();
            let mut b = messenger();
            b.set_helping(helping);
            let (data, out, landed) =
                rendezvous_between(&mut a, &mut b, len, capacity, posted_first);
            let what =
                format!("{len} into {capacity}, posted first {posted_first}, agent {helping}");
            let kept = len.min(capacity);
            assert!(out[..kept] == data[..kept], "{what}");
            assert_eq!(landed, kept, "{what}");
            assert_eq!(b.stats().pulls, pulls, "{what}");
            // Nothing staged either way: both buffers are dmable.
            assert_eq!(a.tx_staging.available(), 3, "{what}");
        }
    }
}

/// Offers and length announcements from a stranger that never sends the
/// requests they announce are dropped, held against that stranger alone:
/// a peer holds one of each at most (they once filled tables shared by
/// every peer, whose own announcements were then refused).
#[test]
fn announcements_without_their_requests_are_held_against_their_sender_only() {
    let mut b = messenger();
    let mut forged = rogue_first_contact();
    for id in 0..5u16 {
        forged.push(Wire::Offer {
            send_id: id,
            token: 0,
            addr: 0x1000,
        });
        forged.push(Wire::LenHigh {
            id,
            read: false,
            high: 1,
        });
    }
    let _rogue = forge(b.addr(), &forged);
    for _ in 0..20 {
        b.progress();
    }
    // Its hello (naming no node), and four of each replaced by the next.
    assert_eq!(b.dropped_messages(), 1 + 4 + 4);
    let held: Vec<_> = b.peers.iter().filter_map(|p| p.offer).collect();
    assert_eq!(held, [(4, 0x1000, 0)], "the last offer only");
    let held: Vec<_> = b.peers.iter().filter_map(|p| p.long_len).collect();
    assert_eq!(held, [(false, 4, 1)], "the last length only");
}

/// An offer of memory its owner freed since (a sender that broke its
/// promise) is not read: the transfer is granted instead.
#[test]
fn an_offer_of_memory_freed_since_is_not_read() {
    let mut a = messenger();
    let mut b = messenger();
    let len = 2 * FRAGMENT;
    let target = b.dma.alloc(len).unwrap();
    post(&mut b, false, dmable_recv(&target, len, 1));
    let source = a.dma.alloc(len).unwrap();
    let at = source.as_ptr();
    // SAFETY: the sender frees the buffer under its send on purpose; the
    // provider never reads it from then on but through the engine, whose
    // checks this tests (the region stays mapped).
    unsafe { a.send(send_req(b.addr(), at, len)) }.unwrap();
    drop(source);
    let again = a.dma.alloc(len).unwrap();
    again.write(0, &vec![0x5a; len]);
    let done = recv_done(&collect(&mut [&mut a, &mut b], 1, 1)[0]).clone();
    assert_eq!(done.len, len);
    assert_eq!(b.stats().pulls, 0, "a stale offer was read");
    collect(&mut [&mut a, &mut b], 0, 1);
    drop(again);
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

/// Several rendezvous receives into ordinary (non-dmable) memory compete
/// for few staging buffers: transfers wait their turn for a grant without
/// being granted twice or past their end, and every message arrives whole.
#[test]
fn concurrent_rendezvous_share_few_staging_buffers() {
    let mut a = messenger();
    let mut b = messenger();
    let len = 3 * FRAGMENT + 5;
    let messages: Vec<Vec<u8>> = (0..6).map(|i| pattern(len, i as u8)).collect();
    let mut bufs: Vec<Vec<u8>> = messages.iter().map(|_| vec![0u8; len]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, true, recv_spec(buf, 10 + i, None, i as u64, 0));
    }
    for (i, m) in messages.iter().enumerate() {
        send(&mut a, b.addr(), m, Some(i as u64), i).unwrap();
    }
    let got = collect(&mut [&mut a, &mut b], 1, messages.len());
    let mut contexts: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, (10..16).collect::<Vec<_>>());
    for (buf, m) in bufs.iter().zip(&messages) {
        assert!(buf == m);
    }
    collect(&mut [&mut a, &mut b], 0, messages.len());
    for _ in 0..10 {
        a.progress();
        b.progress();
    }
    assert!(!a.busy() && !b.busy());
    assert!(b.deferred_grants.is_empty());
    assert_eq!(b.rx_staging.available(), 3);
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

#[test]
fn eager_messages_go_by_rendezvous_to_a_receiver_without_a_ring() {
    let mut a = messenger();
    let mut b = messenger_with(
        64,
        ProtoConfig {
            eager_credits: 0,
            ..config()
        },
    );
    for (i, len) in [inline_capacity(&MatchInfo::default()) + 1, 500, EAGER]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        let mut buf = vec![0u8; len];
        post(&mut b, false, recv_spec(&mut buf, i, None, 0, 0));
        send(&mut a, b.addr(), &data, None, i).unwrap();
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        assert_eq!(recv_done(&got[0]).len, len);
        assert!(buf == data, "{len} bytes");
        collect(&mut [&mut a, &mut b], 0, 1);
    }
    // An inject of eager size too: its copy carries the rendezvous.
    let data = pattern(EAGER, 7);
    let req = SendReq {
        inject: true,
        ..send_req(b.addr(), data.as_ptr(), data.len())
    };
    // SAFETY: data is live during the call; inject copies it.
    unsafe { a.send(req) }.unwrap();
    drop(data);
    let mut buf = vec![0u8; EAGER];
    post(&mut b, false, recv_spec(&mut buf, 9, None, 0, 0));
    collect(&mut [&mut a, &mut b], 1, 1);
    assert!(buf == pattern(EAGER, 7));
    // The receiver's FIN completes the inject (counted, without a CQ entry)
    // and frees its copy; no bounce buffer is left taken.
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
    assert!(!a.busy());
    assert_eq!(a.bounce_pool.available(), config().bounce_buffers);
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

fn quick_peer_check() -> ProtoConfig {
    ProtoConfig {
        peer_check: Some(Duration::from_millis(1)),
        ..config()
    }
}

fn error_of(event: &Event<MailboxAddr>) -> &OpError<MailboxAddr> {
    match event {
        Event::Error(error) => error,
        other => panic!("expected an error completion, got {other:?}"),
    }
}

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

/// Two messengers of one domain send to one receiver at once, with modeled
/// DMA times so that their transfers are in flight together: whichever polls
/// the shared engine, each gets its own completions; the registrations one
/// made of the receiver's staging buffers serve the other; and when the
/// receiver dies, its node leaves the cache for both.
#[test]
fn messengers_of_one_domain_share_its_dma() {
    let domain = DomainDma::new(engine(Profile::Paper), unimem_regcache::Config::default());
    let shared = |cfg| Messenger::new(mailbox(64, Profile::Paper), &domain, cfg).unwrap();
    let mut a1: Shm = shared(quick_peer_check());
    let mut a2: Shm = shared(config());
    assert_eq!(domain.views(), 2);
    let mut b = messenger_profile(64, config(), Profile::Paper);
    let lens = [EAGER, 3 * FRAGMENT + 5, 500, 2 * FRAGMENT];
    let fragments: usize = 2 * lens
        .iter()
        .filter(|&&len| len > EAGER)
        .map(|len| len.div_ceil(FRAGMENT))
        .sum::<usize>();
    let data: Vec<Vec<u8>> = (0..2 * lens.len())
        .map(|i| pattern(lens[i / 2], i as u8))
        .collect();
    let mut bufs: Vec<Vec<u8>> = data.iter().map(|d| vec![0u8; d.len()]).collect();
    let (a1_addr, a2_addr) = (a1.addr(), a2.addr());
    for (i, buf) in bufs.iter_mut().enumerate() {
        let src = if i % 2 == 0 { a1_addr } else { a2_addr };
        post(&mut b, true, recv_spec(buf, i, Some(src), i as u64, 0));
    }
    for (i, d) in data.iter().enumerate() {
        let sender = if i % 2 == 0 { &mut a1 } else { &mut a2 };
        send(sender, b.addr(), d, Some(i as u64), i).unwrap();
    }
    let got = collect(&mut [&mut a1, &mut a2, &mut b], 2, data.len());
    assert_eq!(got.len(), data.len());
    for (i, (buf, d)) in bufs.iter().zip(&data).enumerate() {
        assert!(buf == d, "message {i} of {} bytes", d.len());
    }
    collect(&mut [&mut a1, &mut a2, &mut b], 0, lens.len());
    collect(&mut [&mut a1, &mut a2, &mut b], 1, lens.len());
    assert!(!a1.busy() && !a2.busy());
    // Each of the receiver's staging buffers was registered once, for both.
    let stats = domain.regcache_stats();
    assert!(stats.misses <= 3, "{stats:?}");
    assert_eq!(stats.hits + stats.misses, fragments as u64, "{stats:?}");
    assert!(stats.entries > 0);

    // a1's eager DMA is submitted before a2's: a2, progressing alone, reaps
    // it on its way to its own and keeps it for a1.
    let (x, y) = (pattern(EAGER, 100), pattern(EAGER, 101));
    let (mut bx, mut by) = (vec![0u8; EAGER], vec![0u8; EAGER]);
    post(&mut b, true, recv_spec(&mut bx, 100, Some(a1_addr), 100, 0));
    post(&mut b, true, recv_spec(&mut by, 101, Some(a2_addr), 101, 0));
    send(&mut a1, b.addr(), &x, Some(100), 100).unwrap();
    send(&mut a2, b.addr(), &y, Some(101), 101).unwrap();
    collect(&mut [&mut a2, &mut b], 0, 1);
    collect(&mut [&mut a1, &mut b], 0, 1);
    collect(&mut [&mut b], 0, 2);
    assert!(bx == x && by == y);

    drop(b);
    let deadline = Instant::now() + HANG_GUARD;
    while a1.peers_lost() == 0 {
        a1.progress();
        assert!(
            Instant::now() < deadline,
            "the dead receiver was never noticed"
        );
    }
    assert_eq!(domain.regcache_stats().entries, 0);
    drop(a1);
    assert_eq!(domain.views(), 1);
}

/// A send asking for `FI_MATCH_COMPLETE` / `FI_DELIVERY_COMPLETE`
/// (`delivery_complete`), tagged, from `data`.
fn send_delivered(
    ep: &mut Shm,
    dest: MailboxAddr,
    data: &[u8],
    tag: u64,
    context: usize,
) -> Result<(), PostError> {
    let req = SendReq {
        info: MatchInfo {
            tag: Some(tag),
            data: None,
        },
        context,
        delivery_complete: true,
        ..send_req(dest, data.as_ptr(), data.len())
    };
    // SAFETY: the tests keep `data` alive until the send completes.
    unsafe { ep.send(req) }
}

/// Progresses the sender alone, `rounds` times, and returns its events.
fn sender_alone(a: &mut Shm, rounds: usize) -> Vec<Event<MailboxAddr>> {
    let mut events = Vec::new();
    for _ in 0..rounds {
        a.progress();
        while let Some(e) = a.next_event() {
            events.push(e);
        }
    }
    events
}

/// A send with `delivery_complete` to a receiver that does not run does
/// not complete, whatever the sender does (its data is long in the
/// receiver's ring: that is only transmit complete). One progress of the
/// receiver queues it as unexpected (or delivers it into the posted
/// receive), and then the send completes. Sizes: inline-sized (which
/// goes eager for this), eager, and rendezvous (which always completed
/// on the receiver's FIN).
fn delivery_complete_waits_for_the_target(posted: bool) {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    for (i, len) in [0, 8, EAGER / 2, EAGER, 3 * FRAGMENT]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        let mut buf = vec![0u8; len];
        if posted {
            post(&mut b, true, recv_spec(&mut buf, 100 + i, None, 7, 0));
        }
        send_delivered(&mut a, b.addr(), &data, 7, i).unwrap();
        let early = sender_alone(&mut a, 200);
        assert!(early.is_empty(), "{len} bytes: completed early: {early:?}");
        if len <= EAGER {
            // One progress of the receiver matches or queues it, and says so.
            b.progress();
            let done = collect(&mut [&mut a], 0, 1);
            assert!(
                matches!(done[0], Event::Send { context, completion: true, .. } if context == i),
                "{len} bytes: {done:?}"
            );
        }
        if !posted {
            post(&mut b, true, recv_spec(&mut buf, 100 + i, None, 7, 0));
        }
        if len > EAGER {
            // A rendezvous send completes on the FIN, once the data is in
            // the matched receive buffer: every level, as always.
            collect(&mut [&mut a, &mut b], 0, 1);
        }
        let got = collect(&mut [&mut a, &mut b], 1, 1);
        assert_eq!(
            (recv_done(&got[0]).context, recv_done(&got[0]).len),
            (100 + i, len)
        );
        assert!(buf == data, "{len} bytes: data differs");
        assert!(!a.busy(), "{len} bytes: the send is still in flight");
    }
}

#[test]
fn delivery_complete_waits_for_the_unexpected_queue() {
    delivery_complete_waits_for_the_target(false);
}

#[test]
fn delivery_complete_waits_for_the_posted_receive() {
    delivery_complete_waits_for_the_target(true);
}

/// Without the flag, inline and eager sends complete without the receiver
/// ever running (transmit complete): the default path is unchanged.
#[test]
fn default_sends_complete_without_the_receiver() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let messages = [pattern(8, 1), pattern(EAGER, 2)];
    for (i, m) in messages.iter().enumerate() {
        send(&mut a, b.addr(), m, Some(7), i).unwrap();
    }
    let deadline = Instant::now() + HANG_GUARD;
    let mut done = Vec::new();
    while done.len() < messages.len() {
        assert!(Instant::now() < deadline, "only {done:?}");
        done.extend(sender_alone(&mut a, 1));
    }
    assert!(done.iter().all(|e| matches!(
        e,
        Event::Send {
            completion: true,
            ..
        }
    )));
}

/// Acknowledged sends (half with `copy`, `FI_INJECT`) to a receiver that
/// does not run: as many leave as there are credits, none completes; once
/// it runs the credits come back as before, all the rest leave, and all
/// complete, in order, holding no bounce buffer at the end.
#[test]
fn delivery_complete_sends_return_credits_and_bounce_buffers() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let count = 40;
    let messages: Vec<Vec<u8>> = (0..count).map(|i| pattern(30 + i * 20, i as u8)).collect();
    for (i, m) in messages.iter().enumerate() {
        let req = SendReq {
            context: i,
            copy: i % 2 == 0,
            delivery_complete: true,
            ..send_req(b.addr(), m.as_ptr(), m.len())
        };
        // SAFETY: the messages outlive the sends.
        unsafe { a.send(req) }.unwrap();
    }
    assert!(sender_alone(&mut a, 100).is_empty());
    let done = collect(&mut [&mut a, &mut b], 0, count);
    let contexts: Vec<usize> = done
        .iter()
        .map(|e| match e {
            Event::Send { context, .. } => *context,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(contexts, (0..count).collect::<Vec<_>>());
    let mut bufs: Vec<Vec<u8>> = messages.iter().map(|m| vec![0u8; m.len()]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, None, 0, 0));
    }
    collect(&mut [&mut a, &mut b], 1, count);
    assert!(bufs == messages);
    assert_eq!(a.bounce_pool.available(), config().bounce_buffers);
    assert!(!a.busy() && !b.busy());
}

/// A send waiting for the target's acknowledgement fails with
/// `PeerUnreachable` when the target dies before it ran.
#[test]
fn delivery_complete_send_fails_when_the_target_dies() {
    let mut a = messenger_with(64, quick_peer_check());
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let data = pattern(100, 9);
    send_delivered(&mut a, b.addr(), &data, 7, 5).unwrap();
    assert!(sender_alone(&mut a, 100).is_empty());
    drop(b);
    let failed = collect(&mut [&mut a], 0, 1);
    let error = error_of(&failed[0]);
    assert_eq!(
        (error.context, error.kind, error.send),
        (5, ErrorKind::PeerUnreachable, true)
    );
    assert!(!a.busy());
}

// --- RMA ---------------------------------------------------------------------

use unimem_dma::{Access, Exposure, KeyHandle, KeyTable};

/// Exposes `[addr, addr + len)` of this process under `key`.
fn expose(key: u64, addr: usize, len: usize, access: Access) -> KeyHandle {
    KeyTable::for_process(test_job())
        .unwrap()
        .expose(
            key,
            Exposure {
                addr: addr as u64,
                len: len as u64,
                access,
            },
        )
        .unwrap()
}

/// Keys unique in the process: the table is shared by parallel tests.
fn fresh_key() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0x5eed_0000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn rma_req(
    dest: MailboxAddr,
    local: *const u8,
    len: usize,
    key: u64,
    addr: u64,
) -> RmaReq<MailboxAddr> {
    RmaReq {
        dest,
        iov: IovList::One((local as usize, len)),
        addr,
        key,
        context: 0x77,
        completion: true,
        inject: false,
        data: None,
    }
}

fn rma(ep: &mut Shm, kind: RmaKind, req: RmaReq<MailboxAddr>) {
    // SAFETY: the tests keep the local buffer alive until the event.
    unsafe { ep.rma(kind, req) }.unwrap();
}

const RMA_SIZES: [usize; 8] = [
    0,
    1,
    22,
    FRAGMENT - 1,
    FRAGMENT,
    FRAGMENT + 1,
    3 * FRAGMENT + 5,
    100_000,
];

/// Writes then reads back every size into a target range, local buffers
/// dmable or not; `target_progresses` says whether the target runs.
fn write_read_round_trips(target_dmable: bool, local_dmable: bool) {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let max = *RMA_SIZES.iter().max().unwrap();
    let target_dma = b.dma.alloc(max + 64).unwrap();
    let mut target_heap = vec![0u8; max + 64];
    let target = if target_dmable {
        target_dma.as_ptr() as usize
    } else {
        target_heap.as_mut_ptr() as usize
    };
    let key = fresh_key();
    let _handle = expose(
        key,
        target,
        max + 64,
        Access::REMOTE_READ.union(Access::REMOTE_WRITE),
    );
    let local_dma = a.dma.alloc(max).unwrap();
    let mut local_heap = vec![0u8; max];
    let local = if local_dmable {
        local_dma.as_ptr() as usize
    } else {
        local_heap.as_mut_ptr() as usize
    };
    for (i, &len) in RMA_SIZES.iter().enumerate() {
        let data = pattern(len, i as u8);
        // SAFETY: local holds max >= len bytes, ours alone.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), local as *mut u8, len) };
        // Offset 7 into the range: keys name bytes by offset here.
        rma(
            &mut a,
            RmaKind::Write,
            rma_req(b.addr(), local as *const u8, len, key, 7),
        );
        let events = if target_dmable {
            // One-sided: the target never runs.
            collect(&mut [&mut a], 0, 1)
        } else {
            collect(&mut [&mut a, &mut b], 0, 1)
        };
        assert_eq!(
            events[0],
            Event::Rma {
                context: 0x77,
                kind: RmaKind::Write,
                completion: true
            },
            "write of {len}"
        );
        // SAFETY: target holds max + 64 bytes; no transfer is in flight.
        let landed = unsafe { std::slice::from_raw_parts((target + 7) as *const u8, len) };
        assert!(landed == &data[..], "write of {len} landed intact");
        // Read it back over a cleared local buffer.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(local as *mut u8, 0, len) };
        rma(
            &mut a,
            RmaKind::Read,
            rma_req(b.addr(), local as *const u8, len, key, 7),
        );
        let events = if target_dmable {
            collect(&mut [&mut a], 0, 1)
        } else {
            collect(&mut [&mut a, &mut b], 0, 1)
        };
        assert!(
            matches!(
                events[0],
                Event::Rma {
                    kind: RmaKind::Read,
                    ..
                }
            ),
            "{events:?}"
        );
        // SAFETY: as above.
        let read = unsafe { std::slice::from_raw_parts(local as *const u8, len) };
        assert!(read == &data[..], "read of {len} intact");
    }
    assert!(!a.busy() && !b.busy());
    assert_eq!(a.tx_staging.available(), 3);
    assert_eq!(b.rx_staging.available(), 3);
    assert!(b.next_event().is_none(), "the target reports nothing");
    // Those of at most the inject size to dmable memory went the direct
    // path (done in the call), both ways; nothing else did.
    let small = RMA_SIZES
        .iter()
        .filter(|&&len| len > 0 && len <= a.cfg.eager_size)
        .count() as u64;
    let direct = if target_dmable { 2 * small } else { 0 };
    assert!(small > 0);
    assert_eq!(a.stats.direct, direct, "direct operations");
}

#[test]
fn rma_one_sided_to_dmable_target_memory() {
    write_read_round_trips(true, true);
    write_read_round_trips(true, false);
}

/// A write or read of at most 64 bytes to ordinary memory takes one round
/// trip through the target (its request and bytes in a few mailbox
/// messages, applied on the target's next progress, answered at once),
/// where the rendezvous takes three; one more byte takes the rendezvous.
#[test]
fn small_rma_to_ordinary_memory_takes_one_round_trip() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let mut target = vec![0u8; 256];
    let key = fresh_key();
    let _handle = expose(
        key,
        target.as_mut_ptr() as usize,
        256,
        Access::REMOTE_READ.union(Access::REMOTE_WRITE),
    );
    // One progress of each side, target first, after the post.
    let round_trip = |a: &mut Shm, b: &mut Shm| {
        b.progress();
        a.progress();
        a.next_event()
    };
    for len in [1, 8, 21, 64] {
        let data = pattern(len, len as u8);
        rma(
            &mut a,
            RmaKind::Write,
            rma_req(b.addr(), data.as_ptr(), len, key, 3),
        );
        let done = round_trip(&mut a, &mut b);
        assert!(
            matches!(
                done,
                Some(Event::Rma {
                    kind: RmaKind::Write,
                    ..
                })
            ),
            "write of {len} done after one round trip: {done:?}"
        );
        assert_eq!(&target[3..3 + len], &data[..], "write of {len} in place");
        let mut back = vec![0u8; len];
        rma(
            &mut a,
            RmaKind::Read,
            rma_req(b.addr(), back.as_mut_ptr(), len, key, 3),
        );
        let done = round_trip(&mut a, &mut b);
        assert!(
            matches!(
                done,
                Some(Event::Rma {
                    kind: RmaKind::Read,
                    ..
                })
            ),
            "read of {len} done after one round trip: {done:?}"
        );
        assert_eq!(back, data, "read of {len}");
    }
    let data = pattern(65, 65);
    rma(
        &mut a,
        RmaKind::Write,
        rma_req(b.addr(), data.as_ptr(), 65, key, 3),
    );
    assert!(
        round_trip(&mut a, &mut b).is_none(),
        "65 bytes go by the rendezvous"
    );
    collect(&mut [&mut a, &mut b], 0, 1);
    assert_eq!(&target[3..68], &data[..]);
    assert_eq!(a.stats.assisted, 9);
    assert_eq!(a.stats.atomics, 0, "none of them counts as an atomic");
}

#[test]
fn rma_through_the_target_to_ordinary_memory() {
    write_read_round_trips(false, true);
    write_read_round_trips(false, false);
}

#[test]
fn rma_refusals_move_no_byte() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_dma = b.dma.alloc(4096).unwrap();
        let mut target_heap = vec![0u8; 4096];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        // SAFETY: target holds 4096 bytes.
        unsafe { std::ptr::write_bytes(target as *mut u8, 0xee, 4096) };
        let read_only = fresh_key();
        let _r = expose(read_only, target, 1024, Access::REMOTE_READ);
        let writable = fresh_key();
        let _w = expose(
            writable,
            target + 1024,
            1024,
            Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
        );
        let data = pattern(2000, 3);
        let cases = [
            (fresh_key(), 0, 10, ErrorKind::BadKey),
            (read_only, 0, 10, ErrorKind::AccessDenied),
            (
                writable,
                (target + 1024) as u64,
                1025,
                ErrorKind::AccessDenied,
            ),
            (
                writable,
                (target + 1023) as u64,
                10,
                ErrorKind::AccessDenied,
            ),
            (writable, 0, 10, ErrorKind::AccessDenied),
            (writable, u64::MAX - 4, 10, ErrorKind::AccessDenied),
        ];
        for (key, addr, len, error) in cases {
            rma(
                &mut a,
                RmaKind::Write,
                rma_req(b.addr(), data.as_ptr(), len, key, addr),
            );
            let events = collect(&mut [&mut a, &mut b], 0, 1);
            assert_eq!(
                events[0],
                Event::RmaError {
                    context: 0x77,
                    kind: RmaKind::Write,
                    error
                },
                "key {key:#x} at {addr:#x}+{len}"
            );
        }
        let mut back = vec![0u8; 10];
        rma(
            &mut a,
            RmaKind::Read,
            rma_req(
                b.addr(),
                back.as_mut_ptr(),
                10,
                writable,
                (target + 1024) as u64,
            ),
        );
        let events = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(
            matches!(
                events[0],
                Event::RmaError {
                    kind: RmaKind::Read,
                    error: ErrorKind::AccessDenied,
                    ..
                }
            ),
            "{events:?}"
        );
        // SAFETY: target holds 4096 bytes; nothing is in flight.
        let after = unsafe { std::slice::from_raw_parts(target as *const u8, 4096) };
        assert!(after.iter().all(|&b| b == 0xee), "no byte moved");
        assert!(!a.busy());
    }
}

/// With `count_silent_rma` (the provider's setting), writes that ask for
/// no completion, direct (dmable target) or served by the target, are
/// counts and no event; one that asks for a completion is still an event.
#[test]
fn writes_without_a_completion_are_only_counted() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        a.set_count_silent_rma(true);
        first_contact(&mut a, &mut b);
        let target_dma = b.dma.alloc(4096).unwrap();
        let mut target_heap = vec![0u8; 4096];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            4096,
            Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
        );
        let small = pattern(64, 3);
        for i in 0..5u64 {
            let req = RmaReq {
                inject: true,
                completion: false,
                ..rma_req(b.addr(), small.as_ptr(), 64, key, target as u64 + 64 * i)
            };
            rma(&mut a, RmaKind::Write, req);
        }
        let mut counted = 0;
        let deadline = Instant::now() + HANG_GUARD;
        while counted < 5 {
            assert!(Instant::now() < deadline, "{counted} of 5 counted");
            a.progress();
            b.progress();
            assert!(a.next_event().is_none(), "no event for a silent write");
            if let Some(silent) = a.take_silent_rma() {
                assert_eq!(silent[1..], [0, 0, 0], "all of them writes");
                counted += silent[0];
            }
        }
        assert_eq!(a.take_silent_rma(), None, "taken once");
        let req = rma_req(b.addr(), small.as_ptr(), 64, key, target as u64);
        rma(&mut a, RmaKind::Write, req);
        let done = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(
            matches!(
                done[0],
                Event::Rma {
                    kind: RmaKind::Write,
                    completion: true,
                    ..
                }
            ),
            "{done:?}"
        );
        // SAFETY: target holds 4096 bytes; nothing is in flight.
        let got = unsafe { std::slice::from_raw_parts(target as *const u8, 5 * 64) };
        assert!(
            got.chunks(64).all(|c| c == &small[..]),
            "dmable {target_dmable}"
        );
    }
}

#[test]
fn rma_write_with_data_and_inject() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_dma = b.dma.alloc(3 * FRAGMENT).unwrap();
        let mut target_heap = vec![0u8; 3 * FRAGMENT];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            3 * FRAGMENT,
            Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
        );
        let data = pattern(2 * FRAGMENT + 1, 5);
        let req = RmaReq {
            data: Some(0xdada),
            ..rma_req(b.addr(), data.as_ptr(), data.len(), key, target as u64)
        };
        rma(&mut a, RmaKind::Write, req);
        let done = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(matches!(
            done[0],
            Event::Rma {
                kind: RmaKind::Write,
                ..
            }
        ));
        let landed = collect(&mut [&mut a, &mut b], 1, 1);
        assert_eq!(
            landed[0],
            Event::RemoteWrite {
                data: 0xdada,
                len: 2 * FRAGMENT + 1
            }
        );
        // SAFETY: target holds the write; nothing is in flight.
        let got = unsafe { std::slice::from_raw_parts(target as *const u8, data.len()) };
        assert!(got == &data[..]);

        let mut small = pattern(EAGER, 6);
        // fi_inject_write: copied, no completion.
        let req = RmaReq {
            inject: true,
            completion: false,
            ..rma_req(b.addr(), small.as_ptr(), EAGER, key, target as u64 + 1)
        };
        rma(&mut a, RmaKind::Write, req);
        let expected = small.clone();
        small.fill(0); // an inject's buffer is free once the call returns
        let done = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(matches!(
            done[0],
            Event::Rma {
                kind: RmaKind::Write,
                completion: false,
                ..
            }
        ));
        // SAFETY: as above.
        let got = unsafe { std::slice::from_raw_parts((target + 1) as *const u8, EAGER) };
        assert!(got == &expected[..]);
        let too_big = RmaReq {
            inject: true,
            ..rma_req(b.addr(), data.as_ptr(), EAGER + 1, key, target as u64)
        };
        // SAFETY: refused before anything is read.
        let refused = unsafe { a.rma(RmaKind::Write, too_big) };
        assert_eq!(refused, Err(PostError::TooLong));
    }
}

// --- atomics -------------------------------------------------------------------

use crate::atomic::{AtomicCall, AtomicOp, Datatype};

#[allow(clippy::too_many_arguments)]
fn atomic_req(
    dest: MailboxAddr,
    call: AtomicCall,
    op: AtomicOp,
    datatype: Datatype,
    operand: &[u8],
    compare: &[u8],
    result: &mut [u8],
    key: u64,
    addr: u64,
) -> AtomicReq<MailboxAddr> {
    AtomicReq {
        dest,
        call,
        op,
        datatype,
        count: operand.len().max(result.len()) / datatype.size(),
        operand: IovList::One((operand.as_ptr() as usize, operand.len())),
        compare: IovList::One((compare.as_ptr() as usize, compare.len())),
        result: IovList::One((result.as_mut_ptr() as usize, result.len())),
        addr,
        key,
        context: 0xa7,
        completion: true,
    }
}

/// Posts an atomic from `a` and runs until it completes; returns its event.
fn run_atomic(a: &mut Shm, b: &mut Shm, req: AtomicReq<MailboxAddr>) -> Event<MailboxAddr> {
    // SAFETY: the test keeps the result buffer alive until the event.
    unsafe { a.atomic(req) }.unwrap();
    collect(&mut [&mut *a, &mut *b], 0, 1).remove(0)
}

fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn atomics_on_dmable_and_ordinary_memory() {
    use AtomicCall::*;
    use AtomicOp::{Bxor, Cswap, Max, Read, Sum};
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_dma = b.dma.alloc(64).unwrap();
        target_dma.write(0, &[0; 64]);
        let mut target_heap = vec![0u64; 8];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        let cell = |i: usize| target + 8 * i;
        // SAFETY: the target holds 8 u64s; nothing is in flight.
        let read = |i: usize| unsafe { *(cell(i) as *const u64) };
        // SAFETY: as above.
        let write = |i: usize, v: u64| unsafe { *(cell(i) as *mut u64) = v };
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            64,
            Access::REMOTE_READ.union(Access::REMOTE_WRITE),
        );
        let dest = b.addr();
        let mut none: [u8; 0] = [];

        write(0, 40);
        let e = run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Sum,
                Datatype::U64,
                &words(&[2]),
                &[],
                &mut none,
                key,
                0,
            ),
        );
        assert_eq!(
            e,
            Event::Rma {
                context: 0xa7,
                kind: RmaKind::Atomic,
                completion: true
            }
        );
        assert_eq!(read(0), 42);

        // Fetch-and-add of two elements: old values come back.
        write(1, 7);
        let mut old = [0u8; 16];
        let e = run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Fetch,
                Sum,
                Datatype::U64,
                &words(&[1, 100]),
                &[],
                &mut old,
                key,
                0,
            ),
        );
        assert!(
            matches!(
                e,
                Event::Rma {
                    kind: RmaKind::AtomicFetch,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(old, words(&[42, 7])[..]);
        assert_eq!((read(0), read(1)), (43, 107));

        // Atomic read needs no operand.
        let mut got = [0u8; 8];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(dest, Fetch, Read, Datatype::U64, &[], &[], &mut got, key, 8),
        );
        assert_eq!(got, words(&[107])[..]);

        // Compare-and-swap: one that matches, one that does not.
        let mut old = [0u8; 8];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Compare,
                Cswap,
                Datatype::U64,
                &words(&[5]),
                &words(&[43]),
                &mut old,
                key,
                0,
            ),
        );
        assert_eq!((old, read(0)), (words(&[43]).try_into().unwrap(), 5));
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Compare,
                Cswap,
                Datatype::U64,
                &words(&[9]),
                &words(&[43]),
                &mut old,
                key,
                0,
            ),
        );
        assert_eq!((old, read(0)), (words(&[5]).try_into().unwrap(), 5));

        // Narrow and float elements.
        write(2, 0);
        let bytes = [1u8, 2, 3, 250];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Sum,
                Datatype::U8,
                &bytes,
                &[],
                &mut none,
                key,
                16,
            ),
        );
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Sum,
                Datatype::U8,
                &bytes,
                &[],
                &mut none,
                key,
                16,
            ),
        );
        assert_eq!(
            read(2) & 0xffff_ffff,
            u64::from(u32::from_le_bytes([2, 4, 6, 244]))
        );
        write(3, 2.5f64.to_bits());
        let mut old = [0u8; 8];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Fetch,
                Max,
                Datatype::F64,
                &7.25f64.to_le_bytes(),
                &[],
                &mut old,
                key,
                24,
            ),
        );
        assert_eq!(
            (f64::from_le_bytes(old), f64::from_bits(read(3))),
            (2.5, 7.25)
        );

        // Every element of the largest operand.
        let ones = words(&[1; 8]);
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Bxor,
                Datatype::U64,
                &ones,
                &[],
                &mut none,
                key,
                0,
            ),
        );
        assert_eq!(read(7), 1);
        assert!(!a.busy() && !b.busy());
        if target_dmable {
            // One-sided: the target's progress had nothing to do.
            assert!(b.atomic_rx.is_empty());
        }
    }
}

#[test]
fn atomic_refusals() {
    use AtomicCall::*;
    use AtomicOp::{Bor, Read, Sum};
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_dma = b.dma.alloc(64).unwrap();
        target_dma.write(0, &[0; 64]);
        let mut target_heap = vec![0u64; 8];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        let read_only = fresh_key();
        let _r = expose(read_only, target, 32, Access::REMOTE_READ);
        let write_only = fresh_key();
        let _w = expose(write_only, target + 32, 32, Access::REMOTE_WRITE);
        let dest = b.addr();
        let one = words(&[1]);
        let mut none: [u8; 0] = [];
        let mut old = [0u8; 8];
        let cases: [(AtomicReq<MailboxAddr>, ErrorKind); 5] = [
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    read_only,
                    0,
                ),
                ErrorKind::AccessDenied,
            ),
            (
                atomic_req(
                    dest,
                    Fetch,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut old,
                    write_only,
                    0,
                ),
                ErrorKind::AccessDenied,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    4,
                ),
                ErrorKind::Invalid,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    32,
                ),
                ErrorKind::AccessDenied,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    fresh_key(),
                    0,
                ),
                ErrorKind::BadKey,
            ),
        ];
        for (req, error) in cases {
            let e = run_atomic(&mut a, &mut b, req);
            assert!(
                matches!(e, Event::RmaError { error: got, .. } if got == error),
                "{e:?}, wanted {error:?}"
            );
        }
        // SAFETY: nothing is in flight.
        let untouched = unsafe { std::slice::from_raw_parts(target as *const u64, 8) };
        assert!(untouched.iter().all(|&v| v == 0));
        // Refused at once: an operation the call does not have, too many
        // elements, short buffers.
        let eight = words(&[1; 9]);
        for (req, refused) in [
            (
                atomic_req(
                    dest,
                    Write,
                    Read,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    0,
                ),
                PostError::Unsupported,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Bor,
                    Datatype::F64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    0,
                ),
                PostError::Unsupported,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &eight,
                    &[],
                    &mut none,
                    write_only,
                    0,
                ),
                PostError::TooLong,
            ),
            (
                AtomicReq {
                    count: 2,
                    ..atomic_req(
                        dest,
                        Write,
                        Sum,
                        Datatype::U64,
                        &one,
                        &[],
                        &mut none,
                        write_only,
                        0,
                    )
                },
                PostError::TooShort,
            ),
        ] {
            // SAFETY: refused before anything is read.
            let got = unsafe { a.atomic(req) };
            assert_eq!(got, Err(refused));
        }
        assert!(!a.busy());
    }
}

/// Four initiators (threads, each with its own messenger) fetch-and-add one
/// counter at a target that runs its progress: the final value is exact and
/// every ticket is handed out once, on dmable and on ordinary memory.
/// A put and then an atomic on a flag of the same target (OpenSHMEM's
/// put-then-signal): whoever sees the flag set sees the put's data, for
/// every path the put may take (ordinary memory: bytes or the rendezvous;
/// dmable memory: the direct path or DMA) and both of the atomic's.
#[test]
fn an_atomic_after_a_write_is_applied_after_it() {
    use AtomicCall::Write;
    for target_dmable in [false, true] {
        for len in [8, 64, 80, 4096, 3 * FRAGMENT + 5] {
            let mut a = messenger();
            let mut b = messenger();
            first_contact(&mut a, &mut b);
            let room = len.next_multiple_of(8) + 64;
            let target_dma = b.dma.alloc(room).unwrap();
            target_dma.write(0, &vec![0; room]);
            let mut target_heap = vec![0u8; room];
            let target = if target_dmable {
                target_dma.as_ptr() as usize
            } else {
                target_heap.as_mut_ptr() as usize
            };
            let key = fresh_key();
            let _h = expose(
                key,
                target,
                room,
                Access::REMOTE_READ.union(Access::REMOTE_WRITE),
            );
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let flag_at = (room - 8) as u64;
            rma(
                &mut a,
                RmaKind::Write,
                rma_req(b.addr(), data.as_ptr(), len, key, 0),
            );
            let mut none: [u8; 0] = [];
            let one = words(&[1]);
            let set = atomic_req(
                b.addr(),
                Write,
                AtomicOp::Write,
                Datatype::U64,
                &one,
                &[],
                &mut none,
                key,
                flag_at,
            );
            // SAFETY: the operand lives until the call returns (it is
            // copied); no result.
            unsafe { a.atomic(set) }.unwrap();
            let deadline = Instant::now() + HANG_GUARD;
            let mut done = 0;
            while done < 2 {
                assert!(Instant::now() < deadline, "{len} B: only {done} of 2 done");
                a.progress();
                b.progress();
                // SAFETY: the flag is a u64 of the target, read while
                // nothing of ours writes it (the test's own thread).
                let flag = unsafe { *((target + room - 8) as *const u64) };
                if flag == 1 {
                    // SAFETY: len bytes of the target, as above.
                    let got = unsafe { std::slice::from_raw_parts(target as *const u8, len) };
                    assert!(
                        got == &data[..],
                        "{len} B to {} memory: the flag came before the data",
                        if target_dmable { "dmable" } else { "ordinary" }
                    );
                }
                while let Some(e) = a.next_event() {
                    assert!(matches!(e, Event::Rma { .. }), "{e:?}");
                    done += 1;
                }
            }
        }
    }
}

#[test]
fn concurrent_atomics_from_four_initiators_are_exact() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const EACH: u64 = 500;
    for target_dmable in [true, false] {
        let mut b = messenger();
        let target_dma = b.dma.alloc(8).unwrap();
        let mut target_heap = vec![0u64; 1];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        // SAFETY: the target holds one u64; nothing is in flight yet.
        unsafe { *(target as *mut u64) = 0 };
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            8,
            Access::REMOTE_READ.union(Access::REMOTE_WRITE),
        );
        let dest = b.addr();
        let stop = AtomicBool::new(false);
        let tickets = std::thread::scope(|s| {
            let target_side = s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    b.progress();
                    std::thread::yield_now();
                }
            });
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(move || {
                        let mut a = messenger();
                        let mut seen = Vec::new();
                        let one = words(&[1]);
                        for _ in 0..EACH {
                            let mut old = [0u8; 8];
                            let req = atomic_req(
                                dest,
                                AtomicCall::Fetch,
                                AtomicOp::Sum,
                                Datatype::U64,
                                &one,
                                &[],
                                &mut old,
                                key,
                                0,
                            );
                            // SAFETY: `old` outlives the operation (we wait for it).
                            unsafe { a.atomic(req) }.unwrap();
                            let deadline = Instant::now() + HANG_GUARD;
                            loop {
                                a.progress();
                                if let Some(e) = a.next_event() {
                                    assert!(matches!(e, Event::Rma { .. }), "{e:?}");
                                    break;
                                }
                                assert!(Instant::now() < deadline, "atomic never completed");
                                std::thread::yield_now();
                            }
                            seen.push(u64::from_le_bytes(old));
                        }
                        seen
                    })
                })
                .collect();
            let mut all: Vec<u64> = workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect();
            stop.store(true, Ordering::Relaxed);
            target_side.join().unwrap();
            all.sort_unstable();
            all
        });
        // SAFETY: every operation completed.
        let total = unsafe { *(target as *const u64) };
        assert_eq!(
            total,
            4 * EACH,
            "dmable: {target_dmable}, total {total:#x}, first tickets {:?}",
            &tickets[..4]
        );
        assert_eq!(
            tickets,
            (0..4 * EACH).collect::<Vec<_>>(),
            "each ticket once"
        );
    }
}

// --- untrusted peers -------------------------------------------------------------

/// A third party sends raw messages, as a broken or hostile peer would.
fn forge(to: MailboxAddr, messages: &[Wire]) -> ShmMailbox {
    use unimem_mailbox::Mailbox as _;
    let rogue = mailbox(64, Profile::Native);
    let route = rogue.connect(&to).unwrap();
    for m in messages {
        rogue.send(&route, &m.encode()).unwrap();
    }
    rogue
}

/// A peer that asks for atomics on our ordinary memory and never sends
/// their operands holds three quarters of the places for such atomics at
/// most: another peer's atomic is still carried out, not refused. (Found
/// while aiming the fuzz harness at what one peer can hold of a target:
/// before, such a peer could take every place.)
#[test]
fn a_peer_that_never_sends_its_operands_does_not_block_the_others_atomics() {
    use crate::messenger::rma::atomic::target::{
        MAX_PENDING_ATOMICS, MAX_PENDING_ATOMICS_PER_PEER,
    };
    use unimem_mailbox::Mailbox as _;
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let mut target = vec![0u64; 4];
    let key = fresh_key();
    let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
    let _h = expose(key, target.as_mut_ptr() as usize, 32, rw);
    let rogue = mailbox(64, Profile::Native);
    let route = rogue.connect(&b.addr()).unwrap();
    let mut forged = rogue_first_contact();
    forged.extend(
        (0..MAX_PENDING_ATOMICS as u16 + 10).map(|id| Wire::AtomicReq {
            key,
            addr: target.as_ptr() as u64,
            op: AtomicOp::Sum as u8,
            datatype: Datatype::U64 as u8,
            count: 1,
            id,
            fetch: false,
        }),
    );
    for m in &forged {
        while let Err(unimem_mailbox::Error::Busy) = rogue.send(&route, &m.encode()) {
            b.progress();
        }
    }
    for _ in 0..20 {
        b.progress();
    }
    assert_eq!(b.atomic_rx.len(), MAX_PENDING_ATOMICS_PER_PEER);
    let operand = words(&[5]);
    let req = atomic_req(
        b.addr(),
        AtomicCall::Write,
        AtomicOp::Sum,
        Datatype::U64,
        &operand,
        &[],
        &mut [],
        key,
        0,
    );
    let event = run_atomic(&mut a, &mut b, req);
    assert!(
        matches!(
            event,
            Event::Rma {
                kind: RmaKind::Atomic,
                ..
            }
        ),
        "{event:?}"
    );
    assert_eq!(target[0], 5);
}

/// FINs, grants and fragment reports that name another peer's transfers
/// (or none) are dropped, counted and warned about; the real transfers
/// complete intact and on time, not early.
#[test]
fn stray_rendezvous_messages_of_another_peer_are_dropped() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let len = 6 * FRAGMENT + 5;
    let data = pattern(len, 21);
    let mut buf = vec![0u8; len];
    // The send's RTS leaves, but b has no receive yet: it waits.
    send(&mut a, b.addr(), &data, Some(5), 0x51).unwrap();
    for _ in 0..50 {
        a.progress();
        b.progress();
    }
    // Every send id and transfer id a stranger could guess.
    let mut forged = Vec::new();
    for id in 0..4u16 {
        forged.push(Wire::Fin { send_id: id });
        forged.push(Wire::Grant {
            send_id: id,
            fragment: 0,
            addr: buf.as_mut_ptr() as u64,
            len: FRAGMENT as u32,
            recv_id: 0,
            recv_gen: 0,
            token: 0,
        });
    }
    let _rogue_a = forge(a.addr(), &forged);
    let rogue_b = forge(
        b.addr(),
        &[Wire::FragDone {
            send_id: 0,
            fragment: 0,
            recv_id: 0,
            recv_gen: 0,
        }],
    );
    for _ in 0..50 {
        a.progress();
        b.progress();
    }
    assert!(
        a.next_event().is_none(),
        "a stray FIN completed a send early"
    );
    assert!(
        a.dropped_messages() >= 8,
        "dropped {}",
        a.dropped_messages()
    );
    // Now the receive: the transfer runs, and only its own reports count.
    post(&mut b, true, recv_spec(&mut buf, 0x52, None, 5, 0));
    let _late = forge(
        b.addr(),
        &[Wire::FragDone {
            send_id: 0,
            fragment: 1,
            recv_id: 0,
            recv_gen: 0,
        }],
    );
    let got = collect(&mut [&mut a, &mut b], 1, 1);
    assert!(matches!(&got[0], Event::Recv(r) if r.len == len), "{got:?}");
    assert!(buf == data, "data intact");
    collect(&mut [&mut a, &mut b], 0, 1);
    assert!(b.dropped_messages() >= 1);
    drop(rogue_b);
}

/// Both sides progress until quiet; then every event the target `b` has.
fn target_events(a: &mut Shm, b: &mut Shm) -> Vec<Event<MailboxAddr>> {
    for _ in 0..100 {
        a.progress();
        b.progress();
    }
    std::iter::from_fn(|| b.next_event()).collect()
}

/// A key that counts remote accesses (FI_RMA_EVENT) hears of every
/// completed access it counts (reads, writes), one-sided ones by a notice
/// of the initiator, the others from its own progress; a key that does not
/// hears nothing.
#[test]
fn accesses_to_a_counting_key_are_reported_to_the_target() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_dma = b.dma.alloc(4096).unwrap();
        let mut target_heap = vec![0u8; 4096];
        let target = if target_dmable {
            target_dma.as_ptr() as usize
        } else {
            target_heap.as_mut_ptr() as usize
        };
        let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        let counting = fresh_key();
        let both = Access::NOTIFY_READ.union(Access::NOTIFY_WRITE);
        let _c = expose(counting, target, 1024, rw.union(both));
        // Counts writes only (OpenSHMEM's counter of the symmetric heap):
        // its reads are not told.
        let writes = fresh_key();
        let _w = expose(writes, target + 1024, 1024, rw.union(Access::NOTIFY_WRITE));
        let quiet = fresh_key();
        let _q = expose(quiet, target + 2048, 2048, rw);
        let data = pattern(100, 1);
        let mut back = vec![0u8; 100];
        for key in [counting, writes, quiet] {
            rma(
                &mut a,
                RmaKind::Write,
                rma_req(b.addr(), data.as_ptr(), 100, key, 0),
            );
            collect(&mut [&mut a, &mut b], 0, 1);
            rma(
                &mut a,
                RmaKind::Read,
                rma_req(b.addr(), back.as_mut_ptr(), 100, key, 0),
            );
            collect(&mut [&mut a, &mut b], 0, 1);
        }
        let seen = target_events(&mut a, &mut b);
        assert_eq!(
            seen,
            [
                Event::RemoteAccess(AccessCounts::one(counting, false, true)),
                Event::RemoteAccess(AccessCounts::one(counting, true, false)),
                Event::RemoteAccess(AccessCounts::one(writes, false, true)),
            ],
            "dmable target: {target_dmable}"
        );
    }
}

/// One-sided accesses posted back to back tell their target once per key
/// and run, with their counts, not once each: a put stream costs the
/// target one message. A notice whose counts are all 0 is a peer's lie,
/// dropped.
#[test]
fn notices_of_a_stream_of_accesses_are_summed() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let target = b.dma.alloc(4096).unwrap();
    let at = target.as_ptr() as usize;
    let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
    let both = Access::NOTIFY_READ.union(Access::NOTIFY_WRITE);
    let (k1, k2) = (fresh_key(), fresh_key());
    let _e1 = expose(k1, at, 2048, rw.union(both));
    let _e2 = expose(k2, at + 2048, 2048, rw.union(both));
    let data = pattern(8, 3);
    let mut back = [0u8; 8];
    // k1: three writes and two reads; k2: one write; k1 again: one read.
    let stream = [
        (k1, RmaKind::Write),
        (k1, RmaKind::Write),
        (k1, RmaKind::Read),
        (k1, RmaKind::Write),
        (k1, RmaKind::Read),
        (k2, RmaKind::Write),
        (k1, RmaKind::Read),
    ];
    for (i, &(key, kind)) in stream.iter().enumerate() {
        let buf = if kind == RmaKind::Write {
            data.as_ptr()
        } else {
            back.as_mut_ptr()
        };
        rma(&mut a, kind, rma_req(b.addr(), buf, 8, key, 8 * i as u64));
    }
    collect(&mut [&mut a, &mut b], 0, stream.len());
    let seen = target_events(&mut a, &mut b);
    let counts = |key, reads, writes| {
        Event::RemoteAccess(AccessCounts {
            key,
            reads,
            writes,
            updates: 0,
        })
    };
    assert_eq!(seen, [counts(k1, 2, 3), counts(k2, 0, 1), counts(k1, 1, 0)]);
    assert_eq!(a.stats().notices, stream.len() as u64);

    // A notice of nothing does not decode.
    let lie = Wire::RemoteNotice(AccessCounts {
        key: k1,
        ..AccessCounts::default()
    });
    assert_eq!(Wire::decode(&lie.encode()), None);
}

/// A read of a target whose transmit queue is full (its answer needs a
/// place there) waits for one, instead of failing, and is served in full
/// once the target's sends leave.
#[test]
fn rma_read_waits_for_room_in_the_targets_transmit_queue() {
    let mut a = messenger();
    let mut b = messenger_with(
        64,
        ProtoConfig {
            tx_size: 2,
            ..config()
        },
    );
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let mut target = pattern(3 * FRAGMENT + 5, 9);
    let key = fresh_key();
    let _h = expose(
        key,
        target.as_mut_ptr() as usize,
        target.len(),
        Access::REMOTE_READ,
    );
    // b's queue is full: two rendezvous sends a has no receive for yet.
    let big = pattern(2 * FRAGMENT, 1);
    send(&mut b, a.addr(), &big, None, 1).unwrap();
    send(&mut b, a.addr(), &big, None, 2).unwrap();
    let mut back = vec![0u8; target.len()];
    rma(
        &mut a,
        RmaKind::Read,
        rma_req(b.addr(), back.as_mut_ptr(), back.len(), key, 0),
    );
    for _ in 0..200 {
        a.progress();
        b.progress();
    }
    assert!(a.next_event().is_none(), "the read waits, it does not fail");
    let mut bufs = [vec![0u8; 2 * FRAGMENT], vec![0u8; 2 * FRAGMENT]];
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut a, false, recv_spec(buf, 10 + i, None, 0, 0));
    }
    let events = collect(&mut [&mut a, &mut b], 0, 3);
    let read = events
        .iter()
        .find(|e| matches!(e, Event::Rma { .. } | Event::RmaError { .. }))
        .expect("the read ended");
    assert_eq!(
        *read,
        Event::Rma {
            context: 0x77,
            kind: RmaKind::Read,
            completion: true
        }
    );
    assert!(back == target, "read intact");
    assert!(bufs.iter().all(|b| *b == big));
    collect(&mut [&mut a, &mut b], 1, 2);
    assert!(!a.busy() && !b.busy());
}

/// A peer that reads and never takes the data (grants nothing) holds a
/// quarter of the target's transmit queue at most: the target's own sends
/// are still accepted, and another peer's read is served, in full. (Found
/// by the fuzz harness's hostile endpoint: before, such reads filled the
/// queue, and every other read waited behind them.)
#[test]
fn a_peer_that_reads_and_never_takes_the_data_does_not_fill_the_queue() {
    let mut a = messenger();
    let mut b = messenger_with(
        64,
        ProtoConfig {
            tx_size: 8,
            ..config()
        },
    );
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let target = pattern(3 * FRAGMENT + 5, 7);
    let key = fresh_key();
    let _h = expose(
        key,
        target.as_ptr() as usize,
        target.len(),
        Access::REMOTE_READ,
    );
    let mut first = rogue_first_contact();
    first.extend((0..12u16).map(|recv_id| Wire::RmaRead {
        key,
        addr: target.as_ptr() as u64,
        len: target.len() as u32,
        recv_id,
    }));
    let _rogue = forge(b.addr(), &first);
    for _ in 0..20 {
        b.progress();
    }
    // b's own sends still find room.
    let data = pattern(2 * FRAGMENT, 3);
    let mut buf = vec![0u8; data.len()];
    post(&mut a, false, recv_spec(&mut buf, 1, None, 0, 0));
    send(&mut b, a.addr(), &data, None, 2).unwrap();
    // a's read is served.
    let mut back = vec![0u8; target.len()];
    rma(
        &mut a,
        RmaKind::Read,
        rma_req(b.addr(), back.as_mut_ptr(), back.len(), key, 0),
    );
    let got = collect(&mut [&mut a, &mut b], 0, 2);
    assert!(
        got.contains(&Event::Rma {
            context: 0x77,
            kind: RmaKind::Read,
            completion: true
        }),
        "{got:?}"
    );
    assert!(back == target, "read intact");
    assert!(buf == data, "send intact");
}

/// A receiver that acknowledges a send and closes at once: its FIN is in
/// the sender's mailbox when the sender finds it gone (here: its next send
/// to it meets a closed mailbox). The acknowledged send completes; only
/// what came after fails.
#[test]
fn a_peer_that_acknowledges_and_closes_completes_the_send() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let data = pattern(500, 4);
    let mut buf = vec![0u8; 500];
    post(&mut b, false, recv_spec(&mut buf, 1, None, 0, 0));
    let req = SendReq {
        context: 0xac,
        delivery_complete: true,
        ..send_req(b.addr(), data.as_ptr(), data.len())
    };
    // SAFETY: `data` outlives the send.
    unsafe { a.send(req) }.unwrap();
    // b takes the message (and acknowledges it) without a progressing.
    collect(&mut [&mut b], 0, 1);
    let b_addr = b.addr();
    drop(b);
    // a's next send finds b's mailbox closed.
    let later = pattern(100, 5);
    let _ = send(&mut a, b_addr, &later, None, 0xbd);
    let mut events = Vec::new();
    let deadline = Instant::now() + HANG_GUARD;
    while events.len() < 2 {
        assert!(Instant::now() < deadline, "only {events:?}");
        a.progress();
        while let Some(e) = a.next_event() {
            events.push(e);
        }
    }
    assert!(
        events.contains(&Event::Send {
            context: 0xac,
            tagged: false,
            completion: true
        }),
        "the acknowledged send completes: {events:?}"
    );
}

// --- first contact ---------------------------------------------------------------

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

// --- ids -------------------------------------------------------------------------

/// More rendezvous receives than there are ids: the transfers beyond wait
/// for a free id, in order (none is reused while in use), and every one
/// arrives intact. (The id space is cut to 8 here, 4 for the peers'
/// transfers, 3 of them for one peer's; the wire's is 2^16.)
#[test]
fn rendezvous_receives_beyond_the_id_space_wait_for_a_free_id() {
    let mut a = messenger();
    let mut b = messenger();
    b.limit_rx_ids(8);
    assert_eq!(b.peer_xfer_limit(), 4);
    let limit = b.per_peer_xfer_limit();
    assert_eq!(limit, 3);
    let len = 2 * FRAGMENT + 3;
    let count = 12;
    let data: Vec<Vec<u8>> = (0..count).map(|i| pattern(len, i as u8)).collect();
    let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; len]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, true, recv_spec(buf, i, None, i as u64, 0));
    }
    for (i, d) in data.iter().enumerate() {
        send(&mut a, b.addr(), d, Some(i as u64), 100 + i).unwrap();
    }
    let deadline = Instant::now() + HANG_GUARD;
    let mut done = Vec::new();
    let mut most = 0;
    while done.len() < count {
        assert!(Instant::now() < deadline, "only {} receives", done.len());
        a.progress();
        b.progress();
        most = most.max(b.rx_xfers.len());
        assert!(b.rx_xfers.len() <= limit, "{} transfers", b.rx_xfers.len());
        while let Some(e) = b.next_event() {
            done.push(recv_done(&e).context);
        }
    }
    assert_eq!(most, limit, "the ids were all in use at some point");
    done.sort_unstable();
    assert_eq!(done, (0..count).collect::<Vec<_>>());
    for (buf, d) in bufs.iter().zip(&data) {
        assert!(buf == d, "data intact");
    }
    collect(&mut [&mut a, &mut b], 0, count);
}

/// A peer that starts transfers and never ends them (here: writes to a
/// key of ours whose grants it never answers) holds its share of the ids
/// at most: another peer's rendezvous still gets ids and arrives, intact.
/// (Found by the fuzz harness's hostile endpoint: before, one peer could
/// take every id, and every other peer's rendezvous waited for it.)
#[test]
fn a_peer_that_never_ends_its_transfers_does_not_stall_the_others() {
    let mut a = messenger();
    let mut b = messenger();
    b.limit_rx_ids(8);
    first_contact(&mut a, &mut b);
    let target = b.dma.alloc(8 * FRAGMENT).unwrap();
    let key = fresh_key();
    let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
    let _h = expose(key, target.as_ptr() as usize, 8 * FRAGMENT, rw);
    let mut first = rogue_first_contact();
    // More writes than there are ids; none is ever reported.
    first.extend((0..8u16).map(|send_id| Wire::RmaWrite {
        key,
        // The target's own address, as initiators send it.
        addr: target.as_ptr() as u64,
        len: FRAGMENT as u32,
        send_id,
    }));
    let _rogue = forge(b.addr(), &first);
    for _ in 0..20 {
        b.progress();
    }
    assert_eq!(b.rx_xfers.len(), b.per_peer_xfer_limit());
    let len = 2 * FRAGMENT + 3;
    let data: Vec<Vec<u8>> = (0..4).map(|i| pattern(len, i as u8)).collect();
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; len]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, Some(a.addr()), 0, 0));
    }
    for (i, d) in data.iter().enumerate() {
        send(&mut a, b.addr(), d, None, 10 + i).unwrap();
    }
    let got = collect(&mut [&mut a, &mut b], 1, 4);
    let mut contexts: Vec<usize> = got.iter().map(|e| recv_done(e).context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, [0, 1, 2, 3]);
    assert!(bufs == data, "data intact");
    collect(&mut [&mut a, &mut b], 0, 4);
}

/// A peer whose fragments into ordinary memory are granted (each into a
/// staging buffer) and never put holds all but one staging buffer at most
/// (of the 3 here):
/// another peer's staged transfers still run, and arrive intact. (Found
/// by the fuzz harness's hostile endpoint: before, such a peer held every
/// staging buffer, and every other transfer waited behind its own.)
#[test]
fn a_peer_that_never_puts_its_fragments_does_not_hold_every_staging_buffer() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    // Ordinary memory: writes into it go through staging buffers.
    let mut target = vec![0u8; 8 * FRAGMENT];
    let key = fresh_key();
    let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
    let _h = expose(key, target.as_mut_ptr() as usize, target.len(), rw);
    let mut first = rogue_first_contact();
    first.extend((0..4u16).map(|send_id| Wire::RmaWrite {
        key,
        addr: target.as_ptr() as u64,
        len: 2 * FRAGMENT as u32,
        send_id,
    }));
    let _rogue = forge(b.addr(), &first);
    for _ in 0..20 {
        b.progress();
    }
    assert_eq!(b.rx_staging.available(), 3 - b.per_peer_staging());
    let len = 3 * FRAGMENT + 3;
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(len, i as u8)).collect();
    let mut bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; len]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        post(&mut b, false, recv_spec(buf, i, Some(a.addr()), 0, 0));
    }
    for (i, d) in data.iter().enumerate() {
        send(&mut a, b.addr(), d, None, 10 + i).unwrap();
    }
    collect(&mut [&mut a, &mut b], 1, 3);
    assert!(bufs == data, "data intact");
    collect(&mut [&mut a, &mut b], 0, 3);
}

/// Once a peer is failed (found dead, or a transfer to it failed while it
/// still runs), what it still sends starts nothing: no transfer, read or
/// atomic of it holds an id, a place in the queue or memory for good.
/// (Found by the fuzz harness: writes of hostile peers failed this way
/// kept their ids until none was left for anyone else.)
#[test]
fn a_failed_peer_starts_nothing_more() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let target = b.dma.alloc(4 * FRAGMENT).unwrap();
    let key = fresh_key();
    let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
    let _h = expose(key, target.as_ptr() as usize, 4 * FRAGMENT, rw);
    let a_addr = a.addr();
    let peer = b.known_peer(&a_addr).unwrap();
    b.fail_peer(peer);
    let addr = target.as_ptr() as u64;
    for message in [
        Wire::RmaWrite {
            key,
            addr,
            len: FRAGMENT as u32,
            send_id: 1,
        },
        Wire::RmaRead {
            key,
            addr,
            len: FRAGMENT as u32,
            recv_id: 1,
        },
        Wire::AtomicReq {
            key,
            addr,
            op: AtomicOp::Sum as u8,
            datatype: Datatype::U64 as u8,
            count: 1,
            id: 1,
            fetch: false,
        },
    ] {
        b.dispatch(a_addr, &message.encode());
    }
    assert!(!b.busy(), "nothing of the failed peer is in flight");
    assert!(b.atomic_rx.is_empty());
}

/// A fragment report for an earlier transfer that held the same id (a
/// late or replayed message) names an older generation: dropped, and the
/// transfer holding the id now completes intact.
#[test]
fn a_late_fragment_report_for_a_reused_id_is_dropped() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    let len = 3 * FRAGMENT + 1;
    let first = pattern(len, 1);
    let mut buf = vec![0u8; len];
    post(&mut b, false, recv_spec(&mut buf, 1, None, 0, 0));
    send(&mut a, b.addr(), &first, None, 1).unwrap();
    collect(&mut [&mut a, &mut b], 1, 1);
    collect(&mut [&mut a, &mut b], 0, 1);
    assert_eq!(b.rx_xfers.generation(0), 1, "transfer id 0 was used once");

    let second = pattern(len, 2);
    let mut buf2 = vec![0u8; len];
    post(&mut b, false, recv_spec(&mut buf2, 2, None, 0, 0));
    send(&mut a, b.addr(), &second, None, 2).unwrap();
    // The request reaches b, which grants into transfer id 0 again; a has
    // not put anything yet.
    b.progress();
    assert!(b.rx_xfers.get(0).is_some(), "id 0 reused");
    let dropped = b.dropped_messages();
    let late = Wire::FragDone {
        send_id: 0,
        fragment: 0,
        recv_id: 0,
        recv_gen: 0,
    };
    b.dispatch(a.addr(), &late.encode());
    assert_eq!(b.dropped_messages(), dropped + 1, "late report dropped");
    let got = collect(&mut [&mut a, &mut b], 1, 1);
    assert_eq!(recv_done(&got[0]).context, 2);
    assert!(buf2 == second, "data intact");
    collect(&mut [&mut a, &mut b], 0, 1);
}

// --- liveness --------------------------------------------------------------------

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

/// The first contact of a forged peer: our parameters, and a hello that
/// names no node and offers no eager ring.
fn rogue_first_contact() -> Vec<Wire> {
    vec![
        Wire::Params {
            version: crate::wire::PROTOCOL_VERSION,
            id_bits: crate::wire::ID_BITS,
            fragment_size: FRAGMENT as u32,
            eager_size: EAGER as u32,
        },
        Wire::Hello {
            node: [0; crate::wire::NODE_LEN],
            ring: 0,
            slot_shift: 10,
            slots: 0,
        },
    ]
}

/// The owner invalidates what peers hold before memory serves again: a
/// receiver that frees the buffer it granted (its receive gone) gets no
/// byte of the late put, and the sender's send fails; a sender's cached
/// registration of memory freed and allocated again since is replaced, and
/// the next transfer into the new buffer lands whole.
#[test]
fn puts_never_land_in_memory_freed_since_it_was_granted() {
    let mut a = messenger();
    let mut b = messenger();
    // Every request granted, as when the progress agent matches them (no
    // read of the offered buffer): this is about the sender's puts.
    b.set_helping(true);
    let len = 3 * FRAGMENT;
    let source = a.dma.alloc(len).unwrap();
    let data = pattern(len, 21);
    source.write(0, &data);
    let recv = |target: &DmaBuf, context| dmable_recv(target, len, context);

    // One transfer through a registration the sender caches.
    let first = b.dma.alloc(len).unwrap();
    post(&mut b, false, recv(&first, 1));
    let req = SendReq {
        context: 2,
        ..send_req(b.addr(), source.as_ptr(), len)
    };
    // SAFETY: `source` outlives the sends.
    unsafe { a.send(req.clone()) }.unwrap();
    collect(&mut [&mut a, &mut b], 1, 1);
    collect(&mut [&mut a, &mut b], 0, 1);
    let stale_before = a.dma.domain().stale_registrations();

    // Freed and allocated again: the cached registration is stale, and is
    // replaced (no byte is lost, none lands twice).
    let at = first.as_ptr() as usize;
    drop(first);
    let second = b.dma.alloc(len).unwrap();
    post(&mut b, false, recv(&second, 3));
    // SAFETY: as above.
    unsafe {
        a.send(SendReq {
            context: 4,
            ..req.clone()
        })
    }
    .unwrap();
    collect(&mut [&mut a, &mut b], 1, 1);
    collect(&mut [&mut a, &mut b], 0, 1);
    let mut out = vec![0u8; len];
    second.read(0, &mut out);
    assert!(out == data);
    if second.as_ptr() as usize == at {
        assert!(a.dma.domain().stale_registrations() > stale_before);
    }

    // A grant outstanding when its memory is freed: the late put is
    // refused and nothing lands in what the memory became.
    post(&mut b, false, recv(&second, 5));
    // SAFETY: as above.
    unsafe { a.send(SendReq { context: 6, ..req }) }.unwrap();
    let deadline = Instant::now() + HANG_GUARD;
    while b.rx_xfers.is_empty() {
        assert!(Instant::now() < deadline, "no grant");
        a.flush_active();
        b.progress();
    }
    drop(second);
    let reused = b.dma.alloc(len).unwrap();
    reused.write(0, &vec![0xee; len]);
    let events = collect(&mut [&mut a], 0, 1);
    assert!(
        matches!(&events[0], Event::Error(e) if e.context == 6),
        "{events:?}"
    );
    reused.read(0, &mut out);
    assert!(
        out.iter().all(|&x| x == 0xee),
        "a put landed in freed memory"
    );
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

    let mut a = messenger();
    let mut b = messenger();
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
