//! What the children's logs say: the counts their endpoints' close lines
//! give, and the provider's warnings.

/// What an endpoint carried by RMA and atomics, from the line it logs at
/// `fi_close` (`FI_LOG_LEVEL=info`): `(one-sided, through the target,
/// atomics)`. Fails if `stderr` has no such line, or more than one.
pub fn carried(stderr: &str) -> (u64, u64, u64) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" closed: ") && l.contains("RMA and atomics:"))
        .collect();
    assert_eq!(lines.len(), 1, "one endpoint close line in:\n{stderr}");
    let tail = lines[0].split("RMA and atomics:").nth(1).expect("split");
    let nums: Vec<u64> = tail
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().expect("digits"))
        .collect();
    assert_eq!(nums.len(), 3, "close line: {}", lines[0]);
    (nums[0], nums[1], nums[2])
}

/// The access notices an endpoint sent (`FI_RMA_EVENT`), from the same
/// line as [`carried_direct`].
pub fn carried_notices(stderr: &str) -> u64 {
    count_before(stderr, " access notices to targets")
}

/// The rendezvous receives an endpoint read from their sender's offered
/// buffer, from the same line as [`carried_direct`].
pub fn carried_pulls(stderr: &str) -> u64 {
    count_before(stderr, " rendezvous receives read")
}

/// The number just before `marker` on the first line that holds it.
fn count_before(stderr: &str, marker: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?} in:\n{stderr}"));
    let head = line.split(marker).next().expect("split");
    head.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{marker:?} line: {line}"))
}

/// How many of an endpoint's one-sided operations were done inside their
/// call (the direct path), from its close line (`FI_LOG_LEVEL=info`).
/// Fails if `stderr` has no such line, or more than one.
pub fn carried_direct(stderr: &str) -> u64 {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("one-sided operations done inside their call"))
        .collect();
    assert_eq!(lines.len(), 1, "one direct-path line in:\n{stderr}");
    let tail = lines[0].rsplit("<info> endpoint ").next().expect("split");
    tail.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("direct-path line: {}", lines[0]))
}

/// A warning line of the provider in libfabric's log.
pub fn is_provider_warning(line: &str) -> bool {
    line.contains("<warn>") && line.contains(":unimem:")
}
