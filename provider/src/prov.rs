//! The provider object and the three callbacks the core uses:
//! `fi_prov_ini` (the DSO entry point), `getinfo`, `fabric`, `cleanup`.

use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::base::config;
use crate::base::core;
use crate::base::ffi::{self, ret};
use crate::base::guard::{ffi_guard, ffi_guard_or};
use crate::base::log;
use crate::base::provider::{core_fi_version, provider_mut};
use crate::fabric;
use crate::info::getinfo;
use crate::state::memory;

/// How many times the core registered us without cleaning up yet. The same
/// file reached under two names (a symlink, or a directory listed twice in
/// FI_PROVIDER_PATH) is one DSO that the core registers twice, and later
/// cleans up twice: only the first registration initialises, only the last
/// cleanup tears down.
static REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);

/// DSO entry point, called by the core right after `dlopen`. Cheap: it runs
/// even when `FI_PROVIDER` excludes us. Finds the core, sets `fi_version` to
/// the core's own (the core skips providers older than the requested API),
/// routes `tracing` into `fi_log` and defines our parameters.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut ffi::fi_provider {
    ffi_guard_or("fi_prov_ini", ptr::null_mut(), || {
        if REGISTRATIONS.fetch_add(1, Ordering::AcqRel) > 0 {
            return provider_mut();
        }
        let caller = core::foreign_caller();
        let fi_version = core::resolve(caller).map_or(ffi::HEADER_FI_VERSION, |c| c.fi_version());
        // SAFETY: the core has not seen the provider yet, so nothing accesses it concurrently.
        unsafe {
            let p = provider_mut();
            (*p).fi_version = fi_version;
            (*p).getinfo = Some(getinfo_entry);
            (*p).fabric = Some(fabric_entry);
            (*p).cleanup = Some(cleanup_entry);
        }
        log::install();
        config::define_params();
        provider_mut()
    })
}

/// First thing in every core → provider call: logging filters are final now.
fn on_core_call() {
    static ANNOUNCED: std::sync::Once = std::sync::Once::new();
    log::refresh();
    ANNOUNCED.call_once(|| {
        if let Some(c) = core::get() {
            let v = core_fi_version();
            tracing::info!(
                "unimem {} on libfabric API {}.{} (core found via {})",
                env!("CARGO_PKG_VERSION"),
                v >> 16,
                v & 0xffff,
                c.found_by
            );
        }
    });
}

unsafe extern "C" fn getinfo_entry(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const ffi::fi_info,
    info: *mut *mut ffi::fi_info,
) -> c_int {
    ffi_guard("getinfo", || {
        on_core_call();
        if info.is_null() {
            tracing::warn!("fi_getinfo: NULL info pointer");
            return ret::EINVAL;
        }
        // SAFETY: the core passes NULL or C strings and NULL or a valid fi_info, live for the call.
        let (node, service, hints) =
            unsafe { (ffi::opt_str(node), ffi::opt_str(service), hints.as_ref()) };
        let (Ok(node), Ok(service)) = (node, service) else {
            tracing::info!("fi_getinfo: node/service is not UTF-8");
            return ret::EINVAL;
        };
        match getinfo::getinfo(version, node, service, flags, hints) {
            Ok(list) => {
                // SAFETY: checked non-null above; the core owns the list now.
                unsafe { *info = list };
                ret::SUCCESS
            }
            Err(e) => e.ret(),
        }
    })
}

unsafe extern "C" fn fabric_entry(
    attr: *mut ffi::fi_fabric_attr,
    fab: *mut *mut ffi::fid_fabric,
    context: *mut c_void,
) -> c_int {
    ffi_guard("fabric", || {
        on_core_call();
        // SAFETY: the core passes the application's attr and out pointer.
        ffi::error::ret_of(unsafe { fabric::open(attr, fab, context) })
    })
}

unsafe extern "C" fn cleanup_entry() {
    ffi_guard_or("cleanup", (), || {
        let before = REGISTRATIONS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0);
        if before > 1 {
            return;
        }
        // Our parameters are already undefined and the core is about to
        // dlclose us: stop calling into it and drop cached state so that a
        // re-load starts fresh.
        tracing::debug!("cleanup");
        crate::state::agent::shutdown();
        unimem_net::shutdown();
        memory::release_process_region();
        log::shutdown();
        config::reset();
        core::forget();
    })
}
