//! One test binary runs every multi-process test, so a test's processes
//! share this user's `/dev/shm` with every other test's. A process that
//! opens a mailbox, finds a peer dead or unloads the provider reclaims
//! what dead processes left there, in every job. The few tests that check
//! that a killed process's objects are still there before they reclaim
//! them hold [`alone`]; whatever starts such processes holds [`shared`]
//! meanwhile. [`Peer`](crate::Peer), [`Cluster`](crate::cluster::Cluster)
//! and a running [`mpi`](crate::mpi) job take it themselves.
//!
//! Sharers never wait for a test that waits to be alone (no reader of this
//! lock can deadlock behind a waiting writer while it holds another
//! guard): the one waiting runs once the sharers of the moment are done.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

struct State {
    sharers: usize,
    alone: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    sharers: 0,
    alone: false,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread holds [`alone`]: what it starts itself is its own.
    static ALONE_HERE: Cell<bool> = const { Cell::new(false) };
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held while processes that may reclaim dead ones' objects run.
#[must_use = "the processes may reclaim only while it is held"]
pub struct Shared {
    counted: bool,
}

/// Waits until no test is [`alone`], then counts this one in until the
/// guard goes. Inside the thread that is alone, a no-op.
pub fn shared() -> Shared {
    if ALONE_HERE.with(Cell::get) {
        return Shared { counted: false };
    }
    let mut s = state();
    while s.alone {
        s = CHANGED.wait(s).unwrap_or_else(|e| e.into_inner());
    }
    s.sharers += 1;
    Shared { counted: true }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.counted {
            state().sharers -= 1;
            CHANGED.notify_all();
        }
    }
}

/// Held by a test during which no process but its own may reclaim.
#[must_use = "other tests' processes are held off only while it is held"]
pub struct Alone(());

/// Waits until no other test is alone or runs processes, then keeps every
/// other test from starting any until the guard goes.
pub fn alone() -> Alone {
    let mut s = state();
    while s.alone || s.sharers > 0 {
        s = CHANGED.wait(s).unwrap_or_else(|e| e.into_inner());
    }
    s.alone = true;
    ALONE_HERE.with(|here| here.set(true));
    Alone(())
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE_HERE.with(|here| here.set(false));
        state().alone = false;
        CHANGED.notify_all();
    }
}
