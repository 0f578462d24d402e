//! Atomics: `atomic`, `atomic-wait`, `valid`, `get`, `set`, `flag-wait`,
//! `fetch-add-loop`, and the datatypes and operations they name.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use unimem_fi_sys as ffi;
use unimem_tests::cluster::parse_num;
use unimem_tests::fabric::{
    AtomicBufs, AtomicFamily, AtomicForm, AtomicTarget, Ep, DATATYPE_NAMES, OP_NAMES,
};
use unimem_tests::payload;

use super::args::{send_flags, Args};
use super::objects::AtomicBuf;
use super::{CmdResult, Peer, GUARD, GUARD_BYTE};

/// A datatype word: `enum fi_datatype` and the element size in bytes.
fn datatype_arg(word: &str) -> Result<(u32, usize), String> {
    let index = match DATATYPE_NAMES.iter().position(|&(n, _)| n == word) {
        Some(i) => i,
        None => parse_num(word).ok_or(format!("unknown datatype {word}"))? as usize,
    };
    // Beyond the names: a datatype nobody knows, 8 bytes for the buffers.
    let size = DATATYPE_NAMES.get(index).map_or(8, |&(_, size)| size);
    Ok((index as u32, size))
}

/// An operation word: `enum fi_op`.
fn op_arg(word: &str) -> Result<u32, String> {
    match OP_NAMES.iter().position(|&n| n == word) {
        Some(i) => Ok(i as u32),
        None => parse_num(word)
            .map(|n| n as u32)
            .ok_or(format!("unknown operation {word}")),
    }
}

fn family_arg(word: &str) -> Result<AtomicFamily, String> {
    Ok(match word {
        "write" => AtomicFamily::Write,
        "fetch" => AtomicFamily::Fetch,
        "compare" => AtomicFamily::Compare,
        other => return Err(format!("unknown atomic family {other}")),
    })
}

/// `count` elements of `size` bytes from the values of list `key` (one
/// value: all of them; none: zeros); elements wider than 8 bytes get the
/// value in their low 8 bytes.
fn elements(a: &Args, key: &str, count: usize, size: usize) -> Result<Vec<u8>, String> {
    let values = a.list(key)?;
    let mut bytes = vec![0u8; count * size];
    for i in 0..count {
        let v = match values.len() {
            0 => 0,
            1 => values[0],
            n if i < n => values[i],
            n => return Err(format!("{key}= has {n} values for {count} elements")),
        };
        let w = size.min(8);
        bytes[i * size..i * size + w].copy_from_slice(&v.to_le_bytes()[..w]);
    }
    Ok(bytes)
}

/// The low 8 bytes of each `size`-byte element of `bytes`, as decimal
/// numbers separated by commas.
fn show_elements(bytes: &[u8], size: usize) -> String {
    bytes
        .chunks(size)
        .map(|e| {
            let mut word = [0u8; 8];
            let w = e.len().min(8);
            word[..w].copy_from_slice(&e[..w]);
            u64::from_le_bytes(word).to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Context bit of the `fetch-add-loop` command's atomics.
const LOOP_ATOMIC: u64 = 1 << 60;

impl Peer {
    pub(super) fn atomic(&mut self, a: &Args) -> CmdResult {
        let (peer, key, addr) = (a.num(0)?, a.num(1)?, a.num(2)?);
        let family = family_arg(a.pos.get(3).ok_or("family missing")?)?;
        let (datatype, size) = datatype_arg(a.pos.get(4).ok_or("datatype missing")?)?;
        let op = op_arg(a.pos.get(5).ok_or("operation missing")?)?;
        let count = a.num(6)? as usize;
        let ctx = a.opt("ctx")?.unwrap_or(1);
        let form = if a.flag("inject") {
            AtomicForm::Inject
        } else if let Some(names) = a.opts.get("msg") {
            AtomicForm::Msg {
                flags: send_flags(names)?,
                rma_iovs: a.opt("rma-iovs")?.unwrap_or(1) as usize,
            }
        } else if a.flag("msg") {
            AtomicForm::Msg {
                flags: 0,
                rma_iovs: a.opt("rma-iovs")?.unwrap_or(1) as usize,
            }
        } else if a.flag("v") {
            AtomicForm::Vector
        } else {
            AtomicForm::Plain
        };
        let operands = elements(a, "ops", count, size)?;
        let compares = elements(a, "cmp", count, size)?;
        let len = count * size;
        let mut result = vec![GUARD_BYTE; len + GUARD];
        let t = AtomicTarget {
            peer,
            addr,
            key,
            datatype,
            op,
        };
        let b = AtomicBufs {
            operand: if a.flag("null-ops") {
                std::ptr::null()
            } else {
                operands.as_ptr()
            },
            compare: compares.as_ptr(),
            result: result.as_mut_ptr(),
            count,
            size,
        };
        let inject = form == AtomicForm::Inject;
        if !inject {
            // The heap blocks do not move with the Vecs: they stay valid
            // while the map holds them, until the completion.
            let kept = AtomicBuf {
                result,
                len,
                size,
                _operands: (operands, compares),
            };
            if self.atomic_bufs.insert(ctx, kept).is_some() {
                return Err(format!("atomic {ctx} is already posted"));
            }
        }
        // SAFETY: operands, compares and the result buffer hold count
        // elements; the first two live until the end of this function (the
        // provider copies them) and all three, in atomic_bufs, until the
        // completion (an inject has none; its operands live in this frame).
        let post = |ep: &Ep| unsafe { ep.atomic(family, form, b, t, ctx as usize) };
        let code = if a.flag("try") {
            post(&self.obj.ep)
        } else {
            match self.retry("atomic", post) {
                Ok(()) => 0,
                Err(why) => {
                    self.atomic_bufs.remove(&ctx);
                    return Err(why);
                }
            }
        };
        if code != 0 {
            self.atomic_bufs.remove(&ctx);
            return Ok(format!("rc={code}"));
        }
        if inject || a.flag("nowait") {
            return Ok("rc=0".into());
        }
        self.atomic_wait(ctx)
    }

    /// Waits for the completion of atomic `ctx` (see `atomic`).
    pub(super) fn atomic_wait(&mut self, ctx: u64) -> CmdResult {
        let deadline = Instant::now() + self.wait_limit;
        let (flags, err) = loop {
            if let Some(done) = self.atomic_done.get_mut(&ctx).and_then(VecDeque::pop_front) {
                break done;
            }
            if Instant::now() > deadline {
                return Err(format!("atomic {ctx}: no completion"));
            }
            if !self.poll() {
                std::thread::yield_now();
            }
        };
        let (old, guard) = match self.atomic_bufs.remove(&ctx) {
            Some(ab) => {
                let (data, after) = ab.result.split_at(ab.len);
                let untouched = |b: &[u8]| b.iter().all(|&x| x == GUARD_BYTE);
                let guard = untouched(after) && (err == 0 || untouched(data));
                (show_elements(data, ab.size), guard)
            }
            None => (String::new(), true),
        };
        Ok(format!(
            "rc=0 flags={flags:#x} err={err} old={old} guard={}",
            u8::from(guard)
        ))
    }

    pub(super) fn valid(&mut self, a: &Args) -> CmdResult {
        let (datatype, _) = datatype_arg(a.pos.first().ok_or("datatype missing")?)?;
        let op = op_arg(a.pos.get(1).ok_or("operation missing")?)?;
        let mut out = Vec::new();
        for (name, family) in [
            ("write", AtomicFamily::Write),
            ("fetch", AtomicFamily::Fetch),
            ("compare", AtomicFamily::Compare),
        ] {
            let (rc, count) = self.obj.ep.atomic_valid(family, datatype, op);
            out.push(format!("{name}={rc}/{count}"));
        }
        let domain = self.obj.domain.as_ref().expect("domain open");
        for (name, flags) in [
            ("qwrite", 0),
            ("qfetch", ffi::FI_FETCH_ATOMIC),
            ("qcompare", ffi::FI_COMPARE_ATOMIC),
        ] {
            let (rc, count, size) = domain.query_atomic(datatype, op, flags);
            out.push(format!("{name}={rc}/{count}/{size}"));
        }
        Ok(out.join(" "))
    }

    /// The `count` elements of `size` bytes at `off` of region `key`.
    fn elements_of(
        &self,
        key: u64,
        off: usize,
        count: usize,
        size: usize,
    ) -> Result<&[u8], String> {
        self.region(key)?
            .bytes()
            .get(off..off.saturating_add(count * size))
            .ok_or(format!("{count} elements at {off} are beyond region {key}"))
    }

    pub(super) fn get(&self, a: &Args) -> CmdResult {
        let (key, off) = (a.num(0)?, a.num(1)? as usize);
        let (_, size) = datatype_arg(a.pos.get(2).ok_or("datatype missing")?)?;
        let count = a.num(3)? as usize;
        Ok(show_elements(
            self.elements_of(key, off, count, size)?,
            size,
        ))
    }

    pub(super) fn set(&mut self, a: &Args) -> CmdResult {
        let (key, off) = (a.num(0)?, a.num(1)? as usize);
        let (_, size) = datatype_arg(a.pos.get(2).ok_or("datatype missing")?)?;
        let values: Vec<u64> = a
            .pos
            .get(3)
            .ok_or("values missing")?
            .split(',')
            .map(|v| parse_num(v).ok_or(format!("bad value {v}")))
            .collect::<Result<_, _>>()?;
        let region = self
            .obj
            .mrs
            .iter_mut()
            .find(|r| r.key == key)
            .ok_or(format!("no region {key}"))?;
        let len = region.len;
        let bytes = region.mem[GUARD..GUARD + len]
            .get_mut(off..off.saturating_add(values.len() * size))
            .ok_or(format!(
                "{} elements at {off} are beyond region {key}",
                values.len()
            ))?;
        for (e, v) in bytes.chunks_mut(size).zip(values) {
            let w = size.min(8);
            e[..w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
        Ok(String::new())
    }

    /// `flag-wait`: progresses until the region's u64 at the flag's offset
    /// holds the value, then takes the checksum of the data range at once
    /// (before any other libfabric call), as a program that waits for a
    /// signal and then reads what was put before it.
    pub(super) fn flag_wait(&mut self, a: &Args) -> CmdResult {
        let (key, flag, value) = (a.num(0)?, a.num(1)? as usize, a.num(2)?);
        let (off, len) = (a.num(3)? as usize, a.num(4)? as usize);
        let region = self.region(key)?;
        if flag.checked_add(8).is_none_or(|end| end > region.len) || flag % 8 != 0 {
            return Err(format!("no aligned u64 at {flag} of region {key}"));
        }
        if off.checked_add(len).is_none_or(|end| end > region.len) {
            return Err(format!("{off}+{len} is beyond region {key}"));
        }
        let at = region.bytes()[flag..].as_ptr() as *const u64;
        let deadline = Instant::now() + self.wait_limit;
        let mut polls = 0u64;
        loop {
            // SAFETY: `at` is an aligned u64 inside the region, which lives
            // in `mrs` while this runs; peers write it, hence the volatile
            // read.
            if u64::from_le(unsafe { at.read_volatile() }) == value {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "flag at {flag} of region {key} never became {value}"
                ));
            }
            polls += 1;
            if !self.poll() {
                std::hint::spin_loop();
            }
        }
        std::sync::atomic::fence(Ordering::Acquire);
        let region = self.region(key)?;
        Ok(format!(
            "sum={:#x} polls={polls}",
            payload::checksum(&region.bytes()[off..off + len])
        ))
    }

    /// `fetch-add-loop`: tickets from one counter.
    pub(super) fn fetch_add_loop(&mut self, a: &Args) -> CmdResult {
        let (peer, key, addr, n) = (a.num(0)?, a.num(1)?, a.num(2)?, a.num(3)?);
        let mut tickets = Vec::with_capacity(n as usize);
        if a.flag("local") {
            let bytes = self.elements_of(key, addr as usize, 1, 8)?;
            let ptr = bytes.as_ptr();
            if !(ptr as usize).is_multiple_of(8) {
                return Err(format!(
                    "offset {addr} of region {key} is not 8-byte aligned"
                ));
            }
            // SAFETY: 8 aligned bytes of a live region, which every access
            // (ours, peers' DMA and the provider's) updates atomically.
            let counter = unsafe { &*ptr.cast::<AtomicU64>() };
            for _ in 0..n {
                tickets.push(counter.fetch_add(1, Ordering::SeqCst));
                // Peers' atomics to ordinary memory need our progress.
                self.poll();
            }
        } else {
            let window = a.opt("window")?.unwrap_or(4).clamp(1, 64) as usize;
            let one = 1u64.to_le_bytes();
            // One result word per slot; the Vec is never resized.
            let mut results = vec![0u64; window];
            let base = results.as_mut_ptr();
            let t = AtomicTarget {
                peer,
                addr,
                key,
                datatype: ffi::FI_UINT64,
                op: ffi::FI_SUM,
            };
            let post = |this: &mut Peer, slot: usize| {
                let b = AtomicBufs {
                    operand: one.as_ptr(),
                    compare: std::ptr::null(),
                    result: base.wrapping_add(slot).cast(),
                    count: 1,
                    size: 8,
                };
                let ctx = (LOOP_ATOMIC | slot as u64) as usize;
                // SAFETY: the operand lives through the call; the result
                // word of the slot lives until the command ends, after
                // every completion, and a slot is reposted only after its
                // completion.
                this.retry("fetch-add", |ep| unsafe {
                    ep.atomic(AtomicFamily::Fetch, AtomicForm::Plain, b, t, ctx)
                })
            };
            let mut posted = 0u64;
            for slot in 0..window.min(n as usize) {
                post(self, slot)?;
                posted += 1;
            }
            let deadline = Instant::now() + self.wait_limit;
            while (tickets.len() as u64) < n {
                let busy = self.poll();
                for slot in 0..window {
                    let ctx = LOOP_ATOMIC | slot as u64;
                    let Some((flags, err)) =
                        self.atomic_done.get_mut(&ctx).and_then(VecDeque::pop_front)
                    else {
                        continue;
                    };
                    if err != 0 {
                        return Err(format!("fetch-add error {err} (flags {flags:#x})"));
                    }
                    // SAFETY: the slot's word, written by the provider
                    // before the completion we just read.
                    tickets.push(unsafe { std::ptr::read_volatile(base.add(slot)) });
                    if posted < n {
                        post(self, slot)?;
                        posted += 1;
                    }
                }
                if Instant::now() > deadline {
                    return Err(format!("timed out after {} of {n} tickets", tickets.len()));
                }
                if !busy {
                    std::thread::yield_now();
                }
            }
            // Every slot completed: the provider is done with the words.
            drop(results);
        }
        let list: Vec<String> = tickets.iter().map(u64::to_string).collect();
        Ok(format!("tickets={}", list.join(",")))
    }
}
