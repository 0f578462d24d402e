//! Four processes and the target fetch-add one counter: an exact final
//! value, every ticket given once.

use super::*;

/// Fetch-adds per process per round.
const TICKETS: u64 = 300;

fn tickets(reply: &Reply) -> Vec<u64> {
    let text = reply
        .ok
        .strip_prefix("tickets=")
        .unwrap_or_else(|| panic!("no tickets: {}", reply.ok));
    parse_list(text)
}

fn four_initiators_and_the_target(test: &str, memory: Memory) {
    let mut c = cluster(test, memory);
    c.spawn(5).connect_all();
    let mut r = Region::new(&mut c, 0, 0xc0, 21, "rw");
    const AT: usize = 4096;
    r.set(&mut c, AT, U64, &[0]);
    let mut all = Vec::new();
    // Round 1: the target fetch-adds through libfabric (to itself); round
    // 2: with CPU atomics on its own memory.
    for own in ["", " local"] {
        let commands: Vec<(usize, String)> = (0..5)
            .map(|p| {
                let window = 1 + p % 4;
                let extra = if p == 0 { own } else { "" };
                (
                    p,
                    format!("fetch-add-loop 0 0xc0 {AT} {TICKETS} window={window}{extra}"),
                )
            })
            .collect();
        for (p, reply) in c.all(&commands).iter().enumerate() {
            let got = tickets(reply);
            assert_eq!(got.len() as u64, TICKETS, "p{p}");
            all.extend(got);
        }
    }
    let total = 2 * 5 * TICKETS;
    assert_eq!(r.get(&mut c, AT, U64, 1), [total], "the final count");
    all.sort_unstable();
    let missing: Vec<u64> = (0..total)
        .filter(|t| all.binary_search(t).is_err())
        .collect();
    let twice: Vec<u64> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        missing.is_empty() && twice.is_empty() && all.len() as u64 == total,
        "tickets missing {missing:?}, given twice {twice:?}"
    );
    r.store(AT, U64, &[total]);
    r.check(&mut c, "after the tickets");
    let logs = c.finish();
    for (p, log) in logs.iter().enumerate().skip(1) {
        check_path(log, memory, 2 * TICKETS, &format!("p{p}"));
    }
    check_path(&logs[0], memory, TICKETS, "p0");
}

#[test]
fn four_processes_and_the_target_fetch_add_one_counter_in_ordinary_memory() {
    four_initiators_and_the_target("atomic-tickets", Memory::Ordinary);
}

#[test]
fn four_processes_and_the_target_fetch_add_one_counter_in_dmable_memory() {
    four_initiators_and_the_target("atomic-tickets-dmable", Memory::Dmable);
}
