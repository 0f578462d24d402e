//! Completion lines: what a `fabric-peer` prints for each CQ entry, parsed.

use std::fmt;
use std::str::FromStr;

use crate::fabric;
use crate::payload;

/// What kind of CQ entry a [`Completion`] line reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Send,
    Recv,
    Error,
    /// An RMA write of ours completed (`FI_RMA | FI_WRITE`).
    Write,
    /// An RMA read of ours completed (`FI_RMA | FI_READ`).
    Read,
    /// A peer's write with CQ data landed in our memory
    /// (`FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA`).
    Remote,
}

/// One CQ entry as `fabric-peer` reports it, one line of `key=value`s:
/// `recv ctx=3 flags=0x... len=100 off=0 ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub kind: Kind,
    /// The number the operation was posted with.
    pub ctx: u64,
    pub flags: u64,
    pub len: usize,
    /// Where the data starts, as an offset into the buffer posted with
    /// `ctx` (multi-receive buffers hand out pieces).
    pub off: usize,
    pub tag: u64,
    pub data: u64,
    /// The source `fi_cq_readfrom` gives (receives).
    pub src: u64,
    /// [`payload::checksum`] of the `len` bytes at `off`.
    pub sum: u64,
    /// The guard bytes just past the posted buffer are untouched.
    pub guard: bool,
    /// Error entries: `err` (positive) and `olen`.
    pub err: i32,
    pub olen: usize,
}

impl Completion {
    pub fn new(kind: Kind, ctx: u64, flags: u64) -> Completion {
        Completion {
            kind,
            ctx,
            flags,
            len: 0,
            off: 0,
            tag: 0,
            data: 0,
            src: fabric::FI_ADDR_NOTAVAIL,
            sum: payload::checksum(&[]),
            guard: true,
            err: 0,
            olen: 0,
        }
    }

    pub fn has(&self, flag: u64) -> bool {
        self.flags & flag == flag
    }
}

impl fmt::Display for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Send => "send",
            Kind::Recv => "recv",
            Kind::Error => "error",
            Kind::Write => "write",
            Kind::Read => "read",
            Kind::Remote => "remote",
        };
        write!(
            f,
            "{kind} ctx={} flags={:#x} len={} off={} tag={:#x} data={:#x} src={:#x} \
             sum={:#x} guard={} err={} olen={}",
            self.ctx,
            self.flags,
            self.len,
            self.off,
            self.tag,
            self.data,
            self.src,
            self.sum,
            u8::from(self.guard),
            self.err,
            self.olen
        )
    }
}

/// Decimal, or hexadecimal with `0x`.
pub fn parse_num(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

impl FromStr for Completion {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let kind = match words.next() {
            Some("send") => Kind::Send,
            Some("recv") => Kind::Recv,
            Some("error") => Kind::Error,
            Some("write") => Kind::Write,
            Some("read") => Kind::Read,
            Some("remote") => Kind::Remote,
            _ => return Err(format!("not a completion: {line}")),
        };
        let mut c = Completion::new(kind, 0, 0);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("bad field {word} in {line}"))?;
            let n = parse_num(value).ok_or_else(|| format!("bad number {word} in {line}"))?;
            match key {
                "ctx" => c.ctx = n,
                "flags" => c.flags = n,
                "len" => c.len = n as usize,
                "off" => c.off = n as usize,
                "tag" => c.tag = n,
                "data" => c.data = n,
                "src" => c.src = n,
                "sum" => c.sum = n,
                "guard" => c.guard = n != 0,
                "err" => c.err = n as i32,
                "olen" => c.olen = n as usize,
                _ => return Err(format!("unknown field {key} in {line}")),
            }
        }
        Ok(c)
    }
}
