//! The libfabric objects of the process (fabric, domain, AV, CQ, endpoint,
//! counters) and the buffers that operations in flight own.

use std::collections::HashMap;

use unimem_fi_sys as ffi;
use unimem_tests::fabric::{Api, Av, Cntr, Cq, Domain, Ep, Fabric, Hints, Info, Mr, Object};

use super::args::send_flags;
use super::{GUARD, GUARD_BYTE};

/// A registered region: `len` bytes between two guards of `GUARD` bytes,
/// in `mem`.
pub(super) struct Region {
    pub(super) key: u64,
    pub(super) mr: Mr,
    pub(super) mem: Vec<u8>,
    pub(super) len: usize,
}

impl Region {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.mem[GUARD..GUARD + self.len]
    }

    pub(super) fn guards_intact(&self) -> bool {
        let (before, rest) = self.mem.split_at(GUARD);
        before
            .iter()
            .chain(&rest[self.len..])
            .all(|&b| b == GUARD_BYTE)
    }
}

/// CPU time of the whole process (every thread), in milliseconds.
pub(super) fn process_cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// The counters of `$FABRIC_PEER_CNTR`: completed writes and reads (with
/// `msg`: sends in `write`, receives in `read`).
pub(super) struct Counters {
    pub(super) write: Cntr,
    pub(super) read: Cntr,
}

impl Counters {
    /// `write`, `write-err`, `read`, `read-err`.
    pub(super) fn values(&self) -> [u64; 4] {
        [
            self.write.read(),
            self.write.read_err(),
            self.read.read(),
            self.read.read_err(),
        ]
    }
}

const CNTR_NAMES: [&str; 4] = ["write", "write-err", "read", "read-err"];
const MSG_CNTR_NAMES: [&str; 4] = ["send", "send-err", "recv", "recv-err"];

/// The libfabric objects of the process, in closing order.
pub(super) struct Objects {
    pub(super) ep: Ep,
    /// Registered regions (a key may appear twice should the provider
    /// wrongly accept a duplicate).
    pub(super) mrs: Vec<Region>,
    pub(super) cntrs: Option<Counters>,
    /// How `cntr` names the values of `cntrs`.
    pub(super) cntr_names: [&'static str; 4],
    /// `$FABRIC_PEER_RMA_EVENT`: counters bound with `FI_REMOTE_WRITE` and
    /// `FI_REMOTE_READ` (in `write` and `read`).
    pub(super) remote_cntrs: Option<Counters>,
    /// Counters of `mr-cntr` (closed after the regions they are bound to).
    pub(super) mr_cntrs: Vec<Cntr>,
    pub(super) cq: Cq,
    pub(super) av: Av,
    /// `None` only while `close-domain` tries to close it.
    pub(super) domain: Option<Domain>,
    fabric: Fabric,
    pub(super) info: Info,
}

impl Objects {
    pub(super) fn open(api: &'static Api) -> Result<Objects, String> {
        let step =
            |what: &str, code: i32| format!("{what}: {code} ({})", api.strerror(code as isize));
        // "mr": FI_RMA_EVENT with counters on regions only (`mr-cntr`).
        let rma_event_var = std::env::var("FABRIC_PEER_RMA_EVENT").unwrap_or_default();
        let rma_event = rma_event_var == "1" || rma_event_var == "mr";
        let mut hints = Hints {
            tx_op_flags: send_flags(&std::env::var("FABRIC_PEER_TX_OP_FLAGS").unwrap_or_default())?,
            ..Hints::default()
        };
        if rma_event {
            hints.caps |= ffi::FI_RMA_EVENT;
        }
        if std::env::var("FABRIC_PEER_PROGRESS").as_deref() == Ok("auto") {
            hints.progress = ffi::FI_PROGRESS_AUTO;
        }
        hints.threading = match std::env::var("FABRIC_PEER_THREADING").as_deref() {
            Ok("domain") => ffi::FI_THREAD_DOMAIN,
            Ok("safe") => ffi::FI_THREAD_SAFE,
            _ => ffi::FI_THREAD_UNSPEC,
        };
        let info = Info::get(api, &hints).map_err(|c| step("fi_getinfo", c))?;
        if info.prov_name() != "unimem" {
            return Err(format!("fi_getinfo gave provider {}", info.prov_name()));
        }
        let fabric = Fabric::open(&info).map_err(|c| step("fi_fabric", c))?;
        let domain = fabric.domain(&info).map_err(|c| step("fi_domain", c))?;
        let av = domain.av().map_err(|c| step("fi_av_open", c))?;
        let cq_wait = match std::env::var("FABRIC_PEER_CQ_WAIT").as_deref() {
            Ok("unspec") => ffi::FI_WAIT_UNSPEC,
            _ => ffi::FI_WAIT_NONE,
        };
        let cq = domain
            .cq_waiting_on(cq_wait)
            .map_err(|c| step("fi_cq_open", c))?;
        let cntr_wait = match std::env::var("FABRIC_PEER_CNTR_WAIT").as_deref() {
            Ok("unspec") => ffi::FI_WAIT_UNSPEC,
            _ => ffi::FI_WAIT_NONE,
        };
        // What the two counters count: as bound, and as `cntr` names them.
        let (cntr_flags, cntr_names) = match std::env::var("FABRIC_PEER_CNTR").as_deref() {
            Ok("1") => (Some((ffi::FI_WRITE, ffi::FI_READ)), CNTR_NAMES),
            Ok("msg") => (Some((ffi::FI_SEND, ffi::FI_RECV)), MSG_CNTR_NAMES),
            _ => (None, CNTR_NAMES),
        };
        let cntrs = match cntr_flags {
            Some(_) => Some(Counters {
                write: domain
                    .cntr_waiting_on(cntr_wait)
                    .map_err(|c| step("fi_cntr_open", c))?,
                read: domain
                    .cntr_waiting_on(cntr_wait)
                    .map_err(|c| step("fi_cntr_open", c))?,
            }),
            None => None,
        };
        let remote_cntrs = match rma_event_var == "1" {
            true => Some(Counters {
                write: domain.cntr().map_err(|c| step("fi_cntr_open", c))?,
                read: domain.cntr().map_err(|c| step("fi_cntr_open", c))?,
            }),
            false => None,
        };
        let ep = domain.endpoint(&info).map_err(|c| step("fi_endpoint", c))?;
        ep.bind(&av, 0).map_err(|c| step("fi_ep_bind(av)", c))?;
        ep.bind(&cq, ffi::FI_TRANSMIT | ffi::FI_RECV)
            .map_err(|c| step("fi_ep_bind(cq)", c))?;
        if let (Some(c), Some((write, read))) = (&cntrs, cntr_flags) {
            ep.bind(&c.write, write)
                .map_err(|c| step("fi_ep_bind(cntr)", c))?;
            ep.bind(&c.read, read)
                .map_err(|c| step("fi_ep_bind(cntr)", c))?;
        }
        if let Some(c) = &remote_cntrs {
            ep.bind(&c.write, ffi::FI_REMOTE_WRITE)
                .map_err(|c| step("fi_ep_bind(cntr, FI_REMOTE_WRITE)", c))?;
            ep.bind(&c.read, ffi::FI_REMOTE_READ)
                .map_err(|c| step("fi_ep_bind(cntr, FI_REMOTE_READ)", c))?;
        }
        ep.enable().map_err(|c| step("fi_enable", c))?;
        Ok(Objects {
            ep,
            mrs: Vec::new(),
            cntrs,
            cntr_names,
            remote_cntrs,
            mr_cntrs: Vec::new(),
            cq,
            av,
            domain: Some(domain),
            fabric,
            info,
        })
    }

    /// Closes everything, children first; each close must succeed.
    pub(super) fn close(self) -> Result<(), String> {
        let Objects {
            ep,
            mrs,
            cntrs,
            cntr_names: _,
            remote_cntrs,
            mr_cntrs,
            cq,
            av,
            domain,
            fabric,
            info,
        } = self;
        let closed =
            |what: &str, r: Result<(), i32>| r.map_err(|c| format!("fi_close({what}): {c}"));
        closed("ep", ep.close().map_err(|e| e.1))?;
        for region in mrs {
            // The memory outlives its region.
            closed("mr", region.mr.close().map_err(|e| e.1))?;
            drop(region.mem);
        }
        for c in mr_cntrs {
            closed("mr cntr", c.close().map_err(|e| e.1))?;
        }
        for c in [cntrs, remote_cntrs].into_iter().flatten() {
            closed("write cntr", c.write.close().map_err(|e| e.1))?;
            closed("read cntr", c.read.close().map_err(|e| e.1))?;
        }
        closed("cq", cq.close().map_err(|e| e.1))?;
        closed("av", av.close().map_err(|e| e.1))?;
        if let Some(domain) = domain {
            closed("domain", domain.close().map_err(|e| e.1))?;
        }
        closed("fabric", fabric.close().map_err(|e| e.1))?;
        drop(info);
        Ok(())
    }
}

/// The buffers of sends in flight, by context, each kept until its
/// completion (the provider may read it until then). A context may name
/// several sends at once (tests reuse them): its buffers are all kept until
/// as many completions came.
#[derive(Default)]
pub(super) struct SendBufs(HashMap<u64, (usize, Vec<Vec<u8>>)>);

impl SendBufs {
    pub(super) fn keep(&mut self, ctx: u64, buf: Vec<u8>) {
        let (pending, bufs) = self.0.entry(ctx).or_default();
        *pending += 1;
        bufs.push(buf);
    }

    /// A send of `ctx` completed (or was refused).
    pub(super) fn done(&mut self, ctx: u64) {
        if let Some((pending, _)) = self.0.get_mut(&ctx) {
            *pending -= 1;
            if *pending == 0 {
                self.0.remove(&ctx);
            }
        }
    }
}

/// A posted receive buffer: `len` bytes for the provider, then the guard.
pub(super) struct RecvBuf {
    pub(super) mem: Vec<u8>,
    pub(super) len: usize,
    pub(super) multi: bool,
}

/// The buffer of an RMA read in flight: `len` bytes between two guards of
/// `GUARD` bytes, all `GUARD_BYTE` when posted.
pub(super) struct ReadBuf {
    pub(super) mem: Vec<u8>,
    pub(super) len: usize,
}

/// The buffers of an atomic in flight: the result (`len` bytes, then
/// `GUARD` guard bytes, all `GUARD_BYTE` when posted) and the operands.
pub(super) struct AtomicBuf {
    pub(super) result: Vec<u8>,
    pub(super) len: usize,
    pub(super) size: usize,
    pub(super) _operands: (Vec<u8>, Vec<u8>),
}
