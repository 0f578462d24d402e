mod model;

use crate::{Config, RegCache, Stats};

const PAGE: u64 = 4096;

type Cache = RegCache<u8, u32>;

fn cache(max_entries: usize, max_bytes: usize) -> Cache {
    RegCache::new(Config {
        max_entries,
        max_bytes,
        ..Config::default()
    })
}

/// Caches `pages` pages of `node` from page `first`, registered with a fresh ticket.
fn put(cache: &mut Cache, node: u8, first: u64, pages: u64, value: u32) -> Vec<u32> {
    let ticket = cache.ticket();
    let released = cache.insert(ticket, node, first * PAGE, pages * PAGE, value);
    cache.assert_invariants();
    released
}

fn get(cache: &mut Cache, node: u8, addr: u64, len: u64) -> Option<u32> {
    cache.lookup(node, addr, len).ok().copied()
}

fn sorted(mut values: Vec<u32>) -> Vec<u32> {
    values.sort_unstable();
    values
}

#[test]
fn page_range_aligns_outward() {
    let cache = cache(8, usize::MAX);
    assert_eq!(cache.page_range(0, PAGE), Some((0, PAGE)));
    assert_eq!(cache.page_range(PAGE + 1, 1), Some((PAGE, PAGE)));
    assert_eq!(cache.page_range(PAGE - 1, 2), Some((0, 2 * PAGE)));
    assert_eq!(cache.page_range(3 * PAGE + 5, 0), Some((3 * PAGE, PAGE)));
    let top_page = u64::MAX - (PAGE - 1);
    assert_eq!(cache.page_range(u64::MAX, 1), Some((top_page, PAGE)));
    assert_eq!(cache.page_range(u64::MAX, 2), None);
    assert_eq!(
        cache.page_range(0, u64::MAX),
        None,
        "2^64 bytes do not fit in a u64"
    );
    let huge = RegCache::<u8, u32>::new(Config {
        page_size: 1 << 21,
        ..Config::default()
    });
    assert_eq!(
        huge.page_range(0x20_0001, 0x20_0000),
        Some((0x20_0000, 0x40_0000))
    );
}

#[test]
#[should_panic(expected = "not a power of two")]
fn page_size_must_be_a_power_of_two() {
    let _ = RegCache::<u8, u32>::new(Config {
        page_size: 3000,
        ..Config::default()
    });
}

#[test]
fn sub_ranges_hit() {
    let mut cache = cache(8, usize::MAX);
    assert!(put(&mut cache, 1, 2, 4, 7).is_empty());
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 4 * PAGE), Some(7));
    assert_eq!(get(&mut cache, 1, 3 * PAGE + 100, 10), Some(7));
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 1), Some(7));
    assert_eq!(get(&mut cache, 2, 3 * PAGE, 1), None, "other node");
}

#[test]
fn range_boundaries_are_exact() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 2, 4, 7);
    let end = 6 * PAGE;
    assert_eq!(get(&mut cache, 1, end - 1, 1), Some(7), "last byte");
    assert_eq!(
        get(&mut cache, 1, end - 10, 10),
        Some(7),
        "ends exactly at the end"
    );
    assert_eq!(
        get(&mut cache, 1, end - 10, 11),
        None,
        "one byte past the end"
    );
    assert_eq!(get(&mut cache, 1, end, 1), None, "first byte after");
    assert_eq!(
        get(&mut cache, 1, 2 * PAGE - 1, 2),
        None,
        "one byte before the start"
    );
}

#[test]
fn zero_length_lookups_cover_one_byte() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 2, 1, 7);
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 0), Some(7));
    assert_eq!(get(&mut cache, 1, 3 * PAGE - 1, 0), Some(7));
    assert_eq!(get(&mut cache, 1, 3 * PAGE, 0), None);
}

#[test]
fn ranges_may_end_at_the_top_of_the_address_space() {
    let mut cache = cache(8, usize::MAX);
    let ticket = cache.ticket();
    assert!(cache.insert(ticket, 1, u64::MAX - 99, 100, 7).is_empty());
    assert_eq!(get(&mut cache, 1, u64::MAX, 1), Some(7));
    assert_eq!(get(&mut cache, 1, u64::MAX - 99, 100), Some(7));
    assert_eq!(get(&mut cache, 1, u64::MAX, 2), None, "wraps around");
    assert_eq!(cache.insert(ticket, 1, u64::MAX, 2, 8), [8], "wraps around");
    assert_eq!(
        cache.invalidate_range(1, u64::MAX - 10, u64::MAX),
        [7],
        "clamped"
    );
}

#[test]
fn zero_length_inserts_are_not_cached() {
    let mut cache = cache(8, usize::MAX);
    let ticket = cache.ticket();
    assert_eq!(cache.insert(ticket, 1, PAGE, 0, 7), [7]);
    assert_eq!(get(&mut cache, 1, PAGE, 0), None);
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn requests_straddling_two_entries_miss() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 0, 2, 7);
    let _ = put(&mut cache, 1, 2, 2, 8);
    assert_eq!(get(&mut cache, 1, 2 * PAGE - 1, 2), None);
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 2), Some(8));
}

#[test]
fn entry_bound_evicts_least_recently_used() {
    let mut cache = cache(3, usize::MAX);
    for page in 0..3 {
        assert!(put(&mut cache, 1, page, 1, page as u32).is_empty());
    }
    assert_eq!(put(&mut cache, 1, 10, 1, 10), [0]);
    assert_eq!(put(&mut cache, 2, 10, 1, 20), [1]);
    assert_eq!(get(&mut cache, 1, 0, 1), None);
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 1), Some(2));
    assert_eq!(cache.stats().evictions, 2);
}

#[test]
fn byte_bound_evicts_least_recently_used() {
    let mut cache = cache(100, 4 * PAGE as usize);
    let _ = put(&mut cache, 1, 0, 1, 0);
    let _ = put(&mut cache, 1, 1, 1, 1);
    let _ = put(&mut cache, 1, 2, 2, 2);
    assert_eq!(put(&mut cache, 1, 10, 3, 10), [0, 1, 2], "oldest first");
    assert_eq!(put(&mut cache, 1, 20, 1, 20), Vec::<u32>::new());
    assert_eq!(cache.stats().bytes, 4 * PAGE);
    assert_eq!(put(&mut cache, 1, 30, 4, 30), [10, 20]);
}

#[test]
fn hits_refresh_recency() {
    let mut cache = cache(3, usize::MAX);
    for page in 0..3 {
        let _ = put(&mut cache, 1, page, 1, page as u32);
    }
    assert_eq!(get(&mut cache, 1, 0, 1), Some(0));
    assert_eq!(put(&mut cache, 1, 10, 1, 10), [1]);
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 1), Some(2));
    assert_eq!(put(&mut cache, 1, 11, 1, 11), [0]);
}

#[test]
fn ranges_longer_than_the_byte_bound_are_handed_back() {
    let mut cache = cache(8, 2 * PAGE as usize);
    let _ = put(&mut cache, 1, 0, 1, 1);
    assert_eq!(put(&mut cache, 1, 0, 3, 7), [7]);
    assert_eq!(
        put(&mut cache, 1, 5, 2, 8),
        [1],
        "exactly the bound fits, alone"
    );
    assert_eq!(get(&mut cache, 1, 5 * PAGE, 2 * PAGE), Some(8));
    assert_eq!(cache.stats().evictions, 1);
}

#[test]
fn huge_ranges_do_not_overflow_the_byte_count() {
    let mut cache = cache(8, usize::MAX);
    let half = 1 << 63;
    assert!(put(&mut cache, 1, 0, half / PAGE, 1).is_empty());
    assert_eq!(put(&mut cache, 2, 0, half / PAGE, 2), [1]);
    assert_eq!(cache.stats().bytes, half);
}

#[test]
fn inserts_supersede_contained_entries() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 4, 1, 1);
    let _ = put(&mut cache, 1, 6, 2, 2);
    let _ = put(&mut cache, 1, 1, 1, 3);
    let _ = put(&mut cache, 1, 9, 2, 4);
    let _ = put(&mut cache, 2, 5, 1, 5);
    assert_eq!(put(&mut cache, 1, 2, 7, 9), [1, 2], "by increasing start");
    assert_eq!(get(&mut cache, 1, 4 * PAGE, 1), Some(9));
    assert_eq!(get(&mut cache, 1, PAGE, 1), Some(3));
    assert_eq!(get(&mut cache, 1, 10 * PAGE, 1), Some(4));
    assert_eq!(get(&mut cache, 2, 5 * PAGE, 1), Some(5));
    assert_eq!(
        put(&mut cache, 1, 2, 7, 10),
        [10],
        "equal range is already covered"
    );
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.evictions), (4, 0));
}

#[test]
fn covered_inserts_are_handed_back_and_refresh_the_cover() {
    let mut cache = cache(2, usize::MAX);
    let _ = put(&mut cache, 1, 0, 16, 1);
    let _ = put(&mut cache, 1, 20, 1, 2);
    assert_eq!(put(&mut cache, 1, 4, 1, 3), [3]);
    assert_eq!(put(&mut cache, 1, 30, 1, 4), [2], "the cover was refreshed");
    // Had the small range been cached, it would hide the large one from this lookup.
    assert_eq!(get(&mut cache, 1, 10 * PAGE, PAGE), Some(1));
}

#[test]
fn partial_overlaps_are_kept() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 0, 8, 1);
    assert!(put(&mut cache, 1, 4, 8, 2).is_empty());
    assert!(put(&mut cache, 1, 10, 8, 3).is_empty());
    assert_eq!(get(&mut cache, 1, PAGE, PAGE), Some(1));
    assert_eq!(get(&mut cache, 1, 2 * PAGE, 6 * PAGE), Some(1));
    assert_eq!(
        get(&mut cache, 1, 5 * PAGE, PAGE),
        Some(2),
        "the one starting last"
    );
    assert_eq!(get(&mut cache, 1, 4 * PAGE, 8 * PAGE), Some(2));
    assert_eq!(get(&mut cache, 1, 11 * PAGE, PAGE), Some(3));
    assert_eq!(
        get(&mut cache, 1, 2 * PAGE, 8 * PAGE),
        None,
        "inside none of them"
    );
    assert_eq!(
        get(&mut cache, 1, 9 * PAGE, 4 * PAGE),
        None,
        "inside none of them"
    );
}

#[test]
fn invalidating_a_node_touches_only_that_node() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 0, 1, 1);
    let _ = put(&mut cache, 2, 0, 1, 2);
    let _ = put(&mut cache, 1, 4, 2, 3);
    let _ = put(&mut cache, 3, 4, 2, 4);
    assert_eq!(sorted(cache.invalidate_node(1)), [1, 3]);
    cache.assert_invariants();
    assert_eq!(get(&mut cache, 1, 0, 1), None);
    assert_eq!(get(&mut cache, 2, 0, 1), Some(2));
    assert_eq!(get(&mut cache, 3, 4 * PAGE, 1), Some(4));
    assert_eq!(cache.invalidate_node(1), Vec::<u32>::new());
    let stats = cache.stats();
    assert_eq!(
        (stats.entries, stats.bytes, stats.evictions),
        (2, 3 * PAGE, 0)
    );
}

#[test]
fn invalidating_a_range_drops_overlapping_entries_only() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 0, 2, 1);
    let _ = put(&mut cache, 1, 1, 4, 2);
    let _ = put(&mut cache, 1, 6, 1, 3);
    let _ = put(&mut cache, 1, 8, 1, 4);
    let _ = put(&mut cache, 2, 6, 1, 5);
    assert_eq!(
        sorted(cache.invalidate_range(1, 5 * PAGE - 1, PAGE + 2)),
        [2, 3]
    );
    cache.assert_invariants();
    assert_eq!(get(&mut cache, 1, 0, 1), Some(1));
    assert_eq!(get(&mut cache, 1, 8 * PAGE, 1), Some(4));
    assert_eq!(get(&mut cache, 2, 6 * PAGE, 1), Some(5));
    assert_eq!(
        cache.invalidate_range(1, 2 * PAGE - 1, 0),
        [1],
        "zero length is one byte"
    );
    assert_eq!(
        cache.invalidate_range(1, 2 * PAGE, 6 * PAGE),
        Vec::<u32>::new()
    );
}

#[test]
fn a_new_generation_drops_the_node_entries() {
    let mut cache = cache(8, usize::MAX);
    assert!(cache.set_generation(1, 5).is_empty());
    let _ = put(&mut cache, 1, 0, 1, 1);
    let _ = put(&mut cache, 2, 0, 1, 2);
    assert!(cache.set_generation(1, 5).is_empty(), "unchanged");
    assert_eq!(get(&mut cache, 1, 0, 1), Some(1));
    assert_eq!(cache.set_generation(1, 6), [1]);
    assert_eq!(cache.set_generation(2, 9), [2], "first report of the node");
    let _ = put(&mut cache, 1, 0, 1, 3);
    assert_eq!(
        cache.set_generation(1, 5),
        [3],
        "any change, even backwards"
    );
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn stale_tickets_are_refused() {
    let mut cache = cache(8, usize::MAX);
    let ticket = cache.lookup(1, 0, 1).unwrap_err();
    let _ = cache.invalidate_range(1, 100 * PAGE, 1);
    assert_eq!(
        cache.insert(ticket, 1, 0, PAGE, 1),
        [1],
        "range invalidated meanwhile"
    );
    assert!(
        cache.insert(ticket, 2, 0, PAGE, 2).is_empty(),
        "other nodes unaffected"
    );

    let ticket = cache.lookup(1, 0, 1).unwrap_err();
    let _ = cache.set_generation(1, 3);
    assert_eq!(
        cache.insert(ticket, 1, 0, PAGE, 3),
        [3],
        "new generation meanwhile"
    );
    let ticket = cache.ticket();
    assert!(cache.set_generation(1, 3).is_empty());
    assert!(
        cache.insert(ticket, 1, 0, PAGE, 4).is_empty(),
        "same generation"
    );

    let ticket = cache.ticket();
    let _ = cache.invalidate_node(7);
    assert_eq!(
        cache.insert(ticket, 1, PAGE, PAGE, 5),
        [5],
        "any node leaving voids all"
    );
    let ticket = cache.ticket();
    let _ = cache.clear();
    assert_eq!(
        cache.insert(ticket, 1, PAGE, PAGE, 6),
        [6],
        "clear voids all"
    );
    let ticket = cache.ticket();
    assert!(cache.insert(ticket, 1, PAGE, PAGE, 7).is_empty());
}

#[test]
fn disabled_caches_cache_nothing() {
    for config in [
        Config {
            enabled: false,
            ..Config::default()
        },
        Config {
            max_entries: 0,
            ..Config::default()
        },
        Config {
            max_bytes: 0,
            ..Config::default()
        },
    ] {
        let mut cache = Cache::new(config);
        assert_eq!(put(&mut cache, 1, 0, 1, 7), [7]);
        assert_eq!(get(&mut cache, 1, 0, 1), None);
        assert_eq!(
            cache.stats(),
            Stats {
                misses: 1,
                ..Stats::default()
            }
        );
    }
}

#[test]
fn counters_are_exact() {
    let mut cache = cache(2, usize::MAX);
    let _ = put(&mut cache, 1, 0, 2, 1);
    let _ = put(&mut cache, 1, 4, 1, 2);
    assert_eq!(get(&mut cache, 1, PAGE, 8), Some(1));
    assert_eq!(get(&mut cache, 1, 5 * PAGE, 8), None);
    assert_eq!(get(&mut cache, 1, 4 * PAGE, 8), Some(2));
    let _ = put(&mut cache, 1, 8, 1, 3); // Evicts 1.
    let _ = put(&mut cache, 1, 4, 2, 4); // Supersedes 2: not an eviction.
    let _ = put(&mut cache, 1, 4, 1, 5); // Covered: handed back.
    let _ = cache.invalidate_range(1, 8 * PAGE, 1); // Drops 3: not an eviction.
    assert_eq!(get(&mut cache, 1, 0, 1), None);
    assert_eq!(
        cache.stats(),
        Stats {
            hits: 2,
            misses: 2,
            evictions: 1,
            entries: 1,
            bytes: 2 * PAGE,
        }
    );
}

#[test]
fn clear_hands_everything_back() {
    let mut cache = cache(8, usize::MAX);
    let _ = put(&mut cache, 1, 0, 1, 1);
    let _ = put(&mut cache, 2, 0, 1, 2);
    let _ = cache.set_generation(3, 1);
    assert_eq!(sorted(cache.clear()), [1, 2]);
    cache.assert_invariants();
    assert_eq!(get(&mut cache, 1, 0, 1), None);
    assert_eq!((cache.stats().entries, cache.stats().bytes), (0, 0));
    let ticket = cache.ticket();
    let _ = cache.set_generation(3, 1);
    assert_eq!(
        cache.insert(ticket, 3, 0, PAGE, 9),
        [9],
        "generation forgotten: a change"
    );
    assert!(put(&mut cache, 1, 0, 1, 3).is_empty(), "usable afterwards");
}
