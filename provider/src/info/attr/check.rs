//! Can our template satisfy an application's hints? prov/util's rules:
//! subsets for caps, op_flags and orders, "our required modes must be in
//! theirs", limits that must not exceed ours, MR-mode rules per API
//! version.

use std::fmt;
use std::os::raw::c_int;

use super::template::*;
use super::types::*;
use crate::base::core;
use crate::base::ffi::{self, *};
use crate::base::provider;

const V1_5: u32 = ffi::fi_version(1, 5);
const V2_0: u32 = ffi::fi_version(2, 0);

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

pub(super) type Check = Result<(), Mismatch>;

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

/// Progress models we can honour: manual (and unspecified), auto (the
/// domain then gets the progress agent, `state/agent.rs`); 2.x's
/// CONTROL_UNIFIED only from API 2.0 on (the value does not exist before).
fn progress_ok(api: u32, p: fi_progress) -> Result<(), String> {
    match p {
        FI_PROGRESS_UNSPEC | FI_PROGRESS_MANUAL | FI_PROGRESS_AUTO => Ok(()),
        FI_PROGRESS_CONTROL_UNIFIED if !fi_version_lt(api, V2_0) => Ok(()),
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
pub(super) fn cap_mr_mode(caps: u64, mut mode: c_int) -> c_int {
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

pub(super) fn max_tag(format: u64) -> u64 {
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
