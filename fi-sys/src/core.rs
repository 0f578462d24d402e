//! The libfabric core functions we call, resolved at load time.
//!
//! We never link against libfabric: linking would bind symbol-versioned
//! functions to whatever version the build machine had, and an unlinked
//! reference would bind to the oldest (FABRIC_1.0) ABI. Instead we look the
//! functions up in the core that is loading us. We only rely on functions
//! that exist unversioned since FABRIC_1.0 (`fi_version`, `fi_log_enabled`,
//! `fi_log`, `fi_param_define`, `fi_param_get`); `fi_strerror` and
//! `fi_tostr_r` (bit masks and enums only) are optional, for log text.
//!
//! Where to find the core, most precise first:
//! 1. the object that called `fi_prov_ini` (found with `backtrace` +
//!    `dladdr`): exactly the core registering us, even when it was
//!    `dlopen`ed RTLD_LOCAL (MPI loaded privately by Python) or embedded in
//!    another library (MPICH `--enable-embedded`);
//! 2. the global scope (`dlsym(RTLD_DEFAULT)`): the usual linked application;
//! 3. `dlopen("libfabric.so.1", RTLD_NOLOAD)`;
//! 4. any loaded object providing the functions (`dl_iterate_phdr`), objects
//!    named like libfabric first (MPICH's wheel carries its own copy).
//!
//! Handles from `dlopen(RTLD_NOLOAD)` are closed again right away: the core
//! outlives us (it is the one that unloads us), so the function pointers stay
//! valid without us holding a reference that would keep it loaded forever.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate as ffi;

pub type FiVersionFn = unsafe extern "C" fn() -> u32;
pub type FiLogEnabledFn =
    unsafe extern "C" fn(*const ffi::fi_provider, ffi::fi_log_level, ffi::fi_log_subsys) -> c_int;
pub type FiLogFn = unsafe extern "C" fn(
    *const ffi::fi_provider,
    ffi::fi_log_level,
    ffi::fi_log_subsys,
    *const c_char,
    c_int,
    *const c_char,
    ...
);
pub type FiParamDefineFn = unsafe extern "C" fn(
    *const ffi::fi_provider,
    *const c_char,
    ffi::fi_param_type,
    *const c_char,
    ...
) -> c_int;
pub type FiParamGetFn =
    unsafe extern "C" fn(*mut ffi::fi_provider, *const c_char, *mut c_void) -> c_int;
pub type FiStrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
pub type FiTostrRFn =
    unsafe extern "C" fn(*mut c_char, usize, *const c_void, ffi::fi_type) -> *mut c_char;
pub type FiGetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const ffi::fi_info,
    *mut *mut ffi::fi_info,
) -> c_int;
pub type FiFreeinfoFn = unsafe extern "C" fn(*mut ffi::fi_info);
pub type FiDupinfoFn = unsafe extern "C" fn(*const ffi::fi_info) -> *mut ffi::fi_info;
pub type FiFabricFn =
    unsafe extern "C" fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;

/// The core functions a provider layered over another one calls (the
/// network backend opens `tcp` through them): newest symbol versions, which
/// take and give the core's own struct sizes (ours are a prefix of them).
#[derive(Clone, Copy)]
pub struct LayerFns {
    pub getinfo: FiGetinfoFn,
    pub freeinfo: FiFreeinfoFn,
    pub dupinfo: FiDupinfoFn,
    pub fabric: FiFabricFn,
}

/// The resolved core entry points.
pub struct Core {
    pub version: FiVersionFn,
    pub log_enabled: FiLogEnabledFn,
    pub log: FiLogFn,
    pub param_define: FiParamDefineFn,
    pub param_get: FiParamGetFn,
    pub strerror: Option<FiStrerrorFn>,
    pub tostr_r: Option<FiTostrRFn>,
    /// `None` if the core lacks one of them.
    pub layer: Option<LayerFns>,
    /// How the core was found (for an INFO line once logging is set up).
    pub found_by: String,
}

/// Current core; null before `fi_prov_ini` or after `cleanup`.
/// Each resolution leaks one small `Core` on purpose: a reader may still
/// hold the old pointer, and re-resolution only happens on a re-load.
static CORE: AtomicPtr<Core> = AtomicPtr::new(ptr::null_mut());

/// The core's functions, if resolved.
pub fn get() -> Option<&'static Core> {
    let p = CORE.load(Ordering::Acquire);
    // SAFETY: non-null values come from Box::leak in resolve() and are never freed.
    unsafe { p.as_ref() }
}

/// Forget the core (at `cleanup`: it is about to unload us, and may unload
/// itself afterwards).
pub fn forget() {
    CORE.store(ptr::null_mut(), Ordering::Release);
}

/// Find the core (see the module comment). `caller_ip` is an instruction
/// address inside whoever called `fi_prov_ini`, if known.
pub fn resolve(caller_ip: Option<*const c_void>) -> Option<&'static Core> {
    let core = caller_ip
        .and_then(object_path)
        .and_then(|path| from_object(&path, "object that called fi_prov_ini"))
        // SAFETY: RTLD_DEFAULT is a valid pseudo-handle for dlsym.
        .or_else(|| unsafe { from_handle(libc::RTLD_DEFAULT, "global symbol scope".into()) })
        .or_else(|| from_object("libfabric.so.1", "dlopen(libfabric.so.1, RTLD_NOLOAD)"))
        .or_else(from_loaded_objects)?;
    let leaked: &'static Core = Box::leak(Box::new(core));
    CORE.store(leaked as *const Core as *mut Core, Ordering::Release);
    Some(leaked)
}

/// Instruction address of the nearest caller outside this DSO.
///
/// Called from `fi_prov_ini`, this lands inside the libfabric core that is
/// loading us (whatever its path or link scope).
#[inline(never)]
pub fn foreign_caller() -> Option<*const c_void> {
    let own = own_object_base()?;
    let mut frames = [ptr::null_mut::<c_void>(); 16];
    // SAFETY: the buffer has room for the requested number of frames.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), frames.len() as c_int) };
    frames[..n.max(0) as usize]
        .iter()
        .map(|&ip| ip as *const c_void)
        .find(|&ip| dl_info(ip).is_some_and(|(base, _)| base != own))
}

/// Path of the loaded libunimem-fi.so (to find fi_info.conf next to it).
pub fn own_path() -> Option<PathBuf> {
    dl_info(own_anchor()).map(|(_, path)| PathBuf::from(path))
}

fn own_anchor() -> *const c_void {
    own_object_base as *const c_void
}

fn own_object_base() -> Option<*const c_void> {
    dl_info(own_anchor()).map(|(base, _)| base)
}

/// `dladdr`: (load base, object path) of the object containing `addr`.
fn dl_info(addr: *const c_void) -> Option<(*const c_void, String)> {
    // SAFETY: Dl_info is plain data; all-zero is a valid initial value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only inspects the address and fills `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some((info.dli_fbase as *const c_void, name))
}

fn object_path(addr: *const c_void) -> Option<String> {
    dl_info(addr)
        .map(|(_, path)| path)
        .filter(|p| !p.is_empty())
}

/// Look the functions up in an already-loaded object (never loads one).
fn from_object(path: &str, how: &str) -> Option<Core> {
    let cpath = CString::new(path).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle if the object is already loaded.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: handle is a valid dlopen handle.
    let core = unsafe { from_handle(handle, format!("{how}: {path}")) };
    // SAFETY: balances the dlopen above; the object stays loaded (see module doc).
    unsafe { libc::dlclose(handle) };
    core
}

/// Scan every loaded object (last resort).
fn from_loaded_objects() -> Option<Core> {
    let mut names: Vec<String> = Vec::new();
    unsafe extern "C" fn collect(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our Vec as data.
        let (info, names) = unsafe { (&*info, &mut *(data as *mut Vec<String>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
            if !name.is_empty() {
                names.push(name.into_owned());
            }
        }
        0
    }
    // SAFETY: the callback only reads loader data and appends to `names`.
    unsafe { libc::dl_iterate_phdr(Some(collect), &mut names as *mut Vec<String> as *mut c_void) };
    let own = own_path().map(|p| p.to_string_lossy().into_owned());
    names.retain(|n| Some(n) != own.as_ref());
    // Objects that look like libfabric first; stable order otherwise.
    names.sort_by_key(|n| !n.contains("libfabric"));
    names
        .iter()
        .find_map(|n| from_object(n, "loaded object providing the core API"))
}

/// Resolve every function from `handle`; None unless all required ones exist.
///
/// # Safety
/// `handle` must be a valid dlopen handle or a dlsym pseudo-handle.
unsafe fn from_handle(handle: *mut c_void, found_by: String) -> Option<Core> {
    // SAFETY: caller guarantees the handle; names are NUL-terminated.
    let sym = |name: &[u8]| unsafe {
        let p = libc::dlsym(handle, name.as_ptr() as *const c_char);
        (!p.is_null()).then_some(p)
    };
    // SAFETY: each symbol is the libfabric function of that name; Fn types mirror prototypes.
    unsafe {
        Some(Core {
            version: std::mem::transmute::<*mut c_void, FiVersionFn>(sym(b"fi_version\0")?),
            log_enabled: std::mem::transmute::<*mut c_void, FiLogEnabledFn>(sym(
                b"fi_log_enabled\0",
            )?),
            log: std::mem::transmute::<*mut c_void, FiLogFn>(sym(b"fi_log\0")?),
            param_define: std::mem::transmute::<*mut c_void, FiParamDefineFn>(sym(
                b"fi_param_define\0",
            )?),
            param_get: std::mem::transmute::<*mut c_void, FiParamGetFn>(sym(b"fi_param_get\0")?),
            strerror: sym(b"fi_strerror\0")
                .map(|p| std::mem::transmute::<*mut c_void, FiStrerrorFn>(p)),
            tostr_r: sym(b"fi_tostr_r\0")
                .map(|p| std::mem::transmute::<*mut c_void, FiTostrRFn>(p)),
            layer: (|| {
                Some(LayerFns {
                    getinfo: std::mem::transmute::<*mut c_void, FiGetinfoFn>(sym(b"fi_getinfo\0")?),
                    freeinfo: std::mem::transmute::<*mut c_void, FiFreeinfoFn>(sym(
                        b"fi_freeinfo\0",
                    )?),
                    dupinfo: std::mem::transmute::<*mut c_void, FiDupinfoFn>(sym(b"fi_dupinfo\0")?),
                    fabric: std::mem::transmute::<*mut c_void, FiFabricFn>(sym(b"fi_fabric\0")?),
                })
            })(),
            found_by,
        })
    }
}

impl Core {
    /// The running core's API version.
    pub fn fi_version(&self) -> u32 {
        // SAFETY: fi_version takes no arguments and has no preconditions.
        unsafe { (self.version)() }
    }
}

/// libfabric's text for a (positive or negative) error code.
pub fn strerror(err: c_int) -> String {
    if let Some(f) = get().and_then(|c| c.strerror) {
        // SAFETY: fi_strerror returns a static NUL-terminated string.
        let s = unsafe { f(err.abs()) };
        if !s.is_null() {
            // SAFETY: see above.
            return unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
        }
    }
    format!("error {}", err.abs())
}

/// An enum value (`FI_TYPE_EP_TYPE`, `FI_TYPE_THREADING`, `FI_TYPE_PROGRESS`,
/// `FI_TYPE_AV_TYPE`, `FI_TYPE_ADDR_FORMAT`, `FI_TYPE_MR_MODE`, ...) as
/// libfabric names it, for log lines; the number when the core is unavailable.
pub fn tostr32(value: u32, kind: ffi::fi_type) -> String {
    tostr_raw(&value as *const u32 as *const c_void, kind).unwrap_or_else(|| value.to_string())
}

fn tostr_raw(data: *const c_void, kind: ffi::fi_type) -> Option<String> {
    let f = get()?.tostr_r?;
    let mut buf = [0 as c_char; 1024];
    // SAFETY: buf is writable for its length; `data` is live and as wide as `kind` reads.
    let s = unsafe { f(buf.as_mut_ptr(), buf.len(), data, kind) };
    if s.is_null() {
        return None;
    }
    // SAFETY: fi_tostr_r NUL-terminates within buf.
    let text = unsafe { CStr::from_ptr(s) }
        .to_string_lossy()
        .trim()
        .to_owned();
    (!text.is_empty()).then_some(text)
}

/// Bit mask as libfabric names it (`FI_MSG | FI_TAGGED`), for log lines;
/// hex when the core is unavailable. Only for the 64-bit mask kinds
/// (`FI_TYPE_CAPS`, `FI_TYPE_MODE`, `FI_TYPE_OP_FLAGS`, `FI_TYPE_MSG_ORDER`).
pub fn tostr(value: u64, kind: ffi::fi_type) -> String {
    tostr_raw(&value as *const u64 as *const c_void, kind).unwrap_or_else(|| format!("{value:#x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_object_is_found() {
        // In a unit test "our object" is the test executable.
        assert!(own_path().is_some_and(|p| p.is_file()));
        assert!(own_object_base().is_some());
    }

    #[test]
    fn text_helpers_work_without_a_core() {
        // No libfabric in this process: hex / decimal fallbacks.
        if get().is_none() {
            assert_eq!(tostr(ffi::FI_MSG, ffi::FI_TYPE_CAPS), "0x2");
            assert_eq!(tostr32(3, ffi::FI_TYPE_EP_TYPE), "3");
            assert_eq!(strerror(-ffi::FI_ENOSYS), "error 38");
        }
    }
}
