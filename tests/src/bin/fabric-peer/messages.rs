//! Completions (reading the CQ and queueing what completed), posting
//! messages (`send`, `inject`, `recv`, `try-send`, `bad-send`...) and waiting
//! for them (`wait`, `quiet`, `pending`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use unimem_fi_sys as ffi;
use unimem_tests::cluster::{Completion, Kind};
use unimem_tests::fabric::{rc, CqEntry, CqError, Ep, Match};
use unimem_tests::payload;

use super::args::{send_flags, Args};
use super::objects::RecvBuf;
use super::{
    fatal, CmdResult, Peer, TrafficEvent, GUARD, GUARD_BYTE, QUEUES, TRAFFIC_RECV, TRAFFIC_SEND,
};

impl Peer {
    pub(super) fn rc_text(&self, code: isize) -> String {
        format!("{code} ({})", self.api.strerror(code))
    }

    /// Reads everything the CQ has (which also progresses the endpoint).
    /// Returns whether anything completed.
    pub(super) fn poll(&mut self) -> bool {
        let mut any = false;
        for _ in 0..16 {
            let mut entries = Vec::new();
            match self.obj.cq.read_from(&mut entries) {
                Ok(0) => break,
                Ok(_) => {
                    any = true;
                    entries.into_iter().for_each(|e| self.on_entry(e));
                }
                Err(n) if n == rc::EAVAIL as isize => match self.obj.cq.read_err() {
                    Ok(e) => {
                        any = true;
                        self.on_error(e);
                    }
                    Err(n) => fatal(&format!("fi_cq_readerr: {}", self.rc_text(n))),
                },
                Err(n) => fatal(&format!("fi_cq_readfrom: {}", self.rc_text(n))),
            }
        }
        any
    }

    pub(super) fn on_entry(&mut self, e: CqEntry) {
        let ctx = e.context as u64;
        if e.flags & ffi::FI_ATOMIC != 0 {
            self.atomic_done
                .entry(ctx)
                .or_default()
                .push_back((e.flags, 0));
        } else if e.flags & ffi::FI_REMOTE_WRITE != 0 {
            let mut c = Completion::new(Kind::Remote, ctx, e.flags);
            (c.len, c.data, c.src) = (e.len, e.data, e.src);
            if let Some((key, off, len)) = self.watch {
                match self.obj.mrs.iter().find(|r| r.key == key) {
                    Some(r) if off + len <= r.len => {
                        c.off = off;
                        c.sum = payload::checksum(&r.bytes()[off..off + len]);
                        c.guard = r.guards_intact();
                    }
                    _ => fatal(&format!("watch: no range {off}+{len} of region {key}")),
                }
            }
            self.remote.push_back(c);
        } else if e.flags & (ffi::FI_RMA | ffi::FI_WRITE) == ffi::FI_RMA | ffi::FI_WRITE {
            self.write_bufs.done(ctx);
            self.writes
                .push_back(Completion::new(Kind::Write, ctx, e.flags));
        } else if e.flags & (ffi::FI_RMA | ffi::FI_READ) == ffi::FI_RMA | ffi::FI_READ {
            let c = self.read_done(Kind::Read, ctx, e.flags);
            self.reads.push_back(c);
        } else if e.flags & ffi::FI_SEND != 0 {
            self.send_bufs.done(ctx);
            if ctx & TRAFFIC_SEND != 0 {
                self.traffic.push(TrafficEvent::Sent);
            } else {
                self.sends
                    .push_back(Completion::new(Kind::Send, ctx, e.flags));
            }
        } else if ctx & TRAFFIC_RECV != 0 {
            self.traffic.push(TrafficEvent::Received(e));
        } else {
            let mut c = self.received(Kind::Recv, ctx, e.flags, e.buf, e.len);
            (c.tag, c.data, c.src) = (e.tag, e.data, e.src);
            self.recvs.push_back(c);
        }
    }

    fn on_error(&mut self, e: CqError) {
        let ctx = e.context as u64;
        if ctx & (TRAFFIC_SEND | TRAFFIC_RECV) != 0 {
            self.traffic.push(TrafficEvent::Failed(e));
            return;
        }
        if e.flags & ffi::FI_ATOMIC != 0 {
            self.atomic_done
                .entry(ctx)
                .or_default()
                .push_back((e.flags, e.err));
            return;
        }
        let rma = e.flags & ffi::FI_RMA != 0;
        let mut c = if rma && e.flags & ffi::FI_WRITE != 0 {
            self.write_bufs.done(ctx);
            Completion::new(Kind::Error, ctx, e.flags)
        } else if rma && e.flags & ffi::FI_READ != 0 {
            self.read_done(Kind::Error, ctx, e.flags)
        } else if e.flags & ffi::FI_SEND != 0 {
            self.send_bufs.done(ctx);
            Completion::new(Kind::Error, ctx, e.flags)
        } else {
            self.received(Kind::Error, ctx, e.flags, e.buf, e.len)
        };
        (c.tag, c.data, c.err, c.olen) = (e.tag, e.data, e.err, e.olen);
        self.errors.push_back(c);
    }

    /// The end of the read posted as `ctx`: its length and the checksum of
    /// what it read, and whether the guards are intact; for an error, whether
    /// the whole buffer is (no byte may land). The buffer is freed.
    fn read_done(&mut self, kind: Kind, ctx: u64, flags: u64) -> Completion {
        let mut c = Completion::new(kind, ctx, flags);
        let Some(rb) = self.read_bufs.remove(&ctx) else {
            eprintln!("fabric-peer: completion for unknown read {ctx}");
            c.guard = false;
            return c;
        };
        c.len = rb.len;
        let (before, rest) = rb.mem.split_at(GUARD);
        let (data, after) = rest.split_at(rb.len);
        c.sum = payload::checksum(data);
        let untouched = |b: &[u8]| b.iter().all(|&x| x == GUARD_BYTE);
        c.guard = untouched(before) && untouched(after) && (kind != Kind::Error || untouched(data));
        c
    }

    /// A completion for data that landed in the buffer posted as `ctx`:
    /// where, its checksum, the guard. A buffer is freed with its
    /// completion; a released multi-receive buffer is kept until the end
    /// (`released`), so that a piece reported after its release is still
    /// seen, and written to memory that is still ours.
    fn received(&mut self, kind: Kind, ctx: u64, flags: u64, buf: usize, len: usize) -> Completion {
        let mut c = Completion::new(kind, ctx, flags);
        c.len = len;
        let rb = match self.recv_bufs.get(&ctx) {
            Some(rb) => rb,
            None => match self.released.iter().rev().find(|(c, _)| *c == ctx) {
                Some((_, rb)) => rb,
                None => {
                    eprintln!("fabric-peer: completion for unknown receive {ctx}");
                    c.guard = false;
                    return c;
                }
            },
        };
        c.off = buf.wrapping_sub(rb.mem.as_ptr() as usize);
        let in_bounds = c.off.checked_add(len).is_some_and(|end| end <= rb.len);
        c.guard = in_bounds && rb.mem[rb.len..].iter().all(|&b| b == GUARD_BYTE);
        c.sum = if in_bounds {
            payload::checksum(&rb.mem[c.off..c.off + len])
        } else {
            0
        };
        let multi = rb.multi;
        if !multi {
            self.recv_bufs.remove(&ctx);
        } else if flags & ffi::FI_MULTI_RECV != 0 {
            if let Some(rb) = self.recv_bufs.remove(&ctx) {
                self.released.push((ctx, rb));
            }
        }
        c
    }
}

impl Peer {
    /// Repeats `post` while it says -FI_EAGAIN, progressing in between.
    pub(super) fn retry(
        &mut self,
        what: &str,
        mut post: impl FnMut(&Ep) -> isize,
    ) -> Result<(), String> {
        let deadline = Instant::now() + self.wait_limit;
        loop {
            match post(&self.obj.ep) {
                0 => return Ok(()),
                n if n == rc::EAGAIN as isize && Instant::now() < deadline => {
                    if !self.poll() {
                        std::thread::yield_now();
                    }
                }
                n => return Err(format!("{what}: {}", self.rc_text(n))),
            }
        }
    }

    pub(super) fn send(&mut self, a: &Args) -> CmdResult {
        let (dest, len, seed, ctx) = (a.num(0)?, a.num(1)? as usize, a.num(2)?, a.num(3)?);
        let m = a.matching()?;
        let flags = a
            .opts
            .get("flags")
            .map(|names| send_flags(names))
            .transpose()?;
        let buf = payload::pattern(seed, len);
        let ptr = buf.as_ptr();
        // The heap block does not move with the Vec: it stays valid while
        // the map holds it, until the completion.
        self.send_bufs.keep(ctx, buf);
        // SAFETY: `len` bytes at ptr, kept in send_bufs until completion.
        let posted = self.retry("send", |ep| unsafe {
            match flags {
                Some(flags) => ep.sendmsg(ptr, len, dest, m, ctx as usize, flags),
                None => ep.send(ptr, len, dest, m, ctx as usize),
            }
        });
        if posted.is_err() {
            self.send_bufs.done(ctx);
        }
        posted.map(|()| String::new())
    }

    /// An inject, retried while the provider says -FI_EAGAIN (it may, until
    /// the peer's eager ring is known, since an inject must leave at once).
    pub(super) fn inject(&mut self, a: &Args) -> CmdResult {
        let (dest, len, seed) = (a.num(0)?, a.num(1)? as usize, a.num(2)?);
        let m = a.matching()?;
        let buf = payload::pattern(seed, len);
        // SAFETY: buf holds len bytes; an inject copies them before returning.
        self.retry("inject", |ep| unsafe {
            ep.inject(buf.as_ptr(), len, dest, m)
        })
        .map(|()| String::new())
    }

    /// Posts a receive; with `once`, makes one call and returns its code
    /// instead of retrying.
    pub(super) fn post_recv(&mut self, a: &Args, multi: bool, once: bool) -> CmdResult {
        let (src, len, ctx) = (a.addr(0)?, a.num(1)? as usize, a.num(2)?);
        let tag = match a.opt("tag")? {
            Some(tag) => Some((tag, a.opt("ignore")?.unwrap_or(0))),
            None => None,
        };
        let mut mem = vec![GUARD_BYTE; len + GUARD];
        let ptr = mem.as_mut_ptr();
        if self
            .recv_bufs
            .insert(ctx, RecvBuf { mem, len, multi })
            .is_some()
        {
            return Err(format!("receive {ctx} is already posted"));
        }
        let post = |ep: &Ep| {
            // SAFETY: `len` writable bytes at ptr, kept in recv_bufs until
            // the completion that releases them.
            unsafe {
                if multi {
                    ep.recv_multi(ptr, len, src, ctx as usize)
                } else {
                    ep.recv(ptr, len, src, tag, ctx as usize)
                }
            }
        };
        if once {
            let code = post(&self.obj.ep);
            if code != 0 {
                self.recv_bufs.remove(&ctx);
            }
            return Ok(code.to_string());
        }
        let posted = self.retry("recv", post);
        if posted.is_err() {
            self.recv_bufs.remove(&ctx);
        }
        posted.map(|()| String::new())
    }

    /// One raw send or inject, for the bad-input checks.
    pub(super) fn try_send(&mut self, a: &Args) -> CmdResult {
        let (dest, len) = (a.num(0)?, a.num(1)? as usize);
        let buf_len = a.opt("buf")?.map_or(len, |n| n as usize);
        let ctx = a.opt("ctx")?.unwrap_or(999_999);
        let m = a.matching()?;
        let seed = a.opt("seed")?.unwrap_or(7);
        let buf = payload::pattern(seed, buf_len);
        let inject = a.flag("inject");
        let flags = a
            .opts
            .get("flags")
            .map(|names| send_flags(names))
            .transpose()?;
        // SAFETY: when len > buf_len the provider must refuse the call
        // without reading (that is what is being checked); otherwise buf
        // holds len bytes, kept until the completion below.
        let code = unsafe {
            match flags {
                _ if inject => self.obj.ep.inject(buf.as_ptr(), len, dest, m),
                Some(flags) => self
                    .obj
                    .ep
                    .sendmsg(buf.as_ptr(), len, dest, m, ctx as usize, flags),
                None => self.obj.ep.send(buf.as_ptr(), len, dest, m, ctx as usize),
            }
        };
        if code == 0 && !inject {
            self.send_bufs.keep(ctx, buf);
        }
        Ok(code.to_string())
    }

    /// `bad-send <dest>`: sends the provider must refuse before reading a
    /// byte: a NULL buffer with a length (`fi_send`), iov lengths whose sum
    /// wraps past 2^64, and a NULL iov_base with a length (`fi_sendv`).
    /// Prints `null=<rc> wrap=<rc> null-iov=<rc>`.
    pub(super) fn bad_send(&mut self, a: &Args) -> CmdResult {
        let dest = a.num(0)?;
        let buf = [7u8; 16];
        let ep = &self.obj.ep;
        // SAFETY: each call must be refused without reading its buffers
        // (that is what is checked); buf lives through the calls.
        let (null, wrap, null_iov) = unsafe {
            (
                ep.send(std::ptr::null(), 100, dest, Match::default(), 1),
                ep.sendv(&[(buf.as_ptr(), usize::MAX), (buf.as_ptr(), 2)], dest, 2),
                ep.sendv(&[(buf.as_ptr(), 4), (std::ptr::null(), 5)], dest, 3),
            )
        };
        Ok(format!("null={null} wrap={wrap} null-iov={null_iov}"))
    }
}

impl Peer {
    /// The completion queues, in the order of [`QUEUES`].
    fn queues(&mut self) -> [&mut VecDeque<Completion>; 6] {
        [
            &mut self.sends,
            &mut self.recvs,
            &mut self.errors,
            &mut self.writes,
            &mut self.reads,
            &mut self.remote,
        ]
    }

    pub(super) fn queue_lens(&mut self) -> [usize; 6] {
        self.queues().map(|q| q.len())
    }

    pub(super) fn wait(&mut self, a: &Args) -> CmdResult {
        let mut want = [0usize; 6];
        for (n, name) in want.iter_mut().zip(QUEUES) {
            *n = a.opt(name)?.unwrap_or(0) as usize;
        }
        let errors = want[2];
        let limit = a
            .opt("within")?
            .map_or(self.wait_limit, Duration::from_millis);
        let deadline = Instant::now() + limit;
        while self
            .queue_lens()
            .iter()
            .zip(want)
            .any(|(&have, w)| have < w)
        {
            if errors == 0 {
                if let Some(e) = self.errors.front() {
                    return Err(format!("unexpected error completion: {e}"));
                }
            }
            if Instant::now() > deadline {
                let have: Vec<String> = QUEUES
                    .iter()
                    .zip(self.queue_lens())
                    .map(|(name, n)| format!("{name}={n}"))
                    .collect();
                return Err(format!("timed out with {}", have.join(" ")));
            }
            if !self.poll() {
                std::thread::yield_now();
            }
        }
        for (q, n) in self.queues().into_iter().zip(want) {
            for c in q.drain(..n) {
                println!("{c}");
            }
        }
        Ok(String::new())
    }

    pub(super) fn quiet(&mut self, a: &Args) -> CmdResult {
        let until = Instant::now() + Duration::from_millis(a.num(0)?);
        let before = self.queue_lens();
        while Instant::now() < until {
            if !self.poll() {
                std::thread::yield_now();
            }
        }
        let new: Vec<String> = self
            .queues()
            .iter()
            .zip(before)
            .flat_map(|(q, n)| q.iter().skip(n).map(ToString::to_string))
            .collect();
        if new.is_empty() {
            Ok(String::new())
        } else {
            Err(format!("unexpected completions: {new:?}"))
        }
    }
}
