//! Every entry point unimem does not implement, in one table.
//!
//! libfabric's inline wrappers call an ops table's pointers without
//! checking them, so none may be NULL: each unsupported entry point is a
//! stub that returns its error code. An application that relies on one
//! must learn why it fails rather than retry or hang in silence, so the
//! first call of each stub on each object (endpoint, domain...) logs a
//! warning naming the call and the reason; later calls on that object only
//! return the code (no log flood from a caller that polls).

use std::collections::HashSet;
use std::mem::size_of;
use std::os::raw::{c_char, c_int, c_void};

use parking_lot::Mutex;

use crate::base::ffi::*;
use crate::base::guard::ffi_guard_or;

/// (object, call) pairs already warned about.
static WARNED: Mutex<Option<HashSet<(usize, &'static str)>>> = Mutex::new(None);

/// Pairs remembered at most: past it, the set starts again (a program
/// that opens endpoints without end may hear a warning twice).
const WARNED_MAX: usize = 4096;

/// Logs why `call` on `object` is refused, the first time for that object
/// only. True if it logged.
#[cold]
pub fn refuse(call: &'static str, why: &'static str, object: usize) -> bool {
    // Logging is the only thing here that could panic.
    ffi_guard_or(call, false, || {
        let mut warned = WARNED.lock();
        let set = warned.get_or_insert_with(HashSet::new);
        if set.len() >= WARNED_MAX {
            set.clear();
        }
        let first = set.insert((object, call));
        drop(warned);
        if first {
            tracing::warn!("{call}: not supported by unimem: {why} (reported once per object)");
        }
        first
    })
}

/// Stubs sharing one error code and reason: `code, "why"; name(arg types)
/// -> return type; ...`. The name is the libfabric call, as the warning
/// shows it; the first argument is the object called on.
macro_rules! unsupported {
    ($code:expr, $why:literal; $($name:ident($first:ty $(, $arg:ty)* $(,)?) -> $ret:ty;)+) => {$(
        #[doc = concat!("`", stringify!($name), "`: ", $why, ".")]
        ///
        /// # Safety
        /// None: the arguments are ignored.
        pub unsafe extern "C" fn $name(object: $first $(, _: $arg)*) -> $ret {
            refuse(stringify!($name), $why, object as usize);
            $code as $ret
        }
    )+};
}

const ENOSYS: c_int = -FI_ENOSYS;

// --- struct fi_ops (every object) ----------------------------------------------------

unsupported! { ENOSYS, "nothing can be bound to this object";
    fi_bind(*mut fid, *mut fid, u64) -> c_int;
}
unsupported! { ENOSYS, "this object takes no fi_control commands";
    fi_control(*mut fid, c_int, *mut c_void) -> c_int;
}
unsupported! { ENOSYS, "there are no provider-specific interfaces";
    fi_open_ops(*mut fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int;
    fi_set_ops(*mut fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int;
}
unsupported! { ENOSYS, "objects have no text form of their own";
    fi_tostr(*const fid, *mut c_char, usize) -> c_int;
}

// --- fabric, domain, AV --------------------------------------------------------------

unsupported! { ENOSYS, "passive endpoints are for FI_EP_MSG; unimem offers FI_EP_RDM";
    fi_passive_ep(*mut fid_fabric, *mut fi_info, *mut *mut fid_pep, *mut c_void) -> c_int;
}
unsupported! { ENOSYS, "wait sets are not supported (deprecated in libfabric 2.x)";
    fi_wait_open(*mut fid_fabric, *mut fi_wait_attr, *mut *mut fid_wait) -> c_int;
}
unsupported! { ENOSYS, "scalable endpoints are not offered (max_ep_tx_ctx = 1)";
    fi_scalable_ep(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int;
    fi_tx_context(*mut fid_ep, c_int, *mut fi_tx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    fi_rx_context(*mut fid_ep, c_int, *mut fi_rx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
}
unsupported! { ENOSYS, "no shared transmit contexts (max_ep_stx_ctx = 0)";
    fi_stx_context(*mut fid_domain, *mut fi_tx_attr, *mut *mut fid_stx, *mut c_void) -> c_int;
}
unsupported! { ENOSYS, "no shared receive contexts (max_ep_srx_ctx = 0)";
    fi_srx_context(*mut fid_domain, *mut fi_rx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
}
unsupported! { ENOSYS, "no FI_COLLECTIVE";
    fi_query_collective(*mut fid_domain, fi_collective_op, *mut fi_collective_attr, u64)
        -> c_int;
}
unsupported! { ENOSYS, "AV sets are for collectives (no FI_COLLECTIVE)";
    fi_av_set(*mut fid_av, *mut fi_av_set_attr, *mut *mut fid_av_set, *mut c_void) -> c_int;
}

// --- endpoint: struct fi_ops_ep, struct fi_ops_cm ------------------------------------

unsupported! { ENOSYS, "queue space is not reported (deprecated call)";
    fi_rx_size_left(*mut fid_ep) -> isize;
    fi_tx_size_left(*mut fid_ep) -> isize;
}
unsupported! { ENOSYS, "an endpoint's address is fixed when it is opened (use src_addr)";
    fi_setname(*mut fid, *mut c_void, usize) -> c_int;
}
unsupported! { ENOSYS, "connections are for FI_EP_MSG endpoints; unimem's are FI_EP_RDM";
    fi_getpeer(*mut fid_ep, *mut c_void, *mut usize) -> c_int;
    fi_connect(*mut fid_ep, *const c_void, *const c_void, usize) -> c_int;
    fi_listen(*mut fid_pep) -> c_int;
    fi_accept(*mut fid_ep, *const c_void, usize) -> c_int;
    fi_reject(*mut fid_pep, fid_t, *const c_void, usize) -> c_int;
    fi_shutdown(*mut fid_ep, u64) -> c_int;
}
unsupported! { ENOSYS, "no multicast groups or collectives";
    fi_join(*mut fid_ep, *const c_void, u64, *mut *mut fid_mc, *mut c_void) -> c_int;
}

// --- endpoint: collectives -----------------------------------------------------------

unsupported! { ENOSYS, "no FI_COLLECTIVE";
    fi_barrier(*mut fid_ep, fi_addr_t, *mut c_void) -> isize;
    fi_broadcast(
        *mut fid_ep, *mut c_void, usize, *mut c_void, fi_addr_t, fi_addr_t, fi_datatype, u64,
        *mut c_void,
    ) -> isize;
    fi_alltoall(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_datatype, u64, *mut c_void,
    ) -> isize;
    fi_allreduce(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_datatype, fi_op, u64, *mut c_void,
    ) -> isize;
    fi_allgather(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_datatype, u64, *mut c_void,
    ) -> isize;
    fi_reduce_scatter(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_datatype, fi_op, u64, *mut c_void,
    ) -> isize;
    fi_reduce(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_addr_t, fi_datatype, fi_op, u64, *mut c_void,
    ) -> isize;
    fi_scatter(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_addr_t, fi_datatype, u64, *mut c_void,
    ) -> isize;
    fi_gather(
        *mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t,
        fi_addr_t, fi_datatype, u64, *mut c_void,
    ) -> isize;
    fi_collective_msg(
        *mut fid_ep, *const fi_msg_collective, *mut fi_ioc, *mut *mut c_void, usize, u64,
    ) -> isize;
    fi_barrier2(*mut fid_ep, fi_addr_t, u64, *mut c_void) -> isize;
}

pub static COLLECTIVE_OPS: fi_ops_collective = fi_ops_collective {
    size: size_of::<fi_ops_collective>(),
    barrier: Some(fi_barrier),
    broadcast: Some(fi_broadcast),
    alltoall: Some(fi_alltoall),
    allreduce: Some(fi_allreduce),
    allgather: Some(fi_allgather),
    reduce_scatter: Some(fi_reduce_scatter),
    reduce: Some(fi_reduce),
    scatter: Some(fi_scatter),
    gather: Some(fi_gather),
    msg: Some(fi_collective_msg),
    barrier2: Some(fi_barrier2),
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn warns_once_per_object_and_call() {
        assert!(refuse("fi_test", "testing", 0x1000));
        assert!(!refuse("fi_test", "testing", 0x1000));
        assert!(refuse("fi_test", "testing", 0x2000), "another object");
        assert!(refuse("fi_other", "testing", 0x1000), "another call");
        assert!(!refuse("fi_other", "testing", 0x1000));
    }

    #[test]
    fn stubs_keep_their_codes() {
        let enosys = Error::ENOSYS.ssize();
        // SAFETY: the stubs ignore their arguments.
        unsafe {
            for _ in 0..2 {
                assert_eq!(fi_bind(null_mut(), null_mut(), 0), ENOSYS);
                assert_eq!(fi_control(null_mut(), 0, null_mut()), ENOSYS);
                let open_ops = fi_open_ops(null_mut(), null(), 0, null_mut(), null_mut());
                assert_eq!(open_ops, ENOSYS);
                assert_eq!(fi_tostr(null(), null_mut(), 0), ENOSYS);
                assert_eq!(fi_setname(null_mut(), null_mut(), 0), ENOSYS);
                assert_eq!(fi_shutdown(null_mut(), 0), ENOSYS);
                assert_eq!(fi_rx_size_left(null_mut()), enosys);
                let barrier = COLLECTIVE_OPS.barrier.unwrap();
                assert_eq!(barrier(null_mut(), 0, null_mut()), enosys);
            }
        }
    }
}
