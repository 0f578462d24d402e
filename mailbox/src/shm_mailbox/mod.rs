//! The shared-memory emulation of the virtualized mailbox.
//!
//! Each mailbox is one shared object: a header page, then a ring of
//! `depth` 64-byte slots. Senders and the receiver agree through one atomic
//! word per slot that holds the slot's ticket (its position in the stream),
//! its state and, while a sender writes it, that sender's pid:
//!
//! ```text
//!   FREE(pos) --sender CAS--> CLAIMED(pos, pid) --sender store--> FULL(pos)
//!       ^                                                            |
//!       +------------------ receiver store: FREE(pos + depth) <------+
//! ```
//!
//! A sender claims the slot at the shared tail with one CAS, so a full ring
//! shows as a slot still holding the previous lap: the send reports *busy*
//! and never waits. The receiver reads slots in ticket order, so messages of
//! one sender arrive in the order they were sent, and a slot is read only
//! after its FULL store (Release/Acquire), so no message is ever torn. Because
//! the claimer's pid sits in the slot, a sender killed in the middle of a
//! send cannot wedge the ring: the receiver skips a slot whose claimer died.
//!
//! Every process that may send can write anything into the ring, so nothing
//! in it is trusted, and the checks cost nothing on the common path (they
//! sit on branches a sound ring never takes):
//! - the receiver expects its head slot to hold its head ticket, free (no
//!   pid), claimed (by a nonzero pid) or full; any other word is corrupt:
//!   the slot is skipped with a rate-limited warning ([`ShmMailbox::poll`]);
//! - a visibility time further ahead than the receiver's modeled latency is
//!   corrupt: the message is delivered now instead of never;
//! - a sender that finds the tail more than a lap away from the tickets in
//!   the slots (a corrupted tail) rebuilds it from the slots, where the next
//!   free ticket is the lowest free one, instead of spinning or reporting a
//!   full ring forever ([`resync_tail`]);
//! - the depth in the header is checked against the object's real size
//!   when a sender maps the ring, and never read again.
//!
//! Here: the mailbox and its peers, sends and polls. `ring.rs` holds the
//! shared layout (the slot word, the ring) and the repair of a corrupted
//! tail, `recover.rs` how the receiver passes a head slot it must not wait
//! for.

mod recover;
mod ring;

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Once};

use crate::addr::MailboxAddr;
use crate::doorbell::{self, Doorbell};
use crate::node::{monotonic_ns, JobId, NodeId};
use crate::profile::Profile;
use crate::shm::{object_name, reclaim_dead_objects};
use crate::{Error, Mailbox, Message, MESSAGE_LEN};

use ring::{advance_tail, resync_tail, state, state_kind, state_pid, state_pos, Ring};
use ring::{CLAIMED, FREE, FULL};

/// Largest ring the emulation accepts, in slots.
pub const MAX_DEPTH: usize = 1 << 20;
/// Tail rebuilds one send may do before it reports the ring busy (a ring
/// corrupt beyond repair must not keep a sender spinning).
const MAX_RESYNCS: u32 = 2;
/// How often a sender facing a full ring checks that the receiver lives.
const LIVENESS_CHECK_NS: u64 = 1_000_000;

/// Configuration of a shared-memory mailbox.
#[derive(Clone, Debug)]
pub struct ShmMailboxConfig {
    pub job: JobId,
    /// Ring depth in messages, rounded up to a power of two.
    pub depth: usize,
    pub profile: Profile,
}

impl Default for ShmMailboxConfig {
    fn default() -> Self {
        ShmMailboxConfig {
            job: JobId::from_name("default"),
            depth: 1024,
            profile: Profile::Native,
        }
    }
}

// --- Receiver ----------------------------------------------------------------

/// A mailbox owned by this process: it receives, and sends to peers.
pub struct ShmMailbox {
    ring: Ring,
    addr: MailboxAddr,
    head: u32,
    latency_ns: u64,
    /// A slot read by the last poll and not yet handed back to senders.
    consumed: Option<u32>,
    /// Polls in a row that found the head slot claimed but unfinished, and
    /// when this stall was first timed.
    claimed_polls: u32,
    stalled_since: Option<(u32, u64)>,
    abandoned: u64,
    corrupt: u64,
    /// This process's pid, which our claims on peers' slots carry (not the
    /// address's: a service address has none, and a claim without a pid
    /// is a corrupt word to its receiver).
    pid: u32,
}

static RECLAIM_AT_START: Once = Once::new();
static NEXT_INDEX: AtomicU32 = AtomicU32::new(0);

impl ShmMailbox {
    /// Opens a new mailbox with an address of its own.
    pub fn open(config: &ShmMailboxConfig) -> Result<ShmMailbox, Error> {
        let node = NodeId::current(config.job);
        loop {
            let addr = MailboxAddr {
                node,
                index: NEXT_INDEX.fetch_add(1, Ordering::Relaxed),
            };
            match Self::create(config, addr) {
                // A live process of ours (before a fork) took the name.
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                other => return other,
            }
        }
    }

    /// Opens the well-known mailbox of `service` (see
    /// [`MailboxAddr::for_service`]). Fails with `AddrInUse` if a live
    /// process already serves it.
    pub fn open_service(config: &ShmMailboxConfig, service: &str) -> Result<ShmMailbox, Error> {
        Self::create(config, MailboxAddr::for_service(config.job, service))
    }

    fn create(config: &ShmMailboxConfig, addr: MailboxAddr) -> Result<ShmMailbox, Error> {
        if config.depth == 0 || config.depth > MAX_DEPTH {
            return Err(Error::Invalid);
        }
        RECLAIM_AT_START.call_once(|| {
            let reclaimed = reclaim_dead_objects();
            if reclaimed > 0 {
                tracing::info!(reclaimed, "removed shared objects left by dead processes");
            }
        });
        let depth = config.depth.next_power_of_two().max(2);
        let latency_ns = config.profile.timing().mailbox_latency_ns;
        // A process with a mailbox sends: its sends skip the fence of a
        // wakeable peer's doorbell once registered (see `doorbell`).
        doorbell::register_sender();
        let name = object_name(addr.node.job, &addr.object_tail());
        let ring = Ring::create(&name, depth, latency_ns)?;
        tracing::debug!(%addr, depth, "mailbox opened");
        Ok(ShmMailbox {
            ring,
            addr,
            head: 0,
            latency_ns,
            consumed: None,
            claimed_polls: 0,
            stalled_since: None,
            abandoned: 0,
            corrupt: 0,
            pid: std::process::id(),
        })
    }

    pub fn depth(&self) -> usize {
        self.ring.depth() as usize
    }

    /// A handle on the doorbell, for threads that sleep until a message
    /// comes (see [`crate::doorbell`]).
    pub fn doorbell(&self) -> Doorbell {
        Doorbell::new(Arc::clone(&self.ring.object))
    }

    /// Claims slot `pos` of `ring` and puts `message` in it; else the
    /// ticket the slot holds.
    #[inline]
    fn claim(&self, ring: &Ring, pos: u32, message: &Message) -> Result<(), u32> {
        let slot = ring.slot(pos);
        // Claim at once rather than load first: a load would fetch the
        // line from the receiver's cache shared, the CAS then again to own.
        if let Err(seen) = slot.state.compare_exchange(
            state(pos, FREE, 0),
            self.claim_word(pos),
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            return Err(state_pos(seen));
        }
        let visible_at = match ring.header().latency_ns.load(Ordering::Relaxed) {
            0 => 0,
            latency => monotonic_ns().saturating_add(latency),
        };
        // SAFETY: we hold the claim on this slot: no other sender
        // writes it and the receiver reads it only once FULL.
        unsafe {
            *slot.visible_at.get() = visible_at;
            *slot.source.get() = self.addr.to_bytes();
            *slot.message.get() = *message;
        }
        slot.state.store(state(pos, FULL, 0), Ordering::Release);
        // The tail only guides other senders (one finding this slot taken
        // moves it on): publishing first takes a locked instruction off
        // the receiver's critical path.
        advance_tail(ring.tail(), pos);
        let bell = doorbell::line(&ring.object);
        if bell.wakeable.load(Ordering::Relaxed) != 0 {
            doorbell::ring_if_armed(bell);
        }
        Ok(())
    }

    /// A send whose claim of ticket `pos` found the slot holding ticket
    /// `seen`: moves on as far as the ring allows (see `send`).
    #[inline(never)]
    fn send_contended(
        &self,
        peer: &ShmPeer,
        message: &Message,
        mut pos: u32,
        mut seen: u32,
    ) -> Result<(), Error> {
        let ring = &peer.ring;
        let tail = ring.tail();
        let mut resyncs = 0;
        loop {
            let behind = pos.wrapping_sub(seen) as i32;
            if behind > 0 {
                if behind as u32 != ring.depth() && resyncs < MAX_RESYNCS {
                    // Not the previous lap: the tail is corrupt.
                    resyncs += 1;
                    resync_tail(ring, pos);
                } else {
                    // The slot still holds the previous lap: the ring is
                    // full.
                    if peer.owner_gone() {
                        return Err(Error::Dead);
                    }
                    return Err(Error::Busy);
                }
            } else if seen.wrapping_sub(pos) > ring.depth() {
                // More than a lap ahead of the tail: the tail is corrupt
                // (stepping it on one ticket at a time could take 2^31
                // turns).
                if resyncs == MAX_RESYNCS {
                    return Err(Error::Busy);
                }
                resyncs += 1;
                resync_tail(ring, pos);
            } else {
                // Ticket `pos` is taken (or, if the slot is already in a
                // later lap, long done): make sure the tail has moved past
                // it, and retry with the tail as it is now.
                advance_tail(tail, pos);
            }
            pos = tail.load(Ordering::Relaxed);
            match self.claim(ring, pos, message) {
                Ok(()) => return Ok(()),
                Err(now) => seen = now,
            }
        }
    }

    /// What our claim on a peer's slot `pos` holds while we write it.
    #[inline]
    fn claim_word(&self, pos: u32) -> u64 {
        state(pos, CLAIMED, self.pid)
    }

    /// Messages skipped because their sender died while writing them.
    pub fn abandoned(&self) -> u64 {
        self.abandoned
    }

    /// Hands the slot of the previous message back to senders. Done at the
    /// next poll rather than at once: the store then overlaps the wait for
    /// the next message instead of delaying whatever the caller does with
    /// this one (a reply's CAS would have to wait for it).
    #[inline]
    fn release_consumed(&mut self) {
        if let Some(pos) = self.consumed.take() {
            let next = pos.wrapping_add(self.ring.depth());
            self.ring
                .slot(pos)
                .state
                .store(state(next, FREE, 0), Ordering::Release);
        }
    }

    /// Slots skipped because their state word was corrupt.
    pub fn corrupt_slots(&self) -> u64 {
        self.corrupt
    }
}

impl Drop for ShmMailbox {
    fn drop(&mut self) {
        tracing::debug!(addr = %self.addr, "mailbox closed");
    }
}

// --- Sender side -------------------------------------------------------------

/// A connection to a peer's mailbox: its mapping, kept open for sends.
pub struct ShmPeer {
    ring: Ring,
    addr: MailboxAddr,
    last_liveness_check: AtomicU64,
    /// The messenger's liveness checks of this peer so far: one in
    /// [`THOROUGH_CHECK_EVERY`] reads the owner's start time.
    checks: AtomicU32,
}

/// How often a peer's periodic liveness check is the thorough one (the
/// owner's start time and state from /proc, which tell a reused pid and a
/// dead process its parent has not reaped yet); the others are one
/// `kill(pid, 0)`: checks run in the application's progress calls, every
/// 100 ms by default, for every peer, and six microseconds of /proc per
/// peer is jitter on its critical path. A peer whose process is gone is
/// seen at the next check; one that lingers as a zombie, at the next
/// thorough one.
const THOROUGH_CHECK_EVERY: u32 = 8;

impl ShmPeer {
    pub fn addr(&self) -> MailboxAddr {
        self.addr
    }

    fn owner_gone(&self) -> bool {
        crate::fault::report();
        let header = self.ring.object.header();
        if header.is_closed() {
            return true;
        }
        let now = monotonic_ns();
        let last = self.last_liveness_check.load(Ordering::Relaxed);
        if now.saturating_sub(last) < LIVENESS_CHECK_NS {
            return false;
        }
        self.last_liveness_check.store(now, Ordering::Relaxed);
        header.owner_gone()
    }
}

impl Mailbox for ShmMailbox {
    type Addr = MailboxAddr;
    type Peer = ShmPeer;

    fn addr(&self) -> MailboxAddr {
        self.addr
    }

    fn connect(&self, dest: &MailboxAddr) -> Result<ShmPeer, Error> {
        // Shared memory reaches this host only.
        if dest.node.job != self.addr.node.job || dest.node.is_remote() {
            return Err(Error::Invalid);
        }
        let name = object_name(dest.node.job, &dest.object_tail());
        let ring = Ring::open(&name).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => Error::Invalid,
            Some(libc::ECONNREFUSED) => Error::Dead,
            _ => Error::Io(e),
        })?;
        let header = ring.object.header();
        // The address names one incarnation of a process: a later process
        // that reused the pid is not the peer the caller meant.
        if !dest.is_service() && header.owner_pid() != dest.node.pid {
            return Err(Error::Invalid);
        }
        if !dest.is_service() && !dest.node.is_alive() {
            return Err(Error::Dead);
        }
        Ok(ShmPeer {
            ring,
            addr: *dest,
            last_liveness_check: AtomicU64::new(monotonic_ns()),
            checks: AtomicU32::new(0),
        })
    }

    /// The first claim, inline where the protocol sends: the tail's slot
    /// is nearly always free. Anything else (taken, a full ring, a corrupt
    /// tail) goes on in [`ShmMailbox::send_contended`].
    #[inline]
    fn send(&self, peer: &ShmPeer, message: &Message) -> Result<(), Error> {
        let ring = &peer.ring;
        // One load of a read-mostly line: a closed mailbox takes no message.
        if ring.object.header().is_closed() {
            return Err(Error::Dead);
        }
        let pos = ring.tail().load(Ordering::Relaxed);
        match self.claim(ring, pos, message) {
            Ok(()) => Ok(()),
            Err(seen) => self.send_contended(peer, message, pos, seen),
        }
    }

    fn poll(&mut self) -> Option<(MailboxAddr, Message)> {
        self.release_consumed();
        loop {
            let slot = self.ring.slot(self.head);
            let word = slot.state.load(Ordering::Acquire);
            if state_pos(word) != self.head {
                // A sound ring always holds our head ticket here.
                self.skip_corrupt(word);
                continue;
            }
            match state_kind(word) {
                FULL if state_pid(word) == 0 => {}
                CLAIMED if state_pid(word) != 0 => {
                    if self.check_stalled_claim(word) {
                        continue;
                    }
                    return None;
                }
                FREE if word == state(self.head, FREE, 0) => return None,
                _ => {
                    self.skip_corrupt(word);
                    continue;
                }
            }
            // SAFETY: the slot is FULL for our head ticket: its sender is done
            // with it and no one else writes it until we free it below.
            let (visible_at, source, message) = unsafe {
                (
                    *slot.visible_at.get(),
                    *slot.source.get(),
                    *slot.message.get(),
                )
            };
            if visible_at != 0 {
                let now = monotonic_ns();
                // A sender stamps now + our latency: a time further ahead
                // is corrupt, and would hold the ring forever.
                if now < visible_at && visible_at - now <= self.latency_ns {
                    return None;
                }
            }
            self.consumed = Some(self.head);
            self.head = self.head.wrapping_add(1);
            self.stalled_since = None;
            self.claimed_polls = 0;
            return Some((MailboxAddr::from_bytes(&source), message));
        }
    }

    fn has_message(&self) -> bool {
        // Our head slot in our lap, claimed or full: one load of a line a
        // sender writes only when it has something for us.
        // Anything but our free head slot: a message, or a corrupt word
        // that only `poll` can clear (a sound ring never holds another lap
        // at the head).
        let word = self.ring.slot(self.head).state.load(Ordering::Acquire);
        word != state(self.head, FREE, 0)
    }

    fn peer_alive(&self, peer: &ShmPeer) -> bool {
        crate::fault::report();
        let header = peer.ring.object.header();
        let checks = peer.checks.fetch_add(1, Ordering::Relaxed);
        if checks.is_multiple_of(THOROUGH_CHECK_EVERY) {
            !header.owner_gone()
        } else {
            !header.owner_gone_quick()
        }
    }
}

// The latency model is configured by the receiver, in its header: a sender
// stamps each message with the receiver's modeled delay.
impl ShmMailbox {
    /// The modeled one-way latency of this mailbox (0 for `native`).
    pub fn latency_ns(&self) -> u64 {
        self.latency_ns
    }
}

const _: () = assert!(MESSAGE_LEN == 24);
#[cfg(test)]
mod tests {
    use super::recover::CLAIM_STALL_NS;
    use super::*;

    fn config(tag: &str, depth: usize) -> ShmMailboxConfig {
        ShmMailboxConfig {
            job: JobId::from_name(&format!("mbx-unit-{tag}-{}", std::process::id())),
            depth,
            profile: Profile::Native,
        }
    }

    fn message(n: u64) -> Message {
        let mut m = [0u8; MESSAGE_LEN];
        m[..8].copy_from_slice(&n.to_le_bytes());
        m[16..].copy_from_slice(&(!n).to_le_bytes());
        m
    }

    #[test]
    fn send_to_self_in_order_then_busy() {
        let mut mbx = ShmMailbox::open(&config("self", 4)).unwrap();
        let me = mbx.connect(&mbx.addr()).unwrap();
        assert!(!mbx.has_message());
        for n in 0..4 {
            mbx.send(&me, &message(n)).unwrap();
            assert!(mbx.has_message());
        }
        assert!(matches!(mbx.send(&me, &message(99)), Err(Error::Busy)));
        for n in 0..4 {
            let (src, m) = mbx.poll().unwrap();
            assert_eq!(src, mbx.addr());
            assert_eq!(m, message(n));
        }
        assert!(mbx.poll().is_none());
        assert!(!mbx.has_message());
        // Wraps around many laps.
        for n in 0..1000 {
            mbx.send(&me, &message(n)).unwrap();
            assert_eq!(mbx.poll().unwrap().1, message(n));
        }
    }

    #[test]
    fn an_armed_doorbell_wakes_its_sleeper_on_the_next_message() {
        use crate::doorbell::wait_any;
        use std::time::{Duration, Instant};
        let mut mbx = ShmMailbox::open(&config("bell", 8)).unwrap();
        mbx.doorbell().make_wakeable();
        let sender = ShmMailbox::open(&config("bell", 8)).unwrap();
        let route = sender.connect(&mbx.addr()).unwrap();
        let bell = mbx.doorbell();
        // Not armed: a send does not ring.
        let before = bell.arm();
        bell.disarm();
        sender.send(&route, &message(1)).unwrap();
        assert!(!bell.rang(before));
        assert_eq!(mbx.poll().unwrap().1, message(1));
        // Armed, nothing waiting: the sleeper wakes on the send of another
        // thread, long before its timeout.
        let armed = bell.arm();
        assert!(!mbx.has_message());
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                sender.send(&route, &message(2)).unwrap();
                // Only the first send after the arming rings.
                sender.send(&route, &message(3)).unwrap();
            });
            wait_any(&[(&bell, armed)], None, Some(Duration::from_secs(10)));
        });
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(bell.rang(armed));
        assert_eq!(mbx.poll().unwrap().1, message(2));
        assert_eq!(mbx.poll().unwrap().1, message(3));
        // Rung once: the count moved by one.
        let after = bell.arm();
        assert_eq!(after, crate::doorbell::Armed::after(armed));
        // A ring that came before the sleep returns at once.
        sender.send(&route, &message(4)).unwrap();
        let started = Instant::now();
        wait_any(&[(&bell, after)], None, Some(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_mailbox_that_is_not_wakeable_is_never_rung() {
        let mbx = ShmMailbox::open(&config("nobell", 8)).unwrap();
        let route = mbx.connect(&mbx.addr()).unwrap();
        let bell = mbx.doorbell();
        assert!(!bell.is_wakeable());
        let armed = bell.arm();
        mbx.send(&route, &message(1)).unwrap();
        assert!(!bell.rang(armed));
    }

    #[test]
    fn depth_rounds_up() {
        let mbx = ShmMailbox::open(&config("depth", 5)).unwrap();
        assert_eq!(mbx.depth(), 8);
        assert!(matches!(
            ShmMailbox::open(&config("zero", 0)),
            Err(Error::Invalid)
        ));
    }

    #[test]
    fn closed_peer_is_dead() {
        let a = ShmMailbox::open(&config("closed", 4)).unwrap();
        let b = ShmMailbox::open(&config("closed", 4)).unwrap();
        let to_b = a.connect(&b.addr()).unwrap();
        let b_addr = b.addr();
        drop(b);
        assert!(matches!(a.send(&to_b, &message(1)), Err(Error::Dead)));
        assert!(!a.peer_alive(&to_b));
        assert!(matches!(a.connect(&b_addr), Err(Error::Invalid)));
    }

    #[test]
    fn service_mailbox_is_exclusive() {
        let cfg = config("svc", 4);
        let server = ShmMailbox::open_service(&cfg, "9228").unwrap();
        assert!(server.addr().is_service());
        let err = ShmMailbox::open_service(&cfg, "9228").err().unwrap();
        assert!(matches!(err, Error::Io(e) if e.kind() == io::ErrorKind::AlreadyExists));
        let client = ShmMailbox::open(&cfg).unwrap();
        let to_server = client
            .connect(&MailboxAddr::for_service(cfg.job, "9228"))
            .unwrap();
        client.send(&to_server, &message(7)).unwrap();
        let mut server = server;
        let (src, m) = server.poll().unwrap();
        assert_eq!((src, m), (client.addr(), message(7)));
    }

    /// A service address carries no pid, but its owner's claims do: the
    /// receiver waits for a claimed slot of a service sender instead of
    /// taking it for corrupt and skipping it (the message was lost and
    /// `fi_rdm_pingpong -s` hung when the sender was preempted mid-send).
    #[test]
    fn claim_of_a_service_sender_is_waited_for() {
        let cfg = config("svc-claim", 4);
        let server = ShmMailbox::open_service(&cfg, "9229").unwrap();
        assert!(server.addr().is_service());
        let mut client = ShmMailbox::open(&cfg).unwrap();
        let to_client = server.connect(&client.addr()).unwrap();
        // The server claimed slot 0 and has not filled it yet.
        to_client
            .ring
            .slot(0)
            .state
            .store(server.claim_word(0), Ordering::SeqCst);
        to_client.ring.tail().store(1, Ordering::SeqCst);
        server.send(&to_client, &message(2)).unwrap();
        for _ in 0..10_000 {
            assert!(client.poll().is_none(), "overtook a claimed slot");
        }
        assert_eq!(client.corrupt, 0, "a sound claim taken for corrupt");
        // SAFETY: the claim above is ours (the test plays the server).
        unsafe {
            *to_client.ring.slot(0).source.get() = server.addr().to_bytes();
            *to_client.ring.slot(0).message.get() = message(1);
        }
        to_client
            .ring
            .slot(0)
            .state
            .store(state(0, FULL, 0), Ordering::Release);
        assert_eq!(client.poll().unwrap(), (server.addr(), message(1)));
        assert_eq!(client.poll().unwrap(), (server.addr(), message(2)));
    }

    #[test]
    fn paper_profile_delays_visibility() {
        let mut cfg = config("paper", 4);
        cfg.profile = Profile::Paper;
        let mut mbx = ShmMailbox::open(&cfg).unwrap();
        let me = mbx.connect(&mbx.addr()).unwrap();
        let sent = monotonic_ns();
        mbx.send(&me, &message(1)).unwrap();
        while mbx.poll().is_none() {}
        assert!(monotonic_ns() - sent >= 1_000);
    }

    /// A sender that dies between claiming a slot and filling it must not
    /// wedge the ring; one that is merely slow must not lose its message.
    #[test]
    fn claimed_slot_of_dead_sender_is_skipped() {
        let mut mbx = ShmMailbox::open(&config("stall", 4)).unwrap();
        let me = mbx.connect(&mbx.addr()).unwrap();
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = exited.id();
        exited.wait().unwrap();

        // Slot 0 claimed by the process that is now gone.
        me.ring
            .slot(0)
            .state
            .store(state(0, CLAIMED, dead_pid), Ordering::SeqCst);
        me.ring.tail().store(1, Ordering::SeqCst);
        mbx.send(&me, &message(1)).unwrap();
        let started = monotonic_ns();
        let (_, m) = loop {
            if let Some(received) = mbx.poll() {
                break received;
            }
            assert!(
                monotonic_ns() - started < 1_000_000_000,
                "ring stayed wedged"
            );
        };
        assert_eq!(m, message(1));
        assert_eq!(mbx.abandoned(), 1);

        // Slot 2 claimed by a live sender (us): the message behind it waits.
        let pos = 2;
        me.ring
            .slot(pos)
            .state
            .store(state(pos, CLAIMED, std::process::id()), Ordering::SeqCst);
        me.ring.tail().store(pos + 1, Ordering::SeqCst);
        mbx.send(&me, &message(3)).unwrap();
        let until = monotonic_ns() + 3 * CLAIM_STALL_NS;
        while monotonic_ns() < until {
            assert!(mbx.poll().is_none(), "overtook a live sender's slot");
        }
        // SAFETY: we hold the claim we just made.
        unsafe { *me.ring.slot(pos).message.get() = message(2) };
        me.ring
            .slot(pos)
            .state
            .store(state(pos, FULL, 0), Ordering::Release);
        assert_eq!(mbx.poll().unwrap().1, message(2));
        assert_eq!(mbx.poll().unwrap().1, message(3));
        assert_eq!(mbx.abandoned(), 1);
    }

    #[test]
    fn other_job_is_invalid() {
        let a = ShmMailbox::open(&config("job-a", 4)).unwrap();
        let b = ShmMailbox::open(&config("job-b", 4)).unwrap();
        assert!(matches!(a.connect(&b.addr()), Err(Error::Invalid)));
    }
}
