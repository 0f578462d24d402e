//! The bottom layer: what every libfabric object of ours stands on, and
//! nothing of the provider above it. libfabric's types and error codes
//! (`ffi`) and the core functions found at load time (`core`), both from
//! the `unimem-fi-sys` crate, who we are to
//! the core (`provider`), fid plumbing (`fid`), the panic guard around
//! every entry point (`guard`), logging into `fi_log` (`log`), tunables
//! (`config`), the locks a domain's threading level may elide (`lock`),
//! the lock-free hand-over between the application's calls and the
//! progress agent that the guard keeps (`handover`),
//! the exit-time cleanup of our shared objects (`shutdown`)
//! and the stubs of every entry point we do not implement (`unsupported`).

pub use unimem_fi_sys as ffi;
pub use unimem_fi_sys::core;

pub mod config;
pub mod errdata;
pub mod fid;
pub mod guard;
pub mod handover;
pub mod lock;
pub mod log;
pub mod provider;
pub(crate) mod shutdown;
pub mod unsupported;

/// The network backend's tunables out of the provider's configuration.
pub fn net_settings(cfg: &config::Config) -> unimem_net::Settings<'_> {
    unimem_net::Settings {
        provider: &cfg.net_provider,
        iface: &cfg.net_iface,
        timeout_ms: cfg.net_timeout_ms,
        write_max: cfg.net_write_max,
    }
}

/// What an `int` entry point's return value says, as the tests read it:
/// `Ok` for 0, otherwise its error.
#[cfg(test)]
pub(crate) fn result_of(rc: std::os::raw::c_int) -> ffi::error::Result<()> {
    match isize::try_from(rc).ok().and_then(ffi::Error::from_ret) {
        Some(e) => Err(e),
        None if rc == 0 => Ok(()),
        None => panic!("{rc} is neither 0 nor an error"),
    }
}
