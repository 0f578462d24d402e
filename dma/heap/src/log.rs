//! One-line messages on stderr, written with `write(2)`: the heap has no
//! logging framework (libfabric's is not loaded yet, and must not be).

/// Writes `bytes` to stderr as they are.
pub fn raw(bytes: &[u8]) {
    // SAFETY: write from a valid buffer; a failure is ignored (nowhere to report it).
    let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Writes `unimem-heap: <message>` and a newline.
pub fn line(message: &str) {
    raw(format!("unimem-heap: {message}\n").as_bytes());
}
