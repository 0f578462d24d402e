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
//! network thread when nobody else has for a millisecond.
//! Completions of DMA go to the engine that started them.
//!
//! Here: the interface and what its callers ask of it; `state`: what sits
//! behind its lock and what a packet or a completion does to it; `lookup`:
//! questions to another process (its directory, its keys); `liveness`:
//! who is dead, and the network thread; `inbox`: messages sorted
//! per mailbox.

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
use unimem_fi_sys as ffi;
use unimem_fi_sys::{core, Error};

/// Receive buffers kept posted.
const RECV_BUFFERS: usize = 64;
/// How often the network thread looks whether it must poll.
const TICK: Duration = Duration::from_millis(1);
/// The thread's tick while no process of another host is known: a job of
/// one host leaves it asleep (a first contact waits that long at most).
pub const IDLE_TICK: Duration = Duration::from_millis(20);
/// How often a process tells the processes it talks to that it is alive.
const ALIVE_EVERY: Duration = Duration::from_millis(500);
/// The network is quiet for us once no mailbox message came or left for a
/// whole tick (the network thread says so); the data path then polls
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

mod inbox;
mod liveness;
use liveness::run;
mod lookup;
mod state;

pub use inbox::Inbox;

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
    /// An endpoint polled since the network thread last looked.
    polled: AtomicBool,
    /// When an endpoint last polled while the network was quiet (ns since
    /// `epoch`).
    polled_at: AtomicU64,
    /// A mailbox message came or left over the network since the
    /// interface's thread last looked.
    active: AtomicBool,
    /// No mailbox message came or left over the network for a tick or more
    /// (the network thread says so; a message says otherwise at once).
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
    #[inline]
    pub fn poll_from_data_path(&self) {
        // A job of one host (most): one load.
        if self.remote_processes.load(Ordering::Relaxed) != 0 {
            self.poll_remote_from_data_path();
        }
    }

    fn poll_remote_from_data_path(&self) {
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
    /// progress, or the network thread within a tick), with the
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
                    e if e == Error::EAGAIN.ssize() => {}
                    e => {
                        tracing::warn!(%nic, "network RMA failed: {}", core::strerror(e as i32));
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
