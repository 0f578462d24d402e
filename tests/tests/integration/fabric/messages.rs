//! Messages of every size through the real libfabric core and the unimem
//! provider, between separate `fabric-peer` processes: every protocol limit
//! (inline, eager, rendezvous segment) minus one, equal and plus one, for
//! each way of sending (untagged, tagged, with CQ data, both), receives
//! posted before or after the data arrived, sends to oneself, 64 MiB, and
//! the `paper` timing profile. Every message is checked byte for byte (by
//! checksum of a seeded pattern), with its length, tag, CQ data, flags and
//! source, and the guard bytes past each receive buffer.

use unimem_tests::cluster::{carried_pulls, Msg, Order, EAGER, SEGMENT};

use super::cluster;

/// A way of sending, and the most it carries inside one 192-bit mailbox
/// message (24 bytes, 2 of header; a tag and CQ data take 8 bytes each).
/// A message up to [`PARTS_MORE`] bytes longer goes in parts (up to four
/// mailbox messages, `inline_parts`).
#[derive(Clone, Copy, Debug)]
struct Way {
    tagged: bool,
    data: bool,
    inline: usize,
}

const UNTAGGED: Way = Way {
    tagged: false,
    data: false,
    inline: 22,
};
// With a tag or CQ data, an inline message has 21 bytes less the
// significant bytes of both: the tags below take 6, the CQ data 8.
const TAGGED: Way = Way {
    tagged: true,
    data: false,
    inline: 15,
};
const DATA: Way = Way {
    tagged: false,
    data: true,
    inline: 13,
};
const TAGGED_DATA: Way = Way {
    tagged: true,
    data: true,
    inline: 7,
};
const WAYS: [Way; 4] = [UNTAGGED, TAGGED, DATA, TAGGED_DATA];
/// What three more mailbox messages of 23 bytes carry.
const PARTS_MORE: usize = 3 * 23;

impl Way {
    /// The most it carries in mailbox messages alone.
    fn parted(self) -> usize {
        self.inline + PARTS_MORE
    }
}

/// Sizes around every limit of `way`: 0, 1, inline, eager and segment
/// limits -1/=/+1, and multiples of the segment (up to past the grant
/// window of 4 segments).
fn limit_sizes(way: Way) -> Vec<usize> {
    let mut sizes = vec![0, 1];
    for limit in [way.inline, way.inline + 23, way.parted(), EAGER, SEGMENT] {
        sizes.extend([limit - 1, limit, limit + 1]);
    }
    sizes.extend([2 * SEGMENT, 3 * SEGMENT, 5 * SEGMENT + 3]);
    sizes
}

/// Messages of `sizes`, sent the way `way` says, with distinct seeds, tags
/// and CQ data derived from `id`.
fn messages(way: Way, sizes: &[usize], id: u64) -> Vec<Msg> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let n = (id << 16) + i as u64;
            let mut msg = Msg::new(len, n);
            if way.tagged {
                msg = msg.tag(0x7a90_0000_0000 + n);
            }
            if way.data {
                msg = msg.data(0xda7a_0000_0000_0000 + n);
            }
            msg
        })
        .collect()
}

fn all_ways(sizes: impl Fn(Way) -> Vec<usize>) -> Vec<Msg> {
    WAYS.iter()
        .enumerate()
        .flat_map(|(id, &way)| messages(way, &sizes(way), id as u64))
        .collect()
}

#[test]
fn every_size_limit_every_way_receives_posted_first() {
    let mut c = cluster("limits-posted");
    c.spawn(2).connect_all();
    let msgs = all_ways(limit_sizes);
    c.transfer(0, 1, &msgs, Order::Posted);
    // And back, over the connection the other side set up.
    c.transfer(
        1,
        0,
        &messages(TAGGED_DATA, &limit_sizes(TAGGED_DATA), 9),
        Order::Posted,
    );
    c.finish();
}

/// An inline message travels inside the mailbox message (or a few, in
/// parts): its send completes while the receiver makes no progress at all
/// (it is stopped). One byte more goes eagerly, which needs the receiver's
/// eager ring, so it cannot complete before the receiver runs. This pins
/// each way's inline limits exactly.
#[test]
fn inline_limits_need_no_receiver() {
    let mut c = cluster("inline");
    c.spawn(1 + WAYS.len()).connect_all();
    let mut sent = Vec::new();
    for (k, &way) in WAYS.iter().enumerate() {
        let rx = k + 1; // a receiver that never heard from p0 yet
        c.pause(rx);
        let msgs = messages(
            way,
            &[way.inline, way.inline + 1, way.parted(), way.parted() + 1],
            k as u64,
        );
        for (ctx, msg) in msgs[..3].iter().enumerate() {
            c.cmd(0, msg.send_cmd(rx as u64, ctx as u64));
            let done = c.cmd(0, "wait sends=1").completions();
            assert_eq!(
                done[0].ctx, ctx as u64,
                "{way:?}: inline send of {} bytes completes alone",
                msg.len
            );
        }
        c.cmd(0, msgs[3].send_cmd(rx as u64, 3));
        // Fails on any completion: the eager send must not complete while
        // its receiver is stopped. A wait that is tested, not a
        // synchronisation (SIGSTOP keeps the receiver still, however slow).
        c.cmd(0, "quiet 50");
        sent.push(msgs);
    }
    for (k, msgs) in sent.iter().enumerate() {
        let rx = k + 1;
        c.resume(rx);
        for (i, msg) in msgs.iter().enumerate() {
            let tag = msg.m.tag.map_or(String::new(), |t| format!(" tag={t:#x}"));
            c.cmd(rx, format!("recv 0 {} {i}{tag}", msg.len));
        }
        let got = c.cmd(rx, "wait recvs=4").completions();
        for done in &got {
            msgs[done.ctx as usize].check_recv(done, 0);
        }
        c.cmd(0, "wait sends=1");
    }
    c.finish();
}

/// Injects (inline, in parts, eager) count on a send counter, and the
/// sender's CQ has no entry for any of them, with or without the counter
/// (the messenger reports sends without a CQ entry only to a counter); the
/// receiver's counter counts each receive, and every message arrives whole.
#[test]
fn injects_count_on_a_send_counter_and_complete_nowhere() {
    for counted in [true, false] {
        let mut c = cluster(if counted { "inject-cntr" } else { "inject" });
        if counted {
            c.env("FABRIC_PEER_CNTR", "msg");
        }
        c.spawn(2).connect_all();
        let msgs = all_ways(|way| {
            vec![
                0,
                1,
                way.inline,
                way.inline + 1,
                way.parted(),
                way.parted() + 1,
                EAGER,
            ]
        });
        for (ctx, msg) in msgs.iter().enumerate() {
            let tag = msg.m.tag.map_or(String::new(), |t| format!(" tag={t:#x}"));
            c.cmd(1, format!("recv 0 {} {ctx}{tag}", msg.len));
        }
        for msg in &msgs {
            c.cmd(
                0,
                format!("inject 1 {} {}{}", msg.len, msg.seed, msg.opts()),
            );
        }
        let got = c.cmd(1, format!("wait recvs={}", msgs.len())).completions();
        for done in &got {
            msgs[done.ctx as usize].check_recv(done, 0);
        }
        let n = msgs.len();
        if counted {
            let sent = c.cmd(0, format!("cntr-wait send={n}")).ok;
            assert_eq!(sent, format!("send={n} send-err=0 recv=0 recv-err=0"));
            let received = c.cmd(1, "cntr").ok;
            assert_eq!(received, format!("send=0 send-err=0 recv={n} recv-err=0"));
        }
        c.cmd(0, "quiet 50");
        let pending = c.cmd(0, "pending").ok;
        assert!(pending.starts_with("sends=0 "), "{pending}");
        c.finish();
    }
}

/// More rendezvous transfers at once than the receiver has staging buffers
/// for (it has 8 of one segment each, and a transfer is granted up to 4
/// segments ahead): grants must wait for free buffers, and resume in
/// order, without ever granting past the end of a message.
#[test]
fn concurrent_rendezvous_transfers() {
    let mut c = cluster("rendezvous");
    c.spawn(2).connect_all();
    let sizes = [
        5 * SEGMENT + 3,
        3 * SEGMENT,
        2 * SEGMENT + 1,
        6 * SEGMENT - 1,
    ];
    let msgs = messages(UNTAGGED, &sizes.repeat(3), 1);
    c.transfer(0, 1, &msgs, Order::Posted);
    c.transfer(0, 1, &msgs, Order::Unexpected);
    c.finish();
}

/// With the dmable heap preloaded (send and receive buffers dmable), a
/// receiver that polls when a request to send comes reads the message from
/// the sender's buffer itself: every rendezvous message of a window posted
/// first, each way of sending, one segment and several. One that arrives
/// before its receive is granted, the sender copying, as before. Every byte is checked either way, and the
/// close lines say which path each took.
#[test]
fn a_polling_receiver_reads_rendezvous_messages_from_the_sender() {
    let mut c = cluster("pull");
    c.preload_heap()
        .env("FI_LOG_LEVEL", "info")
        .spawn(2)
        .connect_all();
    let sizes = |_: Way| vec![EAGER + 1, SEGMENT, 3 * SEGMENT + 7, 9 * SEGMENT];
    let posted = all_ways(sizes);
    c.transfer(0, 1, &posted, Order::Posted);
    c.transfer(0, 1, &all_ways(sizes), Order::Unexpected);
    let logs = c.finish();
    assert_eq!(
        carried_pulls(&logs[1]),
        posted.len() as u64,
        "p1 read every message it was polling for, and no other"
    );
    assert_eq!(carried_pulls(&logs[0]), 0, "p0 received nothing");
}

#[test]
fn unexpected_messages_of_every_size() {
    let mut c = cluster("limits-unexpected");
    c.spawn(2).connect_all();
    // Up to the eager limit the sends complete before any receive is
    // posted (Transfer checks it); larger ones wait for their receive.
    c.transfer(0, 1, &all_ways(limit_sizes), Order::Unexpected);
    c.finish();
}

#[test]
fn sixty_four_mebibytes() {
    let mut c = cluster("64mib");
    c.spawn(2).connect_all();
    let big = 64 << 20;
    c.transfer(0, 1, &[Msg::new(big, 1)], Order::Posted);
    let tagged = Msg::new(big + 1, 2).tag(0x64).data(0xd);
    c.transfer(1, 0, &[tagged], Order::Unexpected);
    c.finish();
}

#[test]
fn sends_to_oneself() {
    let mut c = cluster("self");
    c.spawn(1).connect_all();
    let sizes = |way: Way| {
        vec![
            0,
            way.inline,
            way.inline + 1,
            EAGER,
            EAGER + 1,
            3 * SEGMENT + 1,
        ]
    };
    c.transfer(0, 0, &all_ways(sizes), Order::Posted);
    c.transfer(
        0,
        0,
        &messages(TAGGED, &sizes(TAGGED), 7),
        Order::Unexpected,
    );
    c.finish();
}

#[test]
fn paper_timing_profile() {
    let mut c = cluster("paper");
    // Debug logging shows the configuration the provider took.
    c.env("FI_UNIMEM_PROFILE", "paper")
        .env("FI_LOG_LEVEL", "debug")
        .spawn(2)
        .connect_all();
    let sizes = |way: Way| {
        vec![
            0,
            way.inline,
            way.inline + 1,
            EAGER,
            EAGER + 1,
            SEGMENT + 1,
            4 * SEGMENT,
        ]
    };
    c.transfer(0, 1, &all_ways(sizes), Order::Posted);
    c.transfer(
        1,
        0,
        &messages(UNTAGGED, &sizes(UNTAGGED), 5),
        Order::Unexpected,
    );
    for stderr in c.finish() {
        assert!(stderr.contains("<debug> profile = paper"), "{stderr}");
    }
}
