//! The address table proper, plain Rust: indices in insertion order,
//! never reused, and a reverse map for source addresses.

use std::collections::HashMap;

use unimem_mailbox::MailboxAddr;

/// Where an address of the reverse map lives.
#[derive(Debug, Clone, Copy)]
struct Reverse {
    /// Lowest live index holding the address.
    first: u64,
    /// Further live copies (duplicate inserts).
    others: u32,
}

/// The table proper (pure Rust).
#[derive(Debug, Default)]
pub(super) struct Table {
    /// Index → address; None once removed (indices are never reused).
    entries: Vec<Option<MailboxAddr>>,
    reverse: HashMap<MailboxAddr, Reverse>,
}

impl Table {
    /// Room for `count` entries: a hint from the application, so capped.
    pub(super) fn with_capacity(count: usize) -> Self {
        Table {
            entries: Vec::with_capacity(count.min(1024)),
            reverse: HashMap::new(),
        }
    }

    pub(super) fn insert(&mut self, addr: MailboxAddr) -> u64 {
        let index = self.entries.len() as u64;
        self.entries.push(Some(addr));
        self.reverse
            .entry(addr)
            .and_modify(|r| r.others += 1)
            .or_insert(Reverse {
                first: index,
                others: 0,
            });
        index
    }

    #[inline]
    pub(super) fn lookup(&self, fi_addr: u64) -> Option<MailboxAddr> {
        let i = usize::try_from(fi_addr).ok()?;
        self.entries.get(i).copied().flatten()
    }

    #[inline]
    pub(super) fn reverse_lookup(&self, addr: &MailboxAddr) -> Option<u64> {
        self.reverse.get(addr).map(|r| r.first)
    }

    /// Remove one entry; false if `fi_addr` names no live entry.
    pub(super) fn remove(&mut self, fi_addr: u64) -> bool {
        let Some(addr) = self.lookup(fi_addr) else {
            return false;
        };
        self.entries[fi_addr as usize] = None;
        let std::collections::hash_map::Entry::Occupied(mut slot) = self.reverse.entry(addr) else {
            unreachable!("every live entry is in the reverse map");
        };
        let r = slot.get_mut();
        if r.others == 0 {
            slot.remove();
        } else {
            r.others -= 1;
            if r.first == fi_addr {
                // Rare (duplicates only): find the next live copy.
                r.first = self
                    .entries
                    .iter()
                    .position(|e| *e == Some(addr))
                    .expect("a live duplicate remains") as u64;
            }
        }
        true
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use unimem_mailbox::{JobId, NodeId};

    pub(in crate::av) fn peer(pid: u32, index: u32) -> MailboxAddr {
        MailboxAddr {
            node: NodeId {
                job: JobId(0xab),
                pid,
                nonce: 0x1234,
            },
            index,
        }
    }

    #[test]
    fn table_indices_are_stable_and_never_reused() {
        let mut t = Table::default();
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
    }

    #[test]
    fn duplicates_resolve_to_the_lowest_live_index() {
        let mut t = Table::default();
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
    }
}
