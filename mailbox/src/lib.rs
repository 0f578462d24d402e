//! The Unimem virtualized mailbox, and the emulated node it belongs to.
//!
//! Unimem's mailbox carries fixed 192-bit messages to a given node: the
//! control channel of the provider, and the carrier of tiny messages. This
//! crate defines the mailbox as a Rust interface ([`Mailbox`]) and provides
//! its first implementation, [`ShmMailbox`], an emulation in which processes
//! of one host act as Unimem nodes over shared memory.
//!
//! It also holds what every emulated device shares: node identity
//! ([`node`]), the named shared-memory objects and their lifecycle ([`shm`])
//! and the timing profiles ([`profile`]).

pub mod addr;
pub mod codec;
pub mod cpu;
mod crash;
pub mod doorbell;
pub mod fault;
pub mod idmap;
pub mod node;
pub mod profile;
pub mod shm;
mod shm_mailbox;

use std::fmt;
use std::hash::Hash;
use std::io;

pub use addr::{MailboxAddr, ADDR_LEN};
pub use idmap::{IdHasher, IdMap};
pub use node::{JobId, NicAddr, NodeId};
pub use profile::{Profile, TimingModel};
pub use shm_mailbox::{ShmMailbox, ShmMailboxConfig, ShmPeer, MAX_DEPTH};

/// Size of one mailbox message: 192 bits.
pub const MESSAGE_LEN: usize = 24;

/// One mailbox message.
pub type Message = [u8; MESSAGE_LEN];

/// Why a mailbox operation failed.
#[derive(Debug)]
pub enum Error {
    /// The destination's queue is full; retry after it drains.
    Busy,
    /// No such mailbox (malformed, never opened, another job, or closed and
    /// gone), or an invalid parameter.
    Invalid,
    /// The destination's owner closed it or died.
    Dead,
    /// The host refused a resource (shared memory, mappings).
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Busy => f.write_str("destination mailbox is full"),
            Error::Invalid => f.write_str("no such mailbox"),
            Error::Dead => f.write_str("destination mailbox is closed or its node is dead"),
            Error::Io(e) => write!(f, "mailbox resource error: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// A virtualized mailbox: many senders, one receiver, bounded, lock-free.
///
/// Guarantees of every implementation: a send never blocks (a full queue is
/// [`Error::Busy`]), a message is never dropped or torn, and messages of one
/// sender arrive in the order they were sent.
pub trait Mailbox: Send {
    /// Where a mailbox can be reached; at most 32 bytes when encoded.
    type Addr: Copy + Eq + Hash + fmt::Debug + fmt::Display;
    /// An open route to a peer's mailbox.
    type Peer: Send + Sync;

    /// This mailbox's address.
    fn addr(&self) -> Self::Addr;

    /// Opens a route to the mailbox at `dest`: [`Error::Invalid`] if there is
    /// none, [`Error::Dead`] if its node is gone.
    fn connect(&self, dest: &Self::Addr) -> Result<Self::Peer, Error>;

    /// Sends one message to `peer`, from this mailbox.
    fn send(&self, peer: &Self::Peer, message: &Message) -> Result<(), Error>;

    /// The next message that has arrived, with its source.
    fn poll(&mut self) -> Option<(Self::Addr, Message)>;

    /// Whether a message may be waiting: a cheap look, for callers that
    /// skip other work when nothing came; [`Self::poll`] decides.
    fn has_message(&self) -> bool;

    /// Whether `peer`'s node is still there.
    fn peer_alive(&self, peer: &Self::Peer) -> bool;
}
