//! The engine's mover: with asynchronous copies on
//! ([`ShmDmaEngine::set_async_copies`](crate::ShmDmaEngine::set_async_copies)),
//! a transfer of at least the set length is copied by this thread while
//! its caller goes on, as Unimem's DMA engine moves data while the CPU
//! computes (a put posted before a computation is done when the
//! computation ends, not after it). One thread per process, off the
//! application's CPUs, started with the first such copy; it copies in
//! submission order and sleeps when there is nothing to copy.
//!
//! A copy is cut into chunks that whoever comes first takes: the mover,
//! and a caller that polls for the copy's completion again after the poll
//! of the call that submitted it (a program that waits right after
//! posting, or whose mover is not scheduled yet, gets its bytes no later
//! than had it copied them itself, and both copy at once; one that
//! computes between posting and waiting finds them moved).
//!
//! What keeps a copy's memory valid until it is done: the mapping of the
//! remote range and our region (held by the copy until its last chunk is
//! done), the owner's frees of the remote pages (held off by the pin, as
//! for a copy done inline), and the caller's buffer (libfabric's contract:
//! valid until the completion).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bytes one taker copies at a time.
const CHUNK: usize = 64 * 1024;

/// One copy, cut into chunks.
pub(crate) struct AsyncCopy {
    src: *const u8,
    dst: *mut u8,
    len: usize,
    chunks: usize,
    /// The next chunk to take, and how many are copied.
    next: AtomicUsize,
    finished: AtomicUsize,
    /// Polled once already (by the call that submitted it).
    polled: AtomicBool,
    /// What keeps the memory valid (mappings, the pin of the remote
    /// pages): dropped by whoever copies the last chunk.
    hold: Mutex<Option<Box<dyn Send>>>,
}

// SAFETY: the pointers reach memory that `hold` keeps mapped (and whose
// owner's frees its pin holds off) until the last chunk is copied, or
// that the caller keeps valid until then; the chunks are disjoint, each
// copied by the one taker that claimed it.
unsafe impl Send for AsyncCopy {}
// SAFETY: as for Send; the counters are atomic, `hold` behind a mutex.
unsafe impl Sync for AsyncCopy {}

impl AsyncCopy {
    /// # Safety
    /// `[src, src + len)` and `[dst, dst + len)` must not overlap and must
    /// stay valid until the copy is done: `hold` keeps what the caller
    /// does not.
    pub(crate) unsafe fn new(
        src: *const u8,
        dst: *mut u8,
        len: usize,
        hold: Box<dyn Send>,
    ) -> Arc<AsyncCopy> {
        Arc::new(AsyncCopy {
            src,
            dst,
            len,
            chunks: len.div_ceil(CHUNK).max(1),
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            polled: AtomicBool::new(false),
            hold: Mutex::new(Some(hold)),
        })
    }

    /// Whether every byte is at `dst`.
    pub(crate) fn done(&self) -> bool {
        self.finished.load(Ordering::Acquire) == self.chunks
    }

    /// Whether a poller should help: not on the first poll, which comes
    /// from the call that submitted the copy (the caller then goes on,
    /// maybe to compute), but on every later one (it waits for it).
    pub(crate) fn wanted(&self) -> bool {
        self.polled.swap(true, Ordering::Relaxed)
    }

    /// Copies chunks until none is left to take.
    pub(crate) fn work(&self) {
        loop {
            let chunk = self.next.fetch_add(1, Ordering::Relaxed);
            if chunk >= self.chunks {
                return;
            }
            let at = chunk * CHUNK;
            let len = CHUNK.min(self.len - at);
            // SAFETY: see AsyncCopy: chunk `chunk` lies inside both ranges, is
            // valid until `finished` reaches `chunks`, and is ours alone.
            unsafe { std::ptr::copy_nonoverlapping(self.src.add(at), self.dst.add(at), len) };
            if self.finished.fetch_add(1, Ordering::AcqRel) + 1 == self.chunks {
                self.hold.lock().take();
            }
        }
    }
}

/// How long the mover looks for the next copy before it sleeps.
const POLL: Duration = Duration::from_micros(50);

fn next_soon(queue: &Receiver<Arc<AsyncCopy>>) -> Option<Arc<AsyncCopy>> {
    let until = Instant::now() + POLL;
    let mut rounds = 0u32;
    loop {
        match queue.try_recv() {
            Ok(copy) => return Some(copy),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        rounds += 1;
        // Every 32 rounds: the clock, and the CPU to whoever waits for it.
        if rounds.is_multiple_of(32) {
            if Instant::now() >= until {
                return None;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

struct Mover {
    copies: Sender<Arc<AsyncCopy>>,
    /// The process that started the thread (a forked child has none).
    pid: u32,
}

static MOVER: Mutex<Option<Mover>> = Mutex::new(None);

/// Called on the mover thread after each copy (the provider wakes its
/// progress agent with it, which reaps the completion at once).
static ON_DONE: OnceLock<fn()> = OnceLock::new();

/// Sets what the mover calls after each copy (once per process; later
/// calls change nothing).
pub fn on_copy_done(hook: fn()) {
    let _ = ON_DONE.set(hook);
}

/// Hands `copy` to the mover thread; false if the thread cannot be
/// started (the caller then copies it itself).
pub(crate) fn submit(copy: &Arc<AsyncCopy>) -> bool {
    let mut slot = MOVER.lock();
    let pid = std::process::id();
    if slot.as_ref().is_none_or(|m| m.pid != pid) {
        let (copies, queue) = mpsc::channel::<Arc<AsyncCopy>>();
        let started = std::thread::Builder::new()
            .name("unimem-dma".into())
            .spawn(move || {
                unimem_mailbox::cpu::float_off_the_application("the DMA engine's mover");
                while let Ok(mut copy) = queue.recv() {
                    loop {
                        copy.work();
                        if let Some(hook) = ON_DONE.get() {
                            hook();
                        }
                        // The next copy of a stream or of a compute loop
                        // comes soon: looked for a while before sleeping
                        // (a wake-up costs more than the copy may last).
                        match next_soon(&queue) {
                            Some(next) => copy = next,
                            None => break,
                        }
                    }
                }
            });
        if let Err(e) = started {
            tracing::warn!("cannot start the DMA mover thread ({e}): copies are done inline");
            return false;
        }
        *slot = Some(Mover { copies, pid });
    }
    let mover = slot.as_ref().expect("set above");
    mover.copies.send(Arc::clone(copy)).is_ok()
}
