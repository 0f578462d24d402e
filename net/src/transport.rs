//! The network transport under the network backend: one RDM endpoint of
//! another libfabric provider (`tcp` by default), opened through the core
//! that loaded us, as libfabric's utility providers open their core
//! providers. Everything here is a thin, checked call through the opened
//! objects' operation tables; the caller (`nic/`) serializes the calls.
//!
//! The core hides providers that `FI_PROVIDER` filters out (with
//! `FI_PROVIDER=unimem`, `tcp` is one), except from a lookup that asks for
//! hidden ones: the flag below, the core's own internal one, which every
//! core since 1.10 honours.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::c_int;
use std::ptr;
use std::sync::OnceLock;

use unimem_mailbox::NicAddr;

use unimem_fi_sys as ffi;
use unimem_fi_sys::core::{self, LayerFns};
use unimem_fi_sys::Error;

/// `OFI_GETINFO_HIDDEN` (libfabric's `include/ofi.h`): list providers the
/// `FI_PROVIDER` filter hid.
const OFI_GETINFO_HIDDEN: u64 = 1 << 60;

/// Room for a `fi_cq_err_entry` of any core version (2.x appended fields
/// to the 1.17 struct).
const ERR_ENTRY_ROOM: usize = 256;

/// The most completions one [`Transport::poll`] returns.
pub const POLL_MAX: usize = 16;

/// A completion the transport reported.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    pub context: u64,
    /// Bytes received (receives only).
    pub len: usize,
    /// Set: the operation failed (the transport's error number).
    pub error: Option<c_int>,
}

/// One remote-access registration of a range of our memory.
pub struct Registration {
    /// Open until the interface closes: peers may use the key until then.
    _mr: *mut ffi::fid_mr,
    pub key: u64,
}

// SAFETY: a libfabric object of a FI_THREAD_SAFE domain, used under the
// NIC's lock.
unsafe impl Send for Registration {}

/// The transport's endpoint and the objects under it.
pub struct Transport {
    fns: LayerFns,
    /// What fi_getinfo returned (freed on close), and the entry used.
    list: *mut ffi::fi_info,
    info: *mut ffi::fi_info,
    fabric: *mut ffi::fid_fabric,
    domain: *mut ffi::fid_domain,
    cq: *mut ffi::fid_cq,
    av: *mut ffi::fid_av,
    ep: *mut ffi::fid_ep,
    /// Where peers reach this endpoint.
    pub name: NicAddr,
    /// The provider that carries it (`tcp`, `tcp;ofi_rxm`, `verbs;ofi_rxm`).
    pub provider: String,
    /// Largest message `inject` takes.
    pub inject_size: usize,
    /// Largest message that keeps its order with the others: a utility
    /// provider over a connection (`ofi_rxm`) sends longer ones by a
    /// protocol of their own, which later short ones can pass. `usize::MAX`
    /// where the provider names no such limit.
    pub in_order_max: usize,
    /// Remote addresses are virtual addresses (else offsets into the
    /// registration).
    pub virt_addr: bool,
    /// The provider picks registration keys.
    pub prov_key: bool,
}

// SAFETY: the objects are libfabric's, opened FI_THREAD_SAFE; the owner
// (the NIC) calls them under its lock.
unsafe impl Send for Transport {}

/// Runs `f` with this thread's allocations served by the system, not by
/// the preloaded dmable heap, if there is one: the transport's buffers are
/// no application data, and would take dmable memory (in `/dev/shm`) that
/// the node's peers and the application need.
fn system_allocations<R>(f: impl FnOnce() -> R) -> R {
    type SystemOnlyFn = unsafe extern "C" fn(c_int) -> c_int;
    static SYSTEM_ONLY: OnceLock<Option<SystemOnlyFn>> = OnceLock::new();
    let switch = *SYSTEM_ONLY.get_or_init(|| {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT is valid for dlsym.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"unimem_heap_system_only".as_ptr()) };
        // SAFETY: the heap's export of that name has this signature.
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, SystemOnlyFn>(p) })
    });
    let Some(switch) = switch else {
        return f();
    };
    // SAFETY: the heap's switch only sets a thread-local flag.
    let before = unsafe { switch(1) };
    let result = f();
    // SAFETY: as above.
    unsafe { switch(before) };
    result
}

/// Turns a negative return into the positive error number.
fn check(ret: c_int, what: &str) -> Result<(), String> {
    if ret < 0 {
        Err(format!("{what}: {}", core::strerror(ret)))
    } else {
        Ok(())
    }
}

impl Transport {
    /// Opens an RDM endpoint of `provider` bound to `ip` (an ephemeral
    /// port), with messages and RMA.
    pub fn open(provider: &str, ip: [u8; 4]) -> Result<Transport, String> {
        system_allocations(|| {
            let fns = core::get()
                .and_then(|c| c.layer)
                .ok_or("the libfabric core lacks fi_getinfo/fi_fabric")?;
            let version = core::get().map_or(ffi::HEADER_FI_VERSION, |c| c.fi_version());
            // SAFETY: fi_dupinfo(NULL) allocates a zeroed info with its
            // attribute structs, of the core's sizes (ours are a prefix).
            let hints = unsafe { (fns.dupinfo)(ptr::null()) };
            if hints.is_null() {
                return Err("fi_allocinfo failed".into());
            }
            let prov = CString::new(provider).map_err(|_| "bad provider name")?;
            // SAFETY: hints and its attribute structs were just allocated;
            // prov_name is freed by fi_freeinfo with the C allocator.
            unsafe {
                let h = &mut *hints;
                h.caps = ffi::FI_MSG
                    | ffi::FI_RMA
                    | ffi::FI_SEND
                    | ffi::FI_RECV
                    | ffi::FI_READ
                    | ffi::FI_WRITE
                    | ffi::FI_REMOTE_READ
                    | ffi::FI_REMOTE_WRITE;
                h.addr_format = ffi::FI_SOCKADDR_IN;
                (*h.ep_attr).type_ = ffi::FI_EP_RDM;
                (*h.domain_attr).threading = ffi::FI_THREAD_SAFE;
                // We poll (the data path, and the interface's thread when the
                // data path does not): a progress thread of the transport's
                // own would only hand each packet over to us, a wake-up later.
                (*h.domain_attr).data_progress = ffi::FI_PROGRESS_MANUAL;
                (*h.domain_attr).control_progress = ffi::FI_PROGRESS_MANUAL;
                (*h.domain_attr).mr_mode =
                    (ffi::FI_MR_VIRT_ADDR | ffi::FI_MR_ALLOCATED | ffi::FI_MR_PROV_KEY) as c_int;
                // A mailbox message sent after a put must arrive after its
                // data: the protocol announces data it put.
                (*h.tx_attr).msg_order = ffi::FI_ORDER_SAS | ffi::FI_ORDER_SAW;
                (*h.fabric_attr).prov_name = libc::strdup(prov.as_ptr());
            }
            let [a, b, c, d] = ip;
            let node = CString::new(format!("{a}.{b}.{c}.{d}")).expect("no NUL");
            let mut found: *mut ffi::fi_info = ptr::null_mut();
            // SAFETY: valid hints and out pointer; node is NUL-terminated.
            let ret = unsafe {
                (fns.getinfo)(
                    version,
                    node.as_ptr(),
                    ptr::null(),
                    ffi::FI_SOURCE | OFI_GETINFO_HIDDEN,
                    hints,
                    &mut found,
                )
            };
            // SAFETY: hints came from fi_dupinfo.
            unsafe { (fns.freeinfo)(hints) };
            check(ret, &format!("fi_getinfo({provider}, {node:?})"))?;
            if found.is_null() {
                return Err(format!("no {provider} interface at {node:?}"));
            }
            // The provider itself before utility providers layered over it
            // (2.x lists `tcp;ofi_rxm` before `tcp`; the layered one cannot
            // open over a core provider that FI_PROVIDER hides).
            let mut chosen = found;
            let mut at = found;
            while !at.is_null() {
                // SAFETY: entries of the list fi_getinfo returned.
                let (name, next) =
                    unsafe { (CStr::from_ptr((*(*at).fabric_attr).prov_name), (*at).next) };
                if name.to_bytes() == provider.as_bytes() {
                    chosen = at;
                    break;
                }
                at = next;
            }
            let mut transport = Transport {
                fns,
                list: found,
                info: chosen,
                fabric: ptr::null_mut(),
                domain: ptr::null_mut(),
                cq: ptr::null_mut(),
                av: ptr::null_mut(),
                ep: ptr::null_mut(),
                name: NicAddr { ip, port: 0 },
                provider: String::new(),
                inject_size: 0,
                in_order_max: usize::MAX,
                virt_addr: false,
                prov_key: false,
            };
            // On error, Drop closes what was opened.
            transport.open_objects()?;
            Ok(transport)
        })
    }

    fn open_objects(&mut self) -> Result<(), String> {
        // SAFETY: info is the first entry fi_getinfo returned; its
        // attribute pointers are valid. Each object is opened through its
        // parent's operation table, as the header's inline wrappers do,
        // and stored at once so that Drop closes it.
        unsafe {
            let info = &*self.info;
            self.provider = CStr::from_ptr((*info.fabric_attr).prov_name)
                .to_string_lossy()
                .into_owned();
            self.inject_size = (*info.tx_attr).inject_size;
            let mr_mode = (*info.domain_attr).mr_mode as u64;
            self.virt_addr = mr_mode & ffi::FI_MR_VIRT_ADDR != 0;
            self.prov_key = mr_mode & ffi::FI_MR_PROV_KEY != 0;
            check(
                (self.fns.fabric)(info.fabric_attr, &mut self.fabric, ptr::null_mut()),
                "fi_fabric",
            )?;
            let fabric_ops = &*(*self.fabric).ops;
            check(
                fabric_ops.domain.ok_or("no domain op")?(
                    self.fabric,
                    self.info,
                    &mut self.domain,
                    ptr::null_mut(),
                ),
                "fi_domain",
            )?;
            let domain_ops = &*(*self.domain).ops;
            let mut cq_attr: ffi::fi_cq_attr = std::mem::zeroed();
            cq_attr.format = ffi::FI_CQ_FORMAT_MSG;
            cq_attr.wait_obj = ffi::FI_WAIT_NONE;
            cq_attr.size = 1024;
            check(
                domain_ops.cq_open.ok_or("no cq_open op")?(
                    self.domain,
                    &mut cq_attr,
                    &mut self.cq,
                    ptr::null_mut(),
                ),
                "fi_cq_open",
            )?;
            let mut av_attr: ffi::fi_av_attr = std::mem::zeroed();
            av_attr.type_ = ffi::FI_AV_TABLE;
            check(
                domain_ops.av_open.ok_or("no av_open op")?(
                    self.domain,
                    &mut av_attr,
                    &mut self.av,
                    ptr::null_mut(),
                ),
                "fi_av_open",
            )?;
            check(
                domain_ops.endpoint.ok_or("no endpoint op")?(
                    self.domain,
                    self.info,
                    &mut self.ep,
                    ptr::null_mut(),
                ),
                "fi_endpoint",
            )?;
            let ep_fid = ptr::addr_of_mut!((*self.ep).fid);
            let ep_ops = &*(*ep_fid).ops;
            let bind = ep_ops.bind.ok_or("no bind op")?;
            check(
                bind(
                    ep_fid,
                    ptr::addr_of_mut!((*self.cq).fid),
                    ffi::FI_TRANSMIT | ffi::FI_RECV,
                ),
                "fi_ep_bind(cq)",
            )?;
            check(
                bind(ep_fid, ptr::addr_of_mut!((*self.av).fid), 0),
                "fi_ep_bind(av)",
            )?;
            check(
                ep_ops.control.ok_or("no control op")?(
                    ep_fid,
                    ffi::FI_ENABLE as c_int,
                    ptr::null_mut(),
                ),
                "fi_enable",
            )?;
            if let Some(getopt) = (*(*self.ep).ops).getopt {
                let mut limit: usize = 0;
                let mut limit_len = std::mem::size_of::<usize>();
                let ret = getopt(
                    ep_fid,
                    ffi::FI_OPT_ENDPOINT as c_int,
                    ffi::FI_OPT_BUFFERED_LIMIT as c_int,
                    ptr::addr_of_mut!(limit).cast(),
                    &mut limit_len,
                );
                if ret == 0 && limit > 0 {
                    self.in_order_max = limit;
                }
            }
            let mut name: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>();
            check(
                (*(*self.ep).cm).getname.ok_or("no getname op")?(
                    ep_fid,
                    ptr::addr_of_mut!(name).cast(),
                    &mut len,
                ),
                "fi_getname",
            )?;
            if name.sin_family != libc::AF_INET as libc::sa_family_t {
                return Err("the transport's address is not IPv4".into());
            }
            self.name = NicAddr {
                ip: name.sin_addr.s_addr.to_ne_bytes(),
                port: u16::from_be(name.sin_port),
            };
        }
        Ok(())
    }

    /// Adds a peer's interface to the address vector.
    pub fn insert(&mut self, nic: NicAddr) -> Result<ffi::fi_addr_t, String> {
        system_allocations(|| {
            let addr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: nic.port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(nic.ip),
                },
                sin_zero: [0; 8],
            };
            let mut fi_addr = ffi::FI_ADDR_NOTAVAIL;
            // SAFETY: av is open; one address of the AV's format in, one out.
            let ret = unsafe {
                (*(*self.av).ops).insert.ok_or("no insert op")?(
                    self.av,
                    ptr::addr_of!(addr).cast(),
                    1,
                    &mut fi_addr,
                    0,
                    ptr::null_mut(),
                )
            };
            if ret != 1 {
                return Err(format!("fi_av_insert({nic}) = {ret}"));
            }
            Ok(fi_addr)
        })
    }

    /// Posts a receive into `buf` (valid until its completion).
    pub fn post_recv(&mut self, buf: *mut u8, len: usize, context: u64) -> isize {
        system_allocations(|| {
            // SAFETY: the endpoint is open; the caller keeps buf valid until
            // the completion (the NIC owns its receive buffers).
            unsafe {
                match (*(*self.ep).msg).recv {
                    Some(recv) => recv(
                        self.ep,
                        buf.cast(),
                        len,
                        ptr::null_mut(),
                        ffi::FI_ADDR_NOTAVAIL, // = FI_ADDR_UNSPEC: from anyone
                        context as *mut c_void,
                    ),
                    None => Error::ENOSYS.ssize(),
                }
            }
        })
    }

    /// Sends `data` with no completion (at most `inject_size` bytes).
    pub fn inject(&mut self, data: &[u8], dest: ffi::fi_addr_t) -> isize {
        system_allocations(|| {
            // SAFETY: inject copies the bytes within the call.
            unsafe {
                match (*(*self.ep).msg).inject {
                    Some(inject) => inject(self.ep, data.as_ptr().cast(), data.len(), dest),
                    None => Error::ENOSYS.ssize(),
                }
            }
        })
    }

    /// Sends `len` bytes at `buf` (valid until its completion).
    pub fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: ffi::fi_addr_t,
        context: u64,
    ) -> isize {
        system_allocations(|| {
            // SAFETY: the caller keeps buf valid until the completion.
            unsafe {
                match (*(*self.ep).msg).send {
                    Some(send) => send(
                        self.ep,
                        buf.cast(),
                        len,
                        ptr::null_mut(),
                        dest,
                        context as *mut c_void,
                    ),
                    None => Error::ENOSYS.ssize(),
                }
            }
        })
    }

    /// Writes local `[buf, buf + len)` to `addr` under `key` at `dest`
    /// (`write`), or reads from there into it.
    #[allow(clippy::too_many_arguments)]
    pub fn rma(
        &mut self,
        write: bool,
        buf: *mut u8,
        len: usize,
        dest: ffi::fi_addr_t,
        addr: u64,
        key: u64,
        context: u64,
    ) -> isize {
        let context = context as *mut c_void;
        system_allocations(|| {
            // SAFETY: the caller keeps buf valid until the completion.
            unsafe {
                let ops = &*(*self.ep).rma;
                let ret = if write {
                    ops.write.map(|op| {
                        op(
                            self.ep,
                            buf.cast(),
                            len,
                            ptr::null_mut(),
                            dest,
                            addr,
                            key,
                            context,
                        )
                    })
                } else {
                    ops.read.map(|op| {
                        op(
                            self.ep,
                            buf.cast(),
                            len,
                            ptr::null_mut(),
                            dest,
                            addr,
                            key,
                            context,
                        )
                    })
                };
                ret.unwrap_or(Error::ENOSYS.ssize())
            }
        })
    }

    /// Registers `[base, base + len)` of ours for peers to read and write.
    pub fn register(&mut self, base: u64, len: usize, key: u64) -> Result<Registration, String> {
        system_allocations(|| {
            let mut mr: *mut ffi::fid_mr = ptr::null_mut();
            // SAFETY: the domain is open; the range is dmable memory that stays
            // mapped for the process's life (segments are never unmapped while
            // the NIC runs); mr is an out pointer.
            let ret = unsafe {
                (*(*self.domain).mr).reg.ok_or("no mr reg op")?(
                    ptr::addr_of_mut!((*self.domain).fid),
                    base as *const c_void,
                    len,
                    ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE,
                    0,
                    key,
                    0,
                    &mut mr,
                    ptr::null_mut(),
                )
            };
            check(ret, "fi_mr_reg")?;
            // SAFETY: a successful registration fills in mr.
            let key = unsafe { (*mr).key };
            Ok(Registration { _mr: mr, key })
        })
    }

    /// The next completions, at most [`POLL_MAX`], into `out` (cleared
    /// first); an error completion comes alone.
    pub fn poll(&mut self, out: &mut Vec<Completion>) {
        system_allocations(|| {
            out.clear();
            // SAFETY: zeroed entries are valid plain data.
            let mut entries: [ffi::fi_cq_msg_entry; POLL_MAX] = unsafe { std::mem::zeroed() };
            // SAFETY: the CQ is open, of FI_CQ_FORMAT_MSG; room for POLL_MAX entries.
            let n = unsafe {
                match (*(*self.cq).ops).read {
                    Some(read) => read(self.cq, entries.as_mut_ptr().cast(), entries.len()),
                    None => return,
                }
            };
            if n > 0 {
                out.extend(entries[..n as usize].iter().map(|e| Completion {
                    context: e.op_context as u64,
                    len: e.len,
                    error: None,
                }));
            } else if n == Error::EAVAIL.ssize() {
                // A buffer larger than any core's error entry, as its
                // readerr copies the size of its own version.
                let mut room = [0u64; ERR_ENTRY_ROOM / 8];
                // SAFETY: as above; the buffer is aligned and large enough.
                let got = unsafe {
                    match (*(*self.cq).ops).readerr {
                        Some(readerr) => readerr(self.cq, room.as_mut_ptr().cast(), 0),
                        None => return,
                    }
                };
                if got > 0 {
                    // SAFETY: readerr wrote an entry whose prefix is our struct.
                    let err = unsafe { &*room.as_ptr().cast::<ffi::fi_cq_err_entry>() };
                    out.push(Completion {
                        context: err.op_context as u64,
                        len: 0,
                        error: Some(err.err.max(1)),
                    });
                }
            }
        })
    }
}

/// Closes one object; a failure is only logged (nothing else to do).
fn close(fid: *mut ffi::fid) {
    // SAFETY: fid is an open object of the transport's provider.
    let ret = unsafe {
        match (*(*fid).ops).close {
            Some(close) => close(fid),
            None => 0,
        }
    };
    if ret != 0 {
        tracing::debug!("network transport: close failed: {}", core::strerror(ret));
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        system_allocations(|| {
            // Children before parents, as libfabric requires.
            // SAFETY: each pointer is null or an open object of ours.
            unsafe {
                if !self.ep.is_null() {
                    close(ptr::addr_of_mut!((*self.ep).fid));
                }
                if !self.av.is_null() {
                    close(ptr::addr_of_mut!((*self.av).fid));
                }
                if !self.cq.is_null() {
                    close(ptr::addr_of_mut!((*self.cq).fid));
                }
                if !self.domain.is_null() {
                    close(ptr::addr_of_mut!((*self.domain).fid));
                }
                if !self.fabric.is_null() {
                    close(ptr::addr_of_mut!((*self.fabric).fid));
                }
                (self.fns.freeinfo)(self.list);
            }
        })
    }
}
