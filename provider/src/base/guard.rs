//! No Rust panic may unwind into C: every `extern "C"` entry point runs its
//! body through one of these guards.

use std::any::Any;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::base::ffi::ret;

/// Run `body`; a panic becomes `-FI_EOTHER` (and a FI_WARN line).
pub fn ffi_guard<F: FnOnce() -> c_int>(entry: &'static str, body: F) -> c_int {
    ffi_guard_or(entry, ret::EOTHER, body)
}

/// Like [`ffi_guard`] for entry points that return something other than an
/// error code: `on_panic` is returned instead.
///
/// Every entry point also counts as an application call for the progress
/// agent, which stays out of the provider meanwhile (`base/handover.rs`).
#[inline(always)]
pub fn ffi_guard_or<T, F: FnOnce() -> T>(entry: &'static str, on_panic: T, body: F) -> T {
    let _call = crate::base::handover::AppCall::enter();
    // AssertUnwindSafe: after a panic we only report an error; the objects the
    // body touched are left as they are, which is what a C error return means.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            // Logging must not panic again while we are handling a panic.
            let _ = catch_unwind(AssertUnwindSafe(|| {
                let msg = panic_message(&*payload);
                tracing::warn!(target: "unimem_fi::core", "panic in {entry}: {msg}");
            }));
            on_panic
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(non-string panic payload)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_becomes_eother() {
        let rc = ffi_guard("test", || panic!("boom"));
        assert_eq!(rc, ret::EOTHER);
    }

    #[test]
    fn value_passes_through() {
        assert_eq!(ffi_guard("test", || 7), 7);
        assert_eq!(ffi_guard_or("test", 0u8, || 3u8), 3);
    }
}
