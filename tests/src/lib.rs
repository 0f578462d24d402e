//! Shared pieces of the multi-process tests and raw benchmarks: message
//! stamping with checksums, byte patterns, process pinning and spawning.
//!
//! The tests themselves are one test binary, `integration`
//! (`tests/integration/main.rs`), a module per concern: `fabric::*`,
//! `mpi::*`, `emulation`, `heap`, `shm_hardening`, `layers`, `man_page`,
//! `sos`. A filter on the module path runs one concern
//! (`cargo test -p unimem-tests --test integration -- fabric::rma::`);
//! `docs/testing.md` is the map.
//!
//! The fabric tests, which run the provider through the real libfabric
//! core in `fabric-peer` processes, use three modules: [`fabric`] (a thin
//! wrapper over libfabric's calls), [`payload`] (message contents and
//! checks) and [`cluster`] (the children, driven from a test). The MPI
//! tests use [`mpi`], the tests across hosts [`hosts`]. Since every test
//! shares the binary's process and the machine, [`solo`] keeps the tests
//! that need the machine to themselves apart from the others.
//!
//! [`layers`] is the import-circle checker that the `layers` tests
//! (`tests/integration/layers.rs`) run over the workspace.

pub mod cluster;
pub mod fabric;
pub mod heap;
pub mod hosts;
pub mod layers;
pub mod mpi;
pub mod payload;
pub mod pinned;
pub mod solo;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use unimem_mailbox::{Message, MESSAGE_LEN};

/// FNV-1a over `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A test message: sender id, sequence number, filler derived from both, and
/// a checksum over all of it, so that a torn or corrupted message shows.
pub fn stamp(sender: u32, seq: u64) -> Message {
    let mut m = [0u8; MESSAGE_LEN];
    m[0..4].copy_from_slice(&sender.to_le_bytes());
    m[4..12].copy_from_slice(&seq.to_le_bytes());
    let filler = (u64::from(sender) << 40) ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    m[12..20].copy_from_slice(&filler.to_le_bytes());
    let sum = fnv1a(&m[..20]) as u32;
    m[20..24].copy_from_slice(&sum.to_le_bytes());
    m
}

/// Sender and sequence of a message made by [`stamp`], or `None` if its
/// checksum or filler does not match.
pub fn unstamp(m: &Message) -> Option<(u32, u64)> {
    let sender = u32::from_le_bytes(m[0..4].try_into().unwrap());
    let seq = u64::from_le_bytes(m[4..12].try_into().unwrap());
    (stamp(sender, seq) == *m).then_some((sender, seq))
}

/// Deterministic bytes for position `i` of a pattern seeded with `seed`.
pub fn pattern_byte(seed: u64, i: usize) -> u8 {
    let x = (i as u64)
        .wrapping_add(seed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (i as u8)
}

pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seed, i);
    }
}

/// Pins the calling thread to `cpu`; ignored where that CPU does not exist.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is an empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Number of CPUs online on the host, whatever this process's affinity
/// (a child inherits its parent's pinning).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// Spins for a while, then gives the CPU away: with more runnable processes
/// than cores a pure spin would hold the core its peer needs for a whole
/// time slice.
#[inline]
pub fn relax(spins: &mut u32) {
    *spins += 1;
    if spins.is_multiple_of(1024) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// A child process driven line by line over its stdin and stdout.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// Dropped after the child is gone (see [`solo`]).
    _solo: solo::Shared,
}

impl Peer {
    pub fn spawn(program: &str, args: &[&str]) -> Peer {
        let solo = solo::shared();
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer {
            child,
            stdin,
            stdout,
            _solo: solo,
        }
    }

    /// The next line the child prints; panics if it exits first.
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read from child");
        assert!(n > 0, "child exited early: {:?}", self.child.try_wait());
        line.trim_end().to_string()
    }

    /// Reads a line that must start with `key ` and returns the rest.
    pub fn expect(&mut self, key: &str) -> String {
        let line = self.read_line();
        match line.strip_prefix(key) {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => rest.trim().to_string(),
            _ => panic!("expected '{key} ...' from child, got '{line}'"),
        }
    }

    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().expect("flush to child");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the child and returns whether it exited successfully.
    pub fn wait_success(mut self) -> bool {
        self.stdin.take();
        self.child.wait().map(|s| s.success()).unwrap_or(false)
    }
}

impl Drop for Peer {
    /// Closing stdin asks a child to finish and clean up; one that does not
    /// within a grace period is killed.
    fn drop(&mut self) {
        self.stdin.take();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while let Ok(None) = self.child.try_wait() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_detects_corruption() {
        let m = stamp(3, 12345);
        assert_eq!(unstamp(&m), Some((3, 12345)));
        for i in 0..MESSAGE_LEN {
            let mut bad = m;
            bad[i] ^= 1;
            assert_eq!(unstamp(&bad), None, "flip in byte {i} went unnoticed");
        }
    }
}
