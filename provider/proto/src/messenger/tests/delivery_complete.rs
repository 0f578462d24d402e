//! Sends that complete only once the target has the message
//! (`FI_DELIVERY_COMPLETE`), and the default transmit completion.

use super::*;

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
