//! Pieces shared by the provider's integration tests (`loading.rs`,
//! `objects.rs`): where the cdylib is, and the libfabric core opened
//! privately.

#![allow(dead_code)] // each test binary uses its own part

use std::ffi::{c_void, CString};
use std::os::raw::{c_char, c_int};
use std::path::PathBuf;

use unimem_fi::base::ffi;

/// The cdylib built together with the tests.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [
        deps.join("libunimem_fi.so"),
        deps.join("../libunimem_fi.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| panic!("libunimem_fi.so not found near {}", deps.display()))
}

pub type GetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const ffi::fi_info,
    *mut *mut ffi::fi_info,
) -> c_int;
pub type DupinfoFn = unsafe extern "C" fn(*const ffi::fi_info) -> *mut ffi::fi_info;
pub type FreeinfoFn = unsafe extern "C" fn(*mut ffi::fi_info);
pub type FabricFn =
    unsafe extern "C" fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;
pub type VersionFn = unsafe extern "C" fn() -> u32;

/// The core's entry points the tests call (the rest are inline wrappers
/// over ops tables).
pub struct Core {
    pub getinfo: GetinfoFn,
    pub dupinfo: DupinfoFn,
    pub freeinfo: FreeinfoFn,
    pub fabric: FabricFn,
    pub version: VersionFn,
}

/// libfabric.so.1 `dlopen`ed with RTLD_LOCAL (out of the global scope), or
/// `None` (with a message) where it is not installed.
pub fn open_core_privately() -> Option<Core> {
    let lib = CString::new("libfabric.so.1").unwrap();
    // SAFETY: plain dlopen; RTLD_LOCAL keeps the core out of the global scope.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        println!("SKIPPED: libfabric.so.1 not loadable");
        return None;
    }
    let sym = |n: &str| {
        let c = CString::new(n).unwrap();
        // SAFETY: h is a live handle, c a valid C string.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        assert!(!p.is_null(), "{n} missing");
        p
    };
    // SAFETY: these are libfabric's functions (newest symbol versions) with these prototypes.
    unsafe {
        Some(Core {
            getinfo: std::mem::transmute::<*mut c_void, GetinfoFn>(sym("fi_getinfo")),
            dupinfo: std::mem::transmute::<*mut c_void, DupinfoFn>(sym("fi_dupinfo")),
            freeinfo: std::mem::transmute::<*mut c_void, FreeinfoFn>(sym("fi_freeinfo")),
            fabric: std::mem::transmute::<*mut c_void, FabricFn>(sym("fi_fabric")),
            version: std::mem::transmute::<*mut c_void, VersionFn>(sym("fi_version")),
        })
    }
}
