//! Bad input through the real libfabric core and the unimem provider, in
//! separate `fabric-peer` processes: every mistake must give an error code
//! and a warning in libfabric's log (`FI_LOG_LEVEL=warn`, on the child's
//! stderr), never a crash, and the endpoint keeps working afterwards.

use unimem_tests::cluster::{is_provider_warning, Cluster, Msg, Order, EAGER, SEGMENT};
use unimem_tests::fabric::rc;

use super::cluster;

/// A warning from the provider on stderr containing every one of `parts`.
fn assert_warned(stderr: &str, parts: &[&str]) {
    let found = stderr
        .lines()
        .any(|l| is_provider_warning(l) && parts.iter().all(|p| l.contains(p)));
    assert!(found, "no provider warning with {parts:?} in:\n{stderr}");
}

/// Runs `command` on child `i` and checks the return code it reports.
fn expect_rc(c: &mut Cluster, i: usize, command: &str, expected: i32) {
    let got = c.cmd(i, command).num();
    assert_eq!(got, i64::from(expected), "{command}");
}

/// The endpoints still carry messages of every protocol after the errors.
fn still_works(c: &mut Cluster) {
    let msgs = [0, 22, EAGER, 2 * SEGMENT + 1].map(|len| Msg::new(len, len as u64));
    c.transfer(0, 1, &msgs, Order::Posted);
}

#[test]
fn send_to_an_address_not_in_the_av() {
    let mut c = cluster("bad-addr");
    c.spawn(2).connect_all();
    expect_rc(&mut c, 0, "try-send 12345 10", rc::EINVAL);
    expect_rc(&mut c, 0, "try-send 2 10 tag=1", rc::EINVAL);
    expect_rc(&mut c, 0, "try-send 77 10 inject", rc::EINVAL);
    // So are directed receives from one.
    expect_rc(&mut c, 0, "try-recv 9 10 1", rc::EINVAL);
    expect_rc(&mut c, 0, "try-recv 9 10 2 tag=1", rc::EINVAL);
    still_works(&mut c);
    let stderr = c.finish_with_warnings().swap_remove(0);
    assert_warned(
        &stderr,
        &["fi_send", "fi_addr 0x3039", "not in the endpoint's AV"],
    );
    assert_warned(
        &stderr,
        &["fi_tsend", "fi_addr 0x2", "not in the endpoint's AV"],
    );
    assert_warned(
        &stderr,
        &["fi_inject", "fi_addr 0x4d", "not in the endpoint's AV"],
    );
    assert_warned(
        &stderr,
        &["fi_recv", "fi_addr 0x9", "not in the endpoint's AV"],
    );
    assert_warned(
        &stderr,
        &["fi_trecv", "fi_addr 0x9", "not in the endpoint's AV"],
    );
}

/// Two tagged messages from `tx` to a receive of `rx` directed at it:
/// each side finds the other through the endpoint's cache the second time.
fn exchange_twice(c: &mut Cluster, tx: usize, rx: usize) {
    for ctx in [1, 2] {
        let msg = Msg::new(10, ctx).tag(5);
        c.cmd(rx, format!("recv {tx} 10 {ctx} tag=5"));
        c.cmd(tx, msg.send_cmd(rx as u64, ctx));
        let got = c.cmd(rx, "wait recvs=1").completions();
        msg.check_recv(&got[0], tx as u64);
        c.cmd(tx, "wait sends=1");
    }
}

#[test]
fn directed_receives_from_a_removed_address_are_refused() {
    let mut c = cluster("removed-src");
    c.spawn(2).connect_all();
    let (rx, tx) = (0, 1);
    // Twice from the same source: the second receive finds it again
    // (the endpoint remembers a directed receive's source).
    exchange_twice(&mut c, tx, rx);
    c.cmd(rx, "remove 1");
    expect_rc(&mut c, rx, "try-recv 1 10 3 tag=5", rc::EINVAL);
    expect_rc(&mut c, rx, "try-recv 1 10 4", rc::EINVAL);
    let stderr = c.finish_with_warnings().swap_remove(rx);
    assert_warned(
        &stderr,
        &["fi_trecv", "fi_addr 0x1", "not in the endpoint's AV"],
    );
    assert_warned(
        &stderr,
        &["fi_recv", "fi_addr 0x1", "not in the endpoint's AV"],
    );
}

/// A destination sent to before is found again without the AV (the
/// endpoint remembers it); once removed from the AV, sends to it are
/// refused as to any address it does not hold, and the rest still go.
#[test]
fn sends_to_a_removed_address_are_refused() {
    let mut c = cluster("removed-dest");
    c.spawn(3).connect_all();
    let (tx, rx) = (0, 1);
    exchange_twice(&mut c, tx, rx);
    c.cmd(tx, "remove 1");
    expect_rc(&mut c, tx, "try-send 1 10 tag=5", rc::EINVAL);
    expect_rc(&mut c, tx, "try-send 1 10 inject", rc::EINVAL);
    expect_rc(&mut c, tx, "try-send 1 10", rc::EINVAL);
    // Another peer is still reached.
    let msg = Msg::new(10, 3);
    c.cmd(2, "recv 0 10 3");
    c.cmd(tx, msg.send_cmd(2, 3));
    let got = c.cmd(2, "wait recvs=1").completions();
    msg.check_recv(&got[0], tx as u64);
    let stderr = c.finish_with_warnings().swap_remove(tx);
    assert_warned(
        &stderr,
        &["fi_tsend", "fi_addr 0x1", "not in the endpoint's AV"],
    );
    assert_warned(
        &stderr,
        &["fi_send", "fi_addr 0x1", "not in the endpoint's AV"],
    );
}

#[test]
fn messages_over_the_limits_are_refused_before_reading() {
    let mut c = cluster("too-big");
    // By default every length goes (64-bit lengths on the wire); the
    // tunable bounds it.
    c.env("FI_UNIMEM_MAX_MSG_SIZE", "1g");
    c.spawn(2).connect_all();
    let limits = c.cmd(0, "limits");
    assert_eq!(
        limits.field("inject"),
        EAGER as i64,
        "inject_size is the eager size"
    );
    assert_eq!(limits.field("max"), 1 << 30, "max_msg_size");
    // 2 GiB > max_msg_size (1 GiB), from a 16-byte buffer: reading it
    // would crash, so this also shows nothing was read.
    let two_gib = 2u64 << 30;
    expect_rc(
        &mut c,
        0,
        &format!("try-send 1 {two_gib} buf=16"),
        rc::EMSGSIZE,
    );
    expect_rc(
        &mut c,
        0,
        &format!("try-send 1 {two_gib} buf=16 tag=3 data=4"),
        rc::EMSGSIZE,
    );
    expect_rc(
        &mut c,
        0,
        &format!("try-send 1 {} buf=16", (1u64 << 30) + 1),
        rc::EMSGSIZE,
    );
    // Inject above inject_size (the eager size, 16384); the limit itself is fine.
    expect_rc(
        &mut c,
        0,
        &format!("try-send 1 {} buf=16 inject", EAGER + 1),
        rc::EINVAL,
    );
    expect_rc(
        &mut c,
        0,
        &format!("try-send 1 {} buf=16 inject tag=5", EAGER + 1),
        rc::EINVAL,
    );
    c.cmd(0, format!("inject 1 {EAGER} 7"));
    c.cmd(1, format!("recv 0 {EAGER} 1"));
    c.cmd(1, "wait recvs=1");
    // An inject has no completion: none may come while p0 keeps polling
    // for a while (the wait is what is tested, not a synchronisation).
    c.cmd(0, "quiet 50");
    still_works(&mut c);
    let stderr = c.finish_with_warnings().swap_remove(0);
    for op in ["fi_send", "fi_tsenddata"] {
        let any_of = ["TooLong", "max_msg_size", "too long", "exceed"];
        let found = stderr
            .lines()
            .filter(|l| l.contains("<warn>") && l.contains(&format!("{op}:")))
            .any(|l| any_of.iter().any(|w| l.contains(w)));
        assert!(found, "no warning that {op} was too long in:\n{stderr}");
    }
    assert_warned(
        &stderr,
        &["fi_inject", "16385 bytes exceed the inject size 16384"],
    );
    assert_warned(
        &stderr,
        &["fi_tinject", "16385 bytes exceed the inject size 16384"],
    );
}

#[test]
fn unmet_getinfo_hints_give_no_data() {
    let mut c = cluster("hints");
    c.spawn(1);
    expect_rc(&mut c, 0, "getinfo caps=rma", 0);
    expect_rc(&mut c, 0, "getinfo caps=rma|rma-event", 0);
    expect_rc(&mut c, 0, "getinfo caps=msg|atomic", 0);
    expect_rc(&mut c, 0, "getinfo caps=msg|collective", rc::ENODATA);
    expect_rc(&mut c, 0, "getinfo ep=msg", rc::ENODATA);
    expect_rc(&mut c, 0, "getinfo ep=dgram", rc::ENODATA);
    expect_rc(&mut c, 0, "getinfo caps=msg|tagged ep=rdm", 0);
    let stderr = c.finish_with_warnings().swap_remove(0);
    assert_warned(&stderr, &["fi_getinfo: no match", "FI_COLLECTIVE"]);
    assert_warned(&stderr, &["fi_getinfo: no match", "FI_EP_MSG"]);
    assert_warned(&stderr, &["fi_getinfo: no match", "FI_EP_DGRAM"]);
}

#[test]
fn busy_domain_and_endpoints_not_enabled() {
    let mut c = cluster("busy");
    c.spawn(2).connect_all();
    expect_rc(&mut c, 0, "close-domain", rc::EBUSY);
    let reply = c.cmd(0, "disabled-ep");
    for op in ["unbound", "send", "tsend", "inject", "recv", "trecv"] {
        assert_eq!(
            reply.field(op),
            i64::from(rc::EOPBADSTATE),
            "{op}: {}",
            reply.ok
        );
    }
    still_works(&mut c);
    let stderr = c.finish_with_warnings().swap_remove(0);
    assert_warned(&stderr, &["fi_close(domain)", "still open"]);
    for op in ["fi_send", "fi_tsend", "fi_inject", "fi_recv", "fi_trecv"] {
        assert_warned(&stderr, &[&format!("{op}: the endpoint is not enabled")]);
    }
}

/// A receiver whose dmable memory is bounded to what its endpoint needs
/// has no room for a new peer's eager ring. It warns that it will then
/// take messages inline and by rendezvous only: messages of every size
/// must still arrive, not hang.
#[test]
fn receiver_without_room_for_an_eager_ring() {
    let mut c = cluster("no-ring");
    c.spawn(1);
    c.env("FI_UNIMEM_DMA_SEGMENT_SIZE", "2m")
        .env("FI_UNIMEM_DMA_MAX_SIZE", "2m")
        .spawn(1);
    c.connect_all();
    let msgs = [10, 1000, 3 * SEGMENT].map(|len| Msg::new(len, len as u64));
    for (i, msg) in msgs.iter().enumerate() {
        c.cmd(1, format!("recv 0 {} {i}", msg.len));
        c.cmd(0, msg.send_cmd(1, i as u64));
    }
    let n = msgs.len();
    // The children's own wait limit ($FABRIC_PEER_WAIT, 30 s) tells a
    // hang; how fast the messages come is not this test's business.
    let replies = c.all(&[
        (0, format!("wait sends={n}")),
        (1, format!("wait recvs={n}")),
    ]);
    for done in replies[1].completions() {
        msgs[done.ctx as usize].check_recv(&done, 0);
    }
    let stderr = c.finish_with_warnings().swap_remove(1);
    assert_warned(&stderr, &["no dmable memory for a peer's eager ring"]);
}

/// A process out of file descriptors cannot read `/proc`: its checks of
/// its peers' liveness must take that for "unknown", not for a death
/// (which used to fail every operation with its peers). Child 0 progresses
/// for 600 ms (six peer checks) without a free descriptor, then carries
/// messages of every protocol to child 1.
#[test]
fn out_of_file_descriptors_no_peer_is_taken_for_dead() {
    let mut c = cluster("fd-exhaustion");
    c.spawn(2).connect_all();
    still_works(&mut c);
    let held = c.cmd(0, "exhaust-fds 600");
    assert!(held.field("held") > 0, "{}", held.ok);
    still_works(&mut c);
    c.finish();
}
