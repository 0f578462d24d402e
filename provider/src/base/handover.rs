//! Who runs the protocol: the application's calls or the progress agent,
//! never both at once, and no lock between them.
//!
//! Every entry point counts itself in a slot of its thread
//! ([`AppCall::enter`]: a plain store and a load); the agent takes over
//! only when every slot reads zero ([`AgentHold::take`]). The two sides are
//! an asymmetric Dekker: the application's side has no fence, and the
//! agent, before it looks at the slots, has the kernel run a full barrier
//! on every thread of the process that is on a CPU
//! (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`): an application thread
//! that entered before it is then seen inside, one that enters after it
//! sees the agent's claim: while the barrier runs (tens of microseconds on
//! a virtual machine) it cancels the claim and goes in, once the agent
//! holds the provider it waits for the agent's pass to end. The agent
//! pays a system call per takeover, which only happens while the
//! application computes; the application pays nothing it did not pay
//! before on its data path. Where the kernel refuses membarrier, the
//! application's side falls back to a full fence.
//!
//! With the two excluded, the objects of a domain keep the locking its
//! threading model asks for (none under `FI_THREAD_DOMAIN`): the agent is
//! one more caller that never overlaps the application.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Whether the agent runs (else [`AppCall::enter`] is one load).
static ON: AtomicBool = AtomicBool::new(false);
/// The agent's claim: [`FREE`], [`CLAIMING`] (its barrier runs: an
/// application call that comes now cancels the claim and goes in) or
/// [`HELD`] (it is in a pass: a call that comes waits for the end).
static AGENT: AtomicU32 = AtomicU32::new(FREE);
const FREE: u32 = 0;
const CLAIMING: u32 = 1;
const HELD: u32 = 2;
/// membarrier is not available: the application's side fences.
static FENCED: AtomicBool = AtomicBool::new(false);
/// Calls of the application into the provider at depth 0 (only a change
/// matters: a plain load and store).
pub static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// One thread's count of calls in progress.
struct Slot {
    inside: AtomicU32,
}

/// Every thread's slot (leaked: a thread's slot outlives it, reused by no
/// one, zero once the thread is gone).
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

thread_local! {
    static SLOT: Cell<Option<&'static Slot>> = const { Cell::new(None) };
}

/// The calling thread's slot: one thread-local load on every entry point
/// (inlined into the guard), made on the thread's first call.
#[inline]
fn slot() -> &'static Slot {
    match SLOT.with(Cell::get) {
        Some(slot) => slot,
        None => new_slot(),
    }
}

#[cold]
#[inline(never)]
fn new_slot() -> &'static Slot {
    let slot: &'static Slot = Box::leak(Box::new(Slot {
        inside: AtomicU32::new(0),
    }));
    SLOTS.lock().push(slot);
    SLOT.with(|cell| cell.set(Some(slot)));
    slot
}

/// Turns the hand-over on (the agent starts): registers the process for
/// membarrier, or falls back to fences.
pub fn start() {
    // SAFETY: membarrier takes no pointers.
    let registered = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        )
    } == 0;
    if !registered {
        tracing::info!(
            "membarrier unavailable ({}): the application's calls fence instead",
            std::io::Error::last_os_error()
        );
        FENCED.store(true, Ordering::Relaxed);
    }
    ON.store(true, Ordering::SeqCst);
}

/// Turns it off (the agent stopped).
pub fn stop() {
    ON.store(false, Ordering::SeqCst);
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// An application call in progress on this thread (from [`AppCall::enter`]
/// to its drop).
pub struct AppCall {
    slot: &'static Slot,
}

impl AppCall {
    /// Counts the calling thread inside the provider; if the agent holds
    /// it, waits for the end of the agent's pass. The count is kept with
    /// the agent off too (a thread-local store), so that a call already
    /// in progress when the agent starts is seen.
    #[inline]
    pub fn enter() -> AppCall {
        let slot = slot();
        let depth = slot.inside.load(Ordering::Relaxed);
        slot.inside.store(depth + 1, Ordering::Relaxed);
        if depth == 0 && ON.load(Ordering::Relaxed) {
            ACTIVITY.store(
                ACTIVITY.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
            come_in();
        }
        AppCall { slot }
    }
}

/// Runs `f` (a sleep of a blocking call) as if the calling thread were
/// outside the provider: the agent may work meanwhile.
pub fn outside<R>(f: impl FnOnce() -> R) -> R {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    let slot = slot();
    let depth = slot.inside.load(Ordering::Relaxed);
    slot.inside.store(0, Ordering::Release);
    let result = f();
    slot.inside.store(depth, Ordering::Relaxed);
    come_in();
    result
}

/// The calling thread is counted in: goes in unless the agent holds the
/// provider. A claim still in its barrier (a membarrier takes tens of
/// microseconds on a virtual machine) is cancelled rather than waited for.
#[inline]
fn come_in() {
    // Our count before the load of the agent's claim: the agent's
    // membarrier orders them; without membarrier, a fence does.
    if FENCED.load(Ordering::Relaxed) {
        fence(Ordering::SeqCst);
    } else {
        compiler_fence(Ordering::SeqCst);
    }
    // Acquire: what the agent wrote in its pass is ours to read.
    loop {
        match AGENT.load(Ordering::Acquire) {
            FREE => return,
            CLAIMING => {
                if AGENT
                    .compare_exchange(CLAIMING, FREE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return;
                }
            }
            _ => std::hint::spin_loop(),
        }
    }
}

impl Drop for AppCall {
    #[inline]
    fn drop(&mut self) {
        let depth = self.slot.inside.load(Ordering::Relaxed);
        // Release: what this call wrote is the agent's to read.
        self.slot.inside.store(depth - 1, Ordering::Release);
    }
}

/// The agent holding the provider, while no application thread is in it.
pub struct AgentHold(());

impl AgentHold {
    /// The provider if no application thread is in it: `None` otherwise
    /// (the application progresses by itself).
    pub fn take() -> Option<AgentHold> {
        AGENT.store(CLAIMING, Ordering::SeqCst);
        if !FENCED.load(Ordering::Relaxed) {
            // SAFETY: membarrier takes no pointers; the process registered
            // in `start`.
            unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
        }
        if any_inside() {
            let _ = AGENT.compare_exchange(CLAIMING, FREE, Ordering::AcqRel, Ordering::Relaxed);
            return None;
        }
        // An application call that came during the barrier cancelled the
        // claim (and is in): then no hold.
        AGENT
            .compare_exchange(CLAIMING, HELD, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| AgentHold(()))
    }

    /// Whether an application thread is waiting to come in: the agent
    /// ends its pass early.
    pub fn wanted() -> bool {
        any_inside()
    }
}

/// Whether an application thread is counted in (Acquire: what it wrote
/// before it left is ours to read).
fn any_inside() -> bool {
    SLOTS
        .lock()
        .iter()
        .any(|slot| slot.inside.load(Ordering::Acquire) != 0)
}

impl Drop for AgentHold {
    fn drop(&mut self) {
        AGENT.store(FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::UnsafeCell;
    use std::time::Duration;

    /// A counter with no synchronisation of its own: only the hand-over
    /// keeps its increments apart.
    struct Racy(UnsafeCell<u64>);
    // SAFETY: the test's point: the hand-over serializes every access.
    unsafe impl Sync for Racy {}

    /// One increment as two separate accesses, so that two threads at
    /// once lose counts.
    fn bump(count: &Racy) {
        // SAFETY: the caller is the one side the hand-over lets in.
        unsafe {
            let v = std::ptr::read_volatile(count.0.get());
            std::ptr::write_volatile(count.0.get(), v + 1);
        }
    }

    #[test]
    fn the_agent_and_the_application_never_run_at_once() {
        start();
        // Rounds: a broken hand-over loses counts in a few of them. The
        // other tests of this binary call entry points on their threads
        // meanwhile (and keep the agent out while they do): rounds go on
        // until the agent got in, within reason.
        let started = std::time::Instant::now();
        let mut passes = 0;
        let mut rounds = 0;
        while rounds < 12 || (passes == 0 && started.elapsed() < Duration::from_secs(20)) {
            passes += one_round();
            rounds += 1;
        }
        stop();
        // The agent did get in while the application was out.
        assert!(passes > 0, "the agent never got in ({rounds} rounds)");
    }

    /// Returns the agent's passes.
    fn one_round() -> u64 {
        let count = Racy(UnsafeCell::new(0));
        let done = AtomicBool::new(false);
        const CALLS: u64 = 300_000;
        let shared = &count;
        let passes = std::thread::scope(|s| {
            let agent = s.spawn(|| {
                let mut passes = 0u64;
                while !done.load(Ordering::Acquire) {
                    if let Some(_hold) = AgentHold::take() {
                        for _ in 0..1000 {
                            bump(shared);
                        }
                        passes += 1;
                    }
                }
                passes
            });
            // One application thread (FI_THREAD_DOMAIN): calls back to
            // back, and now and then out of the provider for a while.
            for i in 0..CALLS {
                let call = AppCall::enter();
                bump(shared);
                drop(call);
                if i % 1000 == 0 {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
            done.store(true, Ordering::Release);
            agent.join().expect("the agent thread")
        });
        // Both sides counted every increment: none was lost to a race.
        assert_eq!(count.0.into_inner(), CALLS + 1000 * passes);
        passes
    }
}
