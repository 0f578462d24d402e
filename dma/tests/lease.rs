//! Leased registrations (`DmaEngine::lease_registration`): the checks of
//! `load_store` at every access, without the engine (a test binary of its
//! own: one process has one region).

use std::sync::Arc;

use unimem_dma::{DmaEngine, DmaError, DmaRegion, RegionConfig, ShmDmaEngine};
use unimem_mailbox::{JobId, Profile};

const GEN_PAGE: usize = 4096;

/// Stores `bytes` at `addr` through `lease`, if it lets them.
fn store(lease: &unimem_dma::RegLease, addr: u64, bytes: &[u8]) -> bool {
    lease.access(addr, bytes.len(), true, |at| {
        // SAFETY: the lease hands out `bytes.len()` writable bytes at `at`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) }
    })
}

#[test]
fn a_lease_stores_inside_its_registration_until_revoked_or_freed() {
    let region = DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(&format!("lease-engine-{}", std::process::id())),
        segment_size: 1 << 20,
        max_size: 4 << 20,
    })
    .unwrap();
    let mut engine = ShmDmaEngine::new(Arc::clone(&region), Profile::Native);
    let node = engine.local_node();
    let ring = engine.alloc(2 * GEN_PAGE).unwrap();
    let addr = ring.remote_addr();
    let reg = engine.register(node, addr, 2 * GEN_PAGE).unwrap();
    let lease = engine.lease_registration(reg).unwrap();

    // Inside, across the page boundary too.
    assert!(store(&lease, addr + 100, &[5; 8]));
    assert!(store(&lease, addr + GEN_PAGE as u64 - 4, &[6; 8]));
    let mut out = [0u8; 8];
    ring.read(100, &mut out);
    assert_eq!(out, [5; 8]);
    ring.read(GEN_PAGE - 4, &mut out);
    assert_eq!(out, [6; 8]);

    // Outside the registration, or past the address space: nothing runs.
    let never = |_: *mut u8| panic!("a refused access ran");
    assert!(!lease.access(addr + 2 * GEN_PAGE as u64 - 4, 8, true, never));
    assert!(!lease.access(addr - 1, 8, true, never));
    assert!(!lease.access(u64::MAX - 2, 8, true, never));

    // Deregistered, or its node forgotten: refused.
    let other = engine.register(node, addr, GEN_PAGE).unwrap();
    let gone = engine.lease_registration(other).unwrap();
    assert!(store(&gone, addr, &[1]));
    engine.deregister(other).unwrap();
    assert!(!gone.access(addr, 1, true, never));
    let other = engine.register(node, addr, GEN_PAGE).unwrap();
    let forgotten = engine.lease_registration(other).unwrap();
    engine.forget_node(node);
    assert!(!forgotten.access(addr, 1, true, never));
    assert!(engine.lease_registration(other).is_none());

    // The owner freed the memory and it serves again: the lease is stale,
    // as the engine's registration is, and writes nothing into it.
    let reg = engine.register(node, addr, 2 * GEN_PAGE).unwrap();
    let lease = engine.lease_registration(reg).unwrap();
    drop(ring);
    let again = engine.alloc(2 * GEN_PAGE).unwrap();
    assert_eq!(again.remote_addr(), addr, "best fit reuses the block");
    again.write(0, &[1; 2 * GEN_PAGE]);
    assert!(!lease.access(addr + 100, 8, true, never));
    let mut run = |_: *mut u8| panic!("a stale access ran");
    assert!(matches!(
        engine.load_store(reg, addr + 100, 8, true, &mut run),
        Err(DmaError::Stale)
    ));
    let mut all = vec![0u8; 2 * GEN_PAGE];
    again.read(0, &mut all);
    assert!(all.iter().all(|&x| x == 1), "a refused store moved bytes");

    // Taken again (revalidated): a new lease holds, the old one not.
    engine.revalidate(reg).unwrap();
    assert!(!lease.access(addr, 1, true, never));
    let renewed = engine.lease_registration(reg).unwrap();
    assert!(store(&renewed, addr, &[9]));
    again.read(0, &mut out[..1]);
    assert_eq!(out[0], 9);
}
