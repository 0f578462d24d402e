//! Memory regions and RMA: `mr`, `unreg`, `fill-mr`, `check-mr`, `mr-sum`,
//! `write`, `read`, the counters (`cntr-wait`, `cntr-sleep`, `mr-cntr`,
//! `rcntr-wait`), `sread` and `sleep-no-progress`.

use std::time::{Duration, Instant};

use unimem_fi_sys as ffi;
use unimem_tests::fabric::{Ep, Object, RmaCall, RmaTarget};
use unimem_tests::payload;

use super::args::{pieces, seed_arg, send_flags, Args};
use super::objects::{process_cpu_ms, ReadBuf, Region};
use super::{CmdResult, Peer, GUARD, GUARD_BYTE};

impl Peer {
    pub(super) fn region(&self, key: u64) -> Result<&Region, String> {
        self.obj
            .mrs
            .iter()
            .find(|r| r.key == key)
            .ok_or(format!("no region {key}"))
    }

    pub(super) fn mr_sum(&self, a: &Args) -> CmdResult {
        let region = self.region(a.num(0)?)?;
        let (off, len) = match a.pos.len() {
            1 => (0, region.len),
            _ => (a.num(1)? as usize, a.num(2)? as usize),
        };
        let bytes = region
            .bytes()
            .get(off..off.saturating_add(len))
            .ok_or(format!("{off}+{len} is beyond the region"))?;
        Ok(format!(
            "sum={:#x} guard={}",
            payload::checksum(bytes),
            u8::from(region.guards_intact())
        ))
    }

    pub(super) fn mr_reg(&mut self, a: &Args) -> CmdResult {
        let (key, len) = (a.num(0)?, a.num(1)? as usize);
        let access = match a.opts.get("access").copied().unwrap_or("rw") {
            "read" => ffi::FI_REMOTE_READ,
            "write" => ffi::FI_REMOTE_WRITE,
            "rw" => ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE,
            "none" => 0,
            other => return Err(format!("unknown access {other}")),
        };
        let mut mem = vec![GUARD_BYTE; GUARD + len + GUARD];
        match a.opt("seed")? {
            Some(seed) => payload::fill(&mut mem[GUARD..GUARD + len], seed),
            None => mem[GUARD..GUARD + len].fill(0),
        }
        let domain = self.obj.domain.as_ref().expect("domain open");
        // SAFETY: the region's memory is kept with it in `mrs` and freed
        // only after fi_close (unreg, or the end).
        let mr = unsafe { domain.mr_reg(mem[GUARD..].as_mut_ptr(), len, access, key) };
        match mr {
            Ok(mr) => {
                if mr.key() != key {
                    return Err(format!("key {:#x}, asked for {key:#x}", mr.key()));
                }
                self.obj.mrs.push(Region { key, mr, mem, len });
                Ok("0".into())
            }
            Err(code) => Ok(code.to_string()),
        }
    }

    pub(super) fn unreg(&mut self, a: &Args) -> CmdResult {
        let key = a.num(0)?;
        let i = self
            .obj
            .mrs
            .iter()
            .position(|r| r.key == key)
            .ok_or(format!("no region {key}"))?;
        let region = self.obj.mrs.remove(i);
        match region.mr.close() {
            Ok(()) => Ok("0".into()),
            Err((mr, code)) => {
                // Still open: the memory stays with it.
                let Region { key, mem, len, .. } = region;
                self.obj.mrs.insert(i, Region { key, mr, mem, len });
                Ok(code.to_string())
            }
        }
    }

    pub(super) fn fill_mr(&mut self, a: &Args) -> CmdResult {
        let key = a.num(0)?;
        let seed = seed_arg(a, 1)?;
        let region = self
            .obj
            .mrs
            .iter_mut()
            .find(|r| r.key == key)
            .ok_or(format!("no region {key}"))?;
        let bytes = &mut region.mem[GUARD..GUARD + region.len];
        match seed {
            Some(seed) => payload::fill(bytes, seed),
            None => bytes.fill(0),
        }
        Ok(String::new())
    }

    pub(super) fn check_mr(&mut self, a: &Args) -> CmdResult {
        let (key, off, len) = (a.num(0)?, a.num(1)? as usize, a.num(2)? as usize);
        let seed = seed_arg(a, 3)?;
        let at = a.opt("at")?.unwrap_or(0) as usize;
        let region = self.region(key)?;
        if !region.guards_intact() {
            return Err(format!("region {key}: guard bytes overwritten"));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= region.len)
            .ok_or(format!("{off}+{len} is beyond region {key}"))?;
        let expected = match seed {
            Some(seed) => payload::pattern(seed, at + len).split_off(at),
            None => vec![0; len],
        };
        let got = &region.bytes()[off..end];
        match got.iter().zip(&expected).position(|(g, e)| g != e) {
            None => Ok(String::new()),
            Some(i) => {
                let differ = got.iter().zip(&expected).filter(|(g, e)| g != e).count();
                Err(format!(
                    "region {key}: byte {} is {:#04x}, expected {:#04x} ({differ} of {len} differ)",
                    off + i,
                    got[i],
                    expected[i]
                ))
            }
        }
    }

    /// The target of an RMA command: `<peer> <key> <offset>` from word `i`.
    fn rma_target(a: &Args, i: usize) -> Result<RmaTarget, String> {
        Ok(RmaTarget {
            peer: a.num(i)?,
            key: a.num(i + 1)?,
            addr: a.num(i + 2)?,
        })
    }

    /// The entry point an RMA command asks for (`v`, `msg[=flags]`,
    /// `rma-iovs=N`).
    fn rma_call(a: &Args) -> Result<RmaCall, String> {
        let msg = match a.opts.get("msg") {
            Some(names) => Some(send_flags(names)?),
            None => a.flag("msg").then_some(0),
        };
        let rma_iovs = a.opt("rma-iovs")?.unwrap_or(1) as usize;
        Ok(match msg {
            Some(flags) => RmaCall::Msg { flags, rma_iovs },
            None if a.flag("v") => RmaCall::Vector,
            None => RmaCall::Plain,
        })
    }

    pub(super) fn rma_write(&mut self, a: &Args) -> CmdResult {
        let t = Self::rma_target(a, 0)?;
        let (len, seed, ctx) = (a.num(3)? as usize, a.num(4)?, a.num(5)?);
        let data = a.opt("data")?;
        let call = Self::rma_call(a)?;
        let once = a.flag("try");
        let buf = payload::pattern(seed, len);
        let ptr = buf.as_ptr();
        if a.flag("inject") {
            // SAFETY: buf holds len bytes; an inject copies them before
            // returning.
            let inject = |ep: &Ep| unsafe { ep.inject_write(ptr, len, t, data) };
            return if once {
                Ok(inject(&self.obj.ep).to_string())
            } else {
                self.retry("inject write", inject).map(|()| String::new())
            };
        }
        if data.is_some() && call == RmaCall::Vector {
            return Err("fi_writev has no CQ data".into());
        }
        let bufs: Vec<(*const u8, usize)> = match call {
            RmaCall::Plain => vec![(ptr, len)],
            // SAFETY: the pieces lie inside buf.
            _ => pieces(len)
                .map(|(at, n)| (unsafe { ptr.add(at) }, n))
                .collect(),
        };
        // The heap block does not move with the Vec: it stays valid while
        // the map holds it, until the completion.
        self.write_bufs.keep(ctx, buf);
        // SAFETY: the buffers lie in the block kept in write_bufs until
        // the completion.
        let post = |ep: &Ep| unsafe { ep.write(&bufs, t, data, call, ctx as usize) };
        if once {
            let code = post(&self.obj.ep);
            if code != 0 {
                self.write_bufs.done(ctx);
            }
            return Ok(code.to_string());
        }
        let posted = self.retry("write", post);
        if posted.is_err() {
            self.write_bufs.done(ctx);
        }
        posted.map(|()| String::new())
    }

    pub(super) fn rma_read(&mut self, a: &Args) -> CmdResult {
        let t = Self::rma_target(a, 0)?;
        let (len, ctx) = (a.num(3)? as usize, a.num(4)?);
        let call = Self::rma_call(a)?;
        let mut mem = vec![GUARD_BYTE; GUARD + len + GUARD];
        // SAFETY: GUARD + len bytes follow the start of mem.
        let ptr = unsafe { mem.as_mut_ptr().add(GUARD) };
        let bufs: Vec<(*mut u8, usize)> = match call {
            RmaCall::Plain => vec![(ptr, len)],
            // SAFETY: the pieces lie inside the len bytes at ptr.
            _ => pieces(len)
                .map(|(at, n)| (unsafe { ptr.add(at) }, n))
                .collect(),
        };
        if self.read_bufs.insert(ctx, ReadBuf { mem, len }).is_some() {
            return Err(format!("read {ctx} is already posted"));
        }
        // SAFETY: the buffers lie in the block kept in read_bufs until the
        // completion (the heap block does not move with the map).
        let post = |ep: &Ep| unsafe { ep.read(&bufs, t, call, ctx as usize) };
        if a.flag("try") {
            let code = post(&self.obj.ep);
            if code != 0 {
                self.read_bufs.remove(&ctx);
            }
            return Ok(code.to_string());
        }
        let posted = self.retry("read", post);
        if posted.is_err() {
            self.read_bufs.remove(&ctx);
        }
        posted.map(|()| String::new())
    }

    /// `cntr` (no thresholds) and `cntr-wait`.
    pub(super) fn cntr_wait(&mut self, a: &Args) -> CmdResult {
        let names = self.obj.cntr_names;
        let mut want = [0u64; 4];
        for (w, name) in want.iter_mut().zip(names) {
            *w = a.opt(name)?.unwrap_or(0);
        }
        let deadline = Instant::now() + self.wait_limit;
        let show = |v: [u64; 4]| {
            names
                .iter()
                .zip(v)
                .map(|(name, n)| format!("{name}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        loop {
            let cntrs = self
                .obj
                .cntrs
                .as_ref()
                .ok_or("no counters (FABRIC_PEER_CNTR=1)")?;
            // Reading a counter progresses the endpoint.
            let values = cntrs.values();
            if values.iter().zip(want).all(|(&v, w)| v >= w) {
                return Ok(show(values));
            }
            if Instant::now() > deadline {
                return Err(format!("timed out with {}", show(values)));
            }
            std::thread::yield_now();
        }
    }

    /// `cntr-sleep <write|read> <threshold> <ms>`: one `fi_cntr_wait` on
    /// that counter, timed as `sread`: `ok rc=R wall_ms=W cpu_ms=C`.
    pub(super) fn cntr_sleep(&mut self, a: &Args) -> CmdResult {
        let cntrs = self
            .obj
            .cntrs
            .as_ref()
            .ok_or("no counters (FABRIC_PEER_CNTR=1)")?;
        let cntr = match a.pos.first().copied() {
            Some("write") => &cntrs.write,
            Some("read") => &cntrs.read,
            other => return Err(format!("no counter {other:?}")),
        };
        let (threshold, ms) = (a.num(1)?, a.num(2)? as i32);
        let (cpu0, wall0) = (process_cpu_ms(), Instant::now());
        let rc = cntr.wait(threshold, ms);
        let (cpu_ms, wall_ms) = (process_cpu_ms() - cpu0, wall0.elapsed().as_secs_f64() * 1e3);
        Ok(format!("rc={rc} wall_ms={wall_ms:.1} cpu_ms={cpu_ms:.2}"))
    }

    /// `fi_cq_sread` of one entry with a timeout of `ms`, timed:
    /// `ok rc=R wall_ms=W cpu_ms=C` (the process's CPU time while it
    /// waited, every thread's); an entry read is queued as any other.
    pub(super) fn sread(&mut self, a: &Args) -> CmdResult {
        let ms = a.num(0)? as i32;
        let cpu = process_cpu_ms;
        let (cpu0, wall0) = (cpu(), Instant::now());
        let mut entries = Vec::new();
        let rc = match self.obj.cq.sread(&mut entries, ms) {
            Ok(n) => n as isize,
            Err(n) => n,
        };
        let (cpu_ms, wall_ms) = (cpu() - cpu0, wall0.elapsed().as_secs_f64() * 1e3);
        entries.into_iter().for_each(|e| self.on_entry(e));
        Ok(format!("rc={rc} wall_ms={wall_ms:.1} cpu_ms={cpu_ms:.2}"))
    }

    /// `ok sum=S`: the checksum of the first `len` bytes of the buffer
    /// posted as receive `ctx` (no libfabric call: what is there now).
    fn recv_sum(&self, a: &Args) -> CmdResult {
        let ctx: u64 = a.num(0)?;
        let len = a.num(1)? as usize;
        let rb = self
            .recv_bufs
            .get(&ctx)
            .ok_or_else(|| format!("no receive {ctx} posted"))?;
        if len > rb.len {
            return Err(format!("receive {ctx} has {} bytes", rb.len));
        }
        // Volatile: the provider's agent thread writes the buffer behind
        // the compiler's back.
        let bytes: Vec<u8> = (0..len)
            .map(|i| {
                // SAFETY: i < len <= the buffer's length; a byte read.
                unsafe { std::ptr::read_volatile(rb.mem.as_ptr().add(i)) }
            })
            .collect();
        Ok(format!("sum={}", payload::checksum(&bytes)))
    }

    pub(super) fn sleep_no_progress(&mut self, a: &Args) -> CmdResult {
        let until_wake = a.pos.first() == Some(&"wake");
        let ms = if until_wake { 0 } else { a.num(0)? };
        println!("sleeping");
        if !until_wake {
            std::thread::sleep(Duration::from_millis(ms));
            return Ok(String::new());
        }
        loop {
            let line = self
                .commands
                .recv_timeout(self.wait_limit)
                .map_err(|e| format!("no 'wake': {e}"))?;
            let mut words = line.split_whitespace();
            match words.next() {
                Some("wake") => return Ok(String::new()),
                Some("mr-sum") => println!("{}", self.mr_sum(&Args::parse(words))?),
                Some("get") => println!("{}", self.get(&Args::parse(words))?),
                Some("recv-sum") => println!("{}", self.recv_sum(&Args::parse(words))?),
                _ => {
                    return Err(format!(
                        "expected 'wake', 'mr-sum', 'get' or 'recv-sum', got '{line}'"
                    ))
                }
            }
        }
    }
}

impl Peer {
    pub(super) fn mr_cntr(&mut self, a: &Args) -> CmdResult {
        let key = a.num(0)?;
        let flags = match a.pos.get(1).copied() {
            Some("read") => ffi::FI_REMOTE_READ,
            Some("write") => ffi::FI_REMOTE_WRITE,
            Some("rw") => ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE,
            other => return Err(format!("unknown counter flags {other:?}")),
        };
        let domain = self.obj.domain.as_ref().expect("domain open");
        let cntr = domain.cntr().map_err(|c| format!("fi_cntr_open: {c}"))?;
        self.region(key)?
            .mr
            .bind(&cntr, flags)
            .map_err(|c| format!("fi_mr_bind: {c}"))?;
        self.obj.mr_cntrs.push(cntr);
        Ok(String::new())
    }
}

impl Peer {
    /// `rcntr` (no thresholds) and `rcntr-wait`.
    pub(super) fn rcntr_wait(&mut self, a: &Args) -> CmdResult {
        let deadline = Instant::now() + self.wait_limit;
        loop {
            // Reading a counter progresses the endpoint.
            let mut values = Vec::new();
            if let Some(c) = &self.obj.remote_cntrs {
                values.push(("remote-write".to_string(), c.write.read()));
                values.push(("remote-read".to_string(), c.read.read()));
            } else if self.obj.mr_cntrs.is_empty() {
                return Err("no remote counters (FABRIC_PEER_RMA_EVENT=1, or mr-cntr)".into());
            }
            for (i, m) in self.obj.mr_cntrs.iter().enumerate() {
                values.push((format!("mr{i}"), m.read()));
            }
            let show = values
                .iter()
                .map(|(name, n)| format!("{name}={n}"))
                .collect::<Vec<_>>()
                .join(" ");
            let mut reached = true;
            for (name, n) in &values {
                reached &= a.opt(name)?.is_none_or(|want| *n >= want);
            }
            if reached {
                return Ok(show);
            }
            if Instant::now() > deadline {
                return Err(format!("timed out with {show}"));
            }
            std::thread::yield_now();
        }
    }
}
