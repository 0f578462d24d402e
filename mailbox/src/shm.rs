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

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::node::{process_alive, process_start_time, JobId};

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

    /// Start time of the owner process, in clock ticks since boot.
    pub fn owner_start(&self) -> u64 {
        self.owner_start.load(Ordering::Relaxed)
    }

    /// The cheap half of [`Self::owner_gone`]: no system call.
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

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(format!("/{name}")).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

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

    pub fn header(&self) -> &ObjectHeader {
        // SAFETY: every object starts with a header page, and ObjectHeader
        // is atomics only, valid for any bit pattern.
        unsafe { &*(self.base.as_ptr() as *const ObjectHeader) }
    }

    /// Start of the object (its header).
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

/// A read-write mapping of part of another process's object: the emulated
/// route that a remote registration prepares.
pub struct SharedRange {
    base: NonNull<u8>,
    len: usize,
    guard: Option<crate::fault::Guard>,
}

// SAFETY: plain shared memory; concurrent access is the DMA user's contract.
unsafe impl Send for SharedRange {}
// SAFETY: as for Send.
unsafe impl Sync for SharedRange {}

impl SharedRange {
    /// Maps `len` bytes of object `name` (or of the alternative name its
    /// owner chose, see [`SharedObject::create_avoiding`]) from page-aligned
    /// `offset`, populating the page tables now so that transfers do not
    /// fault. The object must be ours, published, owned by `owner` (pid and
    /// start time), and hold the range whole and committed: a range past its
    /// end, or over pages its owner never committed, would fault (SIGBUS)
    /// when touched; it is refused with `InvalidData` instead.
    pub fn map(
        name: &str,
        owner: (u32, u64),
        offset: usize,
        len: usize,
    ) -> io::Result<SharedRange> {
        let end = offset
            .checked_add(len)
            .filter(|_| len > 0 && offset.is_multiple_of(HEADER_SIZE))
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let accept = |header: &ObjectHeader| {
            (header.owner_pid(), header.owner_start()) == owner && !header.is_closed()
        };
        let object = SharedObject::open_checked(name, accept)?;
        let fd = open_existing(&object.name)?;
        let st = file_stat(fd.0)?;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if end as u64 > size || end > object.len() || !is_data(fd.0, &st, offset, end) {
            static LAST: AtomicU64 = AtomicU64::new(0);
            rate_limited(&LAST, || {
                tracing::warn!(
                    object = name,
                    offset,
                    len,
                    size = object.len(),
                    "a peer's range lies outside its object or over memory it never \
                     committed: refused"
                )
            });
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        let base = map(fd.0, offset, len, true)?;
        Ok(SharedRange {
            base,
            len,
            guard: Some(crate::fault::register(base.as_ptr(), len, false)),
        })
    }

    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedRange {
    fn drop(&mut self) {
        self.guard.take();
        // SAFETY: base/len describe a mapping we made and nobody else unmaps.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor; the mapping outlives it by design.
        unsafe { libc::close(self.0) };
    }
}

fn not_ready() -> io::Error {
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// Opens object `name` if it is ours: a regular file of our effective uid
/// that no one else may access (mode 0600 or less). Anything else is
/// *foreign* (`EPERM`): another user's file under our name, or one made
/// accessible to others, which they could resize or write under us. glibc's
/// `shm_open` adds `O_NOFOLLOW`, so a symbolic link is refused too.
fn open_existing(name: &str) -> io::Result<Fd> {
    let cname = c_name(name)?;
    // SAFETY: cname is a valid C string. O_NONBLOCK: a FIFO under our name
    // must not block us (it is refused below).
    let fd = unsafe {
        libc::shm_open(
            cname.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = Fd(fd);
    let st = file_stat(fd.0)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != euid || st.st_mode & 0o077 != 0 {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(fd)
}

/// Whether `name` exists and is not ours (see [`open_existing`]).
fn is_foreign(name: &str) -> bool {
    matches!(open_existing(name), Err(e) if e.raw_os_error() == Some(libc::EPERM)
        || e.raw_os_error() == Some(libc::EACCES)
        || e.raw_os_error() == Some(libc::ELOOP))
}

/// Names `<name>-<16 hex digits>` in `/dev/shm`: the alternatives that
/// [`SharedObject::create_avoiding`] may have chosen for `name`.
fn alternatives(name: &str) -> Vec<String> {
    let prefix = format!("{name}-");
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|entry| {
            entry
                .strip_prefix(&prefix)
                .is_some_and(|tail| tail.len() == 16 && tail.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .collect()
}

/// 64 unpredictable bits (for names others must not guess).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into the buffer.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == bytes.len() as isize {
        return u64::from_ne_bytes(bytes);
    }
    // No entropy source: a value no other process shares, at least.
    crate::node::monotonic_ns() ^ (u64::from(std::process::id()) << 40)
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

/// Allocates the pages of `[offset, offset + len)` of the object behind
/// `fd` now: `ENOSPC` here, rather than SIGBUS at the first touch.
fn commit(fd: libc::c_int, offset: usize, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: a plain system call on a descriptor we hold.
    let rc = unsafe { libc::posix_fallocate(fd, offset as libc::off_t, len as libc::off_t) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Writes the page tables of `len` committed bytes at `start` now (and
/// makes the pages data, which `SEEK_HOLE` tells peers): first touches then
/// do not fault. Best effort: without it, they fault in on first use.
fn populate(start: NonNull<u8>, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: the range lies in a mapping of ours, of committed pages.
    let rc = unsafe { libc::madvise(start.as_ptr().cast(), len, MADV_POPULATE_WRITE) };
    if rc != 0 {
        // Older kernels: touch one byte per page ourselves.
        let page = HEADER_SIZE;
        let mut at = 0;
        while at < len {
            // SAFETY: `at < len`: inside the committed range of our mapping;
            // the volatile read-write keeps every byte as it is.
            unsafe {
                let p = start.as_ptr().add(at);
                std::ptr::write_volatile(p, std::ptr::read_volatile(p));
            }
            at += page;
        }
    }
}

/// Whether `[offset, end)` of the object behind `fd` has no hole: every page
/// of it committed (the whole object allocated), or written by its owner
/// (see [`populate`]; tmpfs reports committed pages not yet written as a
/// hole), so that touching it allocates nothing and cannot fault.
/// `st` is the object's `fstat`, which the caller has already read.
fn is_data(fd: libc::c_int, st: &libc::stat, offset: usize, end: usize) -> bool {
    // An object with as many blocks as bytes has no hole at all: no system
    // call. SEEK_HOLE is the exact test, but tmpfs walks every page from
    // `offset` to the first hole, the end of a fully committed object: a
    // peer that registers a multi-GiB buffer fragment by fragment paid a
    // scan of it for each (a 2 GiB one-copy rendezvous took minutes).
    if st.st_size >= 0 && (st.st_blocks as u64).saturating_mul(512) >= st.st_size as u64 {
        return true;
    }
    // SAFETY: a plain system call on a descriptor we hold.
    let hole = unsafe { libc::lseek(fd, offset as libc::off_t, libc::SEEK_HOLE) };
    hole >= 0 && hole as u64 >= end as u64
}

fn file_stat(fd: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid and st is a writable stat.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn file_size(fd: libc::c_int) -> io::Result<usize> {
    usize::try_from(file_stat(fd)?.st_size).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

fn map(fd: libc::c_int, offset: usize, len: usize, populate: bool) -> io::Result<NonNull<u8>> {
    let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel
    // checks offset and length.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset as libc::off_t,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// What [`owner_state`] found out about an object.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OwnerState {
    /// Owned by this live process.
    Mine,
    /// Ours and closed: a thread of ours is about to unlink it.
    Closing,
    /// Owned by another live process (closed or not: a live owner unlinks
    /// what it closes).
    Alive,
    Dead,
    /// Never initialised, and too old for its creator to still be at it.
    Abandoned,
    Unknown,
}

fn owner_state(name: &str) -> OwnerState {
    let Ok(fd) = open_existing(name) else {
        return OwnerState::Unknown;
    };
    let Ok(st) = file_stat(fd.0) else {
        return OwnerState::Unknown;
    };
    let young = {
        // SAFETY: time(NULL) has no preconditions.
        let now = unsafe { libc::time(std::ptr::null_mut()) };
        now - st.st_mtime < UNINITIALISED_GRACE_SECS
    };
    let not_initialised = if young {
        OwnerState::Unknown
    } else {
        OwnerState::Abandoned
    };
    if (st.st_size as usize) < std::mem::size_of::<ObjectHeader>() {
        return not_initialised;
    }
    let len = HEADER_SIZE.min(st.st_size as usize);
    let Ok(base) = map(fd.0, 0, len, false) else {
        return OwnerState::Unknown;
    };
    // SAFETY: the mapping covers an ObjectHeader; atomics are valid for any bits.
    let header = unsafe { &*(base.as_ptr() as *const ObjectHeader) };
    let pid = header.owner_pid();
    let start = header.owner_start.load(Ordering::Relaxed);
    // A closed object of a live owner is not dead: its owner sets the flag
    // and then unlinks the name, and may make an object under the same name
    // as soon as it is gone. Taken for dead, it was unlinked by whoever
    // looked first, and the owner's own unlink then removed the name from
    // its new object (a key table dropped by one thread while another made
    // the next one: peers found no table, and their RMA FI_EKEYREJECTED).
    let state = if pid == 0 {
        not_initialised
    } else if !process_alive(pid, start) {
        OwnerState::Dead
    } else if pid != std::process::id() {
        OwnerState::Alive
    } else if header.is_closed() {
        OwnerState::Closing
    } else {
        OwnerState::Mine
    };
    // SAFETY: unmapping the header mapping made just above.
    unsafe { libc::munmap(base.as_ptr().cast(), len) };
    state
}

fn unlink(name: &str) -> bool {
    let Ok(cname) = c_name(name) else {
        return false;
    };
    // SAFETY: cname is a valid C string.
    unsafe { libc::shm_unlink(cname.as_ptr()) == 0 }
}

/// Unlinks object `name` if its owner is dead (`state`, its
/// [`owner_state`] just read). Returns whether it did.
fn reclaim_if_dead(name: &str, state: OwnerState) -> bool {
    match state {
        OwnerState::Dead | OwnerState::Abandoned => {
            let unlinked = unlink(name);
            if unlinked {
                tracing::info!(object = name, "reclaimed shared object of a dead process");
            }
            unlinked
        }
        OwnerState::Mine | OwnerState::Closing | OwnerState::Alive | OwnerState::Unknown => false,
    }
}

/// An object of this process that nothing in it maps: it was made before
/// the process called exec, which unmapped it. A launcher or profiler that
/// allocates between its fork and its exec (`perf record`, `valgrind`)
/// gives the program it starts its own pid, and so the names that program
/// is about to create. Nothing else can hold our pid while we live.
/// `state`: its [`owner_state`], just read.
fn reclaim_if_left_before_exec(name: &str, state: OwnerState) -> bool {
    if !matches!(state, OwnerState::Mine | OwnerState::Closing) || mapped_here(name) {
        return false;
    }
    let unlinked = unlink(name);
    if unlinked {
        tracing::info!(
            object = name,
            "reclaimed a shared object this process made before it called exec"
        );
    }
    unlinked
}

/// Whether this process maps object `name` (when in doubt: yes).
fn mapped_here(name: &str) -> bool {
    let path = format!("{SHM_DIR}/{name}");
    let unlinked = format!("{path} (deleted)");
    std::fs::read_to_string("/proc/self/maps").map_or(true, |maps| {
        maps.lines()
            .map(str::trim_end)
            .any(|line| line.ends_with(&path) || line.ends_with(&unlinked))
    })
}

/// This user's object names in `/dev/shm`, whatever the job.
fn user_objects() -> Vec<String> {
    let prefix = user_prefix();
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

/// Removes every object of this user whose owner process is dead, in every
/// job. Returns how many were removed. Cheap enough to run at start-up.
pub fn reclaim_dead_objects() -> usize {
    user_objects()
        .iter()
        .filter(|name| reclaim_if_dead(name, owner_state(name)))
        .count()
}

/// Unlinks every object this process owns, for a process that exits
/// without closing them (an application that never calls `fi_close`).
/// Mappings stay valid until exit; peers see the objects gone.
pub fn remove_own_objects() -> usize {
    user_objects()
        .iter()
        .filter(|name| {
            matches!(owner_state(name), OwnerState::Mine | OwnerState::Closing) && unlink(name)
        })
        .count()
}

/// Names of this user's objects in `job` currently in `/dev/shm` (for tests
/// and diagnostics).
pub fn list_objects(job: Option<JobId>) -> Vec<String> {
    let prefix = job.map(|job| object_name(job, ""));
    let mut names: Vec<String> = user_objects()
        .into_iter()
        .filter(|name| prefix.as_ref().is_none_or(|p| name.starts_with(p)))
        .collect();
    names.sort();
    names
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

    /// The fast answer (blocks cover the size) and the exact one (a hole
    /// past the committed part) of `is_data`.
    #[test]
    fn committed_ranges_are_data_and_holes_are_not() {
        let name = object_name(test_job("holes"), "obj");
        let c = CString::new(format!("/{name}")).unwrap();
        // SAFETY: shm_open of a valid C string; the descriptor is closed by Fd.
        let fd = Fd(unsafe {
            libc::shm_open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
        });
        assert!(fd.0 >= 0);
        let len = 64 * HEADER_SIZE;
        commit(fd.0, 0, len).unwrap();
        // Committed: every page allocated, none can fault.
        assert!(is_data(fd.0, &file_stat(fd.0).unwrap(), 0, len));
        assert!(is_data(
            fd.0,
            &file_stat(fd.0).unwrap(),
            32 * HEADER_SIZE,
            len
        ));
        // Written, as owners do: tmpfs then also reports no hole.
        let page = vec![1u8; HEADER_SIZE];
        for at in (0..len).step_by(HEADER_SIZE) {
            // SAFETY: pwrite of a buffer we own to a descriptor we hold.
            let n =
                unsafe { libc::pwrite(fd.0, page.as_ptr().cast(), page.len(), at as libc::off_t) };
            assert_eq!(n, HEADER_SIZE as isize);
        }
        // Grown without committing: the new part is a hole.
        // SAFETY: a plain system call on a descriptor we hold.
        let rc = unsafe { libc::ftruncate(fd.0, (2 * len) as libc::off_t) };
        assert_eq!(rc, 0);
        assert!(is_data(fd.0, &file_stat(fd.0).unwrap(), 0, len));
        assert!(!is_data(
            fd.0,
            &file_stat(fd.0).unwrap(),
            0,
            len + HEADER_SIZE
        ));
        assert!(!is_data(fd.0, &file_stat(fd.0).unwrap(), len, 2 * len));
        // SAFETY: shm_unlink of a valid C string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
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
