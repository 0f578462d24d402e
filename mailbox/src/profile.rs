//! Timing profiles of the emulated hardware.
//!
//! `native` runs as fast as the host allows. `paper` models the prototype
//! board of the Unimem paper, and the emulation enforces it: a message is not
//! visible, a DMA not complete, a registration not returned before its
//! modeled time.

use std::fmt;
use std::str::FromStr;

use crate::node::monotonic_ns;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Profile {
    #[default]
    Native,
    Paper,
}

/// The modeled costs of one profile; all zero for `native`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TimingModel {
    /// Mailbox one-way latency.
    pub mailbox_latency_ns: u64,
    /// DMA start-up cost per transfer.
    pub dma_startup_ns: u64,
    /// DMA bandwidth in bytes per second; 0 means unlimited.
    pub dma_bytes_per_sec: u64,
    /// Cost of one remote registration.
    pub registration_ns: u64,
}

impl Profile {
    pub fn timing(self) -> TimingModel {
        match self {
            Profile::Native => TimingModel {
                mailbox_latency_ns: 0,
                dma_startup_ns: 0,
                dma_bytes_per_sec: 0,
                registration_ns: 0,
            },
            Profile::Paper => TimingModel {
                mailbox_latency_ns: 1_000,
                dma_startup_ns: 1_000,
                dma_bytes_per_sec: 1_000_000_000,
                registration_ns: 10_000,
            },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Native => "native",
            Profile::Paper => "paper",
        }
    }
}

impl TimingModel {
    /// Time the DMA engine is busy with one transfer of `len` bytes.
    pub fn dma_duration_ns(&self, len: usize) -> u64 {
        self.dma_startup_ns + self.wire_ns(len)
    }

    /// Time `len` bytes take on the links at the DMA's bandwidth.
    fn wire_ns(&self, len: usize) -> u64 {
        match self.dma_bytes_per_sec {
            0 => 0,
            bw => (len as u128 * 1_000_000_000).div_ceil(u128::from(bw)) as u64,
        }
    }

    /// Time a CPU access of `len` bytes of a remote node's memory takes
    /// (Unimem's unified addressing): a store reaches the target in one
    /// mailbox latency, a load comes back in two, and the bytes move at the
    /// DMA's bandwidth (the same links). 0 where the profile models nothing.
    pub fn load_store_ns(&self, len: usize, store: bool) -> u64 {
        let trips = if store { 1 } else { 2 };
        trips * self.mailbox_latency_ns + self.wire_ns(len)
    }

    /// Queues a transfer of `len` bytes behind the engine's last one
    /// (`busy_until`, moved on) and returns when it is done, or `None` where
    /// the profile models no bandwidth (`now` is then not read).
    pub fn queue_transfer(
        &self,
        busy_until: &mut u64,
        len: usize,
        now: impl FnOnce() -> u64,
    ) -> Option<u64> {
        if self.dma_bytes_per_sec == 0 {
            return None;
        }
        *busy_until = (*busy_until).max(now()) + self.dma_duration_ns(len);
        Some(*busy_until)
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct UnknownProfile(pub String);

impl fmt::Display for UnknownProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown timing profile '{}' (native or paper)", self.0)
    }
}

impl std::error::Error for UnknownProfile {}

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(Profile::Native),
            "paper" => Ok(Profile::Paper),
            _ => Err(UnknownProfile(s.to_string())),
        }
    }
}

/// Busy-waits until the monotonic clock reaches `deadline_ns`. Modeled costs
/// are microseconds: sleeping would overshoot them by far.
pub fn spin_until(deadline_ns: u64) {
    let mut spins = 0u32;
    while monotonic_ns() < deadline_ns {
        spins += 1;
        // With more runnable processes than cores, give the core away now
        // and then rather than burn a whole time slice.
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_profiles() {
        assert_eq!("native".parse(), Ok(Profile::Native));
        assert_eq!(" Paper ".parse(), Ok(Profile::Paper));
        assert!("fast".parse::<Profile>().is_err());
    }

    #[test]
    fn paper_dma_model() {
        let t = Profile::Paper.timing();
        assert_eq!(t.dma_duration_ns(0), 1_000);
        // 1 MB at 1 GB/s is 1 ms, plus the start-up.
        assert_eq!(t.dma_duration_ns(1_000_000), 1_001_000);
        assert_eq!(Profile::Native.timing().dma_duration_ns(1 << 30), 0);
    }

    #[test]
    fn spin_until_waits() {
        let start = monotonic_ns();
        spin_until(start + 50_000);
        assert!(monotonic_ns() >= start + 50_000);
    }
}
