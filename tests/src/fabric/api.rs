//! libfabric itself: `libfabric.so.1` loaded with `dlopen`, and the entry
//! points the wrapper calls outside the ops tables.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

use unimem_fi_sys as ffi;

type GetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const ffi::fi_info,
    *mut *mut ffi::fi_info,
) -> c_int;
type DupinfoFn = unsafe extern "C" fn(*const ffi::fi_info) -> *mut ffi::fi_info;
type FreeinfoFn = unsafe extern "C" fn(*mut ffi::fi_info);
type FabricFn =
    unsafe extern "C" fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;
type VersionFn = unsafe extern "C" fn() -> u32;
type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The core functions an application links against.
pub struct Api {
    pub(super) getinfo: GetinfoFn,
    pub(super) dupinfo: DupinfoFn,
    pub(super) freeinfo: FreeinfoFn,
    pub(super) fabric: FabricFn,
    pub(super) strerror: StrerrorFn,
    pub version: u32,
}

/// The core, loaded once per process (`RTLD_LOCAL`, like a private copy).
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    // SAFETY: plain dlopen of a C string literal.
    let h = unsafe {
        libc::dlopen(
            c"libfabric.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if h.is_null() {
        return Err("libfabric.so.1 is not loadable (apt-get install libfabric1)".into());
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c = CString::new(name).expect("no NUL in symbol names");
        // SAFETY: h is a live handle; c a valid C string.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        if p.is_null() {
            Err(format!("libfabric.so.1 has no {name}"))
        } else {
            Ok(p)
        }
    };
    // SAFETY: these are libfabric's functions (the default symbol versions)
    // with exactly these prototypes (rdma/fabric.h, rdma/fi_errno.h).
    unsafe {
        let version = std::mem::transmute::<*mut c_void, VersionFn>(sym("fi_version")?);
        Ok(Api {
            getinfo: std::mem::transmute::<*mut c_void, GetinfoFn>(sym("fi_getinfo")?),
            dupinfo: std::mem::transmute::<*mut c_void, DupinfoFn>(sym("fi_dupinfo")?),
            freeinfo: std::mem::transmute::<*mut c_void, FreeinfoFn>(sym("fi_freeinfo")?),
            fabric: std::mem::transmute::<*mut c_void, FabricFn>(sym("fi_fabric")?),
            strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(sym("fi_strerror")?),
            version: version(),
        })
    }
}

impl Api {
    /// `fi_strerror` of a (negated or not) return code.
    pub fn strerror(&self, code: isize) -> String {
        let code = code.unsigned_abs().min(c_int::MAX as usize) as c_int;
        // SAFETY: fi_strerror returns a static C string for any code.
        unsafe { CStr::from_ptr((self.strerror)(code)) }
            .to_string_lossy()
            .into_owned()
    }
}
