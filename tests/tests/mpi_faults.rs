//! MPI jobs over unimem when things go wrong or are unusual: a rank killed
//! with SIGKILL mid-job, and MPI loaded privately with `dlopen(RTLD_LOCAL)`.
//!
//! The jobs run MPICH (the PyPI wheel in `.venv/`, see `scripts/mpi-setup`)
//! through the project's job helper, `scripts/mpirun-unimem`, on the release
//! build of the provider.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use unimem_mailbox::shm::list_objects;

/// The longest a job may take to end after one of its ranks was killed.
const END_WITHIN: Duration = Duration::from_secs(15);

/// One MPI job at a time: the machine may have two cores only.
fn one_job_at_a_time() -> MutexGuard<'static, ()> {
    static JOBS: Mutex<()> = Mutex::new(());
    JOBS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository path")
}

fn venv_bin(name: &str) -> PathBuf {
    let path = repo().join(".venv/bin").join(name);
    assert!(
        path.exists(),
        "MPICH is not installed ({} missing): run scripts/mpi-setup",
        path.display()
    );
    path
}

/// Builds `tests/mpi/<name>.c` with `compiler` and `flags`; returns the program.
fn build(name: &str, compiler: &Path, flags: &[&str]) -> PathBuf {
    let source = repo().join("tests/mpi").join(format!("{name}.c"));
    let program = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let out = Command::new(compiler)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&program)
        .arg(&source)
        .args(flags)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "{name}.c does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    program
}

/// `scripts/mpirun-unimem` with `options`, then the program and its
/// arguments, in a process group of its own (so that it can be killed whole).
fn job(options: &[&str], program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(repo().join("scripts/mpirun-unimem"));
    cmd.args(options)
        .arg("--")
        .arg(program)
        .args(args)
        .env_remove("FI_PROVIDER")
        .env_remove("FI_LOG_LEVEL")
        .process_group(0);
    cmd
}

/// Kills the job's whole process group when dropped: no test leaves a job
/// behind, whatever fails.
struct RunningJob {
    child: Child,
    lines: mpsc::Receiver<String>,
    output: Vec<String>,
}

impl RunningJob {
    fn start(mut cmd: Command) -> RunningJob {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start scripts/mpirun-unimem");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        for stream in [
            Box::new(stdout) as Box<dyn std::io::Read + Send>,
            Box::new(stderr),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        RunningJob {
            child,
            lines,
            output: Vec::new(),
        }
    }

    /// Reads output until `done` says the lines so far are enough.
    fn wait_for(&mut self, what: &str, timeout: Duration, done: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(&self.output) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.output.push(line),
                Err(_) => panic!("no {what} within {timeout:?}; output:\n{}", self.text()),
            }
        }
    }

    /// Waits for the job to end; its exit status and how long it took.
    fn wait_end(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the job") {
                // The readers finish once the job's output is closed.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                    self.output.push(line);
                }
                return (status, start.elapsed());
            }
            if start.elapsed() > timeout {
                panic!(
                    "the job did not end within {timeout:?}; output:\n{}",
                    self.text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn text(&self) -> String {
        self.output.join("\n")
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill has no memory effects; the group is the job's own.
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// Pid of each rank, from the "rank R pid P" lines of `kill_rank`.
fn rank_pids(lines: &[String], ranks: usize) -> Vec<Option<i32>> {
    let mut pids = vec![None; ranks];
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
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

/// When `rank` reported its MPI error ("rank R: MPI error at <epoch s>: ...").
fn error_time(lines: &[String], rank: usize) -> Option<SystemTime> {
    let prefix = format!("rank {rank}: MPI error at ");
    let line = lines.iter().find(|l| l.starts_with(&prefix))?;
    let seconds: f64 = line[prefix.len()..].split(':').next()?.parse().ok()?;
    Some(UNIX_EPOCH + Duration::from_secs_f64(seconds))
}

fn running(lines: &[String], ranks: usize) -> bool {
    (0..ranks).all(|r| lines.iter().any(|l| *l == format!("rank {r} running")))
}

/// The shared objects of these processes still in /dev/shm.
fn objects_of(pids: &[i32]) -> Vec<String> {
    list_objects(None)
        .into_iter()
        .filter(|name| pids.iter().any(|pid| name.contains(&format!("-{pid}-"))))
        .collect()
}

/// Starts `kill_rank` on `ranks` ranks and kills rank 1 with SIGKILL once
/// traffic flows. Returns the running job, the pids of the ranks and when
/// rank 1 was killed.
fn kill_rank_one(
    options: &[&str],
    env: &[(&str, &str)],
    args: &[&str],
    ranks: usize,
) -> (RunningJob, Vec<i32>, SystemTime) {
    let program = build("kill_rank", &venv_bin("mpicc"), &[]);
    let ranks_arg = ranks.to_string();
    let mut all_options = vec!["-n", ranks_arg.as_str()];
    all_options.extend_from_slice(options);
    let mut cmd = job(&all_options, &program, args);
    cmd.envs(env.iter().copied());
    let mut job = RunningJob::start(cmd);
    job.wait_for(
        "traffic between all ranks",
        Duration::from_secs(60),
        |lines| running(lines, ranks) && rank_pids(lines, ranks).iter().all(Option::is_some),
    );
    let pids: Vec<i32> = rank_pids(&job.output, ranks)
        .into_iter()
        .flatten()
        .collect();
    // SAFETY: kill has no memory effects; the pid is rank 1 of our job.
    assert_eq!(unsafe { libc::kill(pids[1], libc::SIGKILL) }, 0);
    (job, pids, SystemTime::now())
}

#[test]
fn a_killed_rank_ends_the_job_within_seconds_and_leaves_nothing() {
    let _one = one_job_at_a_time();
    // Hydra, as users run it: it sees the dead rank and stops the others.
    let (mut job, pids, _) = kill_rank_one(&[], &[], &[], 3);
    let (status, took) = job.wait_end(END_WITHIN);
    eprintln!("the job ended {took:?} after rank 1 was killed");
    assert!(
        !status.success(),
        "the job succeeded although a rank was killed:\n{}",
        job.text()
    );
    assert!(
        job.text().contains("Killed (signal 9)"),
        "Hydra does not report the killed rank:\n{}",
        job.text()
    );
    let left = objects_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm after {took:?}: {left:?}");
}

/// With the launcher's signals ignored, nothing but the provider can end the
/// survivors' wait: each must get an MPI error and exit on its own.
fn survivors_get_an_mpi_error(options: &[&str], env: &[(&str, &str)], args: &[&str]) {
    let _one = one_job_at_a_time();
    let mut options = options.to_vec();
    options.push("--gforker");
    let mut args = args.to_vec();
    args.insert(0, "survive");
    let (mut job, pids, killed) = kill_rank_one(&options, env, &args, 3);
    job.wait_for("an MPI error on each survivor", END_WITHIN, |lines| {
        error_time(lines, 0).is_some() && error_time(lines, 2).is_some()
    });
    for survivor in [0, 2] {
        let at = error_time(&job.output, survivor).expect("waited for it");
        let after = at.duration_since(killed).unwrap_or_default();
        eprintln!("rank {survivor} had its MPI error {after:?} after rank 1 was killed");
        assert!(after < END_WITHIN, "rank {survivor} waited {after:?}");
    }
    // gforker's own exit status does not tell (it is 0 whatever the ranks did).
    let (_, took) = job.wait_end(END_WITHIN);
    eprintln!("the job ended {took:?} later");
    let left = objects_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

#[test]
fn survivors_of_a_killed_rank_get_an_mpi_error_native() {
    // Receives are directed at their source: those from the dead rank fail.
    survivors_get_an_mpi_error(&[], &[], &[]);
}

#[test]
fn survivors_of_a_killed_rank_get_an_mpi_error_active_messages() {
    // MPICH's active-message receives accept any source: the provider
    // cannot tell that one waits for the dead rank. Its sends to it fail:
    // with 12 KiB messages and a 4 KiB eager size, each survivor always has
    // a rendezvous send to the dead rank pending while it waits.
    // (12 KiB stays below MPICH's 16 KiB active-message eager size: MPICH
    // 5.0.2 in AM-only mode crashes on concurrent larger messages between
    // two ranks over any provider, shm and tcp alike.)
    survivors_get_an_mpi_error(
        &["--am"],
        &[("FI_UNIMEM_EAGER_SIZE", "4096")],
        &["12288", "12288"],
    );
}

/// MPI loaded as Python loads extension modules: `dlopen(RTLD_LOCAL)`, so
/// that neither MPI nor its libfabric is in the global symbol scope. The
/// provider must find the core that loads it all the same.
fn rtld_local(mode: &[&str]) {
    let _one = one_job_at_a_time();
    let include = format!("-I{}", repo().join(".venv/include").display());
    let program = build("dlopen_local", Path::new("cc"), &[include.as_str(), "-ldl"]);
    let libmpi = repo().join(".venv/lib/libmpi.so.12");
    assert!(libmpi.exists(), "{} missing", libmpi.display());
    let mut options = vec!["-n", "2", "--summary"];
    options.extend_from_slice(mode);
    let mut cmd = job(&options, &program, &[libmpi.to_str().expect("utf-8 path")]);
    cmd.env("FI_LOG_LEVEL", "info");
    let mut job = RunningJob::start(cmd);
    let (status, _) = job.wait_end(Duration::from_secs(120));
    let text = job.text();
    assert!(status.success(), "the job failed:\n{text}");
    assert!(text.contains("dlopen_local: PASS"), "no PASS line:\n{text}");
    assert!(
        job.output.iter().any(|l| l.starts_with("provider: unimem")),
        "MPICH's debug summary does not name unimem:\n{text}"
    );
    let mpich_core = repo().join(".venv/lib/mpich/libfabric.so.1");
    let found = format!(
        "core found via object that called fi_prov_ini: {}",
        mpich_core.display()
    );
    assert!(
        text.contains(&found),
        "the provider did not find MPICH's own libfabric as its core:\n{text}"
    );
}

#[test]
fn mpi_loaded_with_rtld_local_runs_over_unimem_native() {
    rtld_local(&[]);
}

#[test]
fn mpi_loaded_with_rtld_local_runs_over_unimem_active_messages() {
    rtld_local(&["--am"]);
}
