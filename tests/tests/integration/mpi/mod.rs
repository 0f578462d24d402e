//! MPI jobs over unimem, through `scripts/mpirun-unimem`
//! (`unimem_tests::mpi`).

mod faults;
mod suite;
