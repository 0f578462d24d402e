//! What an endpoint does not do (RMA, atomics, collectives): complete ops
//! tables whose every entry returns -FI_ENOSYS. libfabric's inline wrappers
//! call these pointers without checking them, so none may be NULL.

use std::mem::size_of;
use std::os::raw::{c_int, c_void};

use crate::base::ffi::*;

/// A typed function that ignores its arguments and returns -FI_ENOSYS.
macro_rules! enosys {
    ($name:ident($($arg:ty),* $(,)?) -> $ret:ty) => {
        unsafe extern "C" fn $name($(_: $arg),*) -> $ret {
            -(FI_ENOSYS as $ret)
        }
    };
}

enosys!(
    rma_read(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    rma_readv(
        *mut fid_ep,
        *const iovec,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(rma_readmsg(*mut fid_ep, *const fi_msg_rma, u64) -> isize);
enosys!(
    rma_write(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    rma_writev(
        *mut fid_ep,
        *const iovec,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(rma_writemsg(*mut fid_ep, *const fi_msg_rma, u64) -> isize);
enosys!(rma_inject(*mut fid_ep, *const c_void, usize, fi_addr_t, u64, u64) -> isize);
enosys!(
    rma_writedata(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(rma_injectdata(*mut fid_ep, *const c_void, usize, u64, fi_addr_t, u64, u64) -> isize);

pub static RMA_OPS: fi_ops_rma = fi_ops_rma {
    size: size_of::<fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

enosys!(
    atomic_write(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
        *mut c_void,
    ) -> isize
);
enosys!(
    atomic_writev(
        *mut fid_ep,
        *const fi_ioc,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
        *mut c_void,
    ) -> isize
);
enosys!(atomic_writemsg(*mut fid_ep, *const fi_msg_atomic, u64) -> isize);
enosys!(
    atomic_inject(
        *mut fid_ep,
        *const c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
    ) -> isize
);
enosys!(
    atomic_readwrite(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
        *mut c_void,
    ) -> isize
);
enosys!(
    atomic_readwritev(
        *mut fid_ep,
        *const fi_ioc,
        *mut *mut c_void,
        usize,
        *mut fi_ioc,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
        *mut c_void,
    ) -> isize
);
enosys!(
    atomic_readwritemsg(
        *mut fid_ep,
        *const fi_msg_atomic,
        *mut fi_ioc,
        *mut *mut c_void,
        usize,
        u64,
    ) -> isize
);
enosys!(
    atomic_compwrite(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *const c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
        *mut c_void,
    ) -> isize
);
enosys!(
    atomic_compwritev(
        *mut fid_ep,
        *const fi_ioc,
        *mut *mut c_void,
        usize,
        *const fi_ioc,
        *mut *mut c_void,
        usize,
        *mut fi_ioc,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        fi_datatype,
        fi_op,
        *mut c_void,
    ) -> isize
);
enosys!(
    atomic_compwritemsg(
        *mut fid_ep,
        *const fi_msg_atomic,
        *const fi_ioc,
        *mut *mut c_void,
        usize,
        *mut fi_ioc,
        *mut *mut c_void,
        usize,
        u64,
    ) -> isize
);

enosys!(atomic_writevalid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int);
enosys!(atomic_readwritevalid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int);
enosys!(atomic_compwritevalid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int);

pub static ATOMIC_OPS: fi_ops_atomic = fi_ops_atomic {
    size: size_of::<fi_ops_atomic>(),
    write: Some(atomic_write),
    writev: Some(atomic_writev),
    writemsg: Some(atomic_writemsg),
    inject: Some(atomic_inject),
    readwrite: Some(atomic_readwrite),
    readwritev: Some(atomic_readwritev),
    readwritemsg: Some(atomic_readwritemsg),
    compwrite: Some(atomic_compwrite),
    compwritev: Some(atomic_compwritev),
    compwritemsg: Some(atomic_compwritemsg),
    writevalid: Some(atomic_writevalid),
    readwritevalid: Some(atomic_readwritevalid),
    compwritevalid: Some(atomic_compwritevalid),
};

enosys!(coll_barrier(*mut fid_ep, fi_addr_t, *mut c_void) -> isize);
enosys!(
    coll_broadcast(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        fi_addr_t,
        fi_datatype,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_alltoall(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_datatype,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_allreduce(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_datatype,
        fi_op,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_allgather(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_datatype,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_reduce_scatter(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_datatype,
        fi_op,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_reduce(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_addr_t,
        fi_datatype,
        fi_op,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_scatter(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_addr_t,
        fi_datatype,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_gather(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        fi_addr_t,
        fi_addr_t,
        fi_datatype,
        u64,
        *mut c_void,
    ) -> isize
);
enosys!(
    coll_msg(
        *mut fid_ep,
        *const fi_msg_collective,
        *mut fi_ioc,
        *mut *mut c_void,
        usize,
        u64,
    ) -> isize
);
enosys!(coll_barrier2(*mut fid_ep, fi_addr_t, u64, *mut c_void) -> isize);

pub static COLLECTIVE_OPS: fi_ops_collective = fi_ops_collective {
    size: size_of::<fi_ops_collective>(),
    barrier: Some(coll_barrier),
    broadcast: Some(coll_broadcast),
    alltoall: Some(coll_alltoall),
    allreduce: Some(coll_allreduce),
    allgather: Some(coll_allgather),
    reduce_scatter: Some(coll_reduce_scatter),
    reduce: Some(coll_reduce),
    scatter: Some(coll_scatter),
    gather: Some(coll_gather),
    msg: Some(coll_msg),
    barrier2: Some(coll_barrier2),
};
