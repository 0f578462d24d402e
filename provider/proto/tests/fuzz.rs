//! A fuzz harness for the protocol core, on stable Rust, with no dependency
//! beyond the crate's own.
//!
//! Three messengers run in this process over the shared-memory emulation
//! (`ShmMailbox`, `ShmDmaEngine`): two well-behaved endpoints, A (the
//! victim) and B, exchange real traffic of every protocol, and a hostile
//! endpoint H, which did first contact with A like any peer, feeds A random
//! and mutated input mixed into that traffic.
//!
//! # An execution
//!
//! One execution is one hostile input, then one progress call of every
//! endpoint (A, the victim, first after the input), then the invariant
//! checks. The input is one of:
//! - a *mutated* real message sent from H's mailbox: taken from what H, A or
//!   B sent lately (so with other peers' send and receive ids, grants and
//!   keys), with bits flipped, bytes and fields overwritten by interesting
//!   values or ids seen on the wire, the op or its flags changed, ranges
//!   spliced from another message, or replayed unchanged;
//! - a real message of H's own messenger caught on its way out and replaced
//!   by such a mutation (or dropped, or sent twice): hostile input inside
//!   live transfers;
//! - an answer A would expect from B, forged by H from A's latest messages:
//!   a fragment report for A's grant, a FIN for A's request to send, a
//!   refusal or grant for A's RMA request, a reply for A's atomic;
//! - a fully random 24-byte message;
//! - a valid request on the range A exposes to H (write, read, atomic)
//!   that H then never carries through;
//! - a write into shared memory H can legitimately reach: the eager ring A
//!   set aside for it (slots it fills), the receive buffers A posted for it
//!   (granted to it), and the range A exposes to it under its key.
//!
//! H and B do not progress in every execution, so that forgeries race the
//! real answers. One pass of A's or B's in four is run as their progress
//! agent runs it (`set_helping`), so the agent's paths meet the same input. In one round of five H is *polite*: only valid requests
//! and writes into its memory, so that it is never fenced and can hold
//! whatever A lends a peer (ids, places in the transmit queue) for
//! thousands of executions; the queues and id spaces of A and B are
//! small (`tx_size` 64, 128 receive ids) to make that reachable.
//!
//! # Traffic
//!
//! A and B keep sends going both ways: inline, eager and rendezvous of up
//! to six fragments, tagged and untagged, from and into dmable and
//! ordinary memory, some injected, some `FI_INJECT`, some delivery
//! complete, their receives posted before or after the message arrives;
//! RMA writes and reads into each other's exposed ranges (dmable: one-sided;
//! ordinary: through the target), and atomics (sum, fetching sum, compare
//! and swap) on exposed words. H's own messenger keeps real traffic with A
//! too: sends to A, receives of A's sends, RMA and atomics on its range.
//!
//! # Invariants
//!
//! - No panic (any panic fails the test, which prints the seed).
//! - Every operation A and B post to each other completes, with success,
//!   within 3000 steps; A's operations with H complete or fail once H is
//!   gone, within 20 seconds (A notices by its peer check, on the clock). A completion for an operation
//!   never posted, or a second one, is a failure.
//! - Data between A and B is byte-exact: a receive holds exactly its
//!   message's pattern and nothing beyond it, a send buffer is unchanged,
//!   an RMA range equals its shadow copy, atomics give the exact values.
//! - No foreign write: guard bytes around every buffer, range and word
//!   array of A and B stay intact, as do canary buffers nobody is granted.
//!
//! H may be fenced; its own operations may fail. A round ends some
//! executions after H is fenced (or after a few thousand without): H's
//! mailbox closes, A's operations with it must end, and a new H does first
//! contact. A and B live through the whole campaign.
//!
//! # Decisions
//!
//! - In one process every endpoint is the same DMA node: A's puts to an
//!   address H names would land in A's or B's memory here, where on real
//!   nodes they land in H's. So a grant (or hello) H forges may name only
//!   its own memory or none at all (the harness moves any other address
//!   into one of those), and a key H forges may not be a key A or B
//!   exposed to each other (one process, one key table). H's honest
//!   messenger is never fed mutated input, so its own DMA stays inside
//!   what A granted it; and what A grants H is memory dedicated to H
//!   (dmable receive buffers, written in place; a dmable exposed range)
//!   for the whole campaign, so that a late put of H never lands in memory
//!   reused for B. Only polite rounds (which forge no fragment report) also
//!   write into ordinary memory A exposes to H, through A's staging
//!   buffers. Directory entries and key tables are per process, not
//!   per endpoint: H cannot own any of its own here, and does not mutate
//!   them.
//! - The random numbers come from SplitMix64, seeded by
//!   `UNIMEM_FUZZ_SEED`; `UNIMEM_FUZZ_EXECS` sets the budget. A seed
//!   replays the same inputs; the peer checks run on the clock, so a replay
//!   may still differ in when A notices H gone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use unimem_dma::{
    Access, DmaBuf, DmaRegion, Exposure, KeyHandle, KeyTable, RegionConfig, ShmDmaEngine,
};
use unimem_mailbox::{
    Error as MailboxError, JobId, Mailbox, MailboxAddr, Message, Profile, ShmMailbox,
    ShmMailboxConfig, ShmPeer, MESSAGE_LEN,
};
use unimem_proto::atomic::{AtomicCall, AtomicOp, Datatype};
use unimem_proto::matching::{IovList, PostedRecv};
use unimem_proto::messenger::SendReq;
use unimem_proto::wire::{MatchInfo, Wire};
use unimem_proto::{AtomicReq, Event, Messenger, ProtoConfig, RmaKind, RmaReq};

// --- random numbers ----------------------------------------------------------------

/// SplitMix64: small, fast, and good enough to pick inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the bias is negligible for our n).
    fn below(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}

// --- a mailbox with a tap ------------------------------------------------------------

const HISTORY: usize = 256;

/// What an endpoint's mailbox saw, shared between its messenger and the
/// harness.
struct TapState {
    /// `None` once closed (H at the end of its round).
    mbx: Option<ShmMailbox>,
    /// The last messages sent, oldest overwritten.
    sent: Vec<Message>,
    sent_next: usize,
    /// Catch the next outgoing message instead of sending it (H).
    intercept: bool,
    intercepted: Option<Message>,
    /// The eager ring the peer set aside for us, from its hello: address
    /// and length (H learns A's).
    peer_ring: Option<(usize, usize)>,
}

/// The mailbox a messenger of the harness runs over: a `ShmMailbox` whose
/// traffic the harness records, and that it can send through itself.
struct Tap {
    addr: MailboxAddr,
    state: Arc<Mutex<TapState>>,
}

impl Tap {
    fn open(job: JobId) -> Tap {
        let mbx = ShmMailbox::open(&ShmMailboxConfig {
            job,
            depth: 256,
            profile: Profile::Native,
        })
        .expect("mailbox");
        Tap {
            addr: mbx.addr(),
            state: Arc::new(Mutex::new(TapState {
                mbx: Some(mbx),
                sent: Vec::with_capacity(HISTORY),
                sent_next: 0,
                intercept: false,
                intercepted: None,
                peer_ring: None,
            })),
        }
    }
}

impl TapState {
    /// The message sent `back` messages before the last one.
    fn recent(&self, back: usize) -> Message {
        let len = self.sent.len();
        let back = back.min(len - 1);
        let newest = if len < HISTORY {
            len - 1
        } else {
            (self.sent_next + HISTORY - 1) % HISTORY
        };
        self.sent[(newest + len - back) % len]
    }

    fn record(&mut self, message: &Message) {
        if self.sent.len() < HISTORY {
            self.sent.push(*message);
        } else {
            self.sent[self.sent_next] = *message;
            self.sent_next = (self.sent_next + 1) % HISTORY;
        }
    }
}

impl Mailbox for Tap {
    type Addr = MailboxAddr;
    type Peer = ShmPeer;

    fn addr(&self) -> MailboxAddr {
        self.addr
    }

    fn connect(&self, dest: &MailboxAddr) -> Result<ShmPeer, MailboxError> {
        match &self.state.lock().mbx {
            Some(mbx) => mbx.connect(dest),
            None => Err(MailboxError::Invalid),
        }
    }

    fn send(&self, peer: &ShmPeer, message: &Message) -> Result<(), MailboxError> {
        let mut state = self.state.lock();
        if state.mbx.is_none() {
            return Err(MailboxError::Dead);
        }
        if state.intercept {
            state.intercept = false;
            state.intercepted = Some(*message);
            return Ok(());
        }
        let sent = state.mbx.as_ref().expect("open").send(peer, message);
        if sent.is_ok() {
            state.record(message);
        }
        sent
    }

    fn poll(&mut self) -> Option<(MailboxAddr, Message)> {
        let mut state = self.state.lock();
        let (src, message) = state.mbx.as_mut()?.poll()?;
        if state.peer_ring.is_none() {
            if let Some(Wire::Hello {
                ring,
                slot_shift,
                slots,
                ..
            }) = Wire::decode(&message)
            {
                let len = (slots as usize) << slot_shift;
                state.peer_ring = (len > 0).then_some((ring as usize, len));
            }
        }
        Some((src, message))
    }

    fn has_message(&self) -> bool {
        self.state
            .lock()
            .mbx
            .as_ref()
            .is_some_and(|m| m.has_message())
    }

    fn peer_alive(&self, peer: &ShmPeer) -> bool {
        self.state
            .lock()
            .mbx
            .as_ref()
            .is_some_and(|m| m.peer_alive(peer))
    }
}

type Ep = Messenger<(Tap, ShmDmaEngine)>;

// --- guarded memory --------------------------------------------------------------

/// Guard bytes on each side of every buffer the harness hands a messenger.
const GUARD: usize = 32;
/// What a receive buffer holds beyond the data that arrived.
const FILL: u8 = 0xee;

/// What a buffer's memory is, kept for its lifetime (never read: the
/// buffer works through its pointer).
#[allow(dead_code)]
enum Backing {
    Dma(DmaBuf),
    /// `u64`s, so that atomics find their words aligned.
    Heap(Box<[u64]>),
}

/// A buffer with guards: `[guard][len bytes][guard]`.
struct Mem {
    _backing: Backing,
    base: *mut u8,
    len: usize,
    guard: u8,
}

impl Mem {
    fn new(region: &Arc<DmaRegion>, dmable: bool, len: usize, guard: u8) -> Mem {
        let total = len + 2 * GUARD;
        let (backing, base) = if dmable {
            let buf = region.alloc(total).expect("dmable memory");
            let base = buf.as_ptr();
            (Backing::Dma(buf), base)
        } else {
            let mut words = vec![0u64; total.div_ceil(8)].into_boxed_slice();
            let base = words.as_mut_ptr() as *mut u8;
            (Backing::Heap(words), base)
        };
        let mem = Mem {
            _backing: backing,
            base,
            len,
            guard,
        };
        // SAFETY: `base` holds `total` bytes, ours alone.
        unsafe {
            std::ptr::write_bytes(base, guard, GUARD);
            std::ptr::write_bytes(base.add(GUARD), FILL, len);
            std::ptr::write_bytes(base.add(GUARD + len), guard, GUARD);
        }
        mem
    }

    fn ptr(&self) -> *mut u8 {
        self.base.wrapping_add(GUARD)
    }

    fn addr(&self) -> usize {
        self.ptr() as usize
    }

    /// The data bytes; the caller holds no other view of them meanwhile.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes past the front guard are ours; the harness is
        // single-threaded, so no DMA writes them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this view unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    fn guards_intact(&self) -> bool {
        // SAFETY: both guards lie inside the allocation.
        let (front, back) = unsafe {
            (
                std::slice::from_raw_parts(self.base, GUARD),
                std::slice::from_raw_parts(self.base.add(GUARD + self.len), GUARD),
            )
        };
        front.iter().chain(back).all(|&b| b == self.guard)
    }

    fn iov(&self, len: usize) -> IovList {
        IovList::One((self.addr(), len))
    }
}

fn pattern_byte(seed: u64, i: usize) -> u8 {
    (seed as u8) ^ (seed >> 8) as u8 ^ (i as u8).wrapping_mul(31) ^ (i >> 8) as u8
}

fn fill_pattern(out: &mut [u8], seed: u64) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = pattern_byte(seed, i);
    }
}

fn is_pattern(data: &[u8], seed: u64) -> bool {
    data.iter()
        .enumerate()
        .all(|(i, &b)| b == pattern_byte(seed, i))
}

// --- the world -----------------------------------------------------------------------

const EAGER: usize = 1024;
const FRAGMENT: usize = 4096;
/// Longest message: six fragments and a bit.
const MAX_MSG: usize = 6 * FRAGMENT + 100;
/// An RMA range: four slots, one operation in each at a time.
const RMA_SLOTS: usize = 4;
const RMA_SLOT: usize = 4 * FRAGMENT;
const WORDS: usize = 64;
/// Receive buffers A keeps posted for H, and their size.
const H_RECV_SLOTS: usize = 6;
const H_RECV_LEN: usize = 3 * FRAGMENT;
/// A's range exposed to H.
const H_RANGE: usize = 8 * FRAGMENT;
/// H's own dmable memory: its send, receive and RMA buffers.
const H_ARENA: usize = 256 << 10;

/// Ids for rendezvous receives of A and B: 64 for the peers' transfers
/// (48 for one peer's), 64 kept for their own reads (as many as
/// `tx_size`).
const RX_IDS: usize = 128;
/// Steps after which an operation between A and B that has not completed
/// counts as hung: nothing in A's and B's way to each other waits for the
/// clock, so steps, not time, are the measure.
const HANG_STEPS: u64 = 3_000;
/// How long the end of a campaign may take to complete what is open.
const FINISH_TIME: Duration = Duration::from_secs(20);
/// How long A may take to end its operations with a gone H.
const DRAIN_TIME: Duration = Duration::from_secs(20);

fn config() -> ProtoConfig {
    ProtoConfig {
        eager_size: EAGER,
        eager_credits: 4,
        bounce_buffers: 8,
        fragment_size: FRAGMENT,
        rendezvous_window: 2,
        staging_buffers: 3,
        // Small queues and id spaces (below), so that a hostile peer can
        // reach their limits within a round.
        tx_size: 64,
        // A notices a gone H quickly: rounds are short.
        peer_check: Some(Duration::from_millis(2)),
        unexpected_limit: 64 << 10,
        ..ProtoConfig::default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    A,
    B,
    H,
}

/// An exposed range of an endpoint, written by its peer's RMA, with a
/// copy of what it must hold.
struct Range {
    mem: Mem,
    key: u64,
    _handle: KeyHandle,
    shadow: Vec<u8>,
    busy: [bool; RMA_SLOTS],
}

/// Exposed words for the peer's atomics, with their expected values.
struct Words {
    mem: Mem,
    key: u64,
    _handle: KeyHandle,
    values: [u64; WORDS],
    busy: [bool; WORDS],
}

enum OpKind {
    /// A send; `mem` is `None` when the call copied the data.
    Send {
        mem: Option<Mem>,
        seed: u64,
        len: usize,
    },
    /// A receive of message `seed` of `len` bytes from the peer.
    Recv { mem: Mem, seed: u64, len: usize },
    /// A receive A posted for H, in its slot.
    HRecv { slot: usize },
    Write {
        local: Mem,
        range: usize,
        slot: usize,
        at: usize,
        len: usize,
    },
    Read {
        local: Mem,
        range: usize,
        slot: usize,
        at: usize,
        len: usize,
    },
    Atomic {
        words: usize,
        first: usize,
        old: Vec<u64>,
        new: Vec<u64>,
        result: Option<Mem>,
        _operand: Mem,
        _compare: Mem,
    },
}

struct Op {
    peer: Who,
    kind: OpKind,
    step: u64,
    at: Instant,
}

impl OpKind {
    /// What it is, for a failure report.
    fn describe(&self) -> String {
        match self {
            OpKind::Send { mem, len, .. } => format!(
                "send of {len} bytes ({})",
                if mem.is_some() { "in place" } else { "copied" }
            ),
            OpKind::Recv { len, mem, .. } => {
                format!("receive of {len} bytes into {} bytes", mem.len)
            }
            OpKind::HRecv { slot } => format!("receive from H in slot {slot}"),
            OpKind::Write { range, at, len, .. } => {
                format!("RMA write of {len} bytes at {at} of range {range}")
            }
            OpKind::Read { range, at, len, .. } => {
                format!("RMA read of {len} bytes at {at} of range {range}")
            }
            OpKind::Atomic { words, old, .. } => {
                format!("atomic on {} words of array {words}", old.len())
            }
        }
    }
}

/// A or B.
struct Endpoint {
    who: Who,
    m: Ep,
    tap: Arc<Mutex<TapState>>,
    ops: HashMap<usize, Op>,
    next_context: usize,
    /// Exposed to the other well-behaved endpoint: dmable, ordinary.
    ranges: Vec<Range>,
    words: Vec<Words>,
    /// Memory nobody is granted: it never changes.
    canaries: Vec<Mem>,
    /// Sends to the other one not yet received, in send order, with the
    /// step from which the receive may be posted: (seed, len, tag, step).
    incoming: VecDeque<(u64, usize, Option<u64>, u64)>,
}

/// A message from the peer whose receive is not posted yet.
impl Endpoint {
    fn context(&mut self) -> usize {
        self.next_context += 1;
        self.next_context
    }

    fn open_ops(&self, peer: Who) -> usize {
        self.ops.values().filter(|o| o.peer == peer).count()
    }
}

/// H: a messenger of its own (honest), plus the harness's hostile hands.
struct Hostile {
    m: Ep,
    tap: Arc<Mutex<TapState>>,
    route: ShmPeer,
    arena: DmaBuf,
    /// Contexts of H's operations in flight (their outcome is not checked).
    ops: HashSet<usize>,
    next_context: usize,
    /// Receives H keeps posted for A's sends.
    recvs: usize,
    next_send: usize,
}

struct World {
    job: JobId,
    region: Arc<DmaRegion>,
    _keys: Arc<KeyTable>,
    eps: [Endpoint; 2],
    h: Option<Hostile>,
    /// A's receive buffers for H and whether each is posted.
    h_slots: Vec<(Mem, bool)>,
    h_range: Mem,
    h_key: u64,
    _h_handle: KeyHandle,
    /// A's ordinary memory exposed to H, which only polite rounds use:
    /// writes into it go through A's staging buffers, which a forged
    /// fragment report could hand back to A (and on to B) before H's
    /// honest put lands.
    h_heap: Mem,
    h_heap_key: u64,
    _h_heap_handle: KeyHandle,
    /// Keys H must not name (A's and B's exposures to each other).
    private_keys: Vec<u64>,
    step: u64,
    rng: Rng,
    seed: u64,
    stats: Stats,
    /// `peers_lost` of A when the current H arrived.
    lost_before: usize,
    /// This round's H sends only valid requests (and writes into its
    /// memory): it is never fenced, and may hold what A lends it.
    polite: bool,
}

#[derive(Default, Debug)]
struct Stats {
    execs: u64,
    rounds: u64,
    fenced: u64,
    injected: u64,
    answers: u64,
    requests: u64,
    intercepted: u64,
    random: u64,
    shm_writes: u64,
    sends: u64,
    rma: u64,
    atomics: u64,
    h_recvs: u64,
    a_sends_to_h: u64,
}

static CURRENT_EXEC: AtomicU64 = AtomicU64::new(0);
static NEXT_KEY: AtomicU64 = AtomicU64::new(0x00f0_0000);

fn fresh_key() -> u64 {
    NEXT_KEY.fetch_add(0x101, Ordering::Relaxed)
}

fn engine(region: &Arc<DmaRegion>) -> ShmDmaEngine {
    ShmDmaEngine::new(region.clone(), Profile::Native)
}

fn expose(keys: &Arc<KeyTable>, key: u64, mem: &Mem, access: Access) -> KeyHandle {
    keys.expose(
        key,
        Exposure {
            addr: mem.addr() as u64,
            len: mem.len as u64,
            access,
        },
    )
    .expect("expose")
}

impl Endpoint {
    fn new(who: Who, job: JobId, region: &Arc<DmaRegion>, keys: &Arc<KeyTable>) -> Endpoint {
        let tap = Tap::open(job);
        let state = tap.state.clone();
        let mut m = Messenger::with_private_dma(tap, engine(region), config()).expect("messenger");
        m.limit_rx_ids(RX_IDS);
        let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        let guard = if who == Who::A { 0xa5 } else { 0xb5 };
        let ranges = [true, false]
            .into_iter()
            .map(|dmable| {
                let mem = Mem::new(region, dmable, RMA_SLOTS * RMA_SLOT, guard);
                let key = fresh_key();
                let _handle = expose(keys, key, &mem, rw);
                let shadow = mem.bytes().to_vec();
                Range {
                    mem,
                    key,
                    _handle,
                    shadow,
                    busy: [false; RMA_SLOTS],
                }
            })
            .collect();
        let words = [true, false]
            .into_iter()
            .map(|dmable| {
                let mut mem = Mem::new(region, dmable, WORDS * 8, guard);
                mem.bytes_mut().fill(0);
                let key = fresh_key();
                let _handle = expose(keys, key, &mem, rw);
                Words {
                    mem,
                    key,
                    _handle,
                    values: [0; WORDS],
                    busy: [false; WORDS],
                }
            })
            .collect();
        let canaries = vec![
            Mem::new(region, true, 4096, guard),
            Mem::new(region, false, 4096, guard),
        ];
        Endpoint {
            who,
            m,
            tap: state,
            ops: HashMap::new(),
            next_context: 0,
            ranges,
            words,
            canaries,
            incoming: VecDeque::new(),
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

impl World {
    fn new(seed: u64) -> World {
        let job = JobId::from_name(&format!("proto-fuzz-{}", std::process::id()));
        let region = DmaRegion::for_process(&RegionConfig {
            job,
            segment_size: 16 << 20,
            max_size: 1 << 30,
        })
        .expect("dmable region");
        let keys = KeyTable::for_process(job).expect("key table");
        let a = Endpoint::new(Who::A, job, &region, &keys);
        let b = Endpoint::new(Who::B, job, &region, &keys);
        let h_slots = (0..H_RECV_SLOTS)
            .map(|_| (Mem::new(&region, true, H_RECV_LEN, 0xa6), false))
            .collect();
        let h_range = Mem::new(&region, true, H_RANGE, 0xa7);
        let h_key = fresh_key();
        let rw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        let _h_handle = expose(&keys, h_key, &h_range, rw);
        let h_heap = Mem::new(&region, false, H_RANGE, 0xa9);
        let h_heap_key = fresh_key();
        let _h_heap_handle = expose(&keys, h_heap_key, &h_heap, rw);
        let private_keys = [&a, &b]
            .into_iter()
            .flat_map(|e| {
                e.ranges
                    .iter()
                    .map(|r| r.key)
                    .chain(e.words.iter().map(|w| w.key))
            })
            .collect();
        World {
            job,
            region,
            _keys: keys,
            eps: [a, b],
            h: None,
            h_slots,
            h_range,
            h_key,
            _h_handle,
            h_heap,
            h_heap_key,
            _h_heap_handle,
            private_keys,
            step: 0,
            rng: Rng(seed),
            seed,
            stats: Stats::default(),
            lost_before: 0,
            polite: false,
        }
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "fuzz invariant broken at execution {} (step {}, seed {:#x}): {what}\nreplay: UNIMEM_FUZZ_SEED={:#x} UNIMEM_FUZZ_EXECS={}",
            self.stats.execs,
            self.step,
            self.seed,
            self.seed,
            self.stats.execs + 1
        )
    }

    fn addr_of(&self, who: Who) -> MailboxAddr {
        match who {
            Who::A => self.eps[0].m.addr(),
            Who::B => self.eps[1].m.addr(),
            Who::H => self.h.as_ref().expect("H").m.addr(),
        }
    }

    // --- traffic between A and B ---------------------------------------------

    /// Posts a send from `eps[from]` to the other, its receive to be posted
    /// by the other after a random delay.
    fn post_send(&mut self, from: usize) {
        let to = 1 - from;
        let rng = &mut self.rng;
        let len = match rng.below(10) {
            0..=2 => rng.below(23),
            // In parts (up to four mailbox messages).
            3 => rng.range(23, 92),
            4..=5 => rng.range(23, EAGER),
            _ => rng.range(EAGER + 1, MAX_MSG),
        };
        let seed = rng.next();
        let tag = rng.percent(60).then(|| rng.next() >> 1);
        let copied = len <= EAGER && rng.percent(25);
        let inject = copied && rng.percent(50);
        let dmable = rng.percent(50);
        let delivery_complete = rng.percent(20);
        let delay = if rng.percent(30) {
            rng.below(50) as u64
        } else {
            0
        };
        let dest = self.eps[to].m.addr();
        let ep = &mut self.eps[from];
        let mut mem = Mem::new(&self.region, dmable, len, 0xc0 | from as u8);
        fill_pattern(mem.bytes_mut(), seed);
        let context = ep.context();
        let req = SendReq {
            dest,
            iov: mem.iov(len),
            info: MatchInfo { tag, data: None },
            context,
            completion: !inject,
            inject,
            copy: copied,
            delivery_complete,
        };
        // SAFETY: `mem` lives in the operation until its completion.
        match unsafe { ep.m.send(req) } {
            Ok(()) => {}
            Err(unimem_proto::PostError::Again) => return,
            Err(e) => {
                let what = format!("{:?} refused a send to its peer: {e:?}", ep.who);
                self.fail(&what)
            }
        }
        let mem = if copied {
            // The call copied it: the buffer is the caller's again.
            mem.bytes_mut().fill(0x11);
            None
        } else {
            Some(mem)
        };
        let peer = self.eps[to].who;
        let step = self.step;
        let ep = &mut self.eps[from];
        ep.ops.insert(
            context,
            Op {
                peer,
                kind: OpKind::Send { mem, seed, len },
                step,
                at: Instant::now(),
            },
        );
        self.eps[to]
            .incoming
            .push_back((seed, len, tag, step + delay));
        self.stats.sends += 1;
    }

    /// Posts the receives whose time has come, in send order (untagged
    /// ones match in that order).
    fn post_receives(&mut self, at: usize) {
        let src = self.eps[1 - at].m.addr();
        let peer = self.eps[1 - at].who;
        while let Some(&(seed, len, tag, from_step)) = self.eps[at].incoming.front() {
            if from_step > self.step {
                break;
            }
            self.eps[at].incoming.pop_front();
            let dmable = self.rng.percent(50);
            let spare = self.rng.below(64);
            let mem = Mem::new(&self.region, dmable, len + spare, 0xd0 | at as u8);
            let ep = &mut self.eps[at];
            let context = ep.context();
            let recv = PostedRecv {
                context,
                iov: mem.iov(len + spare),
                src: Some(src),
                tag: tag.unwrap_or(0),
                ignore: 0,
                completion: true,
                multi_recv: false,
            };
            // SAFETY: `mem` lives in the operation until its completion.
            unsafe { ep.m.post_recv(tag.is_some(), recv) };
            ep.ops.insert(
                context,
                Op {
                    peer,
                    kind: OpKind::Recv { mem, seed, len },
                    step: self.step,
                    at: Instant::now(),
                },
            );
        }
    }

    /// An RMA write or read from `eps[from]` into a free slot of one of the
    /// other's ranges.
    fn post_rma(&mut self, from: usize) {
        let to = 1 - from;
        let range = self.rng.below(2);
        let Some(slot) = (0..RMA_SLOTS).find(|&s| !self.eps[to].ranges[range].busy[s]) else {
            return;
        };
        let at = self.rng.below(RMA_SLOT);
        let len = self.rng.below(RMA_SLOT - at + 1);
        let write = self.rng.percent(50);
        let dmable = self.rng.percent(50);
        let seed = self.rng.next();
        let inject = write && len <= EAGER && self.rng.percent(20);
        let data = (write && self.rng.percent(20)).then(|| self.rng.next());
        let mut local = Mem::new(&self.region, dmable, len, 0xe0 | from as u8);
        if write {
            fill_pattern(local.bytes_mut(), seed);
        }
        let dest = self.eps[to].m.addr();
        let key = self.eps[to].ranges[range].key;
        let ep = &mut self.eps[from];
        let context = ep.context();
        let req = RmaReq {
            dest,
            iov: local.iov(len),
            addr: (slot * RMA_SLOT + at) as u64,
            key,
            context,
            completion: !inject,
            inject,
            data,
        };
        let kind = if write { RmaKind::Write } else { RmaKind::Read };
        // SAFETY: `local` lives in the operation until its completion.
        match unsafe { ep.m.rma(kind, req) } {
            Ok(()) => {}
            Err(unimem_proto::PostError::Again) => return,
            Err(e) => {
                let what = format!("{:?} refused an RMA to its peer: {e:?}", ep.who);
                self.fail(&what)
            }
        }
        let kind = if write {
            OpKind::Write {
                local,
                range,
                slot,
                at,
                len,
            }
        } else {
            OpKind::Read {
                local,
                range,
                slot,
                at,
                len,
            }
        };
        let peer = self.eps[to].who;
        let step = self.step;
        self.eps[from].ops.insert(
            context,
            Op {
                peer,
                kind,
                step,
                at: Instant::now(),
            },
        );
        self.eps[to].ranges[range].busy[slot] = true;
        self.stats.rma += 1;
    }

    /// An atomic from `eps[from]` on free words of the other.
    fn post_atomic(&mut self, from: usize) {
        let to = 1 - from;
        let which = self.rng.below(2);
        let count = self.rng.range(1, 4);
        let first = self.rng.below(WORDS - count + 1);
        if self.eps[to].words[which].busy[first..first + count]
            .iter()
            .any(|&b| b)
        {
            return;
        }
        let (call, op) = match self.rng.below(3) {
            0 => (AtomicCall::Write, AtomicOp::Sum),
            1 => (AtomicCall::Fetch, AtomicOp::Sum),
            _ => (AtomicCall::Compare, AtomicOp::Cswap),
        };
        let old: Vec<u64> = self.eps[to].words[which].values[first..first + count].to_vec();
        let operands: Vec<u64> = (0..count).map(|_| self.rng.next()).collect();
        let compares: Vec<u64> = old
            .iter()
            .map(|&v| if self.rng.percent(70) { v } else { v ^ 1 })
            .collect();
        let new: Vec<u64> = (0..count)
            .map(|i| match op {
                AtomicOp::Sum => old[i].wrapping_add(operands[i]),
                _ if compares[i] == old[i] => operands[i],
                _ => old[i],
            })
            .collect();
        let dmable = self.rng.percent(50);
        let guard = 0xf0 | from as u8;
        let mut operand = Mem::new(&self.region, dmable, count * 8, guard);
        let mut compare = Mem::new(&self.region, dmable, count * 8, guard);
        for i in 0..count {
            operand.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&operands[i].to_le_bytes());
            compare.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&compares[i].to_le_bytes());
        }
        let result = (call != AtomicCall::Write)
            .then(|| Mem::new(&self.region, self.rng.percent(50), count * 8, guard));
        let dest = self.eps[to].m.addr();
        let key = self.eps[to].words[which].key;
        let ep = &mut self.eps[from];
        let context = ep.context();
        let req = AtomicReq {
            dest,
            call,
            op,
            datatype: Datatype::U64,
            count,
            operand: operand.iov(count * 8),
            compare: compare.iov(if call == AtomicCall::Compare {
                count * 8
            } else {
                0
            }),
            result: result
                .as_ref()
                .map_or(IovList::One((0, 0)), |r| r.iov(count * 8)),
            addr: (first * 8) as u64,
            key,
            context,
            completion: true,
        };
        // SAFETY: the buffers live in the operation until its completion.
        match unsafe { ep.m.atomic(req) } {
            Ok(()) => {}
            Err(unimem_proto::PostError::Again) => return,
            Err(e) => {
                let what = format!("{:?} refused an atomic to its peer: {e:?}", ep.who);
                self.fail(&what)
            }
        }
        let peer = self.eps[to].who;
        let step = self.step;
        self.eps[from].ops.insert(
            context,
            Op {
                peer,
                kind: OpKind::Atomic {
                    words: which,
                    first,
                    old,
                    new,
                    result,
                    _operand: operand,
                    _compare: compare,
                },
                step,
                at: Instant::now(),
            },
        );
        for b in &mut self.eps[to].words[which].busy[first..first + count] {
            *b = true;
        }
        self.stats.atomics += 1;
    }

    /// Keeps traffic going: new operations while few are open.
    fn traffic(&mut self, quiet: bool) {
        for from in 0..2 {
            self.post_receives(from);
            if quiet {
                continue;
            }
            let peer = self.eps[1 - from].who;
            let open = self.eps[from].open_ops(peer);
            if open < 12 && self.rng.percent(30) {
                self.post_send(from);
            }
            if open < 12 && self.rng.percent(8) {
                self.post_rma(from);
            }
            if open < 12 && self.rng.percent(8) {
                self.post_atomic(from);
            }
        }
        if !quiet {
            self.h_traffic();
        }
    }

    // --- events and their checks -----------------------------------------------

    fn drain_events(&mut self) {
        for at in 0..2 {
            while let Some(event) = self.eps[at].m.next_event() {
                self.on_event(at, event);
            }
        }
        if let Some(h) = self.h.as_mut() {
            while let Some(event) = h.m.next_event() {
                let context = match event {
                    Event::Send { context, .. } | Event::Rma { context, .. } => context,
                    Event::RmaError { context, .. } => context,
                    Event::Recv(done) => {
                        h.recvs = h.recvs.saturating_sub(1);
                        done.context
                    }
                    Event::Error(e) => {
                        if !e.send {
                            h.recvs = h.recvs.saturating_sub(1);
                        }
                        e.context
                    }
                    _ => continue,
                };
                h.ops.remove(&context);
            }
        }
    }

    fn on_event(&mut self, at: usize, event: Event<MailboxAddr>) {
        let who = self.eps[at].who;
        let context = match &event {
            Event::Send { context, .. }
            | Event::Rma { context, .. }
            | Event::RmaError { context, .. } => *context,
            Event::Recv(done) => done.context,
            Event::Error(e) => e.context,
            Event::RemoteWrite { .. } | Event::RemoteAccess { .. } => return,
        };
        let Some(op) = self.eps[at].ops.remove(&context) else {
            self.fail(&format!(
                "{who:?} reported an operation it does not have (or a second time): {event:?}"
            ));
        };
        if op.peer == Who::H {
            return self.on_h_event(op, &event);
        }
        let ok = match (&op.kind, &event) {
            (OpKind::Send { mem, seed, len }, Event::Send { .. }) => mem
                .as_ref()
                .is_none_or(|m| m.guards_intact() && is_pattern(&m.bytes()[..*len], *seed)),
            (OpKind::Recv { mem, seed, len }, Event::Recv(done)) => {
                done.len == *len
                    && done.buf == mem.addr()
                    && mem.guards_intact()
                    && is_pattern(&mem.bytes()[..*len], *seed)
                    && mem.bytes()[*len..].iter().all(|&b| b == FILL)
            }
            (
                OpKind::Write {
                    local,
                    range,
                    slot,
                    at: off,
                    len,
                },
                Event::Rma {
                    kind: RmaKind::Write,
                    ..
                },
            ) => {
                let target = &mut self.eps[1 - at].ranges[*range];
                let start = slot * RMA_SLOT + off;
                target.shadow[start..start + len].copy_from_slice(local.bytes());
                target.busy[*slot] = false;
                local.guards_intact()
            }
            (
                OpKind::Read {
                    local,
                    range,
                    slot,
                    at: off,
                    len,
                },
                Event::Rma {
                    kind: RmaKind::Read,
                    ..
                },
            ) => {
                let target = &mut self.eps[1 - at].ranges[*range];
                let start = slot * RMA_SLOT + off;
                target.busy[*slot] = false;
                local.guards_intact() && local.bytes() == &target.shadow[start..start + len]
            }
            (
                OpKind::Atomic {
                    words,
                    first,
                    old,
                    new,
                    result,
                    ..
                },
                Event::Rma {
                    kind: RmaKind::Atomic | RmaKind::AtomicFetch,
                    ..
                },
            ) => {
                let target = &mut self.eps[1 - at].words[*words];
                let count = old.len();
                let mut ok = true;
                for i in 0..count {
                    let w = first + i;
                    let now = u64::from_le_bytes(
                        target.mem.bytes()[w * 8..w * 8 + 8].try_into().unwrap(),
                    );
                    ok &= now == new[i];
                    target.values[w] = new[i];
                    target.busy[w] = false;
                    if let Some(r) = result {
                        let got =
                            u64::from_le_bytes(r.bytes()[i * 8..i * 8 + 8].try_into().unwrap());
                        ok &= got == old[i] && r.guards_intact();
                    }
                }
                ok
            }
            _ => false,
        };
        if !ok {
            self.fail(&format!(
                "{who:?}: operation with {:?} ended wrong or with wrong data: {event:?}",
                op.peer
            ));
        }
        // The target's range must hold its shadow outside the slots in use.
        if let OpKind::Write { range, .. } | OpKind::Read { range, .. } = op.kind {
            self.check_range(1 - at, range);
        }
    }

    fn check_ranges(&self, at: usize) {
        for i in 0..self.eps[at].ranges.len() {
            self.check_range(at, i);
        }
    }

    fn check_range(&self, at: usize, i: usize) {
        let range = &self.eps[at].ranges[i];
        for slot in 0..RMA_SLOTS {
            let span = slot * RMA_SLOT..(slot + 1) * RMA_SLOT;
            if !range.busy[slot] && range.mem.bytes()[span.clone()] != range.shadow[span] {
                self.fail(&format!(
                    "{:?}: exposed range {i}, slot {slot}, changed outside any RMA",
                    self.eps[at].who
                ));
            }
        }
    }

    fn on_h_event(&mut self, op: Op, event: &Event<MailboxAddr>) {
        match (op.kind, event) {
            (OpKind::HRecv { slot }, Event::Recv(done)) => {
                let (mem, posted) = &mut self.h_slots[slot];
                if done.buf != mem.addr() || done.len > H_RECV_LEN {
                    self.fail(&format!("A: receive from H ended wrong: {event:?}"));
                }
                *posted = false;
                self.stats.h_recvs += 1;
            }
            (OpKind::HRecv { slot }, Event::Error(e)) if !e.send => {
                self.h_slots[slot].1 = false;
            }
            (OpKind::Send { mem, seed, len }, Event::Send { .. } | Event::Error(_)) => {
                if mem
                    .as_ref()
                    .is_some_and(|m| !m.guards_intact() || !is_pattern(&m.bytes()[..len], seed))
                {
                    self.fail("A: a send buffer of a send to H changed");
                }
            }
            _ => self.fail(&format!("A: operation with H ended wrong: {event:?}")),
        }
    }

    // --- H ---------------------------------------------------------------------------

    /// A new hostile endpoint that does first contact with A.
    fn new_hostile(&mut self) {
        let tap = Tap::open(self.job);
        let state = tap.state.clone();
        let route = tap.connect(&self.eps[0].m.addr()).expect("route to A");
        let m = Messenger::with_private_dma(tap, engine(&self.region), config()).expect("H");
        let arena = self.region.alloc(H_ARENA).expect("H's memory");
        self.h = Some(Hostile {
            m,
            tap: state,
            route,
            arena,
            ops: HashSet::new(),
            next_context: 0,
            recvs: 0,
            next_send: 0,
        });
        self.lost_before = self.eps[0].m.peers_lost();
        self.polite = self.rng.percent(20);
        // First contact both ways: A posts its receives for H (and greets
        // it), H sends and A answers.
        self.h_post_receives();
        self.h_send();
        self.a_send_to_h();
        let deadline = Instant::now() + DRAIN_TIME;
        while self.h.as_ref().unwrap().tap.lock().peer_ring.is_none() {
            if Instant::now() > deadline {
                self.fail("first contact of A and a new H never completed");
            }
            self.step_all();
        }
        // H's hello is in A's mailbox before A's reached H: a few steps
        // more and A has taken it.
        for _ in 0..8 {
            self.step_all();
        }
        self.stats.rounds += 1;
    }

    fn h_fenced(&self) -> bool {
        self.eps[0].m.peers_lost() > self.lost_before
    }

    /// A keeps its receives for H posted (while it still listens to H).
    fn h_post_receives(&mut self) {
        if self.h_fenced() {
            return;
        }
        let src = self.addr_of(Who::H);
        for slot in 0..H_RECV_SLOTS {
            if self.h_slots[slot].1 {
                continue;
            }
            let ep = &mut self.eps[0];
            let context = ep.context();
            let mem = &self.h_slots[slot].0;
            let recv = PostedRecv {
                context,
                iov: mem.iov(H_RECV_LEN),
                src: Some(src),
                tag: 0,
                ignore: u64::MAX,
                completion: true,
                multi_recv: false,
            };
            ep.ops.insert(
                context,
                Op {
                    peer: Who::H,
                    kind: OpKind::HRecv { slot },
                    step: self.step,
                    at: Instant::now(),
                },
            );
            self.h_slots[slot].1 = true;
            // SAFETY: the slots live as long as the world.
            unsafe { self.eps[0].m.post_recv(self.rng.percent(50), recv) };
        }
    }

    /// H's messenger sends A a message from its memory.
    fn h_send(&mut self) {
        let dest = self.eps[0].m.addr();
        let len = match self.rng.below(3) {
            0 => self.rng.below(23),
            1 => self.rng.range(23, EAGER),
            _ => self.rng.range(EAGER + 1, 4 * FRAGMENT),
        };
        let tag = self.rng.percent(50).then(|| self.rng.next());
        let delivery_complete = self.rng.percent(20);
        let h = self.h.as_mut().unwrap();
        // Round-robin over the first half of its arena.
        let at = h.next_send % (H_ARENA / 2 - 4 * FRAGMENT);
        h.next_send = h.next_send.wrapping_add(len + 64);
        h.next_context += 1;
        let context = h.next_context;
        let req = SendReq {
            dest,
            iov: IovList::One((h.arena.as_ptr() as usize + at, len)),
            info: MatchInfo { tag, data: None },
            context,
            completion: true,
            inject: false,
            copy: false,
            delivery_complete,
        };
        // SAFETY: the arena outlives H's messenger's use of it.
        if unsafe { h.m.send(req) }.is_ok() {
            h.ops.insert(context);
        }
    }

    /// A sends H a message; H keeps receives posted for them.
    fn a_send_to_h(&mut self) {
        let dest = self.addr_of(Who::H);
        let len = match self.rng.below(3) {
            0 => self.rng.below(23),
            1 => self.rng.range(23, EAGER),
            _ => self.rng.range(EAGER + 1, 4 * FRAGMENT),
        };
        let seed = self.rng.next();
        let dmable = self.rng.percent(50);
        let mut mem = Mem::new(&self.region, dmable, len, 0xa8);
        fill_pattern(mem.bytes_mut(), seed);
        let ep = &mut self.eps[0];
        let context = ep.context();
        let req = SendReq {
            dest,
            iov: mem.iov(len),
            info: MatchInfo::default(),
            context,
            completion: true,
            inject: false,
            copy: false,
            delivery_complete: self.rng.percent(20),
        };
        // SAFETY: `mem` lives in the operation until its completion.
        if unsafe { ep.m.send(req) }.is_ok() {
            ep.ops.insert(
                context,
                Op {
                    peer: Who::H,
                    kind: OpKind::Send {
                        mem: Some(mem),
                        seed,
                        len,
                    },
                    step: self.step,
                    at: Instant::now(),
                },
            );
            self.stats.a_sends_to_h += 1;
        }
        let a = self.eps[0].m.addr();
        let h = self.h.as_mut().unwrap();
        while h.recvs < 4 {
            h.next_context += 1;
            let context = h.next_context;
            let at = H_ARENA / 2 + h.recvs * 4 * FRAGMENT;
            let recv = PostedRecv {
                context,
                iov: IovList::One((h.arena.as_ptr() as usize + at, 4 * FRAGMENT)),
                src: Some(a),
                tag: 0,
                ignore: 0,
                completion: true,
                multi_recv: false,
            };
            // SAFETY: the arena outlives H's messenger's use of it.
            unsafe { h.m.post_recv(false, recv) };
            h.recvs += 1;
        }
    }

    /// H's RMA and atomics on the range A exposes to it.
    fn h_rma(&mut self) {
        let dest = self.eps[0].m.addr();
        let key = self.h_key;
        let at = self.rng.below(H_RANGE);
        let len = self.rng.below((H_RANGE - at).min(3 * FRAGMENT) + 1);
        let kind = if self.rng.percent(50) {
            RmaKind::Write
        } else {
            RmaKind::Read
        };
        let atomic = self.rng.percent(30);
        let h = self.h.as_mut().unwrap();
        h.next_context += 1;
        let context = h.next_context;
        let local = h.arena.as_ptr() as usize + H_ARENA - 4 * FRAGMENT;
        let posted = if atomic {
            let req = AtomicReq {
                dest,
                call: AtomicCall::Fetch,
                op: AtomicOp::Sum,
                datatype: Datatype::U64,
                count: 2,
                operand: IovList::One((local, 16)),
                compare: IovList::One((local, 0)),
                result: IovList::One((local + 16, 16)),
                addr: (at & !7).min(H_RANGE - 16) as u64,
                key,
                context,
                completion: true,
            };
            // SAFETY: the arena outlives H's messenger's use of it.
            unsafe { h.m.atomic(req) }
        } else {
            let req = RmaReq {
                dest,
                iov: IovList::One((local, len)),
                addr: at as u64,
                key,
                context,
                completion: true,
                inject: false,
                data: None,
            };
            // SAFETY: as above.
            unsafe { h.m.rma(kind, req) }
        };
        if posted.is_ok() {
            h.ops.insert(context);
        }
    }

    fn h_traffic(&mut self) {
        let Some(h) = self.h.as_ref() else {
            return;
        };
        let h_open = h.ops.len();
        self.h_post_receives();
        if h_open < 6 && self.rng.percent(15) {
            self.h_send();
        }
        if h_open < 6 && self.rng.percent(5) {
            self.h_rma();
        }
        if self.eps[0].open_ops(Who::H) < H_RECV_SLOTS + 3 && self.rng.percent(8) {
            self.a_send_to_h();
        }
    }

    /// H's round is over: its mailbox closes, A must end everything it had
    /// with H, then H's memory goes.
    fn end_hostile(&mut self) {
        // Out of the world (no more traffic with it), alive until A is
        // done with it.
        let h = self.h.take().unwrap();
        h.tap.lock().mbx = None;
        if self.h_fenced() {
            self.stats.fenced += 1;
        }
        let deadline = Instant::now() + DRAIN_TIME;
        while self.eps[0].open_ops(Who::H) > 0 {
            if Instant::now() > deadline {
                let open: Vec<_> = self.eps[0]
                    .ops
                    .iter()
                    .filter(|(_, o)| o.peer == Who::H)
                    .map(|(c, o)| (*c, matches!(o.kind, OpKind::HRecv { .. })))
                    .collect();
                self.fail(&format!(
                    "A's operations with a gone H never ended: {open:?} (context, is a receive)"
                ));
            }
            self.step_all();
            self.check_memory();
        }
        // Nothing of A refers to H's memory any more.
        drop(h);
    }

    // --- hostile input -------------------------------------------------------------

    /// Sends one message from H's mailbox, past its messenger.
    fn inject(&mut self, mut message: Message) {
        self.sanitize(&mut message);
        let h = self.h.as_ref().unwrap();
        let state = h.tap.lock();
        if let Some(mbx) = state.mbx.as_ref() {
            // A full mailbox drops it: the input still happened (a send).
            let _ = mbx.send(&h.route, &message);
        }
    }

    /// Keeps H's forgeries to what would reach H's own memory on real
    /// nodes (see the module docs): a grant, an offer or a ring outside
    /// H's memory that lies in this process's dmable memory is moved into
    /// H's, or out of any; a key of A's or B's exposures to each other
    /// becomes H's.
    fn sanitize(&mut self, message: &mut Message) {
        let arena = self.h.as_ref().unwrap().arena.as_ptr() as usize;
        let fix_range = |this: &mut World, addr: u64, len: usize| -> Option<u64> {
            let start = addr as usize;
            let end = start.checked_add(len.max(1));
            let inside = end.is_some_and(|end| start >= arena && end <= arena + H_ARENA);
            let touches = this
                .region
                .segment_ranges()
                .iter()
                .any(|&(base, size)| end.is_none_or(|end| start < base + size && end > base));
            if inside || !touches {
                return None;
            }
            Some(if this.rng.percent(50) && len <= H_ARENA {
                (arena + this.rng.below(H_ARENA - len)) as u64
            } else {
                0x1000 + (addr & 0xfff)
            })
        };
        match Wire::decode(message) {
            Some(Wire::Grant { addr, len, .. }) => {
                let len = (len as usize).max(FRAGMENT);
                if let Some(fixed) = fix_range(self, addr, len) {
                    message[8..16].copy_from_slice(&fixed.to_le_bytes());
                }
            }
            Some(Wire::Hello {
                ring,
                slot_shift,
                slots,
                ..
            }) => {
                let len = (slots as usize)
                    .checked_shl(slot_shift.into())
                    .unwrap_or(usize::MAX);
                if let Some(fixed) = fix_range(self, ring, len.min(1 << 40)) {
                    message[16..24].copy_from_slice(&fixed.to_le_bytes());
                }
            }
            // An offer to read H's own memory: its arena, never freed
            // (token 0), or wherever the fix puts it.
            Some(Wire::Offer { addr, .. }) => {
                if let Some(fixed) = fix_range(self, addr, FRAGMENT) {
                    message[6..14].copy_from_slice(&fixed.to_le_bytes());
                }
            }
            Some(Wire::RmaWrite { key, .. } | Wire::AtomicReq { key, .. })
                if self.private_keys.contains(&key) || (!self.polite && key == self.h_heap_key) =>
            {
                message[1..9].copy_from_slice(&self.h_key.to_le_bytes());
            }
            _ => {}
        }
    }

    /// A message H, A or B sent lately, or none yet.
    fn pick_history(&mut self) -> Option<Message> {
        let source = match self.rng.below(3) {
            0 => self.h.as_ref().unwrap().tap.clone(),
            1 => self.eps[0].tap.clone(),
            _ => self.eps[1].tap.clone(),
        };
        let state = source.lock();
        if state.sent.is_empty() {
            return None;
        }
        // Half of the time one of the last few: those name live transfers.
        let back = if self.rng.percent(50) {
            self.rng.below(4)
        } else {
            self.rng.below(state.sent.len())
        };
        Some(state.recent(back))
    }

    /// What a peer would answer to `message` of A (or B), forged by H with
    /// the ids it names: a fragment report for a grant, a FIN for a
    /// request to send or an acknowledged eager message, a refusal or a
    /// grant for an RMA request, a reply or result for an atomic one.
    fn answer(&mut self, message: &Message) -> Option<Message> {
        let some_gen = |this: &mut World| this.rng.below(4) as u16;
        let wire = match Wire::decode(message)? {
            Wire::Grant {
                send_id,
                fragment,
                recv_id,
                recv_gen,
                ..
            } => Wire::FragDone {
                send_id,
                fragment,
                recv_id,
                recv_gen,
            },
            Wire::Rts { send_id, len, .. } | Wire::RmaWrite { send_id, len, .. } => {
                match self.rng.below(3) {
                    0 => Wire::Fin { send_id },
                    1 => Wire::RmaNack {
                        id: send_id,
                        read: false,
                        error: unimem_proto::wire::RmaRefusal::Denied,
                    },
                    _ => Wire::Grant {
                        send_id,
                        fragment: self.rng.below(2) as u32,
                        addr: self.h.as_ref().unwrap().arena.as_ptr() as u64,
                        len: len.min(FRAGMENT as u32),
                        recv_id: self.some_id(),
                        recv_gen: some_gen(self),
                        // The arena was never freed: 0 is its token.
                        token: self.rng.below(2) as u16,
                    },
                }
            }
            Wire::Eager {
                ack: Some(send_id), ..
            } => Wire::Fin { send_id },
            Wire::RmaRead { recv_id, .. } => {
                if self.rng.percent(50) {
                    Wire::RmaNack {
                        id: recv_id,
                        read: true,
                        error: unimem_proto::wire::RmaRefusal::NoKey,
                    }
                } else {
                    Wire::ReadReady {
                        send_id: self.some_id(),
                        recv_id,
                    }
                }
            }
            Wire::ReadReady { send_id, .. } => Wire::Grant {
                send_id,
                fragment: 0,
                addr: self.h.as_ref().unwrap().arena.as_ptr() as u64,
                len: FRAGMENT as u32,
                recv_id: self.some_id(),
                recv_gen: some_gen(self),
                token: self.rng.below(2) as u16,
            },
            Wire::AtomicReq { id, .. } => {
                if self.rng.percent(50) {
                    Wire::AtomicReply { id, refusal: None }
                } else {
                    let bytes = self.rng.next().to_le_bytes();
                    Wire::AtomicResult {
                        id,
                        bytes: unimem_proto::wire::Chunk::new(&bytes[..self.rng.range(1, 8)]),
                    }
                }
            }
            Wire::FragDone { send_id, .. } => Wire::Fin { send_id },
            _ => return None,
        };
        Some(wire.encode())
    }

    /// An id seen on the wire lately (a send or receive id, a generation),
    /// or an interesting one.
    fn some_id(&mut self) -> u16 {
        if self.rng.percent(30) {
            return [0, 1, 2, 0xffff, 0x8000][self.rng.below(5)];
        }
        match self.pick_history() {
            Some(m) => u16::from_le_bytes([m[2 + self.rng.below(20)], m[3 + self.rng.below(20)]]),
            None => self.rng.next() as u16,
        }
    }

    fn mutate(&mut self, message: &mut Message) {
        for _ in 0..self.rng.range(1, 3) {
            let at = self.rng.below(MESSAGE_LEN);
            match self.rng.below(11) {
                0 | 1 => message[at] ^= 1 << self.rng.below(8),
                2 => message[at] = self.rng.next() as u8,
                3 => message[at] = [0, 1, 0x7f, 0x80, 0xff][self.rng.below(5)],
                4 => {
                    let id = self.some_id().to_le_bytes();
                    let at = self.rng.below(MESSAGE_LEN - 1);
                    message[at..at + 2].copy_from_slice(&id);
                }
                5 => {
                    let value: u32 =
                        [0, 1, u32::MAX, 0x7fff_ffff, FRAGMENT as u32, 1 << 27][self.rng.below(6)];
                    let at = self.rng.below(MESSAGE_LEN - 3);
                    message[at..at + 4].copy_from_slice(&value.to_le_bytes());
                }
                6 => {
                    let value = match self.rng.below(4) {
                        0 => 0,
                        1 => u64::MAX,
                        2 => self.h_key,
                        _ => self.rng.next(),
                    };
                    let at = self.rng.below(MESSAGE_LEN - 7);
                    message[at..at + 8].copy_from_slice(&value.to_le_bytes());
                }
                7 => message[0] = (message[0] & 0xf0) | self.rng.below(16) as u8,
                8 => message[0] = (message[0] & 0x0f) | (self.rng.below(16) as u8) << 4,
                9 => {
                    if let Some(other) = self.pick_history() {
                        let len = self.rng.range(1, MESSAGE_LEN - at);
                        message[at..at + len].copy_from_slice(&other[at..at + len]);
                    }
                }
                _ => {
                    let other = self.rng.below(MESSAGE_LEN);
                    message.swap(at, other);
                }
            }
        }
    }

    /// A request H may send: a write, read or atomic on its own range,
    /// with a fresh id. A serves it (and waits for H's part, which may
    /// never come).
    fn valid_request(&mut self) -> Message {
        let (key, base) = if self.polite && self.rng.percent(50) {
            (self.h_heap_key, self.h_heap.addr())
        } else {
            (self.h_key, self.h_range.addr())
        };
        let at = self.rng.below(H_RANGE - 8);
        let len = self.rng.range(1, H_RANGE - at) as u32;
        // The target's own address, as initiators send it.
        let addr = (base + at) as u64;
        let id = self.rng.next() as u16;
        let wire = match self.rng.below(3) {
            0 => Wire::RmaWrite {
                key,
                addr,
                len,
                send_id: id,
            },
            1 => Wire::RmaRead {
                key,
                addr,
                len,
                recv_id: id,
            },
            _ => Wire::AtomicReq {
                key,
                addr: addr & !7,
                op: AtomicOp::Sum as u8,
                datatype: Datatype::U64 as u8,
                count: 1,
                id,
                fetch: self.rng.percent(50),
            },
        };
        wire.encode()
    }

    fn random_message(&mut self) -> Message {
        let mut message = [0u8; MESSAGE_LEN];
        for chunk in message.chunks_mut(8) {
            let bytes = self.rng.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        if self.rng.percent(50) {
            // A valid op, so that it gets past decoding more often.
            message[0] = (message[0] & 0xf0) | self.rng.range(1, 15) as u8;
        }
        message
    }

    /// A write into memory H may reach: A's eager ring for it, A's receive
    /// buffers for it, or the range A exposes to it.
    fn shm_write(&mut self) {
        let ring = self.h.as_ref().unwrap().tap.lock().peer_ring;
        let (base, len) = match self.rng.below(3) {
            0 if ring.is_some() && !self.h_fenced() => ring.unwrap(),
            1 => {
                let slot = self.rng.below(H_RECV_SLOTS);
                (self.h_slots[slot].0.addr(), H_RECV_LEN)
            }
            _ => (self.h_range.addr(), H_RANGE),
        };
        let at = self.rng.below(len);
        let n = self.rng.range(1, 64).min(len - at);
        let value = self.rng.next();
        let mode = self.rng.below(4);
        // SAFETY: `[base, base + len)` is memory A handed H (its ring for
        // H, receive buffers directed at H, H's exposed range), alive as
        // long as A is; nothing else reads it during this call.
        let bytes = unsafe { std::slice::from_raw_parts_mut((base + at) as *mut u8, n) };
        match mode {
            0 => bytes[0] ^= 1 << (value % 8),
            1 => bytes.fill(value as u8),
            2 => {
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = (value >> (8 * (i % 8))) as u8;
                }
            }
            _ => bytes.fill(0xff),
        }
        self.stats.shm_writes += 1;
    }

    /// One hostile input, progress, and the checks.
    fn execute(&mut self) {
        let mut intercept = false;
        let choice = if self.polite {
            // Valid requests, or writes into H's memory.
            if self.rng.percent(60) {
                95
            } else {
                80
            }
        } else {
            self.rng.below(100)
        };
        match choice {
            0..=24 => {
                let mut message = self.pick_history().unwrap_or_else(|| self.random_message());
                if self.rng.percent(90) {
                    self.mutate(&mut message);
                }
                self.inject(message);
                self.stats.injected += 1;
            }
            25..=39 => {
                // An answer to one of the last messages of A (to B, mostly).
                let back = self.rng.below(6);
                let source = self.eps[0].tap.lock().sent.is_empty().then_some(());
                let last = match source {
                    Some(()) => None,
                    None => Some(self.eps[0].tap.lock().recent(back)),
                };
                let forged = last.and_then(|m| self.answer(&m));
                let mut message = forged.unwrap_or_else(|| self.random_message());
                if self.rng.percent(20) {
                    self.mutate(&mut message);
                }
                self.inject(message);
                self.stats.answers += 1;
            }
            40..=59 => {
                intercept = true;
                self.h.as_ref().unwrap().tap.lock().intercept = true;
            }
            60..=69 => {
                let message = self.random_message();
                self.inject(message);
                self.stats.random += 1;
            }
            70..=89 => self.shm_write(),
            _ => {
                let message = self.valid_request();
                self.inject(message);
                self.stats.requests += 1;
            }
        }
        // H first, so that a caught message reaches A in this execution.
        // H and B are not always scheduled: a forgery then finds the
        // transfers A just started before their real answers do.
        if intercept || self.rng.percent(70) {
            if let Some(h) = self.h.as_mut() {
                h.m.progress();
            }
        }
        let b_runs = self.rng.percent(60);
        if intercept {
            let caught = {
                let h = self.h.as_ref().unwrap();
                let mut state = h.tap.lock();
                state.intercept = false;
                state.intercepted.take()
            };
            let mut message = match caught {
                Some(m) => m,
                // Nothing left H: forge from the history instead.
                None => self.pick_history().unwrap_or_else(|| self.random_message()),
            };
            match self.rng.below(10) {
                // Dropped.
                0 => {}
                // Sent twice.
                1 => {
                    self.inject(message);
                    self.inject(message);
                }
                _ => {
                    self.mutate(&mut message);
                    self.inject(message);
                }
            }
            self.stats.intercepted += 1;
        }
        self.progress(0);
        if b_runs {
            self.progress(1);
        }
        self.drain_events();
        self.traffic(false);
        self.step += 1;
        self.check_memory();
        self.stats.execs += 1;
        CURRENT_EXEC.store(self.stats.execs, Ordering::Relaxed);
        if self.stats.execs.is_multiple_of(512) {
            self.check_hangs();
        }
    }

    /// One progress pass of A or B: in one pass of four the progress
    /// agent's (`set_helping`: what it matches, the sender copies), as
    /// when the application computes while its agent serves peers.
    fn progress(&mut self, at: usize) {
        let agent = self.rng.percent(25);
        let m = &mut self.eps[at].m;
        m.set_helping(agent);
        m.progress();
        m.set_helping(false);
    }

    /// One progress of everyone, events handled, traffic kept going.
    fn step_all(&mut self) {
        if let Some(h) = self.h.as_mut() {
            h.m.progress();
        }
        self.progress(0);
        self.progress(1);
        self.drain_events();
        self.traffic(false);
        self.step += 1;
    }

    // --- invariants ------------------------------------------------------------------

    /// Guards of every buffer of A and B, and the canaries.
    fn check_memory(&self) {
        for ep in &self.eps {
            let guards = ep.ops.values().all(|op| match &op.kind {
                OpKind::Send { mem, .. } => mem.as_ref().is_none_or(Mem::guards_intact),
                OpKind::Recv { mem, .. } => mem.guards_intact(),
                OpKind::HRecv { .. } => true,
                OpKind::Write { local, .. } | OpKind::Read { local, .. } => local.guards_intact(),
                OpKind::Atomic { result, .. } => result.as_ref().is_none_or(Mem::guards_intact),
            });
            let ranges = ep.ranges.iter().all(|r| r.mem.guards_intact())
                && ep.words.iter().all(|w| w.mem.guards_intact());
            let canaries = ep
                .canaries
                .iter()
                .all(|c| c.guards_intact() && c.bytes().iter().all(|&b| b == FILL));
            if !(guards && ranges && canaries) {
                self.fail(&format!(
                    "{:?}: a foreign write (guards: {guards}, ranges: {ranges}, canaries: {canaries})",
                    ep.who
                ));
            }
        }
        if !self.h_slots.iter().all(|(m, _)| m.guards_intact())
            || !self.h_range.guards_intact()
            || !self.h_heap.guards_intact()
        {
            self.fail("A: a write past the memory it granted H");
        }
    }

    fn check_hangs(&self) {
        for ep in &self.eps {
            for (context, op) in &ep.ops {
                if op.peer != Who::H && self.step - op.step > HANG_STEPS {
                    let what = format!(
                        "{:?}: operation {context} with {:?} hangs ({} steps, {:?}): {}; H polite: {}, fenced: {}\nA: {}\nB: {}",
                        ep.who,
                        op.peer,
                        self.step - op.step,
                        op.at.elapsed(),
                        op.kind.describe(),
                        self.polite,
                        self.h.is_some() && self.h_fenced(),
                        self.eps[0].m.debug_state(),
                        self.eps[1].m.debug_state()
                    );
                    self.fail(&what);
                }
            }
        }
    }

    /// The end: no new traffic; everything between A and B completes.
    fn finish(&mut self) {
        if self.h.is_some() {
            self.end_hostile();
        }
        let deadline = Instant::now() + FINISH_TIME;
        while self
            .eps
            .iter()
            .any(|e| !e.ops.is_empty() || !e.incoming.is_empty())
        {
            if Instant::now() > deadline {
                let open: Vec<usize> = self.eps.iter().map(|e| e.ops.len()).collect();
                self.fail(&format!("operations never completed at the end: {open:?}"));
            }
            self.progress(0);
            self.progress(1);
            self.drain_events();
            self.traffic(true);
            self.step += 1;
            self.check_memory();
        }
        for at in 0..2 {
            self.check_ranges(at);
            for (i, words) in self.eps[at].words.iter().enumerate() {
                for w in 0..WORDS {
                    let now =
                        u64::from_le_bytes(words.mem.bytes()[w * 8..w * 8 + 8].try_into().unwrap());
                    if now != words.values[w] {
                        self.fail(&format!(
                            "{:?}: word {w} of words {i} changed",
                            self.eps[at].who
                        ));
                    }
                }
            }
        }
    }
}

/// Runs a campaign of `execs` executions from `seed`; returns its stats.
fn campaign(seed: u64, execs: u64) -> Stats {
    let mut world = World::new(seed);
    let mut round_left = 0u64;
    let mut fenced_at: Option<u64> = None;
    while world.stats.execs < execs {
        if world.h.is_none() {
            world.new_hostile();
            round_left = world.rng.range(1000, 4000) as u64;
            fenced_at = None;
        }
        world.execute();
        round_left -= 1;
        if fenced_at.is_none() && world.h_fenced() {
            // A little of the fenced state, then a fresh H.
            fenced_at = Some(world.stats.execs);
            round_left = round_left.min(world.rng.range(20, 300) as u64);
        }
        if round_left == 0 {
            world.end_hostile();
        }
    }
    world.finish();
    let World { stats, .. } = world;
    stats
}

#[test]
fn fuzz_the_protocol_core() {
    let seed = env_u64("UNIMEM_FUZZ_SEED").unwrap_or(0x5eed_f022);
    // The CI campaign: about ten seconds in a debug build.
    let default = if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    };
    let execs = env_u64("UNIMEM_FUZZ_EXECS").unwrap_or(default);
    println!("fuzz: seed {seed:#x}, {execs} executions");
    let start = Instant::now();
    let result = std::panic::catch_unwind(|| campaign(seed, execs));
    let elapsed = start.elapsed();
    let stats = match result {
        Ok(stats) => stats,
        Err(panic) => {
            eprintln!(
                "fuzz: FAILED at execution {} of seed {seed:#x} after {elapsed:.1?}",
                CURRENT_EXEC.load(Ordering::Relaxed)
            );
            std::panic::resume_unwind(panic);
        }
    };
    let rate = stats.execs as f64 / elapsed.as_secs_f64();
    println!("fuzz: {stats:?}");
    println!(
        "fuzz: {} executions in {:.1} s ({:.0} execs/s), seed {seed:#x}, no invariant broken",
        stats.execs,
        elapsed.as_secs_f64(),
        rate
    );
}
