//! Posting never waits for the peer, through the real libfabric core and
//! the unimem provider, between separate `fabric-peer` processes: a sender
//! posts far more sends and injects than the receiver has eager credits
//! for while the receiver is stopped (SIGSTOP: it makes no progress at
//! all), and every call is accepted; once the receiver runs, everything
//! arrives in order, intact, and the sends complete in order. The one
//! limit is the sender's own transmit queue (`tx_size`): beyond it, and
//! only then, -FI_EAGAIN.

use unimem_tests::cluster::{Cluster, Completion, Msg, Order, EAGER};
use unimem_tests::fabric::rc;

use super::cluster;

const SEND_CTX: u64 = 5_000;
const RECV_CTX: u64 = 6_000;

/// One message of a burst, and whether it goes by `fi_inject`.
struct Post {
    msg: Msg,
    inject: bool,
}

/// One raw send (or inject) of `post` from child `tx` to child `rx` as
/// `ctx`: its return code.
fn try_send(c: &mut Cluster, tx: usize, rx: usize, post: &Post, ctx: u64) -> i64 {
    let inject = if post.inject { " inject" } else { "" };
    c.cmd(
        tx,
        format!(
            "try-send {rx} {} seed={} ctx={ctx}{inject}",
            post.msg.len, post.msg.seed
        ),
    )
    .num()
}

/// Posts receives for `posts` on `rx` (from `tx`), waits for them all and
/// checks that receive i got message i, whole; then waits for the sender's
/// completions (injects have none) and checks that they come in send order.
fn receive_in_order(c: &mut Cluster, tx: usize, rx: usize, posts: &[Post]) {
    for (i, post) in posts.iter().enumerate() {
        c.cmd(
            rx,
            format!("recv {tx} {} {}", post.msg.len, RECV_CTX + i as u64),
        );
    }
    let recvs = c
        .cmd(rx, format!("wait recvs={}", posts.len()))
        .completions();
    let order: Vec<u64> = recvs.iter().map(|r| r.ctx - RECV_CTX).collect();
    assert_eq!(
        order,
        (0..posts.len() as u64).collect::<Vec<_>>(),
        "receives complete in send order"
    );
    for (done, post) in recvs.iter().zip(posts) {
        post.msg.check_recv(done, tx as u64);
    }
    let sends: Vec<u64> = posts
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.inject)
        .map(|(i, _)| SEND_CTX + i as u64)
        .collect();
    let done: Vec<Completion> = c
        .cmd(tx, format!("wait sends={}", sends.len()))
        .completions();
    let order: Vec<u64> = done.iter().map(|d| d.ctx).collect();
    assert_eq!(order, sends, "send completions in send order");
}

#[test]
fn sends_to_a_stopped_receiver_are_all_accepted() {
    let mut c = cluster("posts-never-wait");
    c.spawn(2).connect_all();
    // First contact: each side knows the other's eager ring (16 credits).
    c.transfer(0, 1, &[Msg::new(100, 1)], Order::Posted);
    // Inline, eager up to the eager limit, every fifth an inject: 120
    // messages, most of them eager, far beyond the 16 credits, the 64
    // bounce buffers and (with the injects) anything the receiver returns.
    let posts: Vec<Post> = (0..120u64)
        .map(|i| Post {
            msg: Msg::new([8, 100, 3000, EAGER, 700][i as usize % 5], 0x100 + i),
            inject: i % 5 == 4,
        })
        .collect();
    // The receiver makes no progress from here until all are posted.
    c.pause(1);
    for (i, post) in posts.iter().enumerate() {
        let rc = try_send(&mut c, 0, 1, post, SEND_CTX + i as u64);
        assert_eq!(rc, 0, "post {i} ({:?}, inject: {})", post.msg, post.inject);
    }
    c.resume(1);
    receive_in_order(&mut c, 0, 1, &posts);
    c.finish();
}

/// With `FI_UNIMEM_TX_SIZE=8` the ninth outstanding send (or inject) is
/// refused with -FI_EAGAIN while the receiver is stopped; the accepted ones
/// complete once it runs, in order, and posting works again.
#[test]
fn a_full_transmit_queue_says_eagain() {
    let tx_size = 8;
    let credits = 2;
    let mut c = cluster("tx-size");
    c.env("FI_UNIMEM_TX_SIZE", &tx_size.to_string())
        .env("FI_UNIMEM_EAGER_CREDITS", &credits.to_string())
        .spawn(2)
        .connect_all();
    c.transfer(0, 1, &[Msg::new(100, 1)], Order::Posted);
    c.pause(1);
    let post = |i: u64| Post {
        msg: Msg::new(100 + i as usize, 0x200 + i),
        inject: false,
    };
    let mut posts = Vec::new();
    let fill = |c: &mut Cluster, posts: &mut Vec<Post>| loop {
        let next = post(posts.len() as u64);
        let rc = try_send(c, 0, 1, &next, SEND_CTX + posts.len() as u64);
        if rc != 0 {
            assert_eq!(rc, rc::EAGAIN as i64, "after {} sends", posts.len());
            break;
        }
        posts.push(next);
        assert!(posts.len() <= 64, "the transmit queue never filled");
    };
    fill(&mut c, &mut posts);
    // A send that had a credit leaves and completes without the receiver,
    // at any progress of the sender (it progresses between commands too),
    // freeing its place: let every such send complete, then fill again.
    // Nothing else can free a place while the receiver is stopped.
    c.cmd(0, "progress");
    fill(&mut c, &mut posts);
    // Those with credits may have left and completed; tx_size wait.
    let accepted = posts.len();
    assert!(
        (tx_size..=tx_size + credits).contains(&accepted),
        "{accepted} sends accepted with tx_size {tx_size} and {credits} credits"
    );
    let inject = Post {
        msg: Msg::new(8, 0x300),
        inject: true,
    };
    assert_eq!(try_send(&mut c, 0, 1, &inject, 0), rc::EAGAIN as i64);
    c.resume(1);
    receive_in_order(&mut c, 0, 1, &posts);
    // Room again.
    let more = [post(accepted as u64)];
    assert_eq!(try_send(&mut c, 0, 1, &more[0], SEND_CTX), 0);
    receive_in_order(&mut c, 0, 1, &more);
    c.finish();
}
