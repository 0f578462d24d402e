//! Message contents of the fabric tests: seeded patterns with checksums,
//! and stamped messages that carry their sender and sequence number.
//!
//! Word-wise on purpose: the tests run unoptimised, and a 64 MiB message
//! must be filled and checked in well under a second.

/// Word `i` of the pattern seeded with `seed` (splitmix64).
fn word(seed: u64, i: u64) -> u64 {
    let mut z = seed
        .wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 29)
}

/// Fills `buf` with the pattern of `seed`. A prefix of a pattern is the
/// pattern of the same seed and a shorter length.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut words = buf.chunks_exact_mut(8);
    let mut i = 0;
    for chunk in words.by_ref() {
        chunk.copy_from_slice(&word(seed, i).to_le_bytes());
        i += 1;
    }
    let tail = words.into_remainder();
    let last = word(seed, i).to_le_bytes();
    tail.copy_from_slice(&last[..tail.len()]);
}

/// `len` bytes of the pattern of `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    fill(&mut buf, seed);
    buf
}

/// A 64-bit checksum of `bytes` (length included), sensitive to every bit
/// and to order.
pub fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut words = bytes.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ bytes.len() as u64;
    for chunk in words.by_ref() {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(PRIME).rotate_left(23);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h ^ (h >> 32)
}

/// The checksum of `len` bytes of the pattern of `seed`: what a receiver
/// must report for a message sent from that pattern. Computed word by word,
/// without the pattern in memory (messages of several GiB).
pub fn pattern_checksum(seed: u64, len: usize) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ len as u64;
    let words = len / 8;
    for i in 0..words as u64 {
        h = (h ^ word(seed, i)).wrapping_mul(PRIME).rotate_left(23);
    }
    let last = word(seed, words as u64).to_le_bytes();
    for &b in &last[..len % 8] {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h ^ (h >> 32)
}

/// Smallest stamped message: sequence number and sender.
pub const STAMP_LEN: usize = 12;

/// A stamped message: sequence number (8 bytes), sender rank (4), then the
/// pattern of a seed made of both. `buf` holds at least [`STAMP_LEN`].
pub fn stamp(buf: &mut [u8], rank: u32, seq: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&rank.to_le_bytes());
    fill(&mut buf[12..], stamp_seed(rank, seq));
}

fn stamp_seed(rank: u32, seq: u64) -> u64 {
    (u64::from(rank) << 40) ^ seq.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Rank and sequence number of a message made by [`stamp`], or `None` if
/// any byte differs from what they imply.
pub fn unstamp(buf: &[u8]) -> Option<(u32, u64)> {
    if buf.len() < STAMP_LEN {
        return None;
    }
    let seq = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    let rank = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    (buf[12..] == pattern(stamp_seed(rank, seq), buf.len() - 12)[..]).then_some((rank, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_seeds() {
        let long = pattern(7, 100);
        for len in [0, 1, 7, 8, 9, 64, 99] {
            assert_eq!(pattern(7, len)[..], long[..len]);
        }
        assert_ne!(pattern(7, 16), pattern(8, 16));
        assert_ne!(pattern_checksum(7, 16), pattern_checksum(7, 15));
        assert_ne!(checksum(&[]), checksum(&[0]));
    }

    #[test]
    fn checksum_sees_every_byte() {
        let data = pattern(3, 37);
        let sum = checksum(&data);
        for i in 0..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x10;
            assert_ne!(checksum(&bad), sum, "flip in byte {i}");
        }
    }

    #[test]
    fn stamps_round_trip_and_catch_corruption() {
        let mut buf = vec![0; 40];
        stamp(&mut buf, 3, 99);
        assert_eq!(unstamp(&buf), Some((3, 99)));
        let mut short = vec![0; 12];
        stamp(&mut short, 3, 99);
        assert_eq!(unstamp(&short), Some((3, 99)));
        buf[30] ^= 1;
        assert_eq!(unstamp(&buf), None);
    }

    #[test]
    fn streaming_checksum_matches() {
        for len in [0, 1, 7, 8, 9, 1000, 4099] {
            assert_eq!(
                pattern_checksum(5, len),
                checksum(&pattern(5, len)),
                "{len}"
            );
        }
    }
}
