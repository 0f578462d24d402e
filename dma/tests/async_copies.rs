//! Asynchronous copies (`ShmDmaEngine::set_async_copies`): the mover thread
//! copies large transfers while the submitter goes on, and nothing the
//! submitter or the owner does meanwhile makes the copy touch memory that
//! is gone (a test binary of its own: one process has one region).

use std::sync::Arc;
use std::time::{Duration, Instant};

use unimem_dma::{DmaBuf, DmaEngine, DmaId, DmaRegion, RegId, RegionConfig, ShmDmaEngine};
use unimem_mailbox::{JobId, Profile};

const MIB: usize = 1 << 20;

fn engine() -> ShmDmaEngine {
    let region = DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(&format!("async-copies-{}", std::process::id())),
        segment_size: 64 * MIB,
        max_size: 256 * MIB,
    })
    .unwrap();
    let mut engine = ShmDmaEngine::new(Arc::clone(&region), Profile::Native);
    engine.set_async_copies(64 * 1024);
    engine
}

fn filled(engine: &ShmDmaEngine, len: usize, seed: u8) -> DmaBuf {
    let buf = engine.alloc(len).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ seed).collect();
    buf.write(0, &bytes);
    buf
}

fn holds(buf: &DmaBuf, len: usize, seed: u8) -> bool {
    let mut out = vec![0u8; len];
    buf.read(0, &mut out);
    out.iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8 ^ seed)
}

/// Registers all of `target` and puts `source` into it (the registration
/// and the transfer).
fn put_all(
    engine: &mut ShmDmaEngine,
    source: &DmaBuf,
    target: &DmaBuf,
    len: usize,
) -> (RegId, DmaId) {
    let node = engine.local_node();
    let reg = engine.register(node, target.remote_addr(), len).unwrap();
    let put = engine
        .put(source.as_ptr(), len, reg, target.remote_addr())
        .unwrap();
    (reg, put)
}

/// Polls until `id` is reported (60 s: only a guard against a hang).
fn wait_for(engine: &mut ShmDmaEngine, id: DmaId) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(done) = engine.poll() {
            assert_eq!(done, id, "in submission order");
            return;
        }
        assert!(Instant::now() < end, "the copy never completed");
        std::thread::yield_now();
    }
}

/// One test, in order: the cases share the process's one region.
#[test]
fn large_transfers_move_on_the_engines_thread_and_stay_safe() {
    let mut engine = engine();
    let node = engine.local_node();

    // A put and a get of 8 MiB are copied by the mover; a small put
    // inline, reported after them (in order).
    let len = 8 * MIB;
    let source = filled(&engine, len, 1);
    let target = filled(&engine, len, 9);
    let (reg, put) = put_all(&mut engine, &source, &target, len);
    wait_for(&mut engine, put);
    assert!(holds(&target, len, 1), "the put's bytes");
    let back = filled(&engine, len, 5);
    let other = filled(&engine, len, 3);
    let reg_other = engine.register(node, other.remote_addr(), len).unwrap();
    let get = engine
        .get(back.as_ptr(), len, reg_other, other.remote_addr())
        .unwrap();
    let small = engine
        .put(source.as_ptr(), 4096, reg, target.remote_addr())
        .unwrap();
    wait_for(&mut engine, get);
    wait_for(&mut engine, small);
    assert!(holds(&back, len, 3), "the get's bytes");
    assert_eq!(engine.moved_async(), 2, "the small put was copied inline");

    // Deregistered before the copy is done: the copy still lands, in a
    // mapping the job keeps.
    let fresh = filled(&engine, len, 7);
    let (reg, put) = put_all(&mut engine, &source, &fresh, len);
    engine.deregister(reg).unwrap();
    wait_for(&mut engine, put);
    assert!(holds(&fresh, len, 1), "a put deregistered in flight");

    // The owner frees the target while the copy is in flight: the free
    // waits for the copy's pin, so once it returns the copy is done.
    let big = 32 * MIB;
    let source = filled(&engine, big, 2);
    let doomed = filled(&engine, big, 4);
    let (_, put) = put_all(&mut engine, &source, &doomed, big);
    drop(doomed);
    assert_eq!(
        engine.poll(),
        Some(put),
        "the free returned before the copy ended"
    );
    assert_eq!(engine.moved_async(), 4);
}
