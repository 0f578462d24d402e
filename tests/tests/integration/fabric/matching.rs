//! Which receive gets which message, through the real libfabric core and
//! the unimem provider between separate `fabric-peer` processes: tag
//! matching with ignore masks, directed and `FI_ADDR_UNSPEC` receives,
//! unexpected messages, multi-receive buffers, truncation, cancellation and
//! the sources `fi_cq_readfrom` reports.

use std::collections::HashMap;

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{Cluster, Completion, Kind, Msg, Order, EAGER, SEGMENT};
use unimem_tests::fabric::FI_ADDR_NOTAVAIL;
use unimem_tests::payload;

use super::cluster;

/// Posts one receive on child `rx`: `from` is a fi_addr or "any", `tag`
/// a `(tag, ignore)` pair for the tagged interface.
fn post_recv(
    c: &mut Cluster,
    rx: usize,
    from: &str,
    len: usize,
    ctx: u64,
    tag: Option<(u64, u64)>,
) {
    let tag = tag.map_or(String::new(), |(t, i)| format!(" tag={t:#x} ignore={i:#x}"));
    c.cmd(rx, format!("recv {from} {len} {ctx}{tag}"));
}

/// Sends `msg` from child `tx` to fi_addr `dest`, as operation `ctx`.
fn send(c: &mut Cluster, tx: usize, dest: u64, msg: &Msg, ctx: u64) {
    c.cmd(tx, msg.send_cmd(dest, ctx));
}

/// Waits for `n` completions of `kind` on child `i`.
fn wait(c: &mut Cluster, i: usize, kind: &str, n: usize) -> Vec<Completion> {
    c.cmd(i, format!("wait {kind}={n}")).completions()
}

fn by_ctx(completions: Vec<Completion>) -> HashMap<u64, Completion> {
    completions.into_iter().map(|c| (c.ctx, c)).collect()
}

/// Nothing completes on child `i` for a while (it polls 100 ms and fails
/// on any completion). The wait is what is tested, not a synchronisation:
/// on a slow machine a wrong late completion may go unseen, never a right
/// one be reported.
fn quiet(c: &mut Cluster, i: usize) {
    c.cmd(i, "quiet 100");
}

#[test]
fn tags_match_through_ignore_masks() {
    let mut c = cluster("tags");
    c.spawn(2).connect_all();
    let (tx, rx) = (0, 1);
    // Receives, in posting order, and the message each must get.
    let receives = [
        (0x1200, 0x00ff),          // 0x12xx
        (0x5, 0),                  // exactly 0x5
        (0xabcd_0000, 0xffff),     // 0xabcdxxxx
        (0, u64::MAX),             // any tag
        (0x7000_0000_0000, 0xfff), // 0x7000_0000_0xxx
    ];
    let msgs = [
        Msg::new(10, 1).tag(0x5),      // not 0x12xx: the second
        Msg::new(5000, 2).tag(0x12ab), // the first
        Msg::new(20, 3).tag(0x777),    // only "any"
        Msg::new(3 * SEGMENT, 4).tag(0xabcd_1234),
        Msg::new(14, 5).tag(0x7000_0000_0abc),
    ];
    let expected = [1, 0, 3, 2, 4]; // receive taking message i
    for (ctx, &tag) in receives.iter().enumerate() {
        post_recv(&mut c, rx, "any", 3 * SEGMENT, ctx as u64, Some(tag));
    }
    // An untagged message never matches a tagged receive.
    let untagged = Msg::new(8, 6);
    send(&mut c, tx, rx as u64, &untagged, 99);
    for (i, msg) in msgs.iter().enumerate() {
        send(&mut c, tx, rx as u64, msg, 100 + i as u64);
    }
    wait(&mut c, tx, "sends", msgs.len() + 1);
    let got = by_ctx(wait(&mut c, rx, "recvs", msgs.len()));
    for (i, msg) in msgs.iter().enumerate() {
        msg.check_recv(&got[&(expected[i] as u64)], tx as u64);
    }
    post_recv(&mut c, rx, "any", 8, 9, None);
    untagged.check_recv(&wait(&mut c, rx, "recvs", 1)[0], tx as u64);

    // Unexpected tagged messages: each receive takes the first that it
    // accepts, in arrival order.
    let queued = [
        Msg::new(3, 7).tag(0x31),
        Msg::new(22, 8).tag(0x32),
        Msg::new(EAGER, 9).tag(0x33),
        Msg::new(SEGMENT + 1, 10).tag(0x31),
    ];
    for (i, msg) in queued.iter().enumerate() {
        send(&mut c, tx, rx as u64, msg, 200 + i as u64);
    }
    wait(&mut c, tx, "sends", 3); // the rendezvous one waits for its receive
    c.cmd(rx, "progress");
    let later = [
        ((0x33, 0), 2),    // the only 0x33
        ((0x30, 0x0f), 0), // 0x31 came before 0x32
        ((0x30, 0x0f), 1),
        ((0, u64::MAX), 3),
    ];
    for (k, &(tag, _)) in later.iter().enumerate() {
        post_recv(&mut c, rx, "any", SEGMENT + 1, 20 + k as u64, Some(tag));
    }
    wait(&mut c, tx, "sends", 1);
    let got = by_ctx(wait(&mut c, rx, "recvs", later.len()));
    for (k, &(_, m)) in later.iter().enumerate() {
        queued[m].check_recv(&got[&(20 + k as u64)], tx as u64);
    }
    c.finish();
}

#[test]
fn directed_and_any_source_receives() {
    let mut c = cluster("directed");
    c.spawn(3).connect_all();
    let (rx, a, b) = (0, 1, 2);
    post_recv(&mut c, rx, "2", 100, 1, None); // from b only
    post_recv(&mut c, rx, "1", 100, 2, Some((7, 0))); // from a only
    post_recv(&mut c, rx, "any", 100, 3, None);
    post_recv(&mut c, rx, "any", 100, 4, Some((7, 0)));
    let (a_untagged, a_tagged) = (Msg::new(30, 1), Msg::new(40, 2).tag(7));
    let (b_untagged, b_tagged) = (Msg::new(50, 3), Msg::new(60, 4).tag(7));
    // a first: its untagged message must pass over the receive for b.
    send(&mut c, a, rx as u64, &a_untagged, 1);
    send(&mut c, a, rx as u64, &a_tagged, 2);
    wait(&mut c, a, "sends", 2);
    c.cmd(rx, "progress");
    send(&mut c, b, rx as u64, &b_tagged, 1);
    send(&mut c, b, rx as u64, &b_untagged, 2);
    wait(&mut c, b, "sends", 2);
    let got = by_ctx(wait(&mut c, rx, "recvs", 4));
    b_untagged.check_recv(&got[&1], b as u64);
    a_tagged.check_recv(&got[&2], a as u64);
    a_untagged.check_recv(&got[&3], a as u64);
    b_tagged.check_recv(&got[&4], b as u64);

    // A directed receive leaves another sender's unexpected message alone.
    let (from_b, from_a) = (Msg::new(EAGER + 1, 5), Msg::new(1, 6));
    send(&mut c, b, rx as u64, &from_b, 3);
    c.cmd(rx, "progress");
    post_recv(&mut c, rx, "1", EAGER + 1, 5, None);
    quiet(&mut c, rx);
    send(&mut c, a, rx as u64, &from_a, 3);
    from_a.check_recv(&wait(&mut c, rx, "recvs", 1)[0], a as u64);
    post_recv(&mut c, rx, "any", EAGER + 1, 6, None);
    from_b.check_recv(&wait(&mut c, rx, "recvs", 1)[0], b as u64);
    for sender in [a, b] {
        wait(&mut c, sender, "sends", 1);
    }
    c.finish();
}

/// Offsets of a multi-receive buffer's pieces, checked against `msgs` in
/// the order they were sent: consecutive, the data intact, and the buffer
/// released (FI_MULTI_RECV) with its last completion and only then.
fn check_multi(pieces: &[Completion], msgs: &[Msg], released: bool) {
    let mut offset = 0;
    let mut in_send_order: Vec<&Completion> = pieces.iter().collect();
    in_send_order.sort_by_key(|p| (p.off, p.len));
    assert_eq!(pieces.len(), msgs.len(), "{pieces:#?}");
    for (piece, msg) in in_send_order.iter().zip(msgs) {
        assert_eq!(piece.off, offset, "consumed in order: {piece}");
        msg.check_recv(piece, 0);
        offset += msg.len;
    }
    let flagged: Vec<usize> = (0..pieces.len())
        .filter(|&i| pieces[i].has(ffi::FI_MULTI_RECV))
        .collect();
    let expected = if released {
        vec![pieces.len() - 1]
    } else {
        vec![]
    };
    assert_eq!(flagged, expected, "release flag: {pieces:#?}");
}

/// Splits completions by context, keeping their order.
fn split(all: Vec<Completion>) -> HashMap<u64, Vec<Completion>> {
    let mut map: HashMap<u64, Vec<Completion>> = HashMap::new();
    for c in all {
        map.entry(c.ctx).or_default().push(c);
    }
    map
}

#[test]
fn multi_receive_buffers() {
    let mut c = cluster("multi");
    c.spawn(2).connect_all();
    let (tx, rx) = (0, 1);
    assert_eq!(c.cmd(rx, "min-multi 256").num(), 256, "fi_getopt");
    c.cmd(rx, "multi-recv any 4096 50");
    c.cmd(rx, "multi-recv any 4096 51");
    // 4076 bytes: 20 left < 256 retires the first buffer.
    let first: Vec<Msg> = [100, 0, 22, 1000, 2000, 700, 254]
        .iter()
        .enumerate()
        .map(|(i, &len)| Msg::new(len, i as u64))
        .collect();
    let second = [Msg::new(500, 10), Msg::new(3000, 11)];
    for (i, msg) in first.iter().chain(&second).enumerate() {
        send(&mut c, tx, rx as u64, msg, i as u64);
    }
    let mut got = split(wait(&mut c, rx, "recvs", first.len() + second.len()));
    let in_first = got.remove(&50).unwrap_or_default();
    // Consumed in order: completion buffers increase within the buffer.
    assert!(
        in_first.windows(2).all(|w| w[0].off <= w[1].off),
        "{in_first:#?}"
    );
    check_multi(&in_first, &first, true);
    check_multi(&got.remove(&51).unwrap_or_default(), &second, false);
    // Cancelling the partly used buffer releases it.
    assert_eq!(c.cmd(rx, "cancel 51").num(), 0);
    let cancelled = &wait(&mut c, rx, "errors", 1)[0];
    assert_eq!(cancelled.ctx, 51);
    assert_eq!(cancelled.err, ffi::FI_ECANCELED, "{cancelled}");
    assert!(cancelled.has(ffi::FI_MULTI_RECV), "{cancelled}");
    wait(&mut c, tx, "sends", first.len() + second.len());

    // The last message to fit completes before an earlier, larger one
    // still in transfer: the release waits for that one.
    assert_eq!(c.cmd(rx, "min-multi 16384").num(), 16384);
    c.cmd(rx, "multi-recv any 131072 60");
    c.cmd(rx, "multi-recv any 65536 61");
    let big = [Msg::new(100_000, 20), Msg::new(15_000, 21)]; // 16072 left
    let after = Msg::new(100, 22);
    for (i, msg) in big.iter().chain([&after]).enumerate() {
        send(&mut c, tx, rx as u64, msg, 10 + i as u64);
    }
    let mut got = split(wait(&mut c, rx, "recvs", 3));
    check_multi(&got.remove(&60).unwrap_or_default(), &big, true);
    check_multi(&got.remove(&61).unwrap_or_default(), &[after], false);
    assert_eq!(c.cmd(rx, "cancel 61").num(), 0);
    assert!(wait(&mut c, rx, "errors", 1)[0].has(ffi::FI_MULTI_RECV));
    wait(&mut c, tx, "sends", 3);

    // Messages that arrived first fill a buffer posted later, in order.
    assert_eq!(c.cmd(rx, "min-multi 64").num(), 64);
    let early: Vec<Msg> = [100, 5000, 60, 40]
        .iter()
        .enumerate()
        .map(|(i, &len)| Msg::new(len, 30 + i as u64))
        .collect();
    for (i, msg) in early.iter().enumerate() {
        send(&mut c, tx, rx as u64, msg, 20 + i as u64);
    }
    wait(&mut c, tx, "sends", early.len());
    c.cmd(rx, "progress");
    // 5160 of 5200 bytes: 40 left < 64 retires it; the last waits.
    c.cmd(rx, "multi-recv any 5200 70");
    let pieces = wait(&mut c, rx, "recvs", 3);
    assert!(
        pieces.windows(2).all(|w| w[0].off < w[1].off),
        "{pieces:#?}"
    );
    check_multi(&pieces, &early[..3], true);
    c.cmd(rx, "multi-recv any 1000 71");
    check_multi(&wait(&mut c, rx, "recvs", 1), &early[3..], false);
    assert_eq!(c.cmd(rx, "cancel 71").num(), 0);
    assert!(wait(&mut c, rx, "errors", 1)[0].has(ffi::FI_MULTI_RECV));
    c.finish();
}

/// Cancelling a multi-receive buffer while a piece of it is still being
/// transferred: the release (FI_MULTI_RECV) must wait for that piece's
/// completion, the last time the provider touches the buffer.
#[test]
fn cancel_of_a_multi_receive_buffer_in_use() {
    let mut c = cluster("multi-cancel");
    c.spawn(2).connect_all();
    let (tx, rx) = (0, 1);
    c.cmd(rx, "min-multi 1024");
    c.cmd(rx, "multi-recv any 262144 80");
    // Rendezvous: it needs the sender's puts.
    let msg = Msg::new(100_000, 1);
    // Idle children progress in the background: the receiver is stopped
    // while the request goes out, so that it cannot grant before the
    // sender is stopped too. Then it matches the request and grants, and
    // cancels the buffer before any put.
    c.pause(rx);
    send(&mut c, tx, rx as u64, &msg, 1);
    c.pause(tx);
    c.resume(rx);
    c.cmd(rx, "progress");
    assert_eq!(c.cmd(rx, "cancel 80").num(), 0);
    let cancelled = wait(&mut c, rx, "errors", 1);
    c.resume(tx);
    let mut entries = cancelled;
    entries.extend(wait(&mut c, rx, "recvs", 1));
    quiet(&mut c, rx);
    let piece = entries
        .iter()
        .find(|e| e.kind == Kind::Recv)
        .expect("the piece");
    msg.check_recv(piece, tx as u64);
    let flagged: Vec<&Completion> = entries
        .iter()
        .filter(|e| e.has(ffi::FI_MULTI_RECV))
        .collect();
    assert_eq!(flagged.len(), 1, "released once: {entries:#?}");
    assert_eq!(
        flagged[0],
        entries.last().unwrap(),
        "released with the last completion of the buffer, not before the piece: {entries:#?}"
    );
    wait(&mut c, tx, "sends", 1);
    c.finish();
}

#[test]
fn truncation_reports_the_overflow() {
    let mut c = cluster("truncation");
    c.spawn(2).connect_all();
    let (tx, rx) = (0, 1);
    // (receive buffer, message) for inline, eager and rendezvous sizes.
    let cases = [
        (10, Msg::new(22, 1)),
        (1000, Msg::new(EAGER, 2)),
        (SEGMENT, Msg::new(200_000, 3)),
        (70_000, Msg::new(3 * SEGMENT + 5, 4).tag(9).data(0xdada)),
    ];
    for (i, (room, msg)) in cases.iter().enumerate() {
        post_recv(
            &mut c,
            rx,
            "any",
            *room,
            i as u64,
            msg.m.tag.map(|t| (t, 0)),
        );
        send(&mut c, tx, rx as u64, msg, i as u64);
    }
    let errors = by_ctx(wait(&mut c, rx, "errors", cases.len()));
    for (i, (room, msg)) in cases.iter().enumerate() {
        let e = &errors[&(i as u64)];
        assert_eq!(e.kind, Kind::Error);
        assert_eq!(e.err, ffi::FI_ETRUNC as i32, "{e}");
        assert_eq!((e.len, e.olen), (*room, msg.len - room), "{e}");
        assert_eq!(
            e.sum,
            payload::pattern_checksum(msg.seed, *room),
            "delivered part: {e}"
        );
        assert!(e.guard, "wrote past the buffer: {e}");
        assert_eq!(e.tag, msg.m.tag.unwrap_or(0), "{e}");
        if let Some(data) = msg.m.data {
            assert!(e.has(ffi::FI_REMOTE_CQ_DATA) && e.data == data, "{e}");
        }
    }
    // The sender knows nothing of it.
    wait(&mut c, tx, "sends", cases.len());
    c.finish();
}

#[test]
fn cancel_reports_the_context() {
    let mut c = cluster("cancel");
    c.spawn(2).connect_all();
    let (tx, rx) = (0, 1);
    post_recv(&mut c, rx, "any", 64, 7, Some((0xdead, 0)));
    post_recv(&mut c, rx, "0", 64, 8, None);
    assert_eq!(c.cmd(rx, "cancel 7").num(), 0);
    let e = &wait(&mut c, rx, "errors", 1)[0];
    assert_eq!((e.ctx, e.err), (7, ffi::FI_ECANCELED), "{e}");
    assert!(e.has(ffi::FI_RECV | ffi::FI_TAGGED), "{e}");
    assert_eq!(
        c.cmd(rx, "cancel 7").num(),
        -(ffi::FI_ENOENT as i64),
        "twice"
    );
    assert_eq!(c.cmd(rx, "cancel 12345").num(), -(ffi::FI_ENOENT as i64));
    assert_eq!(c.cmd(rx, "cancel 8").num(), 0);
    let e = &wait(&mut c, rx, "errors", 1)[0];
    assert_eq!((e.ctx, e.err), (8, ffi::FI_ECANCELED), "{e}");
    assert!(e.has(ffi::FI_RECV | ffi::FI_MSG), "{e}");
    // What arrives now waits for a new receive: the cancelled ones are gone.
    let (untagged, tagged) = (Msg::new(64, 1), Msg::new(64, 2).tag(0xdead));
    send(&mut c, tx, rx as u64, &untagged, 1);
    send(&mut c, tx, rx as u64, &tagged, 2);
    wait(&mut c, tx, "sends", 2);
    quiet(&mut c, rx);
    post_recv(&mut c, rx, "any", 64, 9, Some((0xdead, 0)));
    post_recv(&mut c, rx, "any", 64, 10, None);
    let got = by_ctx(wait(&mut c, rx, "recvs", 2));
    tagged.check_recv(&got[&9], tx as u64);
    untagged.check_recv(&got[&10], tx as u64);
    c.finish();
}

#[test]
fn source_addresses_from_the_av() {
    let mut c = cluster("source");
    c.spawn(3);
    let (rx, known, stranger) = (0, 1, 2);
    // The receiver knows only `known` (fi_addr 0); both senders know it.
    let (rx_addr, known_addr, stranger_addr) = (
        c[rx].addr.clone(),
        c[known].addr.clone(),
        c[stranger].addr.clone(),
    );
    assert_eq!(c.cmd(rx, format!("insert {known_addr}")).num(), 0);
    for sender in [known, stranger] {
        assert_eq!(c.cmd(sender, format!("insert {rx_addr}")).num(), 0);
    }
    let sizes = [7, 5000, 2 * SEGMENT + 9]; // inline, eager, rendezvous
    let from = |who: usize| -> Vec<Msg> {
        sizes
            .iter()
            .map(|&len| Msg::new(len, (who as u64) << 32 | len as u64))
            .collect()
    };
    let check = |c: &mut Cluster, senders: &[(usize, u64)]| {
        let n = sizes.len() * senders.len();
        for ctx in 0..n as u64 {
            post_recv(c, rx, "any", 2 * SEGMENT + 9, ctx, None);
        }
        for &(who, _) in senders {
            for (i, msg) in from(who).iter().enumerate() {
                send(c, who, 0, msg, i as u64);
            }
        }
        // Told apart by their lengths and seeds, whatever the arrival order.
        let got = wait(c, rx, "recvs", n);
        for &(who, src) in senders {
            for msg in from(who) {
                let piece = got
                    .iter()
                    .find(|p| p.sum == payload::pattern_checksum(msg.seed, msg.len))
                    .unwrap_or_else(|| panic!("{msg:?} from p{who} not received: {got:#?}"));
                msg.check_recv(piece, src);
            }
            wait(c, who, "sends", sizes.len());
        }
    };
    check(&mut c, &[(known, 0), (stranger, FI_ADDR_NOTAVAIL)]);
    // Once inserted, the stranger has an address too.
    assert_eq!(c.cmd(rx, format!("insert {stranger_addr}")).num(), 1);
    check(&mut c, &[(stranger, 1), (known, 0)]);
    c.finish();
}

/// rx_attr->size is advertised, not a cap: MPI posts thousands of receives,
/// and two peers that both post before they send must not both be refused.
#[test]
fn more_receives_than_rx_size_may_be_posted() {
    let mut c = cluster("beyond-rx-size");
    c.env("FI_UNIMEM_RX_SIZE", "4");
    c.spawn(2).connect_all();
    let msgs: Vec<Msg> = (0..40)
        .map(|i| Msg::new([8, 3000, EAGER + 1, SEGMENT + 7][i % 4], i as u64).tag(i as u64))
        .collect();
    c.transfer(0, 1, &msgs, Order::Posted);
    c.finish();
}
