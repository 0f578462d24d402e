//! Untrusted peers: stray and forged messages are dropped and held
//! against their sender only; what a peer holds of ours is bounded.

use super::*;

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
        let target_memory = TargetMemory::new(&b, 4096, target_dmable);
        let target = target_memory.addr;
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
