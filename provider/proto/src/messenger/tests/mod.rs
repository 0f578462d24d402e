//! The protocol over the real emulation, messengers in one process, with
//! the harness's small thresholds (22-byte inline, 1 KiB eager, 4 KiB
//! fragments: [`crate::testing::config`]) so that every path and boundary
//! is crossed with small buffers.
//!
//! One module per concern, as the messenger's own; this one holds what
//! they share beyond the crate's harness ([`crate::testing`], which the
//! fuzz harness shares too): sends, receives and their events.

mod atomics;
mod delivery_complete;
mod eager;
mod first_contact;
mod ids;
mod liveness;
mod messages;
mod rendezvous;
mod rma;
mod untrusted;

use std::time::{Duration, Instant};

use unimem_dma::{Access, DmaBuf, KeyHandle, KeyTable};
use unimem_mailbox::{MailboxAddr, Profile, ShmMailbox};

use super::untrusted::FENCE_AFTER;
use super::*;
use crate::atomic::{AtomicCall, AtomicOp, Datatype};
use crate::matching::{IovList, PostedRecv};
use crate::test_job;
use crate::testing::{
    config, engine, expose_in, fresh_key, mailbox, messenger, messenger_profile, messenger_with,
    pattern, Shm, EAGER, FRAGMENT,
};
use crate::wire::{inline_capacity, MatchInfo, Wire, MORE_LEN};
use crate::{AccessCounts, ErrorKind, OpError, RecvDone, RmaKind};

/// How long a loop waits for something that must happen before it calls
/// it a hang (not a time requirement).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// A send of `len` bytes at `data` to `dest`: untagged, context 0, with a
/// completion, neither injected nor copied; tests override what they try.
fn send_req(dest: MailboxAddr, data: *const u8, len: usize) -> SendReq<MailboxAddr> {
    SendReq {
        dest,
        iov: IovList::One((data as usize, len)),
        info: MatchInfo::default(),
        context: 0,
        completion: true,
        inject: false,
        copy: false,
        delivery_complete: false,
    }
}

fn send(
    ep: &mut Shm,
    dest: MailboxAddr,
    data: &[u8],
    tag: Option<u64>,
    context: usize,
) -> Result<(), PostError> {
    let req = SendReq {
        info: MatchInfo { tag, data: None },
        context,
        ..send_req(dest, data.as_ptr(), data.len())
    };
    // SAFETY: the tests keep `data` alive until the send completes.
    unsafe { ep.send(req) }
}

/// Injects `data` from `a` to `b`, retrying while the provider says
/// -FI_EAGAIN and progressing both, as an application would.
fn inject(a: &mut Shm, b: &mut Shm, data: &[u8]) {
    let req = SendReq {
        inject: true,
        ..send_req(b.addr(), data.as_ptr(), data.len())
    };
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        // SAFETY: data is live during the call; inject copies it.
        match unsafe { a.send(req.clone()) } {
            Ok(()) => return,
            Err(PostError::Again) => {
                assert!(Instant::now() < deadline, "inject never accepted");
                a.progress();
                b.progress();
            }
            Err(e) => panic!("inject: {e:?}"),
        }
    }
}

fn recv_spec(
    buf: &mut [u8],
    context: usize,
    src: Option<MailboxAddr>,
    tag: u64,
    ignore: u64,
) -> PostedRecv<MailboxAddr> {
    PostedRecv {
        context,
        iov: IovList::One((buf.as_mut_ptr() as usize, buf.len())),
        src,
        tag,
        ignore,
        completion: true,
        multi_recv: false,
    }
}

/// `len` zeroed bytes of target memory at `b`: in its dmable region (so
/// one-sided operations reach it) or in ordinary memory (served through
/// the target), 8-byte aligned either way, for tests that run on both.
struct TargetMemory {
    _dmable: DmaBuf,
    _ordinary: Vec<u64>,
    addr: usize,
}

impl TargetMemory {
    fn new(b: &Shm, len: usize, dmable: bool) -> TargetMemory {
        let dma = b.dma.alloc(len).unwrap();
        dma.write(0, &vec![0; len]);
        let mut ordinary = vec![0u64; len.div_ceil(8)];
        let addr = if dmable {
            dma.as_ptr() as usize
        } else {
            ordinary.as_mut_ptr() as usize
        };
        TargetMemory {
            _dmable: dma,
            _ordinary: ordinary,
            addr,
        }
    }
}

/// An untagged receive of `len` bytes into dmable `target`, from anyone.
fn dmable_recv(target: &DmaBuf, len: usize, context: usize) -> PostedRecv<MailboxAddr> {
    PostedRecv {
        context,
        iov: IovList::One((target.as_ptr() as usize, len)),
        src: None,
        tag: 0,
        ignore: 0,
        completion: true,
        multi_recv: false,
    }
}

fn post(ep: &mut Shm, tagged: bool, recv: PostedRecv<MailboxAddr>) {
    // SAFETY: the tests keep the buffer alive until the receive completes.
    unsafe { ep.post_recv(tagged, recv) }
}

/// Progresses every messenger until `n` events are collected from `ep_index`.
fn collect(eps: &mut [&mut Shm], ep_index: usize, n: usize) -> Vec<Event<MailboxAddr>> {
    let deadline = Instant::now() + HANG_GUARD;
    let mut events = Vec::new();
    while events.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events: {events:?}",
            events.len()
        );
        for ep in eps.iter_mut() {
            ep.progress();
        }
        while let Some(e) = eps[ep_index].next_event() {
            events.push(e);
        }
        // Those without a completion are counts: as events with no context.
        if let Some(silent) = eps[ep_index].take_silent_rma() {
            for (kind, n) in RmaKind::ALL.into_iter().zip(silent) {
                events.extend((0..n).map(|_| Event::Rma {
                    context: 0,
                    kind,
                    completion: false,
                }));
            }
        }
    }
    events
}

fn recv_done(event: &Event<MailboxAddr>) -> &RecvDone<MailboxAddr> {
    match event {
        Event::Recv(done) => done,
        other => panic!("expected a receive completion, got {other:?}"),
    }
}

/// Exposes `[addr, addr + len)` of this process under `key`.
fn expose(key: u64, addr: usize, len: usize, access: Access) -> KeyHandle {
    expose_in(
        &KeyTable::for_process(test_job()).unwrap(),
        key,
        addr,
        len,
        access,
    )
}

/// Sends `a` -> `b` and back once, both progressing: hellos exchanged,
/// each knows the other's eager ring.
fn first_contact(a: &mut Shm, b: &mut Shm) {
    let data = pattern(100, 0xfc);
    let mut buf = vec![0u8; 100];
    post(b, false, recv_spec(&mut buf, 0xfc, None, 0, 0));
    send(a, b.addr(), &data, None, 0xfc).unwrap();
    collect(&mut [&mut *a, &mut *b], 1, 1);
    collect(&mut [&mut *a, &mut *b], 0, 1);
    assert!(buf == data);
}

fn quick_peer_check() -> ProtoConfig {
    ProtoConfig {
        peer_check: Some(Duration::from_millis(1)),
        ..config()
    }
}

fn error_of(event: &Event<MailboxAddr>) -> &OpError<MailboxAddr> {
    match event {
        Event::Error(error) => error,
        other => panic!("expected an error completion, got {other:?}"),
    }
}

/// A third party sends raw messages, as a broken or hostile peer would.
fn forge(to: MailboxAddr, messages: &[Wire]) -> ShmMailbox {
    use unimem_mailbox::Mailbox as _;
    let rogue = mailbox(64, Profile::Native);
    let route = rogue.connect(&to).unwrap();
    for m in messages {
        rogue.send(&route, &m.encode()).unwrap();
    }
    rogue
}

/// The first contact of a forged peer: our parameters, and a hello that
/// names no node and offers no eager ring.
fn rogue_first_contact() -> Vec<Wire> {
    vec![
        Wire::Params {
            version: crate::wire::PROTOCOL_VERSION,
            id_bits: crate::wire::ID_BITS,
            fragment_size: FRAGMENT as u32,
            eager_size: EAGER as u32,
        },
        Wire::Hello {
            node: [0; crate::wire::NODE_LEN],
            ring: 0,
            slot_shift: 10,
            slots: 0,
        },
    ]
}

fn rma_req(
    dest: MailboxAddr,
    local: *const u8,
    len: usize,
    key: u64,
    addr: u64,
) -> RmaReq<MailboxAddr> {
    RmaReq {
        dest,
        iov: IovList::One((local as usize, len)),
        addr,
        key,
        context: 0x77,
        completion: true,
        inject: false,
        data: None,
    }
}

fn rma(ep: &mut Shm, kind: RmaKind, req: RmaReq<MailboxAddr>) {
    // SAFETY: the tests keep the local buffer alive until the event.
    unsafe { ep.rma(kind, req) }.unwrap();
}

#[allow(clippy::too_many_arguments)]
fn atomic_req(
    dest: MailboxAddr,
    call: AtomicCall,
    op: AtomicOp,
    datatype: Datatype,
    operand: &[u8],
    compare: &[u8],
    result: &mut [u8],
    key: u64,
    addr: u64,
) -> AtomicReq<MailboxAddr> {
    AtomicReq {
        dest,
        call,
        op,
        datatype,
        count: operand.len().max(result.len()) / datatype.size(),
        operand: IovList::One((operand.as_ptr() as usize, operand.len())),
        compare: IovList::One((compare.as_ptr() as usize, compare.len())),
        result: IovList::One((result.as_mut_ptr() as usize, result.len())),
        addr,
        key,
        context: 0xa7,
        completion: true,
    }
}

/// Posts an atomic from `a` and runs until it completes; returns its event.
fn run_atomic(a: &mut Shm, b: &mut Shm, req: AtomicReq<MailboxAddr>) -> Event<MailboxAddr> {
    // SAFETY: the test keeps the result buffer alive until the event.
    unsafe { a.atomic(req) }.unwrap();
    collect(&mut [&mut *a, &mut *b], 0, 1).remove(0)
}

fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
