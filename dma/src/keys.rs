//! Remote-access keys: what a node lets its peers read and write.
//!
//! A node *exposes* a range of its memory under a 64-bit key (libfabric's
//! `fi_mr_reg` with remote access); a peer that names the key *resolves* it
//! to the range and its rights, checks its access against them, and only
//! then moves a byte. The table lives in a shared-memory object of the
//! owner (`{pid}-keys`), so that resolving takes no action of the owner:
//! a one-sided access to dmable memory completes while the owner computes.
//!
//! The table is an open-addressed hash of fixed capacity, written by its
//! owner alone (under a lock of its own) and read by peers. Each slot is a
//! seqlock: the owner makes its sequence odd, writes, makes it even again;
//! a reader retries while the sequence is odd or changed under it. A peer
//! trusts nothing it reads there: probes are bounded, a slot caught
//! mid-write too long is passed over (its key is being exposed or
//! withdrawn, so it is not the stable key looked for, which may lie
//! beyond: an owner preempted mid-write on a busy host must not hide it),
//! and the range found is checked again by the engine (a registration
//! covers only the node's dmable memory) before any transfer.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use unimem_mailbox::shm::{object_name, SharedObject, HEADER_SIZE};
use unimem_mailbox::{JobId, NodeId};

use crate::error::DmaError;

/// Slots in a key table: keys one node can expose at once.
pub const KEY_SLOTS: usize = 4096;

/// Rights a key grants its peers.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Access(u64);

impl Access {
    pub const REMOTE_READ: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers name bytes by virtual address; without it, by offset from the
    /// start of the range.
    pub const VIRTUAL_ADDRESS: Access = Access(4);
    /// The owner counts remote reads (libfabric's `FI_RMA_EVENT`): an
    /// initiator that reads it one-sided tells it afterwards.
    pub const NOTIFY_READ: Access = Access(8);
    /// The owner counts remote writes: an initiator that writes it
    /// one-sided (atomics included) tells it afterwards.
    pub const NOTIFY_WRITE: Access = Access(16);
    const ALL: u64 = 31;

    pub const fn empty() -> Access {
        Access(0)
    }

    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the owner counts any remote access.
    pub const fn counts_any(self) -> bool {
        self.0 & (Self::NOTIFY_READ.0 | Self::NOTIFY_WRITE.0) != 0
    }

    /// Whether the owner counts an access that needs `need` (the rights
    /// `REMOTE_READ` and/or `REMOTE_WRITE`): it must be told of it.
    pub const fn counts(self, need: Access) -> bool {
        (need.0 & Self::REMOTE_READ.0 != 0 && self.0 & Self::NOTIFY_READ.0 != 0)
            || (need.0 & Self::REMOTE_WRITE.0 != 0 && self.0 & Self::NOTIFY_WRITE.0 != 0)
    }

    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Only the bits this version defines: a peer may have written others.
    pub const fn from_bits_truncate(bits: u64) -> Access {
        Access(bits & Self::ALL)
    }
}

/// A range a node exposes under a key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Exposure {
    /// First byte, in the owner's address space.
    pub addr: u64,
    pub len: u64,
    pub access: Access,
}

impl Exposure {
    /// The owner's address of `[at, at + len)` named by a peer (a virtual
    /// address or an offset, as the key says), if it lies inside the range
    /// and the key grants `need`.
    pub fn translate(&self, at: u64, len: u64, need: Access) -> Result<u64, DmaError> {
        let start = if self.access.contains(Access::VIRTUAL_ADDRESS) {
            at
        } else {
            self.addr.checked_add(at).ok_or(DmaError::OutOfBounds)?
        };
        self.check(start, len, need)?;
        Ok(start)
    }

    /// Whether the owner's `[start, start + len)` lies inside the range and
    /// the key grants `need` (the owner names its bytes by address).
    pub fn check(&self, start: u64, len: u64, need: Access) -> Result<(), DmaError> {
        if !self.access.contains(need) {
            return Err(DmaError::AccessDenied);
        }
        let end = start.checked_add(len).ok_or(DmaError::OutOfBounds)?;
        let range_end = self
            .addr
            .checked_add(self.len)
            .ok_or(DmaError::OutOfBounds)?;
        if start < self.addr || end > range_end {
            return Err(DmaError::OutOfBounds);
        }
        Ok(())
    }
}

const EMPTY: u64 = 0;
const LIVE: u64 = 1;
/// A withdrawn key: lookups probe past it.
const REMOVED: u64 = 2;

/// One slot of the table, a cache line.
#[repr(C, align(64))]
struct Slot {
    /// Odd while the owner writes the slot.
    seq: AtomicU64,
    state: AtomicU64,
    key: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    access: AtomicU64,
}

const TABLE_LEN: usize = HEADER_SIZE + KEY_SLOTS * std::mem::size_of::<Slot>();

fn table_name(node: &NodeId) -> String {
    object_name(node.job, &format!("{}-keys", node.pid))
}

fn home(key: u64) -> usize {
    // Fibonacci hashing: keys are often small counters or pointers.
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % KEY_SLOTS
}

/// The slots of a mapped table object, which must be `TABLE_LEN` long.
fn slots(object: &SharedObject) -> &[Slot] {
    debug_assert!(object.len() >= TABLE_LEN);
    // SAFETY: the object holds TABLE_LEN bytes (checked by whoever mapped
    // it); slots follow the header page, 64-byte aligned, and are atomics
    // only, valid for any bit pattern.
    unsafe { std::slice::from_raw_parts(object.base().add(HEADER_SIZE) as *const Slot, KEY_SLOTS) }
}

/// Reads a slot consistently, with the sequence number it was read at;
/// None if the owner is too long at it.
fn read_slot(slot: &Slot) -> Option<(u64, u64, Exposure, u64)> {
    for _ in 0..1000 {
        let before = slot.seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let state = slot.state.load(Ordering::Relaxed);
        let key = slot.key.load(Ordering::Relaxed);
        let exposure = Exposure {
            addr: slot.addr.load(Ordering::Relaxed),
            len: slot.len.load(Ordering::Relaxed),
            access: Access::from_bits_truncate(slot.access.load(Ordering::Relaxed)),
        };
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) == before {
            return Some((state, key, exposure, before));
        }
    }
    None
}

/// A peer's key as resolved once, kept by a caller that uses it again and
/// again: whether it still holds is one load from the owner's table (its
/// slot's sequence number), with no look-up of the node or the key.
#[derive(Clone)]
pub struct KeyLease {
    table: Arc<SharedObject>,
    found: Found,
}

impl std::fmt::Debug for KeyLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLease")
            .field("key", &self.found.key)
            .field("exposure", &self.found.exposure)
            .finish()
    }
}

impl KeyLease {
    pub(crate) fn new(table: Arc<SharedObject>, found: Found) -> KeyLease {
        KeyLease { table, found }
    }

    pub fn key(&self) -> u64 {
        self.found.key
    }

    /// What the key exposed when it was resolved; current while
    /// [`Self::still`] says so.
    pub fn exposure(&self) -> Exposure {
        self.found.exposure
    }

    /// Whether the owner still exposes the same range with the same
    /// rights under the key: its slot was not written since, and the table
    /// is still the owner's (not dropped, perhaps made again).
    #[inline]
    pub fn still(&self) -> bool {
        !self.table.header().is_closed() && still(&self.table, &self.found)
    }
}

/// Looks `key` up in a peer's (or our own) mapped table.
pub(crate) fn lookup(object: &SharedObject, key: u64) -> Result<Exposure, DmaError> {
    find(object, key).map(|found| found.exposure)
}

/// A key found in a table: its slot, the slot's sequence number when it
/// was read, and what it exposed then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub(crate) key: u64,
    index: usize,
    seq: u64,
    pub(crate) exposure: Exposure,
}

/// Looks `key` up in a peer's (or our own) mapped table.
pub(crate) fn find(object: &SharedObject, key: u64) -> Result<Found, DmaError> {
    if object.len() < TABLE_LEN {
        return Err(DmaError::NoSuchKey);
    }
    let slots = slots(object);
    let start = home(key);
    for probe in 0..KEY_SLOTS {
        let index = (start + probe) % KEY_SLOTS;
        // Caught mid-write: a key coming or going, not a stable one. Slots
        // never become empty again, so the key looked for, if exposed
        // before, lies on: probe on.
        let Some((state, found, exposure, seq)) = read_slot(&slots[index]) else {
            continue;
        };
        match state {
            EMPTY => break,
            LIVE if found == key => {
                return Ok(Found {
                    key,
                    index,
                    seq,
                    exposure,
                })
            }
            _ => {}
        }
    }
    Err(DmaError::NoSuchKey)
}

/// Whether `found` still holds: its slot was not written since (the
/// owner bumps the sequence number around every change of a slot), so the
/// key is still there with the same range and rights. One load of a line
/// the owner rarely writes, instead of a probe and a consistent read.
pub(crate) fn still(object: &SharedObject, found: &Found) -> bool {
    object.len() >= TABLE_LEN && slots(object)[found.index].seq.load(Ordering::Acquire) == found.seq
}

/// Opens `node`'s key table, checking it is that process's.
pub(crate) fn open_table(node: &NodeId) -> Result<SharedObject, DmaError> {
    let object = SharedObject::open_checked(&table_name(node), |header| {
        header.owner_pid() == node.pid && header.owner_start() as u32 == node.nonce
    })
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => DmaError::DeadNode,
        Some(libc::ENOENT) | Some(libc::EAGAIN) | Some(libc::ESTALE) | Some(libc::EPERM) => {
            DmaError::NoSuchKey
        }
        _ => DmaError::Io(e),
    })?;
    // The name holds a pid; the nonce tells which process of that pid.
    if object.header().owner_start() as u32 != node.nonce || object.len() < TABLE_LEN {
        return Err(DmaError::NoSuchKey);
    }
    Ok(object)
}

/// This process's key table: what it exposes to its peers.
pub struct KeyTable {
    node: NodeId,
    object: SharedObject,
    /// The owner's writes, one at a time.
    write: Mutex<()>,
}

static PROCESS_TABLE: Mutex<Weak<KeyTable>> = Mutex::new(Weak::new());

impl KeyTable {
    /// The table of this process in `job`, created on first use and kept
    /// while someone holds it. After `fork` the child gets a table of its
    /// own: the inherited one is the parent's.
    pub fn for_process(job: JobId) -> Result<Arc<KeyTable>, DmaError> {
        let mut current = PROCESS_TABLE.lock();
        if let Some(table) = current.upgrade() {
            if table.node.pid == std::process::id() {
                if table.node.job != job {
                    return Err(DmaError::Invalid);
                }
                return Ok(table);
            }
            // The parent's: never drop (unlink) it from the child.
            std::mem::forget(table);
        }
        let node = NodeId::current(job);
        let object = SharedObject::create_avoiding(&table_name(&node), TABLE_LEN, TABLE_LEN)?;
        object.publish();
        let table = Arc::new(KeyTable {
            node,
            object,
            write: Mutex::new(()),
        });
        *current = Arc::downgrade(&table);
        Ok(table)
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Exposes `exposure` under `key`; the key is withdrawn when the handle
    /// drops. Fails with [`DmaError::KeyInUse`] for a key already exposed
    /// and [`DmaError::OutOfMemory`] when the table is full.
    pub fn expose(self: &Arc<Self>, key: u64, exposure: Exposure) -> Result<KeyHandle, DmaError> {
        let _write = self.write.lock();
        let slots = slots(&self.object);
        let start = home(key);
        let mut free = None;
        for probe in 0..KEY_SLOTS {
            let index = (start + probe) % KEY_SLOTS;
            let slot = &slots[index];
            match slot.state.load(Ordering::Relaxed) {
                LIVE if slot.key.load(Ordering::Relaxed) == key => return Err(DmaError::KeyInUse),
                LIVE => {}
                REMOVED => {
                    free.get_or_insert(index);
                }
                _ => {
                    free.get_or_insert(index);
                    break;
                }
            }
        }
        let index = free.ok_or(DmaError::OutOfMemory)?;
        let slot = &slots[index];
        write_slot(slot, |slot| {
            slot.key.store(key, Ordering::Relaxed);
            slot.addr.store(exposure.addr, Ordering::Relaxed);
            slot.len.store(exposure.len, Ordering::Relaxed);
            slot.access.store(exposure.access.bits(), Ordering::Relaxed);
            slot.state.store(LIVE, Ordering::Relaxed);
        });
        Ok(KeyHandle {
            table: Arc::clone(self),
            index,
            key,
        })
    }

    /// What this process exposes under `key` (as a peer would find it).
    pub fn lookup(&self, key: u64) -> Result<Exposure, DmaError> {
        lookup(&self.object, key)
    }
}

/// Writes a slot under its seqlock.
fn write_slot(slot: &Slot, write: impl FnOnce(&Slot)) {
    let seq = slot.seq.load(Ordering::Relaxed);
    slot.seq.store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    write(slot);
    slot.seq.store(seq + 2, Ordering::Release);
}

/// A key exposed by this process; withdrawn on drop.
pub struct KeyHandle {
    table: Arc<KeyTable>,
    index: usize,
    key: u64,
}

impl KeyHandle {
    /// Changes the rights of the exposed range (what initiators find from
    /// their next lookup on).
    pub fn set_access(&self, access: Access) {
        if self.table.node.pid != std::process::id() {
            return;
        }
        let _write = self.table.write.lock();
        let slot = &slots(&self.table.object)[self.index];
        write_slot(slot, |slot| {
            slot.access.store(access.bits(), Ordering::Relaxed)
        });
    }

    pub fn key(&self) -> u64 {
        self.key
    }
}

impl std::fmt::Debug for KeyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyHandle").field("key", &self.key).finish()
    }
}

impl Drop for KeyHandle {
    fn drop(&mut self) {
        // A forked child's handle names its parent's table: leave it be.
        if self.table.node.pid != std::process::id() {
            return;
        }
        let _write = self.table.write.lock();
        let slot = &slots(&self.table.object)[self.index];
        write_slot(slot, |slot| slot.state.store(REMOVED, Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobId {
        JobId::from_name(&format!("dma-keys-{}", std::process::id()))
    }

    #[test]
    fn translate_checks_rights_and_bounds() {
        let by_offset = Exposure {
            addr: 0x1000,
            len: 0x100,
            access: Access::REMOTE_READ,
        };
        assert_eq!(
            by_offset.translate(0x10, 8, Access::REMOTE_READ).unwrap(),
            0x1010
        );
        assert!(matches!(
            by_offset.translate(0x10, 8, Access::REMOTE_WRITE),
            Err(DmaError::AccessDenied)
        ));
        assert!(matches!(
            by_offset.translate(0xf9, 8, Access::REMOTE_READ),
            Err(DmaError::OutOfBounds)
        ));
        assert!(matches!(
            by_offset.translate(u64::MAX, 8, Access::REMOTE_READ),
            Err(DmaError::OutOfBounds)
        ));
        let by_address = Exposure {
            access: Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
            ..by_offset
        };
        assert_eq!(
            by_address
                .translate(0x10f8, 8, Access::REMOTE_WRITE)
                .unwrap(),
            0x10f8
        );
        assert!(by_address
            .translate(0xff8, 8, Access::REMOTE_WRITE)
            .is_err());
        assert!(by_address
            .translate(0x10f9, 8, Access::REMOTE_WRITE)
            .is_err());
    }

    /// A key found once holds while its slot is unchanged; new rights, a
    /// withdrawal, or the key exposed again (another range) end it.
    #[test]
    fn a_found_key_holds_until_its_slot_changes() {
        let table = KeyTable::for_process(job()).unwrap();
        let exposure = |addr| Exposure {
            addr,
            len: 64,
            access: Access::REMOTE_READ,
        };
        let key = 0x5eed_0000_0000_0001;
        let handle = table.expose(key, exposure(0x1000)).unwrap();
        let found = find(&table.object, key).unwrap();
        assert_eq!(found.exposure, exposure(0x1000));
        assert!(still(&table.object, &found));
        assert!(still(&table.object, &found), "a look changes nothing");

        handle.set_access(Access::REMOTE_WRITE);
        assert!(!still(&table.object, &found), "new rights");
        let found = find(&table.object, key).unwrap();
        assert_eq!(found.exposure.access, Access::REMOTE_WRITE);
        assert!(still(&table.object, &found));

        drop(handle);
        assert!(!still(&table.object, &found), "withdrawn");
        let _again = table.expose(key, exposure(0x2000)).unwrap();
        assert!(!still(&table.object, &found), "exposed again");
        assert_eq!(find(&table.object, key).unwrap().exposure, exposure(0x2000));
    }

    #[test]
    fn a_lease_holds_until_the_owner_changes_or_withdraws_its_key() {
        let table = KeyTable::for_process(job()).unwrap();
        let exposure = |addr| Exposure {
            addr,
            len: 64,
            access: Access::REMOTE_READ,
        };
        let key = 0x5eed_0000_0000_0002;
        let handle = table.expose(key, exposure(0x1000)).unwrap();
        // As a peer sees the table: a mapping of its own.
        let seen = Arc::new(open_table(&table.node()).unwrap());
        let lease =
            |seen: &Arc<SharedObject>| KeyLease::new(Arc::clone(seen), find(seen, key).unwrap());
        let first = lease(&seen);
        assert_eq!((first.key(), first.exposure()), (key, exposure(0x1000)));
        assert!(first.still() && first.still(), "a look changes nothing");

        handle.set_access(Access::REMOTE_WRITE);
        assert!(!first.still(), "new rights");
        let second = lease(&seen);
        assert_eq!(second.exposure().access, Access::REMOTE_WRITE);
        assert!(second.still());

        drop(handle);
        assert!(!second.still(), "withdrawn");
        let _again = table.expose(key, exposure(0x2000)).unwrap();
        assert!(!second.still(), "exposed again, elsewhere");
        assert_eq!(lease(&seen).exposure(), exposure(0x2000));
    }

    #[test]
    fn expose_lookup_withdraw_reuse() {
        let table = KeyTable::for_process(job()).unwrap();
        let exposure = |addr| Exposure {
            addr,
            len: 64,
            access: Access::REMOTE_READ,
        };
        // Keys that share a home slot probe past each other.
        let keys: Vec<u64> = (0..200u64).map(|i| i << 52).collect();
        let handles: Vec<KeyHandle> = keys
            .iter()
            .map(|&k| table.expose(k, exposure(k + 1)).unwrap())
            .collect();
        assert!(matches!(
            table.expose(keys[7], exposure(0)),
            Err(DmaError::KeyInUse)
        ));
        for &k in &keys {
            assert_eq!(table.lookup(k).unwrap().addr, k + 1);
        }
        // A peer's view: the same object opened by name.
        let opened = open_table(&table.node()).unwrap();
        assert_eq!(lookup(&opened, keys[3]).unwrap(), exposure(keys[3] + 1));
        assert!(matches!(lookup(&opened, 12345), Err(DmaError::NoSuchKey)));
        drop(handles);
        for &k in &keys {
            assert!(matches!(table.lookup(k), Err(DmaError::NoSuchKey)));
        }
        let again = table.expose(keys[0], exposure(9)).unwrap();
        assert_eq!(lookup(&opened, keys[0]).unwrap().addr, 9);
        drop(again);

        // Full: every slot, removed ones reused, then a refusal. (One test:
        // the table is the process's, shared by parallel tests.)
        let mut held = Vec::new();
        let refused = loop {
            match table.expose((1 << 40) + held.len() as u64, exposure(0)) {
                Ok(h) => held.push(h),
                Err(e) => break e,
            }
        };
        assert!(matches!(refused, DmaError::OutOfMemory));
        assert_eq!(held.len(), KEY_SLOTS);
    }

    /// The owner caught in the middle of writing a slot (preempted between
    /// the two halves of its seqlock: on a busy host, for a whole time
    /// slice) must not hide the keys that lie past that slot in their
    /// probe sequence. The slot's own key is changing; the others are not.
    #[test]
    fn a_slot_caught_mid_write_hides_no_other_key() {
        let name = object_name(job(), "keys-mid-write");
        let object = SharedObject::create(&name, TABLE_LEN).unwrap();
        object.publish();
        let slots = slots(&object);
        let put = |index: usize, key: u64| {
            write_slot(&slots[index % KEY_SLOTS], |slot| {
                slot.key.store(key, Ordering::Relaxed);
                slot.addr.store(key + 1, Ordering::Relaxed);
                slot.len.store(64, Ordering::Relaxed);
                slot.access
                    .store(Access::REMOTE_READ.bits(), Ordering::Relaxed);
                slot.state.store(LIVE, Ordering::Relaxed);
            })
        };
        // Two keys with one home slot: the second probes past the first.
        let first = 7u64;
        let at = home(first);
        let second = (first + 1..).find(|&k| home(k) == at).unwrap();
        put(at, first);
        put(at + 1, second);
        assert_eq!(lookup(&object, second).unwrap().addr, second + 1);
        // The owner starts withdrawing `first` and stops there.
        slots[at].seq.fetch_add(1, Ordering::AcqRel);
        assert_eq!(lookup(&object, second).unwrap().addr, second + 1);
        let absent = (second + 1..).find(|&k| home(k) == at).unwrap();
        assert!(matches!(lookup(&object, absent), Err(DmaError::NoSuchKey)));
        slots[at].seq.fetch_add(1, Ordering::AcqRel);
    }
}
