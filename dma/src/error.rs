//! Why a DMA operation was refused.

use std::fmt;
use std::io;

/// Why a DMA operation was refused. A refused transfer moves no byte.
#[derive(Debug)]
pub enum DmaError {
    /// The local range is not (entirely) dmable memory.
    LocalNotDmable,
    /// The registration handle is unknown or was deregistered.
    NotRegistered,
    /// The remote range is not inside the registration, or (when
    /// registering) not inside the node's dmable memory.
    OutOfBounds,
    /// An address plus length overflows.
    LengthOverflow,
    /// No such node in this job.
    NoSuchNode,
    /// The node's process is gone.
    DeadNode,
    /// The dmable region reached its bound.
    OutOfMemory,
    /// `/dev/shm` has no room for the memory asked for (`ENOSPC`).
    NoSpace,
    /// A parameter is invalid (zero length, conflicting configuration).
    Invalid,
    /// The node exposes nothing under this key.
    NoSuchKey,
    /// The key is already exposed by this node.
    KeyInUse,
    /// The key does not grant the access asked for.
    AccessDenied,
    /// The owner freed memory of the registered range since it was
    /// registered: the registration no longer reaches what it named.
    /// Registering the range again gives a current one.
    Stale,
    /// The owner freed memory of the range since it granted it: the grant
    /// is void (its receive is gone), and no registration revives it.
    Revoked,
    /// The CPU's loads and stores do not reach that memory (a node of
    /// another host): only the engine's transfers do.
    NoLoadStore,
    /// The host refused a resource.
    Io(io::Error),
}

impl fmt::Display for DmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaError::LocalNotDmable => f.write_str("local buffer is not dmable memory"),
            DmaError::NotRegistered => f.write_str("remote range is not registered"),
            DmaError::OutOfBounds => f.write_str("remote range is out of bounds"),
            DmaError::LengthOverflow => f.write_str("address plus length overflows"),
            DmaError::NoSuchNode => f.write_str("no such node"),
            DmaError::DeadNode => f.write_str("remote node is dead"),
            DmaError::OutOfMemory => f.write_str("dmable memory exhausted"),
            DmaError::NoSpace => f.write_str("no space left in /dev/shm for dmable memory"),
            DmaError::Invalid => f.write_str("invalid argument"),
            DmaError::NoSuchKey => f.write_str("no such key"),
            DmaError::KeyInUse => f.write_str("key already in use"),
            DmaError::AccessDenied => f.write_str("key does not grant this access"),
            DmaError::Stale => f.write_str("registration is stale: the owner freed that memory"),
            DmaError::Revoked => f.write_str("grant is void: the owner freed that memory"),
            DmaError::NoLoadStore => f.write_str("loads and stores do not reach that node"),
            DmaError::Io(e) => write!(f, "DMA resource error: {e}"),
        }
    }
}

impl std::error::Error for DmaError {}

impl From<io::Error> for DmaError {
    fn from(e: io::Error) -> Self {
        DmaError::Io(e)
    }
}
