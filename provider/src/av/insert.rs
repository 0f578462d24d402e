//! The insert calls (`fi_av_insert`, `fi_av_insertsvc`,
//! `fi_av_insertsym`): addresses parsed or made from services, checked,
//! then inserted all at once (reported through the bound EQ with
//! FI_EVENT).

use std::os::raw::{c_char, c_int, c_void};

use unimem_mailbox::MailboxAddr;

use super::{av_of, c_bytes, AvInner};
use crate::base::ffi::{self, ret, Error, FI_ADDR_NOTAVAIL};
use crate::base::guard::ffi_guard;
use crate::eq::EqError;
use crate::info::addr;
use crate::info::getinfo;

impl AvInner {
    /// Insert parsed addresses: Ok(address) or Err(why not) each.
    /// Writes `fi_addr` (and FI_SYNC_ERR's `sync_err`) and returns what
    /// fi_av_insert returns; with FI_EVENT, reports through the EQ.
    ///
    /// # Safety
    /// `fi_addr` NULL or writable for `items.len()` entries; with
    /// FI_SYNC_ERR, `context` writable for as many ints.
    unsafe fn insert_all(
        &self,
        av_fid: *mut ffi::fid,
        items: Vec<Result<MailboxAddr, Error>>,
        fi_addr: *mut ffi::fi_addr_t,
        flags: u64,
        context: *mut c_void,
    ) -> c_int {
        // Held throughout: the EQ cannot be unbound in the middle.
        let eq = self.eq.lock();
        let sync_err = (flags & ffi::FI_SYNC_ERR != 0).then_some(context as *mut c_int);
        let mut inserted = 0;
        let mut table = self.table.write();
        for (i, item) in items.into_iter().enumerate() {
            let (value, status) = match item {
                Ok(a) => {
                    inserted += 1;
                    (table.insert(a), 0)
                }
                Err(e) => (FI_ADDR_NOTAVAIL, e.code()),
            };
            // SAFETY: fi_addr and sync_err hold one entry per address (caller).
            unsafe {
                if !fi_addr.is_null() {
                    fi_addr.add(i).write_unaligned(value);
                }
                if let Some(p) = sync_err {
                    p.add(i).write_unaligned(status);
                }
            }
            if status != 0 {
                tracing::info!("AV insert: address {i} not inserted (error {status})");
                if let Some(eq) = eq.as_deref() {
                    eq.write_error(EqError {
                        fid: av_fid,
                        context,
                        data: i as u64,
                        err: status,
                        prov_errno: 0,
                        err_data: Vec::new(),
                    });
                }
            }
        }
        drop(table);
        match eq.as_deref() {
            Some(eq) => {
                eq.write_entry(ffi::FI_AV_COMPLETE, av_fid, context, inserted as u64);
                ret::SUCCESS
            }
            None => inserted,
        }
    }

    /// Checks shared by the insert calls (fi_av(3)).
    fn check_insert(&self, flags: u64, context: *mut c_void, op: &str) -> Result<(), Error> {
        if self.events && self.eq.lock().is_none() {
            tracing::warn!("{op}: AV opened with FI_EVENT but no EQ is bound");
            return Err(Error::ENOEQ);
        }
        let unknown = flags & !(ffi::FI_MORE | ffi::FI_SYNC_ERR);
        if unknown != 0 {
            tracing::warn!("{op}: unsupported flags {unknown:#x}");
            return Err(Error::EBADFLAGS);
        }
        if flags & ffi::FI_SYNC_ERR != 0 {
            if self.events {
                tracing::warn!("{op}: FI_SYNC_ERR on an FI_EVENT AV (errors go to the EQ)");
                return Err(Error::EBADFLAGS);
            }
            if context.is_null() {
                tracing::warn!("{op}: FI_SYNC_ERR without an error array as context");
                return Err(Error::EINVAL);
            }
        }
        Ok(())
    }

    /// The address of `service` on `node` (NULL or this host).
    fn service_addr(&self, node: Option<&str>, service: &str) -> Result<MailboxAddr, Error> {
        if let Some(node) = node.filter(|n| !getinfo::node_is_local(n, false)) {
            tracing::info!("AV insert: node '{node}' is not this host");
            return Err(Error::EHOSTUNREACH);
        }
        if service.is_empty() {
            return Err(Error::EINVAL);
        }
        Ok(MailboxAddr::for_service(self.job, service))
    }
}

fn parse_addr(text: &[u8]) -> Result<MailboxAddr, Error> {
    addr::parse(text).ok_or_else(|| {
        tracing::info!(
            "fi_av_insert: '{}' is not a unimem address",
            String::from_utf8_lossy(text)
        );
        Error::EINVAL
    })
}

pub(super) unsafe extern "C" fn av_insert(
    av: *mut ffi::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut ffi::fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    ffi_guard("fi_av_insert", || {
        // SAFETY: fid_av starts with its fid (application's pointer).
        let Some(inner) = (unsafe { av_of(av, "fi_av_insert") }) else {
            return ret::EINVAL;
        };
        if let Err(e) = inner.check_insert(flags, context, "fi_av_insert") {
            return e.ret();
        }
        if addr.is_null() && count > 0 {
            tracing::warn!("fi_av_insert: NULL addresses");
            return ret::EINVAL;
        }
        let mut items = Vec::with_capacity(count);
        let mut p = addr as *const c_char;
        for i in 0..count {
            // SAFETY: addr holds `count` NUL-terminated strings back to back,
            // each followed by at most fi_getname's padding (API contract).
            let text = unsafe { c_bytes(p) };
            items.push(parse_addr(text));
            // SAFETY: the next string (or its padding) starts after this
            // one's NUL.
            p = unsafe { p.add(text.len() + 1) };
            // Past the padding of fi_getname's fixed length, if the caller
            // kept it (a name is never empty, so a NUL there is padding).
            if i + 1 < count {
                for _ in text.len() + 1..addr::MAX_ADDR_LEN {
                    // SAFETY: a byte of this name's padding or the next
                    // name's first: inside the caller's buffer, since a
                    // next name follows.
                    if unsafe { *p } != 0 {
                        break;
                    }
                    // SAFETY: as above.
                    p = unsafe { p.add(1) };
                }
            }
        }
        // SAFETY: fi_addr/context hold `count` entries (API contract).
        unsafe { inner.insert_all(av as *mut ffi::fid, items, fi_addr, flags, context) }
    })
}

pub(super) unsafe extern "C" fn av_insertsvc(
    av: *mut ffi::fid_av,
    node: *const c_char,
    service: *const c_char,
    fi_addr: *mut ffi::fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    ffi_guard("fi_av_insertsvc", || {
        // SAFETY: fid_av starts with its fid (application's pointer).
        let Some(inner) = (unsafe { av_of(av, "fi_av_insertsvc") }) else {
            return ret::EINVAL;
        };
        if let Err(e) = inner.check_insert(flags, context, "fi_av_insertsvc") {
            return e.ret();
        }
        let item = if service.is_null() {
            // An FI_ADDR_STR address in `node`.
            if node.is_null() {
                tracing::warn!("fi_av_insertsvc: neither node nor service");
                return ret::EINVAL;
            }
            // SAFETY: node is a NUL-terminated string (API contract).
            parse_addr(unsafe { c_bytes(node) })
        } else {
            // SAFETY: node (NULL or not) and service are C strings (API contract).
            match unsafe { (ffi::opt_str(node), ffi::opt_str(service)) } {
                (Ok(node), Ok(Some(service))) => inner.service_addr(node, service),
                _ => Err(Error::EINVAL),
            }
        };
        // SAFETY: fi_addr/context hold one entry (API contract).
        unsafe { inner.insert_all(av as *mut ffi::fid, vec![item], fi_addr, flags, context) }
    })
}

/// `fi_av_insertsym`: services `service .. service + svccnt - 1` on each of
/// `nodecnt` nodes. Only the first node can be this host (unimem reaches
/// this host only); addresses on the others fail like any foreign node.
pub(super) unsafe extern "C" fn av_insertsym(
    av: *mut ffi::fid_av,
    node: *const c_char,
    nodecnt: usize,
    service: *const c_char,
    svccnt: usize,
    fi_addr: *mut ffi::fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    ffi_guard("fi_av_insertsym", || {
        // SAFETY: fid_av starts with its fid (application's pointer).
        let Some(inner) = (unsafe { av_of(av, "fi_av_insertsym") }) else {
            return ret::EINVAL;
        };
        if let Err(e) = inner.check_insert(flags, context, "fi_av_insertsym") {
            return e.ret();
        }
        // SAFETY: node and service are C strings (API contract).
        let (node, base) = match unsafe { (ffi::opt_str(node), ffi::opt_str(service)) } {
            (Ok(Some(n)), Ok(Some(s))) => match s.parse::<u32>() {
                Ok(b) if u64::from(b) + (svccnt as u64) <= u64::from(u32::MAX) + 1 => (n, b),
                _ => {
                    tracing::warn!("fi_av_insertsym: service '{s}' is not a numeric range start");
                    return ret::EINVAL;
                }
            },
            _ => {
                tracing::warn!("fi_av_insertsym: node and service must be given");
                return ret::EINVAL;
            }
        };
        let Some(total) = nodecnt
            .checked_mul(svccnt)
            .filter(|&t| t <= u32::MAX as usize)
        else {
            tracing::warn!("fi_av_insertsym: {nodecnt} x {svccnt} addresses is too many");
            return ret::EINVAL;
        };
        let mut items = Vec::with_capacity(total);
        for n in 0..nodecnt {
            for s in 0..svccnt {
                let svc = (u64::from(base) + s as u64).to_string();
                items.push(if n == 0 {
                    inner.service_addr(Some(node), &svc)
                } else {
                    Err(Error::EHOSTUNREACH)
                });
            }
        }
        // SAFETY: fi_addr/context hold nodecnt * svccnt entries (API contract).
        unsafe { inner.insert_all(av as *mut ffi::fid, items, fi_addr, flags, context) }
    })
}
