//! Owner invalidation across processes: two `fabric-peer` processes with
//! the dmable heap preloaded exchange messages, each receive into a fresh
//! heap buffer that is freed once checked, so the next one is allocated
//! where the last one was. The sender's cached registration of the old
//! buffer is then stale: it must be found so and made again, and every
//! byte land where the new receive wants it (checksums of whole buffers,
//! guard bytes after them), in both timing profiles.
//!
//! That a put into memory freed since it was granted never lands is
//! tested where the timing can be forced, in the protocol (unimem-proto)
//! (`puts_never_land_in_memory_freed_since_it_was_granted`) and the engine
//! (`unimem-dma`'s `tests/invalidation.rs`).

use unimem_tests::cluster::{Msg, Order};

/// Sizes above the heap's threshold (64 KiB), in and out of page
/// multiples and fragment multiples (256 KiB), so that buffers move by
/// a page now and then and are reused exactly the next time.
const LENS: [usize; 6] = [
    (64 << 10) + 1,
    300_000,
    (1 << 20) + 7,
    256 << 10,
    3 << 20,
    (1 << 20) + 7,
];

fn churn(test: &str, profile: &str, rounds: usize) {
    let mut c = super::cluster(test);
    c.preload_heap();
    c.env("FI_UNIMEM_PROFILE", profile);
    c.env("FI_LOG_LEVEL", "info");
    c.spawn(2).connect_all();
    let mut seed = 1;
    for round in 0..rounds {
        for &len in &LENS {
            seed += 1;
            c.transfer(0, 1, &[Msg::new(len, seed)], Order::Posted);
            // The other way, and an unexpected arrival now and then.
            let order = if round % 2 == 0 {
                Order::Posted
            } else {
                Order::Unexpected
            };
            c.transfer(1, 0, &[Msg::new(len + round, seed + 1000)], order);
        }
    }
    let stderrs = c.finish_with_warnings();
    for (i, stderr) in stderrs.iter().enumerate() {
        let heap_used = stderr
            .lines()
            .any(|l| l.contains("endpoint") && l.contains("closed") && l.contains(" sends"));
        assert!(heap_used, "p{i} never closed its endpoint:\n{stderr}");
        let stale: u64 = stderr
            .lines()
            .filter_map(|l| l.split(" misses, ").nth(1))
            .filter_map(|rest| rest.split(' ').next()?.parse::<u64>().ok())
            .sum();
        eprintln!("{test} p{i}: {stale} registrations found stale and made again");
        assert!(
            stale > 0,
            "p{i}: no registration was found stale, so nothing was tested:\n{stderr}"
        );
        assert!(
            !stderr.lines().any(|l| l.contains("WARN")),
            "p{i} warned:\n{stderr}"
        );
    }
}

#[test]
fn freed_and_reused_receive_buffers_never_get_a_stale_dma_native() {
    churn("invalidate-native", "native", 12);
}

#[test]
fn freed_and_reused_receive_buffers_never_get_a_stale_dma_paper() {
    churn("invalidate-paper", "paper", 3);
}
