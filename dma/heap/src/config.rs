//! The heap's tunables, read from the environment once, with the names and
//! syntax of the provider's (`FI_UNIMEM_<NAME>`, sizes with `k`, `m`, `g`,
//! `t`). The heap reads the environment only, not `fi_info.conf`: it is
//! loaded before anything knows where the provider and its file are.
//!
//! - `FI_UNIMEM_HEAP_THRESHOLD` (default 1: every allocation):
//!   allocations of at least this many bytes come from the dmable region,
//!   smaller ones from the system allocator;
//! - `FI_UNIMEM_HEAP_MAX_SIZE` (default 768m): the most the heap's segments
//!   may take of the region (the rest stays for the provider's buffers);
//! - `FI_UNIMEM_JOB`, `FI_UNIMEM_DMA_SEGMENT_SIZE`, `FI_UNIMEM_DMA_MAX_SIZE`:
//!   the provider's, for the region (same defaults: default, 64m, 1g).

use std::ffi::CStr;

use unimem_dma::RegionConfig;
use unimem_mailbox::JobId;

pub const DEFAULT_THRESHOLD: usize = 1;
pub const DEFAULT_HEAP_MAX: usize = 768 << 20;

#[derive(Clone, Debug)]
pub struct Config {
    pub heap_max: usize,
    pub region: RegionConfig,
}

/// The raw text of `FI_UNIMEM_<name>`, without allocating (usable from the
/// first `malloc` of the process).
fn env(name: &CStr) -> Option<&'static str> {
    // SAFETY: getenv with a NUL-terminated name; the result points into the
    // environment, which nobody frees in this process's life for our
    // purposes (we copy what we keep before returning).
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    unsafe { CStr::from_ptr(value) }.to_str().ok()
}

/// `"64m"` → 64 MiB: the provider's size syntax (suffix k/m/g/t,
/// case-insensitive, optionally followed by `b` or `ib`).
pub fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let (num, suffix) = text.split_at(digits);
    let num: u64 = num.parse().ok()?;
    let suffix = suffix.trim().to_ascii_lowercase();
    let unit = suffix
        .strip_suffix("ib")
        .or_else(|| suffix.strip_suffix('b'))
        .unwrap_or(&suffix);
    let shift = match unit {
        "" if suffix != "ib" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    usize::try_from(num.checked_mul(1u64 << shift)?).ok()
}

/// [`size`] in `min..=max`: outside, a line on stderr and the default.
fn bounded_size(name: &CStr, default: usize, min: usize, max: usize) -> usize {
    let value = size(name, default);
    if (min..=max).contains(&value) {
        return value;
    }
    crate::log::line(&format!(
        "{}={value} is outside {min}..={max}; using {default}",
        name.to_string_lossy()
    ));
    default
}

fn size(name: &CStr, default: usize) -> usize {
    match env(name) {
        None => default,
        Some(text) => parse_size(text).unwrap_or_else(|| {
            crate::log::line(&format!(
                "{}={text} is not a size; using {default}",
                name.to_string_lossy()
            ));
            default
        }),
    }
}

/// The provider's job-name rule: 1 to 64 characters from `[A-Za-z0-9._-]`.
fn valid_job(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Config {
    /// Only the threshold: what every allocation needs to know. Allocates
    /// nothing.
    pub fn threshold_from_env() -> usize {
        env(c"FI_UNIMEM_HEAP_THRESHOLD")
            .and_then(parse_size)
            .unwrap_or(DEFAULT_THRESHOLD)
            .max(1)
    }

    /// Everything, when the region is first needed.
    pub fn from_env() -> Config {
        let job = match env(c"FI_UNIMEM_JOB").map(str::trim) {
            None => "default".to_string(),
            Some(text) if valid_job(text) => text.to_string(),
            Some(text) => {
                crate::log::line(&format!(
                    "FI_UNIMEM_JOB={text} is not a name of 1-64 characters from [A-Za-z0-9._-]; using default"
                ));
                "default".to_string()
            }
        };
        // The provider's ranges (`fi_info.conf`), so that both agree.
        let segment_size = bounded_size(
            c"FI_UNIMEM_DMA_SEGMENT_SIZE",
            64 << 20,
            unimem_dma::SEGMENT_SIZE_MIN,
            unimem_dma::SEGMENT_SIZE_MAX,
        );
        let max_size = bounded_size(
            c"FI_UNIMEM_DMA_MAX_SIZE",
            1 << 30,
            unimem_dma::REGION_SIZE_MIN,
            unimem_dma::REGION_SIZE_MAX,
        )
        .max(segment_size);
        Config {
            heap_max: size(c"FI_UNIMEM_HEAP_MAX_SIZE", DEFAULT_HEAP_MAX),
            region: RegionConfig {
                job: JobId::from_name(&job),
                segment_size,
                max_size,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_the_provider_parses_them() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("64KiB"), Some(64 << 10));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("12b"), Some(12));
        assert_eq!(parse_size("12ib"), None);
        assert_eq!(parse_size("k"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999t"), None);
        assert!(valid_job("mpi-1.x_2"));
        assert!(!valid_job("a/b"));
    }
}
