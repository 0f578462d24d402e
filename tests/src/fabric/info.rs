//! `fi_getinfo`: the hints asked with, and the list of `fi_info` it returns.

use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};

use unimem_fi_sys as ffi;

use super::Api;

/// What `fi_getinfo` is asked for.
#[derive(Clone, Debug)]
pub struct Hints {
    pub caps: u64,
    pub ep_type: ffi::fi_ep_type,
    pub prov_name: Option<String>,
    /// `tx_attr.op_flags`: the endpoint's default send flags.
    pub tx_op_flags: u64,
    /// `domain_attr.data_progress` and `control_progress` (UNSPEC: none).
    pub progress: ffi::fi_progress,
    /// `domain_attr.threading` (UNSPEC: none).
    pub threading: ffi::fi_threading,
}

impl Default for Hints {
    /// The unimem RDM endpoint with everything the fabric tests use.
    fn default() -> Self {
        Hints {
            caps: ffi::FI_MSG
                | ffi::FI_TAGGED
                | ffi::FI_SOURCE
                | ffi::FI_DIRECTED_RECV
                | ffi::FI_MULTI_RECV
                | ffi::FI_RMA
                | ffi::FI_ATOMIC,
            ep_type: ffi::FI_EP_RDM,
            prov_name: Some("unimem".into()),
            tx_op_flags: 0,
            progress: ffi::FI_PROGRESS_UNSPEC,
            threading: ffi::FI_THREAD_UNSPEC,
        }
    }
}

/// A list of `fi_info` from `fi_getinfo`; freed on drop.
pub struct Info {
    pub(super) api: &'static Api,
    pub(super) ptr: *mut ffi::fi_info,
}

impl Info {
    /// `fi_getinfo(version, NULL, NULL, 0, hints)`, or its negative code.
    pub fn get(api: &'static Api, hints: &Hints) -> Result<Info, i32> {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo(): every attribute
        // struct allocated and zeroed; the strdup'ed name is freed by
        // fi_freeinfo; every pointer passed is live.
        unsafe {
            let h = (api.dupinfo)(null());
            assert!(!h.is_null(), "fi_allocinfo failed");
            (*h).caps = hints.caps;
            (*(*h).ep_attr).type_ = hints.ep_type;
            (*(*h).tx_attr).op_flags = hints.tx_op_flags;
            (*(*h).domain_attr).data_progress = hints.progress;
            (*(*h).domain_attr).control_progress = hints.progress;
            (*(*h).domain_attr).threading = hints.threading;
            if let Some(name) = &hints.prov_name {
                let c = CString::new(name.as_str()).expect("no NUL in provider names");
                (*(*h).fabric_attr).prov_name = libc::strdup(c.as_ptr());
            }
            let mut info = null_mut();
            let rc = (api.getinfo)(api.version, null(), null(), 0, h, &mut info);
            (api.freeinfo)(h);
            if rc == 0 {
                Ok(Info { api, ptr: info })
            } else {
                Err(rc)
            }
        }
    }

    pub(super) fn first(&self) -> &ffi::fi_info {
        // SAFETY: a successful fi_getinfo returns at least one entry, alive
        // until fi_freeinfo in drop.
        unsafe { &*self.ptr }
    }

    pub fn caps(&self) -> u64 {
        self.first().caps
    }

    pub fn inject_size(&self) -> usize {
        // SAFETY: tx_attr of an fi_getinfo answer is allocated.
        unsafe { (*self.first().tx_attr).inject_size }
    }

    pub fn max_msg_size(&self) -> usize {
        // SAFETY: ep_attr of an fi_getinfo answer is allocated.
        unsafe { (*self.first().ep_attr).max_msg_size }
    }

    pub fn prov_name(&self) -> String {
        // SAFETY: fabric_attr and its prov_name are set in an answer.
        unsafe { CStr::from_ptr((*self.first().fabric_attr).prov_name) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: ptr came from fi_getinfo and is freed once.
        unsafe { (self.api.freeinfo)(self.ptr) }
    }
}
