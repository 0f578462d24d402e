//! The plain-Rust form of an `fi_info`: our template, the answer for one
//! request, and an application's hints (where zero or `None` means
//! unspecified).

use std::os::raw::c_int;

use crate::base::ffi::*;
use crate::base::provider;

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

impl Hints {
    /// Whether the application named us explicitly (then a mismatch is
    /// worth a warning rather than an info line).
    pub fn names_us(&self) -> bool {
        self.fabric
            .as_ref()
            .and_then(|f| f.prov_name.as_deref())
            .is_some_and(|n| n.split(';').any(|p| p.eq_ignore_ascii_case(provider::NAME)))
    }
}
