//! The tunables as libfabric parameters: defined at load (so `fi_info -e`
//! lists them), read through `fi_param_get` (`FI_UNIMEM_<NAME>`), and the
//! configuration file's path.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::c_char;
use std::path::PathBuf;

use super::{CONF_FILE_NAME, CONF_PARAM, TUNABLES};
use crate::base::core;
use crate::base::ffi;
use crate::base::provider;

/// `FI_UNIMEM_<NAME>`.
pub fn env_name(name: &str) -> String {
    format!("FI_{}_{}", provider::NAME, name).to_ascii_uppercase()
}

/// Register every tunable (and the file path) as a libfabric parameter.
/// Called from `fi_prov_ini`, so `fi_info -e` lists them.
pub fn define_params() {
    let Some(core) = core::get() else { return };
    let conf_help = format!(
        "path of the unimem configuration file (default: {CONF_FILE_NAME} next to libunimem-fi.so)"
    );
    let params = TUNABLES
        .iter()
        .map(|t| (t.name, t.param_help()))
        .chain(std::iter::once((CONF_PARAM, conf_help)));
    for (name, help) in params {
        let (Ok(cname), Ok(chelp)) = (CString::new(name), CString::new(help)) else {
            continue;
        };
        // SAFETY: NUL-terminated strings that outlive the call; "%s" consumes the one argument.
        let rc = unsafe {
            (core.param_define)(
                provider::provider(),
                cname.as_ptr(),
                ffi::FI_PARAM_STRING,
                c"%s".as_ptr(),
                chelp.as_ptr(),
            )
        };
        if rc != 0 {
            tracing::warn!("fi_param_define({name}) failed: {}", core::strerror(rc));
        }
    }
}

/// The raw environment text of a parameter, through libfabric when possible.
pub(super) fn param_text(name: &str) -> Option<String> {
    // fi_param_get logs an INFO line for every unset variable; skip the
    // call (and the noise) when the variable is not in the environment.
    std::env::var_os(env_name(name))?;
    if let Some(core) = core::get() {
        let cname = CString::new(name).ok()?;
        let mut value: *mut c_char = std::ptr::null_mut();
        // SAFETY: a string parameter stores a `char *` into `value`.
        let rc = unsafe {
            (core.param_get)(
                provider::provider_mut(),
                cname.as_ptr(),
                &mut value as *mut *mut c_char as *mut c_void,
            )
        };
        if rc == 0 && !value.is_null() {
            // SAFETY: the core returns a pointer into the environment.
            return Some(
                unsafe { CStr::from_ptr(value) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        // -FI_ENOENT: not defined with this core (should not happen); read
        // the environment ourselves so the setting is not silently lost.
        if rc != -ffi::FI_ENOENT {
            return None;
        }
    }
    std::env::var(env_name(name)).ok()
}

/// Where the configuration file is, if anywhere.
pub(super) fn conf_path() -> Option<PathBuf> {
    if let Some(path) = param_text(CONF_PARAM).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let next_to_lib = core::own_path()?.parent()?.join(CONF_FILE_NAME);
    next_to_lib.is_file().then_some(next_to_lib)
}
