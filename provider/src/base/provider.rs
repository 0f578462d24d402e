//! Who we are to the libfabric core: the provider's name and version, and
//! the registered `struct fi_provider` that logging and parameters name.
//! The entry points in it (getinfo, fabric, cleanup) belong to the top of
//! the provider: `prov` installs them when the core loads us.

use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::ptr;

use crate::base::ffi;

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
/// its per-provider state in `context`, and we set `fi_version` and the
/// entry points at load. The core and our logging read it through the raw
/// pointer only.
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
    getinfo: None,
    fabric: None,
    cleanup: None,
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
