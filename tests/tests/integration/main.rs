//! `integration`, the one test binary of the multi-process tests: a module
//! per concern, each module's `//!` comment says what it shows
//! (`docs/testing.md` is the map). A test's name is its module path, so a
//! filter picks a concern: `cargo test -p unimem-tests --test integration
//! -- fabric::rma::` runs the RMA tests, `-- layers::` the import-layer
//! checker (`scripts/check-layers`).
//!
//! Every test here shares one process, the machine, this user's
//! `/dev/shm` and the test hosts with the others (each file used to be a
//! process of its own, run alone), so what used to be per file is per
//! binary: MPI jobs run one at a time ([`unimem_tests::mpi::job_lock`]),
//! and the tests that need the machine to themselves (the test hosts', the
//! 5 GiB transfers, and those that watch a killed process's objects) hold
//! [`unimem_tests::solo::alone`], which holds off every other test's
//! processes.

mod emulation;
mod fabric;
mod heap;
mod layers;
mod man_page;
mod mpi;
mod shm_hardening;
mod sos;
