//! The FIFO of a completion queue, without the libfabric object around
//! it: what endpoints report ([`Completion`], [`CompletionError`]) and
//! how it is written out in the application's entry format and API
//! version.

use std::collections::VecDeque;
use std::mem::{offset_of, size_of};
use std::os::raw::{c_int, c_void};
use std::ptr;

use crate::base::errdata;
use crate::base::ffi::{self, Error};

/// One successful operation, as the endpoint reports it.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    pub op_context: *mut c_void,
    /// FI_SEND/FI_RECV | FI_MSG/FI_TAGGED | FI_MULTI_RECV | ...
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    /// For `fi_cq_readfrom`; FI_ADDR_NOTAVAIL when unknown.
    pub src_addr: ffi::fi_addr_t,
}

// SAFETY: the pointers are the application's opaque values (its context
// and buffer addresses); the CQ only hands them back, never dereferences
// them, so moving them between threads is harmless.
unsafe impl Send for Completion {}

impl Completion {
    /// A completion with no length, buffer, data, tag or source.
    pub fn new(op_context: *mut c_void, flags: u64) -> Self {
        Completion {
            op_context,
            flags,
            len: 0,
            buf: ptr::null_mut(),
            data: 0,
            tag: 0,
            src_addr: ffi::FI_ADDR_NOTAVAIL,
        }
    }
}

/// One failed operation.
#[derive(Clone, Debug)]
pub struct CompletionError {
    /// What is known about the operation (flags, context, buffer...).
    pub completion: Completion,
    /// Positive FI_E* code (FI_ETRUNC, FI_ECANCELED, ...).
    pub err: i32,
    /// Positive libfabric error code with more detail, or 0.
    pub prov_errno: i32,
    /// Bytes that did not fit (FI_ETRUNC).
    pub olen: usize,
    /// Provider-specific detail for `fi_cq_strerror`; empty for none.
    pub err_data: Vec<u8>,
}

#[derive(Debug)]
pub(super) enum Entry {
    Done(Completion),
    Failed(Box<CompletionError>),
}

/// `struct fi_cq_err_entry` as of API 1.20 (the 1.17 headers lack
/// `src_addr`). Older applications get a prefix of it.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ErrEntry {
    op_context: *mut c_void,
    flags: u64,
    len: usize,
    buf: *mut c_void,
    data: u64,
    tag: u64,
    olen: usize,
    err: c_int,
    prov_errno: c_int,
    err_data: *mut c_void,
    err_data_size: usize,
    src_addr: ffi::fi_addr_t,
}

/// Size of the entry the application knows, by API version.
const ERR_ENTRY_1_0: usize = offset_of!(ErrEntry, err_data_size);
const ERR_ENTRY_1_5: usize = offset_of!(ErrEntry, src_addr);
const ERR_ENTRY_1_20: usize = size_of::<ErrEntry>();
const _: () = assert!(
    offset_of!(ErrEntry, err_data_size) == offset_of!(ffi::fi_cq_err_entry, err_data_size)
        && (size_of::<ffi::fi_cq_err_entry>() == ERR_ENTRY_1_5
            || size_of::<ffi::fi_cq_err_entry>() == ERR_ENTRY_1_20)
);

const V1_5: u32 = ffi::fi_version(1, 5);
const V1_20: u32 = ffi::fi_version(1, 20);

fn err_entry_size(api: u32) -> usize {
    if ffi::fi_version_lt(api, V1_5) {
        ERR_ENTRY_1_0
    } else if ffi::fi_version_lt(api, V1_20) {
        ERR_ENTRY_1_5
    } else {
        ERR_ENTRY_1_20
    }
}

/// The FIFO proper, without the libfabric object around it.
#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) entries: VecDeque<Entry>,
    /// Error data handed out by the last `fi_cq_readerr` without a buffer.
    pub(super) saved_err_data: Vec<u8>,
}

impl Queue {
    /// `fi_cq_read(from)`: successes up to the first error.
    ///
    /// # Safety
    /// `buf` must be writable for `count` entries of `format`, `src_addr`
    /// NULL or writable for `count` addresses.
    #[inline]
    pub(super) unsafe fn read(
        &mut self,
        format: ffi::fi_cq_format,
        buf: *mut c_void,
        count: usize,
        src_addr: *mut ffi::fi_addr_t,
    ) -> isize {
        match self.entries.front() {
            None => return Error::EAGAIN.ssize(),
            Some(Entry::Failed(_)) => return Error::EAVAIL.ssize(),
            Some(Entry::Done(_)) => {}
        }
        let mut n = 0;
        while n < count {
            let Some(Entry::Done(c)) = self.entries.front() else {
                break;
            };
            // SAFETY: n < count entries fit in buf and src_addr (caller).
            unsafe {
                put(format, buf, n, c);
                if !src_addr.is_null() {
                    src_addr.add(n).write_unaligned(c.src_addr);
                }
            }
            self.entries.pop_front();
            n += 1;
        }
        n as isize
    }

    /// `fi_cq_readerr`: the error at the head, in the layout of API `api`.
    ///
    /// # Safety
    /// `user` must be a writable `fi_cq_err_entry` of API `api`.
    pub(super) unsafe fn read_err(&mut self, api: u32, user: *mut ErrEntry) -> isize {
        if !matches!(self.entries.front(), Some(Entry::Failed(_))) {
            return Error::EAGAIN.ssize();
        }
        let Some(Entry::Failed(e)) = self.entries.pop_front() else {
            unreachable!("head checked above")
        };
        let (user_data, user_size) = if ffi::fi_version_lt(api, V1_5) {
            (ptr::null_mut(), 0)
        } else {
            // SAFETY: both fields exist in the >= 1.5 layout; user is readable (caller).
            unsafe {
                (
                    ptr::addr_of!((*user).err_data).read_unaligned(),
                    ptr::addr_of!((*user).err_data_size).read_unaligned(),
                )
            }
        };
        let e = *e;
        let c = e.completion;
        // SAFETY: user_data is the application's err_data buffer of user_size bytes.
        let (err_data, err_data_size) = unsafe {
            errdata::deliver_err_data(
                api,
                user_data,
                user_size,
                e.err_data,
                &mut self.saved_err_data,
            )
        };
        let out = ErrEntry {
            op_context: c.op_context,
            flags: c.flags,
            len: c.len,
            buf: c.buf,
            data: c.data,
            tag: c.tag,
            olen: e.olen,
            err: e.err,
            prov_errno: e.prov_errno,
            err_data,
            err_data_size,
            src_addr: c.src_addr,
        };
        // SAFETY: the application's entry holds err_entry_size(api) bytes (caller).
        unsafe {
            ptr::copy_nonoverlapping(
                &out as *const ErrEntry as *const u8,
                user as *mut u8,
                err_entry_size(api),
            )
        };
        1
    }
}

/// Store completion `i` of an array in `format`.
///
/// # Safety
/// `buf` must be writable for `i + 1` entries of `format`.
unsafe fn put(format: ffi::fi_cq_format, buf: *mut c_void, i: usize, c: &Completion) {
    // Unaligned writes: nothing obliges the application's buffer to be aligned.
    // SAFETY: in bounds (caller).
    unsafe {
        match format {
            ffi::FI_CQ_FORMAT_MSG => {
                (buf as *mut ffi::fi_cq_msg_entry)
                    .add(i)
                    .write_unaligned(ffi::fi_cq_msg_entry {
                        op_context: c.op_context,
                        flags: c.flags,
                        len: c.len,
                    })
            }
            ffi::FI_CQ_FORMAT_DATA => {
                (buf as *mut ffi::fi_cq_data_entry)
                    .add(i)
                    .write_unaligned(ffi::fi_cq_data_entry {
                        op_context: c.op_context,
                        flags: c.flags,
                        len: c.len,
                        buf: c.buf,
                        data: c.data,
                    })
            }
            ffi::FI_CQ_FORMAT_TAGGED => (buf as *mut ffi::fi_cq_tagged_entry)
                .add(i)
                .write_unaligned(ffi::fi_cq_tagged_entry {
                    op_context: c.op_context,
                    flags: c.flags,
                    len: c.len,
                    buf: c.buf,
                    data: c.data,
                    tag: c.tag,
                }),
            // FI_CQ_FORMAT_CONTEXT (UNSPEC was resolved at open).
            _ => (buf as *mut ffi::fi_cq_entry)
                .add(i)
                .write_unaligned(ffi::fi_cq_entry {
                    op_context: c.op_context,
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(ctx: usize, len: usize) -> Completion {
        Completion {
            len,
            buf: (ctx * 100) as *mut c_void,
            data: 7,
            tag: 0xabc,
            src_addr: ctx as u64,
            ..Completion::new(ctx as *mut c_void, ffi::FI_RECV | ffi::FI_TAGGED)
        }
    }

    fn failed(ctx: usize, err_data: &[u8]) -> Entry {
        Entry::Failed(Box::new(CompletionError {
            completion: done(ctx, 3),
            err: Error::ETRUNC.code(),
            prov_errno: ffi::FI_EIO,
            olen: 9,
            err_data: err_data.to_vec(),
        }))
    }

    fn queue(entries: Vec<Entry>) -> Queue {
        Queue {
            entries: entries.into(),
            saved_err_data: Vec::new(),
        }
    }

    #[test]
    fn formats_copy_the_right_fields() {
        let mut q = queue(vec![Entry::Done(done(1, 10)), Entry::Done(done(2, 20))]);
        let mut tagged = [ffi::fi_cq_tagged_entry::default(); 1];
        let mut src = [0u64; 1];
        // SAFETY: arrays sized for the requested counts.
        let n = unsafe {
            q.read(
                ffi::FI_CQ_FORMAT_TAGGED,
                tagged.as_mut_ptr() as *mut c_void,
                1,
                src.as_mut_ptr(),
            )
        };
        assert_eq!(n, 1);
        let t = tagged[0];
        assert_eq!(
            (t.op_context as usize, t.len, t.buf as usize, t.data, t.tag),
            (1, 10, 100, 7, 0xabc)
        );
        assert_eq!(t.flags, ffi::FI_RECV | ffi::FI_TAGGED);
        assert_eq!(src[0], 1);

        let mut ctx = [ffi::fi_cq_entry::default(); 4];
        // SAFETY: room for 4 entries.
        let n = unsafe {
            q.read(
                ffi::FI_CQ_FORMAT_CONTEXT,
                ctx.as_mut_ptr() as *mut c_void,
                4,
                ptr::null_mut(),
            )
        };
        assert_eq!(n, 1);
        assert_eq!(ctx[0].op_context as usize, 2);
        assert!(ctx[1].op_context.is_null(), "nothing beyond what was read");
        // SAFETY: empty queue, nothing written.
        let n = unsafe {
            q.read(
                ffi::FI_CQ_FORMAT_CONTEXT,
                ctx.as_mut_ptr() as *mut c_void,
                4,
                ptr::null_mut(),
            )
        };
        assert_eq!(n, Error::EAGAIN.ssize());

        q.entries.push_back(Entry::Done(done(3, 30)));
        q.entries.push_back(Entry::Done(done(4, 40)));
        let mut msg = [ffi::fi_cq_msg_entry::default(); 1];
        let mut data = [ffi::fi_cq_data_entry::default(); 1];
        // SAFETY: one entry each.
        unsafe {
            assert_eq!(
                q.read(
                    ffi::FI_CQ_FORMAT_MSG,
                    msg.as_mut_ptr() as *mut c_void,
                    1,
                    ptr::null_mut()
                ),
                1
            );
            assert_eq!(
                q.read(
                    ffi::FI_CQ_FORMAT_DATA,
                    data.as_mut_ptr() as *mut c_void,
                    1,
                    ptr::null_mut()
                ),
                1
            );
        }
        assert_eq!((msg[0].op_context as usize, msg[0].len), (3, 30));
        assert_eq!(
            (
                data[0].op_context as usize,
                data[0].buf as usize,
                data[0].data
            ),
            (4, 400, 7)
        );
    }

    #[test]
    fn errors_are_delivered_in_order() {
        let mut q = queue(vec![
            Entry::Done(done(1, 1)),
            failed(2, b"why"),
            Entry::Done(done(3, 3)),
        ]);
        let mut ctx = [ffi::fi_cq_entry::default(); 3];
        let mut read = |q: &mut Queue, count| {
            // SAFETY: room for 3 entries.
            unsafe {
                q.read(
                    ffi::FI_CQ_FORMAT_CONTEXT,
                    ctx.as_mut_ptr() as *mut c_void,
                    count,
                    ptr::null_mut(),
                )
            }
        };
        assert_eq!(read(&mut q, 3), 1, "stops before the error");
        assert_eq!(read(&mut q, 3), Error::EAVAIL.ssize());
        assert_eq!(read(&mut q, 0), Error::EAVAIL.ssize());

        let mut e = ErrEntry {
            err_data: ptr::null_mut(),
            err_data_size: 0,
            // SAFETY: all-zero is a valid ErrEntry (pointers NULL).
            ..unsafe { std::mem::zeroed() }
        };
        // SAFETY: e is a full 1.20 entry.
        assert_eq!(unsafe { q.read_err(ffi::fi_version(1, 20), &mut e) }, 1);
        assert_eq!(
            (e.op_context as usize, e.err, e.olen),
            (2, Error::ETRUNC.code(), 9)
        );
        assert_eq!((e.prov_errno, e.src_addr), (ffi::FI_EIO, 2));
        // No buffer offered: provider-owned data.
        assert_eq!(e.err_data_size, 3);
        // SAFETY: the queue keeps the data until the next readerr.
        let data = unsafe { std::slice::from_raw_parts(e.err_data as *const u8, 3) };
        assert_eq!(data, b"why");
        // SAFETY: as above.
        let again = unsafe { q.read_err(ffi::fi_version(1, 20), &mut e) };
        assert_eq!(again, Error::EAGAIN.ssize());
        assert_eq!(read(&mut q, 3), 1);
        assert_eq!(read(&mut q, 0), Error::EAGAIN.ssize());
    }

    #[test]
    fn readerr_respects_the_api_version_and_user_buffers() {
        // API 1.17: src_addr beyond the application's struct stays untouched.
        let mut q = queue(vec![failed(5, b"0123456789")]);
        let mut user_buf = [0u8; 4];
        // SAFETY: all-zero is a valid ErrEntry.
        let mut e: ErrEntry = unsafe { std::mem::zeroed() };
        e.src_addr = 0x5a5a;
        e.err_data = user_buf.as_mut_ptr() as *mut c_void;
        e.err_data_size = user_buf.len();
        // SAFETY: e is larger than the 1.17 layout.
        assert_eq!(unsafe { q.read_err(ffi::fi_version(1, 17), &mut e) }, 1);
        assert_eq!(e.src_addr, 0x5a5a);
        assert_eq!(e.err_data, user_buf.as_mut_ptr() as *mut c_void);
        assert_eq!(e.err_data_size, 4);
        assert_eq!(&user_buf, b"0123");

        // API 1.4: 1.0 layout, err_data_size not even read or written.
        let mut q = queue(vec![failed(6, b"xy")]);
        // SAFETY: all-zero is a valid ErrEntry.
        let mut e: ErrEntry = unsafe { std::mem::zeroed() };
        e.err_data_size = 77;
        // SAFETY: as above.
        assert_eq!(unsafe { q.read_err(ffi::fi_version(1, 4), &mut e) }, 1);
        assert_eq!(e.err_data_size, 77);
        assert_eq!(e.err_data, q.saved_err_data.as_mut_ptr() as *mut c_void);
        assert_eq!(err_entry_size(ffi::fi_version(1, 4)), 8 * 7 + 4 + 4 + 8);
        assert_eq!(err_entry_size(ffi::fi_version(2, 0)), ERR_ENTRY_1_5 + 8);
    }
}
