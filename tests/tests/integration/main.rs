//! `integration`, the one test binary of the multi-process tests: a module
//! per concern, each module's `//!` comment says what it shows
//! (`docs/testing.md` is the map). A test's name is its module path, so a
//! filter picks a concern: `cargo test -p unimem-tests --test integration
//! -- fabric::rma::` runs the RMA tests, `-- layers::` the import-layer
//! checker (`scripts/check-layers`).
//!
//! Every test here shares one process and this user's `/dev/shm` with the
//! others, so what used to be per file is per binary: test hosts are used
//! by one test at a time ([`unimem_tests::hosts::exclusive`]), MPI jobs run
//! one at a time ([`unimem_tests::mpi::job_lock`]), and the tests that need
//! no other process to reclaim dead ones' objects hold
//! [`unimem_tests::reclaim::alone`].

mod emulation;
mod fabric;
mod heap;
mod layers;
mod man_page;
mod mpi;
mod shm_hardening;
mod sos;
