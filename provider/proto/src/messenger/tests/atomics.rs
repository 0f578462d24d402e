//! Atomics on dmable and ordinary memory, refusals, order after writes,
//! and exact results from concurrent initiators.

use super::*;

#[test]
fn atomics_on_dmable_and_ordinary_memory() {
    use AtomicCall::*;
    use AtomicOp::{Bxor, Cswap, Max, Read, Sum};
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_memory = TargetMemory::new(&b, 64, target_dmable);
        let target = target_memory.addr;
        let cell = |i: usize| target + 8 * i;
        // SAFETY: the target holds 8 u64s; nothing is in flight.
        let read = |i: usize| unsafe { *(cell(i) as *const u64) };
        // SAFETY: as above.
        let write = |i: usize, v: u64| unsafe { *(cell(i) as *mut u64) = v };
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            64,
            Access::REMOTE_READ.union(Access::REMOTE_WRITE),
        );
        let dest = b.addr();
        let mut none: [u8; 0] = [];

        write(0, 40);
        let e = run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Sum,
                Datatype::U64,
                &words(&[2]),
                &[],
                &mut none,
                key,
                0,
            ),
        );
        assert_eq!(
            e,
            Event::Rma {
                context: 0xa7,
                kind: RmaKind::Atomic,
                completion: true
            }
        );
        assert_eq!(read(0), 42);

        // Fetch-and-add of two elements: old values come back.
        write(1, 7);
        let mut old = [0u8; 16];
        let e = run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Fetch,
                Sum,
                Datatype::U64,
                &words(&[1, 100]),
                &[],
                &mut old,
                key,
                0,
            ),
        );
        assert!(
            matches!(
                e,
                Event::Rma {
                    kind: RmaKind::AtomicFetch,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(old, words(&[42, 7])[..]);
        assert_eq!((read(0), read(1)), (43, 107));

        // Atomic read needs no operand.
        let mut got = [0u8; 8];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(dest, Fetch, Read, Datatype::U64, &[], &[], &mut got, key, 8),
        );
        assert_eq!(got, words(&[107])[..]);

        // Compare-and-swap: one that matches, one that does not.
        let mut old = [0u8; 8];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Compare,
                Cswap,
                Datatype::U64,
                &words(&[5]),
                &words(&[43]),
                &mut old,
                key,
                0,
            ),
        );
        assert_eq!((old, read(0)), (words(&[43]).try_into().unwrap(), 5));
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Compare,
                Cswap,
                Datatype::U64,
                &words(&[9]),
                &words(&[43]),
                &mut old,
                key,
                0,
            ),
        );
        assert_eq!((old, read(0)), (words(&[5]).try_into().unwrap(), 5));

        // Narrow and float elements.
        write(2, 0);
        let bytes = [1u8, 2, 3, 250];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Sum,
                Datatype::U8,
                &bytes,
                &[],
                &mut none,
                key,
                16,
            ),
        );
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Sum,
                Datatype::U8,
                &bytes,
                &[],
                &mut none,
                key,
                16,
            ),
        );
        assert_eq!(
            read(2) & 0xffff_ffff,
            u64::from(u32::from_le_bytes([2, 4, 6, 244]))
        );
        write(3, 2.5f64.to_bits());
        let mut old = [0u8; 8];
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Fetch,
                Max,
                Datatype::F64,
                &7.25f64.to_le_bytes(),
                &[],
                &mut old,
                key,
                24,
            ),
        );
        assert_eq!(
            (f64::from_le_bytes(old), f64::from_bits(read(3))),
            (2.5, 7.25)
        );

        // Every element of the largest operand.
        let ones = words(&[1; 8]);
        run_atomic(
            &mut a,
            &mut b,
            atomic_req(
                dest,
                Write,
                Bxor,
                Datatype::U64,
                &ones,
                &[],
                &mut none,
                key,
                0,
            ),
        );
        assert_eq!(read(7), 1);
        assert!(!a.busy() && !b.busy());
        if target_dmable {
            // One-sided: the target's progress had nothing to do.
            assert!(b.atomic_rx.is_empty());
        }
    }
}

#[test]
fn atomic_refusals() {
    use AtomicCall::*;
    use AtomicOp::{Bor, Read, Sum};
    for target_dmable in [true, false] {
        let mut a = messenger();
        let mut b = messenger();
        first_contact(&mut a, &mut b);
        let target_memory = TargetMemory::new(&b, 64, target_dmable);
        let target = target_memory.addr;
        let read_only = fresh_key();
        let _r = expose(read_only, target, 32, Access::REMOTE_READ);
        let write_only = fresh_key();
        let _w = expose(write_only, target + 32, 32, Access::REMOTE_WRITE);
        let dest = b.addr();
        let one = words(&[1]);
        let mut none: [u8; 0] = [];
        let mut old = [0u8; 8];
        let cases: [(AtomicReq<MailboxAddr>, ErrorKind); 5] = [
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    read_only,
                    0,
                ),
                ErrorKind::AccessDenied,
            ),
            (
                atomic_req(
                    dest,
                    Fetch,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut old,
                    write_only,
                    0,
                ),
                ErrorKind::AccessDenied,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    4,
                ),
                ErrorKind::Invalid,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    32,
                ),
                ErrorKind::AccessDenied,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    fresh_key(),
                    0,
                ),
                ErrorKind::BadKey,
            ),
        ];
        for (req, error) in cases {
            let e = run_atomic(&mut a, &mut b, req);
            assert!(
                matches!(e, Event::RmaError { error: got, .. } if got == error),
                "{e:?}, wanted {error:?}"
            );
        }
        // SAFETY: nothing is in flight.
        let untouched = unsafe { std::slice::from_raw_parts(target as *const u64, 8) };
        assert!(untouched.iter().all(|&v| v == 0));
        // Refused at once: an operation the call does not have, too many
        // elements, short buffers.
        let eight = words(&[1; 9]);
        for (req, refused) in [
            (
                atomic_req(
                    dest,
                    Write,
                    Read,
                    Datatype::U64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    0,
                ),
                PostError::Unsupported,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Bor,
                    Datatype::F64,
                    &one,
                    &[],
                    &mut none,
                    write_only,
                    0,
                ),
                PostError::Unsupported,
            ),
            (
                atomic_req(
                    dest,
                    Write,
                    Sum,
                    Datatype::U64,
                    &eight,
                    &[],
                    &mut none,
                    write_only,
                    0,
                ),
                PostError::TooLong,
            ),
            (
                AtomicReq {
                    count: 2,
                    ..atomic_req(
                        dest,
                        Write,
                        Sum,
                        Datatype::U64,
                        &one,
                        &[],
                        &mut none,
                        write_only,
                        0,
                    )
                },
                PostError::TooShort,
            ),
        ] {
            // SAFETY: refused before anything is read.
            let got = unsafe { a.atomic(req) };
            assert_eq!(got, Err(refused));
        }
        assert!(!a.busy());
    }
}

/// Four initiators (threads, each with its own messenger) fetch-and-add one
/// counter at a target that runs its progress: the final value is exact and
/// every ticket is handed out once, on dmable and on ordinary memory.
/// A put and then an atomic on a flag of the same target (OpenSHMEM's
/// put-then-signal): whoever sees the flag set sees the put's data, for
/// every path the put may take (ordinary memory: bytes or the rendezvous;
/// dmable memory: the direct path or DMA) and both of the atomic's.
#[test]
fn an_atomic_after_a_write_is_applied_after_it() {
    use AtomicCall::Write;
    for target_dmable in [false, true] {
        for len in [8, 64, 80, 4096, 3 * FRAGMENT + 5] {
            let mut a = messenger();
            let mut b = messenger();
            first_contact(&mut a, &mut b);
            let room = len.next_multiple_of(8) + 64;
            let target_dma = b.dma.alloc(room).unwrap();
            target_dma.write(0, &vec![0; room]);
            let mut target_heap = vec![0u8; room];
            let target = if target_dmable {
                target_dma.as_ptr() as usize
            } else {
                target_heap.as_mut_ptr() as usize
            };
            let key = fresh_key();
            let _h = expose(
                key,
                target,
                room,
                Access::REMOTE_READ.union(Access::REMOTE_WRITE),
            );
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let flag_at = (room - 8) as u64;
            rma(
                &mut a,
                RmaKind::Write,
                rma_req(b.addr(), data.as_ptr(), len, key, 0),
            );
            let mut none: [u8; 0] = [];
            let one = words(&[1]);
            let set = atomic_req(
                b.addr(),
                Write,
                AtomicOp::Write,
                Datatype::U64,
                &one,
                &[],
                &mut none,
                key,
                flag_at,
            );
            // SAFETY: the operand lives until the call returns (it is
            // copied); no result.
            unsafe { a.atomic(set) }.unwrap();
            let deadline = Instant::now() + HANG_GUARD;
            let mut done = 0;
            while done < 2 {
                assert!(Instant::now() < deadline, "{len} B: only {done} of 2 done");
                a.progress();
                b.progress();
                // SAFETY: the flag is a u64 of the target, read while
                // nothing of ours writes it (the test's own thread).
                let flag = unsafe { *((target + room - 8) as *const u64) };
                if flag == 1 {
                    // SAFETY: len bytes of the target, as above.
                    let got = unsafe { std::slice::from_raw_parts(target as *const u8, len) };
                    assert!(
                        got == &data[..],
                        "{len} B to {} memory: the flag came before the data",
                        if target_dmable { "dmable" } else { "ordinary" }
                    );
                }
                while let Some(e) = a.next_event() {
                    assert!(matches!(e, Event::Rma { .. }), "{e:?}");
                    done += 1;
                }
            }
        }
    }
}

#[test]
fn concurrent_atomics_from_four_initiators_are_exact() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const EACH: u64 = 500;
    for target_dmable in [true, false] {
        let mut b = messenger();
        let target_memory = TargetMemory::new(&b, 8, target_dmable);
        let target = target_memory.addr;
        // SAFETY: the target holds one u64; nothing is in flight yet.
        unsafe { *(target as *mut u64) = 0 };
        let key = fresh_key();
        let _h = expose(
            key,
            target,
            8,
            Access::REMOTE_READ.union(Access::REMOTE_WRITE),
        );
        let dest = b.addr();
        let stop = AtomicBool::new(false);
        let tickets = std::thread::scope(|s| {
            let target_side = s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    b.progress();
                    std::thread::yield_now();
                }
            });
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(move || {
                        let mut a = messenger();
                        let mut seen = Vec::new();
                        let one = words(&[1]);
                        for _ in 0..EACH {
                            let mut old = [0u8; 8];
                            let req = atomic_req(
                                dest,
                                AtomicCall::Fetch,
                                AtomicOp::Sum,
                                Datatype::U64,
                                &one,
                                &[],
                                &mut old,
                                key,
                                0,
                            );
                            // SAFETY: `old` outlives the operation (we wait for it).
                            unsafe { a.atomic(req) }.unwrap();
                            let deadline = Instant::now() + HANG_GUARD;
                            loop {
                                a.progress();
                                if let Some(e) = a.next_event() {
                                    assert!(matches!(e, Event::Rma { .. }), "{e:?}");
                                    break;
                                }
                                assert!(Instant::now() < deadline, "atomic never completed");
                                std::thread::yield_now();
                            }
                            seen.push(u64::from_le_bytes(old));
                        }
                        seen
                    })
                })
                .collect();
            let mut all: Vec<u64> = workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect();
            stop.store(true, Ordering::Relaxed);
            target_side.join().unwrap();
            all.sort_unstable();
            all
        });
        // SAFETY: every operation completed.
        let total = unsafe { *(target as *const u64) };
        assert_eq!(
            total,
            4 * EACH,
            "dmable: {target_dmable}, total {total:#x}, first tickets {:?}",
            &tickets[..4]
        );
        assert_eq!(
            tickets,
            (0..4 * EACH).collect::<Vec<_>>(),
            "each ticket once"
        );
    }
}
