//! The cached entries: one slab, threaded by an intrusive doubly linked list in recency order.
//!
//! Entries are addressed by slot index, so the per-node range trees point straight at them and a
//! hit or an eviction relinks in O(1) without a second lookup.

/// Index of an entry in the slab, stable for the entry's lifetime.
pub(crate) type Slot = usize;

/// One cached registration.
#[derive(Debug)]
pub(crate) struct Entry<N, V> {
    pub(crate) node: N,
    pub(crate) start: u64,
    /// Last byte of the range: inclusive, so a range may end at the top of the address space.
    pub(crate) last: u64,
    pub(crate) value: V,
}

impl<N, V> Entry<N, V> {
    fn bytes(&self) -> u64 {
        self.last - self.start + 1
    }
}

#[derive(Debug)]
struct Link<N, V> {
    entry: Entry<N, V>,
    newer: Option<Slot>,
    older: Option<Slot>,
}

#[derive(Debug)]
pub(crate) struct Entries<N, V> {
    slots: Vec<Option<Link<N, V>>>,
    vacant: Vec<Slot>,
    newest: Option<Slot>,
    oldest: Option<Slot>,
    bytes: u64,
}

// Not derived: the derive would require `N: Default, V: Default`.
impl<N, V> Default for Entries<N, V> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
            newest: None,
            oldest: None,
            bytes: 0,
        }
    }
}

impl<N, V> Entries<N, V> {
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }

    /// Total length of the cached ranges.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn get(&self, slot: Slot) -> &Entry<N, V> {
        &self.link(slot).entry
    }

    /// Adds `entry` as the most recently used one.
    pub(crate) fn push_newest(&mut self, entry: Entry<N, V>) -> Slot {
        self.bytes += entry.bytes();
        let link = Some(Link {
            entry,
            newer: None,
            older: None,
        });
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot] = link;
                slot
            }
            None => {
                self.slots.push(link);
                self.slots.len() - 1
            }
        };
        self.attach_newest(slot);
        slot
    }

    /// Marks `slot` as the most recently used entry.
    pub(crate) fn touch(&mut self, slot: Slot) {
        if self.newest != Some(slot) {
            self.detach(slot);
            self.attach_newest(slot);
        }
    }

    pub(crate) fn remove(&mut self, slot: Slot) -> Entry<N, V> {
        self.detach(slot);
        let Some(link) = self.slots[slot].take() else {
            unreachable!("slot {slot} was just detached")
        };
        self.vacant.push(slot);
        self.bytes -= link.entry.bytes();
        link.entry
    }

    /// Removes the least recently used entry.
    pub(crate) fn pop_oldest(&mut self) -> Option<Entry<N, V>> {
        self.oldest.map(|slot| self.remove(slot))
    }

    /// All values, in no particular order.
    pub(crate) fn into_values(self) -> Vec<V> {
        self.slots
            .into_iter()
            .flatten()
            .map(|link| link.entry.value)
            .collect()
    }

    fn link(&self, slot: Slot) -> &Link<N, V> {
        match &self.slots[slot] {
            Some(link) => link,
            None => panic!("slot {slot} is vacant"),
        }
    }

    fn link_mut(&mut self, slot: Slot) -> &mut Link<N, V> {
        match &mut self.slots[slot] {
            Some(link) => link,
            None => panic!("slot {slot} is vacant"),
        }
    }

    /// Unlinks `slot` from the recency list, leaving its own links stale.
    fn detach(&mut self, slot: Slot) {
        let Link { newer, older, .. } = *self.link(slot);
        match newer {
            Some(newer) => self.link_mut(newer).older = older,
            None => self.newest = older,
        }
        match older {
            Some(older) => self.link_mut(older).newer = newer,
            None => self.oldest = newer,
        }
    }

    fn attach_newest(&mut self, slot: Slot) {
        let previous = self.newest.replace(slot);
        let link = self.link_mut(slot);
        link.newer = None;
        link.older = previous;
        match previous {
            Some(previous) => self.link_mut(previous).newer = Some(slot),
            None => self.oldest = Some(slot),
        }
    }

    /// The live entries, least recently used first.
    #[cfg(test)]
    pub(crate) fn oldest_first(&self) -> Vec<&Entry<N, V>> {
        let mut order = Vec::new();
        let mut cursor = self.oldest;
        let mut newer = None;
        while let Some(slot) = cursor {
            let link = self.link(slot);
            assert_eq!(link.older, newer, "broken back link at slot {slot}");
            order.push(&link.entry);
            newer = Some(slot);
            cursor = link.newer;
        }
        assert_eq!(self.newest, newer, "list does not end at the newest entry");
        assert_eq!(order.len(), self.len(), "list misses live slots");
        let bytes: u64 = order.iter().map(|entry| entry.bytes()).sum();
        assert_eq!(bytes, self.bytes, "byte count drifted");
        order
    }
}

#[cfg(test)]
mod tests {
    use super::{Entries, Entry};

    fn entry(start: u64) -> Entry<(), u64> {
        Entry {
            node: (),
            start,
            last: start + 9,
            value: start,
        }
    }

    fn order(entries: &Entries<(), u64>) -> Vec<u64> {
        entries.oldest_first().iter().map(|e| e.value).collect()
    }

    #[test]
    fn recency_order_follows_pushes_and_touches() {
        let mut entries = Entries::default();
        let a = entries.push_newest(entry(0));
        entries.push_newest(entry(10));
        let c = entries.push_newest(entry(20));
        assert_eq!(order(&entries), [0, 10, 20]);
        entries.touch(a);
        assert_eq!(order(&entries), [10, 20, 0]);
        entries.touch(a);
        entries.touch(c);
        assert_eq!(order(&entries), [10, 0, 20]);
        assert_eq!(entries.remove(a).value, 0);
        assert_eq!(order(&entries), [10, 20]);
        assert_eq!(entries.pop_oldest().map(|e| e.value), Some(10));
        assert_eq!(entries.pop_oldest().map(|e| e.value), Some(20));
        assert!(entries.pop_oldest().is_none());
        assert_eq!((entries.len(), entries.bytes()), (0, 0));
    }

    #[test]
    fn vacant_slots_are_reused() {
        let mut entries = Entries::default();
        let a = entries.push_newest(entry(0));
        entries.push_newest(entry(10));
        entries.remove(a);
        assert_eq!(entries.push_newest(entry(20)), a);
        assert_eq!(order(&entries), [10, 20]);
        assert_eq!((entries.len(), entries.bytes()), (2, 20));
        let mut values = entries.into_values();
        values.sort_unstable();
        assert_eq!(values, [10, 20]);
    }
}
