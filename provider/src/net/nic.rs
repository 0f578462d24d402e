//! The process's network interface: one endpoint of the transport
//! provider, shared by every domain and endpoint of the process (a process
//! is one Unimem node, and a node has one interface), and the thread that
//! keeps it answering while the application computes.
//!
//! What it carries for the backend's mailboxes and DMA engines:
//! - mailbox messages, each one packet (`packet.rs`), sorted on arrival
//!   into the inbox of the mailbox they are for;
//! - puts and gets, as the transport's RMA writes and reads into the
//!   segments of the peer's dmable memory that the peer registered with the
//!   transport and named in a directory reply (nothing else of a process
//!   is open to the network);
//! - key lookups, answered by the owner from its key table;
//! - "alive" packets: a peer not heard from for `net_timeout_ms` is dead,
//!   whether its process died, its host went down or its link was cut.
//!
//! Whoever polls moves everything: an endpoint's progress (the data path,
//! when it talks to other hosts), a thread waiting for an answer, and the
//! interface's own thread when nobody else has for a millisecond.
//! Completions of DMA go to the engine that started them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use unimem_dma::{DmaError, DmaId, DmaRegion, ShmDmaEngine};
use unimem_mailbox::{MailboxAddr, Message, NicAddr, NodeId, Profile};

use super::packet::{
    max_packet, write_target, Packet, Segment, Write, MAX_BATCH, WRITE_MAX, WRITE_OVERHEAD,
};
use super::transport::{Completion, Registration, Transport, POLL_MAX};
use crate::base::ffi;

/// Receive buffers kept posted.
const RECV_BUFFERS: usize = 64;
/// How often the interface's thread looks whether it must poll.
const TICK: Duration = Duration::from_millis(1);
/// The thread's tick while no process of another host is known: a job of
/// one host leaves it asleep (a first contact waits that long at most).
pub const IDLE_TICK: Duration = Duration::from_millis(20);
/// How often a process tells the processes it talks to that it is alive.
const ALIVE_EVERY: Duration = Duration::from_millis(500);
/// The network is quiet for us once no mailbox message came or left for a
/// whole tick (the interface's thread says so); the data path then polls
/// the transport at most every `QUIET_POLL_NS`. An empty poll of a socket
/// transport is a system call: done on every call, it slows the traffic
/// with this host's neighbours of a process that also has peers on other
/// hosts.
const QUIET_POLL_NS: u64 = 20_000;
/// At most one "did not run" warning this often (a starved thread would
/// say it at every look).
const STALL_WARNING_EVERY: Duration = Duration::from_secs(10);

/// What a completion's context names: the kind in the top bits.
const KIND_SHIFT: u32 = 60;
const RECV: u64 = 1;
const SEND: u64 = 2;
const DMA: u64 = 3;
/// A DMA's context: its engine's slot and its id, in 40 bits.
const DMA_ID_BITS: u32 = 40;

/// Mailbox messages that came for one mailbox of this process.
#[derive(Default)]
pub struct Inbox {
    queue: Mutex<VecDeque<(MailboxAddr, Message)>>,
    len: AtomicUsize,
}

impl Inbox {
    pub fn pop(&self) -> Option<(MailboxAddr, Message)> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut queue = self.queue.lock();
        let got = queue.pop_front();
        self.len.store(queue.len(), Ordering::Release);
        got
    }

    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    fn push(&self, from: MailboxAddr, messages: &[Message]) {
        let mut queue = self.queue.lock();
        queue.extend(messages.iter().map(|m| (from, *m)));
        self.len.store(queue.len(), Ordering::Release);
    }
}

/// A process on another host we talk to.
struct RemoteProcess {
    fi_addr: ffi::fi_addr_t,
    last_heard: Instant,
    last_sent: Instant,
    dead: bool,
    /// Its mailboxes that told us they are gone.
    gone: HashSet<u32>,
    /// Its directory, once asked for: by virtual address or offset.
    segments: Option<(bool, Vec<Segment>)>,
}

/// Our memory registered with the transport.
struct OwnSegment {
    segment: Segment,
    /// Kept until the interface closes: a peer may still use its key.
    _registration: Registration,
}

/// Mailbox messages from one of our mailboxes to one mailbox of another
/// process, gathered into one packet until the next poll.
struct Batch {
    nic: NicAddr,
    dst_index: u32,
    from: MailboxAddr,
    count: usize,
    messages: [Message; MAX_BATCH],
}

/// A short put to a process of another host, encoded as a write packet
/// ([`Write`]), waiting to leave with the mailbox messages sent after it.
struct PendingWrite {
    nic: NicAddr,
    bytes: Vec<u8>,
}

struct State {
    transport: Transport,
    /// What leaves with the next poll, in this order: a write, then the
    /// batch (both to one process).
    write: Option<PendingWrite>,
    batch: Option<Batch>,
    /// A write packet's buffer, kept for the next one.
    write_spare: Vec<u8>,
    /// A batch's encoding, kept for the next one.
    mailbox_scratch: Vec<u8>,
    recv_buffers: Vec<Box<[u8]>>,
    processes: HashMap<NicAddr, RemoteProcess>,
    inboxes: HashMap<u32, Arc<Inbox>>,
    /// Packets whose buffers must live until their send completes.
    sends: Vec<Option<Vec<u8>>>,
    free_sends: Vec<usize>,
    /// Our packets the transport had no room for yet, in order.
    backlog: VecDeque<(NicAddr, Vec<u8>)>,
    /// Where each DMA in flight goes (to blame the right peer for an error).
    dma_dest: HashMap<u64, NicAddr>,
    /// Completed DMAs by engine slot.
    dma_done: HashMap<u16, Vec<DmaId>>,
    replies: HashMap<u32, Packet>,
    own: Vec<OwnSegment>,
    /// Reads our own directory and key table.
    local: ShmDmaEngine,
    next_key: u64,
    completions: Vec<Completion>,
    scratch: Vec<u8>,
    dropped: u64,
    last_warning: Option<Instant>,
    /// When this process last said it did not run.
    last_stall_warning: Option<Instant>,
    counters: Counters,
}

/// What the interface carried so far (for the log: the proof that peers
/// of other hosts were reached through the network).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub packets_out: u64,
    pub packets_in: u64,
    pub transfers: u64,
    pub transfer_bytes: u64,
}

/// The process's network interface.
pub struct Nic {
    state: Mutex<State>,
    /// Where peers reach it.
    pub name: NicAddr,
    pub provider: String,
    /// Longest put that travels in a write packet (`net_write_max`, 0:
    /// none): a packet's order with the others must hold (see
    /// `Transport::in_order_max`).
    pub write_max: usize,
    timeout: Duration,
    pid: u32,
    /// Processes of other hosts known: the data path polls only if any.
    remote_processes: AtomicUsize,
    /// An endpoint polled since the interface's thread last looked.
    polled: AtomicBool,
    /// When an endpoint last polled while the network was quiet (ns since
    /// `epoch`).
    polled_at: AtomicU64,
    /// A mailbox message came or left over the network since the
    /// interface's thread last looked.
    active: AtomicBool,
    /// No mailbox message came or left over the network for a tick or more
    /// (the interface's thread says so; a message says otherwise at once).
    quiet: AtomicBool,
    epoch: Instant,
    next_req: AtomicU32,
    next_engine: AtomicU32,
    stop: AtomicBool,
}

impl Nic {
    /// Opens the interface of provider `provider` at `ip`, for the process
    /// whose dmable memory is `region`, and starts its thread.
    pub fn open(
        provider: &str,
        ip: [u8; 4],
        region: Arc<DmaRegion>,
        timeout: Duration,
        write_max: usize,
    ) -> Result<Arc<Nic>, String> {
        let transport = Transport::open(provider, ip)?;
        let name = transport.name;
        let provider = transport.provider.clone();
        let write_max = write_max
            .min(WRITE_MAX)
            .min(transport.in_order_max.saturating_sub(WRITE_OVERHEAD));
        let nic = Arc::new(Nic {
            state: Mutex::new(State {
                transport,
                write: None,
                batch: None,
                write_spare: Vec::new(),
                mailbox_scratch: Vec::new(),
                recv_buffers: (0..RECV_BUFFERS)
                    .map(|_| vec![0u8; max_packet(write_max)].into_boxed_slice())
                    .collect(),
                processes: HashMap::new(),
                inboxes: HashMap::new(),
                sends: Vec::new(),
                free_sends: Vec::new(),
                backlog: VecDeque::new(),
                dma_dest: HashMap::new(),
                dma_done: HashMap::new(),
                replies: HashMap::new(),
                own: Vec::new(),
                local: ShmDmaEngine::new(region, Profile::Native),
                next_key: 1,
                completions: Vec::new(),
                scratch: Vec::new(),
                dropped: 0,
                last_warning: None,
                last_stall_warning: None,
                counters: Counters::default(),
            }),
            name,
            provider,
            write_max,
            timeout,
            pid: std::process::id(),
            remote_processes: AtomicUsize::new(0),
            polled: AtomicBool::new(false),
            polled_at: AtomicU64::new(0),
            active: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            epoch: Instant::now(),
            next_req: AtomicU32::new(1),
            next_engine: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        {
            let mut st = nic.state.lock();
            for i in 0..RECV_BUFFERS {
                st.repost(i)?;
            }
        }
        let weak = Arc::downgrade(&nic);
        std::thread::Builder::new()
            .name("unimem-nic".into())
            .spawn(move || run(weak))
            .map_err(|e| format!("cannot start the network thread: {e}"))?;
        Ok(nic)
    }

    /// Whether this interface is this process's (not a forked parent's).
    pub fn is_own(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Stops the thread (the provider is being unloaded).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// A slot for one more DMA engine's completions.
    pub fn engine_slot(&self) -> u16 {
        self.next_engine.fetch_add(1, Ordering::Relaxed) as u16
    }

    /// The inbox of our mailbox `index`, made now.
    pub fn open_inbox(&self, index: u32) -> Arc<Inbox> {
        let inbox = Arc::new(Inbox::default());
        self.state.lock().inboxes.insert(index, Arc::clone(&inbox));
        inbox
    }

    /// Our mailbox `index` closed: messages for it are answered "gone".
    pub fn close_inbox(&self, index: u32) {
        self.state.lock().inboxes.remove(&index);
    }

    /// Whether a process of another host is known.
    pub fn talks_to_other_hosts(&self) -> bool {
        self.remote_processes.load(Ordering::Relaxed) > 0
    }

    /// Polls the transport, as the data path does: when the process talks
    /// to other hosts at all, and nobody else is polling right now; while
    /// the network is quiet for us, not more often than `QUIET_POLL_NS`.
    /// While it is not, without reading the clock: the data path spins on
    /// this.
    pub fn poll_from_data_path(&self) {
        if self.remote_processes.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.quiet.load(Ordering::Relaxed) {
            let now = self.now_ns();
            if now.saturating_sub(self.polled_at.load(Ordering::Relaxed)) < QUIET_POLL_NS {
                return;
            }
            self.polled_at.store(now, Ordering::Relaxed);
        }
        if !self.polled.load(Ordering::Relaxed) {
            self.polled.store(true, Ordering::Relaxed);
        }
        self.progress();
    }

    fn mark_active(&self) {
        if !self.active.load(Ordering::Relaxed) {
            self.active.store(true, Ordering::Relaxed);
        }
        if self.quiet.load(Ordering::Relaxed) {
            self.quiet.store(false, Ordering::Relaxed);
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Moves what the transport has for us; false if another thread is at
    /// it.
    pub fn progress(&self) -> bool {
        let Some(mut st) = self.state.try_lock() else {
            return false;
        };
        st.progress(self);
        true
    }

    /// Whether mailbox `index` of the process at `nic` may still be
    /// reached.
    pub fn alive(&self, nic: NicAddr, index: u32) -> bool {
        let st = self.state.lock();
        st.processes
            .get(&nic)
            .is_none_or(|p| !p.dead && !p.gone.contains(&index))
    }

    /// Sends a mailbox message from our mailbox `from` to mailbox `index`
    /// of the process at `nic`. It leaves with the next poll (the caller's
    /// progress, or the interface's thread within a tick), with the
    /// messages sent after it to the same mailbox: one packet for all.
    pub fn send_mailbox(
        &self,
        from: &MailboxAddr,
        nic: NicAddr,
        index: u32,
        message: &Message,
    ) -> Result<(), unimem_mailbox::Error> {
        let mut st = self.state.lock();
        let process = st
            .process(self, nic)
            .map_err(|_| unimem_mailbox::Error::Invalid)?;
        if process.dead || process.gone.contains(&index) {
            return Err(unimem_mailbox::Error::Dead);
        }
        self.mark_active();
        let write_elsewhere = st.write.as_ref().is_some_and(|w| w.nic != nic);
        if write_elsewhere && st.batch.is_none() && !st.flush_batch(self) {
            drop(st);
            self.progress();
            return Err(unimem_mailbox::Error::Busy);
        }
        if let Some(batch) = st.batch.as_mut() {
            let same = batch.nic == nic && batch.dst_index == index && batch.from == *from;
            if same && batch.count < MAX_BATCH {
                batch.messages[batch.count] = *message;
                batch.count += 1;
                return Ok(());
            }
            if !st.flush_batch(self) {
                drop(st);
                self.progress();
                return Err(unimem_mailbox::Error::Busy);
            }
        }
        let mut messages = [[0u8; unimem_mailbox::MESSAGE_LEN]; MAX_BATCH];
        messages[0] = *message;
        st.batch = Some(Batch {
            nic,
            dst_index: index,
            from: *from,
            count: 1,
            messages,
        });
        Ok(())
    }

    /// Puts `bytes` (at most `write_max`)
    /// at `addr` under `key` in the memory of the process at `nic`, in a
    /// write packet that leaves with the next poll, ahead of the mailbox
    /// messages sent to that process after it and in one transport message
    /// with them. The bytes are copied: the put is done for the caller.
    pub fn write_in_packet(
        &self,
        nic: NicAddr,
        key: u64,
        addr: u64,
        bytes: &[u8],
    ) -> Result<(), DmaError> {
        loop {
            {
                let mut st = self.state.lock();
                let process = st.process(self, nic)?;
                if process.dead {
                    return Err(DmaError::DeadNode);
                }
                process.last_sent = Instant::now();
                // Whatever was gathered before it leaves before it.
                if st.flush_batch(self) {
                    self.mark_active();
                    let mut out = std::mem::take(&mut st.write_spare);
                    Write { key, addr, bytes }.encode(self.name, &mut out);
                    st.write = Some(PendingWrite { nic, bytes: out });
                    st.counters.transfers += 1;
                    st.counters.transfer_bytes += bytes.len() as u64;
                    return Ok(());
                }
            }
            // The transport's queue is full: move it along, then retry.
            self.progress();
            std::thread::yield_now();
        }
    }

    /// The registered segment of the process at `nic` that holds
    /// `[addr, addr + len)`, asking it for its directory if we do not know
    /// one that does: its key, the address to use with it, and the
    /// segment's first address and length.
    pub fn segment(&self, nic: NicAddr, addr: u64, len: u64) -> Result<(Segment, bool), DmaError> {
        let end = addr.checked_add(len).ok_or(DmaError::LengthOverflow)?;
        let find = |st: &mut State| -> Result<Option<(Segment, bool)>, DmaError> {
            let process = st.process(self, nic)?;
            if process.dead {
                return Err(DmaError::DeadNode);
            }
            Ok(process.segments.as_ref().and_then(|(virt, segments)| {
                segments
                    .iter()
                    .find(|s| addr >= s.base && end <= s.base.saturating_add(s.len))
                    .map(|s| (*s, *virt))
            }))
        };
        if let Some(found) = find(&mut self.state.lock())? {
            return Ok(found);
        }
        let reply = self.ask(nic, |req| Packet::DirQuery { req })?;
        let Packet::DirReply {
            virt_addr,
            segments,
            ..
        } = reply
        else {
            return Err(DmaError::Invalid);
        };
        let mut st = self.state.lock();
        if let Some(process) = st.processes.get_mut(&nic) {
            process.segments = Some((virt_addr, segments));
        }
        find(&mut st)?.ok_or(DmaError::OutOfBounds)
    }

    /// What the process at `nic` exposes under `key`.
    pub fn key(&self, nic: NicAddr, key: u64) -> Result<unimem_dma::Exposure, DmaError> {
        match self.ask(nic, |req| Packet::KeyQuery { req, key })? {
            Packet::KeyReply {
                found: true,
                addr,
                len,
                access,
                ..
            } => Ok(unimem_dma::Exposure {
                addr,
                len,
                access: unimem_dma::Access::from_bits_truncate(u64::from(access)),
            }),
            Packet::KeyReply { found: false, .. } => Err(DmaError::NoSuchKey),
            _ => Err(DmaError::Invalid),
        }
    }

    /// Sends a question and waits for its answer (the peer's progress or
    /// its interface thread answers within milliseconds), as long as the
    /// peer lives.
    fn ask(&self, nic: NicAddr, question: impl Fn(u32) -> Packet) -> Result<Packet, DmaError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            st.process(self, nic)?;
            st.send_owned(self.name, nic, &question(req));
        }
        loop {
            self.progress();
            {
                let mut st = self.state.lock();
                if let Some(reply) = st.replies.remove(&req) {
                    return Ok(reply);
                }
                if st.processes.get(&nic).is_none_or(|p| p.dead) {
                    return Err(DmaError::DeadNode);
                }
            }
            std::thread::yield_now();
        }
    }

    /// Starts a put of local `[local, local + len)` to `addr` (as the
    /// segment's addressing wants it) under `key` at `nic`.
    #[allow(clippy::too_many_arguments)]
    pub fn rma(
        &self,
        write: bool,
        engine: u16,
        id: DmaId,
        local: *mut u8,
        len: usize,
        nic: NicAddr,
        addr: u64,
        key: u64,
    ) -> Result<(), DmaError> {
        let context = DMA << KIND_SHIFT
            | u64::from(engine) << DMA_ID_BITS
            | (id.0 & ((1 << DMA_ID_BITS) - 1));
        loop {
            {
                let mut st = self.state.lock();
                // Checked on every turn: the wait for room below ends when
                // the process is found dead.
                if st.process(self, nic)?.dead {
                    return Err(DmaError::DeadNode);
                }
                // Messages sent before the transfer leave before it.
                if !st.flush_batch(self) {
                    drop(st);
                    self.progress();
                    std::thread::yield_now();
                    continue;
                }
                let fi_addr = {
                    let process = st.process(self, nic)?;
                    process.last_sent = Instant::now();
                    process.fi_addr
                };
                let ret = st
                    .transport
                    .rma(write, local, len, fi_addr, addr, key, context);
                match ret {
                    0 => {
                        st.dma_dest.insert(context, nic);
                        st.counters.transfers += 1;
                        st.counters.transfer_bytes += len as u64;
                        return Ok(());
                    }
                    e if e == -(ffi::FI_EAGAIN as isize) => {}
                    e => {
                        tracing::warn!(%nic, "network RMA failed: {}", crate::base::core::strerror(e as i32));
                        st.mark_dead(nic, "RMA failed");
                        return Err(DmaError::DeadNode);
                    }
                }
            }
            // The transport's queue is full: move it along, then retry.
            self.progress();
            std::thread::yield_now();
        }
    }

    /// What the interface carried so far.
    pub fn counters(&self) -> Counters {
        self.state.lock().counters
    }

    /// DMAs of engine `slot` completed since the last call, into `out`.
    pub fn take_done(&self, slot: u16, out: &mut VecDeque<DmaId>) {
        let mut st = self.state.lock();
        if let Some(done) = st.dma_done.get_mut(&slot) {
            out.extend(done.drain(..));
        }
    }

    /// The process at `nic` is dead or gone for the caller: forgets its
    /// directory (a new process there has another).
    pub fn forget(&self, nic: NicAddr) {
        if let Some(p) = self.state.lock().processes.get_mut(&nic) {
            p.segments = None;
        }
    }
}

impl State {
    /// The process at `nic`, known from now on.
    fn process(&mut self, nic_: &Nic, nic: NicAddr) -> Result<&mut RemoteProcess, DmaError> {
        if !self.processes.contains_key(&nic) {
            let fi_addr = self.transport.insert(nic).map_err(|e| {
                tracing::warn!(%nic, "{e}");
                DmaError::NoSuchNode
            })?;
            let now = Instant::now();
            self.processes.insert(
                nic,
                RemoteProcess {
                    fi_addr,
                    last_heard: now,
                    last_sent: now,
                    dead: false,
                    gone: HashSet::new(),
                    segments: None,
                },
            );
            nic_.remote_processes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(self.processes.get_mut(&nic).expect("inserted above"))
    }

    fn repost(&mut self, index: usize) -> Result<(), String> {
        let buffer = &mut self.recv_buffers[index];
        let (buf, len) = (buffer.as_mut_ptr(), buffer.len());
        let ret = self
            .transport
            .post_recv(buf, len, RECV << KIND_SHIFT | index as u64);
        if ret != 0 {
            return Err(format!(
                "cannot post a network receive: {}",
                crate::base::core::strerror(ret as i32)
            ));
        }
        Ok(())
    }

    fn inject(&mut self, nic: NicAddr, bytes: &[u8]) -> isize {
        let Some(process) = self.processes.get_mut(&nic) else {
            return -(ffi::FI_EINVAL as isize);
        };
        process.last_sent = Instant::now();
        let fi_addr = process.fi_addr;
        let ret = self.send_packet(fi_addr, bytes);
        if ret == 0 {
            self.counters.packets_out += 1;
        }
        ret
    }

    fn send_packet(&mut self, fi_addr: ffi::fi_addr_t, bytes: &[u8]) -> isize {
        if bytes.len() <= self.transport.inject_size {
            self.transport.inject(bytes, fi_addr)
        } else {
            let slot = match self.free_sends.pop() {
                Some(slot) => slot,
                None => {
                    self.sends.push(None);
                    self.sends.len() - 1
                }
            };
            // The transport reads the bytes until the completion: they
            // go from a buffer of their own, kept until then.
            let owned = bytes.to_vec();
            let ret = self.transport.send(
                owned.as_ptr(),
                owned.len(),
                fi_addr,
                SEND << KIND_SHIFT | slot as u64,
            );
            if ret == 0 {
                self.sends[slot] = Some(owned);
            } else {
                self.free_sends.push(slot);
            }
            ret
        }
    }

    /// Sends the gathered write and mailbox messages, as one transport
    /// message; false if the transport had no room (they wait for the next
    /// try, and nothing may pass them).
    fn flush_batch(&mut self, nic: &Nic) -> bool {
        let (mut write, batch) = (self.write.take(), self.batch.take());
        let to = match (&write, &batch) {
            (Some(w), _) => w.nic,
            (None, Some(b)) => b.nic,
            (None, None) => return true,
        };
        let packet = batch.as_ref().map(|batch| Packet::Mailbox {
            dst_index: batch.dst_index,
            src_index: batch.from.index,
            job: batch.from.node.job,
            pid: batch.from.node.pid,
            nonce: batch.from.node.nonce,
            count: batch.count,
            messages: batch.messages,
        });
        // The write packet's own buffer with the mailbox packet appended,
        // or the mailbox packet alone, encoded in place.
        let (mut bytes, write_len) = match write.as_mut() {
            Some(w) => {
                let bytes = std::mem::take(&mut w.bytes);
                let len = bytes.len();
                (bytes, len)
            }
            None => (std::mem::take(&mut self.scratch), 0),
        };
        match (&packet, write.is_some()) {
            (Some(packet), true) => {
                let mut encoded = std::mem::take(&mut self.mailbox_scratch);
                packet.encode(nic.name, &mut encoded);
                bytes.extend_from_slice(&encoded);
                self.mailbox_scratch = encoded;
            }
            (Some(packet), false) => packet.encode(nic.name, &mut bytes),
            (None, _) => {}
        }
        // Behind our own packets waiting for room, if any.
        let sent = if self.backlog.is_empty() {
            self.inject(to, &bytes)
        } else {
            -(ffi::FI_EAGAIN as isize)
        };
        if sent == -(ffi::FI_EAGAIN as isize) {
            bytes.truncate(write_len);
            match write.as_mut() {
                Some(w) => w.bytes = bytes,
                None => self.scratch = bytes,
            }
            self.write = write;
            self.batch = batch;
            return false;
        }
        match write {
            Some(_) => self.write_spare = bytes,
            None => self.scratch = bytes,
        }
        if sent != 0 {
            let why = crate::base::core::strerror(sent as i32);
            self.mark_dead(to, &format!("send failed: {why}"));
        }
        true
    }

    /// Sends one of our own packets (`from` is our name) to `to`, now or,
    /// if the transport is full, from the backlog.
    fn send_owned(&mut self, from: NicAddr, to: NicAddr, packet: &Packet) {
        let mut bytes = Vec::new();
        packet.encode(from, &mut bytes);
        if self.backlog.is_empty() && self.inject(to, &bytes) == 0 {
            return;
        }
        self.backlog.push_back((to, bytes));
    }

    fn flush_backlog(&mut self) {
        while let Some((nic, bytes)) = self.backlog.pop_front() {
            match self.inject(nic, &bytes) {
                0 => {}
                e if e == -(ffi::FI_EAGAIN as isize) => {
                    self.backlog.push_front((nic, bytes));
                    return;
                }
                _ => self.mark_dead(nic, "send failed"),
            }
        }
    }

    fn mark_dead(&mut self, nic: NicAddr, why: &str) {
        if let Some(p) = self.processes.get_mut(&nic) {
            if !p.dead {
                tracing::warn!(%nic, "peer process on another host is unreachable: {why}");
                p.dead = true;
            }
        }
        // What still waits to leave for it never will: with the transport's
        // queue to it full, it would hold up every packet behind it, to
        // every other process, for good.
        self.backlog.retain(|(to, _)| *to != nic);
        if self.write.as_ref().is_some_and(|w| w.nic == nic) {
            self.write = None;
        }
        if self.batch.as_ref().is_some_and(|b| b.nic == nic) {
            self.batch = None;
        }
    }

    fn progress(&mut self, nic: &Nic) {
        self.flush_backlog();
        self.flush_batch(nic);
        let mut completions = std::mem::take(&mut self.completions);
        // Polls again only after a full batch, or an error (which comes
        // alone): another poll of a socket transport that has nothing is a
        // system call on the way of what just came.
        for _ in 0..8 {
            self.transport.poll(&mut completions);
            let more =
                completions.len() == POLL_MAX || completions.iter().any(|c| c.error.is_some());
            for c in completions.drain(..) {
                self.complete(nic, c);
            }
            if !more {
                break;
            }
        }
        self.completions = completions;
    }

    fn complete(&mut self, nic: &Nic, c: Completion) {
        let kind = c.context >> KIND_SHIFT;
        let index = c.context & ((1 << KIND_SHIFT) - 1);
        match kind {
            RECV => {
                let index = index as usize;
                if index >= self.recv_buffers.len() {
                    return;
                }
                if c.error.is_none() {
                    self.counters.packets_in += 1;
                    let buffer = std::mem::take(&mut self.recv_buffers[index]);
                    let bytes = &buffer[..c.len.min(buffer.len())];
                    match Write::decode(bytes) {
                        Some(Ok((from, write, then))) => {
                            self.heard(nic, from);
                            self.on_write(write);
                            if let Some(packet) = then {
                                self.on_packet(nic, from, packet);
                            }
                        }
                        Some(Err(())) => self.drop_invalid("malformed write packet"),
                        None => match Packet::decode(bytes) {
                            Some((from, packet)) => {
                                self.heard(nic, from);
                                self.on_packet(nic, from, packet);
                            }
                            None => self.drop_invalid("malformed packet"),
                        },
                    }
                    self.recv_buffers[index] = buffer;
                } else if c.error == Some(ffi::FI_ETRUNC as i32) {
                    // Receive buffers are as long as this process's
                    // net_write_max wants; a sender with a larger one
                    // loses its packets here.
                    self.drop_invalid(
                        "a packet longer than this process's receive buffers: FI_UNIMEM_NET_WRITE_MAX must be the same in every process of the job",
                    );
                }
                if let Err(e) = self.repost(index) {
                    tracing::warn!("{e}");
                }
            }
            SEND => {
                let slot = index as usize;
                if let Some(buf) = self.sends.get_mut(slot) {
                    if buf.take().is_some() {
                        self.free_sends.push(slot);
                    }
                }
            }
            DMA => {
                let dest = self.dma_dest.remove(&c.context);
                if let (Some(err), Some(dest)) = (c.error, dest) {
                    self.mark_dead(dest, &crate::base::core::strerror(err));
                }
                let engine = (index >> DMA_ID_BITS) as u16;
                let id = DmaId(index & ((1 << DMA_ID_BITS) - 1));
                // Reported done even if it failed: the peer is dead, and
                // the protocol fails what it left behind.
                self.dma_done.entry(engine).or_default().push(id);
            }
            _ => {}
        }
    }

    /// A short put into our memory: it must lie inside one segment we
    /// opened to the network, under that segment's key, as the transport
    /// checks an RMA write.
    fn on_write(&mut self, write: Write<'_>) {
        let segments = self.own.iter().map(|own| &own.segment);
        if write_target(segments, write.key, write.addr, write.bytes.len()).is_none() {
            return self.drop_invalid("write outside the memory opened to the network");
        }
        // SAFETY: [addr, addr + len) lies inside one of our dmable
        // segments registered with the transport (checked above), which
        // stay mapped while the interface runs; the packet's bytes are a
        // receive buffer of ours, which cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                write.bytes.as_ptr(),
                write.addr as *mut u8,
                write.bytes.len(),
            )
        };
    }

    /// A whole packet (with what rode behind it) came from `from`.
    fn heard(&mut self, nic: &Nic, from: NicAddr) {
        if let Ok(process) = self.process(nic, from) {
            process.last_heard = Instant::now();
        }
    }

    fn on_packet(&mut self, nic: &Nic, from: NicAddr, packet: Packet) {
        match packet {
            Packet::Mailbox {
                dst_index,
                src_index,
                job,
                pid,
                nonce,
                count,
                messages,
            } => {
                let source = MailboxAddr {
                    node: NodeId {
                        job,
                        pid,
                        nonce,
                        nic: Some(from),
                    },
                    index: src_index,
                };
                // A process names only itself as the source: its pid 0
                // would be a service address, another host's interface
                // another process.
                if pid == 0 {
                    return self.drop_invalid("mailbox message from a service address");
                }
                match self.inboxes.get(&dst_index) {
                    Some(inbox) => {
                        nic.mark_active();
                        inbox.push(source, &messages[..count]);
                    }
                    None => {
                        self.send_owned(nic.name, from, &Packet::Gone { index: dst_index });
                    }
                }
            }
            Packet::Alive => {}
            Packet::DirQuery { req } => {
                let segments = self.own_segments();
                let reply = Packet::DirReply {
                    req,
                    virt_addr: self.transport.virt_addr,
                    segments,
                };
                self.send_owned(nic.name, from, &reply);
            }
            Packet::KeyQuery { req, key } => {
                let node = unimem_dma::DmaEngine::local_node(&self.local);
                let reply = match unimem_dma::DmaEngine::resolve_key(&mut self.local, node, key) {
                    Ok(e) => Packet::KeyReply {
                        req,
                        found: true,
                        addr: e.addr,
                        len: e.len,
                        access: e.access.bits() as u32,
                    },
                    Err(_) => Packet::KeyReply {
                        req,
                        found: false,
                        addr: 0,
                        len: 0,
                        access: 0,
                    },
                };
                self.send_owned(nic.name, from, &reply);
            }
            reply @ (Packet::DirReply { req, .. } | Packet::KeyReply { req, .. }) => {
                // Only an answer to a question we asked is kept.
                if req != 0 && req < nic.next_req.load(Ordering::Relaxed) {
                    self.replies.insert(req, reply);
                } else {
                    self.drop_invalid("answer to no question");
                }
            }
            Packet::Gone { index } => {
                if let Some(p) = self.processes.get_mut(&from) {
                    p.gone.insert(index);
                }
            }
        }
    }

    /// Our dmable memory as peers may use it: every committed segment,
    /// registered with the transport (a segment that grew since is
    /// registered again, whole).
    fn own_segments(&mut self) -> Vec<Segment> {
        let node = unimem_dma::DmaEngine::local_node(&self.local);
        let committed = self.local.segments(node).unwrap_or_default();
        let mut out = Vec::with_capacity(committed.len());
        for (base, len) in committed {
            if len == 0 {
                continue;
            }
            let known = self
                .own
                .iter()
                .rev()
                .find(|s| s.segment.base == base && s.segment.len == len);
            let segment = match known {
                Some(s) => s.segment,
                None => {
                    let key = self.next_key;
                    self.next_key += 1;
                    match self.transport.register(base, len as usize, key) {
                        Ok(registration) => {
                            let segment = Segment {
                                base,
                                len,
                                key: registration.key,
                            };
                            self.own.push(OwnSegment {
                                segment,
                                _registration: registration,
                            });
                            segment
                        }
                        Err(e) => {
                            tracing::warn!("cannot open dmable memory to the network: {e}");
                            continue;
                        }
                    }
                }
            };
            out.push(segment);
        }
        out
    }

    fn drop_invalid(&mut self, what: &str) {
        self.dropped += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|last| now.duration_since(last) < Duration::from_secs(1))
        {
            return;
        }
        self.last_warning = Some(now);
        tracing::warn!(
            total = self.dropped,
            "dropped invalid network packet(s): {what}"
        );
    }

    /// Tells the processes we talk to that we live; finds those that went
    /// silent. `absent`: how long this process did not run (see
    /// [`absence`]); its peers' silence over that time is not held against
    /// them.
    fn keep_alive(&mut self, nic: &Nic, absent: Duration, now: Instant) {
        let warned_lately = self
            .last_stall_warning
            .is_some_and(|t| now.duration_since(t) < STALL_WARNING_EVERY);
        if absent > ALIVE_EVERY && !warned_lately {
            self.last_stall_warning = Some(now);
            tracing::warn!(
                "this process did not run for {} ms (the machine or the process stalled): its peers' silence over that time is not counted",
                absent.as_millis()
            );
        }
        let mut silent = Vec::new();
        let mut due = Vec::new();
        for (&addr, p) in self.processes.iter_mut() {
            if p.dead {
                continue;
            }
            p.last_heard = credit_absence(p.last_heard, absent, now);
            if now.duration_since(p.last_heard) > nic.timeout {
                silent.push(addr);
            } else if now.duration_since(p.last_sent) >= ALIVE_EVERY {
                due.push(addr);
            }
        }
        for addr in silent {
            let heard = self.processes[&addr].last_heard.elapsed();
            self.mark_dead(
                addr,
                &format!("not heard from for {} ms", heard.as_millis()),
            );
        }
        for addr in due {
            self.send_owned(nic.name, addr, &Packet::Alive);
        }
    }
}

/// How long this process did not run, from the time since the interface's
/// thread last looked at its peers (every `ALIVE_EVERY / 2` when it runs):
/// what is beyond that period. A paused virtual machine, a stopped job or a
/// starved thread: the peers' silence then says nothing about them, and
/// they, stalled too, may have heard nothing from us either.
fn absence(since_last_look: Duration) -> Duration {
    since_last_look.saturating_sub(ALIVE_EVERY / 2)
}

/// When a peer last heard from counts as heard, once `absent` of the time
/// up to `now` is credited to it: never later than now.
fn credit_absence(last_heard: Instant, absent: Duration, now: Instant) -> Instant {
    last_heard.checked_add(absent).map_or(now, |t| t.min(now))
}

/// The interface's thread: polls when no endpoint has for a tick (the
/// application computes, or waits elsewhere), and keeps peers informed.
fn run(nic: Weak<Nic>) {
    let mut last_alive = Instant::now();
    let mut tick = TICK;
    loop {
        std::thread::sleep(tick);
        let Some(nic) = nic.upgrade() else {
            return;
        };
        tick = if nic.talks_to_other_hosts() {
            TICK
        } else {
            IDLE_TICK
        };
        if nic.stop.load(Ordering::Acquire) || !nic.is_own() {
            return;
        }
        // Quiet once a whole tick passed without a mailbox message; one
        // that came in between says otherwise.
        let active = nic.active.swap(false, Ordering::Relaxed);
        nic.quiet.store(!active, Ordering::Relaxed);
        if !active && nic.active.load(Ordering::Relaxed) {
            nic.quiet.store(false, Ordering::Relaxed);
        }
        let idle = !nic.polled.swap(false, Ordering::Relaxed);
        if idle {
            nic.progress();
        } else if let Some(mut st) = nic.state.try_lock() {
            // A sender that stopped polling still sends what it gathered.
            st.flush_batch(&nic);
        }
        if last_alive.elapsed() >= ALIVE_EVERY / 2 {
            let mut st = nic.state.lock();
            let now = Instant::now();
            let absent = absence(now.duration_since(last_alive));
            last_alive = now;
            st.keep_alive(&nic, absent, now);
            st.flush_backlog();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_on_time_is_no_absence() {
        assert_eq!(absence(Duration::ZERO), Duration::ZERO);
        assert_eq!(absence(ALIVE_EVERY / 2), Duration::ZERO);
        assert_eq!(
            absence(ALIVE_EVERY / 2 + Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn an_absence_is_credited_to_a_peer_up_to_now() {
        let now = Instant::now();
        let heard = now.checked_sub(Duration::from_secs(5)).expect("uptime");
        let credited = credit_absence(heard, Duration::from_secs(4), now);
        assert_eq!(now.duration_since(credited), Duration::from_secs(1));
        // A peer heard just before the stall is as good as heard now.
        assert_eq!(credit_absence(heard, Duration::from_secs(60), now), now);
        assert_eq!(credit_absence(heard, Duration::ZERO, now), heard);
    }
}
