//! The matching and tailoring rules, from hints built as applications
//! build them.

use std::os::raw::c_int;

use super::check::{check, max_tag, Check};
use super::tailor::tailor;
use super::template::*;
use super::types::*;
use crate::base::config::Config;
use crate::base::ffi::{self, *};
use crate::base::provider;

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
    assert_eq!(i.ep.max_msg_size, usize::MAX);
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
    assert_eq!(check(API, &ours(), &rma), Ok(()));
    let rma_event = c_hints(|i, _, _, _, _, _| i.caps = FI_RMA | FI_RMA_EVENT);
    assert_eq!(check(API, &ours(), &rma_event), Ok(()));
    // Reported when asked for only (a notice per one-sided access).
    assert_eq!(
        tailor(API, &ours(), Some(&rma_event)).caps & FI_RMA_EVENT,
        FI_RMA_EVENT
    );
    let rma = c_hints(|i, _, _, _, _, _| i.caps = FI_RMA);
    assert_eq!(tailor(API, &ours(), Some(&rma)).caps & FI_RMA_EVENT, 0);
    let atomic = c_hints(|i, _, _, _, _, _| i.caps = FI_ATOMIC);
    assert_eq!(check(API, &ours(), &atomic), Ok(()));
    let collective = c_hints(|i, _, _, _, _, _| i.caps = FI_MSG | FI_COLLECTIVE);
    assert_eq!(field_of(check(API, &ours(), &collective)), "caps");
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
    // Auto progress is offered when asked for (the progress agent), as
    // asked; nothing asked keeps manual.
    for (control, data) in [
        (FI_PROGRESS_UNSPEC, FI_PROGRESS_AUTO),
        (FI_PROGRESS_AUTO, FI_PROGRESS_UNSPEC),
        (FI_PROGRESS_AUTO, FI_PROGRESS_AUTO),
    ] {
        let h = c_hints(|_, _, _, _, d, _| {
            d.control_progress = control;
            d.data_progress = data;
        });
        assert_eq!(check(API, &ours(), &h), Ok(()));
        let i = tailor(API, &ours(), Some(&h));
        let or_manual = |p| {
            if p == FI_PROGRESS_UNSPEC {
                FI_PROGRESS_MANUAL
            } else {
                p
            }
        };
        assert_eq!(
            (i.domain.control_progress, i.domain.data_progress),
            (or_manual(control), or_manual(data))
        );
    }
    let h = c_hints(|_, _, _, _, d, _| d.data_progress = 77);
    assert_eq!(
        field_of(check(API, &ours(), &h)),
        "domain_attr.data_progress"
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
    // Every completion level but commit (no persistent memory).
    for level in [
        FI_INJECT_COMPLETE,
        FI_TRANSMIT_COMPLETE,
        FI_MATCH_COMPLETE,
        FI_DELIVERY_COMPLETE,
        FI_MATCH_COMPLETE | FI_DELIVERY_COMPLETE,
    ] {
        let h = c_hints(|_, tx, _, _, _, _| tx.op_flags = FI_COMPLETION | level);
        assert_eq!(check(API, &ours(), &h), Ok(()), "{level:#x}");
        assert_eq!(
            tailor(API, &ours(), Some(&h)).tx.op_flags,
            FI_COMPLETION | level
        );
    }
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
    let h = c_hints(|_, tx, _, _, _, _| tx.caps = FI_COLLECTIVE);
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
    let h = c_hints(|_, tx, _, _, _, _| tx.rma_iov_limit = 2);
    assert_eq!(field_of(check(API, &ours(), &h)), "tx_attr.rma_iov_limit");
    let h = c_hints(|_, _, _, ep, _, _| ep.max_msg_size = usize::MAX);
    assert_eq!(check(API, &ours(), &h), Ok(()), "every length");
    let h = c_hints(|_, _, _, _, d, _| d.cq_data_size = 9);
    assert_eq!(
        field_of(check(API, &ours(), &h)),
        "domain_attr.cq_data_size"
    );
    let h = c_hints(|_, _, _, _, d, _| d.cq_data_size = 4);
    assert_eq!(check(API, &ours(), &h), Ok(()));
    // Smaller requests are granted as asked, but for the inject size:
    // the application gets the largest it may use.
    let h = c_hints(|_, tx, rx, _, _, _| {
        tx.size = 64;
        rx.size = 32;
        tx.inject_size = 100;
    });
    let i = tailor(API, &ours(), Some(&h));
    assert_eq!(
        (i.tx.size, i.rx.size, i.tx.inject_size),
        (64, 32, Config::defaults().eager_size)
    );
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
        d.mr_mode = (FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT) as c_int;
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
