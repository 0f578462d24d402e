//! C structs → the plain-Rust types (hints, the info given to
//! `fi_domain`), and the attributes back into C (getinfo.rs allocates).

use std::ffi::CStr;

use super::types::*;
use crate::base::ffi::*;

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
}
