//! Atomics on an endpoint: each family in each call form, and the
//! `*valid` queries.

use std::ffi::c_void;
use std::ptr::null_mut;

use unimem_fi_sys as ffi;

use super::{rc, Ep};

/// Where an atomic operation goes and what it does: the peer's `fi_addr`,
/// the range under `key` at `addr` (an offset into the region), and
/// libfabric's `enum fi_datatype` and `enum fi_op`.
#[derive(Clone, Copy, Debug)]
pub struct AtomicTarget {
    pub peer: u64,
    pub addr: u64,
    pub key: u64,
    pub datatype: u32,
    pub op: u32,
}

/// Which entry point of its family an atomic is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicForm {
    /// `fi_atomic`, `fi_fetch_atomic`, `fi_compare_atomic`.
    Plain,
    /// `fi_atomicv` and kin: the local buffers in three pieces.
    Vector,
    /// `fi_atomicmsg` and kin with these flags: the local buffers in three
    /// pieces, the target range in `rma_iovs` entries (1 is what the
    /// provider supports).
    Msg { flags: u64, rma_iovs: usize },
    /// `fi_inject_atomic` (`fi_atomic` family only).
    Inject,
}

/// The local buffers of an atomic: `count` elements of `size` bytes each
/// at `operand`, `compare` (compare family) and `result` (fetch and
/// compare families); NULL where the family has none.
#[derive(Clone, Copy, Debug)]
pub struct AtomicBufs {
    pub operand: *const u8,
    pub compare: *const u8,
    pub result: *mut u8,
    pub count: usize,
    pub size: usize,
}

/// Three consecutive pieces (first element, elements) covering `count`
/// elements (some empty when `count` < 3).
fn element_pieces(count: usize) -> [(usize, usize); 3] {
    let cuts = [0, count / 3, 2 * count / 3, count];
    [0, 1, 2].map(|i| (cuts[i], cuts[i + 1] - cuts[i]))
}

/// `buf` (elements of `size` bytes) as three `fi_ioc` pieces (NULL
/// `buf`: every piece NULL).
fn iocs(buf: *const u8, count: usize, size: usize) -> Vec<ffi::fi_ioc> {
    element_pieces(count)
        .iter()
        .map(|&(first, n)| ffi::fi_ioc {
            addr: if buf.is_null() {
                null_mut()
            } else {
                buf.wrapping_add(first * size) as *mut c_void
            },
            count: n,
        })
        .collect()
}

/// The names `fabric-peer`'s atomic commands (and the tests that drive
/// them) give `enum fi_datatype`, in its order, with each element's size
/// in bytes.
pub const DATATYPE_NAMES: [(&str, usize); 14] = [
    ("i8", 1),
    ("u8", 1),
    ("i16", 2),
    ("u16", 2),
    ("i32", 4),
    ("u32", 4),
    ("i64", 8),
    ("u64", 8),
    ("float", 4),
    ("double", 8),
    ("fcomplex", 8),
    ("dcomplex", 16),
    ("ldouble", 16),
    ("ldcomplex", 32),
];

/// The names they give `enum fi_op`, in its order.
pub const OP_NAMES: [&str; 19] = [
    "min", "max", "sum", "prod", "lor", "land", "bor", "band", "lxor", "bxor", "read", "write",
    "cswap", "cswap-ne", "cswap-le", "cswap-lt", "cswap-ge", "cswap-gt", "mswap",
];

/// The family of an atomic call (`*valid`: which query).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicFamily {
    /// `fi_atomic` and kin (`fi_atomicvalid`).
    Write,
    /// `fi_fetch_atomic` and kin (`fi_fetch_atomicvalid`).
    Fetch,
    /// `fi_compare_atomic` and kin (`fi_compare_atomicvalid`).
    Compare,
}

impl Ep {
    fn atomic_ops(&self) -> &ffi::fi_ops_atomic {
        // SAFETY: a live endpoint has its atomic ops table.
        unsafe { &*self.get().atomic }
    }

    /// An atomic operation of `family` with `form` on `t`.
    ///
    /// # Safety
    /// The operand and compare buffers must be readable during the call,
    /// the result buffer writable until the operation completes, each for
    /// `b.count` elements of `b.size` bytes (the provider may also refuse
    /// without touching them).
    pub unsafe fn atomic(
        &self,
        family: AtomicFamily,
        form: AtomicForm,
        b: AtomicBufs,
        t: AtomicTarget,
        context: usize,
    ) -> isize {
        let (ep, ctx, ops) = (self.ptr, context as *mut c_void, self.atomic_ops());
        let (dt, op) = (t.datatype, t.op);
        let operand = iocs(b.operand, b.count, b.size);
        let compare = iocs(b.compare, b.count, b.size);
        let result = iocs(b.result, b.count, b.size);
        let (buf, cmp, res) = (
            b.operand.cast::<c_void>(),
            b.compare.cast(),
            b.result.cast(),
        );
        let (peer, addr, key, n) = (t.peer, t.addr, t.key, b.count);
        let null = null_mut();
        // SAFETY (every arm): the endpoint is live; the ioc arrays, the
        // target ranges and the message are live locals (the provider
        // copies them); the buffers are the caller's business.
        match (family, form) {
            // SAFETY: see above.
            (AtomicFamily::Write, AtomicForm::Plain) => unsafe {
                ops.write.expect("write")(ep, buf, n, null, peer, addr, key, dt, op, ctx)
            },
            // SAFETY: see above.
            (AtomicFamily::Write, AtomicForm::Inject) => unsafe {
                ops.inject.expect("inject")(ep, buf, n, peer, addr, key, dt, op)
            },
            // SAFETY: see above.
            (AtomicFamily::Write, AtomicForm::Vector) => unsafe {
                ops.writev.expect("writev")(
                    ep,
                    operand.as_ptr(),
                    null_mut(),
                    operand.len(),
                    peer,
                    addr,
                    key,
                    dt,
                    op,
                    ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Fetch, AtomicForm::Plain) => unsafe {
                ops.readwrite.expect("readwrite")(
                    ep, buf, n, null, res, null, peer, addr, key, dt, op, ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Fetch, AtomicForm::Vector) => unsafe {
                ops.readwritev.expect("readwritev")(
                    ep,
                    operand.as_ptr(),
                    null_mut(),
                    operand.len(),
                    result.as_ptr().cast_mut(),
                    null_mut(),
                    result.len(),
                    peer,
                    addr,
                    key,
                    dt,
                    op,
                    ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Compare, AtomicForm::Plain) => unsafe {
                ops.compwrite.expect("compwrite")(
                    ep, buf, n, null, cmp, null, res, null, peer, addr, key, dt, op, ctx,
                )
            },
            // SAFETY: see above.
            (AtomicFamily::Compare, AtomicForm::Vector) => unsafe {
                ops.compwritev.expect("compwritev")(
                    ep,
                    operand.as_ptr(),
                    null_mut(),
                    operand.len(),
                    compare.as_ptr(),
                    null_mut(),
                    compare.len(),
                    result.as_ptr().cast_mut(),
                    null_mut(),
                    result.len(),
                    peer,
                    addr,
                    key,
                    dt,
                    op,
                    ctx,
                )
            },
            (_, AtomicForm::Inject) => rc::EINVAL as isize,
            (family, AtomicForm::Msg { flags, rma_iovs }) => {
                let ranges: Vec<ffi::fi_rma_ioc> = (0..rma_iovs.max(1))
                    .map(|i| ffi::fi_rma_ioc {
                        addr: addr + (i * b.size) as u64,
                        count: if i == 0 { n } else { 0 },
                        key,
                    })
                    .collect();
                let msg = ffi::fi_msg_atomic {
                    msg_iov: operand.as_ptr(),
                    desc: null_mut(),
                    iov_count: operand.len(),
                    addr: peer,
                    rma_iov: ranges.as_ptr(),
                    rma_iov_count: rma_iovs,
                    datatype: dt,
                    op,
                    context: ctx,
                    data: 0,
                };
                match family {
                    // SAFETY: see above.
                    AtomicFamily::Write => unsafe {
                        ops.writemsg.expect("writemsg")(ep, &msg, flags)
                    },
                    // SAFETY: see above.
                    AtomicFamily::Fetch => unsafe {
                        ops.readwritemsg.expect("readwritemsg")(
                            ep,
                            &msg,
                            result.as_ptr().cast_mut(),
                            null_mut(),
                            result.len(),
                            flags,
                        )
                    },
                    // SAFETY: see above.
                    AtomicFamily::Compare => unsafe {
                        ops.compwritemsg.expect("compwritemsg")(
                            ep,
                            &msg,
                            compare.as_ptr(),
                            null_mut(),
                            compare.len(),
                            result.as_ptr().cast_mut(),
                            null_mut(),
                            result.len(),
                            flags,
                        )
                    },
                }
            }
        }
    }

    /// `fi_atomicvalid`, `fi_fetch_atomicvalid` or `fi_compare_atomicvalid`
    /// of `op` on `datatype`: `(rc, count)`.
    pub fn atomic_valid(&self, family: AtomicFamily, datatype: u32, op: u32) -> (i32, usize) {
        let ops = self.atomic_ops();
        let query = match family {
            AtomicFamily::Write => ops.writevalid,
            AtomicFamily::Fetch => ops.readwritevalid,
            AtomicFamily::Compare => ops.compwritevalid,
        };
        let mut count = 0usize;
        // SAFETY: the endpoint is live; count is a live local.
        let rc = unsafe { query.expect("*valid")(self.ptr, datatype, op, &mut count) };
        (rc, count)
    }
}
