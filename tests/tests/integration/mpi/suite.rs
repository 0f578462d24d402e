//! MPI correctness suite: real MPI jobs over the unimem provider, under
//! MPICH, Open MPI and Intel MPI.
//!
//! Every test runs all the suite programs (`tests/mpi/<name>.c`, see the
//! comment at the top of each) on 2, 3 or 4 ranks, each built with the
//! MPI's own `mpicc`, through `scripts/mpirun-unimem --prove` (see
//! `unimem_tests::mpi`): MPICH in its native (tagged) mode or its
//! active-message mode; Open MPI with ob1 over the ofi BTL and with cm over
//! the ofi MTL (MPI windows by osc/rdma over the ofi BTL in both); Intel
//! MPI over libfabric 2.5.1 and over Debian's 1.17. For each program it
//! checks the exit status, the program's `mpi-suite <name>: PASS (<N>
//! ranks)` line, that unimem carried the job (every rank's endpoints sent
//! and received, and did RMA in `rma`, by the lines the provider logs at
//! close; MPICH's debug summary names unimem; Intel MPI's names unimem and
//! the libfabric it was meant to load), and that the job left nothing in
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
//! Open MPI and Intel MPI run them without it (`MPI_SUITE_AM_FULL=1`).
//!
//! Jobs run with the dmable heap preloaded, as `scripts/mpirun-unimem` does
//! by default; the `*_no_heap` tests run the suite without it
//! (`--no-heap`), and `the_heap_is_on_by_default` checks that the switch
//! does what it says.
//!
//! The `pipeline_rendezvous_*` tests run some of the programs with MPICH's
//! pipeline rendezvous, whose chunks ask for `FI_MATCH_COMPLETE` and
//! `FI_DELIVERY_COMPLETE`, and `read_and_write_rendezvous_*` with its read
//! and write rendezvous, which ride on FI_RMA, at a 16 KiB and at the
//! default eager threshold; `auto_rendezvous_at_16k_*` runs the probe and
//! unexpected-message programs at 16 KiB. The ignored
//! `mpich_pipeline_wildcard_defect` shows why `probe` is not among the
//! former, and `mpich_small_eager_threshold_defect` why no test uses a
//! threshold of 0 (MPICH 5.0.2 fails there with every provider).

use std::path::{Path, PathBuf};
use std::time::Duration;

use unimem_tests::mpi::{self, unimem_carried, Job, Mpi, Output};

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

fn build(mpi: Mpi, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpi-suite");
    mpi.build(&mpi::source(name), &dir, &["-std=c99", "-pthread"])
}

/// What is wrong with one program's run, if anything.
fn problems(mpi: Mpi, am: bool, name: &str, ranks: usize, output: &Output) -> Vec<String> {
    let mut found = Vec::new();
    if !output.success() {
        found.push("it failed".to_string());
    }
    let pass = format!("mpi-suite {name}: PASS ({ranks} ranks)");
    if !output.has_stdout_line(&pass) {
        found.push(format!("no '{pass}' line"));
    }
    // RMA through unimem in `rma`, except in MPICH's active-message mode
    // (no FI_RMA asked for: windows ride on messages)
    if let Err(why) = output.proof(ranks, name == "rma" && !am) {
        found.push(format!("unimem did not carry it: {why}"));
    }
    let libfabric = match mpi {
        Mpi::Impi => Some("2.5.1"),
        Mpi::ImpiSystem => Some("1.17.0"),
        _ => None,
    };
    if mpi == Mpi::Mpich && !unimem_carried(output) {
        found.push("MPICH's debug summary does not name unimem".to_string());
    }
    if let Some(version) = libfabric {
        for line in [
            "MPI startup(): libfabric provider: unimem".to_string(),
            format!("MPI startup(): libfabric version: {version}"),
        ] {
            if !output.contains(&line) {
                found.push(format!("Intel MPI does not say '{line}'"));
            }
        }
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

/// Runs `programs` under MPICH as [`suite`] runs them all.
fn run(programs: &[&str], ranks: usize, am: bool, env: &[(&str, &str)]) {
    run_with(Mpi::Mpich, programs, ranks, am, env, true);
}

/// The whole suite under another MPI than MPICH, without the workarounds
/// for MPICH's defects (`MPI_SUITE_AM_FULL=1`).
fn suite_of(mpi: Mpi, ranks: usize) {
    run_with(
        mpi,
        PROGRAMS,
        ranks,
        false,
        &[("MPI_SUITE_AM_FULL", "1")],
        true,
    );
}

/// Runs `programs` under `mpi`, with the dmable heap preloaded or not
/// (`--no-heap`).
fn run_with(mpi: Mpi, programs: &[&str], ranks: usize, am: bool, env: &[(&str, &str)], heap: bool) {
    run_on(mpi, programs, ranks, am, env, heap, None);
}

/// [`run_with`], the ranks spread over test hosts as `hosts` says
/// (`uh1:2,uh2:2`, `scripts/mpirun-unimem --hosts`) when given.
fn run_on(
    mpi: Mpi,
    programs: &[&str],
    ranks: usize,
    am: bool,
    env: &[(&str, &str)],
    heap: bool,
    hosts: Option<&str>,
) {
    let base = match (mpi, am) {
        (Mpi::Mpich, true) => "MPICH, active messages".to_string(),
        (Mpi::Mpich, false) => "MPICH, native".to_string(),
        (other, _) => other.name().to_string(),
    };
    let base = match hosts {
        Some(hosts) => format!("{base}, on {hosts}"),
        None => base,
    };
    let mode = if heap {
        base
    } else {
        format!("{base}, no heap")
    };
    let mut failures = Vec::new();
    let mut timings = Vec::new();
    let mut total = Duration::ZERO;
    for name in programs {
        let program = build(mpi, name);
        let mut job = Job::new(&program)
            .mpi(mpi)
            .prove(true)
            .ranks(ranks)
            .am(am)
            .timeout(PROGRAM_TIMEOUT);
        if !heap {
            job = job.helper_option("--no-heap");
        }
        if let Some(hosts) = hosts {
            job = job.helper_option("--hosts").helper_option(hosts);
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
        let found = problems(mpi, am, name, ranks, &output);
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
fn openmpi_2_ranks() {
    suite_of(Mpi::OpenMpi, 2);
}

#[test]
fn openmpi_4_ranks() {
    suite_of(Mpi::OpenMpi, 4);
}

#[test]
fn openmpi_mtl_2_ranks() {
    suite_of(Mpi::OpenMpiMtl, 2);
}

#[test]
fn impi_2_ranks() {
    suite_of(Mpi::Impi, 2);
}

#[test]
fn impi_4_ranks() {
    suite_of(Mpi::Impi, 4);
}

#[test]
fn impi_system_2_ranks() {
    suite_of(Mpi::ImpiSystem, 2);
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

/// A mixed job: two ranks on each of two test hosts, each rank talking to
/// its neighbour through shared memory and to the other host's ranks
/// through the network backend.
#[test]
fn suite_4_ranks_on_two_hosts_native() {
    // The fabric tests across hosts cut links: not meanwhile.
    let _hosts = unimem_tests::hosts::exclusive();
    unimem_tests::hosts::ensure();
    run_on(
        Mpi::Mpich,
        PROGRAMS,
        4,
        false,
        &[],
        true,
        Some("uh1:2,uh2:2"),
    );
}

#[test]
fn suite_4_ranks_on_two_hosts_am() {
    // The fabric tests across hosts cut links: not meanwhile.
    let _hosts = unimem_tests::hosts::exclusive();
    unimem_tests::hosts::ensure();
    run_on(
        Mpi::Mpich,
        PROGRAMS,
        4,
        true,
        &[],
        true,
        Some("uh1:2,uh2:2"),
    );
}

#[test]
fn suite_2_ranks_native_no_heap() {
    run_with(Mpi::Mpich, PROGRAMS, 2, false, &[], false);
}

#[test]
fn suite_3_ranks_am_no_heap() {
    run_with(Mpi::Mpich, PROGRAMS, 3, true, &[], false);
}

/// Each rank of a default job adopts the preloaded heap's region (the
/// provider says so at info level) and moves large messages straight
/// between user buffers; with `--no-heap` none does.
#[test]
fn the_heap_is_on_by_default() {
    const ADOPTED: &str = "dmable region: the preloaded heap's";
    for heap in [true, false] {
        let mut job = Job::new(build(Mpi::Mpich, "p2p"))
            .env("FI_LOG_LEVEL", "debug")
            .env("FI_LOG_PROV", "unimem");
        if !heap {
            job = job.helper_option("--no-heap");
        }
        let output = job.run();
        // Not `problems`: its proof needs `--prove`, whose log settings
        // would hide the debug lines counted here.
        assert!(
            output.success() && output.has_stdout_line("mpi-suite p2p: PASS (2 ranks)"),
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

/// The programs that pass with the pipeline, read and write rendezvous
/// (`backlog`: unexpected messages): `probe` does not, for MPICH's defect
/// below.
const PIPELINE_PROGRAMS: &[&str] = &["p2p", "flood", "backlog"];

/// A rendezvous protocol at MPICH's default eager threshold.
fn at_default_threshold(protocol: &'static str) -> [(&'static str, &'static str); 1] {
    [("MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL", protocol)]
}

#[test]
fn pipeline_rendezvous_2_ranks() {
    run(PIPELINE_PROGRAMS, 2, false, PIPELINE);
    run(PIPELINE_PROGRAMS, 2, false, PIPELINE_SMALL_CHUNKS);
    run(
        PIPELINE_PROGRAMS,
        2,
        false,
        &at_default_threshold("pipeline"),
    );
}

#[test]
fn pipeline_rendezvous_4_ranks() {
    run(PIPELINE_PROGRAMS, 4, false, PIPELINE);
    run(PIPELINE_PROGRAMS, 4, false, PIPELINE_SMALL_CHUNKS);
}

/// MPICH's automatic choice at a 16 KiB eager threshold, with the
/// programs of unexpected messages, probes, matched probes and
/// any-source receives (the whole suite runs at the default threshold).
#[test]
fn auto_rendezvous_at_16k_2_and_4_ranks() {
    let env = [("MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD", "16384")];
    run(&["p2p", "probe", "flood", "backlog"], 2, false, &env);
    run(&["p2p", "probe", "flood", "backlog"], 4, false, &env);
}

/// MPICH's read and write rendezvous (`MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL=read`,
/// `=write`) above a 16 KiB eager threshold: the receiver reads the
/// message from the sender's registered buffer (fi_read), or the sender
/// writes it into the receiver's (fi_write). Both need FI_RMA, which
/// unimem has now; `probe` meets the same MPICH defect as the pipeline
/// (an `MPI_ANY_SOURCE` receive of such a message never completes, over
/// shm and tcp too).
fn rendezvous(protocol: &'static str) -> [(&'static str, &'static str); 2] {
    [
        ("MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD", "16384"),
        ("MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL", protocol),
    ]
}

#[test]
fn read_and_write_rendezvous_2_ranks() {
    run(PIPELINE_PROGRAMS, 2, false, &rendezvous("read"));
    run(PIPELINE_PROGRAMS, 2, false, &rendezvous("write"));
    run(PIPELINE_PROGRAMS, 2, false, &at_default_threshold("read"));
    run(PIPELINE_PROGRAMS, 2, false, &at_default_threshold("write"));
}

#[test]
fn read_and_write_rendezvous_4_ranks() {
    run(PIPELINE_PROGRAMS, 4, false, &rendezvous("read"));
    run(PIPELINE_PROGRAMS, 4, false, &rendezvous("write"));
}

/// An eager threshold below MPICH's own control messages
/// (`MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD=0`, or 1024) breaks MPICH 5.0.2
/// itself, with every provider: with 0, `MPI_Init` fails ("Message
/// truncated" in the Allreduce of `check_num_nics`) over unimem and shm,
/// and the tcp job is killed; with 1024, `p2p`'s `MPI_Recv` of 4159 bytes
/// fails with "Message truncated" over unimem and shm alike. 16 KiB and
/// the default pass (the tests above). Run it to see whether a newer MPICH
/// still does.
#[test]
#[ignore = "MPICH 5.0.2 fails here with every provider (shm and tcp too)"]
fn mpich_small_eager_threshold_defect() {
    for protocol in ["auto", "pipeline", "read", "write"] {
        run(
            &["p2p", "probe", "flood", "backlog"],
            2,
            false,
            &[
                ("MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD", "0"),
                ("MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL", protocol),
            ],
        );
    }
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
    let output = Job::new(build(Mpi::Mpich, "large"))
        .prove(true)
        .env("MPI_SUITE_WATCHDOG", "300")
        .timeout(Duration::from_secs(600))
        .run();
    let found = problems(Mpi::Mpich, false, "large", 2, &output);
    assert!(
        found.is_empty(),
        "{}\n{}",
        found.join("; "),
        output.report()
    );
}

/// Open MPI's `threads` program (4 threads per rank in MPI at once), run
/// again and again on 4 ranks: it failed with `FI_EKEYREJECTED` when one
/// thread's MR close dropped the process's key table while another's
/// registration made the next one (the closing thread's unlink then took
/// the new table's name; fixed, and tested deterministically in
/// `unimem-mailbox`'s `a_name_being_closed_by_another_thread_...`). 20
/// runs: the bound the rest of the suite leaves room for.
#[test]
fn openmpi_threads_again_and_again() {
    openmpi_threads(20, &[("MPI_SUITE_AM_FULL", "1")]);
}

/// The same with the network backend on (`FI_UNIMEM_NET_PROVIDER=tcp`).
/// While the interface thread ticked every millisecond, about 1 run in 25
/// hung: one rank's thread waits for ever in `mmap` of a peer's object, in
/// `down_write` of the file's `i_mmap_rwsem` (lock tracepoints), which no
/// task visibly holds; the other ranks' maps of that file queue behind it.
/// With the 20 ms tick of a process that knows no other host, none in 160
/// runs; with a 1 ms tick again 3 in 31. The cause is not found (issue
/// 26), and a job across hosts ticks every millisecond: kept out of the
/// suite until it is; run it to see.
#[test]
#[ignore = "the mmap hang of issue 26 is not found; rare with this test's 20 ms tick"]
fn openmpi_threads_again_and_again_with_the_network_backend() {
    openmpi_threads(
        100,
        &[
            ("MPI_SUITE_AM_FULL", "1"),
            ("FI_UNIMEM_NET_PROVIDER", "tcp"),
        ],
    );
}

/// Open MPI's `threads` program on 4 ranks, `runs` times, with `env`.
fn openmpi_threads(runs: usize, env: &[(&str, &str)]) {
    for _ in 0..runs {
        run_with(Mpi::OpenMpi, &["threads"], 4, false, env, true);
    }
}
