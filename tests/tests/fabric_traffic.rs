//! Volume through the real libfabric core and the unimem provider, between
//! separate `fabric-peer` processes: 100,000 messages in flight arriving in
//! order, and several endpoints exchanging all at once. The `traffic`
//! command of `fabric-peer` posts sends until the provider says
//! -FI_EAGAIN, progresses, and checks every message it receives: its
//! stamp (sender, sequence number, contents), its length, its tag, per
//! sender order and a source address that stays the same per sender.

use unimem_tests::cluster::Cluster;

fn cluster(test: &str) -> Cluster {
    Cluster::new(env!("CARGO_BIN_EXE_fabric-peer"), test)
}

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
