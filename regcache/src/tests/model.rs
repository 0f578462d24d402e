//! Randomized comparison of the cache against a naive model of the specified behaviour: linear
//! scans over a list kept in recency order, and a log of invalidations for the tickets.

use crate::{Config, RegCache, Stats, Ticket};

const PAGE: u64 = 4096;
/// Small enough an address space that ranges overlap all the time.
const SPACE: u64 = 48 * PAGE;
const NODES: u8 = 3;
const OPS: usize = 20_000;

/// The test's choices, from a seeded generator: a failure's seed replays it.
struct Rng(fastrand::Rng);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0.u64(..bound)
    }

    fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// `x - 1`, `x` or `x + 1`.
    fn near(&mut self, x: u64) -> u64 {
        (x + self.below(3)).saturating_sub(1)
    }

    /// A random entry of `lru`, if any.
    fn pick(&mut self, lru: &[ModelEntry]) -> Option<ModelEntry> {
        lru.get(self.below(lru.len().max(1) as u64) as usize)
            .copied()
    }
}

#[derive(Clone, Copy, Debug)]
struct ModelEntry {
    node: u8,
    start: u64,
    last: u64,
    value: u32,
}

struct Model {
    config: Config,
    /// Least recently used first.
    lru: Vec<ModelEntry>,
    generations: Vec<(u8, u64)>,
    /// When each invalidation happened, and of which node (`None`: every ticket is void).
    invalidations: Vec<(u64, Option<u8>)>,
    now: u64,
    stats: Stats,
}

impl Model {
    fn new(config: Config) -> Self {
        Self {
            config,
            lru: Vec::new(),
            generations: Vec::new(),
            invalidations: Vec::new(),
            now: 0,
            stats: Stats::default(),
        }
    }

    fn stats(&self) -> Stats {
        Stats {
            entries: self.lru.len() as u64,
            bytes: self.lru.iter().map(|e| e.last - e.start + 1).sum(),
            ..self.stats
        }
    }

    fn page_range(&self, addr: u64, len: u64) -> (u64, u64) {
        let page = self.config.page_size as u64;
        let start = addr / page * page;
        let end = (addr + len.max(1)).div_ceil(page) * page;
        (start, end - start)
    }

    /// Position in `lru` of the entry of `node` containing `[first, last]`; the latest starting.
    fn containing(&self, node: u8, first: u64, last: u64) -> Option<usize> {
        (0..self.lru.len())
            .filter(|&i| {
                let e = &self.lru[i];
                e.node == node && e.start <= first && last <= e.last
            })
            .max_by_key(|&i| self.lru[i].start)
    }

    fn touch(&mut self, i: usize) {
        let entry = self.lru.remove(i);
        self.lru.push(entry);
    }

    fn lookup(&mut self, node: u8, addr: u64, len: u64) -> Option<u32> {
        let found = addr
            .checked_add(len.max(1) - 1)
            .and_then(|last| self.containing(node, addr, last));
        match found {
            Some(i) => {
                self.stats.hits += 1;
                self.touch(i);
                self.lru.last().map(|e| e.value)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    fn insert(&mut self, issued: u64, node: u8, start: u64, len: u64, value: u32) -> Vec<u32> {
        let Some(last) = len.checked_sub(1).and_then(|n| start.checked_add(n)) else {
            return vec![value];
        };
        let stale = self
            .invalidations
            .iter()
            .any(|&(when, of)| when > issued && (of.is_none() || of == Some(node)));
        let config = self.config;
        if !config.enabled || config.max_entries == 0 || len > config.max_bytes as u64 || stale {
            return vec![value];
        }
        if let Some(i) = self.containing(node, start, last) {
            self.touch(i);
            return vec![value];
        }
        let (mut superseded, kept): (Vec<_>, _) = self
            .lru
            .drain(..)
            .partition(|e| e.node == node && start <= e.start && e.last <= last);
        self.lru = kept;
        superseded.sort_by_key(|e| e.start);
        let mut released: Vec<u32> = superseded.iter().map(|e| e.value).collect();
        self.lru.push(ModelEntry {
            node,
            start,
            last,
            value,
        });
        while self.lru.len() > config.max_entries || self.stats().bytes > config.max_bytes as u64 {
            self.stats.evictions += 1;
            released.push(self.lru.remove(0).value);
        }
        released
    }

    /// Drops the entries of `node` (all nodes if `None`) overlapping `[first, last]`.
    fn drop_overlapping(&mut self, node: Option<u8>, first: u64, last: u64) -> Vec<u32> {
        let (dropped, kept): (Vec<_>, _) = self.lru.drain(..).partition(|e| {
            (node.is_none() || node == Some(e.node)) && e.start <= last && first <= e.last
        });
        self.lru = kept;
        self.invalidations.push((self.now, node));
        dropped.iter().map(|e| e.value).collect()
    }

    fn invalidate_range(&mut self, node: u8, addr: u64, len: u64) -> Vec<u32> {
        self.drop_overlapping(Some(node), addr, addr.saturating_add(len.max(1) - 1))
    }

    fn set_generation(&mut self, node: u8, generation: u64) -> Vec<u32> {
        if self.generations.contains(&(node, generation)) {
            return Vec::new();
        }
        self.generations.retain(|&(of, _)| of != node);
        self.generations.push((node, generation));
        self.drop_overlapping(Some(node), 0, u64::MAX)
    }

    fn invalidate_node(&mut self, node: u8) -> Vec<u32> {
        self.generations.retain(|&(of, _)| of != node);
        let (dropped, kept): (Vec<_>, _) = self.lru.drain(..).partition(|e| e.node == node);
        self.lru = kept;
        self.invalidations.push((self.now, None));
        dropped.iter().map(|e| e.value).collect()
    }

    fn clear(&mut self) -> Vec<u32> {
        self.generations.clear();
        self.drop_overlapping(None, 0, u64::MAX)
    }
}

fn sorted(mut values: Vec<u32>) -> Vec<u32> {
    values.sort_unstable();
    values
}

/// Runs `OPS` random operations on a cache and the model, comparing every result.
fn run(config: Config, seed: u64) -> Stats {
    let mut rng = Rng::new(seed);
    let mut cache = RegCache::<u8, u32>::new(config);
    let mut model = Model::new(config);
    // Tickets of recent misses, with the model time they were issued at.
    let mut tickets: Vec<(Ticket, u64)> = Vec::new();
    let mut next_value = 0;
    for op in 0..OPS {
        model.now += 1;
        let node = rng.below(u64::from(NODES)) as u8;
        let context = format!("seed {seed:#x}, op {op}");
        match rng.below(1000) {
            0..=499 => {
                let (node, addr, len) = match rng.pick(&model.lru) {
                    // Aim inside a cached range, or a byte past either end.
                    Some(e) if rng.percent(70) => {
                        let first = e.start + rng.below(e.last - e.start + 1);
                        let last = first + rng.below(e.last - first + 1);
                        let (addr, last) = (rng.near(first), rng.near(last));
                        (e.node, addr, last.saturating_sub(addr) + 1)
                    }
                    _ => (node, rng.below(SPACE), rng.below(3 * PAGE)),
                };
                let got = cache.lookup(node, addr, len);
                assert_eq!(
                    got.ok().copied(),
                    model.lookup(node, addr, len),
                    "{context}: lookup"
                );
                if let Err(ticket) = got {
                    tickets.push((ticket, model.now));
                    if tickets.len() > 4 {
                        tickets.remove(0);
                    }
                }
            }
            500..=899 => {
                let (addr, len) = (rng.below(SPACE), rng.below(4 * PAGE));
                let (start, len) = if rng.percent(70) {
                    let range = model.page_range(addr, len);
                    let got = cache.page_range(addr, len);
                    assert_eq!(got, Some(range), "{context}: page_range");
                    range
                } else {
                    (addr, len)
                };
                let (ticket, issued) = match tickets.len() {
                    0 => (cache.ticket(), model.now),
                    n => tickets.swap_remove(rng.below(n as u64) as usize),
                };
                next_value += 1;
                assert_eq!(
                    cache.insert(ticket, node, start, len, next_value),
                    model.insert(issued, node, start, len, next_value),
                    "{context}: insert [{start:#x}, +{len:#x})"
                );
            }
            900..=949 => {
                let len = rng.below(2 * PAGE);
                let (node, addr) = match rng.pick(&model.lru) {
                    // Start within a byte of a cached range's end, or end within one of its start.
                    Some(e) if rng.percent(50) => match rng.below(2) {
                        0 => (e.node, rng.near(e.last)),
                        _ => (e.node, rng.near(e.start).saturating_sub(len.max(1) - 1)),
                    },
                    _ => (node, rng.below(SPACE)),
                };
                assert_eq!(
                    sorted(cache.invalidate_range(node, addr, len)),
                    sorted(model.invalidate_range(node, addr, len)),
                    "{context}: invalidate_range"
                );
            }
            950..=979 => {
                let generation = rng.below(3);
                assert_eq!(
                    sorted(cache.set_generation(node, generation)),
                    sorted(model.set_generation(node, generation)),
                    "{context}: set_generation"
                );
            }
            980..=994 => assert_eq!(
                sorted(cache.invalidate_node(node)),
                sorted(model.invalidate_node(node)),
                "{context}: invalidate_node"
            ),
            _ => assert_eq!(
                sorted(cache.clear()),
                sorted(model.clear()),
                "{context}: clear"
            ),
        }
        cache.assert_invariants();
        assert_eq!(cache.stats(), model.stats(), "{context}: stats");
    }
    cache.stats()
}

fn config(max_entries: usize, pages: u64) -> Config {
    Config {
        max_entries,
        max_bytes: (pages * PAGE) as usize,
        ..Config::default()
    }
}

#[test]
fn matches_the_model_under_both_bounds() {
    let stats = run(config(8, 16), 0x9e37_79b9_7f4a_7c15);
    assert!(
        stats.hits > 1000 && stats.misses > 1000 && stats.evictions > 100,
        "{stats:?}"
    );
}

#[test]
fn matches_the_model_under_the_entry_bound() {
    for (max_entries, seed) in [(1, 1), (3, 2), (32, 3)] {
        let stats = run(config(max_entries, u64::MAX / PAGE), seed);
        assert!(
            stats.hits > 1000 && stats.evictions > 0,
            "{max_entries}: {stats:?}"
        );
    }
}

#[test]
fn matches_the_model_under_the_byte_bound() {
    let stats = run(config(1000, 6), 4);
    assert!(stats.hits > 1000 && stats.evictions > 100, "{stats:?}");
}

#[test]
fn matches_the_model_when_disabled() {
    let disabled = Config {
        enabled: false,
        ..Config::default()
    };
    let stats = run(disabled, 5);
    assert_eq!((stats.hits, stats.misses > 1000), (0, true));
}
