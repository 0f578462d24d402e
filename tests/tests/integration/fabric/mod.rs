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
mod rma;
mod traffic;
mod untrusted;
