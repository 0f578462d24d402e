//! The Unimem DMA engine and its dmable memory.
//!
//! Two restrictions of the hardware shape this interface: a transfer's local
//! side must be *dmable* (allocated by the engine's allocator), and its
//! remote side must lie in a range registered first, which is costly. The
//! [`DmaEngine`] trait states the contract; [`ShmDmaEngine`] is the
//! shared-memory emulation in which every process is a node.

mod alloc;
mod atomic;
mod copier;
mod engine;
mod error;
mod gens;
pub mod heap_abi;
mod keys;
mod region;

use std::fmt;
use std::hash::Hash;

pub use atomic::{update_elements, ATOMIC_WIDTHS};
pub use copier::on_copy_done;
pub use engine::{RegLease, ShmDmaEngine};
pub use error::DmaError;
pub use keys::{Access, Exposure, KeyHandle, KeyLease, KeyTable, KEY_SLOTS};
pub use region::{
    host_nodes, DmaBuf, DmaRegion, MemClass, RegionConfig, ALLOC_ALIGN, COMMIT_CHUNK, MAX_SEGMENTS,
    REGION_SIZE_MAX, REGION_SIZE_MIN, SEGMENT_SIZE_MAX, SEGMENT_SIZE_MIN,
};

/// Handle of a remote registration.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RegId(pub u64);

/// What an atomic operation updates ([`DmaEngine::atomic`]): `count`
/// elements of `width` bytes from `remote_addr`, in registration `reg`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ElementRange {
    pub reg: RegId,
    pub remote_addr: u64,
    pub width: usize,
    pub count: usize,
}

/// Identifier of a submitted transfer, reported back by [`DmaEngine::poll`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct DmaId(pub u64);

/// An asynchronous DMA engine with remote registration.
///
/// Completions are polled by id and may come back in any order. A transfer
/// keeps its registration usable until it completes, even if deregistered
/// meanwhile.
pub trait DmaEngine: Send {
    /// A node the engine can reach.
    type Node: Copy + Eq + Hash + fmt::Debug + fmt::Display;

    /// This engine's own node: what peers register against.
    fn local_node(&self) -> Self::Node;

    /// Allocates dmable memory.
    fn alloc(&self, len: usize) -> Result<DmaBuf, DmaError>;

    /// Whether `[addr, addr + len)` is dmable memory of this node.
    fn is_dmable(&self, addr: *const u8, len: usize) -> bool;

    /// Prepares the route to `[addr, addr + len)` of `node`: the costly step.
    fn register(&mut self, node: Self::Node, addr: u64, len: usize) -> Result<RegId, DmaError>;

    /// Registers a range around `[addr, addr + len)` of `node`: the pages
    /// of the `window`-aligned stretch that holds it, as far as the node's
    /// memory there goes (at least the range's own pages). One
    /// registration then serves the neighbouring fragments of a large
    /// buffer. Returns it with the range it covers.
    fn register_window(
        &mut self,
        node: Self::Node,
        addr: u64,
        len: usize,
        window: usize,
    ) -> Result<(RegId, u64, usize), DmaError>;

    /// Makes registration `reg`, found [`DmaError::Stale`], current again:
    /// the owner freed memory of its range and allocated it anew, and the
    /// route must be prepared again (the costly step, as in `register`).
    fn revalidate(&mut self, reg: RegId) -> Result<(), DmaError>;

    /// Releases a registration.
    fn deregister(&mut self, reg: RegId) -> Result<(), DmaError>;

    /// Drops every registration of `node` and what the engine keeps of it
    /// (the node went away).
    fn forget_node(&mut self, node: Self::Node);

    /// Starts copying `len` bytes from local `local` to `remote_addr`, which
    /// must lie in registration `reg`. A registration of memory its owner
    /// freed since is refused with [`DmaError::Stale`] (so are `get` and
    /// `atomic`): owners invalidate what peers hold before reusing memory.
    fn put(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError>;

    /// [`Self::put`] into memory its owner granted with `token` (the owner's
    /// [`Self::grant_token`] of that range then): refused with
    /// [`DmaError::Revoked`], no byte moved, if the owner freed any of it
    /// since. A granted transfer is a rendezvous's, made by whoever
    /// progresses it (a caller that waits for it, or the progress agent):
    /// it is moved by the calling thread, never handed to another.
    fn put_granted(
        &mut self,
        local: *const u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: u16,
    ) -> Result<DmaId, DmaError>;

    /// What a grant of local dmable `[addr, addr + len)` carries so that
    /// [`Self::put_granted`] can tell the memory was not freed since; `None`
    /// if the range cannot be granted in place: not dmable memory of this
    /// node, or pages shared with other blocks (the heap's small blocks),
    /// whose frees would void the grant.
    fn grant_token(&self, addr: *const u8, len: usize) -> Option<u16>;

    /// Starts copying `len` bytes from `remote_addr` in `reg` to `local`.
    fn get(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
    ) -> Result<DmaId, DmaError>;

    /// [`Self::get`] from memory its owner offered with `token` (its
    /// [`Self::grant_token`] of that range then), as [`Self::put_granted`]
    /// puts into granted memory: refused with [`DmaError::Revoked`] if the
    /// owner freed any of it since, and moved by the calling thread.
    fn get_granted(
        &mut self,
        local: *mut u8,
        len: usize,
        reg: RegId,
        remote_addr: u64,
        token: u16,
    ) -> Result<DmaId, DmaError>;

    /// A completed transfer, if any.
    fn poll(&mut self) -> Option<DmaId>;

    /// Updates the elements of `target` with the engine's atomic unit,
    /// each element atomically against any other atomic update of that
    /// memory (see [`update_elements`]; `old` gets each element's bits
    /// before). Done when submitted; completes, as a transfer, once the
    /// engine's model says so.
    fn atomic(
        &mut self,
        target: ElementRange,
        update: &mut dyn FnMut(usize, u64) -> Option<u64>,
        old: &mut dyn FnMut(usize, u64),
    ) -> Result<DmaId, DmaError>;

    /// Transfers copied by the engine's own thread so far, while their
    /// submitter went on (see `ShmDmaEngine::set_async_copies`).
    fn moved_async(&self) -> u64 {
        0
    }

    /// Whether [`Self::load_store`] reaches `node`'s memory at all (a node
    /// of this host): asked before anything costly is done for it.
    fn loads_reach(&self, node: Self::Node) -> bool {
        let _ = node;
        false
    }

    /// Reaches `[remote_addr, remote_addr + len)` of registration `reg`
    /// with the CPU's own loads and stores, as Unimem's unified addressing
    /// lets a node reach a remote node's memory: runs `access` on where
    /// the range is mapped here, and is done when it returns (a store is
    /// then in the target's memory, a load here). The range is checked as
    /// for a transfer (inside the registration, [`DmaError::Stale`] if its
    /// owner freed any of it since), and the owner's frees wait until
    /// `access` returns. The model charges one way for stores (`store`)
    /// and a round trip for loads. [`DmaError::NoLoadStore`] where they
    /// do not reach (a node of another host).
    fn load_store(
        &mut self,
        reg: RegId,
        remote_addr: u64,
        len: usize,
        store: bool,
        access: &mut dyn FnMut(*mut u8),
    ) -> Result<(), DmaError> {
        let _ = (reg, remote_addr, len, store, access);
        Err(DmaError::NoLoadStore)
    }

    /// Registration `reg` resolved for a run of [`Self::load_store`]s by its
    /// holder alone, without the engine ([`RegLease::access`]: the same
    /// checks, each time); `None` where loads and stores do not reach it or
    /// the engine has no leases (the caller goes through `load_store`).
    fn lease_registration(&mut self, reg: RegId) -> Option<RegLease> {
        let _ = reg;
        None
    }

    /// Whether the engine's atomic unit reaches `node`'s memory; where it
    /// does not, atomics go to the owner's progress.
    fn atomics_reach(&self, node: Self::Node) -> bool {
        let _ = node;
        true
    }

    /// What `node` exposes under `key` for remote access (its own node
    /// included), read without any action of the node. The caller checks
    /// its access against it ([`Exposure::translate`]) before moving a
    /// byte; a transfer still needs a registration of the range.
    fn resolve_key(&mut self, node: Self::Node, key: u64) -> Result<Exposure, DmaError>;

    /// [`Self::resolve_key`] as a lease the caller keeps and asks again
    /// cheaply ([`KeyLease::still`]) before each use: the direct path's
    /// memory of a key it uses over and over. `None` where the engine has
    /// none (the caller resolves each time).
    fn lease_key(&mut self, node: Self::Node, key: u64) -> Option<KeyLease> {
        let _ = (node, key);
        None
    }
}
