//! What a fabric and a domain share with the objects opened from them,
//! below those objects: a child (an EQ, a CQ, an endpoint...) holds its
//! parent's state through a [`ParentRef`](crate::base::fid::ParentRef) and
//! never imports the parent's module, so the arrows between the libfabric
//! objects point one way, from the parent that opens to the child opened.
//!
//! - `fabric`: the tunables snapshot of one `fi_fabric`;
//! - `domain`: the resolved attributes of one `fi_domain` and the
//!   resources its endpoints share (DMA engine, registration cache,
//!   progress);
//! - `memory`: the process's dmable region, which every domain's DMA uses;
//! - `progress`: the endpoints a CQ or counter read advances;
//! - `agent`: the progress agent, the thread that advances them while the
//!   application computes (`FI_PROGRESS_AUTO`, `async_progress`).

pub mod agent;
pub mod domain;
pub mod fabric;
pub mod memory;
pub mod progress;

pub use domain::DomainState;
pub use fabric::FabricState;
