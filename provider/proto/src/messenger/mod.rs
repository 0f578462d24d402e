//! The messenger: the protocol state machine behind one libfabric endpoint
//! (peers, queues, transfers). It is named apart from the endpoint object
//! of the provider, which wraps it in a lock and turns its events into CQ
//! entries.
//!
//! Everything here runs inside the application's calls (manual progress):
//! posting a send or a receive, and [`Messenger::progress`], which reaps DMA
//! completions, handles arrived mailbox messages, retries what waited for a
//! resource and flushes the peers' queues. Finished operations come out of
//! [`Messenger::next_event`].
//!
//! Each peer has two outgoing queues. *Data* (inline messages, eager
//! announcements, rendezvous requests) leaves strictly in order, which is
//! what makes matching order follow send order. *Control* (hello, grants,
//! fragment reports, FINs, credits) never waits behind data: a data message
//! blocked on credits must not hold back the very messages that free them.
//!
//! # Modules
//!
//! One type, [`Messenger`], defined here with its fields; its methods are
//! spread over the modules below by concern, each an `impl Messenger` block
//! that says at its top what it owns and what it may touch:
//!
//! - `peers`: the peer table, first contact (Hello), lookup, the queues;
//! - `liveness`: peer checks, and failing what a dead peer leaves behind;
//! - `send`: posting sends and flushing queues; `send::inline`,
//!   `send::eager`, `send::rendezvous` carry them;
//! - `recv`: posting receives, matching, unexpected messages;
//!   `recv::eager` consumes the eager ring, `recv::rendezvous` grants
//!   and stages fragments;
//! - `credits`: eager credits spent, owed and returned;
//! - `rma`: one-sided writes and reads, by DMA when the target range is
//!   dmable (`rma::one_sided`, small ones within their call in
//!   `rma::direct`), else with the target's help (`rma::target`); atomics
//!   in `rma::atomic`, their target's side in `rma::atomic::target`;
//! - `completion`: events for finished and failed operations;
//! - `progress`: the progress loop and the dispatch of mailbox messages;
//! - `untrusted`: invalid peer messages dropped and counted, peers fenced
//!   or refused;
//! - `report`: what the messenger carried and has in flight, for the log;
//! - `ids`: the `Slab` of ids that travel on the wire.

mod completion;
mod credits;
mod ids;
mod liveness;
mod peers;
mod progress;
mod recv;
mod report;
mod rma;
mod send;
mod untrusted;

pub use peers::KnownPeer;
pub use recv::Held;
pub use report::Stats;
pub use rma::atomic::AtomicReq;
pub use rma::RmaReq;
pub use send::SendReq;

use std::collections::VecDeque;
use std::time::Instant;

use unimem_dma::{DmaEngine, DmaError};
use unimem_mailbox::{Error as MailboxError, IdMap, Mailbox};

use crate::dma::{DmaView, DomainDma, Token};
use crate::matching::Matcher;
use crate::pool::BufferPool;
use crate::{Event, PostError, ProtoConfig, RecvSink, RmaKind, WireNode};
use ids::Slab;
use peers::Peer;
use recv::rendezvous::RxXfer;
use rma::target::DeferredRead;
use rma::RmaOp;
use send::rendezvous::Grant;
use send::TxOp;
use send::Waiter;
use untrusted::DroppedMessages;

/// What a messenger runs on: a mailbox, and a DMA engine whose node (where
/// a peer's memory is) travels in a Hello, read back knowing the mailbox
/// address it came from. The one bound the protocol puts on the pair,
/// written here once: every `impl<B: Backend> Messenger<B>` block has it.
///
/// Any pair `(M, D)` that fits is a backend (the provider's
/// `(NodeMailbox, NodeDma)`, the tests' `(ShmMailbox, ShmDmaEngine)`):
/// naming the pair is naming the backend, and each messenger is
/// monomorphised for its mailbox and engine as before.
pub trait Backend {
    type Mailbox: Mailbox;
    type Dma: DmaEngine<Node: WireNode<<Self::Mailbox as Mailbox>::Addr>>;
}

impl<M, D> Backend for (M, D)
where
    M: Mailbox,
    D: DmaEngine<Node: WireNode<M::Addr>>,
{
    type Mailbox = M;
    type Dma = D;
}

/// A backend's mailbox address: how a peer is named.
pub type Addr<B> = <<B as Backend>::Mailbox as Mailbox>::Addr;
/// A backend's route to a peer's mailbox.
pub(crate) type Route<B> = <<B as Backend>::Mailbox as Mailbox>::Peer;
/// A backend's DMA node: where a peer's memory is.
pub type Node<B> = <<B as Backend>::Dma as DmaEngine>::Node;

/// Index of a peer in the table: peers are never removed.
type PeerIdx = usize;

/// The protocol state of one endpoint; see the [module docs](self). Each
/// field is owned by the module named beside it: others read it, or change
/// it through that module's methods.
pub struct Messenger<B: Backend> {
    mbx: B::Mailbox,
    /// This messenger's view of its domain's DMA engine and cache.
    dma: DmaView<B::Dma>,
    cfg: ProtoConfig,
    /// Size of an eager ring slot (and of a bounce buffer): `eager_size`
    /// rounded up to a power of two.
    slot_size: usize,
    // peers
    peers: Vec<Peer<Addr<B>, Route<B>, Node<B>>>,
    by_addr: IdMap<Addr<B>, PeerIdx>,
    /// The peer looked up last: most traffic goes to or comes from the same
    /// peer as the message before, and this spares hashing its address.
    last_peer: Option<(Addr<B>, PeerIdx)>,
    /// Peers with queued messages, flushed by progress.
    active: Vec<PeerIdx>,
    /// The other half of `active`, swapped in while it is flushed, so that
    /// neither ever gives its allocation back (progress).
    active_spare: Vec<PeerIdx>,
    // recv
    matcher: Matcher<Addr<B>, Held>,
    // send
    tx_ops: Slab<TxOp>,
    bounce_pool: BufferPool,
    /// Copies of small injects that waited for a credit, kept for the next
    /// ones (`send/mod.rs`, `take_copy`): not an allocation and a free per
    /// queued message.
    spare_copies: Vec<Box<[u8]>>,
    // completion
    outstanding_sends: usize,
    events: VecDeque<Event<Addr<B>>>,
    /// Where finished receives go when no event waits before them
    /// (none: they are events too).
    recv_sink: Option<Box<dyn RecvSink<Addr<B>>>>,
    /// Whether a send that asks for no CQ entry (an inject, a selective
    /// send) is reported all the same: only a send counter needs it, and
    /// MPI's small sends are injects with none bound.
    report_silent_sends: bool,
    /// Whether RMA operations and atomics that ask for no completion are
    /// counted in `silent_rma` instead of reported as events.
    count_silent_rma: bool,
    /// Those counted, by [`RmaKind`] (see [`Self::take_silent_rma`]).
    silent_rma: [u64; RmaKind::ALL.len()],
    /// Whether any is counted (one load for the endpoint's every drain).
    silent_any: bool,
    // recv::rendezvous
    rx_xfers: Slab<RxXfer<Addr<B>>>,
    /// Transfers a peer started (matched requests to send, its writes to
    /// us) waiting for a free id, in order.
    rx_backlog: VecDeque<RxXfer<Addr<B>>>,
    /// How many ids `rx_xfers` may hand out: all a wire id can name.
    rx_id_limit: usize,
    rx_staging: BufferPool,
    deferred_grants: VecDeque<usize>,
    // rma
    rma_ops: Slab<RmaOp>,
    rma_pending: VecDeque<usize>,
    // rma::atomic
    atomic_rx: IdMap<(PeerIdx, u16), rma::atomic::target::PendingAtomic>,
    // rma::target
    deferred_reads: VecDeque<DeferredRead>,
    // recv::rendezvous
    /// The progress agent runs this pass: a rendezvous it matches is
    /// granted, never read here (the application computes meanwhile).
    helping: bool,
    // send::rendezvous
    tx_staging: BufferPool,
    deferred_fragments: VecDeque<Grant>,
    // progress
    /// What each of our DMAs in flight is for; its id is the DMA's token.
    dma_waiters: Slab<Waiter>,
    /// Tokens of completed DMAs, kept between uses for its allocation.
    dma_done: Vec<Token>,
    // liveness
    /// Progress calls since the last look at the clock for a peer check.
    calls_since_clock: u32,
    next_peer_check: Instant,
    /// Peers found dead so far (the provider reclaims what they left).
    peers_lost: usize,
    /// No peer is left that could send to us (the provider tells, see
    /// `liveness`): receives from any source fail until a new one comes.
    alone: bool,
    /// See `Messenger::audience_check_due`.
    audience_due: bool,
    /// Taking in the mailbox before failing a dead peer (so that failing
    /// another one meanwhile does not start over).
    draining: bool,
    /// What went which way, for the log.
    stats: Stats,
    /// Peer messages dropped as not fitting what the peer may send, and
    /// when the last warning about them went out (warnings are rate-limited).
    dropped: DroppedMessages,
}

fn post_error(e: MailboxError) -> PostError {
    match e {
        MailboxError::Busy => PostError::Again,
        MailboxError::Invalid => PostError::BadAddress,
        MailboxError::Dead => PostError::Unreachable,
        MailboxError::Io(_) => PostError::NoMemory,
    }
}

impl<B: Backend> Messenger<B> {
    /// A messenger over mailbox `mbx`, using its domain's DMA (`dma`: its
    /// engine, and its registration cache, shared with the domain's other
    /// messengers).
    pub fn new(
        mbx: B::Mailbox,
        dma: &DomainDma<B::Dma>,
        mut cfg: ProtoConfig,
    ) -> Result<Self, DmaError> {
        let dma = dma.view();
        // What the wire can carry: an eager length in 27 bits, a fragment
        // length in 32.
        cfg.eager_size = cfg.eager_size.clamp(1, crate::wire::MAX_EAGER_LEN);
        cfg.fragment_size = cfg.fragment_size.clamp(4096, u32::MAX as usize);
        cfg.tx_size = cfg.tx_size.clamp(1, u16::MAX as usize);
        let slot_size = cfg.eager_size.next_power_of_two();
        let bounce_pool =
            BufferPool::allocate(|len| dma.alloc(len), slot_size, cfg.bounce_buffers.max(1))?;
        let tx_staging = BufferPool::allocate(
            |len| dma.alloc(len),
            cfg.fragment_size,
            cfg.staging_buffers.max(1),
        )?;
        let rx_staging = BufferPool::allocate(
            |len| dma.alloc(len),
            cfg.fragment_size,
            cfg.staging_buffers.max(1),
        )?;
        Ok(Messenger {
            mbx,
            dma,
            slot_size,
            peers: Vec::new(),
            by_addr: IdMap::default(),
            last_peer: None,
            active_spare: Vec::new(),
            active: Vec::new(),
            matcher: Matcher::new(0),
            tx_ops: Slab::new(),
            rx_xfers: Slab::new(),
            rx_backlog: VecDeque::new(),
            rx_id_limit: ids::WIRE_IDS,
            rma_ops: Slab::new(),
            rma_pending: VecDeque::new(),
            atomic_rx: IdMap::default(),
            deferred_reads: VecDeque::new(),
            helping: false,
            outstanding_sends: 0,
            bounce_pool,
            spare_copies: Vec::new(),
            tx_staging,
            rx_staging,
            dma_waiters: Slab::new(),
            dma_done: Vec::new(),
            deferred_grants: VecDeque::new(),
            deferred_fragments: VecDeque::new(),
            events: VecDeque::new(),
            recv_sink: None,
            report_silent_sends: true,
            count_silent_rma: false,
            silent_rma: [0; RmaKind::ALL.len()],
            silent_any: false,
            calls_since_clock: 0,
            next_peer_check: Instant::now(),
            peers_lost: 0,
            alone: false,
            audience_due: false,
            draining: false,
            stats: Stats::default(),
            dropped: DroppedMessages::default(),
            cfg,
        })
    }

    /// A messenger with a DMA engine and registration cache of its own,
    /// shared with no other (tests; a domain of one endpoint).
    pub fn with_private_dma(
        mbx: B::Mailbox,
        engine: B::Dma,
        cfg: ProtoConfig,
    ) -> Result<Self, DmaError> {
        let dma = DomainDma::new(engine, unimem_regcache::Config::default());
        Self::new(mbx, &dma, cfg)
    }

    /// The domain's DMA this messenger uses.
    pub fn domain_dma(&self) -> &DomainDma<B::Dma> {
        self.dma.domain()
    }

    pub fn addr(&self) -> Addr<B> {
        self.mbx.addr()
    }

    pub fn config(&self) -> &ProtoConfig {
        &self.cfg
    }

    /// Whether sends that ask for no CQ entry are still reported as
    /// [`Event::Send`] (with `completion` false): on by default; the
    /// provider turns it off for endpoints with no send counter.
    pub fn set_report_silent_sends(&mut self, on: bool) {
        self.report_silent_sends = on;
    }

    /// Reports finished receives to `sink` as they finish, instead of as
    /// [`Event::Recv`]s, whenever no event waits before them.
    pub fn set_recv_sink(&mut self, sink: Box<dyn RecvSink<Addr<B>>>) {
        self.recv_sink = Some(sink);
    }

    /// Stops reporting receives to the sink (they are events again): an
    /// endpoint that closes reports nothing more.
    pub fn drop_recv_sink(&mut self) {
        self.recv_sink = None;
    }

    /// Whether RMA operations and atomics that ask for no completion (an
    /// inject write, MPI's puts with counters) are only counted
    /// ([`Self::take_silent_rma`]) instead of reported as [`Event::Rma`]
    /// with `completion` false: off by default; the provider, whose
    /// counters are all such an event moves, turns it on (an event per
    /// put is a third of a small put's cost in the endpoint).
    pub fn set_count_silent_rma(&mut self, on: bool) {
        self.count_silent_rma = on;
    }

    pub fn set_min_multi_recv(&mut self, min: usize) {
        self.matcher.set_min_multi_recv(min);
    }

    pub fn min_multi_recv(&self) -> usize {
        self.matcher.min_multi_recv()
    }

    /// The next finished operation, if any.
    pub fn next_event(&mut self) -> Option<Event<Addr<B>>> {
        self.events.pop_front()
    }

    /// How many RMA operations and atomics of each kind (in the order of
    /// [`RmaKind::ALL`]) finished without asking for a completion since
    /// the last call: no event names them, only counters count them.
    #[inline]
    pub fn take_silent_rma(&mut self) -> Option<[u64; RmaKind::ALL.len()]> {
        if !std::mem::take(&mut self.silent_any) {
            return None;
        }
        Some(std::mem::take(&mut self.silent_rma))
    }

    /// Whether [`Self::next_event`] or [`Self::take_silent_rma`] has
    /// anything.
    #[inline]
    pub fn has_events(&self) -> bool {
        self.silent_any || !self.events.is_empty()
    }

    /// Receives posted and not yet matched.
    pub fn posted_receives(&self) -> usize {
        self.matcher.posted_len()
    }

    /// Whether work is left that no message will announce: DMA completions
    /// to reap, sends queued for a peer, deferred grants, fragments, reads
    /// and RMA not waiting for a peer's first message (a thread that
    /// sleeps until a message comes must look again soon).
    pub fn local_work(&self) -> bool {
        !self.dma_waiters.is_empty()
            || !self.active.is_empty()
            || !self.deferred_grants.is_empty()
            || !self.deferred_fragments.is_empty()
            || self.rma_waiting_locally()
            || !self.deferred_reads.is_empty()
    }

    /// Whether a message may be waiting in the mailbox (a cheap look).
    pub fn message_waiting(&self) -> bool {
        self.mbx.has_message()
    }

    /// Whether operations are still in flight (sends, RMA, transfers).
    pub fn busy(&self) -> bool {
        self.outstanding_sends > 0 || !self.rx_xfers.is_empty() || !self.rx_backlog.is_empty()
    }

    /// A peer announces the high 32 bits of the length of its next
    /// transfer `id`.
    pub(crate) fn on_len_high(&mut self, peer: PeerIdx, id: u16, read: bool, high: u32) {
        // Each announcement is followed at once by its transfer's start,
        // which takes it: a peer has one at most, and only its own
        // misbehaviour is held against it.
        if self.peers[peer]
            .long_len
            .replace((read, id, high))
            .is_some()
        {
            self.drop_invalid(peer, "length announcement without its transfer");
        }
    }

    /// A peer offers the buffer of its send `send_id`, whose `Rts` comes
    /// next.
    pub(crate) fn on_offer(&mut self, peer: PeerIdx, send_id: u16, offer: (u64, u16)) {
        // Each is followed at once by its `Rts` (one sender's messages
        // arrive in order), which takes it: a peer has one at most, and
        // only its own misbehaviour is held against it.
        let (addr, token) = offer;
        if self.peers[peer]
            .offer
            .replace((send_id, addr, token))
            .is_some()
        {
            self.drop_invalid(peer, "offer whose request to send never came");
        }
    }

    /// The progress agent runs the passes from now on (`true`), or the
    /// application's own calls do again: a rendezvous the agent matches
    /// is granted, so that the sender, not this computing process, copies
    /// it.
    pub fn set_helping(&mut self, helping: bool) {
        self.helping = helping;
    }

    /// The full length of a transfer whose start carried `low`.
    pub(crate) fn full_length(&mut self, peer: PeerIdx, read: bool, id: u16, low: u32) -> usize {
        let high = self.peers[peer]
            .long_len
            .take()
            .filter(|&(r, i, _)| (r, i) == (read, id))
            .map_or(0, |(_, _, high)| high);
        ((u64::from(high) << 32) | u64::from(low)) as usize
    }

    /// Fewer ids for rendezvous receives than the wire allows, to cross
    /// the limit in tests (the unit tests, and the fuzz harness,
    /// `tests/fuzz/`, which is why it is public).
    #[doc(hidden)]
    pub fn limit_rx_ids(&mut self, limit: usize) {
        self.rx_id_limit = limit;
    }

    /// How many peers were found dead so far.
    pub fn peers_lost(&self) -> usize {
        self.peers_lost
    }
}

#[cfg(test)]
mod tests;
