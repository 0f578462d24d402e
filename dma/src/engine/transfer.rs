//! The copies of puts and gets: checked and pinned, then done inline when
//! submitted, or by the mover thread while the caller goes on.

use std::sync::Arc;

use super::ShmDmaEngine;
use crate::copier::{self, AsyncCopy};
use crate::error::DmaError;
use crate::{DmaId, RegId};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Put,
    Get,
}

impl ShmDmaEngine {
    /// A put or get of `len` bytes at `local` with `remote_addr` of `reg`
    /// (granted with a token, or not). A transfer granted is a
    /// rendezvous's, copied here by its caller; any other of at least
    /// `async_min` bytes goes to the mover (its caller computes on).
    #[inline]
    pub(super) fn transfer(
        &mut self,
        direction: Direction,
        local: usize,
        len: usize,
        (reg, remote_addr, granted): (RegId, u64, Option<u16>),
    ) -> Result<DmaId, DmaError> {
        let remote_end = remote_addr
            .checked_add(len as u64)
            .ok_or(DmaError::LengthOverflow)?;
        local.checked_add(len).ok_or(DmaError::LengthOverflow)?;
        if len > 0 && !self.region.contains(local, len) {
            return Err(DmaError::LocalNotDmable);
        }
        if self.async_min > 0 && len >= self.async_min && granted.is_none() {
            return self.transfer_async(
                direction,
                local,
                len,
                reg,
                (remote_addr, remote_end),
                granted,
            );
        }
        self.pinned(reg, remote_addr, remote_end, granted, |remote| {
            // SAFETY: `[remote, remote + len)` lies inside the registration's
            // mapping (`pinned`) and `[local, local + len)` inside our dmable
            // region; the two never overlap, being different mappings, even
            // of the same node.
            unsafe {
                match direction {
                    Direction::Put => {
                        std::ptr::copy_nonoverlapping(local as *const u8, remote, len)
                    }
                    Direction::Get => std::ptr::copy_nonoverlapping(remote, local as *mut u8, len),
                }
            }
            Ok(())
        })?;
        Ok(self.complete_after(len, None))
    }

    /// `transfer` by the mover thread: checked and pinned now, copied
    /// there; `poll` reports it once copied.
    fn transfer_async(
        &mut self,
        direction: Direction,
        local: usize,
        len: usize,
        reg: RegId,
        (remote_addr, remote_end): (u64, u64),
        granted: Option<u16>,
    ) -> Result<DmaId, DmaError> {
        let (pin, remote, registration) = self.pin_range(reg, remote_addr, remote_end, granted)?;
        let pin = pin.detach(Arc::clone(&registration.gens));
        let hold = Box::new((
            pin,
            Arc::clone(&registration.mapping),
            Arc::clone(&self.region),
        ));
        let (src, dst) = match direction {
            Direction::Put => (local as *const u8, remote),
            Direction::Get => (remote as *const u8, local as *mut u8),
        };
        // SAFETY: our region and the remote mapping are different
        // mappings; `hold` keeps both mapped and the remote pages pinned,
        // the caller's buffer is valid until the completion (caller).
        let copy = unsafe { AsyncCopy::new(src, dst, len, hold) };
        if copier::submit(&copy) {
            self.moved_async += 1;
        } else {
            copy.work();
        }
        Ok(self.complete_after(len, Some(copy)))
    }
}
