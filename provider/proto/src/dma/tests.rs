//! The domain's DMA shared by several views, over the real emulation (this
//! process is the remote node too).

use unimem_dma::{DmaRegion, RegionConfig, ShmDmaEngine};
use unimem_mailbox::Profile;

use super::*;
use crate::test_job;

fn domain() -> DomainDma<ShmDmaEngine> {
    let region = DmaRegion::for_process(&RegionConfig {
        job: test_job(),
        segment_size: 16 << 20,
        max_size: 256 << 20,
    })
    .unwrap();
    DomainDma::new(
        ShmDmaEngine::new(region, Profile::Native),
        RegCacheConfig::default(),
    )
}

/// Drains `view`'s completions.
fn completed(view: &mut DmaView<ShmDmaEngine>) -> Vec<Token> {
    let mut done = Vec::new();
    view.completed(&mut done);
    done
}

#[test]
fn completions_go_back_to_the_view_that_submitted_them() {
    let domain = domain();
    let mut a = domain.view();
    let mut b = domain.view();
    let node = domain.local_node();
    let source = domain.alloc(4096).unwrap();
    let target = domain.alloc(4096).unwrap();
    source.write(0, b"routed");
    let reg = a.register(node, target.remote_addr(), 4096).unwrap();
    {
        let mut dma = a.lock();
        dma.put(source.as_ptr(), 6, reg, target.remote_addr(), 1)
            .unwrap();
        dma.put(source.as_ptr(), 6, reg, target.remote_addr() + 8, 3)
            .unwrap();
    }
    b.lock()
        .put(source.as_ptr(), 6, reg, target.remote_addr() + 16, 2)
        .unwrap();
    // `b` polls first: it takes its own and keeps `a`'s for `a`.
    assert_eq!(completed(&mut b), vec![2]);
    assert_eq!(completed(&mut a), vec![1, 3]);
    assert!(completed(&mut a).is_empty() && completed(&mut b).is_empty());
    let mut out = [0u8; 6];
    target.read(16, &mut out);
    assert_eq!(&out, b"routed");
}

#[test]
fn one_views_cached_registration_is_a_hit_for_another() {
    let domain = domain();
    let mut a = domain.view();
    let mut b = domain.view();
    let node = domain.local_node();
    let target = domain.alloc(8192).unwrap();
    let (first, stale) = a
        .lock()
        .cached_registration(node, target.remote_addr(), 100)
        .unwrap();
    assert!(stale.is_empty());
    let (second, _) = b
        .lock()
        .cached_registration(node, target.remote_addr() + 50, 50)
        .unwrap();
    assert_eq!(first, second);
    let stats = domain.regcache_stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (1, 1, 1));
    // A peer on that node died, seen by `b`: the entry is gone for `a` too.
    b.invalidate_node(node);
    assert_eq!(domain.regcache_stats().entries, 0);
    let (third, _) = a
        .lock()
        .cached_registration(node, target.remote_addr(), 100)
        .unwrap();
    assert_ne!(third, first);
    assert_eq!(domain.regcache_stats().misses, 2);
}

#[test]
fn a_view_that_goes_takes_its_registrations_and_completions_along() {
    let domain = domain();
    let mut a = domain.view();
    let mut b = domain.view();
    assert_eq!(domain.views(), 2);
    let node = domain.local_node();
    let source = domain.alloc(4096).unwrap();
    let target = domain.alloc(4096).unwrap();
    let before = domain.with_engine(|e| e.registrations());
    let reg = a.register(node, target.remote_addr(), 4096).unwrap();
    assert_eq!(domain.with_engine(|e| e.registrations()), before + 1);
    a.lock()
        .put(source.as_ptr(), 64, reg, target.remote_addr(), 7)
        .unwrap();
    drop(a);
    assert_eq!(domain.views(), 1);
    assert_eq!(domain.with_engine(|e| e.registrations()), before);
    // The closed view's completion is dropped, not handed to another.
    assert!(completed(&mut b).is_empty());
    // Its slot is reused, and starts empty.
    let mut c = domain.view();
    assert!(completed(&mut c).is_empty());
    assert_eq!(domain.views(), 2);
}
