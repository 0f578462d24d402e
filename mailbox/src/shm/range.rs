//! A mapping of part of another process's object: what a remote
//! registration maps.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::file::{file_stat, is_data, map, open_existing};
use super::{rate_limited, ObjectHeader, SharedObject, HEADER_SIZE};

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
}

impl Drop for SharedRange {
    fn drop(&mut self) {
        self.guard.take();
        // SAFETY: base/len describe a mapping we made and nobody else unmaps.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
