//! `fi_ep_bind` and `fi_enable`: what the endpoint is bound to, frozen
//! when it is enabled.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use super::completion::RecvReport;
use super::inner::{Ep, EpInner};
use crate::av::Av;
use crate::base::ffi::{self, Error};
use crate::base::fid::{Bind, Control, ParentRef};
use crate::cntr::Cntr;
use crate::cq::Cq;
use crate::eq::Eq;
use crate::state::progress::Progress;

impl Bind for EpInner {
    unsafe fn bind(ep: &Ep, bfid: *mut ffi::fid, flags: u64) -> Result<(), Error> {
        // SAFETY: bfid is NULL or a live fid (libfabric contract).
        let Some(class) = (unsafe { bfid.as_ref() }).map(|f| f.fclass as u32) else {
            tracing::warn!("fi_ep_bind: NULL object");
            return Err(Error::EINVAL);
        };
        let inner = &ep.inner;
        let mut b = inner.bindings.write();
        // Checked under the lock fi_enable takes to freeze the bindings.
        if inner.active.get().is_some() {
            tracing::warn!("fi_ep_bind: the endpoint is already enabled");
            return Err(Error::EOPBADSTATE);
        }
        match class {
            ffi::FI_CLASS_AV => {
                // SAFETY: bfid is a live fid of class AV.
                let Some(av) = (unsafe { Av::state_of(bfid) }) else {
                    return Err(Error::EINVAL);
                };
                if b.av.is_some() {
                    tracing::warn!("fi_ep_bind: an AV is already bound");
                    return Err(Error::EINVAL);
                }
                b.av = Some(ParentRef::new(&av));
            }
            ffi::FI_CLASS_CQ => {
                // SAFETY: bfid is a live fid of class CQ.
                let Some(cq) = (unsafe { Cq::state_of(bfid) }) else {
                    return Err(Error::EINVAL);
                };
                let known = ffi::FI_TRANSMIT | ffi::FI_RECV | ffi::FI_SELECTIVE_COMPLETION;
                if flags & !known != 0 || flags & (ffi::FI_TRANSMIT | ffi::FI_RECV) == 0 {
                    tracing::warn!("fi_ep_bind: CQ flags {flags:#x} are not FI_TRANSMIT/FI_RECV[/FI_SELECTIVE_COMPLETION]");
                    return Err(Error::EBADFLAGS);
                }
                let selective = flags & ffi::FI_SELECTIVE_COMPLETION != 0;
                if flags & ffi::FI_TRANSMIT != 0 {
                    b.tx_cq = Some(ParentRef::new(&cq));
                    b.tx_selective = selective;
                }
                if flags & ffi::FI_RECV != 0 {
                    b.rx_cq = Some(ParentRef::new(&cq));
                    b.rx_selective = selective;
                }
            }
            ffi::FI_CLASS_CNTR => {
                // SAFETY: bfid is a live fid of class CNTR.
                let Some(cntr) = (unsafe { Cntr::state_of(bfid) }) else {
                    return Err(Error::EINVAL);
                };
                if flags & ffi::FI_SEND != 0 {
                    b.send_cntr = Some(ParentRef::new(&cntr));
                }
                if flags & ffi::FI_RECV != 0 {
                    b.recv_cntr = Some(ParentRef::new(&cntr));
                }
                if flags & ffi::FI_READ != 0 {
                    b.read_cntr = Some(ParentRef::new(&cntr));
                }
                if flags & ffi::FI_WRITE != 0 {
                    b.write_cntr = Some(ParentRef::new(&cntr));
                }
                // They count only on an endpoint with FI_RMA_EVENT.
                if flags & (ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE) != 0 {
                    crate::mr::remote_counter_bound(&inner.domain, flags);
                }
                if flags & ffi::FI_REMOTE_READ != 0 {
                    b.remote_read_cntr = Some(ParentRef::new(&cntr));
                }
                if flags & ffi::FI_REMOTE_WRITE != 0 {
                    b.remote_write_cntr = Some(ParentRef::new(&cntr));
                }
            }
            ffi::FI_CLASS_EQ => {
                // SAFETY: bfid is a live fid of class EQ.
                let Some(eq) = (unsafe { Eq::state_of(bfid) }) else {
                    return Err(Error::EINVAL);
                };
                b.eq = Some(ParentRef::new(&eq));
            }
            other => {
                tracing::warn!("fi_ep_bind: cannot bind an object of class {other}");
                return Err(Error::EINVAL);
            }
        }
        Ok(())
    }
}

impl Control for EpInner {
    unsafe fn control(ep: &Ep, command: c_int, _arg: *mut c_void) -> Result<(), Error> {
        match command as u32 {
            ffi::FI_ENABLE => {
                let mut b = ep.inner.bindings.write();
                if ep.inner.active.get().is_some() {
                    return Ok(());
                }
                if b.av.is_none() {
                    tracing::warn!("fi_enable: no AV bound to the endpoint");
                    return Err(Error::ENOAV);
                }
                if b.cqs().next().is_none() && b.cntrs().next().is_none() {
                    tracing::warn!("fi_enable: no CQ or counter bound to the endpoint");
                    return Err(Error::ENOCQ);
                }
                // A blocking read of its CQ, or a wait on its counter,
                // sleeps on the mailbox's doorbell.
                if b.cqs().any(|cq| cq.blocks()) || b.cntrs().any(|c| c.blocks()) {
                    ep.inner.bell.make_wakeable();
                }
                {
                    let mut messenger = ep.inner.messenger.lock();
                    // Sends without a CQ entry matter to a send counter only.
                    messenger.set_report_silent_sends(b.send_cntr.is_some());
                    // RMA without a completion moves counters only: counted.
                    messenger.set_count_silent_rma(true);
                    if b.rx_cq.is_some() || b.recv_cntr.is_some() {
                        let report = RecvReport::new(ep.inner.caps, &b);
                        messenger.set_recv_sink(Box::new(report));
                    }
                }
                // Binding is refused from now on, so the bindings freeze.
                let _ = ep.inner.active.set(std::mem::take(&mut *b));
                // Reads of the domain's CQs and counters progress it now.
                let me: Arc<dyn Progress> = ep.inner.clone();
                ep.inner.domain.progress().add(&me);
                // And the agent, in an agent domain, the rest of the time.
                if ep.inner.agent {
                    if let Err(e) = crate::state::agent::join(&me) {
                        tracing::warn!("fi_enable: {e}");
                        ep.inner.domain.progress().remove(&me);
                        return Err(Error::ENOMEM);
                    }
                }
                Ok(())
            }
            other => {
                tracing::info!("fi_control(ep): command {other} is not supported");
                Err(Error::ENOSYS)
            }
        }
    }
}
