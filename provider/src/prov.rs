//! The provider object and the three callbacks the core uses:
//! `fi_prov_ini` (the DSO entry point), `getinfo`, `fabric`, `cleanup`.

use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::{self, ret};
use crate::guard::{ffi_guard, ffi_guard_or};
use crate::{config, core, ep, fabric, getinfo, log};

/// Provider name (fi_info -p unimem, FI_PROVIDER=unimem, FI_UNIMEM_* params).
pub const NAME: &str = "unimem";
const NAME_C: &CStr = c"unimem";

/// Our provider version: the crate's major.minor. Between two loaded
/// providers of the same name the core keeps the higher version.
pub const PROVIDER_VERSION: u32 = ffi::fi_version(
    parse_u32(env!("CARGO_PKG_VERSION_MAJOR")),
    parse_u32(env!("CARGO_PKG_VERSION_MINOR")),
);

const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut v = 0u32;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

/// The registered `struct fi_provider`. It must be writable: the core keeps
/// its per-provider state in `context`, and we set `fi_version` at load.
/// The core and our logging read it through the raw pointer only.
struct ProviderCell(UnsafeCell<ffi::fi_provider>);

// SAFETY: written only by fi_prov_ini (before the core uses it) and by the core in `context`.
unsafe impl Sync for ProviderCell {}

static PROVIDER: ProviderCell = ProviderCell(UnsafeCell::new(ffi::fi_provider {
    version: PROVIDER_VERSION,
    fi_version: ffi::HEADER_FI_VERSION,
    context: ffi::fi_context {
        internal: [ptr::null_mut(); 4],
    },
    name: NAME_C.as_ptr(),
    getinfo: Some(getinfo_entry),
    fabric: Some(fabric_entry),
    cleanup: Some(cleanup_entry),
}));

/// The registered provider (for fi_log / fi_param_*).
pub fn provider() -> *const ffi::fi_provider {
    PROVIDER.0.get()
}

/// Same, for the core functions declared with a non-const pointer.
pub fn provider_mut() -> *mut ffi::fi_provider {
    PROVIDER.0.get()
}

/// API version the running core speaks (what we report as `fi_version`).
pub fn core_fi_version() -> u32 {
    // SAFETY: plain read of a field written once in fi_prov_ini.
    unsafe { (*provider()).fi_version }
}

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
        unsafe { (*provider_mut()).fi_version = fi_version };
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
        let (node, service, hints) = unsafe { (opt_str(node), opt_str(service), hints.as_ref()) };
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
            Err(rc) => rc,
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
        unsafe { fabric::open(attr, fab, context) }
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
        ep::release_process_region();
        log::shutdown();
        config::reset();
        core::forget();
    })
}

/// `Some(&str)` for a non-NULL C string, `None` for NULL.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string valid for `'a`.
pub unsafe fn opt_str<'a>(p: *const c_char) -> Result<Option<&'a str>, std::str::Utf8Error> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_str().map(Some)
}
