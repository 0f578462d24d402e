//! EQ, CQ, counter, AV and MR objects as an application sees them through
//! the real libfabric core: opened from `fi_getinfo`'s answer, driven
//! through the ops tables (what the `fi_*` inline wrappers call), including
//! the error paths and that timed blocking reads do wait.
//!
//! Runs in a child process (libfabric reads its environment once) with the
//! core dlopen'ed; fails, saying what to install, when libfabric.so.1 is
//! missing (scripts/install-deps).

mod common;
use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use unimem_fi::base::ffi::{self, FI_ADDR_NOTAVAIL};

const CHILD_VAR: &str = "UNIMEM_FI_OBJECTS_CHILD";

#[test]
fn objects_through_libfabric() {
    if std::env::var_os(CHILD_VAR).is_some() {
        scenario();
        return;
    }
    let (_, stderr) = common::run_scenario_in_child("objects_through_libfabric", CHILD_VAR, &[]);
    // Error paths explain themselves in FI_LOG.
    for warning in [
        "fi_cq_open: unknown format 99",
        "fi_cq_open: wait object 3: FI_WAIT_FD/POLLFD not supported",
        "fi_close(domain): 5 child object(s) still open",
        "fi_close(eq): still bound to 2 object(s)",
        "fi_av_insert: AV opened with FI_EVENT but no EQ is bound",
        "fi_mr_regv: 9 buffers (1 to mr_iov_limit = 8 allowed)",
        "fi_cntr_open: unsupported flags 0x1",
        "fi_close: the object was already closed",
    ] {
        assert!(stderr.contains(warning), "no '{warning}' in:\n{stderr}");
    }
}

const EAGAIN: isize = -(ffi::FI_EAGAIN as isize);
const EAVAIL: isize = -(ffi::FI_EAVAIL as isize);
const EINVAL: c_int = -ffi::FI_EINVAL;
const EBUSY: c_int = -ffi::FI_EBUSY;

/// `fi_close`.
///
/// # Safety
/// `fid` must be a live libfabric object.
unsafe fn close(fid: *mut ffi::fid) -> c_int {
    // SAFETY: guaranteed by the caller.
    unsafe { ((*(*fid).ops).close.unwrap())(fid) }
}

/// `fi_control`.
///
/// # Safety
/// `fid` must be a live libfabric object, `arg` right for `command`.
unsafe fn control(fid: *mut ffi::fid, command: u32, arg: *mut c_void) -> c_int {
    // SAFETY: guaranteed by the caller.
    unsafe { ((*(*fid).ops).control.unwrap())(fid, command as c_int, arg) }
}

/// `fi_bind` (fi_domain_bind, fi_av_bind, ...).
///
/// # Safety
/// Both must be live libfabric objects.
unsafe fn bind(fid: *mut ffi::fid, bfid: *mut ffi::fid, flags: u64) -> c_int {
    // SAFETY: guaranteed by the caller.
    unsafe { ((*(*fid).ops).bind.unwrap())(fid, bfid, flags) }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

fn scenario() {
    let core = common::open_core_privately();
    let common::Core {
        getinfo,
        freeinfo,
        fabric,
        version,
        ..
    } = core;
    // SAFETY: libfabric API used as documented; every pointer is from libfabric or a live local.
    unsafe {
        let hints = core.unimem_rdm_hints(0);
        let mut info: *mut ffi::fi_info = null_mut();
        assert_eq!(getinfo(version(), null(), null(), 0, hints, &mut info), 0);
        let mut fab: *mut ffi::fid_fabric = null_mut();
        assert_eq!(fabric((*info).fabric_attr, &mut fab, null_mut()), 0);

        let eq = eq_checks(fab);
        let mut dom: *mut ffi::fid_domain = null_mut();
        assert_eq!(
            ((*(*fab).ops).domain.unwrap())(fab, info, &mut dom, null_mut()),
            0
        );
        assert_eq!(bind(dom as _, eq as _, 0), 0, "fi_domain_bind");

        let cq = cq_checks(dom);
        let cntr = cntr_checks(dom);
        let av = av_checks(dom, eq, info);
        let mr = mr_checks(dom, info);
        endpoint_checks(dom, info, av.0, cq, cntr);

        // Children keep their parents open.
        assert_eq!(close(dom as _), EBUSY, "domain with a CQ, counter, AVs, MR");
        assert_eq!(close(eq as _), EBUSY, "EQ bound to the domain and an AV");
        assert_eq!(close(fab as _), EBUSY);
        for fid in [
            cq as *mut ffi::fid,
            cntr as _,
            av.0 as _,
            av.1 as _,
            mr as _,
        ] {
            assert_eq!(close(fid), 0);
        }
        // Use after close is the application's error; the usual case, a
        // second fi_close, is refused with a warning instead of a double
        // free (the allocator leaves a freed block's ops word alone).
        assert_eq!(close(cq as _), EINVAL, "closing a CQ twice");
        assert_eq!(close(dom as _), 0);
        assert_eq!(close(eq as _), 0);
        assert_eq!(close(fab as _), 0);
        freeinfo(info);
        freeinfo(hints);
    }
    println!("scenario complete");
}

/// An endpoint bound as MPICH binds one (an AV, a CQ for both directions,
/// a counter for FI_READ|FI_WRITE), enabled and closed: closing it must
/// release everything it held, so that the domain and fabric close after.
///
/// # Safety
/// Live objects of one domain; `info` from fi_getinfo.
unsafe fn endpoint_checks(
    dom: *mut ffi::fid_domain,
    info: *const ffi::fi_info,
    av: *mut ffi::fid_av,
    cq: *mut ffi::fid_cq,
    cntr: *mut ffi::fid_cntr,
) {
    let mut ep: *mut ffi::fid_ep = null_mut();
    // SAFETY: live domain; info from fi_getinfo; ep is a writable local.
    unsafe {
        let endpoint = (*(*dom).ops).endpoint.unwrap();
        assert_eq!(endpoint(dom, info as *mut _, &mut ep, null_mut()), 0);
        let fid = ep as *mut ffi::fid;
        assert_eq!(bind(fid, av as _, 0), 0);
        assert_eq!(bind(fid, cq as _, ffi::FI_TRANSMIT | ffi::FI_RECV), 0);
        assert_eq!(bind(fid, cntr as _, ffi::FI_READ | ffi::FI_WRITE), 0);
        assert_eq!(control(fid, ffi::FI_ENABLE, null_mut()), 0);
        assert_eq!(close(cq as _), EBUSY, "CQ bound to an open endpoint");
        assert_eq!(close(fid), 0);
    }
}

/// FI_WAIT_FD EQ: fd readiness, FI_PEEK, timed sread; returns an open EQ.
///
/// # Safety
/// `fab` must be a live fabric.
unsafe fn eq_checks(fab: *mut ffi::fid_fabric) -> *mut ffi::fid_eq {
    // SAFETY: fab is live (caller); every other pointer is a live local.
    unsafe {
        let eq_open = (*(*fab).ops).eq_open.unwrap();
        let mut eq: *mut ffi::fid_eq = null_mut();
        let mut attr = ffi::fi_eq_attr {
            wait_obj: ffi::FI_WAIT_FD,
            flags: ffi::FI_WRITE,
            ..Default::default()
        };
        assert_eq!(eq_open(fab, &mut attr, &mut eq, null_mut()), 0);
        let ops = &*(*eq).ops;
        let mut fd: c_int = -1;
        assert_eq!(
            control(eq as _, ffi::FI_GETWAIT, &mut fd as *mut c_int as _),
            0
        );
        let mut eqp = eq as *mut ffi::fid;
        assert_eq!(((*(*fab).ops).trywait.unwrap())(fab, &mut eqp, 1), 0);
        let ready = || {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            libc::poll(&mut p, 1, 0)
        };
        assert_eq!(ready(), 0);

        let size = size_of::<ffi::fi_eq_entry>();
        let entry = ffi::fi_eq_entry {
            fid: eq as _,
            context: 0x77 as _,
            data: 5,
        };
        assert_eq!(
            ops.write.unwrap()(eq, ffi::FI_NOTIFY, &entry as *const _ as _, size, 0),
            size as isize
        );
        assert_eq!(ready(), 1);
        let mut got = ffi::fi_eq_entry::default();
        let mut event = u32::MAX;
        let read = ops.read.unwrap();
        assert_eq!(
            read(eq, &mut event, &mut got as *mut _ as _, size, ffi::FI_PEEK),
            size as isize
        );
        assert_eq!(ready(), 1, "a peek keeps the fd readable");
        assert_eq!(
            read(eq, &mut event, &mut got as *mut _ as _, size, 0),
            size as isize
        );
        assert_eq!(
            (event, got.context as usize, got.data),
            (ffi::FI_NOTIFY, 0x77, 5)
        );
        assert_eq!(ready(), 0);
        assert_eq!(
            read(eq, &mut event, &mut got as *mut _ as _, size, 0),
            EAGAIN
        );
        let mut err = ffi::fi_eq_err_entry::default();
        assert_eq!(ops.readerr.unwrap()(eq, &mut err, 0), EAGAIN);

        let sread = ops.sread.unwrap();
        let (n, waited) = timed(|| sread(eq, &mut event, &mut got as *mut _ as _, size, 200, 0));
        assert_eq!(n, EAGAIN);
        // It did wait; how much longer it took is up to the machine's load.
        assert!(
            waited >= Duration::from_millis(200),
            "fi_eq_sread(200 ms) gave up after {waited:?}"
        );
        eq
    }
}

/// CQ attributes, empty reads, timed and signaled sread; returns an open CQ.
///
/// # Safety
/// `dom` must be a live domain.
unsafe fn cq_checks(dom: *mut ffi::fid_domain) -> *mut ffi::fid_cq {
    // SAFETY: dom is live (caller); every other pointer is a live local.
    unsafe {
        let cq_open = (*(*dom).ops).cq_open.unwrap();
        let mut cq: *mut ffi::fid_cq = null_mut();
        let mut bad = ffi::fi_cq_attr {
            format: 99,
            ..Default::default()
        };
        assert_eq!(cq_open(dom, &mut bad, &mut cq, null_mut()), EINVAL);
        bad = ffi::fi_cq_attr {
            wait_obj: ffi::FI_WAIT_FD,
            ..Default::default()
        };
        assert_eq!(cq_open(dom, &mut bad, &mut cq, null_mut()), -ffi::FI_ENOSYS);

        let mut attr = ffi::fi_cq_attr {
            format: ffi::FI_CQ_FORMAT_TAGGED,
            wait_obj: ffi::FI_WAIT_UNSPEC,
            ..Default::default()
        };
        assert_eq!(cq_open(dom, &mut attr, &mut cq, null_mut()), 0);
        let ops = &*(*cq).ops;
        assert_eq!(ops.size, size_of::<ffi::fi_ops_cq>());
        let mut entries = [ffi::fi_cq_tagged_entry::default(); 4];
        let buf = entries.as_mut_ptr() as *mut c_void;
        assert_eq!(ops.read.unwrap()(cq, buf, 4), EAGAIN);
        let mut src = [0u64; 4];
        assert_eq!(ops.readfrom.unwrap()(cq, buf, 4, src.as_mut_ptr()), EAGAIN);
        assert_eq!(
            ops.read.unwrap()(cq, null_mut(), 0),
            EAGAIN,
            "count 0 only progresses"
        );
        let mut err: ffi::fi_cq_err_entry = std::mem::zeroed();
        assert_eq!(ops.readerr.unwrap()(cq, &mut err, 0), EAGAIN);
        assert_ne!(ops.read.unwrap()(cq, buf, 4), EAVAIL);

        let sread = ops.sread.unwrap();
        let (n, waited) = timed(|| sread(cq, buf, 4, null(), 200));
        assert_eq!(n, EAGAIN);
        assert!(
            waited >= Duration::from_millis(200),
            "fi_cq_sread(200 ms) gave up after {waited:?}"
        );
        assert_eq!(ops.signal.unwrap()(cq), 0);
        // Were the signal lost, this would wait forever: the parent's hang
        // guard (common::CHILD_LIMIT) fails the test then.
        let n = sread(cq, buf, 4, null(), -1);
        assert_eq!(n, EAGAIN, "a signal ends an infinite wait");

        let mut text = [0 as c_char; 64];
        let s = ops.strerror.unwrap()(cq, ffi::FI_EIO, null(), text.as_mut_ptr(), text.len());
        assert_eq!(s, text.as_ptr() as *const c_char);
        assert!(!CStr::from_ptr(s).to_bytes().is_empty());
        let mut obj = 0u32;
        assert_eq!(
            control(cq as _, ffi::FI_GETWAITOBJ, &mut obj as *mut u32 as _),
            0
        );
        assert_eq!(obj, ffi::FI_WAIT_YIELD);
        cq
    }
}

/// Counter arithmetic and a timed wait; returns an open counter.
///
/// # Safety
/// `dom` must be a live domain.
unsafe fn cntr_checks(dom: *mut ffi::fid_domain) -> *mut ffi::fid_cntr {
    // SAFETY: dom is live (caller); every other pointer is a live local.
    unsafe {
        let cntr_open = (*(*dom).ops).cntr_open.unwrap();
        let mut c: *mut ffi::fid_cntr = null_mut();
        let mut bad = ffi::fi_cntr_attr {
            flags: 1,
            ..Default::default()
        };
        assert_eq!(cntr_open(dom, &mut bad, &mut c, null_mut()), EINVAL);
        let mut attr = ffi::fi_cntr_attr {
            events: ffi::FI_CNTR_EVENTS_COMP,
            wait_obj: ffi::FI_WAIT_UNSPEC,
            ..Default::default()
        };
        assert_eq!(cntr_open(dom, &mut attr, &mut c, null_mut()), 0);
        let ops = &*(*c).ops;
        assert_eq!(ops.set.unwrap()(c, 3), 0);
        assert_eq!(ops.add.unwrap()(c, 4), 0);
        assert_eq!(ops.adderr.unwrap()(c, 2), 0);
        assert_eq!((ops.read.unwrap()(c), ops.readerr.unwrap()(c)), (7, 2));
        assert_eq!(ops.wait.unwrap()(c, 7, 1000), 0);
        let (rc, waited) = timed(|| ops.wait.unwrap()(c, 8, 100));
        assert_eq!(rc, -ffi::FI_ETIMEDOUT);
        assert!(
            waited >= Duration::from_millis(100),
            "fi_cntr_wait(100 ms) gave up after {waited:?}"
        );
        c
    }
}

/// Synchronous and FI_EVENT AVs; returns both, open.
///
/// # Safety
/// `dom`, `eq` and `info` must be live.
unsafe fn av_checks(
    dom: *mut ffi::fid_domain,
    eq: *mut ffi::fid_eq,
    info: *const ffi::fi_info,
) -> (*mut ffi::fid_av, *mut ffi::fid_av) {
    // SAFETY: the objects are live (caller); every other pointer is a live local.
    unsafe {
        let av_open = (*(*dom).ops).av_open.unwrap();
        let mut av: *mut ffi::fid_av = null_mut();
        let mut attr = ffi::fi_av_attr::default();
        assert_eq!(av_open(dom, &mut attr, &mut av, null_mut()), 0);
        assert_eq!(attr.type_, ffi::FI_AV_TABLE);
        let ops = &*(*av).ops;

        // Our own address as getinfo gave it, plus a bad one, back to back.
        let own = std::slice::from_raw_parts((*info).src_addr as *const u8, (*info).src_addrlen);
        assert_eq!(own.last(), Some(&0));
        let mut blob = own.to_vec();
        blob.extend_from_slice(b"10.0.0.1:9228\0");
        let mut fi_addr = [0u64; 2];
        let n = ops.insert.unwrap()(
            av,
            blob.as_ptr() as _,
            2,
            fi_addr.as_mut_ptr(),
            0,
            null_mut(),
        );
        assert_eq!(n, 1);
        assert_eq!(fi_addr, [0, FI_ADDR_NOTAVAIL]);
        let mut buf = [0u8; 64];
        let mut len = buf.len();
        assert_eq!(
            ops.lookup.unwrap()(av, 0, buf.as_mut_ptr() as _, &mut len),
            0
        );
        assert_eq!(&buf[..len], own);
        let mut text = [0 as c_char; 16];
        let mut len = text.len();
        let s = ops.straddr.unwrap()(av, own.as_ptr() as _, text.as_mut_ptr(), &mut len);
        assert_eq!(len, own.len());
        assert_eq!(CStr::from_ptr(s).to_bytes(), &own[..15], "truncated");
        assert_eq!(ops.remove.unwrap()(av, fi_addr.as_mut_ptr(), 1, 0), 0);
        let mut len = buf.len();
        assert_eq!(
            ops.lookup.unwrap()(av, 0, buf.as_mut_ptr() as _, &mut len),
            EINVAL
        );
        let n = ops.insert.unwrap()(
            av,
            own.as_ptr() as _,
            1,
            fi_addr.as_mut_ptr(),
            0,
            null_mut(),
        );
        assert_eq!((n, fi_addr[0]), (1, 1), "indices are not reused");

        // FI_EVENT: needs an EQ, then reports there.
        let mut ev_av: *mut ffi::fid_av = null_mut();
        let mut attr = ffi::fi_av_attr {
            flags: ffi::FI_EVENT,
            ..Default::default()
        };
        assert_eq!(av_open(dom, &mut attr, &mut ev_av, null_mut()), 0);
        let ev_ops = &*(*ev_av).ops;
        let insert = ev_ops.insert.unwrap();
        assert_eq!(
            insert(
                ev_av,
                blob.as_ptr() as _,
                2,
                fi_addr.as_mut_ptr(),
                0,
                null_mut()
            ),
            -(ffi::FI_ENOEQ as c_int)
        );
        assert_eq!(bind(ev_av as _, eq as _, 0), 0);
        let ctx = 0x1234 as *mut c_void;
        assert_eq!(
            insert(ev_av, blob.as_ptr() as _, 2, fi_addr.as_mut_ptr(), 0, ctx),
            0
        );
        let eq_ops = &*(*eq).ops;
        let mut entry = ffi::fi_eq_entry::default();
        let mut event = 0u32;
        let size = size_of::<ffi::fi_eq_entry>();
        assert_eq!(
            eq_ops.read.unwrap()(eq, &mut event, &mut entry as *mut _ as _, size, 0),
            EAVAIL
        );
        let mut err = ffi::fi_eq_err_entry::default();
        assert_eq!(
            eq_ops.readerr.unwrap()(eq, &mut err, 0),
            size_of::<ffi::fi_eq_err_entry>() as isize
        );
        assert_eq!(
            (err.fid, err.context, err.data, err.err),
            (ev_av as *mut ffi::fid, ctx, 1, ffi::FI_EINVAL)
        );
        let n = eq_ops.sread.unwrap()(eq, &mut event, &mut entry as *mut _ as _, size, 1000, 0);
        assert_eq!(n, size as isize);
        assert_eq!(
            (event, entry.fid, entry.context, entry.data),
            (ffi::FI_AV_COMPLETE, ev_av as *mut ffi::fid, ctx, 1)
        );
        (av, ev_av)
    }
}

/// Registration, descriptor and key; returns an open MR.
///
/// # Safety
/// `dom` and `info` must be live.
unsafe fn mr_checks(dom: *mut ffi::fid_domain, info: *const ffi::fi_info) -> *mut ffi::fid_mr {
    // SAFETY: the objects are live (caller); the buffer is leaked, so it outlives the MR.
    unsafe {
        let limit = (*(*info).domain_attr).mr_iov_limit;
        assert!(limit > 0);
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 1 << 16].into_boxed_slice());
        let ops = &*(*dom).mr;
        let mut mr: *mut ffi::fid_mr = null_mut();
        let access = ffi::FI_SEND | ffi::FI_RECV;
        let rc = ops.reg.unwrap()(
            dom as _,
            buf.as_ptr() as _,
            buf.len(),
            access,
            0,
            0xc0de,
            0,
            &mut mr,
            null_mut(),
        );
        assert_eq!(rc, 0);
        assert!(!(*mr).mem_desc.is_null(), "fi_mr_desc");
        assert_eq!((*mr).key, 0xc0de, "fi_mr_key");
        let iov: Vec<ffi::iovec> = (0..=limit)
            .map(|i| ffi::iovec {
                iov_base: buf[i * 64..].as_mut_ptr() as _,
                iov_len: 64,
            })
            .collect();
        let mut other: *mut ffi::fid_mr = null_mut();
        let regv = ops.regv.unwrap();
        assert_eq!(
            regv(
                dom as _,
                iov.as_ptr(),
                limit + 1,
                access,
                0,
                1,
                0,
                &mut other,
                null_mut()
            ),
            EINVAL
        );
        assert_eq!(
            regv(
                dom as _,
                iov.as_ptr(),
                limit,
                access,
                0,
                1,
                0,
                &mut other,
                null_mut()
            ),
            0
        );
        assert_eq!(close(other as _), 0);
        mr
    }
}
