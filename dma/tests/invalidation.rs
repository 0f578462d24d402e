//! Owner invalidation through the engine (a test binary of its own: one
//! process has one region, and the unit tests' region is of another job).

use std::sync::Arc;

use unimem_dma::{DmaEngine, DmaError, DmaRegion, RegionConfig, ShmDmaEngine};
use unimem_mailbox::{JobId, Profile};

const GEN_PAGE: usize = 4096;

/// Through the engine: a registration of memory freed since is stale,
/// a grant of memory freed since is void, and neither moves a byte.
#[test]
fn stale_registrations_and_void_grants_move_nothing() {
    let region = DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(&format!("gens-engine-{}", std::process::id())),
        segment_size: 1 << 20,
        max_size: 4 << 20,
    })
    .unwrap();
    let mut engine = ShmDmaEngine::new(Arc::clone(&region), Profile::Native);
    let node = engine.local_node();
    let source = engine.alloc(3 * GEN_PAGE).unwrap();
    source.write(0, &[7; 3 * GEN_PAGE]);
    let target = engine.alloc(3 * GEN_PAGE).unwrap();
    let addr = target.remote_addr();
    let reg = engine.register(node, addr, 3 * GEN_PAGE).unwrap();
    let token = engine.grant_token(target.as_ptr(), 3 * GEN_PAGE).unwrap();
    engine
        .put_granted(source.as_ptr(), 3 * GEN_PAGE, reg, addr, token)
        .unwrap();

    drop(target);
    let again = engine.alloc(3 * GEN_PAGE).unwrap();
    again.write(0, &[1; 3 * GEN_PAGE]);
    assert_eq!(again.remote_addr(), addr, "best fit reuses the block");
    assert!(matches!(
        engine.put(source.as_ptr(), 10, reg, addr + 5),
        Err(DmaError::Stale)
    ));
    let fresh = engine.register(node, addr, 3 * GEN_PAGE).unwrap();
    assert!(matches!(
        engine.put_granted(source.as_ptr(), 10, fresh, addr, token),
        Err(DmaError::Revoked)
    ));
    let mut out = [0u8; 3 * GEN_PAGE];
    again.read(0, &mut out);
    assert!(out.iter().all(|&x| x == 1), "a refused put moved bytes");
    let token = engine.grant_token(again.as_ptr(), 3 * GEN_PAGE).unwrap();
    engine
        .put_granted(source.as_ptr(), 3 * GEN_PAGE, fresh, addr, token)
        .unwrap();
    again.read(0, &mut out);
    assert!(out.iter().all(|&x| x == 7));
}
