//! The messaging protocol, in plain Rust: no libfabric inside, generic over
//! the hardware interfaces ([`unimem_mailbox::Mailbox`],
//! [`unimem_dma::DmaEngine`]), so that it is unit-tested on the emulation
//! and runs unchanged on another backend.
//!
//! Three ways to carry a message, chosen by size:
//! - **inline**: the whole message inside one 192-bit mailbox message;
//! - **eager**: the data is put by DMA into the next slot of a ring the
//!   receiver set aside for this sender, then announced by mailbox; the
//!   ring's slots are credits, returned by the receiver (piggybacked when it
//!   can), so a fast sender never overruns a slow receiver;
//! - **rendezvous**: a request to send; once matched, the receiver grants
//!   the message's *fragments* (each one DMA, into one of its staging
//!   buffers, or into the user buffer itself when it is dmable) a window at
//!   a time, the sender puts each and reports it, and the receiver ends with
//!   a FIN. Data moves only into matched receives.
//!
//! A domain's messengers share one DMA engine and one registration cache,
//! a [`DomainDma`]: see [`dma`].
//!
//! Ordering: one sender's mailbox messages arrive in order, data messages
//! leave each peer queue in order, and matching follows arrival order, which
//! gives `FI_ORDER_SAS`.
//!
//! Posting never waits for the peer: a send that cannot leave yet (no
//! credit, a full mailbox, no bounce buffer, no first contact) waits in its
//! peer's queue, and only a full transmit queue (`tx_size`) refuses one.

pub mod atomic;
/// The little-endian codec of the wire, which lives with the mailbox
/// (the network packets share it).
pub use unimem_mailbox::codec;
pub mod dma;
pub mod iov;
pub mod matching;
pub mod messenger;
pub mod pool;
pub mod wire;

/// The tests' harness, shared by the unit tests and the fuzz harness (see
/// its module docs); compiled for tests only.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;

pub use dma::{DmaView, DomainDma};
pub use messenger::{AtomicReq, Backend, Messenger, RmaReq, Stats};

use std::time::Duration;

use unimem_mailbox::{JobId, MailboxAddr, NodeId};

use wire::NODE_LEN;

/// Tunables of the protocol.
#[derive(Clone, Debug)]
pub struct ProtoConfig {
    /// Largest message sent eagerly; also the size of one eager slot.
    pub eager_size: usize,
    /// Eager slots (credits) a receiver sets aside per sender; 0 sets none
    /// aside, and senders' eager messages come by rendezvous.
    pub eager_credits: usize,
    /// Bounce buffers for eager sends: a send takes one when it leaves (it
    /// has a credit) and gives it back when its DMA completes, so sends
    /// waiting for a slow peer hold none.
    pub bounce_buffers: usize,
    /// Size of a rendezvous fragment (the piece of a message one DMA
    /// moves, one grant at a time), and so of each staging buffer. Set from
    /// the provider tunable `segment_size` (`FI_UNIMEM_SEGMENT_SIZE`).
    pub fragment_size: usize,
    /// Fragments granted ahead per rendezvous transfer.
    pub rendezvous_window: usize,
    /// Staging buffers (`fragment_size` each) per messenger on each side,
    /// for rendezvous from or into memory that is not dmable. Set from the
    /// provider tunable `staging_segments` (`FI_UNIMEM_STAGING_SEGMENTS`).
    pub staging_buffers: usize,
    /// Most sends outstanding at once (`tx_size`): sends queued for a slow
    /// peer count, as do those in flight. Beyond it, and only then, a post
    /// is refused (-FI_EAGAIN): a post never waits for the peer.
    pub tx_size: usize,
    /// Largest message (and RMA operation). The wire carries 64-bit
    /// lengths: the default is every length there is.
    pub max_msg_size: usize,
    /// Mailbox messages handled per progress call at most.
    pub poll_budget: usize,
    /// How often progress checks that known peers are alive; `None`: never.
    pub peer_check: Option<Duration>,
    /// Unexpected message data a receiver holds per sender (bytes, each
    /// message counted with [`UNEXPECTED_OVERHEAD`] more). Past it the
    /// sender is throttled: its messages come by rendezvous, their data
    /// left with it, until receives take the held ones below half of it.
    pub unexpected_limit: usize,
    /// Most mailbox messages (1 to [`wire::MAX_INLINE_PARTS`]) a message
    /// may take that does not fit one: one that fits that many goes in
    /// parts, back to back, rather than by DMA and announcement.
    pub inline_parts: usize,
    /// A message that fits in parts is stored into its eager slot instead
    /// where our stores reach the peer's ring (one host) and a slot is
    /// free. Off where a store is modeled as a mailbox trip of its own
    /// (the `paper` profile), which would make it dearer than the parts.
    pub store_before_parts: bool,
}

/// What an unexpected message costs its receiver besides its data (queue
/// entry, allocation), as counted against `unexpected_limit`.
pub const UNEXPECTED_OVERHEAD: usize = 64;

impl Default for ProtoConfig {
    fn default() -> Self {
        ProtoConfig {
            eager_size: 16 << 10,
            eager_credits: 64,
            bounce_buffers: 64,
            fragment_size: 256 << 10,
            rendezvous_window: 4,
            staging_buffers: 8,
            tx_size: 1024,
            max_msg_size: usize::MAX,
            poll_budget: 256,
            peer_check: Some(Duration::from_millis(100)),
            unexpected_limit: 1 << 20,
            inline_parts: wire::MAX_INLINE_PARTS,
            store_before_parts: true,
        }
    }
}

/// Accesses to one key of a target, by what they did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessCounts {
    pub key: u64,
    pub reads: u32,
    pub writes: u32,
    pub updates: u32,
}

impl AccessCounts {
    /// One access to `key` that read and/or wrote.
    pub fn one(key: u64, read: bool, write: bool) -> AccessCounts {
        AccessCounts {
            key,
            reads: u32::from(read && !write),
            writes: u32::from(write && !read),
            updates: u32::from(read && write),
        }
    }

    /// Those that read (fetching atomics included).
    pub fn read(&self) -> u64 {
        u64::from(self.reads) + u64::from(self.updates)
    }

    /// Those that wrote (fetching atomics included).
    pub fn written(&self) -> u64 {
        u64::from(self.writes) + u64::from(self.updates)
    }

    /// Those that read or wrote: each once.
    pub fn all(&self) -> u64 {
        self.read() + u64::from(self.writes)
    }

    /// These and `more` of the same key, unless a count would overflow.
    pub fn merged(&self, more: &AccessCounts) -> Option<AccessCounts> {
        Some(AccessCounts {
            key: self.key,
            reads: self.reads.checked_add(more.reads)?,
            writes: self.writes.checked_add(more.writes)?,
            updates: self.updates.checked_add(more.updates)?,
        })
    }
}

/// What a finished operation reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event<A> {
    /// A send finished: every send reports one, injects included, so that
    /// send counters count them all.
    Send {
        context: usize,
        tagged: bool,
        /// Whether it asked for a CQ entry (never for an inject).
        completion: bool,
    },
    Recv(RecvDone<A>),
    Error(OpError<A>),
    /// An RMA operation of ours finished: its data is in place (a write's
    /// at the target, a read's in our buffer). Reported for every one, so
    /// that counters count injects too; a CQ entry only with `completion`.
    Rma {
        context: usize,
        kind: RmaKind,
        completion: bool,
    },
    /// An RMA operation of ours failed and moved no byte (or, for a dead
    /// peer, an unknown part of them). Always reported.
    RmaError {
        context: usize,
        kind: RmaKind,
        error: ErrorKind,
    },
    /// A peer's write with CQ data landed in our memory.
    RemoteWrite {
        data: u64,
        len: usize,
    },
    /// Accesses of a peer to a range of ours exposed with
    /// [`unimem_dma::Access::NOTIFY_READ`] or `NOTIFY_WRITE`
    /// (`FI_RMA_EVENT`) are complete, under `key`: `reads` that only read,
    /// `writes` that only wrote, `updates` that did both (atomics that
    /// fetched).
    RemoteAccess(AccessCounts),
}

/// Which one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaKind {
    Write,
    Read,
    /// `fi_atomic`: an update that returns nothing.
    Atomic,
    /// `fi_fetch_atomic` and `fi_compare_atomic`: the old values come back.
    AtomicFetch,
}

impl RmaKind {
    pub const ALL: [RmaKind; 4] = [
        RmaKind::Write,
        RmaKind::Read,
        RmaKind::Atomic,
        RmaKind::AtomicFetch,
    ];
}

/// Where a messenger reports receives as they finish
/// ([`Messenger::set_recv_sink`]): the endpoint's receive CQ and counter,
/// so that a completion is written once, straight into its entry, instead
/// of queued as an [`Event::Recv`] and turned into one later. It is called
/// only when no event waits before it, so reports stay in order.
pub trait RecvSink<A>: Send {
    fn received(&mut self, done: &RecvDone<A>);
}

/// A completed receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvDone<A> {
    pub context: usize,
    pub completion: bool,
    pub tagged: bool,
    pub buf: usize,
    pub len: usize,
    pub tag: u64,
    pub data: Option<u64>,
    pub src: A,
    /// The multi-receive buffer this landed in is released with it.
    pub multi_released: bool,
    /// Part of a multi-receive buffer.
    pub multi: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The message was longer than the receive buffer.
    Truncated,
    /// `fi_cancel`led.
    Canceled,
    /// The peer is dead or unreachable.
    PeerUnreachable,
    /// `FI_PEEK` found nothing.
    NoMessage,
    /// The target exposes nothing under the key.
    BadKey,
    /// The key does not grant the access, or the range lies outside it.
    AccessDenied,
    /// The target refused the request as malformed (an atomic element not
    /// aligned to its size, an operation it does not have).
    Invalid,
}

/// A failed operation: always reported, whatever selective completion says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError<A> {
    pub context: usize,
    pub kind: ErrorKind,
    pub send: bool,
    pub tagged: bool,
    pub buf: usize,
    /// Bytes delivered.
    pub len: usize,
    /// Bytes that did not fit.
    pub olen: usize,
    pub tag: u64,
    pub data: Option<u64>,
    pub src: Option<A>,
    pub multi_released: bool,
}

/// Why a request was refused at once.
#[derive(Debug, PartialEq, Eq)]
pub enum PostError {
    /// The transmit queue (`tx_size`) is full; progress frees it (-FI_EAGAIN).
    Again,
    /// Longer than the largest message (-FI_EMSGSIZE).
    TooLong,
    /// Unknown or malformed destination (-FI_EINVAL).
    BadAddress,
    /// The destination is dead (-FI_EHOSTUNREACH).
    Unreachable,
    /// Resource the host refused (-FI_ENOMEM).
    NoMemory,
    /// An atomic operation and datatype we do not have (-FI_EOPNOTSUPP).
    Unsupported,
    /// Buffers shorter than the operation needs (-FI_EINVAL).
    TooShort,
}

/// A node identity that travels in a Hello, and what the receiver of the
/// Hello makes of it, knowing the mailbox address it came from (`A`).
pub trait WireNode<A>: Sized {
    fn to_wire(&self) -> [u8; NODE_LEN];
    /// The DMA node of the peer at `from` whose Hello names `bytes`; `None`
    /// if that cannot be its node: a peer's memory is its own process's,
    /// never another's it names.
    fn from_hello(bytes: &[u8; NODE_LEN], from: &A) -> Option<Self>;
}

impl WireNode<MailboxAddr> for NodeId {
    fn to_wire(&self) -> [u8; NODE_LEN] {
        let mut out = [0u8; NODE_LEN];
        out[0..4].copy_from_slice(&self.job.0.to_le_bytes());
        out[4..8].copy_from_slice(&self.pid.to_le_bytes());
        out[8..12].copy_from_slice(&self.nonce.to_le_bytes());
        out
    }

    fn from_hello(bytes: &[u8; NODE_LEN], from: &MailboxAddr) -> Option<Self> {
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let claimed = NodeId {
            job: JobId(word(0)),
            pid: word(4),
            nonce: word(8),
            // Where its mailbox is, its memory is: the network address
            // comes from the route the Hello took, not from the Hello.
            nic: from.node.nic,
        };
        // The process must be the mailbox's (its dmable region may belong
        // to another job: the preloaded heap's). A service mailbox names
        // no process, so its owner's claim stands.
        let owner = from.node;
        let same_process = claimed.pid == owner.pid && claimed.nonce == owner.nonce;
        (from.is_service() || same_process).then_some(claimed)
    }
}

#[cfg(test)]
pub(crate) use testing::test_job;

/// The unit tests' allocator: the system's, counting each thread's
/// allocations, so that a test can check a path allocates nothing.
#[cfg(test)]
pub(crate) mod counting_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    struct Counting;

    // SAFETY: every call goes to the system allocator unchanged; counting
    // touches a const-initialized thread-local, which never allocates.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            // SAFETY: forwarded from the caller.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded from the caller.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            // SAFETY: forwarded from the caller.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Allocations (and reallocations) of this thread so far.
    pub(crate) fn allocations() -> u64 {
        ALLOCATIONS.with(Cell::get)
    }
}
