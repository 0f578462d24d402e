//! Address vectors (`fi_av_open`): FI_ADDR_STR addresses (the text of a
//! [`MailboxAddr`], see addr.rs) in, table indices out.
//!
//! Decisions:
//! - FI_AV_TABLE semantics for both types: an fi_addr_t is the insertion
//!   index (FI_AV_MAP is accepted, as getinfo promises, and behaves the
//!   same: an index is a valid map address).
//! - Indices are never reused. A removed index stays a hole that looks
//!   up as nothing, so an fi_addr_t kept by mistake (or a late completion)
//!   can never name a different peer. Re-inserting a removed address gives
//!   it a new index. The table grows by one small entry per insertion.
//! - Addresses are inserted as given; a well-formed address of another job
//!   is accepted (it fails later, at send time, like any unreachable peer).
//!   Inserting an address twice gives two indices; reverse lookup then
//!   answers the lowest live one.
//! - `fi_av_insert` reads `count` NUL-terminated strings packed back to
//!   back (as prov/shm does, and as a single `fi_getname` result is).
//! - Inserts are synchronous; with FI_EVENT they are done on the spot and
//!   reported through the bound EQ (one error entry per failed address,
//!   then FI_AV_COMPLETE with the number inserted), as fi_av(3) describes.
//! - `lookup` takes no lock (table.rs says how): the data path calls it on
//!   every send, from any thread; `reverse_lookup` (FI_SOURCE only) takes
//!   a read lock.
//!
//! Here: the object (open, bind, close) and the calls that read or remove
//! entries; the insert calls are in `insert.rs`, the table in `table.rs`.

mod insert;
mod table;

use std::ffi::CStr;
use std::fmt;
use std::mem::size_of;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::Arc;

use parking_lot::Mutex;
use unimem_mailbox::{JobId, MailboxAddr};

use crate::base::ffi::{self, ret, Error};
use crate::base::fid::{self, Bind, Children, FiObject, FidObject, Parent, ParentRef};
use crate::base::guard::{ffi_guard, ffi_guard_or};
use crate::base::unsupported;
use crate::eq::{Eq, EqInner};
use crate::state::DomainState;
use insert::{av_insert, av_insertsvc, av_insertsym};
use table::Table;

/// Our `struct fid_av`.
pub type Av = FidObject<AvInner>;

/// State shared with the endpoints bound to the AV.
#[derive(Debug)]
pub struct AvInner {
    domain: ParentRef<DomainState>,
    /// Job of `fi_av_insertsvc` service addresses (the configured job).
    job: JobId,
    av_type: ffi::fi_av_type,
    /// Opened with FI_EVENT: inserts report through `eq`.
    events: bool,
    eq: Mutex<Option<ParentRef<EqInner>>>,
    table: Table,
    /// Endpoints bound to this AV.
    children: Children,
}

impl Parent for AvInner {
    fn children(&self) -> &Children {
        &self.children
    }
}

impl AvInner {
    /// The peer behind `fi_addr`; None if it was never inserted or was
    /// removed.
    pub fn lookup(&self, fi_addr: ffi::fi_addr_t) -> Option<MailboxAddr> {
        self.table.lookup(fi_addr)
    }

    /// The fi_addr_t of a peer (its lowest live index), for source
    /// addresses of received messages.
    pub fn reverse_lookup(&self, addr: &MailboxAddr) -> Option<ffi::fi_addr_t> {
        self.table.reverse_lookup(addr)
    }

    /// Every live address of the table, once each (cold paths only).
    pub fn addresses(&self) -> Vec<MailboxAddr> {
        self.table.addresses()
    }

    /// Removals so far: a [`reverse_lookup`](Self::reverse_lookup) answer
    /// stays right while this does not change.
    #[inline]
    pub fn removals(&self) -> u64 {
        self.table.removals()
    }

    /// The domain the AV belongs to (endpoints must share it).
    pub fn domain(&self) -> &DomainState {
        &self.domain
    }

    /// FI_AV_TABLE or FI_AV_MAP, as opened (same behaviour).
    pub fn av_type(&self) -> ffi::fi_av_type {
        self.av_type
    }
}

/// The bytes of a C string, for parsing.
///
/// # Safety
/// `p` must be a NUL-terminated string.
unsafe fn c_bytes<'a>(p: *const c_char) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}

static AV_FI_OPS: ffi::fi_ops = ffi::fi_ops {
    bind: Some(fid::bind::<AvInner>),
    ..fid::fi_ops::<AvInner>()
};

// SAFETY: fid_av starts with its struct fid.
unsafe impl FiObject for AvInner {
    type Fid = ffi::fid_av;
    const CLASS: u32 = ffi::FI_CLASS_AV;
    const KIND: &'static str = "address vector";
    const FI_OPS: &'static ffi::fi_ops = &AV_FI_OPS;

    fn warn(args: fmt::Arguments<'_>) {
        tracing::warn!("{args}");
    }

    fn on_close(av: &Av) -> Result<(), Error> {
        if let Err(n) = fid::check_no_children(av.inner.children()) {
            tracing::warn!("fi_close(av): still bound to {n} endpoint(s)");
            return Err(Error::EBUSY);
        }
        // Dropping it releases the domain and the EQ.
        tracing::debug!("av {av:p} closed");
        Ok(())
    }
}

impl Bind for AvInner {
    unsafe fn bind(av: &Av, bfid: *mut ffi::fid, flags: u64) -> Result<(), Error> {
        let av = &av.inner;
        if flags != 0 {
            tracing::warn!("fi_av_bind: flags must be 0 (got {flags:#x})");
            return Err(Error::EBADFLAGS);
        }
        // SAFETY: bfid comes from the application.
        let Some(eq) = (unsafe { Eq::state_of(bfid) }) else {
            tracing::warn!("fi_av_bind: only a unimem EQ can be bound to an AV");
            return Err(Error::EINVAL);
        };
        if !av.events {
            tracing::warn!(
                "fi_av_bind: the AV was opened without FI_EVENT (inserts are synchronous)"
            );
            return Err(Error::EINVAL);
        }
        let mut slot = av.eq.lock();
        if slot.is_some() {
            tracing::warn!("fi_av_bind: an EQ is already bound");
            return Err(Error::EINVAL);
        }
        *slot = Some(ParentRef::new(&eq));
        Ok(())
    }
}

static AV_OPS: ffi::fi_ops_av = ffi::fi_ops_av {
    size: size_of::<ffi::fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: Some(av_insertsvc),
    insertsym: Some(av_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(unsupported::fi_av_set),
};

/// `fi_av_open` on one of our domains; an FI_AV_UNSPEC type is replaced in
/// `attr` by the domain's, or by FI_AV_TABLE if that too is unspecified.
///
/// # Safety
/// `attr` must be NULL or a valid `fi_av_attr`; `av` NULL or writable.
pub unsafe fn open(
    domain: &Arc<DomainState>,
    attr: *mut ffi::fi_av_attr,
    av: *mut *mut ffi::fid_av,
    context: *mut c_void,
) -> Result<(), Error> {
    if attr.is_null() || av.is_null() {
        tracing::warn!("fi_av_open: NULL attr or av pointer");
        return Err(Error::EINVAL);
    }
    // SAFETY: non-NULL attr is a valid fi_av_attr (caller).
    let a = unsafe { &mut *attr };
    let av_type = match a.type_ {
        ffi::FI_AV_UNSPEC => match domain.info.domain.av_type {
            ffi::FI_AV_MAP => ffi::FI_AV_MAP,
            _ => ffi::FI_AV_TABLE,
        },
        t @ (ffi::FI_AV_TABLE | ffi::FI_AV_MAP) => t,
        other => {
            tracing::warn!("fi_av_open: unknown AV type {other}");
            return Err(Error::EINVAL);
        }
    };
    if !a.name.is_null() || a.flags & ffi::FI_READ != 0 {
        tracing::warn!("fi_av_open: named (shared) AVs are not supported");
        return Err(Error::ENOSYS);
    }
    if a.rx_ctx_bits != 0 {
        tracing::warn!("fi_av_open: rx_ctx_bits given, but there are no scalable endpoints");
        return Err(Error::ENOSYS);
    }
    let unknown = a.flags & !(ffi::FI_EVENT | ffi::FI_SYMMETRIC);
    if unknown != 0 {
        tracing::warn!("fi_av_open: unsupported flags {unknown:#x}");
        return Err(Error::EINVAL);
    }
    a.type_ = av_type;
    let job = JobId::from_name(&domain.config().job);
    let obj = Box::new(Av {
        fid: ffi::fid_av {
            fid: Av::header(context),
            ops: fid::ops_ptr(&AV_OPS),
        },
        inner: Arc::new(AvInner {
            domain: ParentRef::new(domain),
            job,
            av_type,
            events: a.flags & ffi::FI_EVENT != 0,
            eq: Mutex::new(None),
            table: Table::default(),
            children: Children::default(),
        }),
    });
    // SAFETY: av is non-NULL (checked).
    let obj = unsafe { obj.install(av) };
    tracing::debug!("av {obj:p} opened (job {job})");
    Ok(())
}

/// The state of our AV behind `av`, or None (with a warning).
///
/// # Safety
/// `av` must be NULL or a live `struct fid_av`.
unsafe fn av_of<'a>(av: *mut ffi::fid_av, op: &str) -> Option<&'a AvInner> {
    // SAFETY: forwarded from the caller.
    unsafe { Av::from_ptr(av, op) }.map(|av| &*av.inner)
}

unsafe extern "C" fn av_remove(
    av: *mut ffi::fid_av,
    fi_addr: *mut ffi::fi_addr_t,
    count: usize,
    flags: u64,
) -> c_int {
    ffi_guard("fi_av_remove", || {
        // SAFETY: fid_av starts with its fid (application's pointer).
        let Some(inner) = (unsafe { av_of(av, "fi_av_remove") }) else {
            return ret::EINVAL;
        };
        if flags != 0 {
            tracing::warn!("fi_av_remove: flags must be 0 (got {flags:#x})");
            return ret::EBADFLAGS;
        }
        if fi_addr.is_null() && count > 0 {
            tracing::warn!("fi_av_remove: NULL address array");
            return ret::EINVAL;
        }
        let addrs: Vec<u64> = (0..count)
            // SAFETY: fi_addr holds count entries (API contract).
            .map(|i| unsafe { fi_addr.add(i).read_unaligned() })
            .collect();
        let mut table = inner.table.write();
        // All or nothing: a bad address removes none.
        if let Some(bad) = addrs.iter().find(|&&a| table.lookup(a).is_none()) {
            tracing::warn!("fi_av_remove: fi_addr {bad} is not in the AV");
            return ret::EINVAL;
        }
        let mut sorted = addrs;
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            tracing::warn!("fi_av_remove: an fi_addr is listed twice");
            return ret::EINVAL;
        }
        for a in sorted {
            table.remove(a);
        }
        ret::SUCCESS
    })
}

/// Copy `text` + NUL into `buf` of `*len` bytes, truncating (always
/// NUL-terminated when there is room for anything); `*len` becomes the
/// full size needed.
///
/// # Safety
/// `buf` must be writable for `*len` bytes.
unsafe fn copy_out(text: &[u8], buf: *mut u8, len: &mut usize) {
    if *len > 0 {
        let n = text.len().min(*len - 1);
        // SAFETY: n + 1 <= *len bytes fit in buf (caller).
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr(), buf, n);
            *buf.add(n) = 0;
        }
    }
    *len = text.len() + 1;
}

unsafe extern "C" fn av_lookup(
    av: *mut ffi::fid_av,
    fi_addr: ffi::fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    ffi_guard("fi_av_lookup", || {
        // SAFETY: fid_av starts with its fid (application's pointer).
        let Some(inner) = (unsafe { av_of(av, "fi_av_lookup") }) else {
            return ret::EINVAL;
        };
        // SAFETY: addrlen is NULL or a writable size_t (API contract).
        let Some(len) = (unsafe { addrlen.as_mut() }) else {
            tracing::warn!("fi_av_lookup: NULL addrlen");
            return ret::EINVAL;
        };
        if addr.is_null() && *len > 0 {
            tracing::warn!("fi_av_lookup: NULL buffer of {len} bytes");
            return ret::EINVAL;
        }
        let Some(found) = inner.lookup(fi_addr) else {
            tracing::warn!("fi_av_lookup: fi_addr {fi_addr} is not in the AV");
            return ret::EINVAL;
        };
        // SAFETY: addr holds *len bytes (API contract).
        unsafe { copy_out(found.to_string().as_bytes(), addr as *mut u8, len) };
        ret::SUCCESS
    })
}

unsafe extern "C" fn av_straddr(
    av: *mut ffi::fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    ffi_guard_or("fi_av_straddr", ptr::null(), || {
        // SAFETY: fid_av starts with its fid (application's pointer).
        if unsafe { av_of(av, "fi_av_straddr") }.is_none() {
            return ptr::null();
        }
        // SAFETY: len is NULL or a writable size_t (API contract).
        let Some(len) = (unsafe { len.as_mut() }) else {
            tracing::warn!("fi_av_straddr: NULL len");
            return ptr::null();
        };
        if addr.is_null() || (buf.is_null() && *len > 0) {
            tracing::warn!("fi_av_straddr: NULL address or buffer");
            return ptr::null();
        }
        // An FI_ADDR_STR address is its own printable form.
        // SAFETY: addr is an address of the AV's format: a C string.
        let text = unsafe { c_bytes(addr as *const c_char) };
        // SAFETY: buf holds *len bytes (API contract).
        unsafe { copy_out(text, buf as *mut u8, len) };
        buf as *const c_char
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ffi::FI_ADDR_NOTAVAIL;
    use crate::cq::tests::{close, fabric_domain};
    use crate::info::addr;
    use table::tests::peer;

    fn open_av(
        dom: *mut ffi::fid_domain,
        attr: &mut ffi::fi_av_attr,
    ) -> Result<*mut ffi::fid_av, Error> {
        let mut av: *mut ffi::fid_av = ptr::null_mut();
        // SAFETY: dom is a live domain of ours; locals are live.
        let rc = unsafe { ((*(*dom).ops).av_open.unwrap())(dom, attr, &mut av, ptr::null_mut()) };
        crate::base::result_of(rc).map(|()| av)
    }

    /// Addresses packed back to back, each with its NUL.
    fn packed(addrs: &[&str]) -> Vec<u8> {
        addrs.iter().flat_map(|a| a.bytes().chain([0])).collect()
    }

    #[test]
    fn insert_lookup_remove_straddr_through_the_ops() {
        let (fab, dom) = fabric_domain();
        let mut attr = ffi::fi_av_attr::default();
        let av = open_av(dom, &mut attr).unwrap();
        assert_eq!(attr.type_, ffi::FI_AV_TABLE, "UNSPEC resolved and reported");
        let a = peer(10, 1).to_string();
        let b = peer(11, 2).to_string();
        let svc = addr::service_address("default", "9228").unwrap();
        let blob = packed(&[&a, "garbage", &b, &svc]);
        let mut out = [0u64; 4];
        // SAFETY: live objects of ours; buffers sized for the counts passed.
        unsafe {
            let ops = &*(*av).ops;
            assert_eq!(ops.size, size_of::<ffi::fi_ops_av>());
            let n = ops.insert.unwrap()(
                av,
                blob.as_ptr() as *const c_void,
                4,
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            );
            assert_eq!(n, 3);
            assert_eq!(out, [0, FI_ADDR_NOTAVAIL, 1, 2]);

            let inner = Av::state_of(av as *const ffi::fid).unwrap();
            assert_eq!(inner.lookup(1), Some(peer(11, 2)));
            assert_eq!(inner.reverse_lookup(&peer(10, 1)), Some(0));
            assert_eq!(inner.lookup(2).unwrap().to_string(), svc);

            // Lookup: exact size, then truncated.
            let mut buf = [0u8; 64];
            let mut len = buf.len();
            assert_eq!(
                ops.lookup.unwrap()(av, 0, buf.as_mut_ptr() as *mut c_void, &mut len),
                0
            );
            assert_eq!(len, a.len() + 1);
            assert_eq!(&buf[..len], packed(&[&a]).as_slice());
            let mut small = [0xffu8; 8];
            let mut len = small.len();
            assert_eq!(
                ops.lookup.unwrap()(av, 0, small.as_mut_ptr() as *mut c_void, &mut len),
                0
            );
            assert_eq!(len, a.len() + 1, "full size reported");
            assert_eq!(&small[..7], &a.as_bytes()[..7]);
            assert_eq!(small[7], 0);
            let mut len = 0;
            assert_eq!(ops.lookup.unwrap()(av, 0, ptr::null_mut(), &mut len), 0);
            assert_eq!(len, a.len() + 1);
            assert_eq!(
                ops.lookup.unwrap()(av, 77, ptr::null_mut(), &mut len),
                ret::EINVAL
            );

            // Remove: all or nothing.
            let mut bad = [1u64, 99];
            assert_eq!(ops.remove.unwrap()(av, bad.as_mut_ptr(), 2, 0), ret::EINVAL);
            assert_eq!(inner.lookup(1), Some(peer(11, 2)));
            let mut one = [1u64];
            assert_eq!(ops.remove.unwrap()(av, one.as_mut_ptr(), 1, 0), 0);
            assert_eq!(inner.lookup(1), None);
            assert_eq!(inner.reverse_lookup(&peer(11, 2)), None);
            assert_eq!(ops.remove.unwrap()(av, one.as_mut_ptr(), 1, 0), ret::EINVAL);
            let blob = packed(&[&b]);
            let n = ops.insert.unwrap()(
                av,
                blob.as_ptr() as *const c_void,
                1,
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            );
            assert_eq!((n, out[0]), (1, 3), "re-insert gets a fresh index");

            // straddr: the string itself.
            let mut text = [0 as c_char; 64];
            let mut len = text.len();
            let s = ops.straddr.unwrap()(
                av,
                blob.as_ptr() as *const c_void,
                text.as_mut_ptr(),
                &mut len,
            );
            assert_eq!(s, text.as_ptr());
            assert_eq!(CStr::from_ptr(s).to_str().unwrap(), b);
            assert_eq!(len, b.len() + 1);

            // Bad flags, NULL fi_addr allowed, FI_SYNC_ERR.
            let n = ops.insert.unwrap()(
                av,
                blob.as_ptr() as *const c_void,
                1,
                ptr::null_mut(),
                ffi::FI_PEEK,
                ptr::null_mut(),
            );
            assert_eq!(n, ret::EBADFLAGS);
            let n = ops.insert.unwrap()(
                av,
                blob.as_ptr() as *const c_void,
                1,
                ptr::null_mut(),
                0,
                ptr::null_mut(),
            );
            assert_eq!(n, 1);
            let two = packed(&["unimem://x", &a]);
            let mut errs = [-1 as c_int; 2];
            let n = ops.insert.unwrap()(
                av,
                two.as_ptr() as *const c_void,
                2,
                out.as_mut_ptr(),
                ffi::FI_SYNC_ERR,
                errs.as_mut_ptr() as *mut c_void,
            );
            assert_eq!(n, 1);
            assert_eq!(errs, [ffi::FI_EINVAL, 0]);

            // Service addresses: insertsvc and insertsym.
            let n = ops.insertsvc.unwrap()(
                av,
                c"localhost".as_ptr(),
                c"9228".as_ptr(),
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            );
            assert_eq!(n, 1);
            assert_eq!(inner.lookup(out[0]).unwrap().to_string(), svc);
            let n = ops.insertsvc.unwrap()(
                av,
                c"no-such-host.invalid".as_ptr(),
                c"1".as_ptr(),
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            );
            assert_eq!((n, out[0]), (0, FI_ADDR_NOTAVAIL));
            let cs = std::ffi::CString::new(a.clone()).unwrap();
            let n = ops.insertsvc.unwrap()(
                av,
                cs.as_ptr(),
                ptr::null(),
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            );
            assert_eq!(n, 1);
            assert_eq!(inner.lookup(out[0]), Some(peer(10, 1)));
            let n = ops.insertsym.unwrap()(
                av,
                c"127.0.0.1".as_ptr(),
                2,
                c"100".as_ptr(),
                2,
                out.as_mut_ptr(),
                0,
                ptr::null_mut(),
            );
            assert_eq!(n, 2);
            assert_eq!(inner.lookup(out[1]).unwrap().index, 101);
            assert_eq!(&out[2..], [FI_ADDR_NOTAVAIL; 2]);
            assert_eq!(
                ops.av_set.unwrap()(av, ptr::null_mut(), ptr::null_mut(), ptr::null_mut()),
                ret::ENOSYS
            );

            drop(inner);
            assert_eq!(close(dom as *mut ffi::fid), ret::EBUSY);
            assert_eq!(close(av as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
        }
    }

    #[test]
    fn open_checks_attributes() {
        let (fab, dom) = fabric_domain();
        let name = c"shared";
        let bad = [
            (
                ffi::fi_av_attr {
                    type_: 9,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
            (
                ffi::fi_av_attr {
                    name: name.as_ptr(),
                    ..Default::default()
                },
                Error::ENOSYS,
            ),
            (
                ffi::fi_av_attr {
                    rx_ctx_bits: 2,
                    ..Default::default()
                },
                Error::ENOSYS,
            ),
            (
                ffi::fi_av_attr {
                    flags: ffi::FI_PEEK,
                    ..Default::default()
                },
                Error::EINVAL,
            ),
        ];
        for (mut attr, rc) in bad {
            assert_eq!(open_av(dom, &mut attr).err(), Some(rc));
        }
        let mut attr = ffi::fi_av_attr {
            type_: ffi::FI_AV_MAP,
            count: 1 << 30,
            ..Default::default()
        };
        let av = open_av(dom, &mut attr).unwrap();
        assert_eq!(attr.type_, ffi::FI_AV_MAP);
        // SAFETY: live objects of ours.
        unsafe {
            assert_eq!(close(av as *mut ffi::fid), 0);
            assert_eq!(close(dom as *mut ffi::fid), 0);
            assert_eq!(close(fab as *mut ffi::fid), 0);
            assert_eq!(fid::close::<AvInner>(ptr::null_mut()), ret::EINVAL);
        }
    }
}
