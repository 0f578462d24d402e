//! The state of one `fi_fabric` that its children (domains, EQs) hold.

use std::sync::Arc;

use crate::base::config::Config;
use crate::base::fid::{Children, Parent};

/// State shared with the fabric's children.
#[derive(Debug)]
pub struct FabricState {
    /// The tunables, read once when the fabric opened.
    pub config: Arc<Config>,
    children: Children,
}

impl FabricState {
    pub fn new(config: Arc<Config>) -> Self {
        FabricState {
            config,
            children: Children::default(),
        }
    }
}

impl Parent for FabricState {
    fn children(&self) -> &Children {
        &self.children
    }
}
