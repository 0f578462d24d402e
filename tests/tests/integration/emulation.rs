//! The emulated hardware's guarantees, each shown with real separate
//! processes: this test process is one node, `unimem-node` children are
//! others.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use unimem_dma::{DmaEngine, DmaError, DmaRegion, RegId, RegionConfig, ShmDmaEngine};
use unimem_mailbox::shm::{list_objects, reclaim_dead_objects};
use unimem_mailbox::{Error, JobId, Mailbox, NodeId, Profile, ShmMailbox, ShmMailboxConfig};
use unimem_tests::{fill_pattern, fnv1a, pattern_byte, solo, unstamp, Peer};

const NODE: &str = env!("CARGO_BIN_EXE_unimem-node");

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a time requirement: on a loaded machine things are slow.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// One job for all these tests: a process has one dmable region
/// (`DmaRegion::for_process`), and it belongs to one job. No other module
/// of the test binary makes one in this process.
fn job_name() -> String {
    format!("emulation-test-{}", std::process::id())
}

/// Every process that opens a mailbox first reclaims the objects of dead
/// processes of this user, in every job, and so does the provider of
/// every other test of this binary. The dead-node tests check that a
/// killed node's objects are still there before they reclaim them, so no
/// other test may start a child meanwhile: child-spawning tests hold
/// [`solo::shared`] (as every [`Peer`] does), the dead-node tests
/// [`solo::alone`].
fn children_may_reclaim() -> solo::Shared {
    solo::shared()
}

fn nothing_else_reclaims() -> solo::Alone {
    solo::alone()
}

fn job() -> JobId {
    JobId::from_name(&job_name())
}

fn open_mailbox(depth: usize) -> ShmMailbox {
    ShmMailbox::open(&ShmMailboxConfig {
        job: job(),
        depth,
        profile: Profile::Native,
    })
    .unwrap()
}

fn spawn_node(args: &[&str]) -> Peer {
    let job = job_name();
    let mut all = vec![job.as_str()];
    all.extend_from_slice(args);
    Peer::spawn(NODE, &all)
}

/// Receives `senders × per_sender` messages from child processes and checks
/// that every message is intact and each sender's arrive in order.
fn receive_from_senders(depth: usize, senders: u32, per_sender: u64) {
    let mut mbx = open_mailbox(depth);
    let dest = mbx.addr().to_string();
    let count = per_sender.to_string();
    let children: Vec<Peer> = (0..senders)
        .map(|id| spawn_node(&["send", &dest, &id.to_string(), &count]))
        .collect();
    let mut next_seq: HashMap<u32, u64> = HashMap::new();
    let mut sources = HashMap::new();
    let total = u64::from(senders) * per_sender;
    // A million messages through a shallow ring on a shared machine: twice
    // the usual guard.
    let deadline = Instant::now() + 2 * HANG_GUARD;
    let mut received = 0;
    while received < total {
        assert!(
            Instant::now() < deadline,
            "only {received} of {total} messages arrived"
        );
        let Some((source, message)) = mbx.poll() else {
            std::thread::yield_now();
            continue;
        };
        let (sender, seq) = unstamp(&message).expect("torn or corrupted message");
        let expected = next_seq.entry(sender).or_insert(0);
        assert_eq!(seq, *expected, "sender {sender} out of order");
        *expected += 1;
        // Every message of one sender carries that sender's address.
        assert_eq!(*sources.entry(sender).or_insert(source), source);
        received += 1;
    }
    for child in children {
        assert!(child.wait_success(), "a sender failed");
    }
    assert!(mbx.poll().is_none(), "more messages than were sent");
    assert_eq!(next_seq.len(), senders as usize);
    assert!(next_seq.values().all(|&n| n == per_sender));
    assert_eq!(mbx.abandoned(), 0);
}

#[test]
fn per_sender_order_with_four_concurrent_senders() {
    let _children = children_may_reclaim();
    // A shallow ring keeps the senders busy-retrying, interleaving hard.
    receive_from_senders(16, 4, 50_000);
}

#[test]
fn million_messages_arrive_intact() {
    let _children = children_may_reclaim();
    receive_from_senders(1024, 4, 250_000);
}

#[test]
fn busy_when_full_then_recovers_after_draining() {
    let _children = children_may_reclaim();
    let mut mbx = open_mailbox(16);
    let mut filler = spawn_node(&["fill", &mbx.addr().to_string(), "100"]);
    let filled: u64 = filler.expect("filled").parse().unwrap();
    assert_eq!(
        filled, 16,
        "a full mailbox must refuse exactly past its depth"
    );
    for seq in 0..filled {
        let (_, m) = mbx.poll().expect("message of the full ring");
        assert_eq!(unstamp(&m), Some((0, seq)));
    }
    assert!(mbx.poll().is_none());
    filler.send_line("go");
    let mut seq = filled;
    let deadline = Instant::now() + HANG_GUARD;
    while seq < filled + 100 {
        if let Some((_, m)) = mbx.poll() {
            assert_eq!(unstamp(&m), Some((0, seq)));
            seq += 1;
        } else {
            assert!(
                Instant::now() < deadline,
                "only {} of 100 messages after the ring drained",
                seq - filled
            );
            std::thread::yield_now();
        }
    }
    assert_eq!(filler.expect("resumed"), "100");
    assert!(filler.wait_success());
}

#[test]
fn dead_mailbox_owner_is_reported_and_reclaimed() {
    let _alone = nothing_else_reclaims();
    let job_name = format!("dead-mailbox-{}", std::process::id());
    let job = JobId::from_name(&job_name);
    let mbx = ShmMailbox::open(&ShmMailboxConfig {
        job,
        depth: 64,
        profile: Profile::Native,
    })
    .unwrap();
    let mut owner = Peer::spawn(NODE, &[&job_name, "mailbox", "8"]);
    let addr = owner.expect("addr").parse().unwrap();
    let peer = mbx.connect(&addr).unwrap();
    assert!(mbx.peer_alive(&peer));
    owner.kill(); // SIGKILL (and reaped): the owner gets no chance to clean up.

    // How soon a send notices is a matter for a benchmark; here it must
    // notice at all (sends to a dead owner's ring may succeed until it is
    // full, then it must say Dead, not Busy forever).
    let deadline = Instant::now() + HANG_GUARD;
    let error = loop {
        match mbx.send(&peer, &[7; 24]) {
            Ok(()) | Err(Error::Busy) => {
                assert!(Instant::now() < deadline, "dead peer never reported");
                std::thread::yield_now();
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(error, Error::Dead), "got {error:?}");
    assert!(!mbx.peer_alive(&peer));
    assert!(matches!(mbx.connect(&addr), Err(Error::Dead)));

    let leftover = format!("-{}-", owner.pid());
    assert!(list_objects(Some(job))
        .iter()
        .any(|n| n.contains(&leftover)));
    reclaim_dead_objects();
    assert!(!list_objects(Some(job))
        .iter()
        .any(|n| n.contains(&leftover)));
    drop(mbx);
    assert!(list_objects(Some(job)).is_empty());
}

#[test]
fn a_process_removes_its_own_objects_when_it_exits_without_closing() {
    let _children = children_may_reclaim();
    let job_name = format!("exit-hook-{}", std::process::id());
    let mut child = Peer::spawn(NODE, &[&job_name, "exit-uncleanly"]);
    // A mailbox, a region directory, one segment and its generation table.
    assert_eq!(child.expect("removed"), "4");
    assert!(child.wait_success());
    assert!(list_objects(Some(JobId::from_name(&job_name))).is_empty());
}

// --- DMA --------------------------------------------------------------------

fn engine() -> ShmDmaEngine {
    let config = RegionConfig {
        job: job(),
        segment_size: 8 << 20,
        max_size: 64 << 20,
    };
    ShmDmaEngine::new(DmaRegion::for_process(&config).unwrap(), Profile::Native)
}

/// A child holding a dmable buffer: its node, the buffer's address, length.
fn dma_owner(len: usize) -> (Peer, NodeId, u64) {
    let mut owner = spawn_node(&["dma-owner", &len.to_string()]);
    let line = owner.expect("buffer");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[2].parse::<usize>().unwrap(), len);
    (owner, words[0].parse().unwrap(), words[1].parse().unwrap())
}

fn wait_completion(engine: &mut ShmDmaEngine, id: unimem_dma::DmaId) {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        match engine.poll() {
            Some(done) if done == id => return,
            Some(_) => {}
            None => assert!(Instant::now() < deadline, "DMA never completed"),
        }
    }
}

fn remote_hash(owner: &mut Peer, offset: usize, len: usize) -> u64 {
    owner.send_line(&format!("hash {offset} {len}"));
    owner.expect("hash").parse().unwrap()
}

#[test]
fn dma_moves_exact_bytes_at_unaligned_offsets_and_odd_lengths() {
    let _children = children_may_reclaim();
    const LEN: usize = 1 << 20;
    let (mut owner, node, remote) = dma_owner(LEN);
    let mut engine = engine();
    let reg = engine.register(node, remote, LEN).unwrap();
    let local = engine.alloc(LEN + 64).unwrap();

    // What the remote buffer must hold, kept in step with every put.
    let mut mirror = vec![0u8; LEN];
    fill_pattern(&mut mirror, 0);
    let cases = [
        (0, 1),
        (1, 1),
        (3, 7),
        (63, 65),
        (4095, 2),
        (4097, 4093),
        (12_345, 65_537),
        (LEN - 1, 1),
        (LEN - 100_003, 100_003),
        (0, LEN),
    ];
    for (seed, &(offset, len)) in cases.iter().enumerate() {
        let seed = seed as u64 + 1;
        let local_offset = (seed as usize * 13) % 64;
        let mut data = vec![0u8; len];
        fill_pattern(&mut data, seed);
        local.write(local_offset, &data);
        // SAFETY-free: the engine checks the local range is dmable.
        let src = local.as_ptr().wrapping_add(local_offset);
        let id = engine.put(src, len, reg, remote + offset as u64).unwrap();
        wait_completion(&mut engine, id);
        mirror[offset..offset + len].copy_from_slice(&data);

        owner.send_line(&format!("check {offset} {len} {seed}"));
        assert_eq!(owner.read_line(), "ok", "put of {len} bytes at {offset}");
        assert_eq!(
            remote_hash(&mut owner, 0, LEN),
            fnv1a(&mirror),
            "bytes outside the put changed"
        );

        // And back: a get at another unaligned local offset.
        let back_offset = 64 - local_offset.max(1);
        let dst = local.as_ptr().wrapping_add(back_offset);
        let id = engine.get(dst, len, reg, remote + offset as u64).unwrap();
        wait_completion(&mut engine, id);
        let mut got = vec![0u8; len];
        local.read(back_offset, &mut got);
        assert!(got == data, "get of {len} bytes at {offset} differs");
    }
    engine.deregister(reg).unwrap();
    owner.send_line("exit");
    assert!(owner.wait_success());
}

#[test]
fn dma_rejects_each_bad_input_with_its_error_and_moves_no_byte() {
    let _children = children_may_reclaim();
    const LEN: usize = 64 << 10;
    let (mut owner, node, remote) = dma_owner(LEN);
    let initial = remote_hash(&mut owner, 0, LEN);
    let mut engine = engine();
    let local = engine.alloc(LEN).unwrap();
    let mut local_pattern = vec![0u8; LEN];
    fill_pattern(&mut local_pattern, 99);
    local.write(0, &local_pattern);

    // A registration of the middle of the buffer.
    let (reg_start, reg_len) = (remote + 4096, 8192usize);
    let reg = engine.register(node, reg_start, reg_len).unwrap();
    let stale = engine.register(node, reg_start, reg_len).unwrap();
    engine.deregister(stale).unwrap();

    let mut private = vec![0x5au8; 256];
    macro_rules! refused {
        ($what:expr, $result:expr, $error:pat) => {
            match $result {
                Err($error) => {}
                other => panic!("{}: got {:?}", $what, other),
            }
        };
    }
    refused!(
        "put from ordinary memory",
        engine.put(private.as_ptr(), 256, reg, reg_start),
        DmaError::LocalNotDmable
    );
    refused!(
        "get into ordinary memory",
        engine.get(private.as_mut_ptr(), 256, reg, reg_start),
        DmaError::LocalNotDmable
    );
    refused!(
        "local range running past the end of dmable memory",
        engine.put(local.as_ptr(), 16 << 20, reg, reg_start),
        DmaError::LocalNotDmable
    );
    refused!(
        "deregistered handle",
        engine.put(local.as_ptr(), 16, stale, reg_start),
        DmaError::NotRegistered
    );
    refused!(
        "never registered handle",
        engine.put(local.as_ptr(), 16, RegId(987_654), reg_start),
        DmaError::NotRegistered
    );
    refused!(
        "remote range past the registration's end",
        engine.put(local.as_ptr(), 20, reg, reg_start + reg_len as u64 - 10),
        DmaError::OutOfBounds
    );
    refused!(
        "remote range before the registration",
        engine.get(local.as_ptr(), 2, reg, reg_start - 1),
        DmaError::OutOfBounds
    );
    refused!(
        "remote address plus length overflows",
        engine.put(local.as_ptr(), 16, reg, u64::MAX - 5),
        DmaError::LengthOverflow
    );
    refused!(
        "local address plus length overflows",
        engine.put(local.as_ptr(), usize::MAX, reg, reg_start),
        DmaError::LengthOverflow
    );
    refused!(
        "register beyond the node's dmable memory",
        engine.register(node, 0x1000, 4096),
        DmaError::OutOfBounds
    );
    refused!(
        "register with overflowing length",
        engine.register(node, u64::MAX - 10, 100),
        DmaError::LengthOverflow
    );
    refused!(
        "register on a node that never existed",
        engine.register(
            NodeId {
                pid: u32::MAX - 1,
                ..node
            },
            remote,
            16
        ),
        DmaError::NoSuchNode
    );
    assert!(engine.poll().is_none(), "a refused transfer completed");
    assert_eq!(
        remote_hash(&mut owner, 0, LEN),
        initial,
        "a refused transfer moved bytes"
    );
    let mut now = vec![0u8; LEN];
    local.read(0, &mut now);
    assert!(now == local_pattern, "a refused get wrote local memory");
    assert!(private.iter().all(|&b| b == 0x5a));

    owner.send_line("exit");
    assert!(owner.wait_success());
}

#[test]
fn dead_dma_node_is_reported_and_its_memory_reclaimed() {
    let _alone = nothing_else_reclaims();
    let (mut owner, node, remote) = dma_owner(4096);
    let mut engine = engine();
    let reg = engine.register(node, remote, 4096).unwrap();
    owner.kill();
    assert!(!node.is_alive());
    // The existing route still points at memory: no crash, just stale data.
    let local = engine.alloc(64).unwrap();
    let id = engine.put(local.as_ptr(), 64, reg, remote).unwrap();
    wait_completion(&mut engine, id);
    // New routes to the dead node are refused.
    engine.forget_node(node);
    assert!(matches!(
        engine.register(node, remote, 4096),
        Err(DmaError::DeadNode)
    ));

    let leftover = format!("-{}-", node.pid);
    assert!(list_objects(Some(job()))
        .iter()
        .any(|n| n.contains(&leftover)));
    reclaim_dead_objects();
    assert!(!list_objects(Some(job()))
        .iter()
        .any(|n| n.contains(&leftover)));
}

#[test]
fn pattern_bytes_differ_between_seeds() {
    // Guards the data checks above: seeds must produce different bytes.
    let a: Vec<u8> = (0..64).map(|i| pattern_byte(1, i)).collect();
    let b: Vec<u8> = (0..64).map(|i| pattern_byte(2, i)).collect();
    assert_ne!(a, b);
}
