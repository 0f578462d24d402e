//! The process's dmable region: one per process (a process is one Unimem
//! node), made when the first endpoint needs it and kept until the
//! provider's cleanup. Every domain's DMA engine works on it. With the
//! dmable heap (`libunimem-heap.so`) preloaded, it is the heap's region,
//! adopted (see `unimem_dma::heap_abi`): the heap made it, the provider
//! allocates its buffers from it, and peers see one node with one memory.

use std::sync::Arc;

use unimem_dma::{DmaError, DmaRegion, RegionConfig};
use unimem_mailbox::JobId;

use crate::base::config::Config;

/// The region kept for the life of the process (until the provider's
/// cleanup), once an endpoint has needed it.
static PROCESS_REGION: std::sync::Mutex<Option<Arc<DmaRegion>>> = std::sync::Mutex::new(None);

/// This process's dmable region, kept alive from the first endpoint to the
/// provider's cleanup. A node's memory must not come and go while the node
/// lives: peers identify it by the node id (pid and start time) alone, and
/// cache their mappings of it. Dropping it with the last endpoint and
/// creating it again for the next one (fi_rdm_multi_client's clients,
/// one after another in one process) would give the same node id to new
/// memory: peers would find their cached node closed ("dead") or, worse,
/// put data through stale mappings into the old segments.
pub fn process_region(cfg: &Config) -> Result<Arc<DmaRegion>, DmaError> {
    let region = DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(&cfg.job),
        segment_size: cfg.dma_segment_size,
        max_size: cfg.dma_max_size,
    })?;
    let mut kept = PROCESS_REGION.lock().unwrap_or_else(|e| e.into_inner());
    // After a fork, for_process made a new region: it replaces the parent's.
    if let Some(old) = kept.replace(Arc::clone(&region)) {
        let_go(old);
    }
    Ok(region)
}

/// Lets the process's region go (provider cleanup): it is removed once the
/// last endpoint using it closes.
pub fn release_process_region() {
    let kept = PROCESS_REGION
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(region) = kept {
        let_go(region);
    }
}

/// Drops our reference to a region, unless it is a forked child's copy of
/// its parent's: dropping that one would remove the parent's objects from
/// /dev/shm while the parent still uses them, so it is leaked instead (a
/// mapping, gone when the child exits).
fn let_go(region: Arc<DmaRegion>) {
    if region.node().pid == std::process::id() {
        drop(region);
    } else {
        std::mem::forget(region);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Weak;

    /// The dmable region is not dropped with the last endpoint: opening
    /// the next one finds the same region (same node, same memory).
    #[test]
    fn the_process_region_outlives_its_endpoints() {
        let mut cfg = Config::defaults();
        // The job of the crate's other unit tests: one process, one job.
        cfg.job = format!("provider-unit-{}", std::process::id());
        let first = process_region(&cfg).unwrap();
        let node = first.node();
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(weak.upgrade().is_some(), "kept after the last user");
        let again = process_region(&cfg).unwrap();
        assert!(Weak::ptr_eq(&weak, &Arc::downgrade(&again)));
        assert_eq!(again.node(), node);
        drop(again);
        release_process_region();
    }
}
