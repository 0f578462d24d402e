//! Peers that do not agree with us, through the real libfabric core and the
//! unimem provider, in separate `fabric-peer` processes: endpoints started
//! with other sizes adapt to each other at first contact (issue 12, row 14),
//! and the data arrives intact; a hostile process that forges protocol
//! messages (rows 1-3) is dropped and fenced while the data of the others
//! arrives intact; nothing hangs (every command of the cluster has a
//! deadline).

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{is_provider_warning, Msg, Order, EAGER, SEGMENT};
use unimem_tests::fabric::rc;

use super::cluster;

/// Sizes around both sides' thresholds, and messages of many fragments.
fn messages(small: usize, large: usize) -> Vec<Msg> {
    let mut lens = vec![0, 22, 23, 1000];
    for edge in [small, large] {
        lens.extend([edge - 1, edge, edge + 1]);
    }
    lens.extend([3 * large + 5, 1 << 20]);
    lens.iter()
        .enumerate()
        .flat_map(|(i, &len)| {
            [
                Msg::new(len, i as u64 + 1),
                Msg::new(len, i as u64 + 101).tag(0xab00 + i as u64).data(7),
            ]
        })
        .collect()
}

/// Two ranks of one job that read different configuration files: one with
/// a small `FI_UNIMEM_SEGMENT_SIZE` (resp. `FI_UNIMEM_EAGER_SIZE`), the
/// other with a large one. Every message arrives intact both ways, each
/// side having taken the smaller size for this peer; no warning.
#[test]
fn endpoints_with_other_sizes_adapt_to_each_other() {
    let cases = [
        ("FI_UNIMEM_SEGMENT_SIZE", 65536, 262144),
        ("FI_UNIMEM_EAGER_SIZE", 1024, 8192),
    ];
    for (var, small, large) in cases {
        for small_first in [true, false] {
            let mut c = cluster(&format!("sizes-{var}-{small_first}"));
            let (first, second) = if small_first {
                (small, large)
            } else {
                (large, small)
            };
            c.env(var, &first.to_string()).spawn(1);
            c.env(var, &second.to_string()).spawn(1);
            c.connect_all();
            let msgs = messages(small, large);
            c.transfer(0, 1, &msgs, Order::Posted);
            c.transfer(1, 0, &msgs, Order::Posted);
            c.transfer(0, 1, &msgs, Order::Posted);
            c.finish();
        }
    }
}

/// Sends that name memory they cannot have: a NULL buffer with a length,
/// iov lengths that add up past 2^64, a NULL iov_base with a length. Each
/// is refused with `-FI_EINVAL` (no segfault, no 0-byte message sent);
/// the endpoint still works and the peer received nothing else.
#[test]
fn sends_of_impossible_buffers_are_refused() {
    let mut c = cluster("bad-bufs");
    c.spawn(2).connect_all();
    for _ in 0..3 {
        let reply = c.cmd(0, "bad-send 1");
        let einval = i64::from(rc::EINVAL);
        assert_eq!(reply.field("null"), einval, "fi_send(NULL, 100)");
        assert_eq!(reply.field("wrap"), einval, "fi_sendv, lengths wrap");
        assert_eq!(reply.field("null-iov"), einval, "fi_sendv, NULL iov_base");
    }
    c.transfer(0, 1, &[Msg::new(10, 1), Msg::new(70_000, 2)], Order::Posted);
    c.finish_with_warnings();
}

/// A send to an endpoint that closed (its process gone, its objects
/// removed) before we ever sent to it fails with `-FI_EHOSTUNREACH`, not
/// `-FI_EINVAL`: the address was good. Repeated, it is warned about a few
/// times a second, not once per call; the endpoint still works.
#[test]
fn a_send_to_a_closed_endpoint_is_unreachable() {
    let mut c = cluster("closed");
    c.spawn(3).connect_all();
    let gone = c.peers.remove(2);
    gone.finish();
    let unreachable = -(ffi::FI_EHOSTUNREACH as i64);
    for _ in 0..50 {
        assert_eq!(c.cmd(0, "try-send 2 10").num(), unreachable);
        assert_eq!(c.cmd(0, "try-send 2 100000").num(), unreachable);
    }
    c.transfer(
        0,
        1,
        &[Msg::new(100, 1), Msg::new(100_000, 2)],
        Order::Posted,
    );
    let stderr = c.finish_with_warnings().swap_remove(0);
    let warnings = stderr
        .lines()
        .filter(|l| is_provider_warning(l) && l.contains("Unreachable"))
        .count();
    assert!(
        (1..=20).contains(&warnings),
        "{warnings} warnings for 100 refused sends:\n{stderr}"
    );
}

/// A receive directed (`FI_DIRECTED_RECV`) at a peer that never sent
/// anything fails with `FI_EHOSTUNREACH` once that peer dies: one killed
/// before the receive is posted, one killed after, both before any
/// traffic. Within the peer-check bound, not never.
#[test]
fn a_directed_receive_from_a_peer_dead_before_any_traffic_fails() {
    let mut c = cluster("silent-dead");
    c.env("FI_UNIMEM_PEER_CHECK_MS", "20");
    c.spawn(3).connect_all();
    c.kill(2);
    let started = std::time::Instant::now();
    c.cmd(0, "recv 2 100 5");
    c.cmd(0, "recv 1 100 6 tag=3");
    c.cmd(0, "progress");
    c.kill(1);
    let errors = c.cmd(0, "wait errors=2").completions();
    let mut ctxs: Vec<u64> = errors.iter().map(|e| e.ctx).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, [5, 6]);
    for e in &errors {
        assert_eq!(e.err, ffi::FI_EHOSTUNREACH, "{e}");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    c.finish_with_warnings();
}

/// A receive from any source fails with `FI_EHOSTUNREACH` once every peer
/// the endpoint could hear from is gone, and not before: p0 talked with p1
/// and p2 (p3 is in its AV but silent); p1 dies and the receive waits; p2
/// dies and it still waits (p3 could send); p3 dies and it fails, and so
/// does one posted after. p0's own address in its AV does not count.
#[test]
fn a_receive_from_anyone_fails_once_every_peer_is_gone() {
    let mut c = cluster("all-gone");
    c.env("FI_UNIMEM_PEER_CHECK_MS", "20");
    c.spawn(4).connect_all();
    for from in [1, 2] {
        c.transfer(from, 0, &[Msg::new(100, 1)], Order::Posted);
    }
    c.cmd(0, "recv any 100 5");
    // Many peer checks after each death: nothing completes.
    c.kill(1);
    c.cmd(0, "quiet 300");
    c.kill(2);
    c.cmd(0, "quiet 300");
    let started = std::time::Instant::now();
    c.kill(3);
    let errors = c.cmd(0, "wait errors=1").completions();
    assert_eq!((errors[0].ctx, errors[0].err), (5, ffi::FI_EHOSTUNREACH));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    c.cmd(0, "recv any 100 6 tag=2");
    let errors = c.cmd(0, "wait errors=1").completions();
    assert_eq!((errors[0].ctx, errors[0].err), (6, ffi::FI_EHOSTUNREACH));
    let stderr = c.finish_with_warnings().swap_remove(0);
    assert!(
        stderr.contains("receives from any source failed"),
        "no warning:\n{stderr}"
    );
}

/// A server's receive from any source whose only client, in its AV but
/// never heard from (the hostile-writer runs: the client's messages were
/// lost to a corrupted ring, and it gave up), is gone: the peer check sees
/// nobody left and the receive fails, instead of waiting for ever. One
/// whose client lives waits.
#[test]
fn a_receive_from_anyone_fails_when_its_silent_peers_are_gone() {
    let mut c = cluster("silent-gone");
    c.env("FI_UNIMEM_PEER_CHECK_MS", "20");
    c.spawn(2).connect_all();
    c.cmd(0, "recv any 100 5");
    c.cmd(0, "quiet 200");
    let started = std::time::Instant::now();
    let gone = c.peers.remove(1);
    gone.finish();
    let errors = c.cmd(0, "wait errors=1").completions();
    assert_eq!((errors[0].ctx, errors[0].err), (5, ffi::FI_EHOSTUNREACH));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    c.finish_with_warnings();
}

/// Issue 12, rows 1-3, with a separate hostile process: while p0 and p1
/// exchange messages of every protocol both ways (rendezvous sends in
/// flight, eager slots in use), two `unimem-node forge` processes send each
/// of them 3,000 forged messages: FINs, grants and fragment reports naming
/// ids of the transfers in flight, eager announcements, hellos, credits,
/// RMA and atomic answers, and raw random bytes, from a new peer every 8
/// messages. Every message of p0 and p1 arrives intact (no transfer
/// completes early or with other data, nothing hangs), both drop the
/// forgeries with a rate-limited warning and fence their senders, and
/// neither panics.
#[test]
fn forged_protocol_messages_of_another_process_are_dropped() {
    let mut c = cluster("forged");
    c.spawn(2).connect_all();
    let mut forgers: Vec<std::process::Child> = (0..2)
        .map(|i| {
            std::process::Command::new(env!("CARGO_BIN_EXE_unimem-node"))
                .args([
                    c.job(),
                    "forge",
                    &c[i].addr,
                    "3000",
                    &(1234 + i).to_string(),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start unimem-node forge")
        })
        .collect();
    let msgs = messages(EAGER, SEGMENT);
    let mut rounds = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    // Traffic until both forgers are done (each waits for room in its
    // victim's mailbox, which only the victim's progress makes), and at
    // least two rounds.
    while rounds < 2 || forgers.iter_mut().any(|f| f.try_wait().unwrap().is_none()) {
        assert!(
            std::time::Instant::now() < deadline,
            "forgers did not finish"
        );
        c.transfer(0, 1, &msgs, Order::Posted);
        c.transfer(1, 0, &msgs, Order::Unexpected);
        rounds += 1;
    }
    for f in forgers {
        let out = f.wait_with_output().unwrap();
        assert!(out.status.success(), "unimem-node forge failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("forged 3000 "), "{text}");
    }
    // The victims still work together.
    c.transfer(0, 1, &msgs, Order::Posted);
    c.transfer(1, 0, &msgs, Order::Posted);
    for (i, stderr) in c.finish_with_warnings().iter().enumerate() {
        assert!(!stderr.contains("panicked"), "p{i} panicked:\n{stderr}");
        assert!(
            stderr.contains("dropped invalid peer message"),
            "p{i} did not report the forgeries:\n{stderr}"
        );
        let warnings: Vec<&str> = stderr.lines().filter(|l| is_provider_warning(l)).collect();
        assert!(
            warnings.len() < 200,
            "p{i}: {} warnings, not rate-limited; the first:\n{}",
            warnings.len(),
            warnings[..20].join("\n")
        );
    }
}

/// Issue 12, row 9: more rendezvous receives waiting at once than 16-bit
/// wire ids can name. Two senders post 33,000 rendezvous messages each
/// (eager size 0: every message past the inline size goes by rendezvous)
/// to one receiver that posts 66,000 receives, then stall for a second
/// with their transfers started, so that the receiver has 66,000
/// rendezvous to serve (64,512 ids are there for them). Its 16-bit receive id used to wrap and the job
/// hung; now a rendezvous waits for a free id, and every message arrives
/// intact and in order per sender.
#[test]
fn more_rendezvous_receives_than_wire_ids() {
    // Tens of thousands of rendezvous take a while in a debug build.
    unimem_tests::cluster::set_answer_timeout(std::time::Duration::from_secs(300));
    let mut c = cluster("ids");
    // The peers' watchdog (150 s by default) must not end them before
    // their own bound does: a loaded machine took longer than that.
    c.env("FI_UNIMEM_EAGER_SIZE", "0")
        .env("FI_UNIMEM_TX_SIZE", "40000")
        .env("FI_UNIMEM_MBX_DEPTH", "65536")
        .env("FABRIC_PEER_WATCHDOG", "320");
    c.spawn(3).connect_all();
    let traffic = "count=33000 lens=100 within=280000";
    let replies = c.all(&[
        (0, format!("traffic rank=0 from=2 window=66000 {traffic}")),
        (1, format!("traffic rank=1 to=0 hold=1000 {traffic}")),
        (2, format!("traffic rank=2 to=0 hold=1000 {traffic}")),
    ]);
    assert_eq!(replies[0].field("received"), 66_000);
    assert_eq!(replies[1].field("sent"), 33_000);
    assert_eq!(replies[2].field("sent"), 33_000);
    c.finish();
}
