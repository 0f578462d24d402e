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

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Instant;

use unimem_dma::{DmaBuf, DmaEngine, DmaError, DmaId, RegId};
use unimem_mailbox::{Error as MailboxError, Mailbox, Message};
use unimem_regcache::RegCache;

use crate::iov::{gather, scatter, total_len};
use crate::matching::{Cancelled, IovList, Matcher, MultiDone, Placement, PostedRecv, Unexpected};
use crate::pool::{Buffer, BufferPool};
use crate::wire::{inline_capacity, InlineBytes, MatchInfo, Wire, NODE_LEN};
use crate::{ErrorKind, Event, OpError, PostError, ProtoConfig, RecvDone, WireNode};

type PeerIdx = usize;

/// A send request. The iov stays valid until the send's completion (or,
/// for an inject, until the call returns).
#[derive(Clone, Debug)]
pub struct SendReq<A> {
    pub dest: A,
    pub iov: IovList,
    pub info: MatchInfo,
    pub context: usize,
    pub completion: bool,
    pub inject: bool,
}

/// Slots of values addressed by a small integer that travels on the wire.
struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    fn insert(&mut self, value: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(value);
                i
            }
            None => {
                self.slots.push(Some(value));
                self.slots.len() - 1
            }
        }
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i).and_then(Option::as_mut)
    }

    fn remove(&mut self, i: usize) -> Option<T> {
        let value = self.slots.get_mut(i)?.take();
        if value.is_some() {
            self.free.push(i);
        }
        value
    }

    /// Ids of the entries `accept` takes.
    fn ids_where(&self, accept: impl Fn(&T) -> bool) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(&accept))
            .map(|(i, _)| i)
            .collect()
    }

    fn is_empty(&self) -> bool {
        self.slots.len() == self.free.len()
    }
}

/// The eager ring a peer set aside for us, and our place in it.
struct TxRing {
    reg: RegId,
    base: u64,
    slot_size: usize,
    slots: usize,
    next: usize,
    credits: usize,
}

/// The eager ring we set aside for a peer.
struct RxRing {
    memory: DmaBuf,
    slot_size: usize,
    slots: usize,
    next: usize,
    /// Slots consumed and not yet handed back.
    owed: usize,
}

enum DataItem {
    /// An encoded inline message; `op` completes when it leaves.
    Inline {
        message: Message,
        op: usize,
    },
    Eager {
        op: usize,
    },
    Rts {
        op: usize,
    },
}

struct Peer<A, R, N> {
    addr: A,
    route: Option<R>,
    node: Option<N>,
    tx: Option<TxRing>,
    rx: Option<RxRing>,
    hello_sent: bool,
    /// Its hello arrived: we know its node, and whether it has a ring for us.
    hello_received: bool,
    control: VecDeque<Message>,
    data: VecDeque<DataItem>,
    /// In the endpoint's list of peers with queued work.
    active: bool,
    dead: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum EagerState {
    Waiting,
    InFlight,
    Done,
}

enum TxKind {
    Inline,
    Eager {
        bounce: Buffer,
        state: EagerState,
    },
    /// `bounce` holds the data of an eager send that had to go this way.
    Rendezvous {
        iov: IovList,
        bounce: Option<Buffer>,
    },
}

struct TxOp {
    peer: PeerIdx,
    context: usize,
    info: MatchInfo,
    len: usize,
    completion: bool,
    kind: TxKind,
}

/// A grant received for a rendezvous send.
#[derive(Clone, Copy, Debug)]
struct Grant {
    op: usize,
    fragment: u32,
    addr: u64,
    len: usize,
    recv_id: u16,
}

/// A rendezvous receive in progress.
struct RxXfer<A> {
    peer: PeerIdx,
    src: A,
    send_id: u16,
    info: MatchInfo,
    placement: Placement,
    msg_len: usize,
    xfer_len: usize,
    fragments: u32,
    next_grant: u32,
    done: u32,
    /// Granting straight into the (dmable, contiguous) user buffer.
    direct: bool,
    staged: HashMap<u32, Buffer>,
}

enum Waiter {
    Eager {
        op: usize,
    },
    Fragment {
        op: usize,
        fragment: u32,
        recv_id: u16,
        staging: Option<Buffer>,
    },
}

/// What an unexpected message keeps until a receive takes it.
pub enum Held {
    Data(Vec<u8>),
    Rts { peer: PeerIdx, send_id: u16 },
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Data(d) => write!(f, "Data({} bytes)", d.len()),
            Held::Rts { peer, send_id } => write!(f, "Rts(peer {peer}, id {send_id})"),
        }
    }
}

pub struct Messenger<M: Mailbox, D: DmaEngine> {
    mbx: M,
    dma: D,
    cfg: ProtoConfig,
    slot_size: usize,
    peers: Vec<Peer<M::Addr, M::Peer, D::Node>>,
    by_addr: HashMap<M::Addr, PeerIdx>,
    /// The peer looked up last: most traffic goes to or comes from the same
    /// peer as the message before, and this spares hashing its address.
    last_peer: Option<(M::Addr, PeerIdx)>,
    active: Vec<PeerIdx>,
    /// The other half of `active`, swapped in while it is flushed, so that
    /// neither ever gives its allocation back.
    active_spare: Vec<PeerIdx>,
    matcher: Matcher<M::Addr, Held>,
    tx_ops: Slab<TxOp>,
    rx_xfers: Slab<RxXfer<M::Addr>>,
    outstanding_sends: usize,
    bounce_pool: BufferPool,
    tx_staging: BufferPool,
    rx_staging: BufferPool,
    regcache: RegCache<D::Node, RegId>,
    dma_waiters: HashMap<DmaId, Waiter>,
    deferred_grants: VecDeque<usize>,
    deferred_fragments: VecDeque<Grant>,
    events: VecDeque<Event<M::Addr>>,
    /// Progress calls since the last look at the clock for a peer check.
    calls_since_clock: u32,
    next_peer_check: Instant,
    /// Peers found dead so far (the provider reclaims what they left).
    peers_lost: usize,
}

/// Progress calls between two looks at the clock for the peer check: a
/// clock read on every call would cost the fast path.
const CALLS_PER_CLOCK_READ: u32 = 64;

fn post_error(e: MailboxError) -> PostError {
    match e {
        MailboxError::Busy => PostError::Again,
        MailboxError::Invalid => PostError::BadAddress,
        MailboxError::Dead => PostError::Unreachable,
        MailboxError::Io(_) => PostError::NoMemory,
    }
}

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode,
{
    pub fn new(mbx: M, dma: D, mut cfg: ProtoConfig) -> Result<Self, DmaError> {
        cfg.eager_size = cfg.eager_size.max(1);
        cfg.fragment_size = cfg.fragment_size.max(4096);
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
            regcache: RegCache::new(cfg.regcache),
            mbx,
            dma,
            slot_size,
            peers: Vec::new(),
            by_addr: HashMap::new(),
            last_peer: None,
            active_spare: Vec::new(),
            active: Vec::new(),
            matcher: Matcher::new(0),
            tx_ops: Slab::new(),
            rx_xfers: Slab::new(),
            outstanding_sends: 0,
            bounce_pool,
            tx_staging,
            rx_staging,
            dma_waiters: HashMap::new(),
            deferred_grants: VecDeque::new(),
            deferred_fragments: VecDeque::new(),
            events: VecDeque::new(),
            calls_since_clock: 0,
            next_peer_check: Instant::now(),
            peers_lost: 0,
            cfg,
        })
    }

    pub fn addr(&self) -> M::Addr {
        self.mbx.addr()
    }

    pub fn config(&self) -> &ProtoConfig {
        &self.cfg
    }

    pub fn set_min_multi_recv(&mut self, min: usize) {
        self.matcher.set_min_multi_recv(min);
    }

    pub fn min_multi_recv(&self) -> usize {
        self.matcher.min_multi_recv()
    }

    /// The next finished operation, if any.
    pub fn next_event(&mut self) -> Option<Event<M::Addr>> {
        self.events.pop_front()
    }

    /// Receives posted and not yet matched.
    pub fn posted_receives(&self) -> usize {
        self.matcher.posted_len()
    }

    /// Whether operations are still in flight (sends, transfers).
    pub fn busy(&self) -> bool {
        self.outstanding_sends > 0 || !self.rx_xfers.is_empty()
    }

    // --- Peers -------------------------------------------------------------------

    /// A known peer's index. Peers are never removed, so the cached last
    /// lookup stays right.
    fn known_peer(&mut self, addr: &M::Addr) -> Option<PeerIdx> {
        if let Some((last, index)) = self.last_peer {
            if last == *addr {
                return Some(index);
            }
        }
        let index = *self.by_addr.get(addr)?;
        self.last_peer = Some((*addr, index));
        Some(index)
    }

    fn peer_index(&mut self, addr: &M::Addr) -> Result<PeerIdx, PostError> {
        if let Some(index) = self.known_peer(addr) {
            return Ok(index);
        }
        let route = self.mbx.connect(addr).map_err(post_error)?;
        Ok(self.add_peer(*addr, Some(route)))
    }

    /// The peer a message came from, known or not. If it cannot be reached
    /// back, its messages are still delivered.
    fn peer_for_source(&mut self, src: &M::Addr) -> PeerIdx {
        if let Some(index) = self.known_peer(src) {
            return index;
        }
        let route = match self.mbx.connect(src) {
            Ok(route) => Some(route),
            Err(e) => {
                tracing::warn!(%src, "cannot reach back to a sender: {e}");
                None
            }
        };
        self.add_peer(*src, route)
    }

    fn add_peer(&mut self, addr: M::Addr, route: Option<M::Peer>) -> PeerIdx {
        let index = self.peers.len();
        let dead = route.is_none();
        self.peers.push(Peer {
            addr,
            route,
            node: None,
            tx: None,
            rx: None,
            hello_sent: false,
            hello_received: false,
            control: VecDeque::new(),
            data: VecDeque::new(),
            active: false,
            dead,
        });
        self.by_addr.insert(addr, index);
        if !dead {
            self.send_hello(index);
        }
        tracing::debug!(%addr, index, "new peer");
        index
    }

    /// Sets aside our eager ring for `peer` and tells it where it is.
    fn send_hello(&mut self, peer: PeerIdx) {
        if self.peers[peer].hello_sent {
            return;
        }
        let slots = self.cfg.eager_credits.min(u8::MAX as usize);
        // Without a ring (none configured, or no memory for one) the hello
        // still goes out, offering no slots: the peer needs our node for
        // rendezvous, and learns to send its eager messages that way.
        let rx = match self.dma.alloc(self.slot_size * slots) {
            _ if slots == 0 => None,
            Ok(memory) => Some(RxRing {
                memory,
                slot_size: self.slot_size,
                slots,
                next: 0,
                owed: 0,
            }),
            Err(e) => {
                tracing::warn!("no dmable memory for a peer's eager ring: {e}; its eager messages will come by rendezvous");
                None
            }
        };
        let hello = Wire::Hello {
            node: self.dma.local_node().to_wire(),
            ring: rx.as_ref().map_or(0, |rx| rx.memory.remote_addr()),
            slot_shift: self.slot_size.trailing_zeros() as u8,
            slots: rx.as_ref().map_or(0, |rx| rx.slots as u16),
        };
        let state = &mut self.peers[peer];
        state.rx = rx;
        state.hello_sent = true;
        self.queue_control(peer, hello.encode());
    }

    fn queue_control(&mut self, peer: PeerIdx, message: Message) {
        self.peers[peer].control.push_back(message);
        self.mark_active(peer);
    }

    fn mark_active(&mut self, peer: PeerIdx) {
        if !self.peers[peer].active {
            self.peers[peer].active = true;
            self.active.push(peer);
        }
    }

    fn on_hello(
        &mut self,
        peer: PeerIdx,
        node: &[u8; NODE_LEN],
        ring: u64,
        slot_shift: u8,
        slots: u16,
    ) {
        let node = D::Node::from_wire(node);
        let slot_size = 1usize.checked_shl(u32::from(slot_shift)).unwrap_or(0);
        self.peers[peer].node = Some(node);
        self.peers[peer].hello_received = true;
        if self.peers[peer].tx.is_none() && slot_size > 0 && slots > 0 {
            match self.dma.register(node, ring, slot_size * slots as usize) {
                Ok(reg) => {
                    self.peers[peer].tx = Some(TxRing {
                        reg,
                        base: ring,
                        slot_size,
                        slots: slots as usize,
                        next: 0,
                        credits: slots as usize,
                    })
                }
                Err(e) => {
                    tracing::warn!(%node, "cannot register a peer's eager ring: {e}; eager messages to it go by rendezvous")
                }
            }
        }
        self.send_hello(peer);
        self.mark_active(peer);
    }

    /// The peer is gone: everything in flight with it fails.
    fn fail_peer(&mut self, peer: PeerIdx) {
        if self.peers[peer].dead && self.peers[peer].route.is_none() {
            return;
        }
        let events_before = self.events.len();
        self.peers_lost += 1;
        let state = &mut self.peers[peer];
        state.dead = true;
        state.route = None;
        state.control.clear();
        let queued: Vec<DataItem> = state.data.drain(..).collect();
        for item in queued {
            match item {
                DataItem::Inline { op, .. } | DataItem::Eager { op } | DataItem::Rts { op } => {
                    self.fail_send(op)
                }
            }
        }
        for op in self.tx_ops.ids_where(|o| o.peer == peer) {
            self.fail_send(op);
        }
        for id in self.rx_xfers.ids_where(|x| x.peer == peer) {
            let xfer = self.rx_xfers.remove(id).expect("listed above");
            // Its slot may be reused: it must not keep a place in the queue.
            self.deferred_grants.retain(|&d| d != id);
            self.release_staged(&xfer);
            self.complete_recv_error(
                xfer.placement,
                Some(xfer.src),
                xfer.info,
                0,
                ErrorKind::PeerUnreachable,
            );
        }
        self.fail_receives_from(peer);
        if let Some(node) = self.peers[peer].node {
            for reg in self.regcache.invalidate_node(node) {
                let _ = self.dma.deregister(reg);
            }
        }
        let failed = self.events.len() - events_before;
        let addr = self.peers[peer].addr;
        if failed > 0 {
            tracing::warn!(%addr, failed, "peer is dead or unreachable: its operations failed");
        } else {
            // A peer that closed its endpoint and left, as at the end of a job.
            tracing::debug!(%addr, "peer is gone");
        }
    }

    /// Fails the posted receives that only a dead `peer` could satisfy.
    fn fail_receives_from(&mut self, peer: PeerIdx) {
        let addr = self.peers[peer].addr;
        for (tagged, recv) in self.matcher.remove_posted_from(&addr) {
            self.fail_posted(tagged, &recv, ErrorKind::PeerUnreachable, Some(addr), false);
        }
    }

    /// How many peers were found dead so far.
    pub fn peers_lost(&self) -> usize {
        self.peers_lost
    }

    /// Now and then, looks whether known peers are still alive. A receiver
    /// waiting on a sender that died hears nothing more from it: only this
    /// look ends its wait (a sender learns it from the mailbox).
    fn check_peers(&mut self) {
        let Some(interval) = self.cfg.peer_check else {
            return;
        };
        self.calls_since_clock += 1;
        if self.calls_since_clock < CALLS_PER_CLOCK_READ {
            return;
        }
        self.calls_since_clock = 0;
        let now = Instant::now();
        if now < self.next_peer_check {
            return;
        }
        self.next_peer_check = now + interval;
        for peer in 0..self.peers.len() {
            let alive = match &self.peers[peer].route {
                Some(route) => self.mbx.peer_alive(route),
                None => true,
            };
            if !alive {
                self.fail_peer(peer);
            }
        }
    }

    /// Gives back the bounce buffer a finished send held, if any.
    fn release_bounce(&mut self, kind: &TxKind) {
        match *kind {
            TxKind::Eager { bounce, .. }
            | TxKind::Rendezvous {
                bounce: Some(bounce),
                ..
            } => self.bounce_pool.put(bounce),
            _ => {}
        }
    }

    fn fail_send(&mut self, op: usize) {
        let Some(tx) = self.tx_ops.remove(op) else {
            return;
        };
        self.release_bounce(&tx.kind);
        self.outstanding_sends -= 1;
        self.events.push_back(Event::Error(OpError {
            context: tx.context,
            kind: ErrorKind::PeerUnreachable,
            send: true,
            tagged: tx.info.tag.is_some(),
            buf: 0,
            len: 0,
            olen: 0,
            tag: tx.info.tag.unwrap_or(0),
            data: tx.info.data,
            src: None,
            multi_released: false,
        }));
    }

    // --- Sending -----------------------------------------------------------------

    /// Posts a send. Never blocks: out of resources, it says so.
    ///
    /// # Safety
    /// `req.iov` must stay valid until the send completes (until this call
    /// returns for an inject).
    pub unsafe fn send(&mut self, req: SendReq<M::Addr>) -> Result<(), PostError> {
        let len = total_len(&req.iov);
        if len > self.cfg.max_msg_size || (req.inject && len > self.cfg.eager_size) {
            return Err(PostError::TooLong);
        }
        if self.outstanding_sends >= self.cfg.tx_size {
            return Err(PostError::Again);
        }
        let peer = self.peer_index(&req.dest)?;
        if self.peers[peer].dead {
            return Err(PostError::Unreachable);
        }
        let inline = len <= inline_capacity(&req.info);
        if req.inject && !self.inject_ready(peer, inline) {
            return Err(PostError::Again);
        }
        if inline {
            return self.send_inline(peer, &req, len);
        }
        let kind = if len <= self.cfg.eager_size {
            let bounce = self.bounce_pool.get().ok_or(PostError::Again)?;
            // SAFETY: the iov is valid (caller); the bounce buffer holds a slot, at
            // least eager_size >= len bytes, of our own dmable memory.
            unsafe { gather(&req.iov, 0, self.bounce_pool.addr(bounce), len) };
            TxKind::Eager {
                bounce,
                state: EagerState::Waiting,
            }
        } else {
            TxKind::Rendezvous {
                iov: req.iov.clone(),
                bounce: None,
            }
        };
        let rendezvous = matches!(kind, TxKind::Rendezvous { .. });
        let op = self.tx_ops.insert(TxOp {
            peer,
            context: req.context,
            info: req.info,
            len,
            completion: req.completion && !req.inject,
            kind,
        });
        self.outstanding_sends += 1;
        self.peers[peer].data.push_back(if rendezvous {
            DataItem::Rts { op }
        } else {
            DataItem::Eager { op }
        });
        self.mark_active(peer);
        self.flush_peer(peer);
        if req.inject {
            self.push_out_eager(peer, op);
        }
        Ok(())
    }

    /// An inject has no completion the application would wait for, so it
    /// may never call in again: it must leave within this call, or be
    /// refused. It can when nothing is queued ahead of it and, beyond the
    /// inline size, the peer's ring has a free slot (or the peer has no
    /// ring: then it goes by rendezvous, which needs the receiver anyway).
    fn inject_ready(&mut self, peer: PeerIdx, inline: bool) -> bool {
        let ready = |state: &Peer<M::Addr, M::Peer, D::Node>| {
            state.data.is_empty()
                && (inline
                    || match &state.tx {
                        Some(ring) => ring.credits > 0,
                        None => state.hello_received,
                    })
        };
        if !ready(&self.peers[peer]) {
            self.progress();
        }
        ready(&self.peers[peer])
    }

    /// Waits for the DMA of an injected eager send (its modeled time, a few
    /// microseconds at most) and sends its announcement now.
    fn push_out_eager(&mut self, peer: PeerIdx, op: usize) {
        let in_flight = |this: &Self| {
            matches!(
                this.tx_ops.slots.get(op),
                Some(Some(TxOp {
                    kind: TxKind::Eager {
                        state: EagerState::InFlight,
                        ..
                    },
                    ..
                }))
            )
        };
        while in_flight(self) {
            std::hint::spin_loop();
            self.reap_dma();
        }
        self.flush_peer(peer);
    }

    fn send_inline(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<M::Addr>,
        len: usize,
    ) -> Result<(), PostError> {
        let mut bytes = [0u8; 24];
        // SAFETY: the iov is valid (caller of send); len fits the buffer.
        unsafe { gather(&req.iov, 0, bytes.as_mut_ptr(), len) };
        let message = Wire::Inline {
            info: req.info,
            payload: InlineBytes::new(&bytes[..len]),
        }
        .encode();
        let state = &self.peers[peer];
        if state.data.is_empty() {
            let route = state.route.as_ref().expect("live peers have a route");
            match self.mbx.send(route, &message) {
                Ok(()) => {
                    // An inject still counts (send counters), without a CQ entry.
                    self.events.push_back(Event::Send {
                        context: req.context,
                        tagged: req.info.tag.is_some(),
                        completion: req.completion && !req.inject,
                    });
                    return Ok(());
                }
                // An inject must not wait in a queue (see inject_ready).
                Err(MailboxError::Busy) if req.inject => return Err(PostError::Again),
                Err(MailboxError::Busy) => {}
                Err(e) => {
                    self.fail_peer(peer);
                    return Err(post_error(e));
                }
            }
        }
        // Behind earlier data, or the mailbox is full: queue it, in order.
        // Injects too get an op: they complete (and count) when they leave.
        self.outstanding_sends += 1;
        let op = self.tx_ops.insert(TxOp {
            peer,
            context: req.context,
            info: req.info,
            len,
            completion: req.completion && !req.inject,
            kind: TxKind::Inline,
        });
        self.peers[peer]
            .data
            .push_back(DataItem::Inline { message, op });
        self.mark_active(peer);
        Ok(())
    }

    fn complete_send(&mut self, op: usize) {
        let Some(tx) = self.tx_ops.remove(op) else {
            return;
        };
        self.outstanding_sends -= 1;
        self.release_bounce(&tx.kind);
        // Injects report too (`completion` is false for them): counters
        // count every send, CQs only those asking for an entry.
        self.events.push_back(Event::Send {
            context: tx.context,
            tagged: tx.info.tag.is_some(),
            completion: tx.completion,
        });
    }

    /// Sends what `peer`'s queues hold, as far as the mailbox and credits
    /// allow. Returns whether anything is left.
    fn flush_peer(&mut self, peer: PeerIdx) -> bool {
        if self.peers[peer].route.is_none() {
            return false;
        }
        // Control first: it frees resources the data may be waiting for.
        while let Some(message) = self.peers[peer].control.front() {
            let route = self.peers[peer].route.as_ref().expect("checked above");
            match self.mbx.send(route, message) {
                Ok(()) => {
                    self.peers[peer].control.pop_front();
                }
                Err(MailboxError::Busy) => return true,
                Err(_) => {
                    self.fail_peer(peer);
                    return false;
                }
            }
        }
        self.start_eager_dma(peer);
        self.reap_dma();
        while let Some(item) = self.peers[peer].data.front() {
            let (message, op, piggyback) = match *item {
                DataItem::Inline { message, op } => (message, Some(op), 0),
                DataItem::Eager { op } => {
                    let tx = self.tx_ops.slots[op].as_ref().expect("queued op exists");
                    let (info, len) = (tx.info, tx.len);
                    let TxKind::Eager { state, .. } = tx.kind else {
                        unreachable!("eager item holds an eager op")
                    };
                    if state != EagerState::Done {
                        return true;
                    }
                    let credits = self.take_owed(peer);
                    let message = Wire::Eager {
                        info,
                        len: len as u32,
                        credits,
                    };
                    (message.encode(), Some(op), credits)
                }
                DataItem::Rts { op } => {
                    let tx = self.tx_ops.slots[op].as_ref().expect("queued op exists");
                    let (info, len) = (tx.info, tx.len);
                    let credits = self.take_owed(peer);
                    let message = Wire::Rts {
                        info,
                        send_id: op as u16,
                        len: len as u32,
                        credits,
                    };
                    (message.encode(), None, credits)
                }
            };
            let route = self.peers[peer].route.as_ref().expect("checked above");
            match self.mbx.send(route, &message) {
                Ok(()) => {
                    let item = self.peers[peer].data.pop_front();
                    if let (Some(op), Some(DataItem::Inline { .. } | DataItem::Eager { .. })) =
                        (op, item)
                    {
                        self.complete_send(op);
                    }
                }
                Err(MailboxError::Busy) => {
                    if let Some(rx) = self.peers[peer].rx.as_mut() {
                        rx.owed += piggyback as usize;
                    }
                    return true;
                }
                Err(_) => {
                    self.fail_peer(peer);
                    return false;
                }
            }
        }
        false
    }

    /// Starts the DMA of queued eager sends that have a credit, in order.
    fn start_eager_dma(&mut self, peer: PeerIdx) {
        let state = &mut self.peers[peer];
        let Some(ring) = state.tx.as_mut() else {
            if state.hello_received {
                self.eager_by_rendezvous(peer);
            }
            return;
        };
        for item in &state.data {
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.slots[op].as_mut().expect("queued op exists");
            let TxKind::Eager {
                bounce,
                state: ref mut eager,
            } = tx.kind
            else {
                continue;
            };
            if *eager != EagerState::Waiting {
                continue;
            }
            if ring.credits == 0 {
                break;
            }
            let remote = ring.base + (ring.next * ring.slot_size) as u64;
            match self
                .dma
                .put(self.bounce_pool.addr(bounce), tx.len, ring.reg, remote)
            {
                Ok(id) => {
                    ring.credits -= 1;
                    ring.next = (ring.next + 1) % ring.slots;
                    *eager = EagerState::InFlight;
                    self.dma_waiters.insert(id, Waiter::Eager { op });
                }
                Err(e) => {
                    tracing::warn!("eager DMA refused: {e}");
                    break;
                }
            }
        }
    }

    /// A peer that offers no eager ring (it had no dmable memory for one, or
    /// we could not register it) gets queued eager messages by rendezvous,
    /// from the bounce buffers they were copied into.
    fn eager_by_rendezvous(&mut self, peer: PeerIdx) {
        for item in self.peers[peer].data.iter_mut() {
            let DataItem::Eager { op } = *item else {
                continue;
            };
            let tx = self.tx_ops.slots[op].as_mut().expect("queued op exists");
            let TxKind::Eager { bounce, .. } = tx.kind else {
                continue;
            };
            tx.kind = TxKind::Rendezvous {
                iov: IovList::One((self.bounce_pool.addr(bounce) as usize, tx.len)),
                bounce: Some(bounce),
            };
            *item = DataItem::Rts { op };
        }
    }

    /// Credits owed to `peer`, taken for piggybacking (at most 255).
    fn take_owed(&mut self, peer: PeerIdx) -> u8 {
        let Some(rx) = self.peers[peer].rx.as_mut() else {
            return 0;
        };
        let credits = rx.owed.min(u8::MAX as usize);
        rx.owed -= credits;
        credits as u8
    }

    // --- Progress ----------------------------------------------------------------

    /// Advances everything: DMA completions, arrived messages, deferred work,
    /// credits and queued sends.
    pub fn progress(&mut self) {
        // Waiting for a message with nothing in flight is the common case
        // (MPI polls in a loop): a look at the mailbox is all it takes.
        if self.dma_waiters.is_empty()
            && self.active.is_empty()
            && self.deferred_grants.is_empty()
            && self.deferred_fragments.is_empty()
            && !self.mbx.has_message()
        {
            self.check_peers();
            return;
        }
        self.reap_dma();
        for _ in 0..self.cfg.poll_budget {
            let Some((src, message)) = self.mbx.poll() else {
                break;
            };
            self.dispatch(src, &message);
        }
        self.retry_deferred();
        self.return_credits();
        self.flush_active();
        self.reap_dma();
        self.check_peers();
    }

    fn flush_active(&mut self) {
        let mut active = std::mem::take(&mut self.active_spare);
        std::mem::swap(&mut active, &mut self.active);
        for &peer in &active {
            self.peers[peer].active = false;
            if self.flush_peer(peer) {
                self.mark_active(peer);
            }
        }
        active.clear();
        self.active_spare = active;
    }

    fn reap_dma(&mut self) {
        while let Some(id) = self.dma.poll() {
            match self.dma_waiters.remove(&id) {
                Some(Waiter::Eager { op }) => {
                    if let Some(tx) = self.tx_ops.get_mut(op) {
                        if let TxKind::Eager { state, .. } = &mut tx.kind {
                            *state = EagerState::Done;
                        }
                        let peer = tx.peer;
                        self.mark_active(peer);
                    }
                }
                Some(Waiter::Fragment {
                    op,
                    fragment,
                    recv_id,
                    staging,
                }) => {
                    if let Some(staging) = staging {
                        self.tx_staging.put(staging);
                    }
                    if let Some(tx) = self.tx_ops.get_mut(op) {
                        let peer = tx.peer;
                        let done = Wire::FragDone {
                            send_id: op as u16,
                            fragment,
                            recv_id,
                        };
                        self.queue_control(peer, done.encode());
                    }
                }
                None => tracing::warn!(?id, "completion of an unknown DMA"),
            }
        }
    }

    fn return_credits(&mut self) {
        for peer in 0..self.peers.len() {
            let Some(rx) = self.peers[peer].rx.as_ref() else {
                continue;
            };
            // Half the ring: a sender that ran dry always gets its credits back.
            if rx.owed > 0 && rx.owed >= rx.slots.div_ceil(2) && !self.peers[peer].dead {
                let credits = self.take_owed(peer);
                self.queue_control(peer, Wire::Credit { credits }.encode());
            }
        }
    }

    fn retry_deferred(&mut self) {
        while let Some(&id) = self.deferred_grants.front() {
            // It may have been granted up to its window since it queued.
            if self.wants_grant(id) && !self.grant_next(id) {
                break;
            }
            self.deferred_grants.pop_front();
            self.continue_granting(id);
        }
        while let Some(grant) = self.deferred_fragments.pop_front() {
            if !self.put_fragment(grant) {
                self.deferred_fragments.push_front(grant);
                break;
            }
        }
    }

    fn dispatch(&mut self, src: M::Addr, message: &Message) {
        let Some(wire) = Wire::decode(message) else {
            tracing::warn!(%src, "malformed message dropped");
            return;
        };
        let peer = self.peer_for_source(&src);
        match wire {
            Wire::Hello {
                node,
                ring,
                slot_shift,
                slots,
            } => self.on_hello(peer, &node, ring, slot_shift, slots),
            Wire::Inline { info, payload } => {
                let bytes = payload.as_slice();
                self.deliver(src, info, bytes.len(), bytes.as_ptr());
            }
            Wire::Eager { info, len, credits } => {
                self.add_credits(peer, credits);
                let Some(rx) = self.peers[peer].rx.as_mut() else {
                    tracing::warn!(%src, "eager message from a peer without our ring; dropped");
                    return;
                };
                let slot = rx.memory.as_ptr().wrapping_add(rx.next * rx.slot_size);
                let len = (len as usize).min(rx.slot_size);
                rx.next = (rx.next + 1) % rx.slots;
                rx.owed += 1;
                self.deliver(src, info, len, slot);
            }
            Wire::Rts {
                info,
                send_id,
                len,
                credits,
            } => {
                self.add_credits(peer, credits);
                let len = len as usize;
                match self.matcher.match_arrival(&src, &info, len) {
                    Some(placement) => self.start_rx_xfer(peer, src, send_id, info, len, placement),
                    None => self.matcher.push_unexpected(Unexpected {
                        src,
                        info,
                        len,
                        body: Held::Rts { peer, send_id },
                        claimed_by: None,
                    }),
                }
            }
            Wire::Grant {
                send_id,
                fragment,
                addr,
                len,
                recv_id,
            } => {
                let grant = Grant {
                    op: send_id as usize,
                    fragment,
                    addr,
                    len: len as usize,
                    recv_id,
                };
                if !self.deferred_fragments.is_empty() || !self.put_fragment(grant) {
                    self.deferred_fragments.push_back(grant);
                }
            }
            Wire::FragDone {
                fragment, recv_id, ..
            } => self.on_fragment_done(recv_id as usize, fragment),
            Wire::Fin { send_id } => self.complete_send(send_id as usize),
            Wire::Credit { credits } => self.add_credits(peer, credits),
        }
    }

    fn add_credits(&mut self, peer: PeerIdx, credits: u8) {
        if credits == 0 {
            return;
        }
        if let Some(tx) = self.peers[peer].tx.as_mut() {
            tx.credits = (tx.credits + credits as usize).min(tx.slots);
        }
        self.mark_active(peer);
    }

    // --- Receiving ---------------------------------------------------------------

    /// A message whose `len` bytes are at `data` (a mailbox message or an
    /// eager slot, both ours until this returns).
    fn deliver(&mut self, src: M::Addr, info: MatchInfo, len: usize, data: *const u8) {
        match self.matcher.match_arrival(&src, &info, len) {
            Some(placement) => {
                let copied = len.min(placement.capacity());
                // SAFETY: the placement's iov is a posted receive buffer,
                // valid until its completion; `data` holds `len` bytes.
                unsafe { scatter(&placement.iov, 0, data, copied) };
                self.complete_recv(placement, src, info, len, copied);
            }
            None => {
                // SAFETY: `data` holds `len` bytes (see above).
                let bytes = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
                self.matcher.push_unexpected(Unexpected {
                    src,
                    info,
                    len,
                    body: Held::Data(bytes),
                    claimed_by: None,
                });
            }
        }
    }

    fn complete_recv(
        &mut self,
        placement: Placement,
        src: M::Addr,
        info: MatchInfo,
        msg_len: usize,
        copied: usize,
    ) {
        if copied < msg_len {
            let olen = msg_len - copied;
            self.complete_recv_error(placement, Some(src), info, olen, ErrorKind::Truncated);
            return;
        }
        let multi_released = placement
            .multi
            .is_some_and(|id| self.matcher.multi_piece_done(id) == MultiDone::Released);
        self.events.push_back(Event::Recv(RecvDone {
            context: placement.context,
            completion: placement.completion,
            tagged: info.tag.is_some(),
            buf: placement.buf(),
            len: copied,
            tag: info.tag.unwrap_or(0),
            data: info.data,
            src,
            multi_released,
            multi: placement.multi.is_some(),
        }));
    }

    fn complete_recv_error(
        &mut self,
        placement: Placement,
        src: Option<M::Addr>,
        info: MatchInfo,
        olen: usize,
        kind: ErrorKind,
    ) {
        let multi_released = placement
            .multi
            .is_some_and(|id| self.matcher.multi_piece_done(id) == MultiDone::Released);
        let len = if kind == ErrorKind::Truncated {
            placement.capacity()
        } else {
            0
        };
        self.events.push_back(Event::Error(OpError {
            context: placement.context,
            kind,
            send: false,
            tagged: info.tag.is_some(),
            buf: placement.buf(),
            len,
            olen,
            tag: info.tag.unwrap_or(0),
            data: info.data,
            src,
            multi_released,
        }));
    }

    /// Posts a receive; it may complete at once from unexpected messages.
    ///
    /// # Safety
    /// `recv.iov` must stay valid until the receive completes.
    pub unsafe fn post_recv(&mut self, tagged: bool, recv: PostedRecv<M::Addr>) {
        let context = recv.context;
        let multi = recv.multi_recv;
        let dead_src = recv
            .src
            .and_then(|src| self.by_addr.get(&src).copied())
            .filter(|&peer| self.peers[peer].dead);
        let mut next = self.matcher.post(tagged, recv);
        if next.is_none() {
            if let Some(peer) = dead_src {
                // Queued: nothing it could match is left from that peer.
                self.fail_receives_from(peer);
                return;
            }
        }
        while let Some((placement, message)) = next {
            self.take_unexpected(placement, message);
            next = if multi {
                self.matcher.repost_multi(context)
            } else {
                None
            };
        }
    }

    fn take_unexpected(&mut self, placement: Placement, message: Unexpected<M::Addr, Held>) {
        match message.body {
            Held::Data(bytes) => {
                let copied = bytes.len().min(placement.capacity());
                // SAFETY: the placement's iov is a posted receive buffer.
                unsafe { scatter(&placement.iov, 0, bytes.as_ptr(), copied) };
                self.complete_recv(placement, message.src, message.info, message.len, copied);
            }
            Held::Rts { peer, send_id } => self.start_rx_xfer(
                peer,
                message.src,
                send_id,
                message.info,
                message.len,
                placement,
            ),
        }
    }

    /// `FI_PEEK` (with `claim`, `FI_CLAIM` too; with `discard`, drops the
    /// message): reports the first unexpected message `probe` accepts, or a
    /// `NoMessage` error.
    pub fn peek(&mut self, tagged: bool, probe: PostedRecv<M::Addr>, claim: bool, discard: bool) {
        let found = self
            .matcher
            .peek(tagged, &probe, claim && !discard)
            .map(|u| (u.src, u.info, u.len));
        let Some((src, info, len)) = found else {
            self.events.push_back(Event::Error(OpError {
                context: probe.context,
                kind: ErrorKind::NoMessage,
                send: false,
                tagged,
                buf: 0,
                len: 0,
                olen: 0,
                tag: probe.tag,
                data: None,
                src: None,
                multi_released: false,
            }));
            return;
        };
        if discard {
            let _ = self.matcher.peek(tagged, &probe, true);
            if let Some(message) = self.matcher.take_claimed(tagged, probe.context) {
                self.discard(message);
            }
        }
        self.events.push_back(Event::Recv(RecvDone {
            context: probe.context,
            completion: true,
            tagged,
            buf: 0,
            len,
            tag: info.tag.unwrap_or(0),
            data: info.data,
            src,
            multi_released: false,
            multi: false,
        }));
    }

    /// `FI_CLAIM`: receives the message an earlier peek claimed for this
    /// context (or drops it with `discard`). False if there is none.
    ///
    /// # Safety
    /// As for [`Self::post_recv`].
    pub unsafe fn claim(&mut self, tagged: bool, recv: PostedRecv<M::Addr>, discard: bool) -> bool {
        let Some(message) = self.matcher.take_claimed(tagged, recv.context) else {
            return false;
        };
        if discard {
            let (src, info, len) = (message.src, message.info, message.len);
            self.discard(message);
            self.events.push_back(Event::Recv(RecvDone {
                context: recv.context,
                completion: recv.completion,
                tagged,
                buf: 0,
                len,
                tag: info.tag.unwrap_or(0),
                data: info.data,
                src,
                multi_released: false,
                multi: false,
            }));
            return true;
        }
        let placement = Placement {
            context: recv.context,
            iov: recv.iov,
            completion: recv.completion,
            multi: None,
        };
        self.take_unexpected(placement, message);
        true
    }

    /// Drops an unexpected message; a rendezvous sender is told it is done.
    fn discard(&mut self, message: Unexpected<M::Addr, Held>) {
        if let Held::Rts { peer, send_id } = message.body {
            self.queue_control(peer, Wire::Fin { send_id }.encode());
        }
    }

    /// `fi_cancel` of a posted receive. Returns whether one was found.
    pub fn cancel(&mut self, context: usize) -> bool {
        let Some(Cancelled {
            tagged,
            recv,
            released,
        }) = self.matcher.cancel(context)
        else {
            return false;
        };
        self.fail_posted(tagged, &recv, ErrorKind::Canceled, None, released);
        true
    }

    /// Reports a posted receive that ends without data.
    fn fail_posted(
        &mut self,
        tagged: bool,
        recv: &PostedRecv<M::Addr>,
        kind: ErrorKind,
        src: Option<M::Addr>,
        multi_released: bool,
    ) {
        self.events.push_back(Event::Error(OpError {
            context: recv.context,
            kind,
            send: false,
            tagged,
            buf: recv.iov.first().map_or(0, |&(addr, _)| addr),
            len: 0,
            olen: 0,
            tag: recv.tag,
            data: None,
            src,
            multi_released,
        }));
    }

    // --- Rendezvous ----------------------------------------------------------------

    fn start_rx_xfer(
        &mut self,
        peer: PeerIdx,
        src: M::Addr,
        send_id: u16,
        info: MatchInfo,
        msg_len: usize,
        placement: Placement,
    ) {
        if self.peers[peer].dead {
            // Its request arrived before it died; its data never will.
            self.complete_recv_error(placement, Some(src), info, 0, ErrorKind::PeerUnreachable);
            return;
        }
        let xfer_len = msg_len.min(placement.capacity());
        let fragments = xfer_len.div_ceil(self.cfg.fragment_size) as u32;
        let direct = placement.iov.len() == 1
            && self
                .dma
                .is_dmable(placement.iov[0].0 as *const u8, xfer_len.max(1));
        let id = self.rx_xfers.insert(RxXfer {
            peer,
            src,
            send_id,
            info,
            placement,
            msg_len,
            xfer_len,
            fragments,
            next_grant: 0,
            done: 0,
            direct,
            staged: HashMap::new(),
        });
        if fragments == 0 {
            self.finish_rx(id);
            return;
        }
        self.continue_granting(id);
    }

    /// Whether transfer `id` exists and may be granted another fragment:
    /// some are left and its window is not full.
    fn wants_grant(&self, id: usize) -> bool {
        let window = self.cfg.rendezvous_window.max(1) as u32;
        self.rx_xfers
            .slots
            .get(id)
            .and_then(Option::as_ref)
            .is_some_and(|x| x.next_grant < x.fragments && x.next_grant - x.done < window)
    }

    /// Grants fragments of transfer `id` up to its window. Transfers waiting
    /// for staging buffers are served in turn: while some wait, `id` queues
    /// behind them (once: a queued transfer is granted up to its window
    /// when its turn comes).
    fn continue_granting(&mut self, id: usize) {
        while self.wants_grant(id) {
            let queued = !self.deferred_grants.is_empty();
            if (queued && self.deferred_grants.front() != Some(&id)) || !self.grant_next(id) {
                if !self.deferred_grants.contains(&id) {
                    self.deferred_grants.push_back(id);
                }
                return;
            }
        }
    }

    /// Grants the next fragment of `id` (which [`Self::wants_grant`]); false
    /// if no staging buffer is free.
    fn grant_next(&mut self, id: usize) -> bool {
        let fragment_size = self.cfg.fragment_size;
        let Some(xfer) = self.rx_xfers.get_mut(id) else {
            return true;
        };
        let fragment = xfer.next_grant;
        let offset = fragment as usize * fragment_size;
        let len = fragment_size.min(xfer.xfer_len - offset);
        let addr = if xfer.direct {
            (xfer.placement.iov[0].0 + offset) as u64
        } else {
            let Some(staging) = self.rx_staging.get() else {
                return false;
            };
            xfer.staged.insert(fragment, staging);
            self.rx_staging.addr(staging) as u64
        };
        xfer.next_grant += 1;
        let (peer, send_id) = (xfer.peer, xfer.send_id);
        let grant = Wire::Grant {
            send_id,
            fragment,
            addr,
            len: len as u32,
            recv_id: id as u16,
        };
        self.queue_control(peer, grant.encode());
        true
    }

    fn on_fragment_done(&mut self, id: usize, fragment: u32) {
        let fragment_size = self.cfg.fragment_size;
        let Some(xfer) = self.rx_xfers.get_mut(id) else {
            tracing::warn!(id, "fragment report for an unknown transfer");
            return;
        };
        if let Some(staging) = xfer.staged.remove(&fragment) {
            let offset = fragment as usize * fragment_size;
            let len = fragment_size.min(xfer.xfer_len - offset);
            // SAFETY: the staging buffer holds the fragment (its DMA completed
            // before the sender reported it); the iov is the posted buffer.
            unsafe {
                scatter(
                    &xfer.placement.iov,
                    offset,
                    self.rx_staging.addr(staging),
                    len,
                )
            };
            self.rx_staging.put(staging);
        }
        xfer.done += 1;
        if xfer.done == xfer.fragments {
            self.finish_rx(id);
        } else {
            self.continue_granting(id);
        }
    }

    fn finish_rx(&mut self, id: usize) {
        let xfer = self.rx_xfers.remove(id).expect("transfer exists");
        self.deferred_grants.retain(|&d| d != id);
        self.queue_control(
            xfer.peer,
            Wire::Fin {
                send_id: xfer.send_id,
            }
            .encode(),
        );
        self.complete_recv(
            xfer.placement,
            xfer.src,
            xfer.info,
            xfer.msg_len,
            xfer.xfer_len,
        );
    }

    fn release_staged(&mut self, xfer: &RxXfer<M::Addr>) {
        for &staging in xfer.staged.values() {
            self.rx_staging.put(staging);
        }
    }

    /// Puts one granted fragment; false if no staging buffer is free.
    fn put_fragment(&mut self, grant: Grant) -> bool {
        let fragment_size = self.cfg.fragment_size;
        let Some(tx) = self.tx_ops.slots.get(grant.op).and_then(Option::as_ref) else {
            tracing::warn!(op = grant.op, "grant for an unknown send");
            return true;
        };
        let TxKind::Rendezvous { iov, .. } = &tx.kind else {
            tracing::warn!(op = grant.op, "grant for a send that is not a rendezvous");
            return true;
        };
        let offset = grant.fragment as usize * fragment_size;
        let len = grant.len.min(tx.len.saturating_sub(offset));
        let peer = tx.peer;
        let Some(node) = self.peers[peer].node else {
            tracing::warn!(peer, "grant from a peer that never said hello");
            return true;
        };
        let direct = iov.len() == 1
            && self
                .dma
                .is_dmable((iov[0].0 + offset) as *const u8, len.max(1));
        let (src, staging) = if direct {
            ((iov[0].0 + offset) as *const u8, None)
        } else {
            let Some(staging) = self.tx_staging.get() else {
                return false;
            };
            let at = self.tx_staging.addr(staging);
            // SAFETY: the send's iov is valid until it completes; the staging buffer
            // holds fragment_size >= len bytes.
            unsafe { gather(iov, offset, at, len) };
            (at as *const u8, Some(staging))
        };
        let reg = match self.registration(node, grant.addr, len) {
            Ok(reg) => reg,
            Err(e) => {
                tracing::warn!(%node, "cannot register a granted fragment: {e}");
                if let Some(staging) = staging {
                    self.tx_staging.put(staging);
                }
                self.fail_peer(peer);
                return true;
            }
        };
        let result = self.dma.put(src, len, reg.0, grant.addr);
        for stale in reg.1 {
            let _ = self.dma.deregister(stale);
        }
        match result {
            Ok(id) => {
                self.dma_waiters.insert(
                    id,
                    Waiter::Fragment {
                        op: grant.op,
                        fragment: grant.fragment,
                        recv_id: grant.recv_id,
                        staging,
                    },
                );
                self.reap_dma();
            }
            Err(e) => {
                tracing::warn!("fragment DMA refused: {e}");
                if let Some(staging) = staging {
                    self.tx_staging.put(staging);
                }
                self.fail_peer(peer);
            }
        }
        true
    }

    /// A registration covering `[addr, addr + len)` of `node`, from the cache
    /// if it can, with the registrations to release once the caller's DMA
    /// has been submitted.
    fn registration(
        &mut self,
        node: D::Node,
        addr: u64,
        len: usize,
    ) -> Result<(RegId, Vec<RegId>), DmaError> {
        let ticket = match self.regcache.lookup(node, addr, len as u64) {
            Ok(&reg) => return Ok((reg, Vec::new())),
            Err(ticket) => ticket,
        };
        let (start, aligned) = self
            .regcache
            .page_range(addr, len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        let reg = match self.dma.register(node, start, aligned as usize) {
            Ok(reg) => reg,
            // The page-aligned range may poke past the node's memory.
            Err(DmaError::OutOfBounds) => {
                let reg = self.dma.register(node, addr, len)?;
                return Ok((reg, vec![reg]));
            }
            Err(e) => return Err(e),
        };
        Ok((reg, self.regcache.insert(ticket, node, start, aligned, reg)))
    }
}

#[cfg(test)]
mod tests;
