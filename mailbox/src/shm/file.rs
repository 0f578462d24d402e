//! The system calls on one object's file in `/dev/shm`: opening it only
//! if it is ours, committing, populating and mapping its pages, and
//! telling holes from data.

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;

use super::{HEADER_SIZE, SHM_DIR};

pub(super) fn c_name(name: &str) -> io::Result<CString> {
    CString::new(format!("/{name}")).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

pub(super) struct Fd(pub(super) libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor; the mapping outlives it by design.
        unsafe { libc::close(self.0) };
    }
}

pub(super) fn not_ready() -> io::Error {
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// Opens object `name` if it is ours: a regular file of our effective uid
/// that no one else may access (mode 0600 or less). Anything else is
/// *foreign* (`EPERM`): another user's file under our name, or one made
/// accessible to others, which they could resize or write under us. glibc's
/// `shm_open` adds `O_NOFOLLOW`, so a symbolic link is refused too.
pub(super) fn open_existing(name: &str) -> io::Result<Fd> {
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
pub(super) fn is_foreign(name: &str) -> bool {
    matches!(open_existing(name), Err(e) if e.raw_os_error() == Some(libc::EPERM)
        || e.raw_os_error() == Some(libc::EACCES)
        || e.raw_os_error() == Some(libc::ELOOP))
}

/// Names `<name>-<16 hex digits>` in `/dev/shm`: the alternatives that
/// [`SharedObject::create_avoiding`] may have chosen for `name`.
pub(super) fn alternatives(name: &str) -> Vec<String> {
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
pub(super) fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into the buffer.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == bytes.len() as isize {
        return u64::from_ne_bytes(bytes);
    }
    // No entropy source: a value no other process shares, at least.
    crate::node::monotonic_ns() ^ (u64::from(std::process::id()) << 40)
}

/// Allocates the pages of `[offset, offset + len)` of the object behind
/// `fd` now: `ENOSPC` here, rather than SIGBUS at the first touch.
pub(super) fn commit(fd: libc::c_int, offset: usize, len: usize) -> io::Result<()> {
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
pub(super) fn populate(start: NonNull<u8>, len: usize) {
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
pub(super) fn is_data(fd: libc::c_int, st: &libc::stat, offset: usize, end: usize) -> bool {
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

pub(super) fn file_stat(fd: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid and st is a writable stat.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

pub(super) fn file_size(fd: libc::c_int) -> io::Result<usize> {
    usize::try_from(file_stat(fd)?.st_size).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

pub(super) fn map(
    fd: libc::c_int,
    offset: usize,
    len: usize,
    populate: bool,
) -> io::Result<NonNull<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::JobId;
    use crate::shm::object_name;

    /// The fast answer (blocks cover the size) and the exact one (a hole
    /// past the committed part) of `is_data`.
    #[test]
    fn committed_ranges_are_data_and_holes_are_not() {
        let name = object_name(
            JobId::from_name(&format!("shm-test-holes-{}", std::process::id())),
            "obj",
        );
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
}
