//! unimem: a libfabric provider for the Unimem architecture, loaded by any
//! libfabric core as an external provider (`libunimem-fi.so`, entry point
//! `fi_prov_ini`, `FI_PROVIDER=unimem`).
//!
//! No link-time dependency on libfabric: types come from the headers at
//! build time (`base::ffi`, the crate `unimem-fi-sys`), the few core
//! functions we call are found at load time (`base::core`). The modules form layers, and every import
//! points down (`tests/tests/integration/layers.rs` keeps it so):
//!
//! | layer | modules | role |
//! |---|---|---|
//! | entry | `prov` | `fi_prov_ini` and the provider's getinfo/fabric/cleanup |
//! | objects | `fabric`, `domain`, `ep`, `poll`, `av`, `cq`, `cntr`, `mr`, `eq`, `wait` | one module per libfabric object; a parent opens its children |
//! | state | `state` | what a fabric or domain shares with its children |
//! | info | `info` | `fi_info` templates, hint matching, `fi_getinfo`, addresses |
//! | base | `base` | bindings, fid plumbing (`FidObject`), guard, logging, tunables, the stubs of unsupported calls |
//!
//! Below them, in crates of their own: the messaging protocol,
//! `unimem-proto` (`provider/proto`), plain Rust over the hardware traits,
//! which the endpoint drives; the network backend, `unimem-net` (`net/`),
//! a second implementation of those traits that reaches peers on other
//! hosts through another libfabric provider (`tcp`); and the libfabric
//! seam, `unimem-fi-sys` (`fi-sys/`): bindings, the core's functions,
//! the error type.

pub mod base;
pub mod info;
pub mod state;

pub mod av;
pub mod cntr;
pub mod cq;
pub mod domain;
pub mod ep;
pub mod eq;
pub mod fabric;
pub mod mr;
pub mod poll;
pub mod prov;
pub mod wait;

pub use prov::fi_prov_ini;
