//! Small integer ids: a [`Slab`] hands out the ids that name sends
//! (`send_id`) and rendezvous receives (`recv_id`) in the peers' messages,
//! and the tokens of our DMAs in flight, and takes them back when the
//! operation ends.
//!
//! Owns: nothing of the messenger; plain storage its other modules use.

/// Values addressed by a small integer id; freed ids are reused first.
pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
        }
    }

    pub(crate) fn insert(&mut self, value: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(value);
                i
            }
            None => {
                self.entries.push(Some(value));
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
    }
}
