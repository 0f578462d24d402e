//! What the engine keeps of each peer: its directory, opened on first use
//! (and the segments it lists), the generation tables of its segments and
//! its key table.

use std::collections::hash_map::Entry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use unimem_mailbox::shm::SharedObject;
use unimem_mailbox::NodeId;

use super::{ShmDmaEngine, PAGE_SIZE};
use crate::error::DmaError;
use crate::gens::GenTable;
use crate::keys;
use crate::region::{directory, directory_name, gen_table_name};

/// A peer's directory, kept mapped while we hold registrations there.
pub(super) struct RemoteNode {
    pub(super) directory: SharedObject,
    /// Its key table, once a key of it was resolved.
    pub(super) keys: Option<Arc<SharedObject>>,
    /// The key resolved last in it: a run of operations under one key
    /// checks that its slot is unchanged instead of looking it up again.
    last_key: Option<keys::Found>,
    /// Generation tables of its segments, by index, once registered in.
    gens: Vec<Option<Arc<GenTable>>>,
}

impl ShmDmaEngine {
    fn remote_node(&mut self, node: NodeId) -> Result<&RemoteNode, DmaError> {
        self.remote_node_mut(node).map(|remote| &*remote)
    }

    /// `node`, opened on first use; one hash of its id when known (every
    /// small one-sided operation asks).
    fn remote_node_mut(&mut self, node: NodeId) -> Result<&mut RemoteNode, DmaError> {
        // Shared memory reaches this host only.
        if node.is_remote() {
            return Err(DmaError::NoSuchNode);
        }
        if node.job != self.region.node().job || node.pid == 0 {
            return Err(DmaError::NoSuchNode);
        }
        match self.nodes.entry(node) {
            Entry::Occupied(known) => {
                if known.get().directory.header().is_closed() {
                    known.remove();
                    return Err(DmaError::DeadNode);
                }
                Ok(known.into_mut())
            }
            Entry::Vacant(new) => {
                // The name holds a pid; the nonce tells which process of
                // that pid. A directory of another incarnation, or a
                // foreign object under the name, is passed over for the
                // node's own (which may have an alternative name, see
                // `SharedObject::create_avoiding`).
                let directory = SharedObject::open_checked(&directory_name(&node), |header| {
                    header.owner_pid() == node.pid && header.owner_start() as u32 == node.nonce
                })
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ECONNREFUSED) => DmaError::DeadNode,
                    Some(libc::ENOENT) | Some(libc::EAGAIN) => DmaError::NoSuchNode,
                    Some(libc::ESTALE) | Some(libc::EPERM) => {
                        if node.is_alive() {
                            DmaError::NoSuchNode
                        } else {
                            DmaError::DeadNode
                        }
                    }
                    _ => DmaError::Io(e),
                })?;
                Ok(new.insert(RemoteNode {
                    directory,
                    keys: None,
                    last_key: None,
                    gens: Vec::new(),
                }))
            }
        }
    }

    /// The segments of `node`'s dmable memory (its own node included), as
    /// its directory says: first data address and committed length of
    /// each, entries that cannot be a segment left out. The network
    /// backend registers its own with the transport from this.
    pub fn segments(&mut self, node: NodeId) -> Result<Vec<(u64, u64)>, DmaError> {
        let remote = self.remote_node(node)?;
        let dir = directory(&remote.directory);
        let count = dir.count.load(Ordering::Acquire) as usize;
        Ok(dir.segments[..count.min(dir.segments.len())]
            .iter()
            .map(|entry| {
                (
                    entry.base.load(Ordering::Relaxed),
                    entry.len.load(Ordering::Acquire),
                )
            })
            .filter(|&(base, len)| {
                base.is_multiple_of(PAGE_SIZE) && base.checked_add(len).is_some()
            })
            .collect())
    }

    /// The segment of `node` that holds `[addr, end)`: its index, first
    /// data address and committed end.
    pub(super) fn segment_of(
        &mut self,
        node: NodeId,
        addr: u64,
        end: u64,
    ) -> Result<(usize, u64, u64), DmaError> {
        let remote = self.remote_node(node)?;
        // Everything in the directory is the peer's to write: a count past
        // the table, an entry that wraps or is not page-aligned, are ignored
        // (and what a sane entry claims is checked against the segment
        // object itself when it is mapped).
        let dir = directory(&remote.directory);
        let count = dir.count.load(Ordering::Acquire) as usize;
        (0..count.min(dir.segments.len()))
            .find_map(|index| {
                let entry = &dir.segments[index];
                let base = entry.base.load(Ordering::Relaxed);
                let len = entry.len.load(Ordering::Acquire);
                let seg_end = base.checked_add(len)?;
                (base.is_multiple_of(PAGE_SIZE) && addr >= base && end <= seg_end)
                    .then_some((index, base, seg_end))
            })
            .ok_or(DmaError::OutOfBounds)
    }

    /// The generation table of `node`'s segment `index`, opened on first
    /// use (its owner must be the segment's).
    pub(super) fn gen_table(
        &mut self,
        node: NodeId,
        index: usize,
        owner: (u32, u64),
    ) -> Result<Arc<GenTable>, DmaError> {
        let remote = self.nodes.get_mut(&node).ok_or(DmaError::NoSuchNode)?;
        if let Some(Some(table)) = remote.gens.get(index) {
            return Ok(Arc::clone(table));
        }
        let object = SharedObject::open_checked(&gen_table_name(&node, index), |header| {
            header.owner_pid() == owner.0 && header.owner_start() == owner.1
        })
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESTALE) => DmaError::DeadNode,
            _ => DmaError::Io(e),
        })?;
        let table = Arc::new(GenTable::from_peer(object).ok_or(DmaError::OutOfBounds)?);
        if remote.gens.len() <= index {
            remote.gens.resize(index + 1, None);
        }
        remote.gens[index] = Some(Arc::clone(&table));
        Ok(table)
    }

    /// `key` in `node`'s key table (see [`DmaEngine::resolve_key`]).
    #[inline]
    pub(super) fn find_key(&mut self, node: NodeId, key: u64) -> Result<keys::Found, DmaError> {
        let remote = self.remote_node_mut(node)?;
        // A table the owner dropped (its last key went) and made again
        // is a new object under the same name: look again.
        if remote.keys.as_ref().is_some_and(|t| t.header().is_closed()) {
            remote.keys = None;
            remote.last_key = None;
        }
        if remote.keys.is_none() {
            remote.keys = Some(Arc::new(keys::open_table(&node)?));
        }
        let table = remote.keys.as_ref().expect("opened above");
        if let Some(found) = remote.last_key.filter(|found| found.key == key) {
            if keys::still(table, &found) {
                return Ok(found);
            }
        }
        let found = keys::find(table, key);
        remote.last_key = found.as_ref().ok().copied();
        found
    }
}
