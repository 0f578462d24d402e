//! Copies between user iovs and contiguous buffers: the only place the
//! protocol touches application memory.
//!
//! libfabric's contract makes this sound: buffers handed to a send or a
//! receive stay valid, and are not otherwise accessed, until the operation
//! completes. The protocol only keeps iovs of operations in flight.

/// One piece of user memory: address and length.
pub type Iov = (usize, usize);

#[inline]
pub fn total_len(iov: &[Iov]) -> usize {
    match *iov {
        [(_, len)] => len,
        _ => iov.iter().map(|&(_, len)| len).sum(),
    }
}

/// Pieces of `iov` covering the `len` bytes that start `offset` bytes in,
/// as (address, length, position in that range).
fn pieces(
    iov: &[Iov],
    mut offset: usize,
    len: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let mut done = 0;
    iov.iter().filter_map(move |&(addr, piece)| {
        if done == len {
            return None;
        }
        if offset >= piece {
            offset -= piece;
            return None;
        }
        let take = (piece - offset).min(len - done);
        let out = (addr + offset, take, done);
        offset = 0;
        done += take;
        Some(out)
    })
}

/// Where the `len` bytes `offset` bytes in start, when `iov` is one piece
/// that holds them all (every small message): one copy, no walk.
fn one_piece(iov: &[Iov], offset: usize, len: usize) -> Option<usize> {
    match *iov {
        [(addr, piece)] if offset <= piece && len <= piece - offset => Some(addr + offset),
        _ => None,
    }
}

/// Copies `len` bytes of `iov`, from `offset` on, to `dst`.
///
/// # Safety
/// The iov must describe readable memory (the libfabric contract above) and
/// `dst` must be writable for `len` bytes, not overlapping the iov.
#[inline]
pub unsafe fn gather(iov: &[Iov], offset: usize, dst: *mut u8, len: usize) {
    if let Some(at) = one_piece(iov, offset, len) {
        // SAFETY: in bounds of both sides by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, dst, len) };
        return;
    }
    // SAFETY: as above.
    unsafe { gather_pieces(iov, offset, dst, len) }
}

/// [`gather`] from several pieces: out of line, so that the one-piece copy
/// of every small send inlines where it is made.
///
/// # Safety
/// As [`gather`].
#[inline(never)]
unsafe fn gather_pieces(iov: &[Iov], offset: usize, dst: *mut u8, len: usize) {
    for (addr, take, at) in pieces(iov, offset, len) {
        // SAFETY: in bounds of both sides by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.add(at), take) };
    }
}

/// Copies `len` bytes from `src` into `iov`, from `offset` on.
///
/// # Safety
/// The iov must describe writable memory (the libfabric contract above) and
/// `src` must be readable for `len` bytes, not overlapping the iov.
#[inline(always)]
pub unsafe fn scatter(iov: &[Iov], offset: usize, src: *const u8, len: usize) {
    if let Some(at) = one_piece(iov, offset, len) {
        // SAFETY: in bounds of both sides by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, at as *mut u8, len) };
        return;
    }
    // SAFETY: as above.
    unsafe { scatter_pieces(iov, offset, src, len) }
}

/// [`scatter`] into several pieces: out of line, so that the one-piece
/// copy of every small receive inlines where it is made.
///
/// # Safety
/// As [`scatter`].
#[inline(never)]
unsafe fn scatter_pieces(iov: &[Iov], offset: usize, src: *const u8, len: usize) {
    for (addr, take, at) in pieces(iov, offset, len) {
        // SAFETY: in bounds of both sides by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), addr as *mut u8, take) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_scatter_across_pieces() {
        let a = *b"abcdef";
        let b = *b"ghij";
        let c = *b"klmnop";
        let iov = [
            (a.as_ptr() as usize, a.len()),
            (b.as_ptr() as usize, b.len()),
            (c.as_ptr() as usize, c.len()),
        ];
        assert_eq!(total_len(&iov), 16);
        for offset in 0..16 {
            for len in 0..=16 - offset {
                let mut out = vec![0u8; len];
                // SAFETY: the iov points at the arrays above; out has len bytes.
                unsafe { gather(&iov, offset, out.as_mut_ptr(), len) };
                assert_eq!(&out[..], &b"abcdefghijklmnop"[offset..offset + len]);
            }
        }
        let mut x = [0u8; 3];
        let mut y = [0u8; 5];
        let iov = [(x.as_mut_ptr() as usize, 3), (y.as_mut_ptr() as usize, 5)];
        // SAFETY: the iov points at x and y; the source has 6 bytes.
        unsafe { scatter(&iov, 1, b"123456".as_ptr(), 6) };
        assert_eq!((&x, &y), (&[0, b'1', b'2'], &[b'3', b'4', b'5', b'6', 0]));
    }
}
