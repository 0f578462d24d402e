//! The mailbox's doorbell: how a sleeping receiver is woken by the arrival
//! of a message, as Unimem's mailbox raises an interrupt.
//!
//! A wakeable mailbox has, on a cache line of its header page of its own,
//! an *armed* flag and a *rings* counter (a futex word). A thread of the
//! owner that wants to sleep until a message comes arms the bell, looks at
//! the ring once more and sleeps on the counter; a sender that finds the
//! bell armed after publishing its message disarms it, bumps the counter
//! and wakes the sleepers. Only the first sender after an arming pays the
//! system call; a mailbox whose owner is awake (polling) costs senders one
//! load of a line that does not change.
//!
//! The two sides are a store-then-load on each side (message then flag,
//! flag then message), so a full barrier must stand between them: without
//! it either could read before its write is visible, and the sleeper would
//! miss the only message meant to wake it. The sleeper pays for both
//! sides: it fences and then has the kernel put a barrier on every CPU
//! that runs a process registered as a sender
//! (`membarrier(GLOBAL_EXPEDITED)`), so senders pay no fence; a process
//! the kernel refuses fences its own sends. A sender looks at the bell
//! only when the mailbox is wakeable (its owner made it so: some thread
//! of its sleeps on it), one load of a line that rarely changes.
//!
//! The futex word is in memory every peer can write, so a hostile peer can
//! ring at will or leave the bell disarmed: that wakes the owner for
//! nothing or lets it sleep until its timeout, never more. Sleepers always
//! look at the ring after waking.

use std::sync::atomic::{compiler_fence, fence, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shm::SharedObject;

/// The doorbell's line in the header page.
#[repr(C, align(64))]
pub(crate) struct BellLine {
    /// Set by the owner once some thread of its may sleep on the mailbox
    /// (never cleared): senders look at `armed`.
    pub(crate) wakeable: AtomicU32,
    /// Nonzero while a thread of the owner sleeps, or is about to.
    pub(crate) armed: AtomicU32,
    /// Bumped by every ring: the word sleepers wait on.
    pub(crate) rings: AtomicU32,
}

/// What `armed` holds when a sleeper armed it (anything else nonzero is a
/// peer's doing, and still rings).
const SLEEPER: u32 = 2;

/// Where the line sits in the mailbox's header page.
pub(crate) const BELL_OFFSET: usize = 192;

#[inline]
pub(crate) fn line(object: &SharedObject) -> &BellLine {
    // SAFETY: BELL_OFFSET lies in the header page (4 KiB) and is 64-byte
    // aligned; the line holds atomics only.
    unsafe { &*(object.base().add(BELL_OFFSET) as *const BellLine) }
}

/// Sender side: rings the bell of a wakeable mailbox if its owner armed it.
/// Called after the message's slot was published.
#[inline]
pub(crate) fn ring_if_armed(bell: &BellLine) {
    // The message's FULL store must be visible before we read the flag:
    // the sleeper stores the flag, then reads the slot. A sender
    // registered for membarrier needs no fence of its own: the sleeper's
    // membarrier puts one on every CPU that runs a registered process.
    if !registered_sender() {
        fence(Ordering::SeqCst);
    } else {
        compiler_fence(Ordering::SeqCst);
    }
    if bell.armed.load(Ordering::Relaxed) != 0 && bell.armed.swap(0, Ordering::AcqRel) != 0 {
        bell.rings.fetch_add(1, Ordering::Release);
        futex_wake(&bell.rings, false);
    }
}

/// The owner's handle on a mailbox's doorbell: usable from any thread of
/// the owner (the progress agent, a blocking CQ read) while the mailbox
/// itself is in use by another.
#[derive(Clone)]
pub struct Doorbell {
    object: Arc<SharedObject>,
}

/// What [`Doorbell::arm`] saw: the ring count to sleep on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Armed(u32);

impl Armed {
    /// What an arming sees after one more ring.
    pub fn after(armed: Armed) -> Armed {
        Armed(armed.0.wrapping_add(1))
    }
}

impl Doorbell {
    pub(crate) fn new(object: Arc<SharedObject>) -> Doorbell {
        Doorbell { object }
    }

    fn line(&self) -> &BellLine {
        line(&self.object)
    }

    /// Arms the bell for a thread that is going to sleep on it: the next
    /// message rings it. The caller must then look at the mailbox once more
    /// (a message may have come before the arming) and only sleep
    /// ([`wait_any`]) if it found none.
    pub fn arm(&self) -> Armed {
        let line = self.line();
        let seen = line.rings.load(Ordering::Acquire);
        line.armed.store(SLEEPER, Ordering::Relaxed);
        // The flag must be visible before the caller's look at the ring,
        // and senders' messages before it (see `ring_if_armed`).
        fence(Ordering::SeqCst);
        global_barrier();
        Armed(seen)
    }

    /// Disarms the bell if it is armed (a load, and a store only then): the
    /// owner is awake and polling, senders need not ring. Returns whether a
    /// sleeper had armed it (it may now sleep without a bell to wake it).
    #[inline]
    pub fn disarm(&self) -> bool {
        let line = self.line();
        let armed = line.armed.load(Ordering::Relaxed);
        if armed != 0 {
            line.armed.store(0, Ordering::Relaxed);
        }
        armed == SLEEPER
    }

    /// Wakes every thread asleep on this bell, armed or not (its owner is
    /// closing, and sleepers must let go of it).
    pub fn wake_all(&self) {
        let line = self.line();
        line.rings.fetch_add(1, Ordering::Release);
        futex_wake(&line.rings, false);
    }

    /// The ring count as it is, without arming: to sleep until a ring of
    /// a bell someone else armed.
    pub fn seen(&self) -> Armed {
        Armed(self.line().rings.load(Ordering::Acquire))
    }

    /// Whether it rang since `armed`.
    pub fn rang(&self, armed: Armed) -> bool {
        self.line().rings.load(Ordering::Acquire) != armed.0
    }

    /// Makes the mailbox wakeable: from now on senders ring its doorbell
    /// when a thread of ours armed it. Done before a thread sleeps on it.
    pub fn make_wakeable(&self) {
        self.line().wakeable.store(1, Ordering::Release);
    }

    pub fn is_wakeable(&self) -> bool {
        self.line().wakeable.load(Ordering::Relaxed) != 0
    }
}

// --- Barriers between senders and sleepers ----------------------------------

const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;
/// 0: not tried yet, 1: registered, 2: refused.
static SENDER: AtomicU8 = AtomicU8::new(0);
/// Whether this process's sleepers can make senders' fences unneeded.
static SLEEPER_BARRIER: AtomicU8 = AtomicU8::new(0);

/// Registers this process for global expedited membarrier (once): from
/// then on its sends need no fence. Called when a mailbox opens.
pub(crate) fn register_sender() {
    if SENDER.load(Ordering::Relaxed) == 0 {
        // SAFETY: membarrier takes no pointers.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED,
                0,
                0,
            )
        };
        SENDER.store(if rc == 0 { 1 } else { 2 }, Ordering::Release);
    }
}

#[inline]
fn registered_sender() -> bool {
    SENDER.load(Ordering::Acquire) == 1
}

/// A full barrier on every CPU that runs a registered process: what their
/// senders published before it is visible to us after it, and they see our
/// armed flag in their next look. Unregistered senders fence themselves.
fn global_barrier() {
    if SLEEPER_BARRIER.load(Ordering::Relaxed) == 2 {
        return;
    }
    // SAFETY: membarrier takes no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) };
    if rc != 0 && SLEEPER_BARRIER.swap(2, Ordering::Relaxed) != 2 {
        tracing::warn!(
            "membarrier(GLOBAL_EXPEDITED) refused ({}): sleepers on a mailbox may wake late",
            std::io::Error::last_os_error()
        );
    }
}

/// Whether sleepers can rely on senders' rings (the barrier works): if not,
/// they must not sleep for long.
pub fn rings_reliable() -> bool {
    SLEEPER_BARRIER.load(Ordering::Relaxed) != 2
}

/// A process-local wake-up word, for waking a sleeper that is not waiting
/// for a message (a new endpoint, shutdown, a completion written by
/// another thread).
#[derive(Debug, Default)]
pub struct Kick {
    word: AtomicU32,
}

impl Kick {
    pub fn new() -> Kick {
        Kick::default()
    }

    /// The current count, to sleep on.
    pub fn seen(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }

    pub fn kick(&self) {
        self.word.fetch_add(1, Ordering::Release);
        futex_wake(&self.word, true);
    }

    pub fn kicked_since(&self, seen: u32) -> bool {
        self.seen() != seen
    }
}

/// Most doorbells one [`wait_any`] sleeps on (the kernel's limit is 128,
/// one is the kick).
pub const MAX_BELLS: usize = 127;
/// The longest sleep of a [`wait_any`] on more than [`MAX_BELLS`] bells.
pub const BEYOND_MAX_BELLS: Duration = Duration::from_millis(1);

/// Sleeps until one of `bells` rings (each with what its arming saw), `kick`
/// moves on from `kick_seen`, `timeout` passes, or a signal comes. Returns
/// at once if any of them already moved on. Spurious returns are possible:
/// callers look at their mailboxes afterwards. Beyond [`MAX_BELLS`] bells
/// the rest cannot wake it: it then sleeps [`BEYOND_MAX_BELLS`] at most.
pub fn wait_any(
    bells: &[(&Doorbell, Armed)],
    kick: Option<(&Kick, u32)>,
    timeout: Option<Duration>,
) {
    let timeout = if bells.len() > MAX_BELLS {
        Some(timeout.map_or(BEYOND_MAX_BELLS, |t| t.min(BEYOND_MAX_BELLS)))
    } else {
        timeout
    };
    let mut waiters: Vec<FutexWaitv> = Vec::with_capacity(bells.len().min(MAX_BELLS) + 1);
    for (bell, armed) in bells.iter().take(MAX_BELLS) {
        waiters.push(FutexWaitv {
            val: u64::from(armed.0),
            uaddr: &bell.line().rings as *const AtomicU32 as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        });
    }
    if let Some((kick, seen)) = kick {
        waiters.push(FutexWaitv {
            val: u64::from(seen),
            uaddr: &kick.word as *const AtomicU32 as u64,
            flags: FUTEX2_SIZE_U32 | FUTEX2_PRIVATE,
            reserved: 0,
        });
    }
    if waiters.is_empty() {
        if let Some(timeout) = timeout {
            std::thread::sleep(timeout);
        }
        return;
    }
    let deadline = timeout.map(|t| {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let total = now.tv_nsec as u128 + t.as_nanos();
        libc::timespec {
            tv_sec: now
                .tv_sec
                .saturating_add((total / 1_000_000_000) as libc::time_t),
            tv_nsec: (total % 1_000_000_000) as libc::c_long,
        }
    });
    let started = Instant::now();
    // SAFETY: `waiters` is a valid array of futex_waitv for the call; every
    // address is a live atomic u32 (bells' lines are in mappings the
    // doorbells hold); the timeout is NULL or a valid absolute time.
    let rc = unsafe {
        libc::syscall(
            SYS_FUTEX_WAITV,
            waiters.as_ptr(),
            waiters.len() as libc::c_uint,
            0 as libc::c_uint,
            deadline
                .as_ref()
                .map_or(std::ptr::null(), |d| d as *const libc::timespec),
            libc::CLOCK_MONOTONIC,
        )
    };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        // A kernel before 5.16: sleep a little instead (the caller polls).
        let nap = Duration::from_micros(200);
        std::thread::sleep(
            timeout
                .map_or(nap, |t| t.min(nap))
                .saturating_sub(started.elapsed()),
        );
    }
}

/// `struct futex_waitv` (linux/futex.h).
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

const FUTEX2_SIZE_U32: u32 = 0x02;
const FUTEX2_PRIVATE: u32 = 128;
/// futex_waitv's number is the same on x86_64 and aarch64 (the generic
/// table).
const SYS_FUTEX_WAITV: libc::c_long = 449;

fn futex_wake(word: &AtomicU32, private: bool) {
    let op = if private {
        libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG
    } else {
        libc::FUTEX_WAKE
    };
    // SAFETY: FUTEX_WAKE only reads the address, a live atomic u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            op,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kick_wakes_a_sleeper() {
        let kick = Kick::new();
        let seen = kick.seen();
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                kick.kick();
            });
            wait_any(&[], Some((&kick, seen)), Some(Duration::from_secs(10)));
        });
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(kick.kicked_since(seen));
    }
}
