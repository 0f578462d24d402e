//! Calls the provider must refuse: `getinfo` with given hints,
//! `close-domain` while in use, `disabled-ep`.

use unimem_fi_sys as ffi;
use unimem_tests::fabric::{Hints, Info, Match, Object, FI_ADDR_UNSPEC};

use super::args::{cap_bit, send_flags, Args};
use super::{fatal, CmdResult, Peer};

impl Peer {
    pub(super) fn getinfo(&mut self, a: &Args) -> CmdResult {
        let mut hints = Hints::default();
        if let Some(caps) = a.opts.get("caps") {
            hints.caps = caps.split('|').map(cap_bit).sum::<Result<u64, _>>()?;
        }
        if let Some(flags) = a.opts.get("tx-flags") {
            hints.tx_op_flags = send_flags(flags)?;
        }
        if let Some(ep) = a.opts.get("ep") {
            hints.ep_type = match *ep {
                "msg" => ffi::FI_EP_MSG,
                "rdm" => ffi::FI_EP_RDM,
                "dgram" => ffi::FI_EP_DGRAM,
                other => return Err(format!("unknown endpoint type {other}")),
            };
        }
        Ok(match Info::get(self.api, &hints) {
            Ok(_) => "0".into(),
            Err(code) => code.to_string(),
        })
    }

    pub(super) fn close_domain(&mut self) -> CmdResult {
        let domain = self.obj.domain.take().expect("domain open");
        match domain.close() {
            Ok(()) => fatal("fi_close(domain) succeeded while its endpoint is open"),
            Err((domain, code)) => {
                self.obj.domain = Some(domain);
                Ok(code.to_string())
            }
        }
    }

    pub(super) fn disabled_ep(&mut self) -> CmdResult {
        let domain = self.obj.domain.as_ref().expect("domain open");
        let ep = domain
            .endpoint(&self.obj.info)
            .map_err(|c| format!("fi_endpoint: {c}"))?;
        // Leaked: should the provider wrongly accept a receive, the buffer
        // must outlive the endpoint.
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 64].into_boxed_slice());
        let ptr = buf.as_mut_ptr();
        let tag = Match {
            tag: Some(1),
            data: None,
        };
        // SAFETY: 64 bytes at ptr, alive forever.
        let unbound = unsafe { ep.send(ptr, 8, 0, Match::default(), 1) };
        ep.bind(&self.obj.av, 0)
            .map_err(|c| format!("bind av: {c}"))?;
        ep.bind(&self.obj.cq, ffi::FI_TRANSMIT | ffi::FI_RECV)
            .map_err(|c| format!("bind cq: {c}"))?;
        // SAFETY: as above.
        let results = unsafe {
            [
                ("unbound", unbound),
                ("send", ep.send(ptr, 8, 0, Match::default(), 2)),
                ("tsend", ep.send(ptr, 8, 0, tag, 3)),
                ("inject", ep.inject(ptr, 8, 0, Match::default())),
                ("recv", ep.recv(ptr, 64, FI_ADDR_UNSPEC, None, 4)),
                ("trecv", ep.recv(ptr, 64, FI_ADDR_UNSPEC, Some((1, 0)), 5)),
            ]
        };
        ep.close()
            .map_err(|(_, c)| format!("fi_close(second ep): {c}"))?;
        Ok(results
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "))
    }
}
