//! Ids: rendezvous receives beyond the id space wait, a peer's transfers
//! cannot stall the others', late reports for reused ids are dropped.

use super::*;

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
