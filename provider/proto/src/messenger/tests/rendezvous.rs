//! Rendezvous: straight into dmable receive buffers, read by the
//! receiver that polls, staging buffers shared, the domain's DMA shared,
//! memory freed since it was granted.

use super::*;

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
