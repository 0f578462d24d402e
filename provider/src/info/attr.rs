//! What unimem offers (the single `FI_EP_RDM` fi_info template) and how
//! hints are matched against it, following the semantics of libfabric's
//! prov/util attribute checks (subset rules for caps/op_flags/order, "our
//! required modes must be in theirs", ranked threading/progress/resource
//! models, MR-mode rules per API version).
//!
//! Everything here is plain Rust: C structs are converted at the boundary
//! ([`Hints::from_c`]; getinfo.rs writes the result back), so the rules are
//! unit tested without libfabric.
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
//!   FI_INJECT would make every larger send fail).
//! - inject_size = eager_size: an inject is an eager send completed at copy
//!   time (the eager path copies into a dmable bounce buffer anyway).
//! - max_msg_size 1 GiB (rendezvous is pipelined; fits a 32-bit length).

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_int;

use crate::base::config::Config;
use crate::base::core;
use crate::base::ffi::{self, *};
use crate::base::provider;

/// Capabilities of the RDM endpoint (primary and secondary).
pub const CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_DIRECTED_RECV
    | FI_SEND
    | FI_RECV
    | FI_LOCAL_COMM
    | FI_REMOTE_COMM;
pub const TX_CAPS: u64 = FI_MSG | FI_TAGGED | FI_SEND;
pub const RX_CAPS: u64 =
    FI_MSG | FI_TAGGED | FI_RECV | FI_MULTI_RECV | FI_SOURCE | FI_DIRECTED_RECV;
pub const DOMAIN_CAPS: u64 = FI_LOCAL_COMM | FI_REMOTE_COMM;

/// Operation flags accepted as defaults in hints.
pub const TX_OP_FLAGS: u64 =
    FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE;
pub const RX_OP_FLAGS: u64 = FI_COMPLETION | FI_MULTI_RECV;

pub const MSG_ORDER: u64 = FI_ORDER_SAS;
pub const MAX_MSG_SIZE: usize = 1 << 30;
pub const IOV_LIMIT: usize = 8;
/// Remote CQ data is a full 64-bit word.
pub const CQ_DATA_SIZE: usize = 8;
pub const MR_KEY_SIZE: usize = 8;
/// Objects per domain (each endpoint owns one emulated mailbox).
pub const MAX_OBJECTS: usize = 256;
pub const MR_CNT: usize = 1 << 16;
pub const PROTOCOL_VERSION: u32 = 1;
/// Legacy (API < 1.5) registration modes we can honour; see the module doc.
pub const MR_MODE: c_int = (FI_MR_BASIC | FI_MR_SCALABLE) as c_int;

// prov/util's capability classes (include/ofi.h), rebuilt from public bits.
const PRIMARY_TX_CAPS: u64 = FI_MSG
    | FI_RMA
    | FI_TAGGED
    | FI_ATOMIC
    | FI_MULTICAST
    | FI_READ
    | FI_WRITE
    | FI_SEND
    | FI_COLLECTIVE
    | FI_NAMED_RX_CTX
    | FI_HMEM;
const SECONDARY_TX_CAPS: u64 = FI_TRIGGER | FI_FENCE | FI_RMA_PMEM;
const PRIMARY_RX_CAPS: u64 = FI_MSG
    | FI_RMA
    | FI_TAGGED
    | FI_ATOMIC
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RECV
    | FI_DIRECTED_RECV
    | FI_VARIABLE_MSG
    | FI_COLLECTIVE
    | FI_HMEM;
const SECONDARY_RX_CAPS: u64 =
    FI_MULTI_RECV | FI_TRIGGER | FI_RMA_PMEM | FI_SOURCE | FI_RMA_EVENT | FI_SOURCE_ERR;
const PRIMARY_CAPS: u64 = PRIMARY_TX_CAPS | PRIMARY_RX_CAPS | FI_REMOTE_COMM | FI_LOCAL_COMM;
const SECONDARY_CAPS: u64 = SECONDARY_TX_CAPS | SECONDARY_RX_CAPS | FI_SHARED_AV;
const MSG_DIRECTION_CAPS: u64 = FI_SEND | FI_RECV;
/// Rx-only caps an application may leave in tx_attr (ignored there), and
/// the reverse.
const IGNORED_TX_CAPS: u64 = FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RECV
    | FI_DIRECTED_RECV
    | FI_VARIABLE_MSG
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_RMA_EVENT
    | FI_SOURCE_ERR;
const IGNORED_RX_CAPS: u64 =
    FI_READ | FI_WRITE | FI_SEND | FI_FENCE | FI_MULTICAST | FI_NAMED_RX_CTX;
/// MR modes that only matter to an RMA target.
const MR_MODE_RMA_TARGET: c_int =
    (FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_RMA_EVENT) as c_int;

const V1_5: u32 = ffi::fi_version(1, 5);
const V2_0: u32 = ffi::fi_version(2, 0);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpAttr {
    pub ep_type: fi_ep_type,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainAttr {
    pub name: Option<String>,
    pub threading: fi_threading,
    pub control_progress: fi_progress,
    pub data_progress: fi_progress,
    pub resource_mgmt: fi_resource_mgmt,
    pub av_type: fi_av_type,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricAttr {
    pub name: Option<String>,
    pub prov_name: Option<String>,
    pub prov_version: u32,
    pub api_version: u32,
}

/// A complete description (our template, or the result for one request).
/// Addresses are handled by getinfo.rs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub tx: TxAttr,
    pub rx: RxAttr,
    pub ep: EpAttr,
    pub domain: DomainAttr,
    pub fabric: FabricAttr,
}

/// An application's hints: zero / `None` means "unspecified".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addr: Option<Vec<u8>>,
    pub dest_addr: Option<Vec<u8>>,
    pub tx: Option<TxAttr>,
    pub rx: Option<RxAttr>,
    pub ep: Option<EpAttr>,
    pub domain: Option<DomainAttr>,
    pub fabric: Option<FabricAttr>,
}

/// Why hints cannot be met: the field and a human-readable reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub field: &'static str,
    pub why: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

type Check = Result<(), Mismatch>;

fn fail(field: &'static str, why: impl Into<String>) -> Check {
    Err(Mismatch {
        field,
        why: why.into(),
    })
}

/// `requested` must be within `offered` (bit masks).
fn subset(field: &'static str, requested: u64, offered: u64, kind: fi_type) -> Check {
    let extra = requested & !offered;
    if extra == 0 {
        Ok(())
    } else {
        fail(
            field,
            format!(
                "{} not supported (offered: {})",
                core::tostr(extra, kind),
                core::tostr(offered, kind)
            ),
        )
    }
}

/// `requested` must not exceed `offered` (0 = unspecified).
fn at_most(field: &'static str, requested: usize, offered: usize) -> Check {
    if requested > offered {
        fail(
            field,
            format!("{requested} requested, at most {offered} supported"),
        )
    } else {
        Ok(())
    }
}

/// The template for the current configuration.
pub fn template(cfg: &Config) -> Info {
    Info {
        caps: CAPS,
        mode: 0,
        addr_format: FI_ADDR_STR,
        tx: TxAttr {
            caps: TX_CAPS,
            mode: 0,
            op_flags: TX_OP_FLAGS,
            msg_order: MSG_ORDER,
            comp_order: FI_ORDER_NONE,
            inject_size: cfg.eager_size,
            size: cfg.tx_size,
            iov_limit: IOV_LIMIT,
            rma_iov_limit: 0,
            tclass: 0,
        },
        rx: RxAttr {
            caps: RX_CAPS,
            mode: 0,
            op_flags: RX_OP_FLAGS,
            msg_order: MSG_ORDER,
            comp_order: FI_ORDER_NONE,
            // Unexpected messages a peer can have in flight to us.
            total_buffered_recv: cfg.eager_size.saturating_mul(cfg.eager_credits),
            size: cfg.rx_size,
            iov_limit: IOV_LIMIT,
        },
        ep: EpAttr {
            ep_type: FI_EP_RDM,
            protocol: FI_PROTO_UNSPEC,
            protocol_version: PROTOCOL_VERSION,
            max_msg_size: MAX_MSG_SIZE,
            msg_prefix_size: 0,
            max_order_raw_size: 0,
            max_order_war_size: 0,
            max_order_waw_size: 0,
            mem_tag_format: FI_TAG_GENERIC,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            auth_key_size: 0,
        },
        domain: DomainAttr {
            name: Some(provider::NAME.to_owned()),
            threading: FI_THREAD_SAFE,
            control_progress: FI_PROGRESS_MANUAL,
            data_progress: FI_PROGRESS_MANUAL,
            resource_mgmt: FI_RM_ENABLED,
            av_type: FI_AV_UNSPEC,
            mr_mode: MR_MODE,
            mr_key_size: MR_KEY_SIZE,
            cq_data_size: CQ_DATA_SIZE,
            cq_cnt: MAX_OBJECTS,
            ep_cnt: MAX_OBJECTS,
            tx_ctx_cnt: MAX_OBJECTS,
            rx_ctx_cnt: MAX_OBJECTS,
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            max_ep_stx_ctx: 0,
            max_ep_srx_ctx: 0,
            cntr_cnt: MAX_OBJECTS,
            mr_iov_limit: IOV_LIMIT,
            caps: DOMAIN_CAPS,
            mode: 0,
            auth_key_size: 0,
            max_err_data: 0,
            mr_cnt: MR_CNT,
            tclass: 0,
        },
        fabric: FabricAttr {
            name: Some(provider::NAME.to_owned()),
            // Filled in by the core (prov_name must stay NULL for a core provider).
            prov_name: None,
            prov_version: 0,
            api_version: 0,
        },
    }
}

// ---------------------------------------------------------------------------
// Matching

/// Can `prov` (our template) satisfy `hints` for API `api`?
pub fn check(api: u32, prov: &Info, hints: &Hints) -> Check {
    // Endpoint type first: it rules out most foreign requests.
    if let Some(ep) = &hints.ep {
        check_ep_type(prov, ep)?;
    }
    subset("caps", hints.caps, prov.caps, FI_TYPE_CAPS)?;
    // Our required modes must be among the application's.
    if hints.mode & prov.mode != prov.mode {
        return fail(
            "mode",
            format!("{} required", core::tostr(prov.mode, FI_TYPE_MODE)),
        );
    }
    if hints.addr_format != FI_FORMAT_UNSPEC && hints.addr_format != prov.addr_format {
        return fail(
            "addr_format",
            format!(
                "{} requested, only FI_ADDR_STR supported",
                core::tostr32(hints.addr_format, FI_TYPE_ADDR_FORMAT)
            ),
        );
    }
    if let Some(f) = &hints.fabric {
        check_fabric(prov, f)?;
    }
    if let Some(d) = &hints.domain {
        check_domain(api, prov, hints, d)?;
    }
    if let Some(ep) = &hints.ep {
        check_ep(prov, hints, ep)?;
    }
    if let Some(rx) = &hints.rx {
        check_rx(prov, rx, hints.mode)?;
    }
    if let Some(tx) = &hints.tx {
        check_tx(prov, tx, hints.mode)?;
    }
    Ok(())
}

fn check_ep_type(prov: &Info, ep: &EpAttr) -> Check {
    if ep.ep_type != FI_EP_UNSPEC && ep.ep_type != prov.ep.ep_type {
        return fail(
            "ep_attr.type",
            format!(
                "{} requested, only FI_EP_RDM supported",
                core::tostr32(ep.ep_type, FI_TYPE_EP_TYPE)
            ),
        );
    }
    Ok(())
}

fn check_fabric(prov: &Info, f: &FabricAttr) -> Check {
    // prov_name has already been matched by the core.
    if let Some(name) = &f.name {
        if Some(name) != prov.fabric.name.as_ref() {
            return fail(
                "fabric_attr.name",
                format!("'{name}' requested, ours is '{}'", provider::NAME),
            );
        }
    }
    if f.prov_version > provider::PROVIDER_VERSION {
        return fail(
            "fabric_attr.prov_version",
            format!(
                "{:#x} requested, ours is {:#x}",
                f.prov_version,
                provider::PROVIDER_VERSION
            ),
        );
    }
    Ok(())
}

fn threading_known(t: fi_threading) -> bool {
    (FI_THREAD_UNSPEC..=FI_THREAD_ENDPOINT).contains(&t)
}

/// Progress models we can honour: manual (and unspecified); 2.x's
/// CONTROL_UNIFIED only from API 2.0 on (the value does not exist before).
fn progress_ok(api: u32, p: fi_progress) -> Result<(), String> {
    match p {
        FI_PROGRESS_UNSPEC | FI_PROGRESS_MANUAL => Ok(()),
        FI_PROGRESS_CONTROL_UNIFIED if !fi_version_lt(api, V2_0) => Ok(()),
        FI_PROGRESS_AUTO => Err(
            "FI_PROGRESS_AUTO requested; unimem progresses manually (no provider threads)".into(),
        ),
        other => Err(format!("unknown progress model {other}")),
    }
}

fn check_domain(api: u32, prov: &Info, hints: &Hints, d: &DomainAttr) -> Check {
    let p = &prov.domain;
    if let Some(name) = &d.name {
        if Some(name) != p.name.as_ref() {
            return fail(
                "domain_attr.name",
                format!("'{name}' requested, ours is '{}'", provider::NAME),
            );
        }
    }
    // We are thread safe, so every model is acceptable.
    if !threading_known(d.threading) {
        return fail(
            "domain_attr.threading",
            format!("unknown threading model {}", d.threading),
        );
    }
    progress_ok(api, d.control_progress)
        .or_else(|why| fail("domain_attr.control_progress", why))?;
    progress_ok(api, d.data_progress).or_else(|why| fail("domain_attr.data_progress", why))?;
    if d.resource_mgmt > FI_RM_ENABLED {
        return fail(
            "domain_attr.resource_mgmt",
            format!("unknown model {}", d.resource_mgmt),
        );
    }
    if !matches!(d.av_type, FI_AV_UNSPEC | FI_AV_MAP | FI_AV_TABLE) {
        return fail(
            "domain_attr.av_type",
            format!("unknown AV type {}", d.av_type),
        );
    }
    at_most("domain_attr.cq_data_size", d.cq_data_size, p.cq_data_size)?;
    check_mr_mode(api, p.mr_mode, hints, d.mr_mode)?;
    if d.auth_key_size != 0 {
        return fail(
            "domain_attr.auth_key",
            "authorization keys are not supported",
        );
    }
    // The following fields exist from API 1.5 on.
    if fi_version_lt(api, V1_5) {
        return Ok(());
    }
    at_most("domain_attr.cntr_cnt", d.cntr_cnt, p.cntr_cnt)?;
    at_most("domain_attr.mr_iov_limit", d.mr_iov_limit, p.mr_iov_limit)?;
    subset("domain_attr.caps", d.caps, p.caps, FI_TYPE_CAPS)?;
    if d.mode & p.mode != p.mode {
        return fail(
            "domain_attr.mode",
            format!("{} required", core::tostr(p.mode, FI_TYPE_MODE)),
        );
    }
    at_most("domain_attr.max_err_data", d.max_err_data, p.max_err_data)?;
    at_most("domain_attr.mr_cnt", d.mr_cnt, p.mr_cnt)?;
    Ok(())
}

fn rma_target_allowed(caps: u64) -> bool {
    if caps & (FI_RMA | FI_ATOMIC) == 0 {
        return false;
    }
    caps & (FI_REMOTE_READ | FI_REMOTE_WRITE) != 0 || caps & (FI_READ | FI_WRITE) == 0
}

/// Drop the MR-mode bits the requested capabilities make irrelevant.
fn cap_mr_mode(caps: u64, mut mode: c_int) -> c_int {
    if caps & FI_HMEM == 0 {
        mode &= !(FI_MR_HMEM as c_int);
    }
    if !rma_target_allowed(caps) {
        if mode & (FI_MR_LOCAL | FI_MR_HMEM) as c_int == 0 {
            return 0;
        }
        mode &= !MR_MODE_RMA_TARGET;
    }
    mode & !MR_MODE
}

fn check_mr_mode(api: u32, prov_mode: c_int, hints: &Hints, user_mode: c_int) -> Check {
    let basic = FI_MR_BASIC as c_int;
    let scalable = FI_MR_SCALABLE as c_int;
    let why = || {
        format!(
            "[{}] requested, provider mode [{}]",
            core::tostr32(user_mode as u32, FI_TYPE_MR_MODE),
            core::tostr32(prov_mode as u32, FI_TYPE_MR_MODE)
        )
    };
    if prov_mode & FI_MR_LOCAL as c_int != 0
        && hints.mode & FI_LOCAL_MR == 0
        && user_mode & FI_MR_LOCAL as c_int == 0
    {
        return fail("domain_attr.mr_mode", why());
    }
    let ok = if fi_version_lt(api, V1_5) {
        match user_mode {
            m if m == FI_MR_UNSPEC as c_int => prov_mode & (basic | scalable) != 0,
            m if m == basic => prov_mode & basic != 0,
            m if m == scalable => prov_mode & scalable != 0,
            _ => false,
        }
    } else if user_mode & basic != 0 {
        user_mode & !basic == 0 && prov_mode & basic != 0
    } else if user_mode & scalable != 0 {
        user_mode & !scalable == 0 && prov_mode & scalable != 0
    } else {
        let needed = cap_mr_mode(hints.caps, prov_mode);
        user_mode == FI_MR_UNSPEC as c_int || user_mode & needed == needed
    };
    if ok {
        Ok(())
    } else {
        fail("domain_attr.mr_mode", why())
    }
}

fn max_tag(format: u64) -> u64 {
    if format == 0 {
        0
    } else {
        u64::MAX >> format.leading_zeros()
    }
}

fn check_ep(prov: &Info, hints: &Hints, ep: &EpAttr) -> Check {
    let p = &prov.ep;
    if ep.protocol != FI_PROTO_UNSPEC && ep.protocol != p.protocol {
        return fail(
            "ep_attr.protocol",
            format!("protocol {} requested", ep.protocol),
        );
    }
    if ep.protocol_version > p.protocol_version {
        return fail(
            "ep_attr.protocol_version",
            format!(
                "{} requested, ours is {}",
                ep.protocol_version, p.protocol_version
            ),
        );
    }
    at_most("ep_attr.max_msg_size", ep.max_msg_size, p.max_msg_size)?;
    let shared = FI_SHARED_CONTEXT as usize;
    if ep.tx_ctx_cnt == shared {
        return fail(
            "ep_attr.tx_ctx_cnt",
            "shared transmit contexts are not supported",
        );
    }
    at_most(
        "ep_attr.tx_ctx_cnt",
        ep.tx_ctx_cnt,
        prov.domain.max_ep_tx_ctx,
    )?;
    if ep.rx_ctx_cnt == shared {
        return fail(
            "ep_attr.rx_ctx_cnt",
            "shared receive contexts are not supported",
        );
    }
    at_most(
        "ep_attr.rx_ctx_cnt",
        ep.rx_ctx_cnt,
        prov.domain.max_ep_rx_ctx,
    )?;
    if hints.caps & (FI_RMA | FI_ATOMIC) != 0 {
        at_most(
            "ep_attr.max_order_raw_size",
            ep.max_order_raw_size,
            p.max_order_raw_size,
        )?;
        at_most(
            "ep_attr.max_order_war_size",
            ep.max_order_war_size,
            p.max_order_war_size,
        )?;
        at_most(
            "ep_attr.max_order_waw_size",
            ep.max_order_waw_size,
            p.max_order_waw_size,
        )?;
    }
    if ep.auth_key_size != 0 && ep.auth_key_size != p.auth_key_size {
        return fail(
            "ep_attr.auth_key_size",
            "authorization keys are not supported",
        );
    }
    if hints.caps & FI_TAGGED != 0
        && ep.mem_tag_format != 0
        && max_tag(ep.mem_tag_format) > max_tag(p.mem_tag_format)
    {
        return fail(
            "ep_attr.mem_tag_format",
            format!("{:#x} is wider than 64 bits", ep.mem_tag_format),
        );
    }
    Ok(())
}

fn check_rx(prov: &Info, rx: &RxAttr, info_mode: u64) -> Check {
    let p = &prov.rx;
    subset(
        "rx_attr.caps",
        rx.caps & !IGNORED_RX_CAPS,
        p.caps,
        FI_TYPE_CAPS,
    )?;
    let mode = if rx.mode != 0 { rx.mode } else { info_mode };
    if mode & p.mode != p.mode {
        return fail(
            "rx_attr.mode",
            format!("{} required", core::tostr(p.mode, FI_TYPE_MODE)),
        );
    }
    subset(
        "rx_attr.op_flags",
        rx.op_flags,
        RX_OP_FLAGS,
        FI_TYPE_OP_FLAGS,
    )?;
    subset(
        "rx_attr.msg_order",
        rx.msg_order,
        p.msg_order,
        FI_TYPE_MSG_ORDER,
    )?;
    subset(
        "rx_attr.comp_order",
        rx.comp_order,
        p.comp_order,
        FI_TYPE_MSG_ORDER,
    )?;
    at_most(
        "rx_attr.total_buffered_recv",
        rx.total_buffered_recv,
        p.total_buffered_recv,
    )?;
    at_most("rx_attr.size", rx.size, p.size)?;
    at_most("rx_attr.iov_limit", rx.iov_limit, p.iov_limit)?;
    Ok(())
}

fn check_tx(prov: &Info, tx: &TxAttr, info_mode: u64) -> Check {
    let p = &prov.tx;
    subset(
        "tx_attr.caps",
        tx.caps & !IGNORED_TX_CAPS,
        p.caps,
        FI_TYPE_CAPS,
    )?;
    let mode = if tx.mode != 0 { tx.mode } else { info_mode };
    if mode & p.mode != p.mode {
        return fail(
            "tx_attr.mode",
            format!("{} required", core::tostr(p.mode, FI_TYPE_MODE)),
        );
    }
    subset(
        "tx_attr.op_flags",
        tx.op_flags,
        TX_OP_FLAGS,
        FI_TYPE_OP_FLAGS,
    )?;
    subset(
        "tx_attr.msg_order",
        tx.msg_order,
        p.msg_order,
        FI_TYPE_MSG_ORDER,
    )?;
    subset(
        "tx_attr.comp_order",
        tx.comp_order,
        p.comp_order,
        FI_TYPE_MSG_ORDER,
    )?;
    at_most("tx_attr.inject_size", tx.inject_size, p.inject_size)?;
    at_most("tx_attr.size", tx.size, p.size)?;
    at_most("tx_attr.iov_limit", tx.iov_limit, p.iov_limit)?;
    at_most("tx_attr.rma_iov_limit", tx.rma_iov_limit, p.rma_iov_limit)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Tailoring the answer to the hints (after a successful check)

/// Secondary caps reported even to hints that did not ask for them.
/// FI_SOURCE is left out: it costs an address lookup per completion, and
/// fi_getinfo(3) lets a provider report unrequested secondary caps only
/// where they cost nothing.
const UNASKED_SECONDARY_CAPS: u64 = SECONDARY_CAPS & !FI_SOURCE;

/// prov/util's capability selection: the primary caps asked for (all of
/// ours if none), plus secondary caps (FI_SOURCE only if asked for), plus
/// the direction caps.
fn select_caps(info_caps: u64, hint_caps: u64, attr_caps: u64) -> u64 {
    let mut caps = if hint_caps == 0 {
        info_caps & attr_caps & (PRIMARY_CAPS | SECONDARY_CAPS)
    } else {
        (hint_caps & PRIMARY_CAPS)
            | (hint_caps & attr_caps & SECONDARY_CAPS)
            | (attr_caps & UNASKED_SECONDARY_CAPS)
    };
    if caps & (FI_MSG | FI_TAGGED) != 0 && caps & MSG_DIRECTION_CAPS == 0 {
        caps |= attr_caps & MSG_DIRECTION_CAPS;
    }
    caps
}

/// The description returned for `hints` (which `check` accepted).
pub fn tailor(api: u32, prov: &Info, hints: Option<&Hints>) -> Info {
    let mut info = prov.clone();
    let Some(h) = hints else {
        // No hints: everything we have, no default op flags.
        info.tx.op_flags = 0;
        info.rx.op_flags = 0;
        tailor_mr_mode(api, &mut info.domain, None, info.caps);
        return info;
    };
    info.caps = select_caps(prov.caps, h.caps, prov.caps);

    let d = &mut info.domain;
    tailor_mr_mode(api, d, h.domain.as_ref(), info.caps);
    let hd = h.domain.as_ref();
    d.caps = select_caps(info.caps, hd.map_or(0, |x| x.caps), prov.domain.caps);
    if let Some(hd) = hd {
        // Reported exactly as asked (MPICH checks FI_THREAD_DOMAIN).
        if hd.threading != FI_THREAD_UNSPEC {
            d.threading = hd.threading;
        }
        if hd.control_progress != FI_PROGRESS_UNSPEC {
            d.control_progress = hd.control_progress;
        }
        if hd.data_progress != FI_PROGRESS_UNSPEC {
            d.data_progress = hd.data_progress;
        }
        if hd.av_type != FI_AV_UNSPEC {
            d.av_type = hd.av_type;
        }
    }

    if let Some(he) = &h.ep {
        if info.caps & (FI_RMA | FI_ATOMIC) != 0 {
            for (ours, theirs) in [
                (&mut info.ep.max_order_raw_size, he.max_order_raw_size),
                (&mut info.ep.max_order_war_size, he.max_order_war_size),
                (&mut info.ep.max_order_waw_size, he.max_order_waw_size),
            ] {
                if theirs != 0 {
                    *ours = theirs;
                }
            }
        }
        if he.tx_ctx_cnt != 0 {
            info.ep.tx_ctx_cnt = he.tx_ctx_cnt;
        }
        if he.rx_ctx_cnt != 0 {
            info.ep.rx_ctx_cnt = he.rx_ctx_cnt;
        }
    }

    let hr = h.rx.as_ref();
    info.rx.caps = select_caps(info.caps, hr.map_or(0, |x| x.caps), prov.rx.caps);
    info.rx.op_flags = hr.map_or(0, |x| x.op_flags);
    if let Some(hr) = hr {
        for (ours, theirs) in [
            (&mut info.rx.total_buffered_recv, hr.total_buffered_recv),
            (&mut info.rx.size, hr.size),
            (&mut info.rx.iov_limit, hr.iov_limit),
        ] {
            if theirs != 0 {
                *ours = theirs;
            }
        }
    }

    let ht = h.tx.as_ref();
    info.tx.caps = select_caps(info.caps, ht.map_or(0, |x| x.caps), prov.tx.caps);
    info.tx.op_flags = ht.map_or(0, |x| x.op_flags);
    if let Some(ht) = ht {
        for (ours, theirs) in [
            (&mut info.tx.inject_size, ht.inject_size),
            (&mut info.tx.size, ht.size),
            (&mut info.tx.iov_limit, ht.iov_limit),
            (&mut info.tx.rma_iov_limit, ht.rma_iov_limit),
        ] {
            if theirs != 0 {
                *ours = theirs;
            }
        }
    }
    info
}

/// prov/util's MR-mode reporting rules (see the module doc).
fn tailor_mr_mode(api: u32, d: &mut DomainAttr, hints: Option<&DomainAttr>, info_caps: u64) {
    let legacy = MR_MODE;
    let hint_mode = hints.map_or(0, |h| h.mr_mode);
    if hint_mode & legacy != 0 {
        d.mr_mode = hint_mode;
    } else if fi_version_lt(api, V1_5) {
        d.mr_mode = if d.mr_mode != 0 && d.mr_mode != FI_MR_SCALABLE as c_int {
            FI_MR_BASIC as c_int
        } else {
            FI_MR_SCALABLE as c_int
        };
    } else {
        d.mr_mode &= !legacy;
        if hints.is_some() && hint_mode & d.mr_mode != d.mr_mode {
            d.mr_mode = cap_mr_mode(info_caps, d.mr_mode & hint_mode);
        }
    }
}

// ---------------------------------------------------------------------------
// C → Rust

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
unsafe fn c_string(p: *const std::os::raw::c_char) -> Option<String> {
    // SAFETY: guaranteed by the caller.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// # Safety
/// `p` must be NULL or valid for `len` bytes.
unsafe fn c_bytes(p: *const std::ffi::c_void, len: usize) -> Option<Vec<u8>> {
    // SAFETY: guaranteed by the caller.
    (!p.is_null() && len > 0)
        .then(|| unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec())
}

impl TxAttr {
    pub fn from_c(a: &fi_tx_attr) -> Self {
        TxAttr {
            caps: a.caps,
            mode: a.mode,
            op_flags: a.op_flags,
            msg_order: a.msg_order,
            comp_order: a.comp_order,
            inject_size: a.inject_size,
            size: a.size,
            iov_limit: a.iov_limit,
            rma_iov_limit: a.rma_iov_limit,
            tclass: a.tclass,
        }
    }

    pub fn to_c(&self, a: &mut fi_tx_attr) {
        a.caps = self.caps;
        a.mode = self.mode;
        a.op_flags = self.op_flags;
        a.msg_order = self.msg_order;
        a.comp_order = self.comp_order;
        a.inject_size = self.inject_size;
        a.size = self.size;
        a.iov_limit = self.iov_limit;
        a.rma_iov_limit = self.rma_iov_limit;
        a.tclass = self.tclass;
    }
}

impl RxAttr {
    pub fn from_c(a: &fi_rx_attr) -> Self {
        RxAttr {
            caps: a.caps,
            mode: a.mode,
            op_flags: a.op_flags,
            msg_order: a.msg_order,
            comp_order: a.comp_order,
            total_buffered_recv: a.total_buffered_recv,
            size: a.size,
            iov_limit: a.iov_limit,
        }
    }

    pub fn to_c(&self, a: &mut fi_rx_attr) {
        a.caps = self.caps;
        a.mode = self.mode;
        a.op_flags = self.op_flags;
        a.msg_order = self.msg_order;
        a.comp_order = self.comp_order;
        a.total_buffered_recv = self.total_buffered_recv;
        a.size = self.size;
        a.iov_limit = self.iov_limit;
    }
}

impl EpAttr {
    pub fn from_c(a: &fi_ep_attr) -> Self {
        EpAttr {
            ep_type: a.type_,
            protocol: a.protocol,
            protocol_version: a.protocol_version,
            max_msg_size: a.max_msg_size,
            msg_prefix_size: a.msg_prefix_size,
            max_order_raw_size: a.max_order_raw_size,
            max_order_war_size: a.max_order_war_size,
            max_order_waw_size: a.max_order_waw_size,
            mem_tag_format: a.mem_tag_format,
            tx_ctx_cnt: a.tx_ctx_cnt,
            rx_ctx_cnt: a.rx_ctx_cnt,
            auth_key_size: a.auth_key_size,
        }
    }

    /// Leaves `auth_key` alone (we never hand out keys).
    pub fn to_c(&self, a: &mut fi_ep_attr) {
        a.type_ = self.ep_type;
        a.protocol = self.protocol;
        a.protocol_version = self.protocol_version;
        a.max_msg_size = self.max_msg_size;
        a.msg_prefix_size = self.msg_prefix_size;
        a.max_order_raw_size = self.max_order_raw_size;
        a.max_order_war_size = self.max_order_war_size;
        a.max_order_waw_size = self.max_order_waw_size;
        a.mem_tag_format = self.mem_tag_format;
        a.tx_ctx_cnt = self.tx_ctx_cnt;
        a.rx_ctx_cnt = self.rx_ctx_cnt;
        a.auth_key_size = self.auth_key_size;
    }
}

impl DomainAttr {
    /// # Safety
    /// `a.name` must be NULL or a NUL-terminated string.
    pub unsafe fn from_c(a: &fi_domain_attr) -> Self {
        DomainAttr {
            // SAFETY: guaranteed by the caller.
            name: unsafe { c_string(a.name) },
            threading: a.threading,
            control_progress: a.control_progress,
            data_progress: a.data_progress,
            resource_mgmt: a.resource_mgmt,
            av_type: a.av_type,
            mr_mode: a.mr_mode,
            mr_key_size: a.mr_key_size,
            cq_data_size: a.cq_data_size,
            cq_cnt: a.cq_cnt,
            ep_cnt: a.ep_cnt,
            tx_ctx_cnt: a.tx_ctx_cnt,
            rx_ctx_cnt: a.rx_ctx_cnt,
            max_ep_tx_ctx: a.max_ep_tx_ctx,
            max_ep_rx_ctx: a.max_ep_rx_ctx,
            max_ep_stx_ctx: a.max_ep_stx_ctx,
            max_ep_srx_ctx: a.max_ep_srx_ctx,
            cntr_cnt: a.cntr_cnt,
            mr_iov_limit: a.mr_iov_limit,
            caps: a.caps,
            mode: a.mode,
            auth_key_size: a.auth_key_size,
            max_err_data: a.max_err_data,
            mr_cnt: a.mr_cnt,
            tclass: a.tclass,
        }
    }

    /// Everything but `name` (allocated by the caller), `domain` and `auth_key`.
    pub fn to_c(&self, a: &mut fi_domain_attr) {
        a.threading = self.threading;
        a.control_progress = self.control_progress;
        a.data_progress = self.data_progress;
        a.resource_mgmt = self.resource_mgmt;
        a.av_type = self.av_type;
        a.mr_mode = self.mr_mode;
        a.mr_key_size = self.mr_key_size;
        a.cq_data_size = self.cq_data_size;
        a.cq_cnt = self.cq_cnt;
        a.ep_cnt = self.ep_cnt;
        a.tx_ctx_cnt = self.tx_ctx_cnt;
        a.rx_ctx_cnt = self.rx_ctx_cnt;
        a.max_ep_tx_ctx = self.max_ep_tx_ctx;
        a.max_ep_rx_ctx = self.max_ep_rx_ctx;
        a.max_ep_stx_ctx = self.max_ep_stx_ctx;
        a.max_ep_srx_ctx = self.max_ep_srx_ctx;
        a.cntr_cnt = self.cntr_cnt;
        a.mr_iov_limit = self.mr_iov_limit;
        a.caps = self.caps;
        a.mode = self.mode;
        a.auth_key_size = self.auth_key_size;
        a.max_err_data = self.max_err_data;
        a.mr_cnt = self.mr_cnt;
        a.tclass = self.tclass;
    }
}

impl FabricAttr {
    /// # Safety
    /// `a.name` and `a.prov_name` must be NULL or NUL-terminated strings.
    pub unsafe fn from_c(a: &fi_fabric_attr) -> Self {
        FabricAttr {
            // SAFETY: guaranteed by the caller.
            name: unsafe { c_string(a.name) },
            // SAFETY: guaranteed by the caller.
            prov_name: unsafe { c_string(a.prov_name) },
            prov_version: a.prov_version,
            api_version: a.api_version,
        }
    }
}

impl Hints {
    /// Copy an application's `fi_info` (hints, or the info given to
    /// `fi_domain`). Only the 1.17 fields are read: a 2.x application's
    /// structs are larger, never smaller.
    ///
    /// # Safety
    /// `info` and every non-NULL pointer in it must be valid as libfabric
    /// defines them (strings NUL-terminated, addresses `*_addrlen` bytes).
    pub unsafe fn from_c(info: &fi_info) -> Self {
        // SAFETY: every deref below is of a pointer the caller guarantees valid.
        unsafe {
            Hints {
                caps: info.caps,
                mode: info.mode,
                addr_format: info.addr_format,
                src_addr: c_bytes(info.src_addr, info.src_addrlen),
                dest_addr: c_bytes(info.dest_addr, info.dest_addrlen),
                tx: info.tx_attr.as_ref().map(TxAttr::from_c),
                rx: info.rx_attr.as_ref().map(RxAttr::from_c),
                ep: info.ep_attr.as_ref().map(EpAttr::from_c),
                domain: info.domain_attr.as_ref().map(|d| DomainAttr::from_c(d)),
                fabric: info.fabric_attr.as_ref().map(|f| FabricAttr::from_c(f)),
            }
        }
    }

    /// Whether the application named us explicitly (then a mismatch is
    /// worth a warning rather than an info line).
    pub fn names_us(&self) -> bool {
        self.fabric
            .as_ref()
            .and_then(|f| f.prov_name.as_deref())
            .is_some_and(|n| n.split(';').any(|p| p.eq_ignore_ascii_case(provider::NAME)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: u32 = ffi::fi_version(1, 17);

    fn ours() -> Info {
        template(&Config::defaults())
    }

    /// Hints built the way applications do: C structs from zeroed memory.
    fn c_hints(
        edit: impl FnOnce(
            &mut fi_info,
            &mut fi_tx_attr,
            &mut fi_rx_attr,
            &mut fi_ep_attr,
            &mut fi_domain_attr,
            &mut fi_fabric_attr,
        ),
    ) -> Hints {
        let mut info = fi_info::default();
        let mut tx = fi_tx_attr::default();
        let mut rx = fi_rx_attr::default();
        let mut ep = fi_ep_attr::default();
        let mut dom = fi_domain_attr::default();
        let mut fab = fi_fabric_attr::default();
        edit(&mut info, &mut tx, &mut rx, &mut ep, &mut dom, &mut fab);
        info.tx_attr = &mut tx;
        info.rx_attr = &mut rx;
        info.ep_attr = &mut ep;
        info.domain_attr = &mut dom;
        info.fabric_attr = &mut fab;
        // SAFETY: all pointers refer to live locals; `edit` sets only static C-string literals.
        unsafe { Hints::from_c(&info) }
    }

    fn no_edit(
        _: &mut fi_info,
        _: &mut fi_tx_attr,
        _: &mut fi_rx_attr,
        _: &mut fi_ep_attr,
        _: &mut fi_domain_attr,
        _: &mut fi_fabric_attr,
    ) {
    }

    fn field_of(r: Check) -> &'static str {
        r.expect_err("expected a mismatch").field
    }

    #[test]
    fn empty_hints_match() {
        let h = c_hints(no_edit);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(check(API, &ours(), &Hints::default()), Ok(()));
    }

    #[test]
    fn no_hints_report_everything() {
        let i = tailor(API, &ours(), None);
        assert_eq!(i.caps, CAPS);
        assert_eq!(i.tx.caps, TX_CAPS);
        assert_eq!(i.rx.caps, RX_CAPS);
        assert_eq!(i.domain.threading, FI_THREAD_SAFE);
        assert_eq!(i.domain.mr_mode, 0);
        assert_eq!(i.mode, 0);
        assert_eq!(i.tx.op_flags, 0);
        assert_eq!(i.ep.ep_type, FI_EP_RDM);
        assert_eq!(i.addr_format, FI_ADDR_STR);
        assert!(i.ep.max_msg_size >= 1 << 30);
        assert_eq!(i.tx.inject_size, Config::defaults().eager_size);
        assert_eq!(i.fabric.prov_name, None);
    }

    #[test]
    fn ep_type() {
        let msg = c_hints(|_, _, _, ep, _, _| ep.type_ = FI_EP_MSG);
        assert_eq!(field_of(check(API, &ours(), &msg)), "ep_attr.type");
        let dgram = c_hints(|_, _, _, ep, _, _| ep.type_ = FI_EP_DGRAM);
        assert_eq!(field_of(check(API, &ours(), &dgram)), "ep_attr.type");
        let rdm = c_hints(|_, _, _, ep, _, _| ep.type_ = FI_EP_RDM);
        assert_eq!(check(API, &ours(), &rdm), Ok(()));
    }

    #[test]
    fn caps_subset() {
        let rma = c_hints(|i, _, _, _, _, _| i.caps = FI_MSG | FI_RMA);
        assert_eq!(field_of(check(API, &ours(), &rma)), "caps");
        let atomic = c_hints(|i, _, _, _, _, _| i.caps = FI_ATOMIC);
        assert_eq!(field_of(check(API, &ours(), &atomic)), "caps");
        // MPICH's minimum.
        let am = c_hints(|i, _, _, _, _, _| i.caps = FI_MSG | FI_MULTI_RECV);
        assert_eq!(check(API, &ours(), &am), Ok(()));
    }

    #[test]
    fn hinted_caps_are_reported_without_extra_primaries() {
        let h = c_hints(|i, _, _, _, _, _| i.caps = FI_MSG);
        let i = tailor(API, &ours(), Some(&h));
        assert_eq!(
            i.caps & (FI_TAGGED | FI_DIRECTED_RECV | FI_LOCAL_COMM | FI_REMOTE_COMM),
            0
        );
        assert_eq!(
            i.caps & (FI_MSG | FI_SEND | FI_RECV),
            FI_MSG | FI_SEND | FI_RECV
        );
        // Secondary caps come along, but FI_SOURCE (a lookup per
        // completion) only when asked for.
        assert_ne!(i.caps & FI_MULTI_RECV, 0);
        assert_eq!(i.caps & FI_SOURCE, 0);
        assert_eq!(i.rx.caps & FI_SOURCE, 0);
        assert_eq!(i.tx.caps, FI_MSG | FI_SEND);
        assert_eq!(i.rx.caps & FI_TAGGED, 0);
        assert_eq!(i.rx.caps & !i.caps, 0);
        let h = c_hints(|i, _, _, _, _, _| i.caps = FI_MSG | FI_SOURCE);
        let i = tailor(API, &ours(), Some(&h));
        assert_ne!(i.caps & FI_SOURCE, 0);
        assert_ne!(i.rx.caps & FI_SOURCE, 0);
        let i = tailor(API, &ours(), None);
        assert_ne!(i.caps & FI_SOURCE, 0);
    }

    #[test]
    fn modes_are_never_required() {
        let h = c_hints(|i, _, _, _, _, _| i.mode = 0);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let h = c_hints(|i, _, _, _, _, _| i.mode = FI_CONTEXT | FI_CONTEXT2);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(tailor(API, &ours(), Some(&h)).mode, 0);
    }

    #[test]
    fn addr_format() {
        let h = c_hints(|i, _, _, _, _, _| i.addr_format = FI_SOCKADDR_IN);
        assert_eq!(field_of(check(API, &ours(), &h)), "addr_format");
        let h = c_hints(|i, _, _, _, _, _| i.addr_format = FI_ADDR_STR);
        assert_eq!(check(API, &ours(), &h), Ok(()));
    }

    #[test]
    fn names() {
        let h = c_hints(|_, _, _, _, d, _| d.name = c"invalid_domain".as_ptr() as *mut _);
        assert_eq!(field_of(check(API, &ours(), &h)), "domain_attr.name");
        let h = c_hints(|_, _, _, _, _, f| f.name = c"tcp".as_ptr() as *mut _);
        assert_eq!(field_of(check(API, &ours(), &h)), "fabric_attr.name");
        let h = c_hints(|_, _, _, _, d, f| {
            d.name = c"unimem".as_ptr() as *mut _;
            f.name = c"unimem".as_ptr() as *mut _;
            f.prov_name = c"unimem".as_ptr() as *mut _;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert!(h.names_us());
        let h = c_hints(|_, _, _, _, _, f| f.prov_version = provider::PROVIDER_VERSION + 1);
        assert_eq!(
            field_of(check(API, &ours(), &h)),
            "fabric_attr.prov_version"
        );
    }

    #[test]
    fn threading_reported_as_asked() {
        for t in [
            FI_THREAD_SAFE,
            FI_THREAD_FID,
            FI_THREAD_DOMAIN,
            FI_THREAD_COMPLETION,
            FI_THREAD_ENDPOINT,
        ] {
            let h = c_hints(|_, _, _, _, d, _| d.threading = t);
            assert_eq!(check(API, &ours(), &h), Ok(()));
            assert_eq!(tailor(API, &ours(), Some(&h)).domain.threading, t);
        }
        let h = c_hints(no_edit);
        assert_eq!(
            tailor(API, &ours(), Some(&h)).domain.threading,
            FI_THREAD_SAFE
        );
        let h = c_hints(|_, _, _, _, d, _| d.threading = 42);
        assert_eq!(field_of(check(API, &ours(), &h)), "domain_attr.threading");
    }

    #[test]
    fn progress() {
        let h = c_hints(|_, _, _, _, d, _| d.data_progress = FI_PROGRESS_AUTO);
        assert_eq!(
            field_of(check(API, &ours(), &h)),
            "domain_attr.data_progress"
        );
        let h = c_hints(|_, _, _, _, d, _| d.control_progress = FI_PROGRESS_AUTO);
        assert_eq!(
            field_of(check(API, &ours(), &h)),
            "domain_attr.control_progress"
        );
        let h = c_hints(|_, _, _, _, d, _| {
            d.control_progress = FI_PROGRESS_MANUAL;
            d.data_progress = FI_PROGRESS_MANUAL;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let i = tailor(API, &ours(), Some(&h));
        assert_eq!(
            (i.domain.control_progress, i.domain.data_progress),
            (FI_PROGRESS_MANUAL, FI_PROGRESS_MANUAL)
        );
        // 2.x's unified control progress: only understood from API 2.0 on.
        let h = c_hints(|_, _, _, _, d, _| d.control_progress = FI_PROGRESS_CONTROL_UNIFIED);
        assert_eq!(
            field_of(check(API, &ours(), &h)),
            "domain_attr.control_progress"
        );
        let v2 = ffi::fi_version(2, 0);
        assert_eq!(check(v2, &ours(), &h), Ok(()));
        assert_eq!(
            tailor(v2, &ours(), Some(&h)).domain.control_progress,
            FI_PROGRESS_CONTROL_UNIFIED
        );
    }

    #[test]
    fn resource_mgmt_and_av_type() {
        for rm in [FI_RM_UNSPEC, FI_RM_DISABLED, FI_RM_ENABLED] {
            let h = c_hints(|_, _, _, _, d, _| d.resource_mgmt = rm);
            assert_eq!(check(API, &ours(), &h), Ok(()));
            assert_eq!(
                tailor(API, &ours(), Some(&h)).domain.resource_mgmt,
                FI_RM_ENABLED
            );
        }
        for av in [FI_AV_TABLE, FI_AV_MAP] {
            let h = c_hints(|_, _, _, _, d, _| d.av_type = av);
            assert_eq!(check(API, &ours(), &h), Ok(()));
            assert_eq!(tailor(API, &ours(), Some(&h)).domain.av_type, av);
        }
        assert_eq!(
            tailor(API, &ours(), Some(&c_hints(no_edit))).domain.av_type,
            FI_AV_UNSPEC
        );
        assert_eq!(tailor(API, &ours(), None).domain.av_type, FI_AV_UNSPEC);
    }

    #[test]
    fn mr_modes() {
        let local_etc =
            (FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY)
                as c_int;
        let h = c_hints(|_, _, _, _, d, _| d.mr_mode = local_etc);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(tailor(API, &ours(), Some(&h)).domain.mr_mode, 0);
        // v1.0-style requests.
        let v1_0 = ffi::fi_version(1, 0);
        let h = c_hints(no_edit);
        assert_eq!(check(v1_0, &ours(), &h), Ok(()));
        assert_eq!(
            tailor(v1_0, &ours(), Some(&h)).domain.mr_mode,
            FI_MR_BASIC as c_int
        );
        let h = c_hints(|_, _, _, _, d, _| d.mr_mode = FI_MR_SCALABLE as c_int);
        assert_eq!(check(v1_0, &ours(), &h), Ok(()));
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(
            tailor(API, &ours(), Some(&h)).domain.mr_mode,
            FI_MR_SCALABLE as c_int
        );
        let h = c_hints(|_, _, _, _, d, _| d.mr_mode = (FI_MR_BASIC as u64 | FI_MR_LOCAL) as c_int);
        assert_eq!(field_of(check(API, &ours(), &h)), "domain_attr.mr_mode");
        // Version 0 (MPICH 5.0 asks that first) behaves like 1.0.
        assert_eq!(check(0, &ours(), &c_hints(no_edit)), Ok(()));
    }

    #[test]
    fn op_flags_and_order() {
        let h = c_hints(|_, tx, _, _, _, _| tx.op_flags = FI_COMPLETION | FI_DELIVERY_COMPLETE);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(
            tailor(API, &ours(), Some(&h)).tx.op_flags,
            FI_COMPLETION | FI_DELIVERY_COMPLETE
        );
        let h = c_hints(|_, tx, _, _, _, _| tx.op_flags = FI_INJECT);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let h = c_hints(|_, tx, _, _, _, _| tx.op_flags = FI_COMMIT_COMPLETE);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.op_flags");
        let h = c_hints(|_, _, rx, _, _, _| rx.op_flags = FI_MULTI_RECV | FI_COMPLETION);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let h = c_hints(|_, tx, rx, _, _, _| {
            tx.msg_order = FI_ORDER_SAS;
            rx.msg_order = FI_ORDER_SAS;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let h = c_hints(|_, tx, _, _, _, _| tx.msg_order = FI_ORDER_STRICT);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.msg_order");
        let h = c_hints(|_, _, rx, _, _, _| rx.msg_order = FI_ORDER_DATA);
        assert_eq!(field_of(check(API, &ours(), &h)), "rx_attr.msg_order");
        let h = c_hints(|_, _, rx, _, _, _| rx.comp_order = FI_ORDER_STRICT);
        assert_eq!(field_of(check(API, &ours(), &h)), "rx_attr.comp_order");
    }

    #[test]
    fn ignored_direction_caps() {
        // Rx-only caps in tx_attr (and the reverse) are ignored, like prov/util.
        let h = c_hints(|_, tx, rx, _, _, _| {
            tx.caps = FI_MSG | FI_RECV | FI_MULTI_RECV;
            rx.caps = FI_MSG | FI_SEND;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let h = c_hints(|_, tx, _, _, _, _| tx.caps = FI_RMA);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.caps");
    }

    #[test]
    fn sizes_and_limits() {
        let cfg = Config::defaults();
        let h = c_hints(|_, tx, _, _, _, _| tx.size = cfg.tx_size + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.size");
        let h = c_hints(|_, _, rx, _, _, _| rx.size = cfg.rx_size + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "rx_attr.size");
        let h = c_hints(|_, tx, _, _, _, _| tx.iov_limit = IOV_LIMIT + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.iov_limit");
        let h = c_hints(|_, _, rx, _, _, _| rx.iov_limit = IOV_LIMIT + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "rx_attr.iov_limit");
        let h = c_hints(|_, tx, _, _, _, _| tx.inject_size = cfg.eager_size + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.inject_size");
        let h = c_hints(|_, tx, _, _, _, _| tx.rma_iov_limit = 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.rma_iov_limit");
        let h = c_hints(|_, _, _, ep, _, _| ep.max_msg_size = MAX_MSG_SIZE + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "ep_attr.max_msg_size");
        let h = c_hints(|_, _, _, _, d, _| d.cq_data_size = 9);
        assert_eq!(
            field_of(check(API, &ours(), &h)),
            "domain_attr.cq_data_size"
        );
        let h = c_hints(|_, _, _, _, d, _| d.cq_data_size = 4);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        // Smaller requests are granted as asked.
        let h = c_hints(|_, tx, rx, _, _, _| {
            tx.size = 64;
            rx.size = 32;
            tx.inject_size = 100;
        });
        let i = tailor(API, &ours(), Some(&h));
        assert_eq!((i.tx.size, i.rx.size, i.tx.inject_size), (64, 32, 100));
    }

    #[test]
    fn contexts() {
        let h = c_hints(|_, _, _, ep, _, _| ep.tx_ctx_cnt = 2);
        assert_eq!(field_of(check(API, &ours(), &h)), "ep_attr.tx_ctx_cnt");
        let h = c_hints(|_, _, _, ep, _, _| ep.rx_ctx_cnt = FI_SHARED_CONTEXT as usize);
        assert_eq!(field_of(check(API, &ours(), &h)), "ep_attr.rx_ctx_cnt");
        let h = c_hints(|_, _, _, ep, _, _| {
            ep.tx_ctx_cnt = 1;
            ep.rx_ctx_cnt = 1;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
    }

    #[test]
    fn tag_format() {
        // MPICH-style formats are narrower than 64 bits: fine.
        let h = c_hints(|i, _, _, ep, _, _| {
            i.caps = FI_TAGGED;
            ep.mem_tag_format = 0x0000_7fff_ffff_ffff;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let h = c_hints(|i, _, _, ep, _, _| {
            i.caps = FI_TAGGED;
            ep.mem_tag_format = u64::MAX;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(max_tag(FI_TAG_GENERIC), u64::MAX);
        assert_eq!(max_tag(0xff), 0xff);
        assert_eq!(max_tag(0), 0);
    }

    #[test]
    fn auth_keys_refused() {
        let h = c_hints(|_, _, _, ep, _, _| ep.auth_key_size = 8);
        assert_eq!(field_of(check(API, &ours(), &h)), "ep_attr.auth_key_size");
        let h = c_hints(|_, _, _, _, d, _| d.auth_key_size = 8);
        assert_eq!(field_of(check(API, &ours(), &h)), "domain_attr.auth_key");
    }

    #[test]
    fn domain_caps_and_counts() {
        let h = c_hints(|_, _, _, _, d, _| d.caps = FI_LOCAL_COMM);
        assert_eq!(check(API, &ours(), &h), Ok(()));
        assert_eq!(
            tailor(API, &ours(), Some(&h)).domain.caps & FI_LOCAL_COMM,
            FI_LOCAL_COMM
        );
        let h = c_hints(|_, _, _, _, d, _| d.caps = FI_SHARED_AV);
        assert_eq!(field_of(check(API, &ours(), &h)), "domain_attr.caps");
        // ...but that field did not exist before 1.5.
        assert_eq!(check(ffi::fi_version(1, 4), &ours(), &h), Ok(()));
        let h = c_hints(|_, _, _, _, d, _| d.cntr_cnt = MAX_OBJECTS + 1);
        assert_eq!(field_of(check(API, &ours(), &h)), "domain_attr.cntr_cnt");
    }

    /// What MPICH CH4 asks (ofi_init.c / init_provider.c), in essence.
    #[test]
    fn mpich_hints() {
        let h = c_hints(|i, tx, rx, ep, d, _| {
            i.caps = FI_MSG | FI_MULTI_RECV | FI_TAGGED | FI_DIRECTED_RECV;
            i.mode = FI_CONTEXT | FI_ASYNC_IOV | FI_RX_CQ_DATA | FI_CONTEXT2;
            i.addr_format = FI_FORMAT_UNSPEC;
            tx.op_flags = FI_COMPLETION;
            tx.msg_order = FI_ORDER_SAS;
            rx.msg_order = FI_ORDER_SAS;
            ep.type_ = FI_EP_RDM;
            ep.mem_tag_format = 0x0000_ffff_ffff_ffff;
            d.threading = FI_THREAD_DOMAIN;
            d.control_progress = FI_PROGRESS_MANUAL;
            d.data_progress = FI_PROGRESS_MANUAL;
            d.resource_mgmt = FI_RM_ENABLED;
            d.av_type = FI_AV_TABLE;
            d.mr_mode =
                (FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT) as c_int;
        });
        let v = ffi::fi_version(1, 17);
        assert_eq!(check(v, &ours(), &h), Ok(()));
        let i = tailor(v, &ours(), Some(&h));
        assert_eq!(i.domain.threading, FI_THREAD_DOMAIN);
        assert_eq!(i.domain.data_progress, FI_PROGRESS_MANUAL);
        assert_eq!(i.domain.av_type, FI_AV_TABLE);
        assert_eq!(i.domain.resource_mgmt, FI_RM_ENABLED);
        assert_eq!(i.tx.op_flags, FI_COMPLETION);
        assert_eq!(i.caps & (FI_MSG | FI_MULTI_RECV), FI_MSG | FI_MULTI_RECV);
        assert_eq!(i.domain.mr_mode, 0);
        assert!(i.domain.cq_data_size >= 4);
    }

    /// fabtests asks FI_DELIVERY_COMPLETE (-U), FI_RM_ENABLED and mode FI_CONTEXT.
    #[test]
    fn fabtests_hints() {
        let h = c_hints(|i, tx, _, ep, d, _| {
            i.caps = FI_MSG | FI_TAGGED;
            i.mode = FI_CONTEXT;
            tx.op_flags = FI_DELIVERY_COMPLETE;
            ep.type_ = FI_EP_RDM;
            d.resource_mgmt = FI_RM_ENABLED;
            d.mr_mode =
                (FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR)
                    as c_int;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
    }
}
