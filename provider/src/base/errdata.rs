//! What the error entries of CQs and EQs share: handing error data to the
//! application the way its API version expects, and the text of a provider
//! error code (`fi_cq_strerror`, `fi_eq_strerror`).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

use crate::base::core;
use crate::base::ffi;

const V1_5: u32 = ffi::fi_version(1, 5);

/// Where `fi_cq_readerr`/`fi_eq_readerr` put error data: the application's
/// buffer when it offers one (API >= 1.5, `err_data_size` > 0), otherwise
/// `saved`, which the queue keeps until the next error read. Returns the
/// (pointer, size) to report.
///
/// # Safety
/// `user_buf` must be NULL or writable for `user_size` bytes.
pub unsafe fn deliver_err_data(
    api: u32,
    user_buf: *mut c_void,
    user_size: usize,
    data: Vec<u8>,
    saved: &mut Vec<u8>,
) -> (*mut c_void, usize) {
    if !ffi::fi_version_lt(api, V1_5) && user_size > 0 && !user_buf.is_null() {
        let n = user_size.min(data.len());
        // SAFETY: user_buf is writable for user_size >= n bytes (caller).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), user_buf as *mut u8, n) };
        return (user_buf, n);
    }
    *saved = data;
    if saved.is_empty() {
        (ptr::null_mut(), 0)
    } else {
        (saved.as_mut_ptr() as *mut c_void, saved.len())
    }
}

/// Text for a provider error code (`fi_cq_strerror`, `fi_eq_strerror`),
/// copied into `buf` when the application gives one.
///
/// # Safety
/// `buf` must be NULL or writable for `len` bytes.
pub unsafe fn strerror(prov_errno: c_int, buf: *mut c_char, len: usize) -> *const c_char {
    let core_text = core::get()
        .and_then(|c| c.strerror)
        // SAFETY: fi_strerror accepts any code and returns a static string.
        .map(|f| unsafe { f(prov_errno.saturating_abs()) })
        .filter(|p| !p.is_null());
    let text = core_text.unwrap_or(c"unimem: provider error".as_ptr());
    if buf.is_null() || len == 0 {
        return text;
    }
    // SAFETY: text is a NUL-terminated static string.
    let bytes = unsafe { CStr::from_ptr(text) }.to_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: buf is writable for len > n bytes (caller); the regions are distinct.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strerror_copies_and_truncates() {
        let mut buf = [0x55 as c_char; 4];
        // SAFETY: buf holds 4 bytes.
        let p = unsafe { strerror(ffi::FI_EIO, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(p, buf.as_ptr());
        assert_eq!(buf[3], 0);
        // SAFETY: no buffer: a static string comes back.
        let s = unsafe { CStr::from_ptr(strerror(ffi::FI_EIO, ptr::null_mut(), 0)) };
        assert!(!s.to_bytes().is_empty());
    }
}
