//! A command's words: positional arguments, `key=value` options, and the
//! named flags and capabilities they spell.

use std::collections::HashMap;

use unimem_fi_sys as ffi;
use unimem_tests::cluster::parse_num;
use unimem_tests::fabric::{Match, FI_ADDR_UNSPEC};

/// A command line: positional words and `key=value` options.
pub(super) struct Args<'a> {
    pub(super) pos: Vec<&'a str>,
    pub(super) opts: HashMap<&'a str, &'a str>,
}

impl<'a> Args<'a> {
    pub(super) fn parse(words: impl Iterator<Item = &'a str>) -> Args<'a> {
        let mut args = Args {
            pos: Vec::new(),
            opts: HashMap::new(),
        };
        for w in words {
            match w.split_once('=') {
                Some((k, v)) => {
                    args.opts.insert(k, v);
                }
                None => args.pos.push(w),
            }
        }
        args
    }

    pub(super) fn num(&self, i: usize) -> Result<u64, String> {
        let word = self.pos.get(i).ok_or(format!("argument {i} missing"))?;
        parse_num(word).ok_or(format!("bad number '{word}'"))
    }

    pub(super) fn addr(&self, i: usize) -> Result<u64, String> {
        match self.pos.get(i) {
            Some(&"any") => Ok(FI_ADDR_UNSPEC),
            _ => self.num(i),
        }
    }

    pub(super) fn opt(&self, key: &str) -> Result<Option<u64>, String> {
        self.opts
            .get(key)
            .map(|v| parse_num(v).ok_or(format!("bad number {key}={v}")))
            .transpose()
    }

    pub(super) fn flag(&self, word: &str) -> bool {
        self.pos.contains(&word)
    }

    pub(super) fn list(&self, key: &str) -> Result<Vec<u64>, String> {
        match self.opts.get(key) {
            None => Ok(Vec::new()),
            Some(v) => v
                .split(',')
                .map(|x| parse_num(x).ok_or(format!("bad number in {key}={v}")))
                .collect(),
        }
    }

    pub(super) fn matching(&self) -> Result<Match, String> {
        Ok(Match {
            tag: self.opt("tag")?,
            data: self.opt("data")?,
        })
    }
}

/// Send flags named `a|b` (`send`'s `flags=`, `getinfo`'s `tx-flags=`,
/// `$FABRIC_PEER_TX_OP_FLAGS`); empty: none.
pub(super) fn send_flags(names: &str) -> Result<u64, String> {
    names
        .split('|')
        .filter(|name| !name.is_empty())
        .map(send_flag)
        .sum()
}

/// One flag of [`send_flags`].
fn send_flag(name: &str) -> Result<u64, String> {
    Ok(match name {
        "completion" => ffi::FI_COMPLETION,
        "inject" => ffi::FI_INJECT,
        "inject-complete" => ffi::FI_INJECT_COMPLETE,
        "transmit-complete" => ffi::FI_TRANSMIT_COMPLETE,
        "match-complete" => ffi::FI_MATCH_COMPLETE,
        "delivery-complete" => ffi::FI_DELIVERY_COMPLETE,
        "commit-complete" => ffi::FI_COMMIT_COMPLETE,
        other => return Err(format!("unknown send flag {other}")),
    })
}

/// A seed word: a number, or `zero` (`None`) for zeros.
pub(super) fn seed_arg(a: &Args, i: usize) -> Result<Option<u64>, String> {
    match a.pos.get(i) {
        Some(&"zero") => Ok(None),
        _ => a.num(i).map(Some),
    }
}

/// Three consecutive pieces (offset, length) covering `len` bytes, for the
/// vector calls (some empty when `len` < 3).
pub(super) fn pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let cuts = [0, len / 3, 2 * len / 3, len];
    (0..3).map(move |i| (cuts[i], cuts[i + 1] - cuts[i]))
}

pub(super) fn cap_bit(name: &str) -> Result<u64, String> {
    Ok(match name {
        "msg" => ffi::FI_MSG,
        "tagged" => ffi::FI_TAGGED,
        "rma" => ffi::FI_RMA,
        "rma-event" => ffi::FI_RMA_EVENT,
        "collective" => ffi::FI_COLLECTIVE,
        "atomic" => ffi::FI_ATOMIC,
        "source" => ffi::FI_SOURCE,
        "directed" => ffi::FI_DIRECTED_RECV,
        "multi" => ffi::FI_MULTI_RECV,
        other => return Err(format!("unknown capability {other}")),
    })
}
