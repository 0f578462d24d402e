//! A job to run: which MPI, ranks, modes, variables, launcher arguments,
//! program, timeout; the lock that runs one job at a time.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::build::warn_if_provider_stale;
use super::output::{read_lines, Captured};
use super::procfs::mpich_shm_files;
use super::{mpirun_unimem, target_dir, Mpi, Output, RunningJob, Stream, DEFAULT_TIMEOUT};

/// Holds the lock that lets one MPI job of this test binary run at a time.
/// [`Job::run`] and [`Job::spawn`] take it themselves; a test that runs
/// other heavy work beside a job may take it too (it is not reentrant).
pub fn job_lock() -> MutexGuard<'static, ()> {
    static JOBS: Mutex<()> = Mutex::new(());
    JOBS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Variables the job helper sets from its options: taken out of the
/// inherited environment so that only the [`Job`]'s settings count.
pub(super) const MODE_VARIABLES: &[&str] = &[
    "MPIR_CVAR_CH4_OFI_ENABLE_TAGGED",
    "MPIR_CVAR_CH4_OFI_ENABLE_RMA",
    "MPIR_CVAR_DEBUG_SUMMARY",
    "I_MPI_DEBUG",
    "I_MPI_OFI_LIBRARY",
    "FI_UNIMEM_PROFILE",
    "FI_UNIMEM_JOB",
];

/// An MPI job to run through `scripts/mpirun-unimem`.
#[derive(Clone, Debug)]
pub struct Job {
    program: PathBuf,
    args: Vec<OsString>,
    mpi: Mpi,
    ranks: usize,
    am: bool,
    paper: bool,
    summary: bool,
    prove: bool,
    helper_options: Vec<OsString>,
    launcher_args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_remove: Vec<OsString>,
    timeout: Duration,
    unimem_job: Option<String>,
}

impl Job {
    /// `program` on 2 ranks of MPICH, native (tagged) mode, debug summary
    /// on, no proof, [`DEFAULT_TIMEOUT`].
    pub fn new(program: impl Into<PathBuf>) -> Job {
        Job {
            program: program.into(),
            args: Vec::new(),
            mpi: Mpi::Mpich,
            ranks: 2,
            am: false,
            paper: false,
            summary: true,
            prove: false,
            helper_options: Vec::new(),
            launcher_args: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            unimem_job: None,
        }
    }

    /// Which MPI launches the job (`--mpi`); the program must be built
    /// with its `mpicc` ([`Mpi::build`]).
    pub fn mpi(mut self, mpi: Mpi) -> Job {
        self.mpi = mpi;
        self
    }

    /// The job helper's proof that unimem carried the job (`--prove`): each
    /// endpoint logs what it carried at close ([`Output::proof`]), and the
    /// helper fails a job in which a rank did not send and receive.
    pub fn prove(mut self, prove: bool) -> Job {
        self.prove = prove;
        self
    }

    pub fn ranks(mut self, ranks: usize) -> Job {
        self.ranks = ranks;
        self
    }

    /// MPICH's active-message-only mode (`--am`) instead of native mode.
    pub fn am(mut self, am: bool) -> Job {
        self.am = am;
        self
    }

    /// The paper's modeled hardware (`--paper`).
    pub fn paper(mut self, paper: bool) -> Job {
        self.paper = paper;
        self
    }

    /// MPICH's debug summary (`--summary`), on by default: it names the
    /// provider ([`assert_unimem_carried`]). For Intel MPI, `I_MPI_DEBUG=5`
    /// (its libfabric's version and provider); nothing for Open MPI.
    pub fn summary(mut self, summary: bool) -> Job {
        self.summary = summary;
        self
    }

    /// Another option of the job helper, before `--` (e.g. `--gforker`).
    pub fn helper_option(mut self, option: impl AsRef<OsStr>) -> Job {
        self.helper_options.push(option.as_ref().to_owned());
        self
    }

    /// An argument for the launcher (`mpiexec`), after `--` and before the
    /// program (e.g. `-disable-auto-cleanup`).
    pub fn launcher_arg(mut self, arg: impl AsRef<OsStr>) -> Job {
        self.launcher_args.push(arg.as_ref().to_owned());
        self
    }

    /// An argument for the program.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Job {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Job
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// A variable for the job (the launcher passes the environment on to
    /// the ranks).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Job {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// A variable taken out of the inherited environment.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Job {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    /// The longest the job may run; it is killed then.
    pub fn timeout(mut self, timeout: Duration) -> Job {
        self.timeout = timeout;
        self
    }

    /// The unimem job name (`FI_UNIMEM_JOB`); by default each job gets a
    /// unique one, so that its shared-memory objects can be told apart.
    pub fn unimem_job(mut self, name: impl Into<String>) -> Job {
        self.unimem_job = Some(name.into());
        self
    }

    fn command(&self, unimem_job: &str) -> Command {
        let mut cmd = Command::new(mpirun_unimem());
        if self.mpi != Mpi::Mpich {
            cmd.arg("--mpi").arg(self.mpi.name());
        }
        cmd.arg("-n").arg(self.ranks.to_string());
        if self.prove {
            cmd.arg("--prove");
        }
        if self.am {
            cmd.arg("--am");
        }
        if self.paper {
            cmd.arg("--paper");
        }
        if self.summary {
            cmd.arg("--summary");
        }
        cmd.args(&self.helper_options)
            .arg("--")
            .args(&self.launcher_args)
            .arg(&self.program)
            .args(&self.args);
        for key in MODE_VARIABLES {
            cmd.env_remove(key);
        }
        for key in &self.env_remove {
            cmd.env_remove(key);
        }
        cmd.env("FI_UNIMEM_JOB", unimem_job);
        cmd.env("CARGO_TARGET_DIR", target_dir());
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        cmd
    }

    /// The command line, for messages.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.env {
            let _ = write!(s, "{}={} ", k.to_string_lossy(), v.to_string_lossy());
        }
        let _ = write!(s, "{}", mpirun_unimem().display());
        if self.mpi != Mpi::Mpich {
            let _ = write!(s, " --mpi {}", self.mpi.name());
        }
        let _ = write!(s, " -n {}", self.ranks);
        for (on, opt) in [
            (self.prove, "--prove"),
            (self.am, "--am"),
            (self.paper, "--paper"),
            (self.summary, "--summary"),
        ] {
            if on {
                s.push(' ');
                s.push_str(opt);
            }
        }
        for part in self
            .helper_options
            .iter()
            .chain([OsString::from("--")].iter())
            .chain(&self.launcher_args)
            .chain([self.program.clone().into_os_string()].iter())
            .chain(&self.args)
        {
            s.push(' ');
            s.push_str(&part.to_string_lossy());
        }
        s
    }

    /// Starts the job (after taking [`job_lock`]).
    pub fn spawn(&self) -> RunningJob {
        // Shared first: a test that is alone may wait for the job lock.
        let solo = crate::solo::shared();
        let guard = job_lock();
        warn_if_provider_stale();
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let unimem_job = self.unimem_job.clone().unwrap_or_else(|| {
            format!(
                "mpi-{}-{}",
                std::process::id(),
                SERIAL.fetch_add(1, Ordering::Relaxed)
            )
        });
        let mpich_files_before = mpich_shm_files();
        let mut child = self
            .command(&unimem_job)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", mpirun_unimem().display()));
        let capture = Arc::new(Mutex::new(Captured::default()));
        let (tx, lines) = mpsc::channel();
        let mut readers = Vec::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        for (stream, pipe) in [
            (Stream::Stdout, Box::new(stdout) as Box<dyn Read + Send>),
            (Stream::Stderr, Box::new(stderr)),
        ] {
            let capture = Arc::clone(&capture);
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                read_lines(pipe, stream, &capture, &tx)
            }));
        }
        RunningJob {
            describe: self.describe(),
            unimem_job,
            started: Instant::now(),
            deadline: Instant::now() + self.timeout,
            timeout: self.timeout,
            child: Some(child),
            known: HashMap::new(),
            last_track: None,
            capture,
            lines,
            readers,
            status: None,
            mpich_files_before,
            _guard: guard,
            _solo: solo,
        }
    }

    /// Runs the job to its end and returns what it did; a job still running
    /// at its timeout is killed and the test fails with its output.
    pub fn run(&self) -> Output {
        let job = self.spawn();
        let left = job.deadline.saturating_duration_since(Instant::now());
        job.wait_timeout(left)
    }
}
