//! Completion levels through the real libfabric core and the unimem
//! provider, between separate `fabric-peer` processes (fi_cq(3)):
//! a send with `FI_MATCH_COMPLETE | FI_DELIVERY_COMPLETE` (as MPICH's
//! pipeline rendezvous sends its chunks) completes only once the target has
//! matched the message or queued it as unexpected, so not while the target
//! is stopped (SIGSTOP: no progress at all); a send without them completes
//! once its message is at the target (transmit complete), stopped or not.
//! The same holds for the endpoint's default flags (`tx_attr.op_flags`).
//! `FI_COMMIT_COMPLETE` (persistent memory, which we have none of) is
//! refused.

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{Cluster, Completion, Msg, Order, EAGER};
use unimem_tests::fabric::rc;

use super::cluster;

const SEND_CTX: u64 = 5_000;
const RECV_CTX: u64 = 6_000;
const LEVELS: &str = "completion|match-complete|delivery-complete";
/// How long a stopped target is watched for completions that must not
/// come: any length shows the point, none proves it.
const QUIET_MS: u64 = 300;

/// Sizes of every way: inline-sized (which goes eager for these flags),
/// eager, the eager limit, and rendezvous.
fn messages() -> Vec<Msg> {
    [8, 3000, EAGER, 3 * EAGER]
        .iter()
        .enumerate()
        .map(|(i, &len)| Msg::new(len, 0x40 + i as u64).tag(0x700 + i as u64))
        .collect()
}

fn contexts(done: &[Completion]) -> Vec<u64> {
    let mut ctx: Vec<u64> = done.iter().map(|d| d.ctx).collect();
    ctx.sort_unstable();
    ctx
}

fn post_receives(c: &mut Cluster, tx: usize, rx: usize, msgs: &[Msg]) {
    for (i, m) in msgs.iter().enumerate() {
        let tag = m.m.tag.expect("tagged");
        c.cmd(
            rx,
            format!("recv {tx} {} {} tag={tag:#x}", m.len, RECV_CTX + i as u64),
        );
    }
}

fn check_receives(c: &mut Cluster, tx: usize, rx: usize, msgs: &[Msg]) {
    let mut recvs = c
        .cmd(rx, format!("wait recvs={}", msgs.len()))
        .completions();
    recvs.sort_by_key(|r| r.ctx);
    for (done, (i, m)) in recvs.iter().zip(msgs.iter().enumerate()) {
        assert_eq!(done.ctx, RECV_CTX + i as u64);
        m.check_recv(done, tx as u64);
    }
}

/// Sends `msgs` (with `flags`, or the endpoint's default flags) from 0 to
/// a stopped 1, with or without receives posted there first, and checks
/// that none completes while 1 is stopped; then that, once 1 runs, the
/// inline- and eager-sized ones complete before any receive is posted
/// (queued as unexpected: match and delivery complete), and every message
/// arrives intact.
fn wait_for_a_stopped_target(test: &str, flags: Option<&str>, tx_op_flags: &str, posted: bool) {
    let mut c = cluster(test);
    c.env("FABRIC_PEER_TX_OP_FLAGS", tx_op_flags)
        .spawn(2)
        .connect_all();
    // First contact: each side knows the other's eager ring.
    c.transfer(0, 1, &[Msg::new(100, 1)], Order::Posted);
    let msgs = messages();
    if posted {
        post_receives(&mut c, 0, 1, &msgs);
    }
    c.pause(1);
    let flags = flags.map_or(String::new(), |f| format!(" flags={f}"));
    for (i, m) in msgs.iter().enumerate() {
        let send = m.send_cmd(1, SEND_CTX + i as u64);
        c.cmd(0, format!("{send}{flags}"));
    }
    // Nothing completes while the target is stopped, during the posts or
    // after: its data may be in the target's ring (transmit complete), but
    // nothing matched it.
    c.cmd(0, format!("quiet {QUIET_MS}"));
    assert_eq!(c.cmd(0, "pending").field("sends"), 0, "completed early");
    c.resume(1);
    if !posted {
        // The target runs (it reads its CQ between commands): it queues
        // the inline- and eager-sized messages as unexpected, and that
        // completes their sends, with no receive posted.
        let early = msgs.iter().filter(|m| m.len <= EAGER).count();
        let done = c.cmd(0, format!("wait sends={early}")).completions();
        assert_eq!(
            contexts(&done),
            (0..early as u64).map(|i| SEND_CTX + i).collect::<Vec<_>>()
        );
        post_receives(&mut c, 0, 1, &msgs);
        check_receives(&mut c, 0, 1, &msgs);
        let rest = msgs.len() - early;
        c.cmd(0, format!("wait sends={rest}"));
    } else {
        let done = c.cmd(0, format!("wait sends={}", msgs.len())).completions();
        assert_eq!(
            contexts(&done),
            (0..msgs.len() as u64)
                .map(|i| SEND_CTX + i)
                .collect::<Vec<_>>()
        );
        check_receives(&mut c, 0, 1, &msgs);
    }
    c.finish();
}

#[test]
fn match_and_delivery_complete_wait_for_the_unexpected_queue() {
    wait_for_a_stopped_target("levels-unexpected", Some(LEVELS), "", false);
}

#[test]
fn match_and_delivery_complete_wait_for_the_posted_receive() {
    wait_for_a_stopped_target("levels-posted", Some(LEVELS), "", true);
}

/// The same through the endpoint's default flags: `fi_tsend` on an
/// endpoint opened with `tx_attr.op_flags` = `FI_MATCH_COMPLETE`.
#[test]
fn match_complete_as_the_endpoints_op_flags() {
    wait_for_a_stopped_target("levels-op-flags", None, "completion|match-complete", false);
}

/// Without those flags, inline and eager sends complete while the target
/// is stopped (transmit complete); fi_getinfo takes every level in hints
/// but commit, and a send asking for commit is refused.
#[test]
fn transmit_complete_needs_no_target_and_commit_is_refused() {
    let mut c = cluster("levels-transmit");
    c.spawn(2).connect_all();
    c.transfer(0, 1, &[Msg::new(100, 1)], Order::Posted);
    let msgs: Vec<Msg> = messages().into_iter().filter(|m| m.len <= EAGER).collect();
    c.pause(1);
    for (i, m) in msgs.iter().enumerate() {
        let flags = ["", " flags=transmit-complete", " flags=inject-complete"][i % 3];
        let send = m.send_cmd(1, SEND_CTX + i as u64);
        c.cmd(0, format!("{send}{flags}"));
    }
    c.cmd(0, format!("wait sends={}", msgs.len()));
    c.resume(1);
    post_receives(&mut c, 0, 1, &msgs);
    check_receives(&mut c, 0, 1, &msgs);

    for flags in [
        "inject-complete",
        "transmit-complete",
        "match-complete",
        "delivery-complete",
        "completion|match-complete|delivery-complete",
    ] {
        let rc = c.cmd(0, format!("getinfo tx-flags={flags}")).num();
        assert_eq!(rc, 0, "fi_getinfo with tx op_flags {flags}");
    }
    let rc = c.cmd(0, "getinfo tx-flags=commit-complete").num();
    assert_eq!(rc, rc::ENODATA as i64);
    let rc = c
        .cmd(0, "try-send 1 100 tag=5 flags=completion|commit-complete")
        .num();
    assert_eq!(rc, -(ffi::FI_EBADFLAGS as i64));
    c.finish_with_warnings();
}
