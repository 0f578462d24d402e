//! What unimem offers: the attribute values of its single `FI_EP_RDM`
//! fi_info ([`template`]), and libfabric's capability classes the
//! matching rules need.

use std::os::raw::c_int;

use super::types::*;
use crate::base::config::Config;
use crate::base::ffi::*;
use crate::base::provider;
use unimem_proto::atomic::ATOMIC_MAX_BYTES;

/// Capabilities of the RDM endpoint (primary and secondary).
pub const CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_RMA
    | FI_ATOMIC
    | FI_READ
    | FI_WRITE
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RMA_EVENT
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_DIRECTED_RECV
    | FI_SEND
    | FI_RECV
    | FI_LOCAL_COMM
    | FI_REMOTE_COMM;
pub const TX_CAPS: u64 = FI_MSG | FI_TAGGED | FI_SEND | FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE;
pub const RX_CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_RECV
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_DIRECTED_RECV
    | FI_RMA
    | FI_ATOMIC
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RMA_EVENT;
pub const DOMAIN_CAPS: u64 = FI_LOCAL_COMM | FI_REMOTE_COMM;

/// Operation flags accepted as defaults in hints.
/// Every completion level a send may ask for, each honoured (see
/// `ep/data/mod.rs`), but `FI_COMMIT_COMPLETE`: it concerns persistent memory,
/// which we do not have, and is refused.
pub const TX_OP_FLAGS: u64 = FI_COMPLETION
    | FI_INJECT
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_MATCH_COMPLETE
    | FI_DELIVERY_COMPLETE;
pub const RX_OP_FLAGS: u64 = FI_COMPLETION | FI_MULTI_RECV;

/// Sends arrive in order; so are atomics applied, to each target location
/// (one-sided ones when posted, the others in mailbox order, a one-sided one
/// waiting behind those of the same target: see `messenger/rma/atomic/`).
pub const MSG_ORDER: u64 = FI_ORDER_SAS
    | FI_ORDER_ATOMIC_RAR
    | FI_ORDER_ATOMIC_RAW
    | FI_ORDER_ATOMIC_WAR
    | FI_ORDER_ATOMIC_WAW;
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
pub(super) const PRIMARY_TX_CAPS: u64 = FI_MSG
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
pub(super) const SECONDARY_TX_CAPS: u64 = FI_TRIGGER | FI_FENCE | FI_RMA_PMEM;
pub(super) const PRIMARY_RX_CAPS: u64 = FI_MSG
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
pub(super) const SECONDARY_RX_CAPS: u64 =
    FI_MULTI_RECV | FI_TRIGGER | FI_RMA_PMEM | FI_SOURCE | FI_RMA_EVENT | FI_SOURCE_ERR;
pub(super) const PRIMARY_CAPS: u64 =
    PRIMARY_TX_CAPS | PRIMARY_RX_CAPS | FI_REMOTE_COMM | FI_LOCAL_COMM;
pub(super) const SECONDARY_CAPS: u64 = SECONDARY_TX_CAPS | SECONDARY_RX_CAPS | FI_SHARED_AV;
pub(super) const MSG_DIRECTION_CAPS: u64 = FI_SEND | FI_RECV;
/// Rx-only caps an application may leave in tx_attr (ignored there), and
/// the reverse.
pub(super) const IGNORED_TX_CAPS: u64 = FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RECV
    | FI_DIRECTED_RECV
    | FI_VARIABLE_MSG
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_RMA_EVENT
    | FI_SOURCE_ERR;
pub(super) const IGNORED_RX_CAPS: u64 =
    FI_READ | FI_WRITE | FI_SEND | FI_FENCE | FI_MULTICAST | FI_NAMED_RX_CTX;
/// MR modes that only matter to an RMA target.
pub(super) const MR_MODE_RMA_TARGET: c_int =
    (FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_RMA_EVENT) as c_int;

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
            // One target range per RMA operation.
            rma_iov_limit: 1,
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
            max_msg_size: cfg.message_limit(),
            msg_prefix_size: 0,
            // Atomics up to their largest size are ordered (the
            // FI_ORDER_ATOMIC_* bits of msg_order); RMA reads and writes
            // are not (no FI_ORDER_RAW and kin).
            max_order_raw_size: ATOMIC_MAX_BYTES,
            max_order_war_size: ATOMIC_MAX_BYTES,
            max_order_waw_size: ATOMIC_MAX_BYTES,
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
