//! Endpoint address strings (FI_ADDR_STR).
//!
//! Isolated on purpose: this will become the mailbox crate's address type.

/// The well-known address of `service` in job `job`:
/// `unimem://<job>/svc/<service>`.
pub fn service_address(job: &str, service: &str) -> Option<String> {
    if job.is_empty() || service.is_empty() || service.contains(['/', '\0']) {
        return None;
    }
    Some(format!("unimem://{job}/svc/{service}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format() {
        assert_eq!(
            service_address("default", "9228").as_deref(),
            Some("unimem://default/svc/9228")
        );
        assert_eq!(service_address("default", ""), None);
        assert_eq!(service_address("default", "a/b"), None);
    }
}
