//! unimem: a libfabric provider for the Unimem architecture, loaded by any
//! libfabric core as an external provider (`libunimem-fi.so`, entry point
//! `fi_prov_ini`, `FI_PROVIDER=unimem`).
//!
//! No link-time dependency on libfabric: types come from the headers at
//! build time (`ffi`), the few core functions we call are found at load time
//! (`core`). One module per libfabric object, as in prov/tcp and prov/util:
//!
//! | module    | role                                                        |
//! |-----------|-------------------------------------------------------------|
//! | `prov`    | `fi_prov_ini`, the provider struct, getinfo/fabric/cleanup  |
//! | `getinfo` | `fi_getinfo`: addresses, node check, C `fi_info` building   |
//! | `attr`    | the fi_info template and hint matching (pure Rust)          |
//! | `fabric`  | `fi_fabric` object                                          |
//! | `domain`  | `fi_domain` object                                          |
//! | `ep`      | RDM endpoints: binding, options, the msg and tagged data path |
//! | `eq`      | event queues (`fi_eq_open`), FI_WAIT_FD via eventfd         |
//! | `cq`      | completion queues: formats, errors in order, blocking reads |
//! | `cntr`    | completion counters                                         |
//! | `av`      | address vectors: FI_ADDR_STR ↔ table index                  |
//! | `mr`      | memory registration (local) and descriptors                 |
//! | `poll`    | poll sets (`fi_poll_open`): CQs and counters polled together |
//! | `wait`    | blocking reads under manual progress, accepted wait objects |
//! | `fid`     | shared object plumbing: identity, refcounts, ENOSYS stubs   |
//! | `config`  | tunables: table, fi_info.conf, FI_UNIMEM_* parameters       |
//! | `log`     | `tracing` → `fi_log`                                        |
//! | `core`    | core functions resolved with dlsym                          |
//! | `guard`   | `catch_unwind` around every `extern "C"` entry point        |
//! | `addr`    | endpoint address strings                                    |
//! | `progress`| manual progress: endpoints run by CQ/counter reads          |
//! | `shutdown`| removes our /dev/shm objects when the process exits         |
//! | `proto`   | the messaging protocol, plain Rust over the hardware traits |
//!

pub mod addr;
pub mod attr;
pub mod av;
pub mod cntr;
pub mod config;
pub mod core;
pub mod cq;
pub mod domain;
pub mod ep;
pub mod eq;
pub mod fabric;
pub mod ffi;
pub mod fid;
pub mod getinfo;
pub mod guard;
pub mod log;
pub mod mr;
pub mod poll;
pub mod progress;
pub mod proto;
pub mod prov;
mod shutdown;
pub mod wait;

pub use prov::fi_prov_ini;
