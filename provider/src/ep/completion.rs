//! Turning the protocol's finished operations into CQ entries and counter
//! events, honouring selective completion, and progress when a CQ or
//! counter of the endpoint's domain is read.

use std::os::raw::c_void;
use std::sync::atomic::Ordering;

use unimem_mailbox::MailboxAddr;

use super::inner::{Bindings, EpInner, EpMessenger, SourceHit};
use crate::av::AvInner;
use crate::base::ffi::{self, Error};
use crate::base::fid::ParentRef;
use crate::base::lock::DomainMutexGuard;
use crate::cntr::CntrInner;
use crate::cq::{Completion, CompletionError, CqInner};
use crate::state::progress::{Pending, Progress};
use unimem_mailbox::doorbell::Doorbell;
use unimem_proto::{ErrorKind, Event, RecvDone, RecvSink, RmaKind};

impl Progress for EpInner {
    fn progress(&self) {
        let mut messenger = self.enter();
        self.advance(&mut messenger);
        self.after_pass(messenger);
    }

    fn progress_for_agent(&self) -> Pending {
        let mut messenger = self.messenger.lock();
        // The application computes meanwhile: what the pass matches, the
        // sender copies.
        messenger.set_helping(true);
        self.advance(&mut messenger);
        messenger.set_helping(false);
        let pending = pending_of(&messenger);
        self.after_pass(messenger);
        pending
    }

    fn pending(&self) -> Pending {
        pending_of(&self.messenger.lock())
    }

    fn doorbell(&self) -> Option<&Doorbell> {
        self.bell.is_wakeable().then_some(&self.bell)
    }

    fn in_flight(&self) -> Option<String> {
        self.messenger.lock().in_flight()
    }
}

fn pending_of(messenger: &EpMessenger) -> Pending {
    Pending {
        message: messenger.message_waiting(),
        local_work: messenger.local_work(),
        busy: messenger.busy(),
    }
}

impl EpInner {
    /// After a peer was lost, or when the peer check asks: if every peer
    /// this endpoint could hear from (those its AV holds, and those that
    /// reached it) is lost, nobody is left to match a receive from any
    /// source, and those fail. An AV address never heard from counts as
    /// lost only if its mailbox is gone; an endpoint that knows no peer
    /// and has none in its AV (a server waiting for its first) is not
    /// alone.
    fn fail_receives_if_alone(&self) {
        let av_addresses = |b: &Bindings| b.av.as_ref().map(|av| av.addresses());
        let addresses = match self.active.get() {
            Some(active) => av_addresses(active),
            None => av_addresses(&self.bindings.read()),
        }
        .unwrap_or_default();
        // Not `enter`: the agent's pass comes here too.
        let mut messenger = self.messenger.lock();
        let own = messenger.addr();
        let known = messenger.known_peers_lost();
        let mut others = addresses.iter().filter(|&&a| a != own).peekable();
        let alone = match known {
            Some(false) => false,
            None if others.peek().is_none() => false,
            _ => others.all(|a| messenger.lost(a)),
        };
        if alone {
            messenger.left_alone();
            self.drain(&mut messenger);
        }
    }

    fn advance(&self, messenger: &mut EpMessenger) {
        messenger.progress();
        self.drain(messenger);
    }

    /// After a progress pass, with the messenger released: the shared
    /// objects of peers found dead since the last look go, and after such
    /// a loss, or when the peer check asks, receives from any source fail
    /// if nobody is left.
    #[inline]
    fn after_pass(&self, mut messenger: DomainMutexGuard<'_, EpMessenger>) {
        let lost = messenger.peers_lost();
        let look = messenger.audience_check_due();
        drop(messenger);
        // A load first: a swap on every progress call would be a locked
        // instruction on the polling path.
        if look || self.peers_reclaimed.load(Ordering::Relaxed) != lost {
            self.after_loss_or_look(lost, look);
        }
    }

    #[cold]
    fn after_loss_or_look(&self, lost: usize, look: bool) {
        let new_loss = self.peers_reclaimed.load(Ordering::Relaxed) != lost
            && self.peers_reclaimed.swap(lost, Ordering::Relaxed) != lost;
        if new_loss {
            // A killed process cannot remove its mailbox and memory: the
            // peers that find it dead do.
            let removed = unimem_mailbox::shm::reclaim_dead_objects();
            tracing::info!(removed, "reclaimed the shared objects of dead peers");
        }
        if new_loss || look {
            self.fail_receives_if_alone();
        }
    }
}

/// The error an operation that failed with `kind` completes with.
fn error_of(kind: ErrorKind) -> Error {
    match kind {
        ErrorKind::Truncated => Error::ETRUNC,
        ErrorKind::Canceled => Error::ECANCELED,
        ErrorKind::PeerUnreachable => Error::EHOSTUNREACH,
        ErrorKind::NoMessage => Error::ENOMSG,
        ErrorKind::BadKey => Error::EKEYREJECTED,
        ErrorKind::AccessDenied => Error::EACCES,
        ErrorKind::Invalid => Error::EINVAL,
    }
}

/// The CQ flags and counter of an RMA operation of ours.
fn rma_flags(kind: RmaKind, bindings: &Bindings) -> (u64, Option<&ParentRef<CntrInner>>) {
    match kind {
        RmaKind::Write => (ffi::FI_RMA | ffi::FI_WRITE, bindings.write_cntr.as_ref()),
        RmaKind::Read => (ffi::FI_RMA | ffi::FI_READ, bindings.read_cntr.as_ref()),
        RmaKind::Atomic => (ffi::FI_ATOMIC | ffi::FI_WRITE, bindings.write_cntr.as_ref()),
        RmaKind::AtomicFetch => (ffi::FI_ATOMIC | ffi::FI_READ, bindings.read_cntr.as_ref()),
    }
}

fn kind_flag(tagged: bool) -> u64 {
    if tagged {
        ffi::FI_TAGGED
    } else {
        ffi::FI_MSG
    }
}

/// The CQ flags of a message operation (`direction`: FI_SEND or FI_RECV),
/// finished or failed.
#[inline]
fn message_flags(direction: u64, tagged: bool, data: Option<u64>, multi_released: bool) -> u64 {
    let mut flags = direction | kind_flag(tagged);
    if data.is_some() {
        flags |= ffi::FI_REMOTE_CQ_DATA;
    }
    if multi_released {
        flags |= ffi::FI_MULTI_RECV;
    }
    flags
}

impl EpInner {
    /// Turns the protocol's finished operations into CQ entries and counter
    /// events.
    #[inline]
    pub(super) fn drain(&self, messenger: &mut EpMessenger) {
        // Most posts and polls leave nothing to drain: one look, inline.
        if messenger.has_events() {
            self.drain_events(messenger);
        }
    }

    fn drain_events(&self, messenger: &mut EpMessenger) {
        let setup;
        let bindings = match self.active.get() {
            Some(active) => active,
            None => {
                setup = self.bindings.read();
                &*setup
            }
        };
        while let Some(event) = messenger.next_event() {
            match event {
                Event::Send {
                    context,
                    tagged,
                    completion,
                } => {
                    if completion {
                        if let Some(cq) = &bindings.tx_cq {
                            cq.write(Completion::new(
                                context as *mut c_void,
                                ffi::FI_SEND | kind_flag(tagged),
                            ));
                        }
                    }
                    if let Some(cntr) = &bindings.send_cntr {
                        cntr.inc();
                    }
                }
                Event::Recv(done) => {
                    if done.completion || done.multi_released {
                        if let Some(cq) = &bindings.rx_cq {
                            let av = bindings
                                .av
                                .as_deref()
                                .filter(|_| self.caps & ffi::FI_SOURCE != 0);
                            let src = source_fi_addr(av, &mut messenger.last_source, &done.src);
                            cq.write(recv_entry(&done, src));
                        }
                    }
                    if let Some(cntr) = &bindings.recv_cntr {
                        cntr.inc();
                    }
                }
                Event::Rma {
                    context,
                    kind,
                    completion,
                } => {
                    let (flags, cntr) = rma_flags(kind, bindings);
                    if completion {
                        if let Some(cq) = &bindings.tx_cq {
                            cq.write(Completion::new(context as *mut c_void, flags));
                        }
                    }
                    if let Some(cntr) = cntr {
                        cntr.inc();
                    }
                }
                Event::RmaError {
                    context,
                    kind,
                    error,
                } => {
                    let (flags, cntr) = rma_flags(kind, bindings);
                    if let Some(cq) = &bindings.tx_cq {
                        let err = error_of(error).code();
                        cq.write_error(CompletionError {
                            completion: Completion::new(context as *mut c_void, flags),
                            err,
                            prov_errno: err,
                            olen: 0,
                            err_data: Vec::new(),
                        });
                    }
                    if let Some(cntr) = cntr {
                        cntr.inc_err();
                    }
                }
                Event::RemoteWrite { data, len } => {
                    // Only a write with CQ data reports at the target
                    // (no FI_RMA_EVENT): on the receive CQ, no context.
                    if let Some(cq) = &bindings.rx_cq {
                        cq.write(Completion {
                            op_context: std::ptr::null_mut(),
                            flags: ffi::FI_RMA | ffi::FI_REMOTE_WRITE | ffi::FI_REMOTE_CQ_DATA,
                            len,
                            buf: std::ptr::null_mut(),
                            data,
                            tag: 0,
                            src_addr: ffi::FI_ADDR_NOTAVAIL,
                        });
                    }
                }
                Event::RemoteAccess(counts) => {
                    if self.caps & ffi::FI_RMA_EVENT != 0 {
                        let read = counts.read();
                        if let Some(cntr) = bindings.remote_read_cntr.as_ref().filter(|_| read > 0)
                        {
                            cntr.add_successes(read);
                        }
                        let written = counts.written();
                        let cntr = bindings.remote_write_cntr.as_ref();
                        if let Some(cntr) = cntr.filter(|_| written > 0) {
                            cntr.add_successes(written);
                        }
                    }
                    crate::mr::count_remote_access(&counts);
                }
                Event::Error(e) => {
                    let (cq, cntr, direction) = if e.send {
                        (&bindings.tx_cq, &bindings.send_cntr, ffi::FI_SEND)
                    } else {
                        (&bindings.rx_cq, &bindings.recv_cntr, ffi::FI_RECV)
                    };
                    let flags = message_flags(direction, e.tagged, e.data, e.multi_released);
                    let err = error_of(e.kind).code();
                    if let Some(cq) = cq {
                        cq.write_error(CompletionError {
                            completion: Completion {
                                op_context: e.context as *mut c_void,
                                flags,
                                len: e.len,
                                buf: e.buf as *mut c_void,
                                data: e.data.unwrap_or(0),
                                tag: e.tag,
                                src_addr: e.src.map_or(ffi::FI_ADDR_NOTAVAIL, |src| {
                                    let av = bindings
                                        .av
                                        .as_deref()
                                        .filter(|_| self.caps & ffi::FI_SOURCE != 0);
                                    source_fi_addr(av, &mut messenger.last_source, &src)
                                }),
                            },
                            err,
                            prov_errno: err,
                            olen: e.olen,
                            err_data: Vec::new(),
                        });
                    }
                    if let Some(cntr) = cntr {
                        cntr.inc_err();
                    }
                }
            }
        }
        // Operations that asked for no completion move counters only: at
        // once, so that a counter read right after its puts (MPI's flush)
        // finds them without progress (`CntrInner::read_progressing`).
        if let Some(silent) = messenger.take_silent_rma() {
            for (kind, n) in RmaKind::ALL.into_iter().zip(silent) {
                if n == 0 {
                    continue;
                }
                if let (_, Some(cntr)) = rma_flags(kind, bindings) {
                    cntr.add_successes(n);
                }
            }
        }
    }
}

/// The CQ entry of a finished receive whose source is `src_addr`.
#[inline]
fn recv_entry(done: &RecvDone<MailboxAddr>, src_addr: ffi::fi_addr_t) -> Completion {
    Completion {
        op_context: done.context as *mut c_void,
        flags: message_flags(ffi::FI_RECV, done.tagged, done.data, done.multi_released),
        len: done.len,
        buf: done.buf as *mut c_void,
        data: done.data.unwrap_or(0),
        tag: done.tag,
        src_addr,
    }
}

/// The messenger's [`RecvSink`]: a receive's CQ entry and counter event,
/// written as it finishes (no event queued and drained later). Holds
/// what the endpoint's frozen bindings hold for it, for as long as the
/// endpoint's messenger lives, which is the endpoint's life.
pub(super) struct RecvReport {
    cq: Option<ParentRef<CqInner>>,
    cntr: Option<ParentRef<CntrInner>>,
    /// The AV, with FI_SOURCE only.
    av: Option<ParentRef<AvInner>>,
    last_source: Option<SourceHit>,
}

impl RecvReport {
    pub(super) fn new(caps: u64, bindings: &Bindings) -> Self {
        RecvReport {
            cq: bindings.rx_cq.clone(),
            cntr: bindings.recv_cntr.clone(),
            av: bindings.av.clone().filter(|_| caps & ffi::FI_SOURCE != 0),
            last_source: None,
        }
    }
}

impl RecvSink<MailboxAddr> for RecvReport {
    #[inline]
    fn received(&mut self, done: &RecvDone<MailboxAddr>) {
        if done.completion || done.multi_released {
            if let Some(cq) = &self.cq {
                let src = source_fi_addr(self.av.as_deref(), &mut self.last_source, &done.src);
                cq.write(recv_entry(done, src));
            }
        }
        if let Some(cntr) = &self.cntr {
            cntr.inc();
        }
    }
}

/// A completion's source address: an AV lookup (hashing the address) that
/// only endpoints with FI_SOURCE pay for (`av` is given to them only); MPI
/// does without (it sends its rank as CQ data), though MPICH asks for it.
/// The last answer is kept, and reused while the AV has had no removal.
fn source_fi_addr(
    av: Option<&AvInner>,
    last: &mut Option<SourceHit>,
    src: &MailboxAddr,
) -> ffi::fi_addr_t {
    let Some(av) = av else {
        return ffi::FI_ADDR_NOTAVAIL;
    };
    // Read before the lookup: a removal meanwhile makes the answer stale.
    let removals = av.removals();
    if let Some(hit) = last.filter(|h| h.addr == *src && h.removals == removals) {
        return hit.fi_addr;
    }
    match av.reverse_lookup(src) {
        Some(fi_addr) => {
            *last = Some(SourceHit {
                addr: *src,
                fi_addr,
                removals,
            });
            fi_addr
        }
        None => ffi::FI_ADDR_NOTAVAIL,
    }
}
