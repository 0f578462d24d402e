//! A separate process acting as one Unimem node, driven by the
//! multi-process tests: `unimem-node <job> <role> [args...]`.
//!
//! Roles:
//! - `send <dest> <sender-id> <count>`: sends `count` stamped messages,
//!   retrying while the destination is busy; prints `sent <count> busy <n>`.
//! - `fill <dest> <more>`: sends until the destination is busy, prints
//!   `filled <n>`, waits for `go` on stdin, sends `more` messages (retrying),
//!   prints `resumed <more>`.
//! - `mailbox <depth>`: opens a mailbox, prints `addr <addr>`, then idles
//!   until stdin closes or says `exit`.
//! - `exit-uncleanly`: opens a mailbox and a dmable buffer, removes its own
//!   objects as an exit hook would, prints `removed <n>` and exits without
//!   closing anything.
//! - `dma-owner <len>`: allocates a dmable buffer filled with pattern 0,
//!   prints `buffer <node> <addr> <len>`, then serves `hash <off> <len>`
//!   (prints `hash <fnv>`), `check <off> <len> <seed>` (prints `ok` or
//!   `mismatch <index>`) and `exit`.
//! - `forge <dest> <count> <seed>`: a hostile peer. Sends `count` forged
//!   protocol messages to `dest`: well-formed wire messages of every kind
//!   (FIN, grants, fragment reports, eager announcements, hellos, credits,
//!   RMA and atomic answers) with ids, sequence numbers, lengths and
//!   addresses drawn at random from small ranges (so that many name
//!   transfers the victim really has in flight with another peer), mixed
//!   with raw random bytes. Every 8 messages it opens a new mailbox, a new
//!   peer to the victim, so that fencing one does not end the attack.
//!   Prints `forged <count> busy <n>`.

use std::io::BufRead;
use std::process::ExitCode;

use unimem_dma::{DmaRegion, RegionConfig};
use unimem_mailbox::{Error, JobId, Mailbox, MailboxAddr, ShmMailbox, ShmMailboxConfig};
use unimem_tests::{fill_pattern, fnv1a, pattern_byte, stamp};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [job, role, rest @ ..] = args.as_slice() else {
        eprintln!("usage: unimem-node <job> <role> [args...]");
        return ExitCode::from(2);
    };
    let job = JobId::from_name(job);
    let result = match (role.as_str(), rest) {
        ("send", [dest, id, count]) => send(job, dest, id.parse().unwrap(), count.parse().unwrap()),
        ("fill", [dest, more]) => fill(job, dest, more.parse().unwrap()),
        ("mailbox", [depth]) => mailbox(job, depth.parse().unwrap()),
        ("dma-owner", [len]) => dma_owner(job, len.parse().unwrap()),
        ("exit-uncleanly", []) => exit_uncleanly(job),
        ("forge", [dest, count, seed]) => {
            forge(job, dest, count.parse().unwrap(), seed.parse().unwrap())
        }
        _ => Err(format!("unknown role or arguments: {role} {rest:?}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("unimem-node: {e}");
            ExitCode::FAILURE
        }
    }
}

fn open_mailbox(job: JobId, depth: usize) -> Result<ShmMailbox, String> {
    let config = ShmMailboxConfig {
        job,
        depth,
        ..Default::default()
    };
    ShmMailbox::open(&config).map_err(|e| e.to_string())
}

fn connect(mbx: &ShmMailbox, dest: &str) -> Result<unimem_mailbox::ShmPeer, String> {
    let dest: MailboxAddr = dest.parse().map_err(|e| format!("{e}"))?;
    mbx.connect(&dest).map_err(|e| e.to_string())
}

/// Sends one message, yielding while the destination is busy. Returns how
/// many times it was busy.
fn send_retrying(
    mbx: &ShmMailbox,
    peer: &unimem_mailbox::ShmPeer,
    message: &[u8; 24],
) -> Result<u64, String> {
    let mut busy = 0;
    loop {
        match mbx.send(peer, message) {
            Ok(()) => return Ok(busy),
            Err(Error::Busy) => {
                busy += 1;
                std::thread::yield_now();
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn send(job: JobId, dest: &str, id: u32, count: u64) -> Result<(), String> {
    let mbx = open_mailbox(job, 2)?;
    let peer = connect(&mbx, dest)?;
    let mut busy = 0;
    for seq in 0..count {
        busy += send_retrying(&mbx, &peer, &stamp(id, seq))?;
    }
    println!("sent {count} busy {busy}");
    Ok(())
}

fn fill(job: JobId, dest: &str, more: u64) -> Result<(), String> {
    let mbx = open_mailbox(job, 2)?;
    let peer = connect(&mbx, dest)?;
    let mut seq = 0;
    loop {
        match mbx.send(&peer, &stamp(0, seq)) {
            Ok(()) => seq += 1,
            Err(Error::Busy) => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    println!("filled {seq}");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "go" {
        return Err(format!("expected 'go', got '{}'", line.trim()));
    }
    for _ in 0..more {
        send_retrying(&mbx, &peer, &stamp(0, seq))?;
        seq += 1;
    }
    println!("resumed {more}");
    Ok(())
}

fn mailbox(job: JobId, depth: usize) -> Result<(), String> {
    let mbx = open_mailbox(job, depth)?;
    println!("addr {}", mbx.addr());
    for line in std::io::stdin().lock().lines() {
        if line.map_err(|e| e.to_string())?.trim() == "exit" {
            break;
        }
    }
    Ok(())
}

fn exit_uncleanly(job: JobId) -> Result<(), String> {
    let mbx = open_mailbox(job, 8)?;
    let region = DmaRegion::for_process(&RegionConfig {
        job,
        segment_size: 1 << 20,
        max_size: 1 << 20,
    })
    .map_err(|e| e.to_string())?;
    let buf = region.alloc(4096).map_err(|e| e.to_string())?;
    let removed = unimem_mailbox::shm::remove_own_objects();
    println!("removed {removed}");
    // Exit with everything still open: no destructor runs.
    std::mem::forget((mbx, buf, region));
    std::process::exit(0);
}

fn dma_owner(job: JobId, len: usize) -> Result<(), String> {
    let config = RegionConfig {
        job,
        segment_size: len.max(1 << 20),
        max_size: 2 * len.max(1 << 20),
    };
    let region = DmaRegion::for_process(&config).map_err(|e| e.to_string())?;
    let buf = region.alloc(len).map_err(|e| e.to_string())?;
    let mut pattern = vec![0u8; len];
    fill_pattern(&mut pattern, 0);
    buf.write(0, &pattern);
    println!("buffer {} {} {}", region.node(), buf.remote_addr(), len);
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> usize { words[i].parse().unwrap() };
        match words.first().copied() {
            Some("hash") => {
                let mut bytes = vec![0u8; num(2)];
                buf.read(num(1), &mut bytes);
                println!("hash {}", fnv1a(&bytes));
            }
            Some("check") => {
                let mut bytes = vec![0u8; num(2)];
                buf.read(num(1), &mut bytes);
                let seed = words[3].parse().unwrap();
                match bytes
                    .iter()
                    .enumerate()
                    .find(|&(i, &b)| b != pattern_byte(seed, i))
                {
                    Some((i, _)) => println!("mismatch {i}"),
                    None => println!("ok"),
                }
            }
            Some("exit") | None => break,
            Some(other) => return Err(format!("unknown command {other}")),
        }
    }
    Ok(())
}

/// One forged message: a well-formed wire message with values a sound
/// peer would not send, or 24 random bytes.
fn forged_message(rng: &mut fastrand::Rng) -> [u8; 24] {
    use unimem_proto::wire::{Chunk, MatchInfo, RmaRefusal, Wire};
    let id = rng.u16(..64);
    let addr = rng.u64(..);
    let len = rng.u32(..1 << 20);
    let wire = match rng.u64(..12) {
        0 => Wire::Fin { send_id: id },
        1 => Wire::Grant {
            send_id: id,
            fragment: rng.u32(..8),
            addr,
            len,
            recv_id: rng.u16(..64),
            recv_gen: rng.u16(..4),
            token: rng.u16(..4),
        },
        2 => Wire::FragDone {
            send_id: id,
            fragment: rng.u32(..8),
            recv_id: rng.u16(..64),
            recv_gen: rng.u16(..4),
        },
        3 => Wire::Eager {
            info: MatchInfo {
                tag: Some(rng.u64(..4)),
                data: None,
            },
            len: rng.u32(..20_000),
            seq: rng.u8(..32),
            credits: rng.u8(..),
            ack: rng.bool().then_some(id),
        },
        4 => Wire::Hello {
            node: std::array::from_fn(|_| rng.u8(..)),
            ring: addr,
            slot_shift: rng.u8(..64),
            slots: rng.u16(..),
        },
        5 => Wire::Credit {
            credits: rng.u8(..),
        },
        6 => Wire::LenHigh {
            id,
            read: rng.bool(),
            high: rng.u32(..),
        },
        7 => Wire::ReadReady {
            send_id: id,
            recv_id: rng.u16(..64),
        },
        8 => Wire::RmaNack {
            id,
            read: rng.bool(),
            error: RmaRefusal::Denied,
        },
        9 => Wire::AtomicResult {
            id,
            bytes: Chunk::new(&addr.to_le_bytes()),
        },
        10 => Wire::AtomicReply { id, refusal: None },
        _ => return std::array::from_fn(|_| rng.u8(..)),
    };
    wire.encode()
}

fn forge(job: JobId, dest: &str, count: u64, seed: u64) -> Result<(), String> {
    // Seeded: a forger's run can be replayed with its seed.
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut busy = 0;
    let mut sent = 0;
    while sent < count {
        // A new peer every 8 messages: the victim fences each after a few.
        let mbx = open_mailbox(job, 2)?;
        let peer = connect(&mbx, dest)?;
        for _ in 0..8.min(count - sent) {
            busy += send_retrying(&mbx, &peer, &forged_message(&mut rng))?;
            sent += 1;
        }
    }
    println!("forged {sent} busy {busy}");
    Ok(())
}
