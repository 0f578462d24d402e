//! Named shared-memory objects: the emulated hardware's memory.
//!
//! Every object lives in `/dev/shm` under a name that carries the user and
//! the job (`unimem-<uid>-<job>-...`), starts with an [`ObjectHeader`] naming
//! its owner process, is removed by its owner on close, and is reclaimed by
//! any later process of the same user once its owner is dead.
//!
//! Peers are untrusted, and so is `/dev/shm`:
//! - memory is *committed* with `posix_fallocate` when an object is made
//!   (or, for a sparse object, when a range of it is put to use), so a full
//!   `/dev/shm` is an `ENOSPC` error at that moment, never a SIGBUS later;
//! - an object is opened only if it is a regular file of our effective uid
//!   with no access for group or others ([`open_existing`]): another user's
//!   file under one of our names is *foreign*, never mapped, reclaimed or
//!   trusted; a creator that finds its name squatted by one uses an
//!   unpredictable alternative (`<name>-<random>`, [`SharedObject::create_avoiding`])
//!   that openers find by listing `/dev/shm` ([`SharedObject::open_checked`]);
//! - sizes are checked with `fstat` before anything is mapped, and the size
//!   an object's header announces must be its real size.
//!
//! Here: the header, the names, and [`SharedObject`] (making, opening and
//! closing an object). `file.rs` holds the system calls on an object's
//! file, `range.rs` the mapping of part of a peer's object
//! ([`SharedRange`]), `reclaim.rs` who owns an object and the removal of
//! those whose owner is gone.

mod file;
mod range;
mod reclaim;

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::node::{process_alive, process_exists, process_start_time, JobId};

use file::{
    alternatives, c_name, commit, file_size, is_foreign, map, not_ready, open_existing, populate,
    random_u64, Fd,
};
pub use range::SharedRange;
pub use reclaim::{list_objects, reclaim_dead_objects, remove_own_objects};
use reclaim::{owner_state, reclaim_if_dead, reclaim_if_left_before_exec, OwnerState};

/// Size of the header page at the start of every object.
pub const HEADER_SIZE: usize = 4096;

const MAGIC: u64 = 0x554e_494d_454d_0001; // "UNIMEM" + layout version 1
const SHM_DIR: &str = "/dev/shm";
/// An object whose header was never completed is reclaimed after this long:
/// its creator crashed between creating and initialising it.
const UNINITIALISED_GRACE_SECS: i64 = 30;
/// Longest wait for another thread of ours to unlink a name it closed.
const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The first bytes of every shared object.
#[repr(C)]
pub struct ObjectHeader {
    /// [`MAGIC`] once the object is fully initialised (stored last, Release).
    magic: AtomicU64,
    /// Stored after `owner_start` (Release): whoever sees the pid sees the
    /// start time that goes with it.
    owner_pid: AtomicU32,
    /// Set by the owner when it closes the object: peers treat it as dead.
    closed: AtomicU32,
    owner_start: AtomicU64,
    /// Size of the object in bytes, header included.
    size: AtomicU64,
}

impl ObjectHeader {
    pub fn owner_pid(&self) -> u32 {
        self.owner_pid.load(Ordering::Acquire)
    }

    /// Whether the owner closed the object or died.
    pub fn owner_gone(&self) -> bool {
        self.closed.load(Ordering::Acquire) != 0
            || !process_alive(self.owner_pid(), self.owner_start.load(Ordering::Relaxed))
    }

    /// [`Self::owner_gone`] at a fraction of its cost: one `kill(pid, 0)`
    /// (about 0.4 us here) instead of reading the process's start time
    /// from /proc (about 6 us, more when cold), which is what tells a pid
    /// reused by another process: callers that check often do the whole
    /// check now and then.
    pub fn owner_gone_quick(&self) -> bool {
        self.closed.load(Ordering::Acquire) != 0 || !process_exists(self.owner_pid())
    }

    /// Start time of the owner process, in clock ticks since boot.
    pub fn owner_start(&self) -> u64 {
        self.owner_start.load(Ordering::Relaxed)
    }

    /// The cheap half of [`Self::owner_gone`]: no system call.
    #[inline]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) != 0
    }
}

/// Prefix of the names of every object of this user.
fn user_prefix() -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    format!("unimem-{uid}-")
}

/// The name of an object of `job`, e.g. `unimem-1000-8a3f10c2-4242-mbx0`.
pub fn object_name(job: JobId, tail: &str) -> String {
    format!("{}{job}-{tail}", user_prefix())
}

/// A mapping of a named shared-memory object.
pub struct SharedObject {
    base: NonNull<u8>,
    len: usize,
    name: String,
    owner: bool,
    /// Kept for a sparse object, which commits more of itself later.
    fd: Option<Fd>,
    /// Its protection from SIGBUS (see `fault.rs`), dropped before the unmap.
    guard: Option<crate::fault::Guard>,
    /// Our own object's entry among those a fatal signal unlinks (see
    /// `crash.rs`).
    _owned: Option<crate::crash::Owned>,
}

const _: () = assert!(std::mem::offset_of!(ObjectHeader, closed) == crate::fault::CLOSED_OFFSET);

// SAFETY: the mapping is process-wide memory; all shared state inside it is
// accessed through atomics or by protocols documented where they are used.
unsafe impl Send for SharedObject {}
// SAFETY: as for Send; `&SharedObject` hands out only raw pointers.
unsafe impl Sync for SharedObject {}

impl SharedObject {
    /// Creates object `name` of `len` bytes (header included), owned by this
    /// process, all of it committed. Fails with `AlreadyExists` if the name
    /// is taken by a live owner or by a foreign object; a dead owner's object
    /// of the same name is reclaimed first.
    pub fn create(name: &str, len: usize) -> io::Result<SharedObject> {
        Self::create_in(name, len, len)
    }

    /// [`Self::create`], committing only the first `committed` bytes (at
    /// least the header page): the rest is committed by [`Self::commit`] as
    /// it is put to use, and must not be touched before.
    pub fn create_sparse(name: &str, len: usize, committed: usize) -> io::Result<SharedObject> {
        Self::create_in(name, len, committed)
    }

    /// [`Self::create_sparse`] for an object that peers find with
    /// [`Self::open_checked`]: if `name` is held by a foreign object (not
    /// ours, see [`open_existing`]), the object is made under an
    /// unpredictable alternative name instead (`<name>-<random>`), with one
    /// warning. [`Self::name`] tells which.
    pub fn create_avoiding(name: &str, len: usize, committed: usize) -> io::Result<SharedObject> {
        match Self::create_in(name, len, committed) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && is_foreign(name) => {
                tracing::warn!(
                    object = name,
                    "a foreign object (another user's, or not a private regular file) holds \
                     this name: refused; using an unpredictable name instead"
                );
                for _ in 0..16 {
                    let alternative = format!("{name}-{:016x}", random_u64());
                    match Self::create_in(&alternative, len, committed) {
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                        other => return other,
                    }
                }
                Err(io::Error::from(io::ErrorKind::AlreadyExists))
            }
            other => other,
        }
    }

    fn create_in(name: &str, len: usize, committed: usize) -> io::Result<SharedObject> {
        if len < HEADER_SIZE || committed < HEADER_SIZE || committed > len {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let cname = c_name(name)?;
        let mut closing_since = None;
        let fd = loop {
            // SAFETY: cname is a valid C string; flags and mode are plain ints.
            let fd = unsafe {
                libc::shm_open(
                    cname.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                break fd;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::AlreadyExists {
                return Err(err);
            }
            let state = owner_state(name);
            if state == OwnerState::Closing {
                // Another thread of ours is between closing the object and
                // unlinking it: the name is free in a moment. (Still taken
                // after the wait, it was closed by the image before exec.)
                let since = *closing_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() < CLOSING_WAIT {
                    std::thread::yield_now();
                    continue;
                }
            }
            if reclaim_if_dead(name, state) || reclaim_if_left_before_exec(name, state) {
                continue;
            }
            return Err(err);
        };
        let object = Self::map_new(Fd(fd), name, len, committed);
        if object.is_err() {
            // SAFETY: cname is valid; we created the name and failed to set it up.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
        object
    }

    fn map_new(fd: Fd, name: &str, len: usize, committed: usize) -> io::Result<SharedObject> {
        // SAFETY: fd is a valid descriptor we own.
        if unsafe { libc::ftruncate(fd.0, len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        commit(fd.0, 0, committed).inspect_err(|e| {
            tracing::warn!(
                object = name,
                bytes = committed,
                "cannot commit shared memory in /dev/shm: {e}"
            )
        })?;
        let sparse = committed < len;
        let base = map(fd.0, 0, len, false)?;
        // The committed part is populated now, the rest as it is committed.
        populate(base, committed);
        let object = SharedObject {
            base,
            len,
            name: name.to_string(),
            owner: true,
            fd: sparse.then_some(fd),
            guard: Some(crate::fault::register(base.as_ptr(), len, true)),
            _owned: Some(crate::crash::own(&format!("{SHM_DIR}/{name}"))),
        };
        let pid = std::process::id();
        let header = object.header();
        header.size.store(len as u64, Ordering::Relaxed);
        header
            .owner_start
            .store(process_start_time(pid).unwrap_or(0), Ordering::Relaxed);
        // Last: another process's reclaim pass that reads a pid must also
        // read its start time, or it would take a live owner for dead.
        header.owner_pid.store(pid, Ordering::Release);
        Ok(object)
    }

    /// Commits `[offset, offset + len)` of a sparse object of ours (see
    /// [`Self::create_sparse`]): allocates its pages in `/dev/shm` now, or
    /// fails (`ENOSPC` when `/dev/shm` is full), and writes them so that
    /// peers see them as data (`SEEK_HOLE`, see [`SharedRange::map`]).
    pub fn commit(&self, offset: usize, len: usize) -> io::Result<()> {
        let Some(fd) = &self.fd else {
            return Ok(()); // committed whole at creation
        };
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        commit(fd.0, offset, len)?;
        // SAFETY: `[offset, end)` lies inside our mapping (checked above).
        let start = unsafe { NonNull::new_unchecked(self.base.as_ptr().add(offset)) };
        populate(start, end - offset);
        Ok(())
    }

    /// Marks a created object ready: openers wait for this (see [`Self::open`]).
    /// Call once the object-specific layout is initialised.
    pub fn publish(&self) {
        self.header().magic.store(MAGIC, Ordering::Release);
    }

    /// Opens the existing, published object `name` whole.
    pub fn open(name: &str) -> io::Result<SharedObject> {
        let fd = open_existing(name)?;
        Self::open_fd(fd, name)
    }

    /// Opens the published object of `name` (or of an alternative name
    /// that [`Self::create_avoiding`] chose) whose header `accept`s: the
    /// first of ours that does. Errors are those of `name` itself.
    pub fn open_checked(
        name: &str,
        accept: impl Fn(&ObjectHeader) -> bool,
    ) -> io::Result<SharedObject> {
        let first = match Self::open(name) {
            Ok(object) if accept(object.header()) => return Ok(object),
            Ok(_) => Err(io::Error::from_raw_os_error(libc::ESTALE)),
            Err(e) => Err(e),
        };
        // The plain name is missing, foreign or another incarnation's: the
        // owner may have made its object under an alternative name.
        for alternative in alternatives(name) {
            if let Ok(object) = Self::open(&alternative) {
                if accept(object.header()) {
                    return Ok(object);
                }
            }
        }
        first
    }

    fn open_fd(fd: Fd, name: &str) -> io::Result<SharedObject> {
        let size = file_size(fd.0)?;
        if size < HEADER_SIZE {
            return Err(not_ready());
        }
        let base = map(fd.0, 0, size, false)?;
        let object = SharedObject {
            base,
            len: size,
            name: name.to_string(),
            owner: false,
            fd: None,
            guard: Some(crate::fault::register(base.as_ptr(), size, true)),
            _owned: None,
        };
        if object.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(not_ready());
        }
        // The size the owner wrote must be the real one: anything else is a
        // corrupted header or an object resized under us.
        if object.header().size.load(Ordering::Relaxed) != size as u64 {
            static LAST: AtomicU64 = AtomicU64::new(0);
            rate_limited(&LAST, || {
                tracing::warn!(
                    object = name,
                    real = size,
                    announced = object.header().size.load(Ordering::Relaxed),
                    "shared object's size differs from its header's: refused"
                )
            });
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        if object.header().owner_gone() {
            return Err(io::Error::from_raw_os_error(libc::ECONNREFUSED));
        }
        Ok(object)
    }

    #[inline]
    pub fn header(&self) -> &ObjectHeader {
        // SAFETY: every object starts with a header page, and ObjectHeader
        // is atomics only, valid for any bit pattern.
        unsafe { &*(self.base.as_ptr() as *const ObjectHeader) }
    }

    /// Start of the object (its header).
    #[inline]
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for SharedObject {
    fn drop(&mut self) {
        if self.owner {
            self.header().closed.store(1, Ordering::Release);
            if let Ok(cname) = c_name(&self.name) {
                // SAFETY: cname is a valid C string naming our own object.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
            }
        }
        self.guard.take();
        // SAFETY: base/len describe a mapping we made and nobody else unmaps.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Calls `warn` unless a warning went out through `last` (a monotonic time
/// in ns) less than a second ago: for warnings a peer can provoke at will.
pub fn rate_limited(last: &AtomicU64, warn: impl FnOnce()) {
    let now = crate::node::monotonic_ns();
    let before = last.load(Ordering::Relaxed);
    if (before == 0 || now.saturating_sub(before) >= 1_000_000_000)
        && last
            .compare_exchange(before, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        warn();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_job(tag: &str) -> JobId {
        JobId::from_name(&format!("shm-test-{tag}-{}", std::process::id()))
    }

    /// A thread that makes an object under a name another thread of the
    /// process has closed but not yet unlinked waits for the name; the
    /// other's unlink then leaves the new object alone. (Taken for dead,
    /// the closed object was unlinked at once, and the new one lost its
    /// name to the closing thread's unlink: peers could not open it.)
    #[test]
    fn a_name_being_closed_by_another_thread_is_made_again_after_its_unlink() {
        let job = test_job("closing");
        let name = object_name(job, "obj");
        let len = 2 * HEADER_SIZE;
        let old = SharedObject::create_avoiding(&name, len, len).unwrap();
        old.publish();
        // The closing thread's first step: the flag, before the unlink.
        old.header().closed.store(1, Ordering::Release);
        let maker = {
            let name = name.clone();
            std::thread::spawn(move || {
                let new = SharedObject::create_avoiding(&name, len, len).unwrap();
                new.publish();
                new
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!maker.is_finished(), "made while the name was still taken");
        drop(old);
        let new = maker.join().unwrap();
        let found = SharedObject::open(&name).expect("the new object keeps its name");
        assert!(!found.header().is_closed());
        drop(found);
        drop(new);
        assert!(list_objects(Some(job)).is_empty());
    }

    #[test]
    fn create_open_close_unlinks() {
        let job = test_job("lifecycle");
        let name = object_name(job, "obj");
        let owner = SharedObject::create(&name, 2 * HEADER_SIZE).unwrap();
        // Not published yet: openers must not see a half-built object.
        assert_eq!(
            SharedObject::open(&name).err().unwrap().raw_os_error(),
            Some(libc::EAGAIN)
        );
        owner.publish();
        let peer = SharedObject::open(&name).unwrap();
        assert_eq!(peer.len(), 2 * HEADER_SIZE);
        assert_eq!(peer.header().owner_pid(), std::process::id());
        // SAFETY: both map the same object; offset HEADER_SIZE is in bounds.
        unsafe {
            *owner.base().add(HEADER_SIZE) = 0x5a;
            assert_eq!(*peer.base().add(HEADER_SIZE), 0x5a);
        }
        assert!(list_objects(Some(job)).contains(&name));
        drop(owner);
        assert!(peer.header().is_closed());
        assert!(list_objects(Some(job)).is_empty());
    }

    #[test]
    fn name_taken_by_live_owner() {
        let name = object_name(test_job("taken"), "obj");
        let first = SharedObject::create(&name, HEADER_SIZE).unwrap();
        first.publish();
        let err = SharedObject::create(&name, HEADER_SIZE).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn open_missing_fails() {
        let name = object_name(test_job("missing"), "obj");
        let err = SharedObject::open(&name).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
