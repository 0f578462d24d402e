//! A fuzz harness for the protocol (the messenger), on stable Rust, with no dependency
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
//! - The random numbers come from SplitMix64 (the harness's
//!   [`testing::Rng`]), seeded by `UNIMEM_FUZZ_SEED`; `UNIMEM_FUZZ_EXECS`
//!   sets the budget. A failing campaign prints its seed and the execution
//!   it failed at; the seed replays the same inputs; the peer checks run on
//!   the clock, so a replay may still differ in when A notices H gone.
//! - The harness is the crate's ([`unimem_proto::testing`], shared with
//!   the unit tests: the test configuration, keys, random numbers), which
//!   this integration test sees through the crate's dev-dependency on
//!   itself with the feature `testing`. What is the fuzzer's own is in the
//!   modules below: the tapped mailbox (`tap`), guarded memory (`memory`),
//!   the world's making (`world`), the traffic between A and B and its
//!   checks (`traffic`), H (`hostile`), its input (`inputs`), and one
//!   execution with the invariants (`execution`).

mod execution;
mod hostile;
mod inputs;
mod memory;
mod tap;
mod traffic;
mod world;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use unimem_dma::{Access, DmaBuf, DmaRegion, KeyHandle, KeyTable, ShmDmaEngine};
use unimem_mailbox::{
    Error as MailboxError, JobId, Mailbox, MailboxAddr, Message, Profile, ShmMailbox,
    ShmMailboxConfig, ShmPeer, MESSAGE_LEN,
};
use unimem_proto::atomic::{AtomicCall, AtomicOp, Datatype};
use unimem_proto::matching::{IovList, PostedRecv};
use unimem_proto::messenger::SendReq;
use unimem_proto::testing::{self, expose_in, fresh_key, Rng, EAGER, FRAGMENT};
use unimem_proto::wire::{MatchInfo, Wire};
use unimem_proto::{AtomicReq, Event, Messenger, ProtoConfig, RmaKind, RmaReq};

use memory::{fill_pattern, is_pattern, Mem, FILL};
use tap::{Tap, TapState};

/// A messenger over a tapped mailbox.
type Ep = Messenger<(Tap, ShmDmaEngine)>;

// --- the world -----------------------------------------------------------------------

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

/// The harness's test configuration, with small queues and id spaces
/// (below), so that a hostile peer can reach their limits within a round.
fn config() -> ProtoConfig {
    ProtoConfig {
        tx_size: 64,
        // A notices a gone H quickly: rounds are short.
        peer_check: Some(Duration::from_millis(2)),
        unexpected_limit: 64 << 10,
        ..testing::config()
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

fn engine(region: &Arc<DmaRegion>) -> ShmDmaEngine {
    ShmDmaEngine::new(region.clone(), Profile::Native)
}

fn expose(keys: &Arc<KeyTable>, key: u64, mem: &Mem, access: Access) -> KeyHandle {
    expose_in(keys, key, mem.addr(), mem.len, access)
}

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
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
fn fuzz_the_protocol() {
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
