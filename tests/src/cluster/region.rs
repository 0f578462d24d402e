//! A region registered at a target, and the test's model of its bytes.

use super::{Cluster, Reply};
use crate::payload;

/// A region registered at a target (`fabric-peer`'s `mr`), and the test's
/// model of its bytes.
pub struct Region {
    pub target: usize,
    pub key: u64,
    pub bytes: Vec<u8>,
}

impl Region {
    /// Registers `len` bytes of pattern `seed` as `key` at `target`.
    pub fn new(
        c: &mut Cluster,
        target: usize,
        key: u64,
        len: usize,
        seed: u64,
        access: &str,
    ) -> Region {
        let rc = c
            .cmd(
                target,
                format!("mr {key} {len} access={access} seed={seed}"),
            )
            .num();
        assert_eq!(rc, 0, "fi_mr_reg of key {key} at p{target}");
        Region {
            target,
            key,
            bytes: payload::pattern(seed, len),
        }
    }

    /// The model after a write of `len` bytes of pattern `seed` at `off`.
    pub fn written(&mut self, off: usize, len: usize, seed: u64) {
        self.bytes[off..off + len].copy_from_slice(&payload::pattern(seed, len));
    }

    pub fn sum(&self, off: usize, len: usize) -> u64 {
        payload::checksum(&self.bytes[off..off + len])
    }

    /// [`Self::check`] for a target in `sleep-no-progress wake`.
    pub fn check_asleep(&self, c: &mut Cluster, what: &str) {
        c.begin(self.target, format!("mr-sum {}", self.key));
        let reply = Reply {
            lines: Vec::new(),
            ok: c.next_line(self.target),
        };
        self.holds(&reply, what);
    }

    /// The target's region holds exactly the model, guards intact.
    pub fn check(&self, c: &mut Cluster, what: &str) {
        let reply = c.cmd(self.target, format!("mr-sum {}", self.key));
        self.holds(&reply, what);
    }

    /// `reply` (to `mr-sum`) says the region holds the model, guards intact.
    fn holds(&self, reply: &Reply, what: &str) {
        assert_eq!(
            reply.field("guard"),
            1,
            "guard bytes of region {}: {what}",
            self.key
        );
        assert_eq!(
            reply.field("sum") as u64,
            self.sum(0, self.bytes.len()),
            "contents of region {} at p{}: {what}",
            self.key,
            self.target
        );
    }

    /// The little-endian u64 at `off` of the model.
    pub fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.bytes[off..off + 8].try_into().expect("8 bytes"))
    }
}
