//! `fi_getinfo` for unimem: match the hints (attr/), work out addresses,
//! and hand back a C `fi_info` list the core can free.
//!
//! Memory: the application frees our list with `fi_freeinfo`, which is plain
//! `free()` on the info, each attribute struct, the names and the addresses,
//! and may `fi_dupinfo` it with the *core's* struct sizes. So everything is
//! allocated with libc `calloc`/`strdup`/`malloc`, and every struct is
//! over-allocated (zeroed) beyond its 1.17 size: a 2.x core copies the
//! fields appended since (domain_attr grew by 40 bytes from 1.20 to 2.x,
//! ep_attr by a pointer), which then read as zero/NULL. `nic` and `prov_name` stay NULL
//! (the core fills in `prov_name`).
//!
//! Addresses (FI_ADDR_STR, length including the NUL):
//! - `service` given: `addr::service_address(job, service)`, which becomes
//!   `src_addr` with FI_SOURCE and `dest_addr` without;
//! - with FI_SOURCE, hints' `dest_addr` is passed through; without it,
//!   hints' `src_addr` (and `dest_addr` if neither node nor service);
//! - `src_addr` is always set (fabtests' getinfo_test requires it): if
//!   nothing above provides one, it is this process's anonymous address,
//!   `service_address(job, "pid<pid>")`.
//! - `node`: unimem reaches the processes of this host only, so a node must
//!   name this host (localhost, a local address, or the host name); anything
//!   else, or an unresolvable name, is -FI_ENODATA (fabtests' `fi_rdm
//!   g00n13s` checks exactly this). Node without service selects no
//!   particular endpoint.
//! - FI_SOURCE with neither node nor service is -FI_EINVAL (as prov/util).

use std::ffi::{c_void, CString};
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};
use std::os::raw::{c_char, c_int};
use std::ptr;

use crate::base::config::{self, Config};
use crate::base::ffi::{self, Error, FI_NUMERICHOST, FI_SOURCE};
use crate::base::provider;
use crate::info::addr;
use crate::info::attr::{self, Hints, Info};

/// Internal flags (include/ofi.h: OFI_GETINFO_INTERNAL, OFI_CORE_PROV_ONLY,
/// unchanged from 1.x to 2.x) marking a utility provider's probe.
const LAYERING_PROBE: u64 = (1 << 58) | (1 << 59);

/// Zeroed room after each struct for fields appended by later libfabric
/// versions (2.x adds at most 48 bytes so far).
const STRUCT_PAD: usize = 256;

/// Answer one `fi_getinfo` call: a one-entry list, or an error
/// (FI_ENODATA when the hints or node cannot be met, with a log line).
pub fn getinfo(
    version: u32,
    node: Option<&str>,
    service: Option<&str>,
    flags: u64,
    hints: Option<&ffi::fi_info>,
) -> Result<*mut ffi::fi_info, Error> {
    let cfg = config::get();
    // SAFETY: the core passes hints that are NULL or a valid fi_info.
    let hints = hints.map(|h| unsafe { Hints::from_c(h) });
    // Loud when an application asked for unimem by name; quiet when a
    // utility provider (rxm, rxd) probes whether it can layer on us.
    let loud = flags & LAYERING_PROBE == 0 && hints.as_ref().is_some_and(Hints::names_us);
    let no_match = |why: String| {
        if loud {
            tracing::warn!("fi_getinfo: no match: {why}");
        } else {
            tracing::info!("fi_getinfo: no match: {why}");
        }
        Error::ENODATA
    };

    if flags & FI_SOURCE != 0 && node.is_none() && service.is_none() {
        tracing::info!("fi_getinfo: FI_SOURCE without node or service");
        return Err(Error::EINVAL);
    }
    if let Some(node) = node {
        if !node_is_local(node, flags & FI_NUMERICHOST != 0) {
            return Err(no_match(format!(
                "node '{node}' is not this host (unimem reaches processes on this host only)"
            )));
        }
    }
    let ours = attr::template(&cfg);
    if let Some(h) = &hints {
        attr::check(version, &ours, h).map_err(|m| no_match(m.to_string()))?;
    }
    let info = attr::tailor(version, &ours, hints.as_ref());
    let (src, dest) = addresses(&cfg, service, flags, hints.as_ref()).map_err(no_match)?;
    let show = |a: &[u8]| String::from_utf8_lossy(a.strip_suffix(&[0]).unwrap_or(a)).into_owned();
    tracing::debug!(
        "fi_getinfo: match (api {}.{}), src {}, dest {}",
        version >> 16,
        version & 0xffff,
        show(&src),
        dest.as_deref().map_or_else(|| "none".to_owned(), show)
    );
    CInfo::build(&info, &src, dest.as_deref())
        .map(CInfo::into_raw)
        .ok_or(Error::ENOMEM)
}

/// (src_addr, dest_addr) as NUL-terminated strings (see the module doc).
fn addresses(
    cfg: &Config,
    service: Option<&str>,
    flags: u64,
    hints: Option<&Hints>,
) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    let service_addr = |s: &str| {
        addr::service_address(&cfg.job, s)
            .map(nul_terminated)
            .ok_or_else(|| format!("service '{s}' cannot name a unimem endpoint"))
    };
    let from_hints = |pick: fn(&Hints) -> &Option<Vec<u8>>| {
        hints.and_then(|h| pick(h).clone()).map(nul_terminated)
    };
    let (src, dest) = if flags & FI_SOURCE != 0 {
        (
            service.map(service_addr).transpose()?,
            from_hints(|h| &h.dest_addr),
        )
    } else {
        let dest = match service {
            Some(s) => Some(service_addr(s)?),
            None => from_hints(|h| &h.dest_addr),
        };
        (from_hints(|h| &h.src_addr), dest)
    };
    let src = match src {
        Some(s) => s,
        None => service_addr(&format!("pid{}", std::process::id()))?,
    };
    Ok((src, dest))
}

/// Text (or an application's address bytes) ending in exactly one NUL.
fn nul_terminated(s: impl Into<Vec<u8>>) -> Vec<u8> {
    let mut v: Vec<u8> = s.into();
    if let Some(end) = v.iter().position(|&b| b == 0) {
        v.truncate(end);
    }
    v.push(0);
    v
}

/// Does `node` name this host?
/// With FI_NUMERICHOST only an address literal is accepted.
pub(crate) fn node_is_local(node: &str, numeric_only: bool) -> bool {
    let local = local_addresses();
    let is_local = |ip: &IpAddr| ip.is_loopback() || ip.is_unspecified() || local.contains(ip);
    if let Ok(ip) = node.parse::<IpAddr>() {
        return is_local(&ip);
    }
    if numeric_only {
        return false;
    }
    if node.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Some(host) = host_name() {
        let short = host.split('.').next().unwrap_or(&host);
        if node.eq_ignore_ascii_case(&host) || node.eq_ignore_ascii_case(short) {
            return true;
        }
    }
    match (node, 0u16).to_socket_addrs() {
        Ok(mut addrs) => addrs.any(|a| is_local(&a.ip())),
        Err(_) => false,
    }
}

fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for len - 1 bytes, so its last byte stays NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&buf[..end]).ok().map(str::to_owned)
}

/// Addresses of this host's interfaces.
fn local_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr is a sockaddr whose family names its concrete type.
            unsafe {
                match (*ifa.ifa_addr).sa_family as c_int {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

// ---------------------------------------------------------------------------
// C allocation

/// An `fi_info` under construction; freed (like `fi_freeinfo`) unless
/// handed over with [`CInfo::into_raw`].
struct CInfo(*mut ffi::fi_info);

/// Zeroed `T` plus [`STRUCT_PAD`] bytes, from the C allocator.
fn calloc_struct<T>() -> Option<*mut T> {
    // SAFETY: plain allocation; a null result is handled.
    let p = unsafe { libc::calloc(1, size_of::<T>() + STRUCT_PAD) } as *mut T;
    (!p.is_null()).then_some(p)
}

fn c_strdup(s: &str) -> Option<*mut c_char> {
    let c = CString::new(s).ok()?;
    // SAFETY: c is NUL-terminated.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn c_memdup(bytes: &[u8]) -> Option<*mut c_void> {
    // SAFETY: plain allocation of at least one byte; a null result is handled.
    let p = unsafe { libc::malloc(bytes.len().max(1)) } as *mut u8;
    if p.is_null() {
        return None;
    }
    // SAFETY: p has room for bytes.len() bytes and does not overlap `bytes`.
    unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    Some(p as *mut c_void)
}

impl CInfo {
    fn build(info: &Info, src: &[u8], dest: Option<&[u8]>) -> Option<CInfo> {
        let c = CInfo(calloc_struct::<ffi::fi_info>()?);
        // Each attribute pointer is stored before it is written through, so
        // Drop frees whatever was allocated if we bail out half-way.
        // SAFETY: c.0 and its attribute structs are fresh, zeroed and unshared.
        unsafe {
            let fi = &mut *c.0;
            fi.caps = info.caps;
            fi.mode = info.mode;
            fi.addr_format = info.addr_format;

            fi.src_addr = c_memdup(src)?;
            fi.src_addrlen = src.len();
            if let Some(dest) = dest {
                fi.dest_addr = c_memdup(dest)?;
                fi.dest_addrlen = dest.len();
            }

            fi.tx_attr = calloc_struct()?;
            info.tx.to_c(&mut *fi.tx_attr);
            fi.rx_attr = calloc_struct()?;
            info.rx.to_c(&mut *fi.rx_attr);
            fi.ep_attr = calloc_struct()?;
            info.ep.to_c(&mut *fi.ep_attr);

            fi.domain_attr = calloc_struct()?;
            info.domain.to_c(&mut *fi.domain_attr);
            (*fi.domain_attr).name =
                c_strdup(info.domain.name.as_deref().unwrap_or(provider::NAME))?;

            fi.fabric_attr = calloc_struct()?;
            let fab = &mut *fi.fabric_attr;
            fab.name = c_strdup(info.fabric.name.as_deref().unwrap_or(provider::NAME))?;
            fab.prov_version = provider::PROVIDER_VERSION;
            fab.api_version = info.fabric.api_version;
        }
        Some(c)
    }

    fn into_raw(self) -> *mut ffi::fi_info {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for CInfo {
    fn drop(&mut self) {
        // SAFETY: everything reachable from self.0 is NULL or C-allocated by `build`, and unshared.
        unsafe {
            let fi = &mut *self.0;
            libc::free(fi.src_addr);
            libc::free(fi.dest_addr);
            libc::free(fi.tx_attr as *mut c_void);
            libc::free(fi.rx_attr as *mut c_void);
            libc::free(fi.ep_attr as *mut c_void);
            if let Some(d) = fi.domain_attr.as_mut() {
                libc::free(d.name as *mut c_void);
            }
            libc::free(fi.domain_attr as *mut c_void);
            if let Some(f) = fi.fabric_attr.as_mut() {
                libc::free(f.name as *mut c_void);
                libc::free(f.prov_name as *mut c_void);
            }
            libc::free(fi.fabric_attr as *mut c_void);
            libc::free(self.0 as *mut c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn cfg() -> Config {
        Config::defaults()
    }

    fn text(v: &[u8]) -> &str {
        CStr::from_bytes_with_nul(v).unwrap().to_str().unwrap()
    }

    /// The address getinfo gives `service` in the default job.
    fn svc(service: &str) -> String {
        addr::service_address("default", service).unwrap()
    }

    #[test]
    fn source_and_destination() {
        let (src, dest) = addresses(&cfg(), Some("9228"), FI_SOURCE, None).unwrap();
        assert_eq!(text(&src), svc("9228"));
        assert!(svc("9228").ends_with("/svc/9228"));
        assert_eq!(dest, None);

        let (src, dest) = addresses(&cfg(), Some("9228"), 0, None).unwrap();
        assert_eq!(text(&dest.unwrap()), svc("9228"));
        assert_eq!(text(&src), svc(&format!("pid{}", std::process::id())));

        let (src, dest) = addresses(&cfg(), None, 0, None).unwrap();
        assert_eq!(text(&src), svc(&format!("pid{}", std::process::id())));
        assert_eq!(dest, None);
    }

    #[test]
    fn hint_addresses_pass_through() {
        let hints = Hints {
            src_addr: Some(b"unimem://default/svc/mine".to_vec()), // no NUL: added
            dest_addr: Some(b"unimem://default/svc/peer\0".to_vec()),
            ..Hints::default()
        };
        let (src, dest) = addresses(&cfg(), None, 0, Some(&hints)).unwrap();
        assert_eq!(text(&src), "unimem://default/svc/mine");
        assert_eq!(text(&dest.unwrap()), "unimem://default/svc/peer");
        // With FI_SOURCE, the service wins for src, hints' dest is kept.
        let (src, dest) = addresses(&cfg(), Some("1"), FI_SOURCE, Some(&hints)).unwrap();
        assert_eq!(text(&src), svc("1"));
        assert_eq!(text(&dest.unwrap()), "unimem://default/svc/peer");
    }

    #[test]
    fn local_nodes() {
        assert!(node_is_local("localhost", false));
        assert!(node_is_local("127.0.0.1", true));
        assert!(node_is_local("::1", false));
        assert!(!node_is_local("192.0.2.1", true)); // TEST-NET-1, never local
        assert!(!node_is_local("localhost", true));
        assert!(!node_is_local("no-such-host.invalid", false));
        if let Some(h) = host_name() {
            assert!(node_is_local(&h, false));
        }
    }

    #[test]
    fn c_info_layout_and_free() {
        let info = attr::tailor(ffi::fi_version(1, 17), &attr::template(&cfg()), None);
        let c = CInfo::build(&info, b"a\0", Some(b"bb\0")).unwrap();
        // SAFETY: c.0 was just built and is valid.
        unsafe {
            let fi = &*c.0;
            assert_eq!(fi.src_addrlen, 2);
            assert_eq!(fi.dest_addrlen, 3);
            assert_eq!((*fi.ep_attr).type_, ffi::FI_EP_RDM);
            assert_eq!(
                CStr::from_ptr((*fi.domain_attr).name).to_str(),
                Ok("unimem")
            );
            assert_eq!(
                CStr::from_ptr((*fi.fabric_attr).name).to_str(),
                Ok("unimem")
            );
            assert!((*fi.fabric_attr).prov_name.is_null());
            assert!(fi.nic.is_null());
            assert!(fi.next.is_null());
        }
        drop(c); // frees everything (checked under valgrind/ASan by hand)
    }
}
