//! The provider through the real libfabric core, between separate
//! `fabric-peer` processes (`unimem_tests::cluster`).

mod agent;
mod atomic;
mod completion;
mod direct;
mod errors;
mod hosts;
mod huge;
mod invalidation;
mod matching;
mod messages;
mod posting;
mod rebuild;
mod rma;
mod traffic;
mod untrusted;

use unimem_tests::cluster::Cluster;

/// `fabric-peer` processes for test `test`, in a job of their own
/// ([`Cluster::new`]); each module adds its own settings.
pub(crate) fn cluster(test: &str) -> Cluster {
    Cluster::new(env!("CARGO_BIN_EXE_fabric-peer"), test)
}
