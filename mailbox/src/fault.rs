//! Containment of SIGBUS from shared objects that another process shrank.
//!
//! Any process of our user may `ftruncate` an object we map (a broken or
//! hostile peer; the kernel allows it to whoever may write the file), and
//! the next touch of a page past the new end raises SIGBUS. Seals would
//! forbid the truncation, but only on memory file descriptors, which
//! peers would have to reach through `/proc/<pid>/fd` (a change of every
//! object's naming, lifecycle and clean-up, left for later). What we do
//! instead, as Wayland compositors do for their clients' buffers: every
//! shared mapping is *registered* here, and a SIGBUS handler that finds the
//! faulting address inside a registered mapping replaces that whole mapping
//! with private anonymous memory (zeros) and returns; the access is
//! retried and succeeds. An object's mapping that was replaced so gets a
//! header that says "closed", so peers take its owner for gone and its
//! users fail their operations with it (`FI_EHOSTUNREACH`) instead of
//! dying. A fault anywhere else is not ours: the previous disposition of
//! SIGBUS is put back and the access faults again into it.
//!
//! Nothing here runs on a message's path: registration happens when an
//! object or range is mapped, the handler only on a fault.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// Mappings that can be protected at once; beyond, a mapping is not (one
/// debug line), and a truncation of it faults as before.
const SLOTS: usize = 8192;

static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Whether the mapping starts with an object header (which the handler
/// marks closed).
static HEADERS: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// Mappings replaced by the handler so far.
static REPLACED: AtomicU64 = AtomicU64::new(0);
/// How many of them were reported.
static REPORTED: AtomicU64 = AtomicU64::new(0);

static INSTALL: Once = Once::new();
static mut PREVIOUS: Option<libc::sigaction> = None;

/// Offset of `ObjectHeader::closed` (see `shm/mod.rs`).
pub(crate) const CLOSED_OFFSET: usize = 12;

/// A registration, undone when dropped (before the mapping goes).
pub struct Guard(Option<usize>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            LENS[slot].store(0, Ordering::SeqCst);
            HEADERS[slot].store(false, Ordering::SeqCst);
            STARTS[slot].store(0, Ordering::SeqCst);
        }
    }
}

/// Protects the mapping `[start, start + len)`; `header`: it starts with an
/// object header.
pub(crate) fn register(start: *mut u8, len: usize, header: bool) -> Guard {
    INSTALL.call_once(install);
    let start = start as usize;
    for slot in 0..SLOTS {
        if STARTS[slot]
            .compare_exchange(0, start, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            HEADERS[slot].store(header, Ordering::SeqCst);
            LENS[slot].store(len, Ordering::SeqCst);
            return Guard(Some(slot));
        }
    }
    tracing::debug!(
        len,
        "too many shared mappings to protect one more from SIGBUS"
    );
    Guard(None)
}

/// Reports, once each, mappings the handler replaced since the last call:
/// one warning line. Called from cold paths (liveness checks).
pub fn report() {
    let replaced = REPLACED.load(Ordering::Relaxed);
    let reported = REPORTED.load(Ordering::Relaxed);
    if replaced != reported
        && REPORTED
            .compare_exchange(reported, replaced, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            mappings = replaced - reported,
            "a shared object was truncated under us (SIGBUS contained): its mapping is \
             now private zeros and its owner counts as gone"
        );
    }
}

/// Mappings the handler replaced since the process started.
pub fn replaced() -> u64 {
    REPLACED.load(Ordering::Relaxed)
}

fn install() {
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: an all-zero sigaction is a valid value for the kernel to fill.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigaction pointers; sa_mask left empty. PREVIOUS is
    // written once, here (under INSTALL), before the handler can run.
    unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0 {
            PREVIOUS = Some(previous);
        }
    }
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in 0..SLOTS {
        let start = STARTS[slot].load(Ordering::SeqCst);
        let len = LENS[slot].load(Ordering::SeqCst);
        if len == 0 || addr < start || addr - start >= len {
            continue;
        }
        // SAFETY: the range is a live mapping of ours (registered until
        // just before its munmap); replacing it in place with anonymous
        // memory is what makes the faulting access succeed on retry. mmap
        // is a plain system call, safe in a signal handler.
        let ok = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        } != libc::MAP_FAILED;
        if ok {
            if HEADERS[slot].load(Ordering::SeqCst) {
                // SAFETY: the mapping starts with an ObjectHeader, whose
                // `closed` word sits at CLOSED_OFFSET, now our own memory.
                unsafe {
                    (*((start + CLOSED_OFFSET) as *const std::sync::atomic::AtomicU32))
                        .store(1, Ordering::SeqCst)
                };
            }
            REPLACED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        break;
    }
    // Not ours (or the replacement failed): a crash. Our objects go (see
    // `crash.rs`), then the previous disposition again, and the access
    // faults into it.
    crate::crash::remove_all();
    // SAFETY: PREVIOUS was set before this handler was installed and is
    // never written again; the kernel passes a valid siginfo; raise is
    // async-signal-safe.
    unsafe {
        crate::crash::put_back(libc::SIGBUS, std::ptr::addr_of!(PREVIOUS).read());
        // A SIGBUS sent by a process (kill, raise) has no access to retry:
        // sent again, it reaches that disposition as well.
        if (*info).si_code <= 0 {
            libc::raise(libc::SIGBUS);
        }
    }
}
