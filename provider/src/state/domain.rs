//! The state of one `fi_domain` that its children (AVs, CQs, counters,
//! memory regions, poll sets, endpoints) hold: the attributes resolved
//! against the application's info, the tunables, and the EQ bound to it.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::base::config::Config;
use crate::base::fid::{Children, Parent, ParentRef};
use crate::info::attr::Info;
use crate::state::fabric::FabricState;

/// State shared with the domain's children.
#[derive(Debug)]
pub struct DomainState {
    fabric: ParentRef<FabricState>,
    /// API version the application opened the fabric with.
    pub api_version: u32,
    /// The attributes resolved against the application's info: threading
    /// (FI_THREAD_DOMAIN lets the data path skip locks), progress, sizes,
    /// caps, mr_mode...
    pub info: Info,
    /// EQ bound with `fi_domain_bind` (at most one), held open while bound.
    eq: Mutex<Option<ParentRef<dyn Parent>>>,
    children: Children,
}

impl DomainState {
    pub fn new(fabric: &Arc<FabricState>, api_version: u32, info: Info) -> Self {
        DomainState {
            fabric: ParentRef::new(fabric),
            api_version,
            info,
            eq: Mutex::new(None),
            children: Children::default(),
        }
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.fabric.config
    }

    /// Binds an EQ; `false` if one is bound already.
    pub fn bind_eq(&self, eq: ParentRef<dyn Parent>) -> bool {
        let mut slot = self.eq.lock();
        if slot.is_some() {
            return false;
        }
        *slot = Some(eq);
        true
    }

    /// Whether an EQ is bound.
    pub fn has_eq(&self) -> bool {
        self.eq.lock().is_some()
    }
}

impl Parent for DomainState {
    fn children(&self) -> &Children {
        &self.children
    }
}
