//! Raw figures of the emulated Unimem hardware, beside the host's own
//! limits: `unimem-rawbench [--runs N] [--profile native|paper|both]`.
//!
//! Two processes pinned to different CPUs: this one, and a copy of itself
//! started as `unimem-rawbench --peer <role> ...`. Every figure is the median
//! of `--runs` runs. Printed as one Markdown table.

use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use unimem_dma::{DmaEngine, DmaRegion, RegId, RegionConfig, ShmDmaEngine};
use unimem_mailbox::shm::{object_name, SharedObject, HEADER_SIZE};
use unimem_mailbox::{JobId, Mailbox, MailboxAddr, NodeId, Profile, ShmMailbox, ShmMailboxConfig};
use unimem_regcache::{Config as CacheConfig, RegCache};
use unimem_tests::{online_cpus, pin_to_cpu, relax, Peer};

const STOP: u64 = u64::MAX;
const DMA_BUFFER: usize = 16 << 20;
const DMA_SIZES: [usize; 7] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];

struct Options {
    runs: usize,
    profiles: Vec<Profile>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--peer") {
        peer_main(&args[1..]);
        return;
    }
    let mut options = Options {
        runs: 5,
        profiles: vec![Profile::Native, Profile::Paper],
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--runs" => options.runs = it.next().and_then(|n| n.parse().ok()).expect("--runs N"),
            "--profile" => {
                options.profiles = match it.next().map(String::as_str) {
                    Some("both") => vec![Profile::Native, Profile::Paper],
                    Some(p) => vec![p.parse().expect("--profile native|paper|both")],
                    None => panic!("--profile native|paper|both"),
                }
            }
            other => {
                eprintln!("usage: unimem-rawbench [--runs N] [--profile native|paper|both]; unknown {other}");
                std::process::exit(2);
            }
        }
    }
    run(&options);
}

fn job_name() -> String {
    format!("rawbench-{}", std::process::id())
}

fn spawn_peer(args: &[&str]) -> Peer {
    let exe = std::env::current_exe().expect("own path");
    let mut all = vec!["--peer"];
    all.extend_from_slice(args);
    Peer::spawn(exe.to_str().expect("utf-8 path"), &all)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn median_of(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    median((0..runs).map(|_| f()).collect())
}

// --- Table ------------------------------------------------------------------

struct Row {
    figure: String,
    values: Vec<String>,
    note: String,
}

fn ns(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} µs", v / 1000.0)
    } else {
        format!("{v:.0} ns")
    }
}

fn gbps(v: f64) -> String {
    format!("{:.3} GB/s", v / 1e9)
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn run(options: &Options) {
    let cpus = online_cpus();
    let pinned = cpus >= 2;
    if pinned {
        pin_to_cpu(0);
    }
    let runs = options.runs;
    let mut rows: Vec<Row> = Vec::new();
    let columns: Vec<String> = options
        .profiles
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    let per_profile = |f: &mut dyn FnMut(Profile) -> String| -> Vec<String> {
        options.profiles.iter().map(|&p| f(p)).collect()
    };

    let cacheline = median_of(runs, cacheline_one_way_ns);
    rows.push(Row {
        figure: "reference: cache-line ping-pong, one-way".into(),
        values: vec![ns(cacheline); columns.len()],
        note: "bare shared-memory flag between the two processes".into(),
    });
    let mut mailbox_native = 0.0;
    rows.push(Row {
        figure: "mailbox one-way latency (ping-pong)".into(),
        values: per_profile(&mut |p| {
            let v = median_of(runs, || mailbox_one_way_ns(p));
            if p == Profile::Native {
                mailbox_native = v;
            }
            ns(v)
        }),
        note: "paper model: 1 µs".into(),
    });
    rows.push(Row {
        figure: "mailbox message rate (one sender)".into(),
        values: per_profile(&mut |p| {
            format!("{:.1} M msg/s", median_of(runs, || mailbox_rate(p)) / 1e6)
        }),
        note: String::new(),
    });

    let mut put_ratio_min = f64::INFINITY;
    for &size in &DMA_SIZES {
        let reference = median_of(runs, || memcpy_bandwidth(size));
        let mut native_put = 0.0;
        rows.push(Row {
            figure: format!("DMA put {}", size_name(size)),
            values: per_profile(&mut |p| {
                let v = median_of(runs, || dma_bandwidth(p, size, Direction::Put));
                if p == Profile::Native {
                    native_put = v;
                }
                gbps(v)
            }),
            note: format!("memcpy reference {}", gbps(reference)),
        });
        if size >= 1 << 20 && options.profiles.contains(&Profile::Native) {
            put_ratio_min = put_ratio_min.min(native_put / reference);
        }
        rows.push(Row {
            figure: format!("DMA get {}", size_name(size)),
            values: per_profile(&mut |p| {
                gbps(median_of(runs, || dma_bandwidth(p, size, Direction::Get)))
            }),
            note: "paper model: 1 GB/s + 1 µs".into(),
        });
    }
    rows.push(Row {
        figure: "registration of 64 KiB, no cache".into(),
        values: per_profile(&mut |p| ns(median_of(runs, || registration_ns(p, false)))),
        note: "register + deregister; paper model: 10 µs".into(),
    });
    rows.push(Row {
        figure: "registration of 64 KiB, with cache".into(),
        values: per_profile(&mut |p| ns(median_of(runs, || registration_ns(p, true)))),
        note: "lookup over a working set of 64 ranges that fits the cache".into(),
    });

    println!(
        "Unimem emulation, raw figures: median of {runs} runs, {}",
        if pinned {
            "processes pinned to CPUs 0 and 1"
        } else {
            "one CPU: processes not pinned"
        }
    );
    println!();
    println!("| figure | {} | note |", columns.join(" | "));
    println!("|---|{}---|", "---|".repeat(columns.len()));
    for row in &rows {
        println!(
            "| {} | {} | {} |",
            row.figure,
            row.values.join(" | "),
            row.note
        );
    }
    println!();
    if options.profiles.contains(&Profile::Native) {
        println!(
            "native mailbox latency / cache-line ping-pong: {:.2}x (target: within 2x)",
            mailbox_native / cacheline
        );
        println!(
            "native DMA put >= 1 MiB / memcpy, worst size: {:.0}% (target: at least 70%)",
            put_ratio_min * 100.0
        );
    }
}

// --- Cache-line ping-pong (reference) --------------------------------------------

const PINGPONG_ITERS: u64 = 200_000;

fn ball(object: &SharedObject) -> &AtomicU64 {
    // SAFETY: the object is larger than its header page; the word after it is
    // 8-byte aligned and only used as an atomic.
    unsafe { &*(object.base().add(HEADER_SIZE) as *const AtomicU64) }
}

fn cacheline_one_way_ns() -> f64 {
    let name = object_name(JobId::from_name(&job_name()), "cacheline");
    let object = SharedObject::create(&name, 2 * HEADER_SIZE).expect("create ping-pong object");
    object.publish();
    let mut peer = spawn_peer(&["cacheline", &name]);
    peer.expect("ready");
    let ball = ball(&object);
    let start = Instant::now();
    for i in 0..PINGPONG_ITERS {
        ball.store(2 * i + 1, Ordering::Release);
        let mut spins = 0;
        while ball.load(Ordering::Acquire) != 2 * i + 2 {
            relax(&mut spins);
        }
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    ball.store(STOP, Ordering::Release);
    assert!(peer.wait_success());
    elapsed / (2 * PINGPONG_ITERS) as f64
}

fn peer_cacheline(name: &str) {
    let object = SharedObject::open(name).expect("open ping-pong object");
    let ball = ball(&object);
    println!("ready");
    let (mut expect, mut spins) = (1, 0);
    loop {
        let v = ball.load(Ordering::Acquire);
        if v == STOP {
            return;
        }
        if v == expect {
            ball.store(v + 1, Ordering::Release);
            expect += 2;
        } else {
            relax(&mut spins);
        }
    }
}

// --- Mailbox ----------------------------------------------------------------

fn open_mailbox(profile: Profile, depth: usize) -> ShmMailbox {
    ShmMailbox::open(&ShmMailboxConfig {
        job: JobId::from_name(&job_name()),
        depth,
        profile,
    })
    .expect("open mailbox")
}

fn send_spinning(mbx: &ShmMailbox, peer: &unimem_mailbox::ShmPeer, message: &[u8; 24]) {
    let mut spins = 0;
    loop {
        match mbx.send(peer, message) {
            Ok(()) => return,
            Err(unimem_mailbox::Error::Busy) => relax(&mut spins),
            Err(e) => panic!("send: {e}"),
        }
    }
}

fn poll_spinning(mbx: &mut ShmMailbox) -> [u8; 24] {
    let mut spins = 0;
    loop {
        if let Some((_, m)) = mbx.poll() {
            return m;
        }
        relax(&mut spins);
    }
}

fn mailbox_one_way_ns(profile: Profile) -> f64 {
    let iters: u64 = match profile {
        Profile::Native => 200_000,
        Profile::Paper => 20_000,
    };
    let mut mbx = open_mailbox(profile, 64);
    let mut peer = spawn_peer(&["echo", &job_name(), profile.name(), &mbx.addr().to_string()]);
    let echo: MailboxAddr = peer.expect("addr").parse().unwrap();
    let to_echo = mbx.connect(&echo).unwrap();
    let mut message = [0u8; 24];
    // Warm-up round trips, then the measured ones.
    for _ in 0..1000 {
        send_spinning(&mbx, &to_echo, &message);
        poll_spinning(&mut mbx);
    }
    let start = Instant::now();
    for i in 0..iters {
        message[..8].copy_from_slice(&i.to_le_bytes());
        send_spinning(&mbx, &to_echo, &message);
        let back = poll_spinning(&mut mbx);
        debug_assert_eq!(back, message);
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    send_spinning(&mbx, &to_echo, &[0xff; 24]);
    assert!(peer.wait_success());
    elapsed / (2 * iters) as f64
}

fn peer_echo(job: &str, profile: Profile, dest: &str) {
    let mut mbx = ShmMailbox::open(&ShmMailboxConfig {
        job: JobId::from_name(job),
        depth: 64,
        profile,
    })
    .expect("open mailbox");
    let back = mbx.connect(&dest.parse().unwrap()).expect("connect back");
    println!("addr {}", mbx.addr());
    loop {
        let m = poll_spinning(&mut mbx);
        if m == [0xff; 24] {
            return;
        }
        send_spinning(&mbx, &back, &m);
    }
}

fn mailbox_rate(profile: Profile) -> f64 {
    const COUNT: u64 = 2_000_000;
    let mut mbx = open_mailbox(profile, 1024);
    let mut peer = spawn_peer(&[
        "flood",
        &job_name(),
        &mbx.addr().to_string(),
        &COUNT.to_string(),
    ]);
    peer.expect("ready");
    let start = Instant::now();
    peer.send_line("go");
    for _ in 0..COUNT {
        poll_spinning(&mut mbx);
    }
    let elapsed = start.elapsed().as_secs_f64();
    assert!(peer.wait_success());
    COUNT as f64 / elapsed
}

fn peer_flood(job: &str, dest: &str, count: u64) {
    let mbx = ShmMailbox::open(&ShmMailboxConfig {
        job: JobId::from_name(job),
        depth: 2,
        profile: Profile::Native,
    })
    .expect("open mailbox");
    let to = mbx.connect(&dest.parse().unwrap()).expect("connect");
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let mut message = [0u8; 24];
    for i in 0..count {
        message[..8].copy_from_slice(&i.to_le_bytes());
        send_spinning(&mbx, &to, &message);
    }
}

// --- DMA ----------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Direction {
    Put,
    Get,
}

fn region() -> std::sync::Arc<DmaRegion> {
    DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(&job_name()),
        segment_size: 64 << 20,
        max_size: 256 << 20,
    })
    .expect("dmable region")
}

/// A peer process holding a 16 MiB dmable buffer: returns it, its node and
/// the buffer's address.
fn dma_peer() -> (Peer, NodeId, u64) {
    let mut peer = spawn_peer(&["dma-owner", &job_name()]);
    let line = peer.expect("buffer");
    let (node, addr) = line.split_once(' ').unwrap();
    (peer, node.parse().unwrap(), addr.parse().unwrap())
}

fn peer_dma_owner(job: &str) {
    let region = DmaRegion::for_process(&RegionConfig {
        job: JobId::from_name(job),
        segment_size: DMA_BUFFER,
        max_size: DMA_BUFFER,
    })
    .expect("dmable region");
    let buf = region.alloc(DMA_BUFFER).expect("dmable buffer");
    // Touch every page, as an application would have.
    buf.write(0, &vec![1u8; DMA_BUFFER]);
    println!("buffer {} {}", region.node(), buf.remote_addr());
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

fn dma_bandwidth(profile: Profile, size: usize, direction: Direction) -> f64 {
    let (peer, node, remote) = dma_peer();
    let mut engine = ShmDmaEngine::new(region(), profile);
    let reg = engine.register(node, remote, DMA_BUFFER).expect("register");
    let local = engine.alloc(size).expect("local buffer");
    local.write(0, &vec![2u8; size]);
    // About 256 MiB per measurement (32 MiB under the paper model's 1 GB/s).
    let budget = match profile {
        Profile::Native => 256 << 20,
        Profile::Paper => 32 << 20,
    };
    let iters = (budget / size).max(8);
    let slots = DMA_BUFFER / size;
    let transfer = |engine: &mut ShmDmaEngine, i: usize| {
        let remote_addr = remote + ((i % slots) * size) as u64;
        match direction {
            Direction::Put => engine.put(local.as_ptr(), size, reg, remote_addr),
            Direction::Get => engine.get(local.as_ptr(), size, reg, remote_addr),
        }
        .expect("transfer")
    };
    let wait_all = |engine: &mut ShmDmaEngine, count: usize| {
        let mut done = 0;
        while done < count {
            if engine.poll().is_some() {
                done += 1;
            }
        }
    };
    // Warm-up: one pass over the remote buffer, completed before timing.
    for i in 0..slots {
        transfer(&mut engine, i);
    }
    wait_all(&mut engine, slots);
    let start = Instant::now();
    for i in 0..iters {
        transfer(&mut engine, i);
    }
    wait_all(&mut engine, iters);
    let elapsed = start.elapsed().as_secs_f64();
    drop(peer);
    (iters * size) as f64 / elapsed
}

/// Single-thread memcpy between two private buffers of this process.
fn memcpy_bandwidth(size: usize) -> f64 {
    let src = vec![3u8; size];
    let mut dst = vec![0u8; DMA_BUFFER.max(size)];
    let slots = dst.len() / size;
    let iters = ((256 << 20) / size).max(8);
    for i in 0..slots {
        dst[i * size..(i + 1) * size].copy_from_slice(&src);
    }
    let start = Instant::now();
    for i in 0..iters {
        let at = (i % slots) * size;
        dst[at..at + size].copy_from_slice(std::hint::black_box(&src));
    }
    let elapsed = start.elapsed().as_secs_f64();
    std::hint::black_box(&dst);
    (iters * size) as f64 / elapsed
}

// --- Registration -------------------------------------------------------------

fn registration_ns(profile: Profile, cached: bool) -> f64 {
    const RANGE: usize = 64 << 10;
    const WORKING_SET: usize = 64;
    let iters = if cached { 100_000 } else { 2_000 };
    let (peer, node, remote) = dma_peer();
    let mut engine = ShmDmaEngine::new(region(), profile);
    let mut cache: RegCache<NodeId, RegId> = RegCache::new(CacheConfig {
        max_entries: 2 * WORKING_SET,
        max_bytes: 2 * WORKING_SET * RANGE,
        ..CacheConfig::default()
    });
    let start = Instant::now();
    for i in 0..iters {
        let addr = remote + ((i % WORKING_SET) * RANGE) as u64;
        if cached {
            if let Err(ticket) = cache.lookup(node, addr, RANGE as u64) {
                let (start, len) = cache.page_range(addr, RANGE as u64).expect("page range");
                let reg = engine
                    .register(node, start, len as usize)
                    .expect("register");
                for evicted in cache.insert(ticket, node, start, len, reg) {
                    engine.deregister(evicted).expect("deregister");
                }
            }
        } else {
            let reg = engine.register(node, addr, RANGE).expect("register");
            engine.deregister(reg).expect("deregister");
        }
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    for reg in cache.clear() {
        engine.deregister(reg).expect("deregister");
    }
    drop(peer);
    elapsed / iters as f64
}

// --- Peer side ------------------------------------------------------------------

fn peer_main(args: &[String]) {
    if online_cpus() >= 2 {
        pin_to_cpu(1);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["cacheline", name] => peer_cacheline(name),
        ["echo", job, profile, dest] => peer_echo(job, profile.parse().unwrap(), dest),
        ["flood", job, dest, count] => peer_flood(job, dest, count.parse().unwrap()),
        ["dma-owner", job] => peer_dma_owner(job),
        other => panic!("unknown peer role {other:?}"),
    }
}
