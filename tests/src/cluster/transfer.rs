//! Checked transfers: messages of seeded patterns, sent and received in a
//! given order, every completion and byte checked.

use std::collections::HashMap;

use unimem_fi_sys as ffi;

use super::{Cluster, Completion, Kind};
use crate::fabric::Match;
use crate::payload;

/// One message of a transfer: `len` bytes of the pattern of `seed`.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub len: usize,
    pub seed: u64,
    pub m: Match,
}

impl Msg {
    pub fn new(len: usize, seed: u64) -> Msg {
        Msg {
            len,
            seed,
            m: Match::default(),
        }
    }

    pub fn tag(mut self, tag: u64) -> Msg {
        self.m.tag = Some(tag);
        self
    }

    pub fn data(mut self, data: u64) -> Msg {
        self.m.data = Some(data);
        self
    }

    /// Options of `send`/`recv` commands for this message's match info.
    pub fn opts(&self) -> String {
        let mut s = String::new();
        if let Some(tag) = self.m.tag {
            s += &format!(" tag={tag:#x}");
        }
        if let Some(data) = self.m.data {
            s += &format!(" data={data:#x}");
        }
        s
    }

    /// `fabric-peer` command sending this message to `dest` as `ctx`.
    pub fn send_cmd(&self, dest: u64, ctx: u64) -> String {
        format!(
            "send {dest} {} {} {ctx}{}",
            self.len,
            self.seed,
            self.opts()
        )
    }

    /// Checks a receive completion against this message.
    pub fn check_recv(&self, c: &Completion, src: u64) {
        let what = format!("{self:?} received as {c}");
        assert_eq!(c.kind, Kind::Recv, "{what}");
        assert_eq!(c.len, self.len, "length: {what}");
        assert_eq!(
            c.sum,
            payload::pattern_checksum(self.seed, self.len),
            "data: {what}"
        );
        assert!(c.guard, "wrote past the buffer: {what}");
        assert_eq!(c.src, src, "source: {what}");
        let kind = if self.m.tag.is_some() {
            ffi::FI_TAGGED
        } else {
            ffi::FI_MSG
        };
        assert!(c.has(ffi::FI_RECV | kind), "flags: {what}");
        assert_eq!(c.tag, self.m.tag.unwrap_or(0), "tag: {what}");
        assert_eq!(
            c.has(ffi::FI_REMOTE_CQ_DATA),
            self.m.data.is_some(),
            "{what}"
        );
        if let Some(data) = self.m.data {
            assert_eq!(c.data, data, "CQ data: {what}");
        }
    }
}

/// When the receives of a transfer are posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Before anything is sent.
    Posted,
    /// After the sends: every message up to the eager size has completed
    /// at the sender and every message has reached the receiver unexpected.
    Unexpected,
}

/// Context numbers of a transfer's sends and receives.
const SEND_CTX: u64 = 1_000_000;
const RECV_CTX: u64 = 2_000_000;
/// Eager limit the clusters run with (`FI_UNIMEM_EAGER_SIZE`).
pub const EAGER: usize = 16384;
/// Segment size the clusters run with (`FI_UNIMEM_SEGMENT_SIZE`).
pub const SEGMENT: usize = 65536;

pub(super) struct Transfer<'a> {
    pub(super) cluster: &'a mut Cluster,
    pub(super) tx: usize,
    pub(super) rx: usize,
}

impl Transfer<'_> {
    fn post_receives(&mut self, msgs: &[Msg]) {
        let src = self.tx; // fi_addr j is child j (connect_all)
        for (i, msg) in msgs.iter().enumerate() {
            let tag = msg.m.tag.map_or(String::new(), |t| format!(" tag={t:#x}"));
            let ctx = RECV_CTX + i as u64;
            self.cluster
                .cmd(self.rx, format!("recv {src} {} {ctx}{tag}", msg.len));
        }
    }

    /// Waits for `sends` send and `recvs` receive completions, on both
    /// children at once.
    fn wait(&mut self, sends: usize, recvs: usize) -> (Vec<Completion>, Vec<Completion>) {
        if self.tx == self.rx {
            let all = self
                .cluster
                .cmd(self.tx, format!("wait sends={sends} recvs={recvs}"))
                .completions();
            return all.into_iter().partition(|c| c.kind == Kind::Send);
        }
        let replies = self.cluster.all(&[
            (self.tx, format!("wait sends={sends}")),
            (self.rx, format!("wait recvs={recvs}")),
        ]);
        (replies[0].completions(), replies[1].completions())
    }

    pub(super) fn run(mut self, msgs: &[Msg], order: Order) {
        let dest = self.rx as u64;
        if order == Order::Posted {
            self.post_receives(msgs);
        }
        for (i, msg) in msgs.iter().enumerate() {
            self.cluster
                .cmd(self.tx, msg.send_cmd(dest, SEND_CTX + i as u64));
        }
        let mut sends = Vec::new();
        if order == Order::Unexpected {
            // Sends that need no receive complete now...
            let early = msgs.iter().filter(|m| m.len <= EAGER).count();
            sends = self.wait(early, 0).0;
            let mut early_ctx: Vec<u64> = sends.iter().map(|c| c.ctx).collect();
            early_ctx.sort_unstable();
            let expected: Vec<u64> = (0..msgs.len())
                .filter(|&i| msgs[i].len <= EAGER)
                .map(|i| SEND_CTX + i as u64)
                .collect();
            assert_eq!(early_ctx, expected, "sends completed before any receive");
            // ...and the receiver takes in everything that has arrived.
            self.cluster.cmd(self.rx, "progress");
            self.post_receives(msgs);
        }
        let (more, recvs) = self.wait(msgs.len() - sends.len(), msgs.len());
        sends.extend(more);
        check_sends(&sends, msgs);
        let by_ctx: HashMap<u64, &Completion> = recvs.iter().map(|c| (c.ctx, c)).collect();
        assert_eq!(by_ctx.len(), msgs.len(), "one completion per receive");
        for (i, msg) in msgs.iter().enumerate() {
            let c = by_ctx
                .get(&(RECV_CTX + i as u64))
                .unwrap_or_else(|| panic!("no completion for receive {i} ({msg:?})"));
            msg.check_recv(c, self.tx as u64);
        }
    }
}

fn check_sends(sends: &[Completion], msgs: &[Msg]) {
    let mut ctxs: Vec<u64> = sends.iter().map(|c| c.ctx).collect();
    ctxs.sort_unstable();
    let expected: Vec<u64> = (0..msgs.len() as u64).map(|i| SEND_CTX + i).collect();
    assert_eq!(ctxs, expected, "one send completion per message");
    for c in sends {
        let msg = &msgs[(c.ctx - SEND_CTX) as usize];
        let kind = if msg.m.tag.is_some() {
            ffi::FI_TAGGED
        } else {
            ffi::FI_MSG
        };
        assert!(c.has(ffi::FI_SEND | kind), "{msg:?}: {c}");
    }
}
