//! Blocking calls under manual progress (`fi_cq_sread`, `fi_cntr_wait`,
//! `fi_eq_sread`), shared by cq/, cntr.rs and eq.rs.
//!
//! Nothing completes unless someone polls, so a CQ or counter waits by
//! polling: progress, check, spin a little, then, with a wait object,
//! sleep on the doorbells of its endpoints' mailboxes ([`Sleepers`]: a
//! message for them, or a completion the progress agent wrote, wakes it),
//! else yield the CPU on every round (with more processes than cores a
//! spinning waiter would otherwise hold the core its peer needs). There is
//! no file descriptor to sleep on, which decides the wait objects we
//! accept:
//!
//! | wait_obj             | CQ, counter                 | EQ                  |
//! |----------------------|-----------------------------|---------------------|
//! | NONE, UNSPEC, YIELD  | yes (a progress/yield loop) | yes (condvar)       |
//! | FD                   | -FI_ENOSYS (*)              | yes (eventfd)       |
//! | SET, POLLFD          | -FI_ENOSYS (no wait sets)   | -FI_ENOSYS          |
//! | MUTEX_COND           | -FI_ENOSYS                  | -FI_ENOSYS          |
//!
//! (*) nothing would make the fd readable while the application sleeps
//! on it: completions only appear while it calls us. EQ events, by
//! contrast, are produced only by calls into the provider (`fi_eq_write`,
//! asynchronous AV inserts), so an EQ can keep an eventfd truthful.
//!
//! FI_WAIT_NONE forbids blocking reads in the API; we serve them anyway
//! (the loop needs no wait object), which is friendlier than failing.

use std::os::raw::c_int;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use unimem_mailbox::doorbell::{self, Kick};
use unimem_mailbox::node::monotonic_ns;

use crate::base::ffi::{self, Error};
use crate::base::handover;
use crate::state::agent;
use crate::state::progress::{Pending, ProgressList};

/// Why a request is refused: the error to return and the reason for
/// the caller's warning (logged by the caller, under its own subsystem).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: Error,
    pub reason: &'static str,
}

/// Validate `wait_obj` for a CQ or counter.
pub fn check_polled(wait_obj: ffi::fi_wait_obj) -> Result<(), Refused> {
    match wait_obj {
        ffi::FI_WAIT_NONE | ffi::FI_WAIT_UNSPEC | ffi::FI_WAIT_YIELD => Ok(()),
        ffi::FI_WAIT_FD | ffi::FI_WAIT_POLLFD => Err(Refused {
            code: Error::ENOSYS,
            reason: "FI_WAIT_FD/POLLFD not supported: with manual progress nothing would \
                     signal the fd; use FI_WAIT_UNSPEC or FI_WAIT_YIELD",
        }),
        ffi::FI_WAIT_SET | ffi::FI_WAIT_MUTEX_COND => Err(Refused {
            code: Error::ENOSYS,
            reason: "wait sets and FI_WAIT_MUTEX_COND are not supported",
        }),
        _ => Err(Refused {
            code: Error::EINVAL,
            reason: "unknown wait object",
        }),
    }
}

/// The wait object a polled CQ or counter reports for FI_GETWAITOBJ:
/// what it really does when blocking.
pub fn effective_polled(wait_obj: ffi::fi_wait_obj) -> ffi::fi_wait_obj {
    match wait_obj {
        ffi::FI_WAIT_NONE => ffi::FI_WAIT_NONE,
        _ => ffi::FI_WAIT_YIELD,
    }
}

/// End of a libfabric timeout in milliseconds (negative = never).
#[derive(Clone, Copy, Debug)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    pub fn after_ms(timeout: c_int) -> Self {
        Deadline(
            u64::try_from(timeout)
                .ok()
                .map(|ms| Instant::now() + Duration::from_millis(ms)),
        )
    }

    pub fn expired(&self) -> bool {
        self.0.is_some_and(|end| Instant::now() >= end)
    }

    pub fn instant(&self) -> Option<Instant> {
        self.0
    }

    /// Time left, `None` for never.
    pub fn remaining(&self) -> Option<Duration> {
        self.0
            .map(|end| end.saturating_duration_since(Instant::now()))
    }
}

/// Rounds of a timed spin between two yields of the CPU.
const YIELD_EVERY: usize = 32;

/// Spin `spins` rounds (and, in a blocking wait, for `wait_spin_us` while
/// this host has a CPU for every unimem process), then yield the CPU on
/// every further round or sleep.
///
/// A waiter that sleeps costs each message that wakes it a futex wake at
/// its sender and a trip through the scheduler at the waiter (several
/// microseconds here); OpenSHMEM's wait_until sleeps in `fi_cntr_wait` for
/// each remote write, so a put stream woke it once per put (0.96 against
/// 0.48 us per 32-byte put, a 2-PE barrier 27 against 3.4 us).
#[derive(Debug)]
pub struct Backoff {
    spins: usize,
    round: usize,
    /// Spins on until this time (monotonic ns); 0: rounds only.
    until_ns: u64,
}

impl Backoff {
    /// `spins` comes from the `spin_yield` tunable.
    pub fn new(spins: usize) -> Self {
        Backoff {
            spins,
            round: 0,
            until_ns: 0,
        }
    }

    /// For a blocking wait: `spins` rounds, and `spin_us` (the
    /// `wait_spin_us` tunable) unless the host runs more unimem processes
    /// than it has CPUs (the spinner would hold the core its peer needs).
    pub fn for_wait(spins: usize, spin_us: usize) -> Self {
        let until_ns = if spin_us == 0 || host_oversubscribed(true) {
            0
        } else {
            monotonic_ns().saturating_add(spin_us as u64 * 1_000)
        };
        Backoff {
            spins,
            round: 0,
            until_ns,
        }
    }

    /// Whether it still spins (the next snooze does not yield).
    pub fn spinning(&self) -> bool {
        self.round < self.spins || (self.until_ns != 0 && monotonic_ns() < self.until_ns)
    }

    pub fn snooze(&mut self) {
        if self.spinning() {
            self.round += 1;
            // Past its rounds, a timed spin lets a thread that waits for
            // this CPU run now and then (a DMA mover or progress agent
            // floated off its own rank's core: without this, a rank waiting
            // here held the core for a whole time slice).
            if self.round > self.spins && self.round.is_multiple_of(YIELD_EVERY) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
    }
}

/// The `idle_yield` tunable: when a polling read that found nothing gives
/// the CPU away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleYield {
    /// When this host runs more unimem processes than it has CPUs.
    Auto,
    Always,
    Never,
}

impl IdleYield {
    pub fn from_tunable(value: &str) -> IdleYield {
        match value {
            "always" => IdleYield::Always,
            "never" => IdleYield::Never,
            _ => IdleYield::Auto,
        }
    }
}

/// Empty non-blocking reads in a row, of one CQ.
///
/// MPI libraries wait by calling `fi_cq_read` in a tight loop. With a CPU per
/// process nothing is faster; with more processes than CPUs, the poller
/// burns the time slice that the process it waits for needs, and every
/// message then waits for the scheduler (milliseconds). So after `spins`
/// empty reads in a row, each further empty read yields the CPU, when the
/// policy says so.
///
/// A run of empty reads that lasts [`STALL_NS`] is a stall: `nothing` says
/// so once per run, and the CQ reports what its endpoints have in flight
/// (a job that hangs then says, in each process's log, what it waits for).
#[derive(Debug, Default)]
pub struct IdlePolls {
    empty: AtomicUsize,
    /// When the current run was first seen long (monotonic ns); 0: not yet.
    long_since: AtomicU64,
}

/// Empty reads between two looks at the clock for a stall.
const STALL_LOOK: usize = 1 << 16;
/// Nothing read for this long is a stall.
pub const STALL_NS: u64 = 10_000_000_000;

impl IdlePolls {
    pub fn found(&self) {
        if self.empty.load(Ordering::Relaxed) != 0 {
            self.empty.store(0, Ordering::Relaxed);
            self.long_since.store(0, Ordering::Relaxed);
        }
    }

    /// One more empty read; true once per run of them, when it has lasted
    /// [`STALL_NS`].
    pub fn nothing(&self, spins: usize, policy: IdleYield) -> bool {
        // A plain load and store, no locked add: the count only needs to be
        // about right when threads poll the same CQ at once.
        let empty = self.empty.load(Ordering::Relaxed);
        self.empty.store(empty.saturating_add(1), Ordering::Relaxed);
        let stalled = empty % STALL_LOOK == STALL_LOOK - 1 && self.stalled();
        if empty < spins {
            return stalled;
        }
        let yield_cpu = match policy {
            IdleYield::Always => true,
            IdleYield::Never => false,
            // The count is recounted every half second at most, and the
            // clock that says when is read every 64th empty read: MPI's
            // flush and wait loops read an empty CQ on every call.
            IdleYield::Auto => host_oversubscribed(empty.is_multiple_of(64)),
        };
        if yield_cpu {
            std::thread::yield_now();
        }
        stalled
    }

    /// At a look: whether the run just reached [`STALL_NS`].
    fn stalled(&self) -> bool {
        let now = monotonic_ns().max(1);
        let since = self.long_since.load(Ordering::Relaxed);
        if since == 0 {
            self.long_since.store(now, Ordering::Relaxed);
            return false;
        }
        // u64::MAX: reported for this run.
        if since != u64::MAX && now.saturating_sub(since) >= STALL_NS {
            self.long_since.store(u64::MAX, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// Whether this host runs more unimem processes than it has online CPUs;
/// counted again at most every half second, by whoever asks with `look`
/// (the others take the last count, without reading the clock).
fn host_oversubscribed(look: bool) -> bool {
    const RECOUNT_NS: u64 = 500_000_000;
    static OVERSUBSCRIBED: AtomicBool = AtomicBool::new(false);
    static NEXT_COUNT_NS: AtomicU64 = AtomicU64::new(0);
    if !look {
        return OVERSUBSCRIBED.load(Ordering::Relaxed);
    }
    let now = monotonic_ns();
    let due = NEXT_COUNT_NS.load(Ordering::Relaxed);
    if now >= due
        && NEXT_COUNT_NS
            .compare_exchange(due, now + RECOUNT_NS, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
        let processes = unimem_dma::host_nodes();
        let over = processes > cpus;
        if over != OVERSUBSCRIBED.swap(over, Ordering::Relaxed) {
            tracing::info!(processes, cpus, "idle polls yield the CPU: {over}");
        }
    }
    OVERSUBSCRIBED.load(Ordering::Relaxed)
}

/// `fi_control` of CQs and counters (FI_GETWAITOBJ, FI_GETWAIT). A
/// refusal's reason goes to `warn`, the caller's (which logs under its own
/// subsystem); FI_GETWAIT's FI_ENODATA is an answer, not warned.
///
/// # Safety
/// `arg` must be NULL or valid for the command (`enum fi_wait_obj *` for
/// FI_GETWAITOBJ).
pub unsafe fn polled_control(
    wait_obj: ffi::fi_wait_obj,
    command: c_int,
    arg: *mut std::ffi::c_void,
    warn: impl FnOnce(&'static str),
) -> Result<(), Error> {
    match command as u32 {
        ffi::FI_GETWAITOBJ => {
            if arg.is_null() {
                warn("NULL argument");
                return Err(Error::EINVAL);
            }
            // SAFETY: FI_GETWAITOBJ's argument is an `enum fi_wait_obj *` (caller).
            unsafe { *(arg as *mut ffi::fi_wait_obj) = effective_polled(wait_obj) };
            Ok(())
        }
        // No fd or mutex to hand out: see the module table.
        ffi::FI_GETWAIT => Err(Error::ENODATA),
        _ => {
            warn("command not supported");
            Err(Error::ENOSYS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_objects() {
        for ok in [ffi::FI_WAIT_NONE, ffi::FI_WAIT_UNSPEC, ffi::FI_WAIT_YIELD] {
            assert_eq!(check_polled(ok), Ok(()));
        }
        for no in [
            ffi::FI_WAIT_FD,
            ffi::FI_WAIT_SET,
            ffi::FI_WAIT_MUTEX_COND,
            ffi::FI_WAIT_POLLFD,
        ] {
            assert_eq!(check_polled(no).map_err(|r| r.code), Err(Error::ENOSYS));
        }
        assert_eq!(check_polled(99).map_err(|r| r.code), Err(Error::EINVAL));
        assert_eq!(effective_polled(ffi::FI_WAIT_UNSPEC), ffi::FI_WAIT_YIELD);
    }

    #[test]
    fn deadlines() {
        assert!(!Deadline::after_ms(-1).expired());
        assert!(Deadline::after_ms(-1).instant().is_none());
        assert!(Deadline::after_ms(0).expired());
        // Not expired long before its time (a short deadline could pass
        // before the check on a loaded machine)...
        assert!(!Deadline::after_ms(60_000).expired());
        // ...expired once its time has passed (the sleep is what is tested).
        let d = Deadline::after_ms(20);
        std::thread::sleep(Duration::from_millis(25));
        assert!(d.expired());
    }

    #[test]
    fn backoff_spins_then_yields() {
        let mut b = Backoff::new(2);
        for _ in 0..5 {
            b.snooze();
        }
        assert_eq!(b.round, 2);
    }

    #[test]
    fn a_wait_spins_for_its_time_then_yields() {
        // Whether the host counts as oversubscribed depends on the unimem
        // processes of other tests: both cases are checked. The clock
        // starts before the wait's deadline is set: started after, a
        // preemption between the two made the spin look shorter than it
        // was (seen once in a suite run).
        let start = Instant::now();
        let mut b = Backoff::for_wait(2, 2_000);
        if b.until_ns == 0 {
            assert!(host_oversubscribed(true));
            return;
        }
        while b.spinning() {
            b.snooze();
        }
        assert!(start.elapsed() >= Duration::from_millis(2));
        assert!(b.round > 2);
        assert!(!Backoff::for_wait(0, 0).spinning());
    }
}

/// Threads asleep in a blocking call of one CQ or counter (`fi_cq_sread`,
/// `fi_cntr_wait`): they sleep on the doorbells of the domain's endpoints
/// and on a kick, which whatever makes them ready (an entry or count the
/// progress agent wrote, `fi_cq_signal`) gives.
#[derive(Debug, Default)]
pub struct Sleepers {
    count: AtomicU32,
    kick: Kick,
}

impl Sleepers {
    pub fn new() -> Sleepers {
        Sleepers::default()
    }

    /// Wakes the sleepers, if any; called after the change that makes them
    /// ready. `agent`: another thread (the progress agent) may make it,
    /// so the change is fenced before the look at the sleepers, as they
    /// count themselves before their look at what they wait for.
    pub fn wake(&self, agent: bool) {
        if agent {
            fence(Ordering::SeqCst);
        }
        if self.count.load(Ordering::Relaxed) != 0 {
            self.kick.kick();
        }
    }

    /// Sleeps until a message comes for one of `progress`'s endpoints, a
    /// wake, or the deadline, unless `ready` says there is no need;
    /// `false` (at once) if an endpoint's mailbox is not wakeable (the
    /// caller then yields in its loop). Sleeps in slices, shorter while
    /// work is left that no message announces.
    pub fn sleep(
        &self,
        progress: &ProgressList,
        ready: impl Fn() -> bool,
        deadline: &Deadline,
    ) -> bool {
        let members = progress.members();
        if members.iter().any(|m| m.doorbell().is_none()) {
            return false;
        }
        let armed: Vec<_> = members
            .iter()
            .filter_map(|m| m.doorbell())
            .map(|bell| (bell, bell.arm()))
            .collect();
        let kick_seen = self.kick.seen();
        self.count.fetch_add(1, Ordering::SeqCst);
        let mut pending = Pending::default();
        for member in &members {
            pending |= member.pending();
        }
        if !ready() && !pending.message {
            let slice = if pending.local_work || !doorbell::rings_reliable() {
                Duration::from_micros(100)
            } else if pending.busy {
                Duration::from_millis(10)
            } else {
                Duration::from_millis(100)
            };
            let timeout = deadline.remaining().map_or(slice, |left| left.min(slice));
            // Asleep, the thread is out of the provider: the agent may
            // progress meanwhile (and wake us with what it wrote).
            handover::outside(|| {
                doorbell::wait_any(&armed, Some((&self.kick, kick_seen)), Some(timeout))
            });
        }
        self.count.fetch_sub(1, Ordering::Relaxed);
        // The progress agent may have armed the same bells: disarmed, they
        // would not wake it, so it is kicked to look (as an application
        // call that finds them armed does).
        for (bell, _) in &armed {
            agent::entered(bell);
        }
        true
    }
}
