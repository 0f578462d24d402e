//! RMA: writes and reads one-sided and through the target, refusals,
//! completions only counted, CQ data and injects.

use super::*;

const RMA_SIZES: [usize; 8] = [
    0,
    1,
    22,
    FRAGMENT - 1,
    FRAGMENT,
    FRAGMENT + 1,
    3 * FRAGMENT + 5,
    100_000,
];

/// Writes then reads back every size into a target range, local buffers
/// dmable or not; `target_progresses` says whether the target runs.
fn write_read_round_trips(target_dmable: bool, local_dmable: bool) {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let max = *RMA_SIZES.iter().max().unwrap();
    let target_dma = b.dma.alloc(max + 64).unwrap();
    let mut target_heap = vec![0u8; max + 64];
    let target = if target_dmable {
        target_dma.as_ptr() as usize
    } else {
        target_heap.as_mut_ptr() as usize
    };
    let key = fresh_key();
    let _handle = expose(
        key,
        target,
        max + 64,
        Access::REMOTE_READ.union(Access::REMOTE_WRITE),
    );
    let target_memory = TargetMemory::new(&a, max, local_dmable);
    let local = target_memory.addr;
    for (i, &len) in RMA_SIZES.iter().enumerate() {
        let data = pattern(len, i as u8);
        // SAFETY: local holds max >= len bytes, ours alone.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), local as *mut u8, len) };
        // Offset 7 into the range: keys name bytes by offset here.
        rma(
            &mut a,
            RmaKind::Write,
            rma_req(b.addr(), local as *const u8, len, key, 7),
        );
        let events = if target_dmable {
            // One-sided: the target never runs.
            collect(&mut [&mut a], 0, 1)
        } else {
            collect(&mut [&mut a, &mut b], 0, 1)
        };
        assert_eq!(
            events[0],
            Event::Rma {
                context: 0x77,
                kind: RmaKind::Write,
                completion: true
            },
            "write of {len}"
        );
        // SAFETY: target holds max + 64 bytes; no transfer is in flight.
        let landed = unsafe { std::slice::from_raw_parts((target + 7) as *const u8, len) };
        assert!(landed == &data[..], "write of {len} landed intact");
        // Read it back over a cleared local buffer.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(local as *mut u8, 0, len) };
        rma(
            &mut a,
            RmaKind::Read,
            rma_req(b.addr(), local as *const u8, len, key, 7),
        );
        let events = if target_dmable {
            collect(&mut [&mut a], 0, 1)
        } else {
            collect(&mut [&mut a, &mut b], 0, 1)
        };
        assert!(
            matches!(
                events[0],
                Event::Rma {
                    kind: RmaKind::Read,
                    ..
                }
            ),
            "{events:?}"
        );
        // SAFETY: as above.
        let read = unsafe { std::slice::from_raw_parts(local as *const u8, len) };
        assert!(read == &data[..], "read of {len} intact");
    }
    assert!(!a.busy() && !b.busy());
    assert_eq!(a.tx_staging.available(), 3);
    assert_eq!(b.rx_staging.available(), 3);
    assert!(b.next_event().is_none(), "the target reports nothing");
    // Those of at most the inject size to dmable memory went the direct
    // path (done in the call), both ways; nothing else did.
    let small = RMA_SIZES
        .iter()
        .filter(|&&len| len > 0 && len <= a.cfg.eager_size)
        .count() as u64;
    let direct = if target_dmable { 2 * small } else { 0 };
    assert!(small > 0);
    assert_eq!(a.stats.direct, direct, "direct operations");
}

#[test]
fn rma_one_sided_to_dmable_target_memory() {
    write_read_round_trips(true, true);
    write_read_round_trips(true, false);
}

/// A write or read of at most 64 bytes to ordinary memory takes one round
/// trip through the target (its request and bytes in a few mailbox
/// messages, applied on the target's next progress, answered at once),
/// where the rendezvous takes three; one more byte takes the rendezvous.
#[test]
fn small_rma_to_ordinary_memory_takes_one_round_trip() {
    let mut a = messenger();
    let mut b = messenger();
    first_contact(&mut a, &mut b);
    first_contact(&mut b, &mut a);
    let mut target = vec![0u8; 256];
    let key = fresh_key();
    let _handle = expose(
        key,
        target.as_mut_ptr() as usize,
        256,
        Access::REMOTE_READ.union(Access::REMOTE_WRITE),
    );
    // One progress of each side, target first, after the post.
    let round_trip = |a: &mut Shm, b: &mut Shm| {
        b.progress();
        a.progress();
        a.next_event()
    };
    for len in [1, 8, 21, 64] {
        let data = pattern(len, len as u8);
        rma(
            &mut a,
            RmaKind::Write,
            rma_req(b.addr(), data.as_ptr(), len, key, 3),
        );
        let done = round_trip(&mut a, &mut b);
        assert!(
            matches!(
                done,
                Some(Event::Rma {
                    kind: RmaKind::Write,
                    ..
                })
            ),
            "write of {len} done after one round trip: {done:?}"
        );
        assert_eq!(&target[3..3 + len], &data[..], "write of {len} in place");
        let mut back = vec![0u8; len];
        rma(
            &mut a,
            RmaKind::Read,
            rma_req(b.addr(), back.as_mut_ptr(), len, key, 3),
        );
        let done = round_trip(&mut a, &mut b);
        assert!(
            matches!(
                done,
                Some(Event::Rma {
                    kind: RmaKind::Read,
                    ..
                })
            ),
            "read of {len} done after one round trip: {done:?}"
        );
        assert_eq!(back, data, "read of {len}");
    }
    let data = pattern(65, 65);
    rma(
        &mut a,
        RmaKind::Write,
        rma_req(b.addr(), data.as_ptr(), 65, key, 3),
    );
    assert!(
        round_trip(&mut a, &mut b).is_none(),
        "65 bytes go by the rendezvous"
    );
    collect(&mut [&mut a, &mut b], 0, 1);
    assert_eq!(&target[3..68], &data[..]);
    assert_eq!(a.stats.assisted, 9);
    assert_eq!(a.stats.atomics, 0, "none of them counts as an atomic");
}

#[test]
fn rma_through_the_target_to_ordinary_memory() {
    write_read_round_trips(false, true);
    write_read_round_trips(false, false);
}

#[test]
fn rma_refusals_move_no_byte() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_memory = TargetMemory::new(&b, 4096, target_dmable);
        let target = target_memory.addr;
        // SAFETY: target holds 4096 bytes.
        unsafe { std::ptr::write_bytes(target as *mut u8, 0xee, 4096) };
        let read_only = fresh_key();
        let _r = expose(read_only, target, 1024, Access::REMOTE_READ);
        let writable = fresh_key();
        let _w = expose(
            writable,
            target + 1024,
            1024,
            Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
        );
        let data = pattern(2000, 3);
        let cases = [
            (fresh_key(), 0, 10, ErrorKind::BadKey),
            (read_only, 0, 10, ErrorKind::AccessDenied),
            (
                writable,
                (target + 1024) as u64,
                1025,
                ErrorKind::AccessDenied,
            ),
            (
                writable,
                (target + 1023) as u64,
                10,
                ErrorKind::AccessDenied,
            ),
            (writable, 0, 10, ErrorKind::AccessDenied),
            (writable, u64::MAX - 4, 10, ErrorKind::AccessDenied),
        ];
        for (key, addr, len, error) in cases {
            rma(
                &mut a,
                RmaKind::Write,
                rma_req(b.addr(), data.as_ptr(), len, key, addr),
            );
            let events = collect(&mut [&mut a, &mut b], 0, 1);
            assert_eq!(
                events[0],
                Event::RmaError {
                    context: 0x77,
                    kind: RmaKind::Write,
                    error
                },
                "key {key:#x} at {addr:#x}+{len}"
            );
        }
        let mut back = vec![0u8; 10];
        rma(
            &mut a,
            RmaKind::Read,
            rma_req(
                b.addr(),
                back.as_mut_ptr(),
                10,
                writable,
                (target + 1024) as u64,
            ),
        );
        let events = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(
            matches!(
                events[0],
                Event::RmaError {
                    kind: RmaKind::Read,
                    error: ErrorKind::AccessDenied,
                    ..
                }
            ),
            "{events:?}"
        );
        // SAFETY: target holds 4096 bytes; nothing is in flight.
        let after = unsafe { std::slice::from_raw_parts(target as *const u8, 4096) };
        assert!(after.iter().all(|&b| b == 0xee), "no byte moved");
        assert!(!a.busy());
    }
}

/// With `count_silent_rma` (the provider's setting), writes that ask for
/// no completion, direct (dmable target) or served by the target, are
/// counts and no event; one that asks for a completion is still an event.
#[test]
fn writes_without_a_completion_are_only_counted() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        a.set_count_silent_rma(true);
        first_contact(&mut a, &mut b);
        let target_memory = TargetMemory::new(&b, 4096, target_dmable);
        let target = target_memory.addr;
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            4096,
            Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
        );
        let small = pattern(64, 3);
        for i in 0..5u64 {
            let req = RmaReq {
                inject: true,
                completion: false,
                ..rma_req(b.addr(), small.as_ptr(), 64, key, target as u64 + 64 * i)
            };
            rma(&mut a, RmaKind::Write, req);
        }
        let mut counted = 0;
        let deadline = Instant::now() + HANG_GUARD;
        while counted < 5 {
            assert!(Instant::now() < deadline, "{counted} of 5 counted");
            a.progress();
            b.progress();
            assert!(a.next_event().is_none(), "no event for a silent write");
            if let Some(silent) = a.take_silent_rma() {
                assert_eq!(silent[1..], [0, 0, 0], "all of them writes");
                counted += silent[0];
            }
        }
        assert_eq!(a.take_silent_rma(), None, "taken once");
        let req = rma_req(b.addr(), small.as_ptr(), 64, key, target as u64);
        rma(&mut a, RmaKind::Write, req);
        let done = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(
            matches!(
                done[0],
                Event::Rma {
                    kind: RmaKind::Write,
                    completion: true,
                    ..
                }
            ),
            "{done:?}"
        );
        // SAFETY: target holds 4096 bytes; nothing is in flight.
        let got = unsafe { std::slice::from_raw_parts(target as *const u8, 5 * 64) };
        assert!(
            got.chunks(64).all(|c| c == &small[..]),
            "dmable {target_dmable}"
        );
    }
}

#[test]
fn rma_write_with_data_and_inject() {
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_memory = TargetMemory::new(&b, 3 * FRAGMENT, target_dmable);
        let target = target_memory.addr;
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            3 * FRAGMENT,
            Access::REMOTE_WRITE.union(Access::VIRTUAL_ADDRESS),
        );
        let data = pattern(2 * FRAGMENT + 1, 5);
        let req = RmaReq {
            data: Some(0xdada),
            ..rma_req(b.addr(), data.as_ptr(), data.len(), key, target as u64)
        };
        rma(&mut a, RmaKind::Write, req);
        let done = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(matches!(
            done[0],
            Event::Rma {
                kind: RmaKind::Write,
                ..
            }
        ));
        let landed = collect(&mut [&mut a, &mut b], 1, 1);
        assert_eq!(
            landed[0],
            Event::RemoteWrite {
                data: 0xdada,
                len: 2 * FRAGMENT + 1
            }
        );
        // SAFETY: target holds the write; nothing is in flight.
        let got = unsafe { std::slice::from_raw_parts(target as *const u8, data.len()) };
        assert!(got == &data[..]);

        let mut small = pattern(EAGER, 6);
        // fi_inject_write: copied, no completion.
        let req = RmaReq {
            inject: true,
            completion: false,
            ..rma_req(b.addr(), small.as_ptr(), EAGER, key, target as u64 + 1)
        };
        rma(&mut a, RmaKind::Write, req);
        let expected = small.clone();
        small.fill(0); // an inject's buffer is free once the call returns
        let done = collect(&mut [&mut a, &mut b], 0, 1);
        assert!(matches!(
            done[0],
            Event::Rma {
                kind: RmaKind::Write,
                completion: false,
                ..
            }
        ));
        // SAFETY: as above.
        let got = unsafe { std::slice::from_raw_parts((target + 1) as *const u8, EAGER) };
        assert!(got == &expected[..]);
        let too_big = RmaReq {
            inject: true,
            ..rma_req(b.addr(), data.as_ptr(), EAGER + 1, key, target as u64)
        };
        // SAFETY: refused before anything is read.
        let refused = unsafe { a.rma(RmaKind::Write, too_big) };
        assert_eq!(refused, Err(PostError::TooLong));
    }
}
