//! MPI jobs over unimem when things go wrong or are unusual: a rank killed
//! with SIGKILL mid-job, and MPI loaded privately with `dlopen(RTLD_LOCAL)`.
//! Jobs run through `scripts/mpirun-unimem` (see `unimem_tests::mpi`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use unimem_tests::mpi::{self, assert_unimem_carried, Build, Job, Line, RunningJob};

/// How long the tests wait for traffic to flow, and then for the job (or
/// the survivors' MPI errors) after the kill, before they call it a hang.
/// Not a time requirement: how fast a dead rank is noticed is for a
/// benchmark; the times are printed.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpi-faults")
}

/// What a rank printed on `line`: the line from its last "rank " on. A
/// launcher that merges the ranks' output (gforker) may put a rank's whole
/// line after another process's unfinished one (seen: "==== data
/// structure summary ====rank 2 pid 11500", and a wait for the pids that
/// ran out).
fn rank_part(line: &Line) -> &str {
    line.text
        .rfind("rank ")
        .map_or(line.text.as_str(), |at| &line.text[at..])
}

/// Pid of each rank, from the "rank R pid P" lines of `kill_rank`.
fn rank_pids(lines: &[Line], ranks: usize) -> Vec<Option<i32>> {
    let mut pids = vec![None; ranks];
    for line in lines {
        let words: Vec<&str> = rank_part(line).split_whitespace().collect();
        if let ["rank", rank, "pid", pid] = words[..] {
            if let (Ok(rank), Ok(pid)) = (rank.parse::<usize>(), pid.parse()) {
                if rank < ranks {
                    pids[rank] = Some(pid);
                }
            }
        }
    }
    pids
}

fn all_running(lines: &[Line], ranks: usize) -> bool {
    (0..ranks).all(|r| {
        lines
            .iter()
            .any(|l| rank_part(l) == format!("rank {r} running"))
    })
}

/// When `rank` reported its MPI error ("rank R: MPI error at <epoch s>: ...").
fn error_time(lines: &[Line], rank: usize) -> Option<SystemTime> {
    let prefix = format!("rank {rank}: MPI error at ");
    // Anywhere in a line (see `rank_part`): its text may name ranks too.
    let at = lines
        .iter()
        .find_map(|l| l.text.find(&prefix).map(|at| &l.text[at + prefix.len()..]))?;
    let seconds: f64 = at.split(':').next()?.parse().ok()?;
    Some(UNIX_EPOCH + Duration::from_secs_f64(seconds))
}

/// How rank 1 is killed.
#[derive(Clone, Copy, PartialEq)]
enum Kill {
    /// Wherever it is: possibly mid-transfer.
    Anywhere,
    /// At the start of a round, once it holds there (`kill_rank survive`
    /// and SIGUSR2), and once every other rank has sent it one more
    /// message (SIGURG), which the held rank cannot take: every other
    /// rank then has a send to it in flight. (A round's own send to it
    /// may have been taken before it held: a rank one round ahead of it
    /// has its send of the next round granted while it still finishes
    /// its round. Without the extra message, such a rank waited only in
    /// a receive, which nothing at the provider ties to the dead rank,
    /// about 1 run in 10 under load.)
    AtRoundStart,
}

/// Starts `kill_rank` as `job` says (3 ranks) and kills rank 1 with SIGKILL
/// once traffic flows. Returns the running job and when rank 1 was killed.
fn kill_rank_one(job: Job, kill: Kill) -> (RunningJob, Instant, SystemTime) {
    const RANKS: usize = 3;
    // The job's own limit stays above both waits (kill_rank itself stops
    // after 300 s if nobody kills a rank).
    let mut running = job.ranks(RANKS).timeout(3 * HANG_GUARD).spawn();
    running.wait_until("traffic between all ranks", HANG_GUARD, |lines| {
        all_running(lines, RANKS) && rank_pids(lines, RANKS).iter().all(Option::is_some)
    });
    let victim = rank_pids(&running.lines_so_far(), RANKS)[1].expect("waited for it");
    if kill == Kill::AtRoundStart {
        // SAFETY: as below; kill_rank survive catches SIGUSR2.
        assert_eq!(unsafe { libc::kill(victim, libc::SIGUSR2) }, 0);
        running.wait_until("rank 1 to hold", HANG_GUARD, |lines| {
            lines.iter().any(|l| rank_part(l) == "rank 1 holding")
        });
        let pids = rank_pids(&running.lines_so_far(), RANKS);
        for survivor in (0..RANKS).filter(|&r| r != 1) {
            let pid = pids[survivor].expect("waited for it");
            // SAFETY: as below; kill_rank survive-poke catches SIGURG.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGURG) }, 0);
        }
        running.wait_until("the others to send rank 1 one more", HANG_GUARD, |lines| {
            (0..RANKS).filter(|&r| r != 1).all(|r| {
                lines
                    .iter()
                    .any(|l| rank_part(l) == format!("rank {r} poked"))
            })
        });
    }
    // SAFETY: kill has no memory effects; the pid is rank 1 of this job,
    // which is still running (it only ends when killed).
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    (running, Instant::now(), SystemTime::now())
}

fn kill_rank() -> PathBuf {
    mpi::build(&mpi::source("kill_rank"), &out_dir(), &[])
}

#[test]
fn a_killed_rank_ends_the_job_and_leaves_nothing() {
    // Hydra, as users run it: it sees the dead rank and stops the others.
    let (running, killed, _) = kill_rank_one(Job::new(kill_rank()), Kill::Anywhere);
    let output = running.wait_timeout(HANG_GUARD);
    eprintln!(
        "the job ended {:?} after rank 1 was killed",
        killed.elapsed()
    );
    assert!(
        !output.success() && output.contains("Killed (signal 9)"),
        "the job does not report the killed rank\n{}",
        output.report()
    );
    let left = output.leftover_objects();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// With the launcher's signals ignored, nothing but the provider can end the
/// survivors' wait: each must get an MPI error and exit on its own.
/// `sizes`: kill_rank's optional LARGE and SMALL message sizes.
fn survivors_get_an_mpi_error(job: Job, sizes: &[&str], kill: Kill) {
    // Held at a round's start, the victim is sent one more message by the
    // others (SIGURG, `survive-poke`) before the kill.
    let mode = match kill {
        Kill::Anywhere => "survive",
        Kill::AtRoundStart => "survive-poke",
    };
    let job = job.helper_option("--gforker").arg(mode).args(sizes);
    let (mut running, _, killed) = kill_rank_one(job, kill);
    running.wait_until("an MPI error on each survivor", HANG_GUARD, |lines| {
        error_time(lines, 0).is_some() && error_time(lines, 2).is_some()
    });
    let lines = running.lines_so_far();
    for survivor in [0, 2] {
        let at = error_time(&lines, survivor).expect("waited for it");
        let after = at.duration_since(killed).unwrap_or_default();
        eprintln!("rank {survivor} had its MPI error {after:?} after rank 1 was killed");
    }
    // gforker's own exit status does not tell (it is 0 whatever the ranks did).
    let output = running.wait_timeout(HANG_GUARD);
    let left = output.leftover_objects();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

#[test]
fn survivors_of_a_killed_rank_get_an_mpi_error_native() {
    // Receives are directed at their source: those from the dead rank fail.
    survivors_get_an_mpi_error(Job::new(kill_rank()), &[], Kill::Anywhere);
}

#[test]
fn survivors_of_a_killed_rank_get_an_mpi_error_active_messages() {
    // MPICH's active-message receives accept any source: the provider
    // cannot tell that one waits for the dead rank. Its sends to it fail:
    // with 12 KiB messages and a 4 KiB eager size, a send to the dead rank
    // is a rendezvous that waits for its grant. Killed anywhere, the dead
    // rank may have granted a survivor's send of the round and died before
    // its own send to it left: that survivor then waits on a receive alone,
    // which nothing at the provider ties to the dead rank (1 run in 10).
    // Held at the start of a round, it grants nothing more, and each
    // survivor sends it one more message before the kill (Kill::AtRoundStart).
    // (12 KiB stays below MPICH's 16 KiB active-message eager size: MPICH
    // 5.0.2 in AM-only mode crashes on concurrent larger messages between
    // two ranks over any provider, shm and tcp alike.)
    let job = Job::new(kill_rank())
        .am(true)
        .env("FI_UNIMEM_EAGER_SIZE", "4096");
    survivors_get_an_mpi_error(job, &["12288", "12288"], Kill::AtRoundStart);
}

/// MPI loaded as Python loads extension modules: `dlopen(RTLD_LOCAL)`, so
/// that neither MPI nor its libfabric is in the global symbol scope. The
/// provider must find the core that loads it all the same.
fn rtld_local(am: bool) {
    // Fails (not skips) without MPICH, saying how to install it.
    mpi::mpich_bin("mpiexec");
    let venv = mpi::repo_root().join(".venv");
    let program = Build::new(mpi::source("dlopen_local"), out_dir())
        .compiler("cc")
        .flags([
            format!("-I{}", venv.join("include").display()),
            "-ldl".into(),
        ])
        .build();
    let libmpi = venv.join("lib/libmpi.so.12");
    let output = Job::new(program)
        .am(am)
        .env("FI_LOG_LEVEL", "info")
        .arg(&libmpi)
        .run();
    output.assert_success();
    assert!(
        output.contains("dlopen_local: PASS"),
        "no PASS line\n{}",
        output.report()
    );
    assert_unimem_carried(&output);
    let found = format!(
        "core found via object that called fi_prov_ini: {}",
        venv.join("lib/mpich/libfabric.so.1").display()
    );
    assert!(
        output.contains(&found),
        "the provider did not find MPICH's own libfabric as its core\n{}",
        output.report()
    );
}

#[test]
fn mpi_loaded_with_rtld_local_runs_over_unimem_native() {
    rtld_local(false);
}

#[test]
fn mpi_loaded_with_rtld_local_runs_over_unimem_active_messages() {
    rtld_local(true);
}

/// A host cut off from the others mid-job (its link to the bridge down):
/// a rank of the other host gets an MPI error within seconds (the network
/// backend hears nothing from the cut-off rank for `net_timeout_ms`, 10 s),
/// Hydra ends the job on it, and nothing is left in either host's
/// `/dev/shm` (the cut-off host's once its link is back).
///
/// MPICH finds the failed completion fatal: the rank prints "Abort(...)
/// ... No route to host" and sends Hydra a PMI abort, on which `mpiexec`
/// exits at once, dropping whatever rank output its proxies had not yet
/// forwarded (a job that ended 13.4 s after the cut with neither the
/// rank's own report nor MPICH's message in its output, about 1 run in
/// 8 under load). Hydra's `-errfile-pattern` files do not help: `mpiexec`
/// writes them (strace: the "Abort" text written by the rank, then by
/// `mpiexec` to the file, then `mpiexec`'s exit with the abort's code,
/// 143 here after truncation). So each rank writes its stderr to a file
/// itself (`KILL_RANK_STDERR`), before the abort, and the test reads
/// those as well.
#[test]
fn a_host_cut_off_mid_job_ends_it_within_seconds() {
    use unimem_tests::hosts;
    let _hosts = hosts::exclusive();
    hosts::ensure();
    const RANKS: usize = 3;
    let errors = out_dir().join(format!("host-cut-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&errors);
    std::fs::create_dir_all(&errors).expect("create the directory of the ranks' stderr");
    let job = Job::new(kill_rank())
        .helper_option("--hosts")
        .helper_option("uh1:2,uh2:1")
        .env("KILL_RANK_STDERR", &errors)
        .arg("survive");
    let mut running = job.ranks(RANKS).timeout(3 * HANG_GUARD).spawn();
    running.wait_until("traffic between all ranks", HANG_GUARD, |lines| {
        all_running(lines, RANKS) && rank_pids(lines, RANKS).iter().all(Option::is_some)
    });
    let link = hosts::cut_off("uh2");
    let cut = Instant::now();
    // A rank of uh1 returns its MPI error, or MPICH finds the failed
    // completion fatal (an error in its progress aborts the rank): either
    // way the job ends with an error.
    let mut noticed = None;
    while cut.elapsed() < Duration::from_secs(30) {
        let lines = running.lines_so_far();
        let errored = error_time(&lines, 0).is_some() || error_time(&lines, 1).is_some();
        if errored || running.has_ended() {
            noticed = Some(cut.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = running.lines_so_far();
    drop(link);
    let output = running.wait_timeout(HANG_GUARD);
    let after = noticed.unwrap_or_else(|| panic!("nothing within 30 s\n{}", output.report()));
    eprintln!("the job had its error {after:?} after uh2 was cut off");
    // The default timeout (10 s), a look at the peers, and room for a
    // loaded machine.
    assert!(after < Duration::from_secs(20), "{after:?}");
    // Each rank's own stderr (KILL_RANK_STDERR): MPICH's abort report is
    // there even when mpiexec exited before forwarding it.
    let stderr_files: String = std::fs::read_dir(&errors)
        .map(|dir| {
            dir.flatten()
                .map(|file| std::fs::read_to_string(file.path()).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&errors);
    assert!(
        !output.success()
            && (output.contains("MPI error at")
                || output.contains("No route to host")
                || stderr_files.contains("No route to host")),
        "{}\n--- the ranks' stderr files ---\n{stderr_files}",
        output.report()
    );
    let ours = |host: &str| -> Vec<String> {
        hosts::shm_objects(host)
            .into_iter()
            .filter(|name| name.starts_with("unimem-"))
            .collect()
    };
    let left = ours("uh1");
    assert!(left.is_empty(), "left in uh1's /dev/shm: {left:?}");
    // The cut-off rank outlives the job (its proxy could not reach it);
    // once it is gone, what it left is reclaimed like any dead process's.
    let victim = rank_pids(&lines, RANKS)[2].expect("waited for it");
    let until = Instant::now() + HANG_GUARD;
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(victim, 0) } == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let tool = mpi::target_dir().join("release/unimem-shm");
    hosts::run_in("uh2", &[tool.to_str().expect("UTF-8 path"), "reclaim"]);
    let left = ours("uh2");
    assert!(left.is_empty(), "left in uh2's /dev/shm: {left:?}");
}
