//! The `traffic` command: stamped messages to and from several peers, every
//! one checked (contents, length, tag, per-sender order, source).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use unimem_fi_sys as ffi;
use unimem_tests::fabric::{rc, CqEntry, Match, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use unimem_tests::payload;

use super::args::Args;
use super::{CmdResult, Peer, TrafficEvent, TRAFFIC_RECV, TRAFFIC_SEND};

impl Peer {
    pub(super) fn traffic(&mut self, a: &Args) -> CmdResult {
        let spec = Traffic {
            rank: a.opt("rank")?.ok_or("rank= missing")? as u32,
            to: a.list("to")?,
            from: a.opt("from")?.unwrap_or(0),
            count: a.opt("count")?.ok_or("count= missing")?,
            lens: a.list("lens")?.into_iter().map(|l| l as usize).collect(),
            tagged: a.flag("tagged"),
            window: a.opt("window")?.unwrap_or(256) as usize,
            hold: Duration::from_millis(a.opt("hold")?.unwrap_or(0)),
            within: a
                .opt("within")?
                .map_or(self.wait_limit, Duration::from_millis),
        };
        if spec.lens.is_empty() || spec.lens.iter().any(|&l| l < payload::STAMP_LEN) {
            return Err(format!("lens= must list sizes >= {}", payload::STAMP_LEN));
        }
        spec.run(self)
    }
}

/// The `traffic` command: stamped messages to and from many peers at once.
struct Traffic {
    rank: u32,
    to: Vec<u64>,
    from: u64,
    count: u64,
    lens: Vec<usize>,
    tagged: bool,
    window: usize,
    /// No libfabric call for this long once the first sends are posted.
    hold: Duration,
    /// How long it may take.
    within: Duration,
}

fn tag_of(rank: u32, seq: u64) -> u64 {
    (u64::from(rank) << 48) | seq
}

/// The receiving half of `traffic`: a window of receive buffers, reposted
/// as they complete, and what each sender's messages looked like.
struct Receiving {
    /// Buffers, and the number of the post each is in (posts are numbered
    /// in order).
    slots: Vec<(Vec<u8>, u64)>,
    posts: u64,
    /// Per sender: its source address, and (sequence, post number) of each
    /// message in completion order.
    heard: HashMap<u32, (u64, Vec<(u64, u64)>)>,
    /// Completion order must be send order too: every message fits one
    /// mailbox message (inline), so none can be overtaken. (Eager-sized
    /// ones can: a receiver that holds too much unexpected data throttles
    /// its sender, whose eager messages then go by rendezvous and complete
    /// after later inline ones; their matching order is still checked.)
    strict: bool,
}

impl Traffic {
    /// What the provider carries inline, with a tag of 8 significant bytes
    /// at most (ranks and sequence numbers) when tagged.
    fn inline_capacity(&self) -> usize {
        unimem_proto::wire::inline_capacity(&unimem_proto::wire::MatchInfo {
            tag: self.tagged.then_some(u64::MAX),
            data: None,
        })
    }

    fn len_of(&self, seq: u64) -> usize {
        self.lens[(seq % self.lens.len() as u64) as usize]
    }

    fn run(&self, peer: &mut Peer) -> CmdResult {
        let expected = self.from * self.count;
        let max_len = *self.lens.iter().max().expect("lens checked");
        let mut rx = Receiving {
            slots: vec![(vec![0; max_len], 0); self.window.min(expected as usize)],
            posts: 0,
            heard: HashMap::new(),
            strict: max_len <= self.inline_capacity(),
        };
        for slot in 0..rx.slots.len() {
            self.post_recv(peer, &mut rx, slot)?;
        }
        let mut next_send = vec![0u64; self.to.len()];
        let total_sends = self.to.len() as u64 * self.count;
        let (mut sent, mut received, mut refused) = (0u64, 0u64, 0u64);
        let deadline = Instant::now() + self.within;
        let mut hold = self.hold;
        while received < expected || sent < total_sends {
            let mut busy = self.post_sends(peer, &mut next_send, &mut refused)?;
            if !hold.is_zero() {
                std::thread::sleep(std::mem::take(&mut hold));
            }
            busy |= peer.poll();
            for event in std::mem::take(&mut peer.traffic) {
                match event {
                    TrafficEvent::Sent => sent += 1,
                    TrafficEvent::Failed(e) => return Err(format!("traffic error entry: {e:?}")),
                    TrafficEvent::Received(e) => {
                        let slot = (e.context as u64 & !TRAFFIC_RECV) as usize;
                        self.check(&e, &mut rx, slot)?;
                        received += 1;
                        if rx.posts < expected {
                            self.post_recv(peer, &mut rx, slot)?;
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "timed out: sent {sent} of {total_sends} (posted {next_send:?}), \
                     received {received} of {expected}"
                ));
            }
            if !busy {
                std::thread::yield_now();
            }
        }
        self.check_order(&rx)?;
        Ok(format!("sent={sent} received={received} eagain={refused}"))
    }

    pub(super) fn post_recv(
        &self,
        peer: &mut Peer,
        rx: &mut Receiving,
        slot: usize,
    ) -> Result<(), String> {
        let tag = self.tagged.then_some((0, u64::MAX));
        let (buf, post) = &mut rx.slots[slot];
        *post = rx.posts;
        rx.posts += 1;
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: the slot buffers live until the command ends, after every
        // receive completed, and a slot is reposted only after completing.
        peer.retry("traffic recv", |ep| unsafe {
            ep.recv(ptr, len, FI_ADDR_UNSPEC, tag, TRAFFIC_RECV as usize | slot)
        })
    }

    /// Posts sends round-robin until every destination is done or the
    /// provider says -FI_EAGAIN (counted in `refused`). Returns whether it
    /// posted any.
    fn post_sends(
        &self,
        peer: &mut Peer,
        next: &mut [u64],
        refused: &mut u64,
    ) -> Result<bool, String> {
        let mut posted = false;
        loop {
            let mut round = false;
            for (d, &dest) in self.to.iter().enumerate() {
                let seq = next[d];
                if seq == self.count {
                    continue;
                }
                let mut buf = vec![0u8; self.len_of(seq)];
                payload::stamp(&mut buf, self.rank, seq);
                let ctx = TRAFFIC_SEND | (d as u64) << 40 | seq;
                let m = Match {
                    tag: self.tagged.then(|| tag_of(self.rank, seq)),
                    data: None,
                };
                // SAFETY: the buffer is kept in send_bufs until completion.
                let code = unsafe {
                    peer.obj
                        .ep
                        .send(buf.as_ptr(), buf.len(), dest, m, ctx as usize)
                };
                match code {
                    0 => {
                        peer.send_bufs.keep(ctx, buf);
                        next[d] += 1;
                        round = true;
                    }
                    n if n == rc::EAGAIN as isize => {
                        *refused += 1;
                        return Ok(posted);
                    }
                    n => return Err(format!("traffic send: {}", peer.rc_text(n))),
                }
            }
            if !round {
                return Ok(posted);
            }
            posted = true;
        }
    }

    /// Checks one received message: contents, length, tag, source.
    fn check(&self, e: &CqEntry, rx: &mut Receiving, slot: usize) -> Result<(), String> {
        let (buf, post) = &rx.slots[slot];
        let data = buf
            .get(..e.len)
            .ok_or("completion longer than the buffer")?;
        let (rank, seq) =
            payload::unstamp(data).ok_or_else(|| format!("corrupt message: {e:?}"))?;
        let what = format!("message {seq} from {rank}");
        if e.len != self.len_of(seq) {
            return Err(format!(
                "{what}: {} bytes, sent {}",
                e.len,
                self.len_of(seq)
            ));
        }
        if self.tagged && (e.tag != tag_of(rank, seq) || e.flags & ffi::FI_TAGGED == 0) {
            return Err(format!("{what}: tag {:#x}", e.tag));
        }
        if e.src == FI_ADDR_NOTAVAIL {
            return Err(format!("{what}: no source"));
        }
        let (src, seen) = rx.heard.entry(rank).or_insert((e.src, Vec::new()));
        if e.src != *src {
            return Err(format!("{what}: source {} after {src}", e.src));
        }
        if rx.strict && seen.last().map_or(0, |&(s, _)| s + 1) != seq {
            return Err(format!("{what} completed after {:?}", seen.last()));
        }
        seen.push((seq, *post));
        Ok(())
    }

    /// Every sender's messages all arrived, once each, and took the
    /// receives in the order they were posted (FI_ORDER_SAS).
    fn check_order(&self, rx: &Receiving) -> Result<(), String> {
        let sources: HashSet<u64> = rx.heard.values().map(|h| h.0).collect();
        if rx.heard.len() as u64 != self.from || sources.len() != rx.heard.len() {
            return Err(format!(
                "heard {} senders from {} sources, expected {}",
                rx.heard.len(),
                sources.len(),
                self.from
            ));
        }
        for (rank, (_, seen)) in &rx.heard {
            let mut seen = seen.clone();
            seen.sort_unstable();
            for (i, w) in seen.iter().enumerate() {
                if w.0 != i as u64 {
                    return Err(format!("from {rank}: message {} where {i} was due", w.0));
                }
            }
            if let Some(w) = seen.windows(2).find(|w| w[0].1 > w[1].1) {
                return Err(format!(
                    "from {rank}: message {} matched post {}, message {} the earlier post {}",
                    w[0].0, w[0].1, w[1].0, w[1].1
                ));
            }
        }
        Ok(())
    }
}
