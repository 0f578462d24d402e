//! A hash map for the data path's small keys: node ids, registration ids,
//! peer indices and addresses.
//!
//! The standard map hashes with SipHash, which guards against keys chosen
//! to collide but costs tens of nanoseconds per lookup, several times per
//! small RMA operation. The keys here are identities of processes this one
//! talks to, so a hostile peer can add at most its own entries: the
//! protection is not worth the cost. [`IdHasher`] mixes each word with one
//! rotate, xor and multiply.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` hashed by [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A fast, non-keyed hasher for small integer-like keys.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

/// An odd constant with well-spread bits (2^64 divided by the golden ratio).
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl IdHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(MIX);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.mix(u64::from_le_bytes(chunk.try_into().expect("8-byte chunk")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.mix(n.into());
    }

    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.mix(n.into());
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.mix(n.into());
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    /// The product's high bits are its best mixed: fold them into the low
    /// ones, which pick the bucket.
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(value: T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(value)
    }

    #[test]
    fn sequential_and_strided_keys_spread_over_buckets() {
        // Low bits pick a bucket: consecutive ids and ids differing only in
        // high bits must both land in many different ones.
        for keys in [
            (0..4096u64).collect::<Vec<_>>(),
            (0..4096u64).map(|i| i << 32).collect(),
            (0..4096u64).map(|i| i << 12).collect(),
        ] {
            let buckets: HashSet<u64> = keys.iter().map(|&k| hash(k) & 1023).collect();
            assert!(
                buckets.len() > 900,
                "only {} of 1024 buckets",
                buckets.len()
            );
        }
    }

    #[test]
    fn byte_keys_of_different_lengths_differ() {
        assert_ne!(
            hash([1u8, 2, 3].as_slice()),
            hash([1u8, 2, 3, 0].as_slice())
        );
        let mut map: IdMap<(u32, u64), u32> = IdMap::default();
        map.insert((1, 2), 3);
        assert_eq!(map.get(&(1, 2)), Some(&3));
        assert_eq!(map.get(&(2, 1)), None);
    }
}
