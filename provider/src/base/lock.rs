//! Locks that cost nothing when the application's threading level says no
//! two threads use a domain's objects at once.
//!
//! With `FI_THREAD_DOMAIN` (what MPICH asks for) the application
//! serializes every call on the objects of a domain: its endpoints, CQs,
//! counters and AVs. The locks that keep those objects' state consistent
//! between threads are then pure cost, two locked instructions each on
//! every send, receive and completion; libfabric's own providers elide
//! them the same way. [`DomainMutex`] and [`DomainRwLock`] are chosen at
//! open, from the domain's threading level ([`Locking::for_threading`]): a
//! real parking_lot lock, or none at all.
//!
//! An elided lock still keeps a busy flag, a plain load and store (no
//! locked instruction): taking it while it is held panics (the entry
//! point's guard turns that into an error) instead of handing out two
//! `&mut` to one value. That catches every re-entry from our own code, and
//! an application that breaks its `FI_THREAD_DOMAIN` promise with two
//! threads at once nearly always.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::lock_api::{RawMutex as _, RawRwLock as _};
use parking_lot::{RawMutex, RawRwLock};

use crate::base::ffi;

/// Whether the locks of a domain's objects lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locking {
    /// Threads may call on the domain's objects at once.
    Locked,
    /// The application serializes its calls on the domain's objects
    /// (`FI_THREAD_DOMAIN`).
    Elided,
}

impl Locking {
    /// What a domain opened with `threading` needs. Only `FI_THREAD_DOMAIN`
    /// elides: with `FI_THREAD_COMPLETION`, `FI_THREAD_ENDPOINT` or
    /// `FI_THREAD_FID` two threads may use two endpoints or CQs of one
    /// domain at once, and every CQ read progresses all of the domain's
    /// endpoints.
    pub fn for_threading(threading: ffi::fi_threading) -> Locking {
        if threading == ffi::FI_THREAD_DOMAIN {
            Locking::Elided
        } else {
            Locking::Locked
        }
    }
}

/// The busy flag of an elided lock: [`WRITER`] or a count of readers.
const WRITER: usize = usize::MAX;

#[cold]
#[inline(never)]
fn misuse(what: &str) -> ! {
    panic!(
        "{what}: an object of a FI_THREAD_DOMAIN domain used by two calls at once \
         (the application must serialize its calls on a domain's objects)"
    )
}

/// A mutex that locks only when the domain's threading level needs it.
pub struct DomainMutex<T> {
    /// None: elided.
    raw: Option<RawMutex>,
    /// Elided only: whether a guard is out (0 or [`WRITER`]).
    busy: AtomicUsize,
    value: UnsafeCell<T>,
}

// SAFETY: as a Mutex: the value moves between threads with the lock.
unsafe impl<T: Send> Send for DomainMutex<T> {}
// SAFETY: locked, as parking_lot's Mutex; elided, only one call at a time
// reaches the value (the application's FI_THREAD_DOMAIN promise, which the
// busy flag checks, and which orders its calls across threads).
unsafe impl<T: Send> Sync for DomainMutex<T> {}

impl<T> DomainMutex<T> {
    pub fn new(value: T, locking: Locking) -> Self {
        DomainMutex {
            raw: (locking == Locking::Locked).then_some(RawMutex::INIT),
            busy: AtomicUsize::new(0),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub fn lock(&self) -> DomainMutexGuard<'_, T> {
        match &self.raw {
            Some(raw) => raw.lock(),
            None => {
                // A plain load and store: the application orders its calls.
                if self.busy.load(Ordering::Relaxed) != 0 {
                    misuse("lock");
                }
                self.busy.store(WRITER, Ordering::Relaxed);
            }
        }
        DomainMutexGuard { lock: self }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for DomainMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = if self.raw.is_some() {
            "locked"
        } else {
            "elided"
        };
        write!(f, "DomainMutex({mode})")
    }
}

/// The value of a [`DomainMutex`], held.
pub struct DomainMutexGuard<'a, T> {
    lock: &'a DomainMutex<T>,
}

impl<T> Deref for DomainMutexGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock (or the busy flag).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for DomainMutexGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock (or the busy flag), and is
        // borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for DomainMutexGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        match &self.lock.raw {
            // SAFETY: this guard locked it.
            Some(raw) => unsafe { raw.unlock() },
            None => self.lock.busy.store(0, Ordering::Relaxed),
        }
    }
}

/// A readers-writer lock that locks only when the domain's threading level
/// needs it. Elided, reads may nest (a count, plainly loaded and stored).
pub struct DomainRwLock<T> {
    /// None: elided.
    raw: Option<RawRwLock>,
    /// Elided only: readers out, or [`WRITER`].
    busy: AtomicUsize,
    value: UnsafeCell<T>,
}

// SAFETY: as an RwLock: the value moves between threads with the lock.
unsafe impl<T: Send> Send for DomainRwLock<T> {}
// SAFETY: locked, as parking_lot's RwLock (readers share &T, hence Sync);
// elided, only one call at a time reaches the value (the application's
// FI_THREAD_DOMAIN promise, which the busy count checks).
unsafe impl<T: Send + Sync> Sync for DomainRwLock<T> {}

impl<T> DomainRwLock<T> {
    pub fn new(value: T, locking: Locking) -> Self {
        DomainRwLock {
            raw: (locking == Locking::Locked).then_some(RawRwLock::INIT),
            busy: AtomicUsize::new(0),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub fn read(&self) -> DomainReadGuard<'_, T> {
        match &self.raw {
            Some(raw) => raw.lock_shared(),
            None => {
                let readers = self.busy.load(Ordering::Relaxed);
                if readers == WRITER {
                    misuse("read");
                }
                self.busy.store(readers + 1, Ordering::Relaxed);
            }
        }
        DomainReadGuard { lock: self }
    }

    pub fn write(&self) -> DomainWriteGuard<'_, T> {
        match &self.raw {
            Some(raw) => raw.lock_exclusive(),
            None => {
                if self.busy.load(Ordering::Relaxed) != 0 {
                    misuse("write");
                }
                self.busy.store(WRITER, Ordering::Relaxed);
            }
        }
        DomainWriteGuard { lock: self }
    }
}

/// Shared access to the value of a [`DomainRwLock`].
pub struct DomainReadGuard<'a, T> {
    lock: &'a DomainRwLock<T>,
}

impl<T> Deref for DomainReadGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds a read lock (or counts as a reader): no
        // writer is out.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for DomainReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        match &self.lock.raw {
            // SAFETY: this guard holds one shared lock.
            Some(raw) => unsafe { raw.unlock_shared() },
            None => {
                let readers = self.lock.busy.load(Ordering::Relaxed);
                self.lock.busy.store(readers - 1, Ordering::Relaxed);
            }
        }
    }
}

/// Exclusive access to the value of a [`DomainRwLock`].
pub struct DomainWriteGuard<'a, T> {
    lock: &'a DomainRwLock<T>,
}

impl<T> Deref for DomainWriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the guard holds the write lock (or the busy flag).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for DomainWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the write lock (or the busy flag), and is
        // borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for DomainWriteGuard<'_, T> {
    fn drop(&mut self) {
        match &self.lock.raw {
            // SAFETY: this guard holds the exclusive lock.
            Some(raw) => unsafe { raw.unlock_exclusive() },
            None => self.lock.busy.store(0, Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::Arc;

    #[test]
    fn only_thread_domain_elides() {
        assert_eq!(
            Locking::for_threading(ffi::FI_THREAD_DOMAIN),
            Locking::Elided
        );
        for t in [
            ffi::FI_THREAD_SAFE,
            ffi::FI_THREAD_FID,
            ffi::FI_THREAD_COMPLETION,
            ffi::FI_THREAD_ENDPOINT,
            ffi::FI_THREAD_UNSPEC,
        ] {
            assert_eq!(Locking::for_threading(t), Locking::Locked, "{t}");
        }
    }

    #[test]
    fn both_modes_hand_out_the_value() {
        for locking in [Locking::Locked, Locking::Elided] {
            let m = DomainMutex::new(1, locking);
            *m.lock() += 1;
            assert_eq!(*m.lock(), 2);
            let rw = DomainRwLock::new(vec![1], locking);
            rw.write().push(2);
            let (a, b) = (rw.read(), rw.read());
            assert_eq!((a.len(), b.len()), (2, 2), "reads nest");
        }
    }

    #[test]
    fn elided_locks_refuse_overlapping_use() {
        let m = DomainMutex::new(0, Locking::Elided);
        let held = m.lock();
        assert!(catch_unwind(AssertUnwindSafe(|| drop(m.lock()))).is_err());
        drop(held);
        drop(m.lock());

        let rw = DomainRwLock::new(0, Locking::Elided);
        let r = rw.read();
        assert!(catch_unwind(AssertUnwindSafe(|| drop(rw.write()))).is_err());
        drop(r);
        let w = rw.write();
        assert!(catch_unwind(AssertUnwindSafe(|| drop(rw.read()))).is_err());
        drop(w);
        drop(rw.write());
    }

    #[test]
    fn locked_mutex_serializes_threads() {
        let m = Arc::new(DomainMutex::new(0u64, Locking::Locked));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 40_000);
    }
}
