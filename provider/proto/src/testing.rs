//! The test harness of the protocol, one for its unit tests
//! (`messenger/tests/`) and its fuzz harness (`tests/fuzz/`): the small
//! configuration that crosses every path with small buffers, messengers
//! over the shared-memory emulation, keys, byte patterns, and the seeded
//! random numbers of the fuzz campaign.
//!
//! How the two share it: the unit tests are the crate compiled with
//! `cfg(test)`, the fuzz harness an integration test, which sees only the
//! crate's public items. So this module is public, compiled under
//! `cfg(test)` and under the cargo feature `testing`, which the crate's
//! own dev-dependency on itself turns on (`Cargo.toml`): `cargo test`
//! builds it, a build of the provider does not. It is no interface of the
//! crate (hidden from its documentation): nothing outside tests may use it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use unimem_dma::{Access, DmaRegion, Exposure, KeyHandle, KeyTable, RegionConfig, ShmDmaEngine};
use unimem_mailbox::{JobId, Profile, ShmMailbox, ShmMailboxConfig};

use crate::{Messenger, ProtoConfig};

/// The largest eager message of the test configuration.
pub const EAGER: usize = 1024;
/// The rendezvous fragment of the test configuration.
pub const FRAGMENT: usize = 4096;

/// Small thresholds (22-byte inline, 1 KiB eager, 4 KiB fragments), few
/// credits and buffers, so that every path and limit is crossed with small
/// buffers. The fuzz harness narrows the queues further.
pub fn config() -> ProtoConfig {
    ProtoConfig {
        eager_size: EAGER,
        eager_credits: 4,
        bounce_buffers: 8,
        fragment_size: FRAGMENT,
        rendezvous_window: 2,
        staging_buffers: 3,
        tx_size: 256,
        ..ProtoConfig::default()
    }
}

/// A messenger over the shared-memory emulation.
pub type Shm = Messenger<(ShmMailbox, ShmDmaEngine)>;

/// The job of the unit tests. One process has one dmable region, of one
/// job: every unit test of the crate that touches DMA shares this job.
pub fn test_job() -> JobId {
    JobId::from_name(&format!("provider-unit-{}", std::process::id()))
}

/// The process's dmable region, for `job` (the first call's sizes hold).
pub fn region(job: JobId, max_size: usize) -> Arc<DmaRegion> {
    DmaRegion::for_process(&RegionConfig {
        job,
        segment_size: 16 << 20,
        max_size,
    })
    .expect("dmable region")
}

/// A mailbox of the unit tests' job, `depth` messages deep.
pub fn mailbox(depth: usize, profile: Profile) -> ShmMailbox {
    ShmMailbox::open(&ShmMailboxConfig {
        job: test_job(),
        depth,
        profile,
    })
    .unwrap()
}

/// A DMA engine on the unit tests' region.
pub fn engine(profile: Profile) -> ShmDmaEngine {
    ShmDmaEngine::new(region(test_job(), 256 << 20), profile)
}

/// A messenger of the given mailbox depth, configuration and timing
/// profile, with a DMA engine of its own.
pub fn messenger_profile(depth: usize, cfg: ProtoConfig, profile: Profile) -> Shm {
    Messenger::with_private_dma(mailbox(depth, profile), engine(profile), cfg).unwrap()
}

/// As [`messenger_profile`], with the native profile (no modeled time).
pub fn messenger_with(depth: usize, cfg: ProtoConfig) -> Shm {
    messenger_profile(depth, cfg, Profile::Native)
}

/// A messenger of the test configuration.
pub fn messenger() -> Shm {
    messenger_with(64, config())
}

/// `len` bytes that differ from one `seed` to another and from their
/// neighbours.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A key unique in the process: its key table is shared by the tests that
/// run in parallel. Far apart, so that a key changed by a bit or one is
/// none of them.
pub fn fresh_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x00f0_0000);
    NEXT.fetch_add(0x101, Ordering::Relaxed)
}

/// Exposes `[addr, addr + len)` of this process under `key` in `keys`,
/// for as long as the handle lives.
pub fn expose_in(
    keys: &Arc<KeyTable>,
    key: u64,
    addr: usize,
    len: usize,
    access: Access,
) -> KeyHandle {
    keys.expose(
        key,
        Exposure {
            addr: addr as u64,
            len: len as u64,
            access,
        },
    )
    .expect("expose")
}

/// SplitMix64: small, fast, and good enough to pick inputs; one seed
/// gives one sequence, so a campaign replays from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the bias is negligible for our n).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True `p` times in a hundred.
    pub fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}
