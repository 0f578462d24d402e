//! Removal of this process's shared objects when a fatal signal ends it.
//!
//! A process that exits removes what it owns (the provider's destructor,
//! `shm::remove_own_objects`), and a process that finds a peer dead removes
//! the peer's; but a job that dies whole (every rank killed by a fault or
//! by its launcher) leaves nobody to do it until the next job's first
//! process reclaims them. So, like libfabric's `shm`, every process that
//! owns an object handles the fatal signals (SIGSEGV, SIGBUS, SIGABRT,
//! SIGFPE, SIGILL, SIGTERM, SIGINT, SIGQUIT): it unlinks the names it owns,
//! then puts back the disposition the signal had before and raises the
//! signal again, so the application's own handler (or the default action:
//! a core dump, an exit) runs as it would have without us.
//!
//! The handler is async-signal-safe: it reads a fixed table of the owned
//! names (paths under `/dev/shm`, written before they are marked ready,
//! tagged with the owner's pid so that a forked child never removes its
//! parent's) and calls `unlink`, `sigaction` and `raise` only. SIGBUS goes
//! through `fault.rs` first, which contains faults on shared mappings a
//! peer truncated; only a fault that is not one of those comes here. A
//! signal the process ignored when the first object was made is left
//! alone: a process that ignores SIGINT must keep its objects on Ctrl-C.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Once;

/// Objects one process may own at once and be cleaned after; beyond, an
/// object is left for reclaiming (one debug line).
const SLOTS: usize = 512;
/// Longest path kept, NUL included (names are about 50 bytes).
const PATH_LEN: usize = 128;

const FREE: u8 = 0;
const TAKEN: u8 = 1;
const READY: u8 = 2;

struct Slot {
    state: AtomicU8,
    /// The process that owns the object (a forked child inherits the table).
    pid: AtomicU32,
    /// NUL-terminated `/dev/shm/<name>`; written only while `TAKEN`.
    path: UnsafeCell<[u8; PATH_LEN]>,
}

// SAFETY: `path` is written only by the thread that took the slot (state
// TAKEN, which no reader reads), and read only once the slot is READY
// (Release/Acquire on `state`).
unsafe impl Sync for Slot {}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        state: AtomicU8::new(FREE),
        pid: AtomicU32::new(0),
        path: UnsafeCell::new([0; PATH_LEN]),
    }
}; SLOTS];

/// The signals handled here, SIGBUS apart (see `fault.rs`).
const SIGNALS: [libc::c_int; 7] = [
    libc::SIGSEGV,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGQUIT,
];

/// The disposition each signal had before ours, by signal number; written
/// once each, before our handler for it is installed.
struct Previous(UnsafeCell<[Option<libc::sigaction>; 32]>);

// SAFETY: written only in `install` (under INSTALL, before the handlers
// exist), read only by the handlers afterwards.
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous(UnsafeCell::new([None; 32]));
static INSTALL: Once = Once::new();

/// An owned object's entry in the table, cleared when dropped (once the
/// object is unlinked).
#[derive(Debug)]
pub(crate) struct Owned(Option<usize>);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            TABLE[slot].state.store(FREE, Ordering::Release);
        }
    }
}

/// Records that this process owns the object at `path` (under
/// `/dev/shm`): a fatal signal unlinks it.
pub(crate) fn own(path: &str) -> Owned {
    INSTALL.call_once(install);
    if path.len() >= PATH_LEN {
        tracing::debug!(object = path, "name too long to remove on a fatal signal");
        return Owned(None);
    }
    for (index, slot) in TABLE.iter().enumerate() {
        if slot
            .state
            .compare_exchange(FREE, TAKEN, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        // SAFETY: the slot is TAKEN by us: no one else writes it and the
        // handler does not read it.
        let bytes = unsafe { &mut *slot.path.get() };
        bytes[..path.len()].copy_from_slice(path.as_bytes());
        bytes[path.len()] = 0;
        slot.pid.store(std::process::id(), Ordering::Relaxed);
        slot.state.store(READY, Ordering::Release);
        return Owned(Some(index));
    }
    tracing::debug!(
        object = path,
        "too many objects to remove on a fatal signal: left for reclaiming"
    );
    Owned(None)
}

/// Unlinks every object this process owns. Async-signal-safe.
pub(crate) fn remove_all() {
    // SAFETY: getpid has no preconditions and is async-signal-safe.
    let me = unsafe { libc::getpid() } as u32;
    for slot in &TABLE {
        if slot.state.load(Ordering::Acquire) != READY || slot.pid.load(Ordering::Relaxed) != me {
            continue;
        }
        // SAFETY: a READY slot holds a NUL-terminated path that is not
        // written until the slot is freed; unlink is async-signal-safe.
        unsafe { libc::unlink(slot.path.get().cast::<libc::c_char>()) };
    }
}

fn install() {
    for sig in SIGNALS {
        // SAFETY: all-zero sigactions are valid values to fill in.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading a disposition (NULL new action) changes nothing.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut previous) } != 0
            || previous.sa_sigaction == libc::SIG_IGN
        {
            continue;
        }
        // SAFETY: as above.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_fatal as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: valid sigaction pointers; PREVIOUS[sig] is written before
        // the handler that reads it exists, and never again.
        unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            (*PREVIOUS.0.get())[sig as usize] = Some(previous);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_fatal(sig: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    remove_all();
    // The disposition from before, and the signal again: delivered when
    // this handler returns (it is blocked meanwhile), to the application's
    // handler or to the default action. A fault returns into the faulting
    // instruction, which faults into it at the latest.
    // SAFETY: PREVIOUS[sig] was written before this handler was installed;
    // raise is async-signal-safe.
    unsafe {
        put_back(sig, (*PREVIOUS.0.get())[sig as usize & 31]);
        libc::raise(sig);
    }
}

/// Puts back the disposition `sig` had before ours (the default if it is
/// not known). Async-signal-safe (sigaction, signal).
pub(crate) fn put_back(sig: libc::c_int, previous: Option<libc::sigaction>) {
    // SAFETY: a valid sigaction, or the default disposition.
    unsafe {
        match previous {
            Some(previous) => libc::sigaction(sig, &previous, std::ptr::null_mut()),
            None => libc::signal(sig, libc::SIG_DFL) as libc::c_int,
        };
    }
}
