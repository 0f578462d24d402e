//! Endpoint address strings (FI_ADDR_STR).
//!
//! An address is the canonical text of a [`MailboxAddr`]:
//! `unimem://<job hex>/<pid>.<nonce hex>/<index>` for an endpoint's own
//! mailbox, `unimem://<job hex>/svc/<service>` for a well-known one. An
//! endpoint whose process has a network interface (the network backend)
//! adds it, `@<ipv4>:<port>`, for peers of other hosts; an address of this
//! host's interface is taken without it (see `unimem_net::canonical`).

use unimem_mailbox::{JobId, MailboxAddr};

/// Longest address, in bytes, including the terminating NUL. MPICH hands
/// `fi_getname` a 64-byte buffer; the canonical text takes at most 62.
pub const MAX_ADDR_LEN: usize = 64;

/// The well-known address of `service` in job `job` (the configured job
/// name): `MailboxAddr::for_service` as text. None for an empty name.
pub fn service_address(job: &str, service: &str) -> Option<String> {
    if job.is_empty() || service.is_empty() {
        return None;
    }
    Some(MailboxAddr::for_service(JobId::from_name(job), service).to_string())
}

/// Parse an address as the application gave it (the bytes before the NUL).
pub fn parse(text: &[u8]) -> Option<MailboxAddr> {
    if text.len() >= MAX_ADDR_LEN {
        return None;
    }
    let addr: MailboxAddr = std::str::from_utf8(text).ok()?.parse().ok()?;
    if addr.node.nic.is_none() {
        // A node of this host: nothing to canonicalize (and no settings to read).
        return Some(addr);
    }
    Some(unimem_net::canonical(
        addr,
        &crate::base::net_settings(&crate::base::config::get()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format() {
        let job = JobId::from_name("default");
        assert_eq!(
            service_address("default", "9228"),
            Some(format!("unimem://{job}/svc/9228"))
        );
        let named = service_address("default", "pid42").unwrap();
        assert_eq!(
            named,
            MailboxAddr::for_service(job, "pid42").to_string(),
            "names hash to an index"
        );
        assert_eq!(service_address("default", ""), None);
        assert_eq!(service_address("", "1"), None);
    }

    #[test]
    fn parse_round_trip_and_limits() {
        let text = service_address("j", "7").unwrap();
        let addr = parse(text.as_bytes()).unwrap();
        assert_eq!(addr.to_string(), text);
        assert!(text.len() < MAX_ADDR_LEN);
        assert_eq!(parse(b"tcp://1.2.3.4"), None);
        assert_eq!(parse(&[0xff, 0xfe]), None);
        let long = format!("{text}{}", "0".repeat(MAX_ADDR_LEN));
        assert_eq!(parse(long.as_bytes()), None);
    }
}
