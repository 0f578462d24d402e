//! `tracing` events → libfabric's logging (`fi_log`), so that
//! `FI_LOG_LEVEL`, `FI_LOG_PROV=unimem` and `FI_LOG_SUBSYS` work for us as
//! for any provider, including events from the mailbox/dma crates.
//!
//! Installation: we set the *global* default dispatcher. In the cdylib this
//! is private to us: Rust symbols are not exported from a cdylib, so our copy
//! of `tracing` (and its global) is ours alone and cannot clash with a Rust
//! host application's own subscriber, which lives in its own copy. When the
//! crate is instead linked as an rlib into a Rust program that already set a
//! global subscriber, `set_global_default` fails and we leave theirs in
//! place (events then go where that program wants them). A scoped dispatcher
//! (`with_default` around every entry point) would cost a thread-local swap
//! on every data-path call and miss threads the provider spawns.
//!
//! Level mapping (order-preserving; note libfabric orders
//! warn < trace < info < debug, with "trace" meaning light execution tracing):
//!
//! | tracing        | libfabric      |
//! |----------------|----------------|
//! | ERROR, WARN    | FI_LOG_WARN    |
//! | INFO           | FI_LOG_INFO    |
//! | DEBUG, TRACE   | FI_LOG_DEBUG   |
//!
//! Mapping `trace!` to FI_LOG_TRACE would make the most verbose Rust events
//! appear with `FI_LOG_LEVEL=info`. FI_LOG_TRACE is reachable explicitly with
//! `target: "fi_trace"` (or a target ending in `::fi_trace`), for one-line
//! "entered fi_xxx" records.
//!
//! Subsystem: from the event's target (by default the module path, e.g.
//! `unimem_fi::domain`), matching path segments from the last one back:
//! fabric, domain, ep/ep_ctrl/endpoint/cm → ep_ctrl, ep_data/msg/tagged/rma/
//! atomic/progress/proto/rdm → ep_data, av, cq, eq, mr/regcache, cntr/counter;
//! crates: unimem_mailbox and unimem_dma → ep_data, unimem_regcache → mr;
//! anything else → core. An explicit `target: "cq"` works the same way.
//!
//! Enabled-ness is cached as a bit mask of (level, subsystem) pairs computed
//! with `fi_log_enabled` when the core first calls us (after registration,
//! when libfabric's per-provider filter is in place) and refreshed on every
//! `fi_getinfo`/`fi_fabric`; callsites then get a static interest, so a
//! disabled `debug!` costs nothing on the data path. Before that (inside
//! `fi_prov_ini`) every event asks `fi_log_enabled` directly.

use std::ffi::CString;
use std::fmt::{self, Write as _};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

use crate::base::core;
use crate::base::ffi;
use crate::base::provider;

/// Bit `level * 16 + subsys` set = enabled; `ARMED` = the mask is valid.
static MASK: AtomicU64 = AtomicU64::new(0);
const ARMED: u64 = 1 << 63;
/// False before `fi_prov_ini` and after `cleanup`: never call the core then.
static ALIVE: AtomicBool = AtomicBool::new(false);

const LEVELS: [ffi::fi_log_level; 4] = [
    ffi::FI_LOG_WARN,
    ffi::FI_LOG_TRACE,
    ffi::FI_LOG_INFO,
    ffi::FI_LOG_DEBUG,
];

/// Install the subscriber (idempotent) and start forwarding.
pub fn install() {
    ALIVE.store(true, Ordering::Release);
    MASK.store(0, Ordering::Release);
    // Err = a global subscriber already exists: ours from an earlier load of
    // this DSO copy, or the host's when linked as an rlib. Keep it either way.
    let _ = tracing::dispatcher::set_global_default(tracing::Dispatch::new(FiLogSubscriber));
    tracing::callsite::rebuild_interest_cache();
}

/// Recompute the enabled mask from libfabric's filters.
pub fn refresh() {
    let Some(core) = core::get().filter(|_| ALIVE.load(Ordering::Acquire)) else {
        return;
    };
    let mut mask = ARMED;
    for level in LEVELS {
        for subsys in ffi::FI_LOG_CORE..ffi::FI_LOG_SUBSYS_MAX {
            // SAFETY: the provider pointer is the registered, static provider.
            if unsafe { (core.log_enabled)(provider::provider(), level, subsys) } != 0 {
                mask |= bit(level, subsys);
            }
        }
    }
    if MASK.swap(mask, Ordering::AcqRel) != mask {
        tracing::callsite::rebuild_interest_cache();
    }
}

/// Stop forwarding (at `cleanup`: the core is about to unload us).
pub fn shutdown() {
    ALIVE.store(false, Ordering::Release);
    MASK.store(ARMED, Ordering::Release);
    tracing::callsite::rebuild_interest_cache();
}

fn bit(level: ffi::fi_log_level, subsys: ffi::fi_log_subsys) -> u64 {
    1 << (level * 16 + subsys)
}

/// tracing level → libfabric level (see the module table).
pub fn fi_level(meta: &Metadata<'_>) -> ffi::fi_log_level {
    let target = meta.target();
    if target == "fi_trace" || target.ends_with("::fi_trace") {
        return ffi::FI_LOG_TRACE;
    }
    match *meta.level() {
        Level::ERROR | Level::WARN => ffi::FI_LOG_WARN,
        Level::INFO => ffi::FI_LOG_INFO,
        Level::DEBUG | Level::TRACE => ffi::FI_LOG_DEBUG,
    }
}

/// tracing target → libfabric subsystem (see the module comment).
pub fn fi_subsys(target: &str) -> ffi::fi_log_subsys {
    target
        .rsplit("::")
        .find_map(|segment| match segment {
            "fabric" => Some(ffi::FI_LOG_FABRIC),
            "domain" => Some(ffi::FI_LOG_DOMAIN),
            "ep" | "ep_ctrl" | "endpoint" | "cm" => Some(ffi::FI_LOG_EP_CTRL),
            "ep_data" | "msg" | "tagged" | "rma" | "atomic" | "progress" | "proto" | "rdm" => {
                Some(ffi::FI_LOG_EP_DATA)
            }
            "unimem_mailbox" | "unimem_dma" => Some(ffi::FI_LOG_EP_DATA),
            "av" => Some(ffi::FI_LOG_AV),
            "cq" => Some(ffi::FI_LOG_CQ),
            "eq" => Some(ffi::FI_LOG_EQ),
            "mr" | "regcache" | "unimem_regcache" => Some(ffi::FI_LOG_MR),
            "cntr" | "counter" => Some(ffi::FI_LOG_CNTR),
            "core" => Some(ffi::FI_LOG_CORE),
            _ => None,
        })
        .unwrap_or(ffi::FI_LOG_CORE)
}

/// Whether libfabric wants this (level, subsystem); None if we cannot know yet.
fn enabled_for(level: ffi::fi_log_level, subsys: ffi::fi_log_subsys) -> bool {
    if !ALIVE.load(Ordering::Acquire) {
        return false;
    }
    let mask = MASK.load(Ordering::Acquire);
    if mask & ARMED != 0 {
        return mask & bit(level, subsys) != 0;
    }
    match core::get() {
        // SAFETY: the provider pointer is the registered, static provider.
        Some(core) => unsafe { (core.log_enabled)(provider::provider(), level, subsys) != 0 },
        None => false,
    }
}

struct FiLogSubscriber;

impl Subscriber for FiLogSubscriber {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // Spans carry nothing we forward.
        if !meta.is_event() {
            return Interest::never();
        }
        if MASK.load(Ordering::Acquire) & ARMED == 0 {
            return Interest::sometimes();
        }
        if enabled_for(fi_level(meta), fi_subsys(meta.target())) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event() && enabled_for(fi_level(meta), fi_subsys(meta.target()))
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let (level, subsys) = (fi_level(meta), fi_subsys(meta.target()));
        if !enabled_for(level, subsys) {
            return;
        }
        let Some(core) = core::get() else { return };
        let mut text = MessageText::default();
        event.record(&mut text);
        let mut msg = text.0;
        msg.push('\n');
        let msg = c_string(msg);
        let func = c_string(meta.module_path().unwrap_or(meta.target()).to_owned());
        let line = meta.line().map_or(0, |l| l as c_int);
        // Like FI_LOG: keep errno intact across the logging call.
        // SAFETY: __errno_location returns this thread's errno slot.
        let saved_errno = unsafe { *libc::__errno_location() };
        // SAFETY: NUL-terminated strings that outlive the call; "%s" consumes the one argument.
        unsafe {
            (core.log)(
                provider::provider(),
                level,
                subsys,
                func.as_ptr(),
                line,
                c"%s".as_ptr(),
                msg.as_ptr(),
            );
            *libc::__errno_location() = saved_errno;
        }
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

fn c_string(s: String) -> CString {
    CString::new(s).unwrap_or_else(|e| {
        let cleaned: Vec<u8> = e.into_vec().into_iter().filter(|&b| b != 0).collect();
        CString::new(cleaned).unwrap_or_default()
    })
}

/// "message k1=v1 k2=v2".
#[derive(Default)]
struct MessageText(String);

impl Visit for MessageText {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsystem_from_target() {
        assert_eq!(fi_subsys("unimem_fi::domain"), ffi::FI_LOG_DOMAIN);
        assert_eq!(fi_subsys("unimem_fi::fabric"), ffi::FI_LOG_FABRIC);
        assert_eq!(fi_subsys("unimem_fi::getinfo"), ffi::FI_LOG_CORE);
        assert_eq!(fi_subsys("unimem_fi::ep::rdm"), ffi::FI_LOG_EP_DATA);
        assert_eq!(fi_subsys("unimem_fi::ep"), ffi::FI_LOG_EP_CTRL);
        assert_eq!(fi_subsys("unimem_mailbox::queue"), ffi::FI_LOG_EP_DATA);
        assert_eq!(fi_subsys("unimem_regcache"), ffi::FI_LOG_MR);
        assert_eq!(fi_subsys("cq"), ffi::FI_LOG_CQ);
        assert_eq!(fi_subsys("something_else"), ffi::FI_LOG_CORE);
    }

    #[test]
    fn mask_bits_are_distinct_and_below_armed() {
        let mut seen = 0u64;
        for level in LEVELS {
            for subsys in ffi::FI_LOG_CORE..ffi::FI_LOG_SUBSYS_MAX {
                let b = bit(level, subsys);
                assert_eq!(seen & b, 0);
                assert_eq!(b & ARMED, 0);
                seen |= b;
            }
        }
    }
}
