//! The description returned for hints that [`check`](super::check)
//! accepted: prov/util's capability selection, values reported as asked,
//! and its MR-mode reporting rules.

use std::os::raw::c_int;

use super::check::cap_mr_mode;
use super::template::*;
use super::types::*;
use crate::base::ffi::{self, *};

const V1_5: u32 = ffi::fi_version(1, 5);

/// Secondary caps reported even to hints that did not ask for them.
/// FI_SOURCE and FI_RMA_EVENT are left out: one costs an address lookup
/// per completion, the other a notice per one-sided access, and
/// fi_getinfo(3) lets a provider report unrequested secondary caps only
/// where they cost nothing.
const UNASKED_SECONDARY_CAPS: u64 = SECONDARY_CAPS & !(FI_SOURCE | FI_RMA_EVENT);

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
        // Not inject_size: a smaller request gets ours, the size an
        // application sizes its inject path by (every inject up to it costs
        // us the same; SOS, which asks for 16 bytes, sent 17 to 2048 bytes
        // through bounce buffers and a CQ read each, 0.85 against 0.47 us
        // per put + quiet). A larger one is refused by `check`.
        for (ours, theirs) in [
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
