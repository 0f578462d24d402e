//! What every post of the data path shares (sends and receives, RMA,
//! atomics): reading the buffers a call names, running the operation on
//! the messenger, and refusing a post with a warning. Refusals warn at a
//! rate limit per entry point (`PostWarnings`, inner.rs):
//! an application that retries a failing call in a loop must not flood
//! the log.

use std::fmt;
use std::os::raw::c_void;

use super::inner::{EpInner, EpMessenger};
use crate::base::ffi::{self, Error};
use unimem_proto::matching::{Iov, IovList};
use unimem_proto::PostError;

/// Send-side op_flags that mean nothing to RMA and atomics (MPI sets them
/// as the endpoint's defaults for its sends): left out of their checks.
pub(super) const SEND_ONLY_FLAGS: u64 =
    ffi::FI_MATCH_COMPLETE | ffi::FI_MSG | ffi::FI_TAGGED | ffi::FI_SEND;

impl EpInner {
    /// Runs `post` (one operation of call `op`) on the messenger, then
    /// reports what it finished at once; its refusal as libfabric's error.
    #[inline(always)]
    pub(super) fn post(
        &self,
        op: &str,
        post: impl FnOnce(&mut EpMessenger) -> Result<(), PostError>,
    ) -> Result<(), Error> {
        let mut messenger = self.enter();
        let result = post(&mut messenger);
        // Most posts finish nothing at once: drain's look is inline.
        self.drain(&mut messenger);
        result.map_err(|e| map_post_error(self, e, op))
    }
}

pub(super) fn map_post_error(ep: &EpInner, e: PostError, op: &str) -> Error {
    let code = match e {
        PostError::Again => return Error::EAGAIN,
        PostError::TooLong => Error::EMSGSIZE,
        PostError::BadAddress => Error::EINVAL,
        PostError::Unreachable => Error::EHOSTUNREACH,
        PostError::NoMemory => Error::ENOMEM,
        PostError::Unsupported => Error::EOPNOTSUPP,
        PostError::TooShort => Error::EINVAL,
    };
    ep.refuse(op, code, format_args!("{op}: {e:?}"))
}

impl EpInner {
    /// Refuses a post of call `op` with libfabric's error `code`, warning
    /// `why` (rate-limited).
    #[cold]
    pub(super) fn refuse(&self, op: &str, code: Error, why: fmt::Arguments<'_>) -> Error {
        self.post_warnings.warn(op, why);
        code
    }
}

/// The buffers a call names (sends, receives and RMA alike).
#[derive(Clone, Copy)]
pub(super) enum Bufs {
    /// `buf, len`.
    One(*const c_void, usize),
    /// `iov, count` (the `v` and `msg` calls).
    Iov(*const ffi::iovec, usize),
}

impl Bufs {
    /// The buffers as (address, length) pairs, or the error to return.
    ///
    /// # Safety
    /// An iov array must hold its count of iovecs (libfabric's contract).
    #[inline(always)]
    pub(super) unsafe fn read(self, ep: &EpInner, op: &str) -> Result<IovList, Error> {
        match self {
            Bufs::One(buf, len) => {
                if buf.is_null() && len > 0 {
                    let why = format_args!("{op}: NULL buffer of {len} bytes");
                    return Err(ep.refuse(op, Error::EINVAL, why));
                }
                Ok(IovList::One((buf as usize, len)))
            }
            // SAFETY: iov holds count iovecs (caller).
            Bufs::Iov(iov, count) => unsafe { iovs(ep, op, iov, count) },
        }
    }
}

/// The iov array of a call, as (address, length) pairs.
///
/// # Safety
/// `iov` must be NULL (with `count` 0) or point to `count` iovecs.
unsafe fn iovs(
    ep: &EpInner,
    op: &str,
    iov: *const ffi::iovec,
    count: usize,
) -> Result<IovList, Error> {
    if count > ep.iov_limit {
        let why = format_args!("{op}: {count} iovs exceed the limit of {}", ep.iov_limit);
        return Err(ep.refuse(op, Error::EINVAL, why));
    }
    if count > 0 && iov.is_null() {
        return Err(ep.refuse(op, Error::EINVAL, format_args!("{op}: NULL iov")));
    }
    if count == 0 {
        return Ok(IovList::Many(Vec::new()));
    }
    // SAFETY: iov points to count iovecs (caller).
    let slice = unsafe { std::slice::from_raw_parts(iov, count) };
    // Lengths are added up all along the protocol: their sum must fit.
    let mut total = 0usize;
    for v in slice {
        if v.iov_base.is_null() && v.iov_len > 0 {
            let why = format_args!("{op}: NULL iov_base of {} bytes", v.iov_len);
            return Err(ep.refuse(op, Error::EINVAL, why));
        }
        let Some(sum) = total.checked_add(v.iov_len) else {
            let why = format_args!("{op}: iov lengths add up past SIZE_MAX");
            return Err(ep.refuse(op, Error::EINVAL, why));
        };
        total = sum;
    }
    if let [v] = slice {
        // What collecting one piece would give, without the Vec.
        return Ok(IovList::One((v.iov_base as usize, v.iov_len)));
    }
    Ok(slice
        .iter()
        .map(|v| (v.iov_base as usize, v.iov_len))
        .collect::<Vec<Iov>>()
        .into())
}
