//! Volume through the real libfabric core and the unimem provider, between
//! separate `fabric-peer` processes: 100,000 messages in flight arriving in
//! order, and several endpoints exchanging all at once. The `traffic`
//! command of `fabric-peer` posts sends until the provider says
//! -FI_EAGAIN, progresses, and checks every message it receives: its
//! stamp (sender, sequence number, contents), its length, its tag, per
//! sender order and a source address that stays the same per sender.

use unimem_tests::cluster::Cluster;

use super::cluster;

/// Sender 0 sends `count` messages to receiver 1.
fn one_way(test: &str, count: u64, options: &str) {
    let mut c = cluster(test);
    c.spawn(2).connect_all();
    let replies = c.all(&[
        (0, format!("traffic rank=0 to=1 count={count} {options}")),
        (1, format!("traffic rank=1 from=1 count={count} {options}")),
    ]);
    assert_eq!(replies[0].field("sent"), count as i64);
    assert_eq!(replies[1].field("received"), count as i64);
    println!(
        "{test}: the sender was told -FI_EAGAIN {} times",
        replies[0].field("eagain")
    );
    c.finish();
}

#[test]
fn hundred_thousand_untagged_messages_in_order() {
    one_way("100k-untagged", 100_000, "lens=16");
}

#[test]
fn hundred_thousand_tagged_messages_in_order() {
    // 12 bytes fit a tagged inline message (14).
    one_way("100k-tagged", 100_000, "lens=12 tagged");
}

#[test]
fn mixed_sizes_in_order() {
    // Inline, eager and rendezvous messages interleaved keep their order.
    one_way("mixed", 3_000, "lens=16,200,16384,16385,70000");
}

/// Every endpoint sends to every other while receiving from all of them.
fn all_to_all(test: &str, peers: usize, count: u64, options: &str) {
    let mut c = cluster(test);
    c.spawn(peers);
    exchange(&mut c, count, options);
    c.finish();
}

/// All children send `count` messages to every other and receive as many
/// from each, at once.
fn exchange(c: &mut Cluster, count: u64, options: &str) {
    let peers = c.peers.len();
    c.connect_all();
    let commands: Vec<(usize, String)> = (0..peers)
        .map(|me| {
            let to: Vec<String> = (0..peers)
                .filter(|&p| p != me)
                .map(|p| p.to_string())
                .collect();
            let from = peers - 1;
            let to = to.join(",");
            (
                me,
                format!("traffic rank={me} to={to} from={from} count={count} {options}"),
            )
        })
        .collect();
    for reply in c.all(&commands) {
        let per_peer = (peers as i64 - 1) * count as i64;
        assert_eq!(reply.field("sent"), per_peer);
        assert_eq!(reply.field("received"), per_peer);
    }
}

#[test]
fn four_endpoints_all_to_all() {
    all_to_all("all-to-all", 4, 4_000, "lens=16,200,5000");
}

#[test]
fn three_endpoints_all_to_all_tagged_with_rendezvous() {
    all_to_all("all-to-all-tagged", 3, 600, "lens=12,3000,70000 tagged");
}

/// Processes that start at the same moment (as a job launcher starts
/// ranks) must not disturb each other: each one's start-up clean-up of
/// objects left by dead processes runs while the others create theirs.
#[test]
fn endpoints_starting_together() {
    for round in 0..4 {
        let mut c = cluster(&format!("together-{round}"));
        c.spawn_together(8);
        // No time limit of its own: the children's wait limit
        // ($FABRIC_PEER_WAIT, 30 s) only tells a hang.
        exchange(&mut c, 20, "lens=16,5000");
        c.finish();
    }
}

/// The receiver's close line: (most unexpected bytes held from one
/// sender, times a sender was throttled).
fn unexpected_held(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.contains("unexpected messages held at most"))
        .unwrap_or_else(|| panic!("no unexpected-messages line in:\n{stderr}"));
    let nums: Vec<u64> = line
        .split("held at most")
        .nth(1)
        .expect("split")
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().expect("digits"))
        .collect();
    (nums[0], nums[1])
}

/// Four senders each send 10,000 eager and 100 rendezvous messages to a
/// receiver that progresses but posts no receive for two seconds, then
/// takes them all (contents and per-sender order checked). Returns the
/// receiver's (peak held from one sender, throttles).
fn unexpected_flood(test: &str, limit: &str) -> (u64, u64) {
    let mut c = cluster(test);
    c.env("FI_UNIMEM_UNEXPECTED_PER_PEER", limit)
        .env("FI_LOG_LEVEL", "info")
        .env("FABRIC_PEER_WAIT", "120");
    c.spawn(5).connect_all();
    // 100 eager messages of 1000 bytes, then one rendezvous of 70000.
    let mut lens = vec!["1000"; 100];
    lens.push("70000");
    let lens = lens.join(",");
    let count = 10_100;
    let senders: Vec<(usize, String)> = (1..5)
        .map(|s| {
            (
                s,
                format!("traffic rank={s} to=0 count={count} lens={lens}"),
            )
        })
        .collect();
    for (s, command) in &senders {
        c.begin(*s, command.as_str());
    }
    // Progressing, no receive posted: everything that arrives is unexpected.
    c.cmd(0, "quiet 2000");
    let got = c.cmd(
        0,
        format!("traffic rank=0 from=4 count={count} lens={lens} within=120000"),
    );
    assert_eq!(got.field("received"), 4 * count as i64);
    for reply in c.answers(&senders) {
        assert_eq!(reply.field("sent"), count as i64);
    }
    let logs = c.finish();
    unexpected_held(&logs[0])
}

/// Unexpected traffic at scale: the receiver's memory for unexpected data
/// stays bounded per sender (`unexpected_per_peer`; past it senders are
/// throttled to rendezvous), every message arrives intact and in order,
/// and the senders finish. Without the bound the same flood is held
/// whole.
#[test]
fn unexpected_flood_from_four_senders_is_bounded_and_intact() {
    let (held, throttles) = unexpected_flood("unexpected-64k", "64k");
    // The bound, plus what a sender had in flight when told: its eager
    // credits (16 slots of at most 16 KiB) and some mailbox messages.
    let bound = (64 << 10) + 16 * ((16 << 10) + 64) + (64 << 10);
    println!("64 KiB limit: held at most {held} bytes from one sender, {throttles} throttles");
    assert!(held <= bound, "held {held} > {bound}");
    assert!(throttles >= 1, "never throttled");
    let (unbounded, never) = unexpected_flood("unexpected-unbounded", "1t");
    println!("no limit: held at most {unbounded} bytes from one sender");
    assert_eq!(never, 0);
    assert!(
        unbounded > 4 * bound,
        "the flood itself holds only {unbounded}"
    );
}
