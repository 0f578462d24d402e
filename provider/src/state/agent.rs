//! The progress agent: one thread per process (a Unimem node has one
//! interface) that moves the protocol of the endpoints it serves while the
//! application computes, as a NIC would: rendezvous grants and transfers,
//! FINs, credits, target-assisted RMA and atomics, liveness.
//!
//! It behaves like hardware that raises an interrupt:
//! - **Asleep when there is nothing to do**, on the doorbells of its
//!   endpoints' mailboxes ([`unimem_mailbox::doorbell`]): the first message
//!   after it armed a bell wakes it. It never spins on a core the
//!   application needs: after a wake with operations in flight it polls
//!   for [`POLL`] (the next message of a transfer comes within
//!   microseconds), then sleeps, waking for local work every
//!   [`LOCAL_WORK`] and for liveness every [`LIVENESS`]. It runs on the
//!   CPUs the application's thread is not pinned to.
//! - **Only while the application is outside**, without a lock between
//!   them: the agent takes the provider through `base/handover.rs` only
//!   when no application call is in it; a call that starts meanwhile waits
//!   for the end of the agent's pass (at most [`POLL`] and one pass).
//! - **Armed only while the application computes.** Every application call
//!   counts in `handover::ACTIVITY`; an agent that sees the count move only
//!   watches (sleeps [`WATCH`], doubling up to [`WATCH_MAX`], with the
//!   bells disarmed), so a rank that
//!   polls costs its senders nothing. Once the count stops moving, the
//!   agent takes over, arms every bell, looks once more and sleeps until a
//!   message comes. An application call that finds its endpoint's bell
//!   armed disarms it and kicks the agent back to watching. (Posts once
//!   armed their bell on the way out so that a transfer's next message
//!   would reach the agent at once: on a 2-CPU host that only cost senders
//!   a wake-up each, measured with SMB's mpi_overhead, and it went.)
//!
//! Domains that asked for `FI_PROGRESS_AUTO`, and every domain when the
//! `async_progress` tunable is set, join the agent. A process without an
//! agent pays a thread-local count per call (`handover`) and nothing else.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use unimem_mailbox::doorbell::{self, Doorbell, Kick};

use crate::base::handover::{self, AgentHold};
use crate::state::progress::{same, Pending, Progress};

/// How long the agent sleeps, bells disarmed, while the application is
/// calling into the provider (it progresses by itself meanwhile): from
/// [`WATCH`], doubling up to [`WATCH_MAX`] while the calls go on. Each
/// look is a wake-up on another core: at 1 ms they cost MPICH's
/// `osu_latency` 15 % on this host's virtual CPUs (1.86 against 2.22 us
/// for 8 B, 5 alternating rounds); a rank that then computes is served
/// after at most [`WATCH_MAX`].
pub const WATCH: Duration = Duration::from_millis(1);
pub const WATCH_MAX: Duration = Duration::from_millis(64);
/// How long the agent, woken with operations in flight, keeps polling
/// before it sleeps again.
pub const POLL: Duration = Duration::from_micros(50);
/// How soon the agent looks again at work no message announces (DMA
/// completions, sends queued on a full ring, deferred grants).
pub const LOCAL_WORK: Duration = Duration::from_micros(100);
/// How often the agent looks at endpoints that peers of other hosts reach
/// (their messages ring no bell).
pub const NETWORK: Duration = Duration::from_millis(1);
/// How soon the agent looks again at operations in flight whose peer may
/// have died (the liveness checks of `peer_check_ms`).
pub const LIVENESS: Duration = Duration::from_millis(50);

static AGENT: Mutex<Option<Agent>> = Mutex::new(None);

/// The agent's thread and what it serves.
struct Agent {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The process that started the thread (a forked child has none).
    pid: u32,
}

struct Shared {
    members: Mutex<Vec<Arc<dyn Progress>>>,
    /// Bumped when the members change, so the thread copies them only then.
    generation: AtomicU32,
    /// The generation whose members the thread holds (it let go of the
    /// others).
    adopted: AtomicU32,
    kick: Kick,
    stop: AtomicBool,
}

/// The application entered an endpoint the agent serves, whose doorbell is
/// `bell`: disarmed if the agent had armed it to sleep, and the agent told
/// to go back to watching (else it would sleep on a bell that no longer
/// rings).
#[inline]
pub fn entered(bell: &Doorbell) {
    if bell.disarm() {
        kick();
    }
}

/// Wakes the agent (it then looks at its endpoints).
pub fn kick() {
    if let Some(agent) = AGENT.lock().as_ref() {
        agent.shared.kick.kick();
    }
}

/// `member` (an enabled endpoint of an agent domain) is served from now on;
/// the thread starts with the first.
pub fn join(member: &Arc<dyn Progress>) -> Result<(), String> {
    let mut slot = AGENT.lock();
    let pid = std::process::id();
    if slot.as_ref().is_some_and(|a| a.pid != pid) {
        // Inherited through fork: the parent's thread is not here.
        if let Some(mut stale) = slot.take() {
            stale.thread.take();
        }
    }
    if slot.is_none() {
        let shared = Arc::new(Shared {
            members: Mutex::new(Vec::new()),
            generation: AtomicU32::new(0),
            adopted: AtomicU32::new(u32::MAX),
            kick: Kick::new(),
            stop: AtomicBool::new(false),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("unimem-agent".into())
            .spawn(move || run(&for_thread))
            .map_err(|e| format!("cannot start the progress agent: {e}"))?;
        handover::start();
        tracing::info!("progress agent started");
        *slot = Some(Agent {
            shared,
            thread: Some(thread),
            pid,
        });
    }
    let agent = slot.as_ref().expect("made above");
    agent.shared.members.lock().push(Arc::clone(member));
    agent.shared.generation.fetch_add(1, Ordering::Release);
    agent.shared.kick.kick();
    Ok(())
}

/// `member` is closing: the agent lets go of it, and of its references
/// (the endpoint's bindings hold CQs and counters the application closes
/// next). Returns once the thread holds the members without it; it may
/// have been in a pass on it, which it finishes first.
pub fn leave(member: &Arc<dyn Progress>) {
    let shared = {
        let slot = AGENT.lock();
        let Some(agent) = slot.as_ref() else { return };
        if agent.pid != std::process::id() {
            return;
        }
        Arc::clone(&agent.shared)
    };
    let generation = {
        let mut members = shared.members.lock();
        members.retain(|m| !same(m, member));
        shared
            .generation
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1)
    };
    let until = std::time::Instant::now() + Duration::from_secs(5);
    // Adopted this generation or a later one.
    while shared
        .adopted
        .load(Ordering::Acquire)
        .wrapping_sub(generation)
        > u32::MAX / 2
    {
        if shared.stop.load(Ordering::Acquire) || std::time::Instant::now() >= until {
            tracing::warn!("the progress agent did not let go of a closing endpoint");
            return;
        }
        shared.kick.kick();
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Stops and joins the thread (the provider is being unloaded: no thread
/// of ours may run code that is about to be unmapped).
pub fn shutdown() {
    let agent = AGENT.lock().take();
    handover::stop();
    if let Some(mut agent) = agent {
        agent.shared.stop.store(true, Ordering::Release);
        agent.shared.kick.kick();
        if agent.pid == std::process::id() {
            if let Some(thread) = agent.thread.take() {
                // The process may be exiting on the agent's own thread (a
                // signal handler that calls exit ran on it): it cannot
                // join itself, and stops with the process.
                if thread.thread().id() != std::thread::current().id() {
                    let _ = thread.join();
                }
            }
        }
    }
}

fn run(shared: &Shared) {
    unimem_mailbox::cpu::float_off_the_application("the progress agent");
    let mut members: Vec<Arc<dyn Progress>> = Vec::new();
    let mut generation = u32::MAX;
    let mut last_activity = u64::MAX;
    let mut watch = WATCH;
    while !shared.stop.load(Ordering::Acquire) {
        let kick_seen = shared.kick.seen();
        let now = shared.generation.load(Ordering::Acquire);
        if now != generation {
            generation = now;
            members = shared.members.lock().clone();
            shared.adopted.store(generation, Ordering::Release);
        }
        let bells: Vec<&Doorbell> = members.iter().filter_map(|m| m.doorbell()).collect();
        let activity = handover::ACTIVITY.load(Ordering::Relaxed);
        let app_active = activity != last_activity;
        last_activity = activity;
        // While the application keeps calling, it progresses by itself:
        // look again soon (or when a bell rings: a blocking read armed it).
        let hold = if app_active { None } else { AgentHold::take() };
        let Some(hold) = hold else {
            let watched: Vec<_> = bells.iter().map(|b| (*b, b.seen())).collect();
            doorbell::wait_any(&watched, Some((&shared.kick, kick_seen)), Some(watch));
            watch = (watch * 2).min(WATCH_MAX);
            continue;
        };
        watch = WATCH;
        let mut left = Pending::default();
        let armed: Vec<_> = bells.iter().map(|b| (*b, b.arm())).collect();
        // A panic must neither kill the agent nor leave it holding.
        let passes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // At least twice (what came before the arming rang no bell);
            // then, while operations are in flight, on for a little while
            // as an interrupt handler turns to polling under load: the
            // next message of a transfer comes within microseconds, and
            // each wake-up would cost far more. An application call that
            // wants in ends it.
            let woke = std::time::Instant::now();
            let mut rounds = 0;
            loop {
                left = Pending::default();
                for member in &members {
                    left |= member.progress_for_agent();
                }
                rounds += 1;
                let more = left.message || left.local_work || left.busy;
                if rounds >= 2 && (!more || woke.elapsed() >= POLL || AgentHold::wanted()) {
                    break;
                }
            }
        }));
        drop(hold);
        if passes.is_err() {
            tracing::warn!("the progress agent's pass panicked; it goes on");
        }
        let timeout = if left.message || left.local_work {
            Some(LOCAL_WORK)
        } else if let Some(nic) = unimem_net::current() {
            // Messages from other hosts come through the network thread,
            // which rings no bell; while none is known, a first contact
            // may wait the network thread's own idle tick.
            Some(if nic.talks_to_other_hosts() {
                NETWORK
            } else {
                unimem_net::IDLE_TICK
            })
        } else if !doorbell::rings_reliable() {
            // Without membarrier a ring may be missed.
            Some(NETWORK)
        } else if left.busy || bells.len() < members.len() {
            Some(LIVENESS)
        } else {
            None
        };
        doorbell::wait_any(&armed, Some((&shared.kick, kick_seen)), timeout);
    }
}
