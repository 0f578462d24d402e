//! The dmable heap (`libunimem-heap.so`) preloaded into separate processes:
//! `tests/heap/heapcheck.c` (built with `cc`) for the allocation API,
//! threads, fork, `realloc` across the threshold and exhaustion; and two
//! `fabric-peer` processes for the point of it all, a large message that
//! goes straight from the sender's heap to the receiver's by one DMA.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use unimem_mailbox::shm::list_objects;
use unimem_mailbox::JobId;
use unimem_tests::cluster::{carried_pulls, Msg, Order};
use unimem_tests::{heap, mpi};

/// A heapcheck run that takes longer than this is taken for a hang.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn heapcheck() -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("heap");
    mpi::Build::new(mpi::repo_root().join("tests/heap/heapcheck.c"), out)
        .compiler("cc")
        .flags(["-pthread", "-ldl"])
        .build()
}

/// Runs `heapcheck args` with the heap preloaded, in a unimem job of its
/// own, with `env`; checks that it passed and left nothing in /dev/shm.
fn run(test: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let job = format!("heap-{test}-{}", std::process::id());
    let mut cmd = Command::new(heapcheck());
    cmd.args(args)
        .env("LD_PRELOAD", heap::library())
        .env("FI_UNIMEM_JOB", &job)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start heapcheck");
    let deadline = Instant::now() + HANG_GUARD;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("heapcheck output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("heapcheck {}: PASS", args[0])),
        "heapcheck {args:?} failed ({})\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}",
        output.status
    );
    let left = list_objects(Some(JobId::from_name(&job)));
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_whole_allocation_api() {
    // The default: every block dmable.
    let out = run("api", &["api"], &[]);
    assert_eq!(stderr(&out), "", "the heap said something");
    // Other thresholds, as the environment sets them: smaller blocks
    // from the system.
    for threshold in ["65536", "1048576"] {
        let out = run(
            &format!("api-{threshold}"),
            &["api"],
            &[("FI_UNIMEM_HEAP_THRESHOLD", threshold)],
        );
        assert_eq!(stderr(&out), "", "the heap said something");
    }
}

#[test]
fn small_blocks_are_dmable_share_pages_and_serve_again() {
    let out = run("small", &["small"], &[]);
    assert_eq!(stderr(&out), "", "the heap said something");
}

#[test]
fn threads_allocate_and_free_at_once() {
    run("threads", &["threads", "8"], &[]);
}

#[test]
fn a_forked_child_gets_a_copy_and_a_region_of_its_own() {
    run("fork", &["fork"], &[]);
    run(
        "fork-64k",
        &["fork"],
        &[("FI_UNIMEM_HEAP_THRESHOLD", "65536")],
    );
}

#[test]
fn realloc_across_the_threshold_keeps_the_data() {
    run("realloc", &["realloc"], &[]);
    run(
        "realloc-64k",
        &["realloc"],
        &[("FI_UNIMEM_HEAP_THRESHOLD", "65536")],
    );
}

#[test]
fn an_exhausted_region_falls_back_with_one_line() {
    let out = run(
        "exhaust",
        &["exhaust"],
        &[
            ("FI_UNIMEM_DMA_SEGMENT_SIZE", "1m"),
            ("FI_UNIMEM_HEAP_MAX_SIZE", "4m"),
        ],
    );
    let said: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.starts_with("unimem-heap:"))
        .map(str::to_string)
        .collect();
    assert_eq!(said.len(), 1, "one line about the full region: {said:?}");
    assert!(said[0].contains("dmable region is full"), "{said:?}");
}

/// The heap must not bring libfabric along: MPI loads its own.
#[test]
fn the_heap_does_not_load_libfabric() {
    let out = Command::new("ldd")
        .arg(heap::library())
        .output()
        .expect("run ldd");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ldd failed: {text}");
    assert!(!text.contains("libfabric"), "ldd:\n{text}");
}

/// One message of 1 MiB (a rendezvous) from p0 to p1, with or without the
/// heap; returns both sides' stderr (libfabric's log at debug level).
fn one_large_message(test: &str, with_heap: bool) -> Vec<String> {
    let mut c = crate::fabric::cluster(test);
    c.env("FI_LOG_LEVEL", "debug");
    if with_heap {
        c.preload_heap();
    }
    c.spawn(2).connect_all();
    c.transfer(
        0,
        1,
        &[Msg::new(1 << 20, 7), Msg::new(3 << 20, 8)],
        Order::Posted,
    );
    c.finish()
}

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

#[test]
fn with_the_heap_large_messages_go_straight_between_user_buffers() {
    let logs = one_large_message("heap-direct", true);
    for (side, log) in [("sender", &logs[0]), ("receiver", &logs[1])] {
        assert!(
            log.contains("dmable region: the preloaded heap's"),
            "{side} did not adopt the heap's region"
        );
    }
    // Each message goes straight between the user buffers: read by the
    // receiver from the sender's (it posted first and polls), or put by the
    // sender into the receiver's (granted); never through staging.
    let read = carried_pulls(&logs[1]) as usize;
    assert_eq!(
        count(&logs[0], "rendezvous send direct") + read,
        2,
        "{}",
        logs[0]
    );
    assert_eq!(count(&logs[0], "rendezvous send staged"), 0);
    assert_eq!(
        count(&logs[1], "rendezvous receive direct"),
        2,
        "{}",
        logs[1]
    );
    assert_eq!(count(&logs[1], "rendezvous receive staged"), 0);
}

#[test]
fn without_the_heap_large_messages_are_staged() {
    let logs = one_large_message("heap-staged", false);
    assert_eq!(count(&logs[0], "rendezvous send staged"), 2, "{}", logs[0]);
    assert_eq!(
        count(&logs[1], "rendezvous receive staged"),
        2,
        "{}",
        logs[1]
    );
}
