//! What unimem offers (the single `FI_EP_RDM` fi_info template) and how
//! hints are matched against it, following the semantics of libfabric's
//! prov/util attribute checks (subset rules for caps/op_flags/order, "our
//! required modes must be in theirs", ranked threading/progress/resource
//! models, MR-mode rules per API version).
//!
//! Everything here is plain Rust: C structs are converted at the boundary
//! ([`Hints::from_c`]; getinfo.rs writes the result back), so the rules are
//! unit tested without libfabric. By concern:
//! - `types`: the plain-Rust `fi_info` ([`Info`], [`Hints`], ...);
//! - `template`: what we offer ([`template`]) and libfabric's capability
//!   classes;
//! - `check`: matching hints against the template ([`check`]);
//! - `tailor`: the answer for accepted hints ([`tailor`]);
//! - `convert`: C structs ↔ the types.
//!
//! Decisions (each documented where it is applied):
//! - threading: every model is accepted and reported back exactly as asked
//!   (MPICH insists on FI_THREAD_DOMAIN); nothing asked → FI_THREAD_SAFE,
//!   like shm and tcp. Domains record the model so the data path can skip
//!   locking under FI_THREAD_DOMAIN.
//! - progress: manual only (no provider threads). AUTO in hints → no match;
//!   UNSPEC/MANUAL (and 2.x FI_PROGRESS_CONTROL_UNIFIED) → reported as asked.
//! - resource management: always FI_RM_ENABLED (we never drop: -FI_EAGAIN).
//! - av_type: TABLE and MAP are both accepted and reported as asked (like
//!   tcp's util AV: table indices are valid map addresses, and 2.x
//!   deprecates MAP in favour of TABLE semantics). Nothing asked →
//!   FI_AV_UNSPEC ("either"), as shm, tcp and rxm report; `fi_av_open`
//!   then picks TABLE. Reporting TABLE unasked would make fabtests assume
//!   the AV holds a single peer at index 0 (fi_rdm_multi_client's server
//!   answers each new client at fi_addr 0).
//! - mr_mode: messaging needs no registration, so nothing is required: we
//!   advertise only the legacy FI_MR_BASIC|FI_MR_SCALABLE bits (as shm/tcp
//!   do), which prov/util's rules turn into mr_mode 0 for API >= 1.5 and
//!   FI_MR_BASIC for older APIs. Any mode bits the app offers (fabtests:
//!   FI_MR_LOCAL|ENDPOINT|..., MPICH: VIRT_ADDR|ALLOCATED|PROV_KEY|ENDPOINT)
//!   are accepted; FI_MR_LOCAL is never required. Revisit with FI_RMA.
//! - op_flags: the supported sets below are accepted in hints and reported
//!   back as asked; without tx/rx hints we report no default flags (a default
//!   FI_INJECT would make every larger send fail). Sends take every
//!   completion level (inject, transmit, match, delivery) but
//!   FI_COMMIT_COMPLETE, which is about persistent memory: we have none.
//! - inject_size = eager_size: an inject is an eager send completed at copy
//!   time (the eager path copies into a dmable bounce buffer anyway).
//! - max_msg_size: every length (the wire carries 64-bit lengths; the
//!   tunable of that name can bound it).

mod check;
mod convert;
mod tailor;
mod template;
mod types;

pub use check::{check, Mismatch};
pub use tailor::tailor;
pub use template::*;
pub use types::*;

#[cfg(test)]
mod tests;
