//! What peers read of a region: the directory's layout (where each
//! segment sits in the owner's address space and how much of it is
//! committed) and the names of the region's objects.

use std::sync::atomic::{AtomicU32, AtomicU64};

use unimem_mailbox::shm::{object_name, SharedObject, HEADER_SIZE};
use unimem_mailbox::NodeId;

use super::MAX_SEGMENTS;

#[repr(C)]
pub(crate) struct SegmentEntry {
    /// Address of the segment's first data byte in the owner's address space.
    pub base: AtomicU64,
    /// Bytes of the segment committed so far (stored with Release once
    /// committed): peers register ranges inside these only.
    pub len: AtomicU64,
}

#[repr(C)]
pub(crate) struct Directory {
    /// Entries below this count are valid (stored with Release after the entry).
    pub count: AtomicU32,
    _pad: u32,
    pub segments: [SegmentEntry; MAX_SEGMENTS],
}

pub(crate) const DIRECTORY_OFFSET: usize = 128;
const _: () = assert!(DIRECTORY_OFFSET + std::mem::size_of::<Directory>() <= HEADER_SIZE);

pub(crate) fn directory_name(node: &NodeId) -> String {
    object_name(node.job, &format!("{}-dma", node.pid))
}

/// How many processes of this user on this host have dmable memory, in any
/// job: each has one directory object (`…-dma`, or `…-dma-<random>` when a
/// foreign object held that name). (Objects of killed processes count
/// until someone reclaims them.)
pub fn host_nodes() -> usize {
    unimem_mailbox::shm::list_objects(None)
        .iter()
        .filter(|name| name.ends_with("-dma") || name.contains("-dma-"))
        .count()
}

pub(crate) fn segment_name(node: &NodeId, index: usize) -> String {
    object_name(node.job, &format!("{}-seg{index}", node.pid))
}

/// The generation table of segment `index` (see `gens.rs`).
pub(crate) fn gen_table_name(node: &NodeId, index: usize) -> String {
    object_name(node.job, &format!("{}-gen{index}", node.pid))
}

/// The directory inside a mapped directory object.
pub(crate) fn directory(object: &SharedObject) -> &Directory {
    // SAFETY: directory objects are at least a header page long and the
    // Directory fits in it after the object header; it is atomics only.
    unsafe { &*(object.base().add(DIRECTORY_OFFSET) as *const Directory) }
}
