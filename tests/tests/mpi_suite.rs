//! MPI correctness suite: real MPICH jobs over the unimem provider.
//!
//! Every test runs all the suite programs (`tests/mpi/<name>.c`, see the
//! comment at the top of each) on 2, 3 or 4 ranks, in MPICH's native
//! (tagged) mode or its active-message mode, through `scripts/mpirun-unimem`
//! (see `unimem_tests::mpi`). For each program it checks the exit status,
//! the program's `mpi-suite <name>: PASS (<N> ranks)` line, that MPICH's
//! debug summary names unimem, and that the job left nothing in
//! `/dev/shm`. A failing program does not stop the others: the test
//! reports every failure, with the program's output, at the end.
//!
//! Four ranks oversubscribe a two-core machine; the programs keep their
//! iteration counts modest for that. Each program also has a watchdog: a
//! rank stuck in one phase for 60 s (`MPI_SUITE_WATCHDOG`) says where and
//! exits, well within the job's timeout.
//!
//! MPICH 5.0.2 has defects of its own in active-message mode (and for MPI
//! RMA, which rides on active messages over unimem), with every provider;
//! the programs keep clear of them and say so in a `note:` line (see
//! `avoid_am_bugs` in `tests/mpi/suite.h`). The ignored test
//! `mpich_active_message_defects` runs the programs without that care.
//!
//! Jobs run with the dmable heap preloaded, as `scripts/mpirun-unimem` does
//! by default; the `*_no_heap` tests run the suite without it
//! (`--no-heap`), and `the_heap_is_on_by_default` checks that the switch
//! does what it says.
//!
//! The `pipeline_rendezvous_*` tests run some of the programs with MPICH's
//! pipeline rendezvous, whose chunks ask for `FI_MATCH_COMPLETE` and
//! `FI_DELIVERY_COMPLETE`; the ignored `mpich_pipeline_wildcard_defect`
//! shows why `probe` is not among them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use unimem_tests::mpi::{self, unimem_carried, Job, Output};

/// The suite programs, in the order they run.
const PROGRAMS: &[&str] = &[
    "p2p",
    "probe",
    "flood",
    "backlog",
    "modes",
    "datatypes",
    "collectives",
    "rma",
    "threads",
];

/// Longest run of one program (its watchdog fires after 60 s in a phase).
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(150);

fn build(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpi-suite");
    mpi::build(&mpi::source(name), &dir, &["-std=c99", "-pthread"])
}

/// What is wrong with one program's run, if anything.
fn problems(name: &str, ranks: usize, output: &Output) -> Vec<String> {
    let mut found = Vec::new();
    if !output.success() {
        found.push("it failed".to_string());
    }
    let pass = format!("mpi-suite {name}: PASS ({ranks} ranks)");
    if !output.has_stdout_line(&pass) {
        found.push(format!("no '{pass}' line"));
    }
    if !unimem_carried(output) {
        found.push("MPICH's debug summary does not name unimem".to_string());
    }
    let left = output.leftover_objects();
    if !left.is_empty() {
        found.push(format!("left in /dev/shm: {left:?}"));
    }
    found
}

fn suite(ranks: usize, am: bool, env: &[(&str, &str)]) {
    run(PROGRAMS, ranks, am, env);
}

/// Runs `programs` as [`suite`] runs them all.
fn run(programs: &[&str], ranks: usize, am: bool, env: &[(&str, &str)]) {
    run_with(programs, ranks, am, env, true);
}

/// As [`run`], with the dmable heap preloaded or not (`--no-heap`).
fn run_with(programs: &[&str], ranks: usize, am: bool, env: &[(&str, &str)], heap: bool) {
    let mode = match (am, heap) {
        (false, true) => "native",
        (true, true) => "active messages",
        (false, false) => "native, no heap",
        (true, false) => "active messages, no heap",
    };
    let mut failures = Vec::new();
    let mut timings = Vec::new();
    let mut total = Duration::ZERO;
    for name in programs {
        let program = build(name);
        let mut job = Job::new(&program)
            .ranks(ranks)
            .am(am)
            .timeout(PROGRAM_TIMEOUT);
        if !heap {
            job = job.helper_option("--no-heap");
        }
        for (key, value) in env {
            job = job.env(key, value);
        }
        let output = job.run();
        total += output.elapsed;
        timings.push(format!("{name} {:.2} s", output.elapsed.as_secs_f64()));
        for note in output.stdout.lines().filter(|l| l.contains(": note: ")) {
            eprintln!("{note}");
        }
        let found = problems(name, ranks, &output);
        if !found.is_empty() {
            failures.push(format!(
                "== {name} on {ranks} ranks, {mode}: {}\n{}",
                found.join("; "),
                output.report()
            ));
        }
    }
    eprintln!(
        "mpi suite, {ranks} ranks, {mode}: {:.2} s ({})",
        total.as_secs_f64(),
        timings.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} of {} suite programs failed on {ranks} ranks, {mode}:\n\n{}",
        failures.len(),
        programs.len(),
        failures.join("\n\n")
    );
}

#[test]
fn suite_2_ranks_native() {
    suite(2, false, &[]);
}

#[test]
fn suite_2_ranks_am() {
    suite(2, true, &[]);
}

#[test]
fn suite_3_ranks_native() {
    suite(3, false, &[]);
}

#[test]
fn suite_3_ranks_am() {
    suite(3, true, &[]);
}

#[test]
fn suite_4_ranks_native() {
    suite(4, false, &[]);
}

#[test]
fn suite_4_ranks_am() {
    suite(4, true, &[]);
}

#[test]
fn suite_2_ranks_native_no_heap() {
    run_with(PROGRAMS, 2, false, &[], false);
}

#[test]
fn suite_3_ranks_am_no_heap() {
    run_with(PROGRAMS, 3, true, &[], false);
}

/// Each rank of a default job adopts the preloaded heap's region (the
/// provider says so at info level) and moves large messages straight
/// between user buffers; with `--no-heap` none does.
#[test]
fn the_heap_is_on_by_default() {
    const ADOPTED: &str = "dmable region: the preloaded heap's";
    for heap in [true, false] {
        let mut job = Job::new(build("p2p"))
            .env("FI_LOG_LEVEL", "debug")
            .env("FI_LOG_PROV", "unimem");
        if !heap {
            job = job.helper_option("--no-heap");
        }
        let output = job.run();
        assert!(
            problems("p2p", 2, &output).is_empty(),
            "{}",
            output.report()
        );
        let count = |text: &str| {
            output
                .lines
                .iter()
                .filter(|l| l.text.contains(text))
                .count()
        };
        let (adopted, direct, staged) = (
            count(ADOPTED),
            count("rendezvous receive direct"),
            count("rendezvous receive staged"),
        );
        eprintln!("heap {heap}: {adopted} ranks adopted it; rendezvous receives: {direct} direct, {staged} staged");
        if heap {
            assert_eq!(adopted, 2, "{}", output.report());
            assert!(direct > 0 && staged == 0, "{}", output.report());
        } else {
            assert_eq!(adopted, 0, "{}", output.report());
            assert!(direct == 0 && staged > 0, "{}", output.report());
        }
    }
}

/// MPICH's pipeline rendezvous (`MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL=pipeline`)
/// above a 16 KiB eager threshold: MPICH sends each chunk with
/// `fi_tsendmsg(FI_COMPLETION | FI_MATCH_COMPLETE | FI_DELIVERY_COMPLETE)`
/// and counts on those levels (unimem used to refuse FI_MATCH_COMPLETE,
/// and MPICH aborted: "Assertion failed in ofi_pipeline.c").
const PIPELINE: &[(&str, &str)] = &[
    ("MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD", "16384"),
    ("MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL", "pipeline"),
];

/// As [`PIPELINE`], in 16 KiB chunks: each one an eager send of unimem
/// that waits for the target's acknowledgement (with MPICH's default
/// chunks, most go by unimem's rendezvous, which always waited for the
/// target).
const PIPELINE_SMALL_CHUNKS: &[(&str, &str)] = &[
    ("MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD", "16384"),
    ("MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL", "pipeline"),
    ("MPIR_CVAR_CH4_OFI_PIPELINE_CHUNK_SZ", "16384"),
];

/// The programs that pass with the pipeline rendezvous: `probe` does not,
/// for MPICH's defect below.
const PIPELINE_PROGRAMS: &[&str] = &["p2p", "flood"];

#[test]
fn pipeline_rendezvous_2_ranks() {
    run(PIPELINE_PROGRAMS, 2, false, PIPELINE);
    run(PIPELINE_PROGRAMS, 2, false, PIPELINE_SMALL_CHUNKS);
}

#[test]
fn pipeline_rendezvous_4_ranks() {
    run(PIPELINE_PROGRAMS, 4, false, PIPELINE);
    run(PIPELINE_PROGRAMS, 4, false, PIPELINE_SMALL_CHUNKS);
}

/// `probe` with the pipeline rendezvous hangs in its first phase: MPICH
/// 5.0.2 never completes an `MPI_ANY_SOURCE` receive of a pipelined
/// message (the sender completes; the receive waits forever). A
/// two-rank `MPI_Send`/`MPI_Recv(MPI_ANY_SOURCE)` of 100 000 bytes shows
/// it with the tcp and shm providers as with unimem; with the source
/// named it passes. Run it to see whether a newer MPICH still does.
#[test]
#[ignore = "MPICH 5.0.2 hangs here with every provider (tcp and shm too)"]
fn mpich_pipeline_wildcard_defect() {
    run(&["probe"], 2, false, PIPELINE);
}

/// The programs without their care for MPICH 5.0.2's active-message
/// defects (`MPI_SUITE_AM_FULL=1`): several of them crash in MPICH, over
/// any provider. Run it to see whether a newer MPICH still does.
#[test]
#[ignore = "MPICH 5.0.2 crashes here with every provider (tcp and shm too)"]
fn mpich_active_message_defects() {
    suite(3, true, &[("MPI_SUITE_AM_FULL", "1")]);
}

/// MPI-4's large-count calls beyond 2^31 bytes (`tests/mpi/large.c`:
/// contiguous and strided), on 2 ranks in native mode: unimem carries
/// 64-bit lengths (max_msg_size is SIZE_MAX). It needs some 9 GiB and a
/// minute, so it runs once, not on every rank count.
#[test]
fn large_count_messages_beyond_two_gib() {
    let output = Job::new(build("large"))
        .env("MPI_SUITE_WATCHDOG", "300")
        .timeout(Duration::from_secs(600))
        .run();
    let found = problems("large", 2, &output);
    assert!(
        found.is_empty(),
        "{}\n{}",
        found.join("; "),
        output.report()
    );
}
