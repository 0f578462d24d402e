//! The engine's atomic unit: read-modify-write of memory elements that
//! stays atomic against every other atomic update of the same memory, from
//! any process (each element is one compare-and-swap loop on the CPU's
//! atomic instructions, which hold across processes that map the memory).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::error::DmaError;

/// Widths of the elements the unit updates.
pub const ATOMIC_WIDTHS: [usize; 4] = [1, 2, 4, 8];

/// Updates `count` elements of `width` bytes at `at`: for each, `update`
/// gets its index and current bits and returns the new bits (`None`:
/// leave it). Each element's read and write are one atomic step. Returns
/// the old bits of each element through `old`.
///
/// # Safety
/// `[at, at + width * count)` must be valid, writable memory for the whole
/// call, `at` aligned to `width`.
pub unsafe fn update_elements(
    at: *mut u8,
    width: usize,
    count: usize,
    update: &mut dyn FnMut(usize, u64) -> Option<u64>,
    old: &mut dyn FnMut(usize, u64),
) -> Result<(), DmaError> {
    if !ATOMIC_WIDTHS.contains(&width) || !(at as usize).is_multiple_of(width) {
        return Err(DmaError::Invalid);
    }
    for index in 0..count {
        // SAFETY: the element lies inside the range (caller), aligned to
        // its width (checked).
        let element = unsafe { at.add(index * width) };
        macro_rules! cas_loop {
            ($atomic:ty, $bits:ty) => {{
                // SAFETY: aligned, valid for the call (see above); other
                // processes touch it only atomically.
                let cell = unsafe { <$atomic>::from_ptr(element as *mut $bits) };
                let mut current = cell.load(Ordering::Acquire);
                loop {
                    let Some(new) = update(index, current as u64) else {
                        break;
                    };
                    match cell.compare_exchange_weak(
                        current,
                        new as $bits,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break,
                        Err(seen) => current = seen,
                    }
                }
                current as u64
            }};
        }
        let before = match width {
            1 => cas_loop!(AtomicU8, u8),
            2 => cas_loop!(AtomicU16, u16),
            4 => cas_loop!(AtomicU32, u32),
            _ => cas_loop!(AtomicU64, u64),
        };
        old(index, before);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_updates_are_exact() {
        let mut cells = vec![0u64; 4];
        let at = cells.as_mut_ptr() as usize;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(move || {
                    for _ in 0..10_000 {
                        // SAFETY: `cells` outlives the scope; 4 aligned u64s.
                        unsafe {
                            update_elements(
                                at as *mut u8,
                                8,
                                4,
                                &mut |_, old| Some(old + 1),
                                &mut |_, _| {},
                            )
                        }
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(cells, [40_000; 4]);
    }

    #[test]
    fn widths_old_values_and_alignment() {
        let mut bytes = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut olds = Vec::new();
        // SAFETY: 8 bytes, 2-byte elements at an aligned start.
        unsafe {
            update_elements(
                bytes.as_mut_ptr().add(0),
                1,
                3,
                &mut |i, old| (i != 1).then_some(old * 10),
                &mut |_, old| olds.push(old),
            )
        }
        .unwrap();
        assert_eq!(olds, [1, 2, 3]);
        assert_eq!(&bytes[..3], &[10, 2, 30]);
        let mut word = [0u32; 2];
        let odd = (word.as_mut_ptr() as *mut u8).wrapping_add(1);
        // SAFETY: refused before any access.
        let refused = unsafe { update_elements(odd, 4, 1, &mut |_, v| Some(v), &mut |_, _| {}) };
        assert!(matches!(refused, Err(DmaError::Invalid)));
        // SAFETY: as above.
        let refused = unsafe { update_elements(odd, 3, 1, &mut |_, v| Some(v), &mut |_, _| {}) };
        assert!(matches!(refused, Err(DmaError::Invalid)));
        word[0] = 7;
        assert_eq!(word[0], 7);
    }
}
