//! The address table proper, plain Rust: indices in insertion order,
//! never reused, and a reverse map for source addresses.
//!
//! The data path looks an fi_addr_t up on every send, from any thread:
//! that lookup takes no lock. The entries live in chunks that never move
//! (chunk `k` holds `FIRST_CHUNK << k` of them), made once by the writer;
//! an entry is written before it is marked live (a release store, which a
//! lookup acquires), and never rewritten: a removal only marks it dead,
//! and its index is never reused. Inserts, removals and the reverse map,
//! which only `FI_SOURCE` reads on the data path, take the lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::{RwLock, RwLockWriteGuard};
use unimem_mailbox::{IdMap, JobId, MailboxAddr, NicAddr, NodeId};

/// Entries of chunk 0; chunk `k` holds `FIRST_CHUNK << k`.
const FIRST_CHUNK: usize = 64;
/// Chunks: room for 64 * (2^40 - 1) entries, past any memory.
const CHUNKS: usize = 40;

/// Where an address of the reverse map lives.
#[derive(Debug, Clone, Copy)]
struct Reverse {
    /// Lowest live index holding the address.
    first: u64,
    /// Further live copies (duplicate inserts).
    others: u32,
}

/// One index of the table: an address, packed into three words.
#[derive(Debug, Default)]
struct Slot {
    /// Job and pid.
    node: AtomicU64,
    /// Start-time nonce and mailbox index.
    mailbox: AtomicU64,
    /// The node's network address (IPv4 and port, bit 48 set), 0 for a
    /// node of this host.
    nic: AtomicU64,
    /// Written, and not removed since.
    live: AtomicBool,
}

/// Index → address, read without a lock.
#[derive(Debug)]
struct Entries {
    chunks: [OnceLock<Box<[Slot]>>; CHUNKS],
}

impl Default for Entries {
    fn default() -> Self {
        Entries {
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

/// The chunk of an index and its place in it.
#[inline]
fn chunk_of(index: u64) -> Option<(usize, usize)> {
    let first = FIRST_CHUNK as u64;
    // Chunk k starts at first * (2^k - 1).
    let k = (index / first + 1).ilog2() as usize;
    let start = first * ((1u64 << k) - 1);
    (k < CHUNKS).then(|| (k, (index - start) as usize))
}

impl Entries {
    #[inline]
    fn slot(&self, index: u64) -> Option<&Slot> {
        let (k, at) = chunk_of(index)?;
        self.chunks[k].get().map(|chunk| &chunk[at])
    }

    #[inline]
    fn lookup(&self, index: u64) -> Option<MailboxAddr> {
        let slot = self.slot(index)?;
        if !slot.live.load(Ordering::Acquire) {
            return None;
        }
        let (node, mailbox, nic) = (
            slot.node.load(Ordering::Relaxed),
            slot.mailbox.load(Ordering::Relaxed),
            slot.nic.load(Ordering::Relaxed),
        );
        Some(MailboxAddr {
            node: NodeId {
                job: JobId((node >> 32) as u32),
                pid: node as u32,
                nonce: (mailbox >> 32) as u32,
                nic: (nic != 0).then(|| NicAddr {
                    ip: ((nic >> 16) as u32).to_be_bytes(),
                    port: nic as u16,
                }),
            },
            index: mailbox as u32,
        })
    }

    /// Writes a new index (the writer's lock held).
    fn publish(&self, index: u64, addr: MailboxAddr) {
        let (k, at) = chunk_of(index).expect("the table outgrew memory");
        let chunk =
            self.chunks[k].get_or_init(|| (0..FIRST_CHUNK << k).map(|_| Slot::default()).collect());
        let slot = &chunk[at];
        let node = (u64::from(addr.node.job.0) << 32) | u64::from(addr.node.pid);
        let mailbox = (u64::from(addr.node.nonce) << 32) | u64::from(addr.index);
        let nic = addr.node.nic.map_or(0, |nic| {
            1 << 48 | u64::from(u32::from_be_bytes(nic.ip)) << 16 | u64::from(nic.port)
        });
        slot.node.store(node, Ordering::Relaxed);
        slot.mailbox.store(mailbox, Ordering::Relaxed);
        slot.nic.store(nic, Ordering::Relaxed);
        slot.live.store(true, Ordering::Release);
    }
}

/// What inserts and removals change, under the lock.
#[derive(Debug, Default)]
struct Index {
    /// Indices handed out so far (the next one).
    len: u64,
    /// Hashed by the fast hasher of the messenger's peer map: only the
    /// application inserts keys.
    reverse: IdMap<MailboxAddr, Reverse>,
}

/// The table proper (pure Rust).
#[derive(Debug, Default)]
pub(super) struct Table {
    entries: Entries,
    index: RwLock<Index>,
    /// Removals so far: a reverse lookup's answer stays right until the
    /// next removal (an insert never changes the lowest live index of an
    /// address already in).
    removals: AtomicU64,
}

/// Inserts and removals, one writer at a time.
pub(super) struct Writer<'a> {
    entries: &'a Entries,
    index: RwLockWriteGuard<'a, Index>,
    removals: &'a AtomicU64,
}

impl Table {
    /// The peer at `fi_addr`, without a lock.
    #[inline]
    pub(super) fn lookup(&self, fi_addr: u64) -> Option<MailboxAddr> {
        self.entries.lookup(fi_addr)
    }

    #[inline]
    pub(super) fn reverse_lookup(&self, addr: &MailboxAddr) -> Option<u64> {
        self.index.read().reverse.get(addr).map(|r| r.first)
    }

    /// Every live address, once each (a cold path: it copies them).
    pub(super) fn addresses(&self) -> Vec<MailboxAddr> {
        self.index.read().reverse.keys().copied().collect()
    }

    /// Inserts and removals, excluding other writers meanwhile.
    pub(super) fn write(&self) -> Writer<'_> {
        Writer {
            entries: &self.entries,
            index: self.index.write(),
            removals: &self.removals,
        }
    }

    /// Removals so far (see the field).
    #[inline]
    pub(super) fn removals(&self) -> u64 {
        self.removals.load(Ordering::Acquire)
    }
}

impl Writer<'_> {
    pub(super) fn lookup(&self, fi_addr: u64) -> Option<MailboxAddr> {
        self.entries.lookup(fi_addr)
    }

    pub(super) fn insert(&mut self, addr: MailboxAddr) -> u64 {
        let index = self.index.len;
        self.entries.publish(index, addr);
        self.index.len += 1;
        self.index
            .reverse
            .entry(addr)
            .and_modify(|r| r.others += 1)
            .or_insert(Reverse {
                first: index,
                others: 0,
            });
        index
    }

    #[cfg(test)]
    fn reverse_lookup(&self, addr: &MailboxAddr) -> Option<u64> {
        self.index.reverse.get(addr).map(|r| r.first)
    }

    /// Remove one entry; false if `fi_addr` names no live entry.
    pub(super) fn remove(&mut self, fi_addr: u64) -> bool {
        let Some(addr) = self.lookup(fi_addr) else {
            return false;
        };
        let slot = self.entries.slot(fi_addr).expect("live");
        slot.live.store(false, Ordering::Release);
        // Bumped after the change: an answer read before it is dropped.
        self.removals.fetch_add(1, Ordering::Release);
        let (entries, len) = (self.entries, self.index.len);
        let std::collections::hash_map::Entry::Occupied(mut slot) = self.index.reverse.entry(addr)
        else {
            unreachable!("every live entry is in the reverse map");
        };
        let r = slot.get_mut();
        if r.others == 0 {
            slot.remove();
        } else {
            r.others -= 1;
            if r.first == fi_addr {
                // Rare (duplicates only): find the next live copy.
                r.first = (fi_addr + 1..len)
                    .find(|&i| entries.lookup(i) == Some(addr))
                    .expect("a live duplicate remains");
            }
        }
        true
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::Arc;

    pub(in crate::av) fn peer(pid: u32, index: u32) -> MailboxAddr {
        MailboxAddr {
            node: NodeId {
                job: JobId(0xab),
                pid,
                nonce: 0x1234,
                nic: None,
            },
            index,
        }
    }

    #[test]
    fn table_indices_are_stable_and_never_reused() {
        let table = Table::default();
        let mut t = table.write();
        let (a, b) = (peer(1, 0), peer(2, 0));
        assert_eq!(t.insert(a), 0);
        assert_eq!(t.insert(b), 1);
        assert_eq!(t.lookup(1), Some(b));
        assert_eq!(t.reverse_lookup(&b), Some(1));
        assert!(t.remove(0));
        assert!(!t.remove(0));
        assert_eq!(t.lookup(0), None);
        assert_eq!(t.reverse_lookup(&a), None);
        assert_eq!(t.insert(a), 2, "removed index 0 is not reused");
        assert_eq!(t.reverse_lookup(&a), Some(2));
        assert_eq!(t.lookup(u64::MAX), None);
        assert!(!t.remove(99));
        // A node of another host keeps its network address.
        let far = MailboxAddr {
            node: NodeId {
                nic: Some("198.18.0.12:65535".parse().unwrap()),
                ..peer(3, 7).node
            },
            ..peer(3, 7)
        };
        let at = t.insert(far);
        assert_eq!(t.lookup(at), Some(far));
        assert_eq!(t.reverse_lookup(&far), Some(at));
        assert_eq!(t.reverse_lookup(&peer(3, 7)), None, "not the same node");
    }

    #[test]
    fn duplicates_resolve_to_the_lowest_live_index() {
        let table = Table::default();
        let mut t = table.write();
        let a = peer(1, 0);
        assert_eq!(
            (t.insert(a), t.insert(peer(3, 3)), t.insert(a), t.insert(a)),
            (0, 1, 2, 3)
        );
        assert_eq!(t.reverse_lookup(&a), Some(0));
        assert!(t.remove(0));
        assert_eq!(t.reverse_lookup(&a), Some(2));
        assert!(t.remove(3));
        assert_eq!(t.reverse_lookup(&a), Some(2));
        assert!(t.remove(2));
        assert_eq!(t.reverse_lookup(&a), None);
        drop(t);
        assert_eq!(table.removals(), 3, "each removal counts, inserts do not");
    }

    #[test]
    fn chunks_tile_the_indices() {
        assert_eq!(chunk_of(0), Some((0, 0)));
        assert_eq!(chunk_of(63), Some((0, 63)));
        assert_eq!(chunk_of(64), Some((1, 0)));
        assert_eq!(chunk_of(191), Some((1, 127)));
        assert_eq!(chunk_of(192), Some((2, 0)));
        assert_eq!(chunk_of(u64::MAX), None);
        let table = Table::default();
        let mut t = table.write();
        for i in 0..1000 {
            assert_eq!(t.insert(peer(i, i)), u64::from(i));
        }
        drop(t);
        for i in 0..1000 {
            assert_eq!(table.lookup(u64::from(i)), Some(peer(i, i)));
        }
        assert_eq!(table.lookup(1000), None);
    }

    #[test]
    fn lookups_run_beside_inserts() {
        let table = Arc::new(Table::default());
        let reader = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while seen < 5000 {
                    match table.lookup(seen) {
                        Some(a) => {
                            assert_eq!(a, peer(seen as u32, 7));
                            seen += 1;
                        }
                        None => std::hint::spin_loop(),
                    }
                }
            })
        };
        for i in 0..5000 {
            table.write().insert(peer(i, 7));
        }
        reader.join().unwrap();
    }
}
