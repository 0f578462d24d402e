//! Building C programs: compiled only when the source, the flags or the
//! compiler changed; a warning when the staged provider is older than its
//! sources.

use std::collections::hash_map::DefaultHasher;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use super::{mpicc, provider_library, repo_root, Mpi, DEFAULT_CFLAGS};

impl Mpi {
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
pub(super) fn newest_header_beside(source: &Path) -> SystemTime {
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

pub(super) fn mtime(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `name` as found on PATH when it has no directory part.
pub(super) fn resolve(program: &Path) -> PathBuf {
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
pub(super) fn warn_if_provider_stale() {
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

pub(super) fn rust_sources(dir: &Path) -> Vec<PathBuf> {
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
