//! Every data call of the msg and tagged interfaces (the `v` and `msg`
//! forms included, which the multi-process tests do not use) between two
//! endpoints of one process, through the real libfabric core: what arrives,
//! what each completion says, and the errors the calls refuse with.
//!
//! Runs in a child process (libfabric reads its environment once) with the
//! core dlopen'ed and a job of its own; passes with a message when
//! libfabric.so.1 is missing.

mod common;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use unimem_fi::base::ffi;

const CHILD_VAR: &str = "UNIMEM_FI_DATA_CALLS_CHILD";

#[test]
fn data_calls_through_libfabric() {
    if std::env::var_os(CHILD_VAR).is_some() {
        scenario();
        return;
    }
    let job = format!("data-calls-{}", std::process::id());
    let (_, stderr) = common::run_scenario_in_child(
        "data_calls_through_libfabric",
        CHILD_VAR,
        &[("FI_UNIMEM_JOB", job)],
    );
    for warning in [
        "fi_inject: 16385 bytes exceed the inject size 16384",
        "fi_sendv: 9 iovs exceed the limit of 8",
        "fi_trecvv: NULL iov",
        "fi_tsendmsg: unsupported flags 0x",
        "fi_send: fi_addr 0x63 is not in the endpoint's AV",
        "fi_trecvmsg: FI_MULTI_RECV takes one untagged buffer",
        "fi_read: the endpoint was opened without FI_RMA",
    ] {
        assert!(stderr.contains(warning), "no '{warning}' in:\n{stderr}");
    }
    // Refused RMA says so once per endpoint, however often it is tried.
    assert_eq!(
        stderr.matches("opened without FI_RMA").count(),
        1,
        "{stderr}"
    );
}

const EINVAL: isize = -(ffi::FI_EINVAL as isize);
const EAGAIN: isize = -(ffi::FI_EAGAIN as isize);
const EBADFLAGS: isize = -(ffi::FI_EBADFLAGS as isize);
const INJECT_SIZE: usize = 16 << 10;

/// One endpoint with a CQ of its own for both directions.
struct Side {
    ep: *mut ffi::fid_ep,
    cq: *mut ffi::fid_cq,
}

impl Side {
    fn msg(&self) -> &ffi::fi_ops_msg {
        // SAFETY: a live endpoint has its ops tables.
        unsafe { &*(*self.ep).msg }
    }

    fn tagged(&self) -> &ffi::fi_ops_tagged {
        // SAFETY: as above.
        unsafe { &*(*self.ep).tagged }
    }

    /// The next completion, progressing both sides meanwhile.
    fn next(&self, other: &Side) -> ffi::fi_cq_tagged_entry {
        let deadline = Instant::now() + Duration::from_secs(60); // a hang guard only
        loop {
            let mut e = ffi::fi_cq_tagged_entry::default();
            // SAFETY: live CQs of the tagged format; e holds one entry.
            let n = unsafe {
                let read = (*(*self.cq).ops).read.unwrap();
                let _ = read(other.cq, null_mut(), 0);
                read(self.cq, &mut e as *mut _ as *mut c_void, 1)
            };
            if n == 1 {
                return e;
            }
            assert_eq!(n, EAGAIN, "fi_cq_read");
            assert!(Instant::now() < deadline, "no completion in 60 s: hang");
            std::thread::yield_now();
        }
    }

    /// Nothing (more) to read.
    fn none(&self) {
        // SAFETY: a live CQ; no entries asked for.
        let n = unsafe { ((*(*self.cq).ops).read.unwrap())(self.cq, null_mut(), 0) };
        assert_eq!(n, EAGAIN);
    }
}

fn iov(buf: &[u8]) -> ffi::iovec {
    ffi::iovec {
        iov_base: buf.as_ptr() as *mut c_void,
        iov_len: buf.len(),
    }
}

/// For a buffer the provider writes into.
fn iov_mut(buf: &mut [u8]) -> ffi::iovec {
    ffi::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: buf.len(),
    }
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
        let hints = core.unimem_rdm_hints(ffi::FI_MSG | ffi::FI_TAGGED | ffi::FI_MULTI_RECV);
        let mut info: *mut ffi::fi_info = null_mut();
        assert_eq!(getinfo(version(), null(), null(), 0, hints, &mut info), 0);
        assert_eq!((*(*info).tx_attr).inject_size, INJECT_SIZE);
        let mut fab: *mut ffi::fid_fabric = null_mut();
        assert_eq!(fabric((*info).fabric_attr, &mut fab, null_mut()), 0);
        let mut dom: *mut ffi::fid_domain = null_mut();
        let domain = (*(*fab).ops).domain.unwrap();
        assert_eq!(domain(fab, info, &mut dom, null_mut()), 0);
        let dops = &*(*dom).ops;
        let mut av: *mut ffi::fid_av = null_mut();
        let mut av_attr = ffi::fi_av_attr::default();
        assert_eq!(
            dops.av_open.unwrap()(dom, &mut av_attr, &mut av, null_mut()),
            0
        );

        let open_side = || {
            let mut cq: *mut ffi::fid_cq = null_mut();
            let mut attr = ffi::fi_cq_attr {
                format: ffi::FI_CQ_FORMAT_TAGGED,
                ..Default::default()
            };
            assert_eq!(
                dops.cq_open.unwrap()(dom, &mut attr, &mut cq, null_mut()),
                0
            );
            let mut ep: *mut ffi::fid_ep = null_mut();
            assert_eq!(dops.endpoint.unwrap()(dom, info, &mut ep, null_mut()), 0);
            let fid = ep as *mut ffi::fid;
            let bind = (*(*fid).ops).bind.unwrap();
            assert_eq!(bind(fid, av as _, 0), 0);
            assert_eq!(bind(fid, cq as _, ffi::FI_TRANSMIT | ffi::FI_RECV), 0);
            let control = (*(*fid).ops).control.unwrap();
            assert_eq!(control(fid, ffi::FI_ENABLE as c_int, null_mut()), 0);
            Side { ep, cq }
        };
        let a = open_side();
        let b = open_side();
        let mut name = [0u8; 128];
        let mut len = name.len();
        let getname = (*(*b.ep).cm).getname.unwrap();
        assert_eq!(getname(b.ep as _, name.as_mut_ptr() as _, &mut len), 0);
        let mut to_b = u64::MAX;
        let insert = (*(*av).ops).insert.unwrap();
        assert_eq!(
            insert(av, name.as_ptr() as _, 1, &mut to_b, 0, null_mut()),
            1
        );
        fixed_length_names(av, &name[..len]);

        untagged(&a, &b, to_b);
        tagged(&a, &b, to_b);
        refused(&a, &b, to_b);

        for fid in [
            a.ep as *mut ffi::fid,
            b.ep as _,
            a.cq as _,
            b.cq as _,
            av as _,
        ] {
            assert_eq!(((*(*fid).ops).close.unwrap())(fid), 0);
        }
        assert_eq!(((*(*dom).fid.ops).close.unwrap())(dom as _), 0);
        assert_eq!(((*(*fab).fid.ops).close.unwrap())(fab as _), 0);
        freeinfo(info);
        freeinfo(hints);
    }
    println!("scenario complete");
}

/// Every name from fi_getname has one length, NUL-padded (64 bytes), so
/// that names gathered at the stride of one's own (MPICH, SOS) line up
/// whatever the digits of their pids; fi_av_insert takes such a packed
/// array, and names back to back with no padding too.
///
/// # Safety
/// `av` is an open AV; `name` is an endpoint's name as fi_getname gave it.
unsafe fn fixed_length_names(av: *mut ffi::fid_av, name: &[u8]) {
    const LEN: usize = 64;
    assert_eq!(name.len(), LEN, "fi_getname's length");
    let text = name.split(|&b| b == 0).next().unwrap();
    assert!(
        name[text.len()..].iter().all(|&b| b == 0),
        "padding: {name:?}"
    );
    let text = std::str::from_utf8(text).unwrap();
    // Names of processes whose pids have 1 and 7 digits.
    let rest = text.strip_prefix("unimem://").unwrap();
    let (job, rest) = rest.split_once('/').unwrap();
    let (_, nonce_index) = rest.split_once('.').unwrap();
    let names = [
        format!("unimem://{job}/7.{nonce_index}"),
        format!("unimem://{job}/1234567.{nonce_index}"),
        text.to_string(),
    ];
    // SAFETY: av is open (caller): its ops table is the provider's.
    let (insert, lookup) = unsafe { ((*(*av).ops).insert.unwrap(), (*(*av).ops).lookup.unwrap()) };
    let check = |packed: &[u8], how: &str| {
        let mut fi_addrs = [u64::MAX; 3];
        // SAFETY: packed holds 3 names as fi_av_insert takes them; fi_addrs
        // has room for 3.
        let n = unsafe {
            insert(
                av,
                packed.as_ptr() as _,
                3,
                fi_addrs.as_mut_ptr(),
                0,
                null_mut(),
            )
        };
        assert_eq!(n, 3, "{how}: {fi_addrs:?}");
        for (fi_addr, want) in fi_addrs.iter().zip(&names) {
            let mut got = [0u8; 128];
            let mut got_len = got.len();
            // SAFETY: got holds got_len bytes.
            let rc = unsafe { lookup(av, *fi_addr, got.as_mut_ptr() as _, &mut got_len) };
            assert_eq!(rc, 0);
            let got = std::str::from_utf8(got.split(|&b| b == 0).next().unwrap()).unwrap();
            assert_eq!(got, want, "{how}");
        }
    };
    let mut padded = vec![0u8; 3 * LEN];
    for (i, n) in names.iter().enumerate() {
        padded[i * LEN..i * LEN + n.len()].copy_from_slice(n.as_bytes());
    }
    check(&padded, "at a stride of 64");
    let back_to_back: Vec<u8> = names.iter().flat_map(|n| n.bytes().chain([0])).collect();
    check(&back_to_back, "back to back");
}

/// fi_sendv/fi_recvv, fi_sendmsg/fi_recvmsg, fi_senddata, fi_injectdata.
///
/// # Safety
/// Live, enabled endpoints; `to_b` is B in their AV.
unsafe fn untagged(a: &Side, b: &Side, to_b: u64) {
    let (am, bm) = (a.msg(), b.msg());
    let (hello, world) = (b"hello, ".to_vec(), b"world".to_vec());
    let mut head = [0u8; 4];
    let mut tail = [0u8; 16];
    // SAFETY: the buffers outlive the transfers, which complete below.
    unsafe {
        let riov = [iov_mut(&mut head), iov_mut(&mut tail)];
        let n = bm.recvv.unwrap()(b.ep, riov.as_ptr(), null_mut(), 2, u64::MAX, 1 as _);
        assert_eq!(n, 0);
        let siov = [iov(&hello), iov(&world)];
        assert_eq!(
            am.sendv.unwrap()(a.ep, siov.as_ptr(), null_mut(), 2, to_b, 2 as _),
            0
        );
        let sent = a.next(b);
        assert_eq!(
            (sent.op_context as usize, sent.flags),
            (2, ffi::FI_SEND | ffi::FI_MSG)
        );
        let got = b.next(a);
        assert_eq!((got.op_context as usize, got.len), (1, 12));
        assert_eq!(got.flags, ffi::FI_RECV | ffi::FI_MSG);
        assert_eq!((&head, &tail[..8]), (b"hell", &b"o, world"[..]));
    }

    // fi_sendmsg: its data travels only with FI_REMOTE_CQ_DATA.
    let mut buf = [0u8; 8];
    for (flags, expect) in [(0, None), (ffi::FI_REMOTE_CQ_DATA, Some(99))] {
        let rv = [iov_mut(&mut buf)];
        let rmsg = ffi::fi_msg {
            msg_iov: rv.as_ptr(),
            iov_count: 1,
            addr: u64::MAX,
            context: 3 as _,
            data: 1234,
            ..Default::default()
        };
        let payload = *b"msg";
        let sv = [iov(&payload)];
        let smsg = ffi::fi_msg {
            msg_iov: sv.as_ptr(),
            iov_count: 1,
            addr: to_b,
            context: 4 as _,
            data: 99,
            ..Default::default()
        };
        // SAFETY: the messages and buffers outlive the transfers.
        unsafe {
            assert_eq!(bm.recvmsg.unwrap()(b.ep, &rmsg, 0), 0);
            assert_eq!(am.sendmsg.unwrap()(a.ep, &smsg, flags), 0);
        }
        assert_eq!(a.next(b).op_context as usize, 4);
        let got = b.next(a);
        assert_eq!((got.op_context as usize, got.len), (3, 3));
        assert_eq!(got.flags & ffi::FI_REMOTE_CQ_DATA != 0, expect.is_some());
        if let Some(data) = expect {
            assert_eq!(got.data, data);
        }
        assert_eq!(&buf[..3], b"msg");
        buf = [0; 8];
    }

    // fi_senddata, then fi_injectdata: no send completion for an inject.
    let payload = *b"data";
    // SAFETY: the buffers outlive the transfers.
    unsafe {
        for inject in [false, true] {
            let n = bm.recv.unwrap()(b.ep, buf.as_mut_ptr() as _, 8, null_mut(), u64::MAX, 5 as _);
            assert_eq!(n, 0);
            let p = payload.as_ptr() as *const c_void;
            let n = if inject {
                am.injectdata.unwrap()(a.ep, p, 4, 77, to_b)
            } else {
                am.senddata.unwrap()(a.ep, p, 4, null_mut(), 77, to_b, 6 as _)
            };
            assert_eq!(n, 0);
            let got = b.next(a);
            assert_eq!((got.op_context as usize, got.len, got.data), (5, 4, 77));
            assert_ne!(got.flags & ffi::FI_REMOTE_CQ_DATA, 0);
            if !inject {
                assert_eq!(a.next(b).op_context as usize, 6);
            }
        }
        a.none();
        b.none();
    }
}

/// The tagged calls: fi_tsendv/fi_trecvv, fi_tsendmsg/fi_trecvmsg,
/// fi_tsenddata, fi_tinject, fi_tinjectdata, matched by tag.
///
/// # Safety
/// As [`untagged`].
unsafe fn tagged(a: &Side, b: &Side, to_b: u64) {
    let (at, bt) = (a.tagged(), b.tagged());
    let payload = *b"tagged!";
    let p = payload.as_ptr() as *const c_void;
    let mut bufs = [[0u8; 8]; 6];
    // SAFETY: the buffers outlive the transfers, which complete below.
    unsafe {
        // Receives for tags 10..=15, posted in reverse: matching is by tag.
        for (i, buf) in bufs.iter_mut().enumerate().rev() {
            let tag = 10 + i as u64;
            let n = match i {
                0 => {
                    let v = [iov_mut(buf)];
                    bt.recvv.unwrap()(b.ep, v.as_ptr(), null_mut(), 1, u64::MAX, tag, 0, tag as _)
                }
                1 => {
                    let v = [iov_mut(buf)];
                    let msg = ffi::fi_msg_tagged {
                        msg_iov: v.as_ptr(),
                        iov_count: 1,
                        addr: u64::MAX,
                        tag: tag | 0xf00,
                        ignore: 0xf00,
                        context: tag as _,
                        ..Default::default()
                    };
                    bt.recvmsg.unwrap()(b.ep, &msg, 0)
                }
                _ => {
                    let ptr = buf.as_mut_ptr() as *mut c_void;
                    bt.recv.unwrap()(b.ep, ptr, 8, null_mut(), u64::MAX, tag, 0, tag as _)
                }
            };
            assert_eq!(n, 0, "receive {i}");
        }
        let v = [iov(&payload)];
        assert_eq!(
            at.sendv.unwrap()(a.ep, v.as_ptr(), null_mut(), 1, to_b, 10, 20 as _),
            0
        );
        let msg = ffi::fi_msg_tagged {
            msg_iov: v.as_ptr(),
            iov_count: 1,
            addr: to_b,
            tag: 11,
            context: 21 as _,
            data: 5,
            ..Default::default()
        };
        assert_eq!(at.sendmsg.unwrap()(a.ep, &msg, ffi::FI_REMOTE_CQ_DATA), 0);
        assert_eq!(
            at.send.unwrap()(a.ep, p, 7, null_mut(), to_b, 12, 22 as _),
            0
        );
        assert_eq!(
            at.senddata.unwrap()(a.ep, p, 7, null_mut(), 6, to_b, 13, 23 as _),
            0
        );
        assert_eq!(at.inject.unwrap()(a.ep, p, 7, to_b, 14), 0);
        assert_eq!(at.injectdata.unwrap()(a.ep, p, 7, 8, to_b, 15), 0);
    }
    let mut sent: Vec<usize> = (0..4).map(|_| a.next(b).op_context as usize).collect();
    sent.sort_unstable();
    assert_eq!(sent, [20, 21, 22, 23]);
    let mut got: Vec<(u64, u64, u64)> = (0..6)
        .map(|_| {
            let e = b.next(a);
            assert_eq!(
                e.flags & !ffi::FI_REMOTE_CQ_DATA,
                ffi::FI_RECV | ffi::FI_TAGGED
            );
            assert_eq!((e.op_context as u64, e.len), (e.tag & 0xff, 7));
            let data = if e.flags & ffi::FI_REMOTE_CQ_DATA != 0 {
                e.data
            } else {
                0
            };
            (e.tag, data, e.op_context as u64)
        })
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        [
            (10, 0, 10),
            (11, 5, 11),
            (12, 0, 12),
            (13, 6, 13),
            (14, 0, 14),
            (15, 8, 15)
        ]
    );
    assert!(bufs.iter().all(|buf| &buf[..7] == b"tagged!"));
    a.none();
    b.none();
}

/// What the calls refuse: a NULL msg, too long an inject, too many or NULL
/// iovecs, unknown flags, an address not in the AV, FI_MULTI_RECV with a
/// tag; and an RMA call, refused as unsupported (warned about once).
///
/// # Safety
/// As [`untagged`].
unsafe fn refused(a: &Side, b: &Side, to_b: u64) {
    let (am, at, bt) = (a.msg(), a.tagged(), b.tagged());
    let big = vec![0u8; INJECT_SIZE + 1];
    let p = big.as_ptr() as *const c_void;
    let nine = [iov(&big[..1]); 9];
    // SAFETY: nothing is accepted, so no buffer is used after the calls.
    unsafe {
        assert_eq!(am.sendmsg.unwrap()(a.ep, null(), 0), EINVAL);
        assert_eq!(bt.recvmsg.unwrap()(b.ep, null(), 0), EINVAL);
        assert_eq!(am.inject.unwrap()(a.ep, p, INJECT_SIZE + 1, to_b), EINVAL);
        assert_eq!(
            at.inject.unwrap()(a.ep, p, INJECT_SIZE + 1, to_b, 1),
            EINVAL
        );
        assert_eq!(
            am.sendv.unwrap()(a.ep, nine.as_ptr(), null_mut(), 9, to_b, null_mut()),
            EINVAL
        );
        assert_eq!(
            bt.recvv.unwrap()(b.ep, null(), null_mut(), 1, u64::MAX, 0, 0, null_mut()),
            EINVAL
        );
        let v = [iov(&big[..1])];
        let msg = ffi::fi_msg_tagged {
            msg_iov: v.as_ptr(),
            iov_count: 1,
            addr: to_b,
            ..Default::default()
        };
        assert_eq!(
            at.sendmsg.unwrap()(a.ep, &msg, ffi::FI_MULTI_RECV),
            EBADFLAGS
        );
        assert_eq!(
            am.send.unwrap()(a.ep, p, 1, null_mut(), 99, null_mut()),
            EINVAL
        );
        let rmsg = ffi::fi_msg_tagged {
            addr: u64::MAX,
            ..msg
        };
        assert_eq!(bt.recvmsg.unwrap()(b.ep, &rmsg, ffi::FI_MULTI_RECV), EINVAL);
        let buf = big.as_ptr() as *mut c_void;
        // Opened without FI_RMA (not in the hints): refused.
        let read = (*(*a.ep).rma).read.unwrap();
        for _ in 0..3 {
            assert_eq!(
                read(a.ep, buf, 1, null_mut(), to_b, 0, 0, null_mut()),
                -(ffi::FI_EOPNOTSUPP as isize)
            );
        }
    }
}
