//! A signal after a put (OpenSHMEM's put-then-signal, no fence between
//! them) comes after its data.

use super::*;

/// A put and then an atomic that sets a flag at the same target (the
/// put-then-signal of OpenSHMEM programs, with no fence between them):
/// a target that waits for the flag and then reads the put's range finds
/// all of the put's data, for every path the put takes (bytes, the
/// rendezvous, the direct path, DMA) and both of the atomic's. fi_unimem(7)
/// promises it: an atomic is applied after the writes posted before it to
/// the same target.
fn a_signal_after_a_put(test: &str, memory: Memory) {
    let mut c = cluster(test, memory);
    c.spawn(2).connect_all();
    let key = 0x516;
    assert_eq!(c.cmd(1, format!("mr {key} {REGION} access=rw")).num(), 0);
    let flag = REGION - 8;
    let mut round = 0u64;
    for len in [8, 64, 65, 80, 4096, 16384, 16385, 100_000] {
        for form in ["", " inject"] {
            if form == " inject" && len > 16384 {
                continue;
            }
            round += 1;
            let seed = 0x5e0 + round;
            c.begin(1, format!("flag-wait {key} {flag} {round} 0 {len}"));
            c.cmd(0, format!("write 1 {key} 0 {len} {seed} {round}"));
            c.cmd(
                0,
                format!("atomic 1 {key} {flag} write u64 write 1 ops={round}{form}"),
            );
            let seen = c.next_line(1);
            let sum = seen
                .split_whitespace()
                .find_map(|w| w.strip_prefix("sum="))
                .and_then(unimem_tests::cluster::parse_num)
                .unwrap_or_else(|| panic!("flag-wait answered {seen:?}"));
            assert_eq!(
                sum,
                payload::checksum(&payload::pattern(seed, len)),
                "{memory:?} memory, {len}-byte put then atomic{form}: the flag came before the data"
            );
            c.cmd(0, "wait writes=1");
        }
    }
    c.finish();
}

#[test]
fn a_signal_after_a_put_to_ordinary_memory_comes_after_its_data() {
    a_signal_after_a_put("signal-after-put", Memory::Ordinary);
}

#[test]
fn a_signal_after_a_put_to_dmable_memory_comes_after_its_data() {
    a_signal_after_a_put("signal-after-put-dmable", Memory::Dmable);
}
