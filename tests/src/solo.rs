//! One test binary runs every multi-process test, so a test's processes
//! share the machine, this user's `/dev/shm` and the test hosts with every
//! other test's (each test file used to be a process of its own, run
//! alone). The tests that need no other test's processes meanwhile hold
//! [`alone`]; whatever starts processes holds [`shared`] while they run:
//! [`Peer`](crate::Peer), [`Cluster`](crate::cluster::Cluster) and a
//! running [`mpi`](crate::mpi) job take it themselves.
//!
//! Alone are the tests that check that a killed process's objects are
//! still there before they reclaim them (a process of this user that opens
//! a mailbox, finds a peer dead or unloads the provider reclaims what dead
//! processes left, in every job), the tests on the test hosts
//! ([`hosts::exclusive`](crate::hosts::exclusive): they cut links and
//! time how soon that is noticed) and the 5 GiB transfers (11 GiB of
//! memory).
//!
//! Sharers never wait for a test that waits to be alone (no holder of one
//! guard can deadlock behind a waiting test while it takes another): the
//! one waiting runs once the sharers of the moment are done. Take `alone`
//! before any other lock a sharer may hold.

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

/// Held while a test's processes run.
#[must_use = "other tests are held off only while it is held"]
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

/// Held by a test during which no other test's processes run.
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
