//! LRU cache of remote DMA registrations, keyed by node and address range.
//!
//! The Unimem DMA engine can only target remote addresses that were registered first, and a
//! registration costs more than 10 µs, so the provider caches them. [`RegCache`] maps a node and
//! a range of that node's virtual addresses to a registration value `V`: in practice an
//! `Arc<Registration>` whose `Drop` deregisters. The cache never deregisters anything itself.
//! Every value it stops caching is handed back to the caller, who drops it after releasing its
//! lock, while DMAs in flight keep their own clones alive.
//!
//! ```
//! use std::sync::Arc;
//! use unimem_regcache::{Config, RegCache};
//!
//! struct Registration; // Its `Drop` would deregister.
//!
//! let mut cache: RegCache<u16, Arc<Registration>> = RegCache::new(Config::default());
//! let (node, addr, len) = (3, 0x7f00_1234, 100);
//! let registration = match cache.lookup(node, addr, len) {
//!     Ok(cached) => Arc::clone(cached),
//!     Err(ticket) => {
//!         let (start, len) = cache.page_range(addr, len).expect("range wraps around");
//!         // Register [start, start + len) here, without holding the cache lock.
//!         let registration = Arc::new(Registration);
//!         let released = cache.insert(ticket, node, start, len, Arc::clone(&registration));
//!         drop(released); // Deregisters: do it outside the cache lock.
//!         registration
//!     }
//! };
//! // Later requests within the same pages hit.
//! assert!(Arc::ptr_eq(cache.lookup(node, addr + 64, 512).unwrap(), &registration));
//! ```
//!
//! # Design
//!
//! **Lookups are O(log n).** A lookup hits if the requested range lies inside one cached range
//! of the node; a request straddling two cached registrations misses, since a DMA uses a single
//! registration. Each node keeps its ranges in a `BTreeMap` by start, and no cached range
//! contains another. Ends therefore increase with starts, so only the range with the greatest
//! start at or below the address needs checking: if any range contains the request, that one
//! does. [`RegCache::insert`] keeps the invariant: a range already covered by a cached one is
//! handed back, and cached ranges the new one covers are superseded and handed back. Partially
//! overlapping ranges are both kept: both are valid, and dropping either would lose coverage.
//!
//! **Recency** is an intrusive doubly linked list threaded through a slab of entries, which the
//! range trees address by slot: refresh and eviction are O(1), with no `unsafe` and no second
//! index. The `lru` crate would keep its own hash map of every entry beside the trees that
//! containment lookups need anyway, so every hit would pay a tree search and a hash lookup, and
//! it could not express the byte bound.
//!
//! **Bounds.** The cache holds at most `max_entries` entries and `max_bytes` registered bytes.
//! An insert evicts least recently used entries until both hold; a range longer than `max_bytes`
//! is never cached. A disabled cache, or one with a zero bound, caches nothing: every lookup
//! misses and every insert hands its value straight back, so the caller deregisters as soon as
//! its DMA completes.
//!
//! **Invalidation comes from the owner.** Entries are keyed by *remote* addresses, which local
//! memory monitors cannot watch, so only the owning node can tell that a registration went
//! stale: [`RegCache::invalidate_node`] when it goes away, [`RegCache::set_generation`] when it
//! reports a new generation (it restarted or reallocated its dmable memory), and
//! [`RegCache::invalidate_range`] when it frees a range.
//!
//! **Tickets close the race between a miss and its insert.** Registering is too slow to hold the
//! cache lock meanwhile, so an invalidation can arrive between the two; inserting afterwards
//! would cache a registration of memory the owner has already freed. A miss therefore returns a
//! [`Ticket`], and [`RegCache::insert`] does not cache the value if the node was invalidated
//! after the ticket was issued.
//!
//! **Edge cases.** A zero-length lookup, invalidation or [`RegCache::page_range`] covers the one
//! byte at its address; a zero-length insert is not cached. Ranges are stored by their last byte
//! so that one may end at the top of the address space. A request wrapping past the top misses
//! in [`RegCache::lookup`], is refused by [`RegCache::page_range`] and [`RegCache::insert`], and
//! is clamped to the top by [`RegCache::invalidate_range`].
//!
//! The cache is not internally synchronized: the provider wraps it in a mutex.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod entries;
#[cfg(test)]
mod tests;

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};
use std::mem;

use entries::{Entries, Entry, Slot};

/// Sizing of a [`RegCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Most entries cached at once; 0 disables the cache.
    pub max_entries: usize,
    /// Most registered bytes cached at once; longer ranges are never cached.
    pub max_bytes: usize,
    /// Granularity of [`RegCache::page_range`]; a power of two.
    pub page_size: usize,
    /// `false` turns the cache off: every lookup misses and every insert is handed back.
    pub enabled: bool,
}

impl Default for Config {
    /// 1024 entries (libfabric's MR cache default) and 1 GiB, pending measurements on hardware.
    fn default() -> Self {
        Self {
            max_entries: 1024,
            max_bytes: 1 << 30,
            page_size: 4096,
            enabled: true,
        }
    }
}

/// Counters and occupancy of a [`RegCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that were not.
    pub misses: u64,
    /// Entries dropped to respect the bounds (not counting invalidated or superseded ones).
    pub evictions: u64,
    /// Entries cached now.
    pub entries: u64,
    /// Bytes covered by the entries cached now.
    pub bytes: u64,
}

/// When a registration was started, so that [`RegCache::insert`] can tell whether the owner
/// invalidated its node meanwhile.
///
/// Take it from a missed [`RegCache::lookup`], or from [`RegCache::ticket`], *before* registering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// LRU cache of registrations `V` of address ranges of remote nodes `N`; see the crate docs.
/// `S` hashes the nodes (the standard hasher unless the caller has a faster one).
#[derive(Debug)]
pub struct RegCache<N, V, S = RandomState> {
    nodes: HashMap<N, NodeState, S>,
    entries: Entries<N, V>,
    /// 0 when disabled.
    max_entries: usize,
    max_bytes: u64,
    page_mask: u64,
    /// Invalidations so far; a ticket records the epoch it was issued in.
    epoch: u64,
    /// Tickets issued before this epoch are void for every node.
    floor: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    /// The entry the last lookup hit: a run of small operations on one buffer hits it again
    /// without hashing the node or searching its ranges. Forgotten by every change to the
    /// entries (a slot is reused once removed, and a new entry may start after it).
    last_hit: Option<LastHit<N>>,
}

/// See [`RegCache::last_hit`].
#[derive(Clone, Copy, Debug)]
struct LastHit<N> {
    node: N,
    slot: Slot,
    /// The entry's first and last byte.
    first: u64,
    last: u64,
    /// Where the node's next entry starts (`u64::MAX`: none): from there on another entry
    /// starts later, and a lookup must find the one starting last.
    next_start: u64,
}

#[derive(Debug, Default)]
struct NodeState {
    /// Last generation the owner reported.
    generation: Option<u64>,
    /// Epoch of the last invalidation: tickets issued before it are void for this node.
    invalidated_at: u64,
    /// Slots of the node's entries by range start. No range contains another, so range ends
    /// increase with starts.
    by_start: BTreeMap<u64, Slot>,
}

impl<N: Copy + Eq + Hash, V, S: BuildHasher + Default> RegCache<N, V, S> {
    /// Creates an empty cache.
    ///
    /// # Panics
    ///
    /// If `config.page_size` is not a power of two.
    #[must_use]
    pub fn new(config: Config) -> Self {
        assert!(
            config.page_size.is_power_of_two(),
            "page size {} is not a power of two",
            config.page_size
        );
        Self {
            nodes: HashMap::default(),
            entries: Entries::default(),
            max_entries: if config.enabled {
                config.max_entries
            } else {
                0
            },
            max_bytes: config.max_bytes as u64,
            page_mask: config.page_size as u64 - 1,
            epoch: 0,
            floor: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            last_hit: None,
        }
    }

    /// The range of whole pages covering `[addr, addr + len)`, as `(start, len)`: what to
    /// register on a miss, so that neighbouring requests hit. `None` if the pages would wrap
    /// around the address space.
    #[must_use]
    pub fn page_range(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let start = addr & !self.page_mask;
        let last = last_byte(addr, len)? | self.page_mask;
        Some((start, (last - start).checked_add(1)?))
    }

    /// The registration of a cached range of `node` containing `[addr, addr + len)`, refreshed
    /// as most recently used; among several, the one starting last.
    ///
    /// On a miss, the [`Ticket`] to pass to [`RegCache::insert`] once the range is registered.
    pub fn lookup(&mut self, node: N, addr: u64, len: u64) -> Result<&V, Ticket> {
        let again = self.last_hit.filter(|hit| {
            hit.node == node
                && addr >= hit.first
                && addr < hit.next_start
                && last_byte(addr, len).is_some_and(|end| end <= hit.last)
        });
        let found = match again {
            Some(hit) => Some(hit.slot),
            None => self.containing(node, addr, len),
        };
        match found {
            Some(slot) => {
                self.hits += 1;
                self.entries.touch(slot);
                if again.is_none() {
                    let entry = self.entries.get(slot);
                    let next_start = self.nodes.get(&node).map_or(u64::MAX, |state| {
                        let after = entry.start.saturating_add(1);
                        state
                            .by_start
                            .range(after..)
                            .next()
                            .map_or(u64::MAX, |(&s, _)| s)
                    });
                    self.last_hit = Some(LastHit {
                        node,
                        slot,
                        first: entry.start,
                        last: entry.last,
                        next_start,
                    });
                }
                Ok(&self.entries.get(slot).value)
            }
            None => {
                self.misses += 1;
                Err(self.ticket())
            }
        }
    }

    /// A ticket for a registration about to start, when there was no missed lookup to get one.
    #[must_use]
    pub fn ticket(&self) -> Ticket {
        Ticket(self.epoch)
    }

    /// Caches `value`, the registration of `[start, start + len)` on `node`, as the most recently
    /// used entry, and returns the values the caller must now release: the superseded entries
    /// (those inside the new range) by increasing start, then the evicted ones, least recently
    /// used first.
    ///
    /// `value` itself is returned, uncached, if the cache is disabled, `len` is 0 or more than
    /// `max_bytes`, the range wraps around the address space, the node was invalidated after
    /// `ticket` was issued, or a cached range already contains this one (e.g. two threads
    /// missed on the same range; that entry is refreshed instead).
    #[must_use = "dropping the released registrations deregisters them: do it outside the lock"]
    pub fn insert(&mut self, ticket: Ticket, node: N, start: u64, len: u64, value: V) -> Vec<V> {
        self.last_hit = None;
        let Some(last) = len.checked_sub(1).and_then(|span| start.checked_add(span)) else {
            return vec![value];
        };
        if self.max_entries == 0 || len > self.max_bytes || self.is_stale(ticket, node) {
            return vec![value];
        }
        let state = self.nodes.entry(node).or_default();
        if let Some(slot) = starting_at_or_before(&state.by_start, start) {
            if self.entries.get(slot).last >= last {
                self.entries.touch(slot);
                return vec![value];
            }
        }
        let mut released = Vec::new();
        // The ranges inside the new one start in it and, ends increasing with starts, form a run
        // that ends at the first range reaching past it.
        while let Some((&covered, &slot)) = state.by_start.range(start..).next() {
            if self.entries.get(slot).last > last {
                break;
            }
            state.by_start.remove(&covered);
            released.push(self.entries.remove(slot).value);
        }
        while !self.has_room_for(len) {
            released.push(self.evict_oldest());
        }
        let slot = self.entries.push_newest(Entry {
            node,
            start,
            last,
            value,
        });
        let state = self.nodes.entry(node).or_default();
        state.by_start.insert(start, slot);
        released
    }

    /// Drops the entries of `node` overlapping `[addr, addr + len)`, which its owner freed, and
    /// voids the node's outstanding tickets.
    #[must_use = "dropping the released registrations deregisters them: do it outside the lock"]
    pub fn invalidate_range(&mut self, node: N, addr: u64, len: u64) -> Vec<V> {
        self.invalidate(node, addr, addr.saturating_add(len.max(1) - 1))
    }

    /// Records the generation the owner of `node` reports. If it differs from the last one (or
    /// is the first), drops the node's entries and voids its outstanding tickets: the owner
    /// restarted or reallocated its dmable memory since they were registered.
    #[must_use = "dropping the released registrations deregisters them: do it outside the lock"]
    pub fn set_generation(&mut self, node: N, generation: u64) -> Vec<V> {
        let state = self.nodes.entry(node).or_default();
        if state.generation.replace(generation) == Some(generation) {
            return Vec::new();
        }
        self.invalidate(node, 0, u64::MAX)
    }

    /// Forgets `node`, which went away: drops its entries and generation. Voids every
    /// outstanding ticket, of any node, since the node's invalidation epoch leaves with it;
    /// nodes go away rarely enough.
    #[must_use = "dropping the released registrations deregisters them: do it outside the lock"]
    pub fn invalidate_node(&mut self, node: N) -> Vec<V> {
        self.last_hit = None;
        self.void_tickets();
        let Some(state) = self.nodes.remove(&node) else {
            return Vec::new();
        };
        state
            .by_start
            .into_values()
            .map(|slot| self.entries.remove(slot).value)
            .collect()
    }

    /// Drops every entry and generation, and voids every outstanding ticket.
    #[must_use = "dropping the released registrations deregisters them: do it outside the lock"]
    pub fn clear(&mut self) -> Vec<V> {
        self.last_hit = None;
        self.void_tickets();
        self.nodes.clear();
        mem::take(&mut self.entries).into_values()
    }

    /// Counters since creation, and current occupancy.
    #[must_use]
    pub fn stats(&self) -> Stats {
        Stats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            entries: self.entries.len() as u64,
            bytes: self.entries.bytes(),
        }
    }

    fn containing(&self, node: N, addr: u64, len: u64) -> Option<Slot> {
        let last = last_byte(addr, len)?;
        let slot = starting_at_or_before(&self.nodes.get(&node)?.by_start, addr)?;
        (self.entries.get(slot).last >= last).then_some(slot)
    }

    /// Whether one more entry of `len` bytes fits. An empty cache has room for any range that
    /// may be cached, since `max_entries >= 1` and `len <= max_bytes`. Making room before
    /// inserting keeps the byte count within `max_bytes`, so it never overflows.
    fn has_room_for(&self, len: u64) -> bool {
        self.entries.len() < self.max_entries && self.entries.bytes() <= self.max_bytes - len
    }

    fn evict_oldest(&mut self) -> V {
        self.last_hit = None;
        let Some(victim) = self.entries.pop_oldest() else {
            unreachable!("an empty cache has room")
        };
        if let Some(state) = self.nodes.get_mut(&victim.node) {
            state.by_start.remove(&victim.start);
        }
        self.evictions += 1;
        victim.value
    }

    fn is_stale(&self, ticket: Ticket, node: N) -> bool {
        let invalidated_at = self
            .nodes
            .get(&node)
            .map_or(0, |state| state.invalidated_at);
        ticket.0 < self.floor.max(invalidated_at)
    }

    fn void_tickets(&mut self) {
        self.epoch += 1;
        self.floor = self.epoch;
    }

    /// Drops the entries of `node` overlapping `[first, last]` and voids its outstanding tickets.
    fn invalidate(&mut self, node: N, first: u64, last: u64) -> Vec<V> {
        self.last_hit = None;
        self.epoch += 1;
        let state = self.nodes.entry(node).or_default();
        state.invalidated_at = self.epoch;
        let mut released = Vec::new();
        // The overlapping ranges start at or before `last` and, ends increasing with starts,
        // form a run that, scanned backwards, ends at the first range ending before `first`.
        while let Some((&start, &slot)) = state.by_start.range(..=last).next_back() {
            if self.entries.get(slot).last < first {
                break;
            }
            state.by_start.remove(&start);
            released.push(self.entries.remove(slot).value);
        }
        released
    }

    /// Checks the structural invariants the design relies on.
    #[cfg(test)]
    fn assert_invariants(&self) {
        let order = self.entries.oldest_first();
        let mut indexed = 0;
        for (node, state) in &self.nodes {
            let mut previous: Option<&Entry<N, V>> = None;
            for (&start, &slot) in &state.by_start {
                let entry = self.entries.get(slot);
                assert!(
                    entry.node == *node && entry.start == start,
                    "index points astray"
                );
                if let Some(previous) = previous {
                    assert!(previous.last < entry.last, "a range contains another");
                }
                previous = Some(entry);
            }
            indexed += state.by_start.len();
        }
        assert_eq!(indexed, order.len(), "entries missing from the index");
        assert!(order.len() <= self.max_entries, "entry bound exceeded");
        assert!(
            self.entries.bytes() <= self.max_bytes,
            "byte bound exceeded"
        );
    }
}

/// Last byte of `[addr, addr + len)`, counting a zero length as one byte; `None` if it wraps.
fn last_byte(addr: u64, len: u64) -> Option<u64> {
    addr.checked_add(len.max(1) - 1)
}

fn starting_at_or_before(by_start: &BTreeMap<u64, Slot>, addr: u64) -> Option<Slot> {
    by_start.range(..=addr).next_back().map(|(_, &slot)| slot)
}
