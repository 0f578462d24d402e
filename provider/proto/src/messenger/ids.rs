//! Small integer ids: a [`Slab`] hands out the ids that name sends
//! (`send_id`) and rendezvous receives (`recv_id`) in the peers' messages,
//! and the tokens of our DMAs in flight, and takes them back when the
//! operation ends.
//!
//! An id on the wire is 16 bits wide ([`crate::wire::ID_BITS`]): the
//! slabs whose ids travel never hold more entries than that (their users
//! make sure of it, by `tx_size` or by waiting for a free id), so an id in
//! use is never reused. Each id also has a *generation*, bumped every time
//! it is freed: a message that names the id and the generation (a
//! fragment report names the transfer's) is recognized as late, for an
//! earlier holder of the id, and dropped.
//!
//! Owns: nothing of the messenger; plain storage its other modules use.

/// How many ids a 16-bit wire field can name.
pub(crate) const WIRE_IDS: usize = 1 << 16;

/// Values addressed by a small integer id; freed ids are reused first.
pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    /// The generation of each id: how many times it was freed (wrapping).
    generations: Vec<u16>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            entries: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// The current generation of id `i` (its holder's, if it has one).
    pub(crate) fn generation(&self, i: usize) -> u16 {
        self.generations.get(i).copied().unwrap_or(0)
    }

    pub(crate) fn insert(&mut self, value: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(value);
                i
            }
            None => {
                self.entries.push(Some(value));
                self.generations.push(0);
                self.entries.len() - 1
            }
        }
    }

    /// The id the next [`insert`](Self::insert) returns.
    pub(crate) fn next_id(&self) -> usize {
        self.free.last().copied().unwrap_or(self.entries.len())
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.entries.get(i).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.entries.get_mut(i).and_then(Option::as_mut)
    }

    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        let value = self.entries.get_mut(i)?.take();
        if value.is_some() {
            self.generations[i] = self.generations[i].wrapping_add(1);
            self.free.push(i);
        }
        value
    }

    /// Ids of the entries `accept` takes.
    pub(crate) fn ids_where(&self, accept: impl Fn(&T) -> bool) -> Vec<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(&accept))
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether any entry satisfies `accept`.
    pub(crate) fn any(&self, accept: impl Fn(&T) -> bool) -> bool {
        self.entries.iter().flatten().any(accept)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.len() == self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn ids_are_reused_once_freed() {
        let mut slab = Slab::new();
        assert!(slab.is_empty());
        let a = slab.insert('a');
        let b = slab.insert('b');
        assert_ne!(a, b);
        assert_eq!(slab.remove(a), Some('a'));
        assert_eq!(slab.remove(a), None, "removed twice");
        assert_eq!(slab.get(a), None);
        assert_eq!(slab.next_id(), a);
        assert_eq!(slab.insert('c'), a);
        assert_eq!(slab.next_id(), 2);
        *slab.get_mut(b).unwrap() = 'B';
        assert_eq!(slab.ids_where(|&v| v == 'B'), vec![b]);
        assert!(!slab.is_empty());
        assert_eq!(slab.len(), 2);
    }

    /// Every free bumps the id's generation, so a message for an earlier
    /// holder of a reused id is told apart; the generation wraps.
    #[test]
    fn reused_ids_have_a_new_generation() {
        let mut slab = Slab::new();
        let a = slab.insert(1);
        assert_eq!(slab.generation(a), 0);
        let mut seen = vec![0u16];
        for round in 1..=70_000u32 {
            slab.remove(a).unwrap();
            assert_eq!(slab.insert(round), a, "the id is reused");
            seen.push(slab.generation(a));
        }
        assert_eq!(seen[1], 1);
        assert_eq!(seen[65_536], 0, "wraps after 2^16 frees");
        assert_ne!(seen[65_535], seen[65_536]);
        assert_eq!(slab.generation(12345), 0, "an id never handed out");
    }
}
