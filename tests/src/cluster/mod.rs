//! The test side of the fabric tests: `fabric-peer` processes driven over
//! stdin/stdout, each a libfabric application on the unimem provider.
//!
//! # Which provider is tested
//!
//! [`provider_library`] picks, in order:
//! 1. `$UNIMEM_FI_LIB`, a path to a built `libunimem_fi.so` (to test a
//!    release or installed build);
//! 2. the cdylib cargo built together with this test: `unimem-provider` is
//!    a dependency of this crate, so `cargo test` compiles it (cdylib and
//!    rlib, from the same sources, same profile) into
//!    `<target>/<profile>/deps/`, next to the test executable. This is the
//!    normal case, and it is never stale;
//! 3. `<target>/<profile>/libunimem_fi.so`, this profile first, then the
//!    other one (`debug`/`release`), where `<target>` is `$CARGO_TARGET_DIR`
//!    or the workspace's `target/`;
//! 4. otherwise it runs `cargo build -p unimem-provider` (with `--release`
//!    for a release test build) once, saying so on stderr.
//!
//! Each [`Cluster`] stages that library as `libunimem-fi.so` in a temporary
//! directory of its own (`FI_PROVIDER_PATH`), so that libfabric's directory
//! scan sees exactly one provider and no stray `fi_info.conf`.
//!
//! # Isolation and hangs
//!
//! Every cluster runs in its own job (`FI_UNIMEM_JOB`), so tests running in
//! parallel never see each other's shared-memory objects, and
//! [`Cluster::finish`] asserts that the job left nothing in `/dev/shm`.
//! Every read from a child has a deadline (`$UNIMEM_FABRIC_TIMEOUT` seconds,
//! default 40; a child gives up waiting after 30, `$FABRIC_PEER_WAIT`); a
//! child still running when its handle drops is killed, and every child
//! also has a watchdog of its own (`$FABRIC_PEER_WATCHDOG`, 150 s). On a
//! failure every child of the cluster is killed and the report carries
//! everybody's stderr.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use unimem_fi::base::ffi;
use unimem_mailbox::shm::list_objects;
use unimem_mailbox::JobId;

use crate::fabric::{self, Match};
use crate::payload;

// ---------------------------------------------------------------------------
// Completion lines

/// What kind of CQ entry a [`Completion`] line reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Send,
    Recv,
    Error,
    /// An RMA write of ours completed (`FI_RMA | FI_WRITE`).
    Write,
    /// An RMA read of ours completed (`FI_RMA | FI_READ`).
    Read,
    /// A peer's write with CQ data landed in our memory
    /// (`FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA`).
    Remote,
}

/// One CQ entry as `fabric-peer` reports it, one line of `key=value`s:
/// `recv ctx=3 flags=0x... len=100 off=0 ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub kind: Kind,
    /// The number the operation was posted with.
    pub ctx: u64,
    pub flags: u64,
    pub len: usize,
    /// Where the data starts, as an offset into the buffer posted with
    /// `ctx` (multi-receive buffers hand out pieces).
    pub off: usize,
    pub tag: u64,
    pub data: u64,
    /// The source `fi_cq_readfrom` gives (receives).
    pub src: u64,
    /// [`payload::checksum`] of the `len` bytes at `off`.
    pub sum: u64,
    /// The guard bytes just past the posted buffer are untouched.
    pub guard: bool,
    /// Error entries: `err` (positive) and `olen`.
    pub err: i32,
    pub olen: usize,
}

impl Completion {
    pub fn new(kind: Kind, ctx: u64, flags: u64) -> Completion {
        Completion {
            kind,
            ctx,
            flags,
            len: 0,
            off: 0,
            tag: 0,
            data: 0,
            src: fabric::FI_ADDR_NOTAVAIL,
            sum: payload::checksum(&[]),
            guard: true,
            err: 0,
            olen: 0,
        }
    }

    pub fn has(&self, flag: u64) -> bool {
        self.flags & flag == flag
    }
}

impl fmt::Display for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Send => "send",
            Kind::Recv => "recv",
            Kind::Error => "error",
            Kind::Write => "write",
            Kind::Read => "read",
            Kind::Remote => "remote",
        };
        write!(
            f,
            "{kind} ctx={} flags={:#x} len={} off={} tag={:#x} data={:#x} src={:#x} \
             sum={:#x} guard={} err={} olen={}",
            self.ctx,
            self.flags,
            self.len,
            self.off,
            self.tag,
            self.data,
            self.src,
            self.sum,
            u8::from(self.guard),
            self.err,
            self.olen
        )
    }
}

/// Decimal, or hexadecimal with `0x`.
pub fn parse_num(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

impl FromStr for Completion {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let kind = match words.next() {
            Some("send") => Kind::Send,
            Some("recv") => Kind::Recv,
            Some("error") => Kind::Error,
            Some("write") => Kind::Write,
            Some("read") => Kind::Read,
            Some("remote") => Kind::Remote,
            _ => return Err(format!("not a completion: {line}")),
        };
        let mut c = Completion::new(kind, 0, 0);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("bad field {word} in {line}"))?;
            let n = parse_num(value).ok_or_else(|| format!("bad number {word} in {line}"))?;
            match key {
                "ctx" => c.ctx = n,
                "flags" => c.flags = n,
                "len" => c.len = n as usize,
                "off" => c.off = n as usize,
                "tag" => c.tag = n,
                "data" => c.data = n,
                "src" => c.src = n,
                "sum" => c.sum = n,
                "guard" => c.guard = n != 0,
                "err" => c.err = n as i32,
                "olen" => c.olen = n as usize,
                _ => return Err(format!("unknown field {key} in {line}")),
            }
        }
        Ok(c)
    }
}

// ---------------------------------------------------------------------------
// The provider under test

fn target_profile_dir() -> Option<PathBuf> {
    // <target>/<profile>/deps/<test>-<hash>
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// The `libunimem_fi.so` the fabric tests load (see the module docs).
pub fn provider_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(find_provider_library).clone()
}

fn find_provider_library() -> PathBuf {
    const NAME: &str = "libunimem_fi.so";
    if let Some(lib) = std::env::var_os("UNIMEM_FI_LIB") {
        let lib = PathBuf::from(lib);
        assert!(
            lib.is_file(),
            "UNIMEM_FI_LIB={} is not a file",
            lib.display()
        );
        return lib;
    }
    let profile_dir = target_profile_dir().expect("test executable in <target>/<profile>/deps");
    let beside_test = profile_dir.join("deps").join(NAME);
    if beside_test.is_file() {
        return beside_test;
    }
    let release = profile_dir.ends_with("release");
    let targets: Vec<PathBuf> = [
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
        profile_dir.parent().map(Path::to_path_buf),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let profiles = if release {
        ["release", "debug"]
    } else {
        ["debug", "release"]
    };
    let candidates = || {
        targets
            .iter()
            .flat_map(|t| profiles.iter().map(move |p| t.join(p).join(NAME)))
    };
    if let Some(found) = candidates().find(|p| p.is_file()) {
        eprintln!("fabric tests: using {}", found.display());
        return found;
    }
    eprintln!(
        "fabric tests: {NAME} not found; running `cargo build -p unimem-provider{}`",
        if release { " --release" } else { "" }
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "unimem-provider"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p unimem-provider failed");
    candidates()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{NAME} still missing after cargo build"))
}

/// A temporary directory holding the provider as `libunimem-fi.so`.
struct ProviderDir(PathBuf);

impl ProviderDir {
    fn new() -> ProviderDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "unimem-fabric-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create provider dir");
        std::os::unix::fs::symlink(provider_library(), dir.join("libunimem-fi.so"))
            .expect("symlink provider");
        ProviderDir(dir)
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------
// One child

/// Seconds set by [`set_answer_timeout`]; 0: the default.
static ANSWER_TIMEOUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Raises the deadline of every read from a child of this process's
/// clusters (tests of operations that take long by nature, such as
/// messages of several GiB).
pub fn set_answer_timeout(timeout: Duration) {
    ANSWER_TIMEOUT.store(
        timeout.as_secs().max(1),
        std::sync::atomic::Ordering::Relaxed,
    );
}

fn timeout() -> Duration {
    let set = ANSWER_TIMEOUT.load(std::sync::atomic::Ordering::Relaxed);
    let secs = std::env::var("UNIMEM_FABRIC_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .max(set);
    Duration::from_secs(secs)
}

/// What a command answered: its data lines and the final `ok ...` text.
#[derive(Debug)]
pub struct Reply {
    pub lines: Vec<String>,
    pub ok: String,
}

impl Reply {
    /// The data lines as completions.
    pub fn completions(&self) -> Vec<Completion> {
        self.lines
            .iter()
            .map(|l| l.parse().unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }

    /// The `ok` text as one number (e.g. a return code).
    pub fn num(&self) -> i64 {
        parse_signed(&self.ok).unwrap_or_else(|| panic!("not a number: '{}'", self.ok))
    }

    /// Field `key=value` of the `ok` text, as a decimal fraction.
    pub fn float(&self, key: &str) -> f64 {
        self.ok
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no number {key}= in '{}'", self.ok))
    }

    /// Field `key=value` of the `ok` text, as a number.
    pub fn field(&self, key: &str) -> i64 {
        self.ok
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| parse_signed(v))
            .unwrap_or_else(|| panic!("no number {key}= in '{}'", self.ok))
    }
}

/// A number that may be negative (return codes).
fn parse_signed(text: &str) -> Option<i64> {
    let text = text.trim();
    match text.strip_prefix('-') {
        Some(digits) => parse_num(digits).map(|n| -(n as i64)),
        None => parse_num(text).map(|n| n as i64),
    }
}

/// A running `fabric-peer`.
pub struct FabricPeer {
    pub name: String,
    /// Its endpoint's address (`fi_getname`).
    pub addr: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    exited: bool,
    /// Killed on purpose ([`Cluster::kill`]): no part of the finish.
    killed: bool,
}

impl FabricPeer {
    /// Starts a child, in test host `host` if given; [`Self::read_addr`]
    /// waits until it is ready.
    fn start(exe: &str, name: &str, env: &[(String, String)], host: Option<&str>) -> FabricPeer {
        let mut cmd = match host {
            // `testhosts exec` becomes the child (nsenter execs it): its
            // pid is the child's, for pause, resume and kill.
            Some(host) => {
                let mut cmd = Command::new(crate::hosts::script());
                cmd.args(["exec", host, exe]);
                cmd
            }
            None => Command::new(exe),
        };
        cmd.arg(name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Only what the test sets: nothing inherited may change the provider.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FI_") {
                cmd.env_remove(key);
            }
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {exe}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        let stdout_reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        FabricPeer {
            name: name.to_string(),
            addr: String::new(),
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            readers: vec![stdout_reader, stderr_reader],
            exited: false,
            killed: false,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads the first line, the endpoint's address: the child is ready.
    fn read_addr(&mut self) {
        let first = self.line();
        match first.strip_prefix("addr ") {
            Some(addr) => self.addr = addr.to_string(),
            None => self.die(&format!("expected its address, got '{first}'")),
        }
    }

    /// What the child wrote to stderr so far, as far as the reader thread
    /// has taken it from the pipe: a line written just before the child's
    /// last answer may still be on its way. Use the stderr that
    /// [`Cluster::finish`] returns (complete) for checks.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Fails the test with the child's stderr (after killing it).
    fn die(&mut self, why: &str) -> ! {
        self.kill();
        panic!("{}: {why}\n{}", self.name, self.stderr_tail())
    }

    /// The end of its stderr, headed by its name (for failure reports).
    fn stderr_tail(&self) -> String {
        // Once the child is gone its stderr reaches its end: wait for the
        // reader to take all of it (bounded, in case a stray process still
        // holds the pipe).
        if self.exited {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !self.readers.iter().all(JoinHandle::is_finished) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let stderr = self.stderr();
        let mut start = stderr.len().saturating_sub(6000);
        while !stderr.is_char_boundary(start) {
            start += 1;
        }
        format!("--- {} stderr (tail) ---\n{}", self.name, &stderr[start..])
    }

    /// The next line it prints, `Ok(None)` if none comes within `wait`,
    /// `Err` if it has exited.
    fn next_line(&mut self, wait: Duration) -> Result<Option<String>, String> {
        match self.lines.recv_timeout(wait) {
            Ok(line) => Ok(Some(line)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait();
                self.exited = true;
                Err(format!("exited early: {status:?}"))
            }
        }
    }

    fn line(&mut self) -> String {
        match self.next_line(timeout()) {
            Ok(Some(line)) => line,
            Ok(None) => self.die("no answer before the deadline"),
            Err(why) => self.die(&why),
        }
    }

    /// Sends one command line without waiting for its answer.
    fn post(&mut self, command: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{command}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("cannot send '{command}': {e}"))
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, which has not been reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.name);
    }

    fn kill(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.exited = true;
        }
    }

    /// Closes stdin, which makes the child close every libfabric object
    /// (each `fi_close` must succeed) and exit; returns its stderr.
    pub fn finish(mut self) -> String {
        self.stdin.take();
        let closed = self.line();
        if closed != "closed" {
            self.die(&format!("expected 'closed', got '{closed}'"));
        }
        let deadline = Instant::now() + timeout();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for child") {
                break status;
            }
            if Instant::now() > deadline {
                self.die("did not exit after closing");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        self.exited = true;
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        let stderr = self.stderr();
        assert!(
            status.success(),
            "{} exited with {status}; stderr:\n{stderr}",
            self.name
        );
        stderr
    }
}

impl Drop for FabricPeer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What an endpoint carried by RMA and atomics, from the line it logs at
/// `fi_close` (`FI_LOG_LEVEL=info`): `(one-sided, through the target,
/// atomics)`. Fails if `stderr` has no such line, or more than one.
pub fn carried(stderr: &str) -> (u64, u64, u64) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" closed: ") && l.contains("RMA and atomics:"))
        .collect();
    assert_eq!(lines.len(), 1, "one endpoint close line in:\n{stderr}");
    let tail = lines[0].split("RMA and atomics:").nth(1).expect("split");
    let nums: Vec<u64> = tail
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().expect("digits"))
        .collect();
    assert_eq!(nums.len(), 3, "close line: {}", lines[0]);
    (nums[0], nums[1], nums[2])
}

/// A region registered at a target (`fabric-peer`'s `mr`), and the test's
/// model of its bytes.
pub struct Region {
    pub target: usize,
    pub key: u64,
    pub bytes: Vec<u8>,
}

impl Region {
    /// Registers `len` bytes of pattern `seed` as `key` at `target`.
    pub fn new(
        c: &mut Cluster,
        target: usize,
        key: u64,
        len: usize,
        seed: u64,
        access: &str,
    ) -> Region {
        let rc = c
            .cmd(
                target,
                format!("mr {key} {len} access={access} seed={seed}"),
            )
            .num();
        assert_eq!(rc, 0, "fi_mr_reg of key {key} at p{target}");
        Region {
            target,
            key,
            bytes: payload::pattern(seed, len),
        }
    }

    /// The model after a write of `len` bytes of pattern `seed` at `off`.
    pub fn written(&mut self, off: usize, len: usize, seed: u64) {
        self.bytes[off..off + len].copy_from_slice(&payload::pattern(seed, len));
    }

    pub fn sum(&self, off: usize, len: usize) -> u64 {
        payload::checksum(&self.bytes[off..off + len])
    }

    /// [`Self::check`] for a target in `sleep-no-progress wake`.
    pub fn check_asleep(&self, c: &mut Cluster, what: &str) {
        c.begin(self.target, format!("mr-sum {}", self.key));
        let reply = Reply {
            lines: Vec::new(),
            ok: c.next_line(self.target),
        };
        self.holds(&reply, what);
    }

    /// The target's region holds exactly the model, guards intact.
    pub fn check(&self, c: &mut Cluster, what: &str) {
        let reply = c.cmd(self.target, format!("mr-sum {}", self.key));
        self.holds(&reply, what);
    }

    /// `reply` (to `mr-sum`) says the region holds the model, guards intact.
    fn holds(&self, reply: &Reply, what: &str) {
        assert_eq!(
            reply.field("guard"),
            1,
            "guard bytes of region {}: {what}",
            self.key
        );
        assert_eq!(
            reply.field("sum") as u64,
            self.sum(0, self.bytes.len()),
            "contents of region {} at p{}: {what}",
            self.key,
            self.target
        );
    }

    /// The little-endian u64 at `off` of the model.
    pub fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.bytes[off..off + 8].try_into().expect("8 bytes"))
    }
}

/// The access notices an endpoint sent (`FI_RMA_EVENT`), from the same
/// line as [`carried_direct`].
pub fn carried_notices(stderr: &str) -> u64 {
    count_before(stderr, " access notices to targets")
}

/// The rendezvous receives an endpoint read from their sender's offered
/// buffer, from the same line as [`carried_direct`].
pub fn carried_pulls(stderr: &str) -> u64 {
    count_before(stderr, " rendezvous receives read")
}

/// The number just before `marker` on the first line that holds it.
fn count_before(stderr: &str, marker: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?} in:\n{stderr}"));
    let head = line.split(marker).next().expect("split");
    head.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{marker:?} line: {line}"))
}

/// How many of an endpoint's one-sided operations were done inside their
/// call (the direct path), from its close line (`FI_LOG_LEVEL=info`).
/// Fails if `stderr` has no such line, or more than one.
pub fn carried_direct(stderr: &str) -> u64 {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("one-sided operations done inside their call"))
        .collect();
    assert_eq!(lines.len(), 1, "one direct-path line in:\n{stderr}");
    let tail = lines[0].rsplit("<info> endpoint ").next().expect("split");
    tail.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("direct-path line: {}", lines[0]))
}

/// A warning line of the provider in libfabric's log.
pub fn is_provider_warning(line: &str) -> bool {
    line.contains("<warn>") && line.contains(":unimem:")
}

// ---------------------------------------------------------------------------
// A group of children in one job

/// `fabric-peer` processes of one test, in a job of their own.
pub struct Cluster {
    exe: String,
    job: String,
    /// Test hosts the children run in, in turn (none: this host).
    hosts: Vec<String>,
    env: Vec<(String, String)>,
    pub peers: Vec<FabricPeer>,
    _dir: ProviderDir,
    /// Dropped after the children are gone (see [`crate::reclaim`]).
    _reclaims: crate::reclaim::Shared,
}

impl Cluster {
    /// A cluster for test `test`, running the `fabric-peer` at `exe`; `None`
    /// (after saying why) when libfabric itself is missing.
    ///
    /// Default environment of the children: the provider only
    /// (`FI_PROVIDER=unimem`), warnings on (`FI_LOG_LEVEL=warn`, or
    /// `$UNIMEM_FABRIC_LOG_LEVEL` to see more), eager size 16 KiB and
    /// segment 64 KiB; with `$UNIMEM_FABRIC_AGENT=1`, the progress agent
    /// on (`FI_UNIMEM_ASYNC_PROGRESS=1`; for suites that do not test its
    /// absence).
    pub fn new(exe: &str, test: &str) -> Cluster {
        // No silent skip: the test command installs libfabric first.
        if let Err(e) = fabric::api() {
            panic!("libfabric is not usable ({e}); run scripts/install-deps");
        }
        let job: String = format!("fab-{test}-{}", std::process::id())
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(64)
            .collect();
        let dir = ProviderDir::new();
        let log_level = std::env::var("UNIMEM_FABRIC_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
        let env = [
            ("FI_PROVIDER_PATH", dir.0.to_str().expect("UTF-8 temp dir")),
            ("FI_PROVIDER", "unimem"),
            ("FI_LOG_LEVEL", &log_level),
            ("FI_LOG_PROV", "unimem"),
            ("FI_UNIMEM_JOB", &job),
            ("FI_UNIMEM_EAGER_SIZE", "16384"),
            ("FI_UNIMEM_SEGMENT_SIZE", "65536"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec();
        let mut env = env;
        // The hostile-peer suites run both ways (`scripts/test`).
        if std::env::var("UNIMEM_FABRIC_AGENT").is_ok_and(|v| v == "1") {
            env.push(("FI_UNIMEM_ASYNC_PROGRESS".into(), "1".into()));
        }
        Cluster {
            exe: exe.to_string(),
            job,
            hosts: Vec::new(),
            env,
            peers: Vec::new(),
            _dir: dir,
            _reclaims: crate::reclaim::shared(),
        }
    }

    /// The unimem job of the children (`FI_UNIMEM_JOB`), for other
    /// processes that join it (a hostile `unimem-node`, say).
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Sets an environment variable of the children spawned from now on.
    pub fn env(&mut self, key: &str, value: &str) -> &mut Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Children spawned from now on have the dmable heap preloaded
    /// (`LD_PRELOAD`): their allocations, from `FI_UNIMEM_HEAP_THRESHOLD`
    /// bytes up (every one by default), are dmable.
    pub fn preload_heap(&mut self) -> &mut Self {
        let heap = crate::heap::library();
        self.env("LD_PRELOAD", heap.to_str().expect("UTF-8 heap path"))
    }

    /// Children spawned from now on run in these test hosts (see
    /// [`crate::hosts`]), child `i` in `hosts[i % hosts.len()]`, and reach
    /// each other through the network backend between hosts.
    pub fn on_hosts(&mut self, hosts: &[&str]) -> &mut Self {
        self.hosts = hosts.iter().map(|h| h.to_string()).collect();
        self
    }

    /// The test host child `i` runs in, if any.
    pub fn host_of(&self, i: usize) -> Option<&str> {
        (!self.hosts.is_empty()).then(|| self.hosts[i % self.hosts.len()].as_str())
    }

    /// Starts `n` more children, `p0`, `p1`, ..., one after the other
    /// (each is ready before the next starts).
    pub fn spawn(&mut self, n: usize) -> &mut Self {
        for _ in 0..n {
            self.start_one();
            self.peers.last_mut().expect("just started").read_addr();
        }
        self
    }

    /// Starts `n` more children all at once, like a job launcher, then
    /// waits until all are ready.
    pub fn spawn_together(&mut self, n: usize) -> &mut Self {
        let first = self.peers.len();
        for _ in 0..n {
            self.start_one();
        }
        for peer in &mut self.peers[first..] {
            peer.read_addr();
        }
        self
    }

    fn start_one(&mut self) {
        let name = format!("p{}", self.peers.len());
        let host = self.host_of(self.peers.len()).map(str::to_string);
        let peer = FabricPeer::start(&self.exe, &name, &self.env, host.as_deref());
        self.peers.push(peer);
    }

    /// Every child inserts every child's address (itself included), in
    /// order: `fi_addr` `j` is child `j` everywhere.
    pub fn connect_all(&mut self) -> &mut Self {
        let addrs: Vec<String> = self.peers.iter().map(|p| p.addr.clone()).collect();
        for i in 0..self.peers.len() {
            for (j, addr) in addrs.iter().enumerate() {
                let fi_addr = self.cmd(i, format!("insert {addr}")).num();
                assert_eq!(fi_addr, j as i64, "p{i}: fi_addr of p{j}");
            }
        }
        self
    }

    /// Ends every child cleanly, checks that the job left nothing in
    /// `/dev/shm` and that the provider logged no warning (a clean run has
    /// nothing to warn about).
    pub fn finish(self) -> Vec<String> {
        let stderrs = self.finish_with_warnings();
        for (i, stderr) in stderrs.iter().enumerate() {
            let warnings: Vec<&str> = stderr.lines().filter(|l| is_provider_warning(l)).collect();
            assert!(
                warnings.is_empty(),
                "p{i} logged warnings:\n{}",
                warnings.join("\n")
            );
        }
        stderrs
    }

    /// [`Self::finish`] for tests that provoke warnings: returns the
    /// children's stderr without looking at it.
    pub fn finish_with_warnings(mut self) -> Vec<String> {
        let stderrs: Vec<String> = self
            .peers
            .drain(..)
            .map(|p| if p.killed { p.stderr() } else { p.finish() })
            .collect();
        let left = list_objects(Some(JobId::from_name(&self.job)));
        assert!(
            left.is_empty(),
            "left in /dev/shm by job {}: {left:?}",
            self.job
        );
        // Each test host has a /dev/shm of its own.
        let prefix = unimem_mailbox::shm::object_name(JobId::from_name(&self.job), "");
        for host in &self.hosts {
            let left: Vec<String> = crate::hosts::shm_objects(host)
                .into_iter()
                .filter(|name| name.starts_with(&prefix))
                .collect();
            assert!(left.is_empty(), "left in {host}'s /dev/shm: {left:?}");
        }
        stderrs
    }

    /// Stops child `i` (SIGSTOP) and waits until it is stopped: it makes
    /// no progress until resumed.
    pub fn pause(&self, i: usize) {
        self.pause_together(&[i]);
    }

    /// Stops children `ids` at once (SIGSTOP to all, then waits for each),
    /// as a machine that stops stops them all.
    pub fn pause_together(&self, ids: &[usize]) {
        for &i in ids {
            self.peers[i].signal(libc::SIGSTOP);
        }
        for &i in ids {
            self.wait_stopped(i);
        }
    }

    fn wait_stopped(&self, i: usize) {
        let peer = &self.peers[i];
        let stat = format!("/proc/{}/stat", peer.child.id());
        // A guard against a hang only: stopping is quick, but not under load.
        let deadline = Instant::now() + Duration::from_secs(60);
        // The state follows the command name, which ends with ')'.
        let stopped = || {
            std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| {
                    s.rsplit(')')
                        .next()
                        .map(|rest| rest.trim_start().starts_with('T'))
                })
                .unwrap_or(false)
        };
        while !stopped() {
            assert!(Instant::now() < deadline, "{} does not stop", peer.name);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills child `i` (SIGKILL), a crash, and reaps it. It takes no part
    /// in [`Self::finish`] (which returns its stderr as it was); what it
    /// left in `/dev/shm` is for the survivors to reclaim.
    pub fn kill(&mut self, i: usize) {
        let peer = &mut self.peers[i];
        peer.kill();
        peer.killed = true;
    }

    /// Waits for child `i`, which is dying (a `crash` command), and reaps
    /// it. Like [`Self::kill`], it takes no part in [`Self::finish`].
    pub fn wait_death(&mut self, i: usize) -> std::process::ExitStatus {
        let peer = &mut self.peers[i];
        let status = peer.child.wait().expect("wait for the child");
        peer.exited = true;
        peer.killed = true;
        status
    }

    /// Resumes child `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.peers[i].signal(libc::SIGCONT);
    }

    /// Runs one command on child `i`; a failure fails the test.
    pub fn cmd(&mut self, i: usize, command: impl Into<String>) -> Reply {
        self.all(&[(i, command.into())]).pop().expect("one reply")
    }

    /// Sends one command to child `i` without waiting for its answer,
    /// which [`Self::answers`] reads later (no other command may go to
    /// child `i` in between).
    pub fn begin(&mut self, i: usize, command: impl Into<String>) -> String {
        let command = command.into();
        if let Err(why) = self.peers[i].post(&command) {
            self.fail(i, &why);
        }
        command
    }

    /// The next line child `i` prints (a data line of a command started
    /// with [`Self::begin`]); a failure line, an exit or the deadline fails
    /// the test.
    pub fn next_line(&mut self, i: usize) -> String {
        let deadline = Instant::now() + timeout();
        loop {
            match self.peers[i].next_line(Duration::from_millis(10)) {
                Ok(Some(line)) if line.starts_with("fail") => self.fail(i, &line),
                Ok(Some(line)) => return line,
                Ok(None) if Instant::now() > deadline => {
                    self.fail(i, "no line before the deadline")
                }
                Ok(None) => {}
                Err(why) => self.fail(i, &why),
            }
        }
    }

    /// Runs commands on several children at once (all are sent before any
    /// answer is read) and returns their answers, in order. A failure, an
    /// exit or the deadline anywhere fails the test with every child's
    /// stderr.
    pub fn all(&mut self, commands: &[(usize, String)]) -> Vec<Reply> {
        for (i, command) in commands {
            self.begin(*i, command.as_str());
        }
        self.answers(commands)
    }

    /// The answers to `commands`, already sent with [`Self::begin`] (at
    /// most one per child), in order; failures as for [`Self::all`].
    pub fn answers(&mut self, commands: &[(usize, String)]) -> Vec<Reply> {
        let mut partial: Vec<Vec<String>> = vec![Vec::new(); commands.len()];
        let mut replies: Vec<Option<Reply>> = commands.iter().map(|_| None).collect();
        let deadline = Instant::now() + timeout();
        while replies.iter().any(Option::is_none) {
            for (k, (i, command)) in commands.iter().enumerate() {
                if replies[k].is_some() {
                    continue;
                }
                let line = match self.peers[*i].next_line(Duration::from_millis(2)) {
                    Ok(Some(line)) => line,
                    Ok(None) => continue,
                    Err(why) => self.fail(*i, &format!("'{command}': {why}")),
                };
                if let Some(ok) = line.strip_prefix("ok") {
                    replies[k] = Some(Reply {
                        lines: std::mem::take(&mut partial[k]),
                        ok: ok.trim().to_string(),
                    });
                } else if let Some(why) = line.strip_prefix("fail") {
                    let lines = &partial[k];
                    self.fail(
                        *i,
                        &format!("'{command}' failed:{why}\n(after: {lines:#?})"),
                    );
                } else {
                    partial[k].push(line);
                }
            }
            if Instant::now() > deadline {
                self.fail(commands[0].0, "no answer before the deadline");
            }
        }
        replies
            .into_iter()
            .map(|r| r.expect("all answered"))
            .collect()
    }

    /// Fails the test: kills every child and reports child `i`'s trouble
    /// with everybody's stderr.
    fn fail(&mut self, i: usize, why: &str) -> ! {
        let objects = list_objects(Some(JobId::from_name(&self.job)));
        for peer in &mut self.peers {
            peer.kill();
        }
        let pids: Vec<String> = self
            .peers
            .iter()
            .map(|p| format!("{}={}", p.name, p.child.id()))
            .collect();
        let stderrs: Vec<String> = self.peers.iter().map(FabricPeer::stderr_tail).collect();
        panic!(
            "{}: {why}\nchildren: {}\nobjects of the job: {objects:#?}\n{}",
            self.peers[i].name,
            pids.join(" "),
            stderrs.join("\n")
        )
    }

    /// Sends `msgs` from child `tx` to child `rx` (possibly the same), and
    /// checks every completion on both sides; see [`Transfer`].
    pub fn transfer(&mut self, tx: usize, rx: usize, msgs: &[Msg], order: Order) {
        Transfer {
            cluster: self,
            tx,
            rx,
        }
        .run(msgs, order);
    }
}

impl std::ops::Index<usize> for Cluster {
    type Output = FabricPeer;
    fn index(&self, i: usize) -> &FabricPeer {
        &self.peers[i]
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Only after a failure: kill the children, then take what they left
        // out of /dev/shm. Every object of the job is theirs (the job is
        // this cluster's alone), so no liveness check is needed, and no
        // other test's objects are looked at.
        if !self.peers.is_empty() {
            for peer in &mut self.peers {
                peer.kill();
            }
            for name in list_objects(Some(JobId::from_name(&self.job))) {
                if let Ok(c) = std::ffi::CString::new(format!("/{name}")) {
                    // SAFETY: shm_unlink of a valid C string.
                    unsafe { libc::shm_unlink(c.as_ptr()) };
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Checked transfers

/// One message of a transfer: `len` bytes of the pattern of `seed`.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub len: usize,
    pub seed: u64,
    pub m: Match,
}

impl Msg {
    pub fn new(len: usize, seed: u64) -> Msg {
        Msg {
            len,
            seed,
            m: Match::default(),
        }
    }

    pub fn tag(mut self, tag: u64) -> Msg {
        self.m.tag = Some(tag);
        self
    }

    pub fn data(mut self, data: u64) -> Msg {
        self.m.data = Some(data);
        self
    }

    /// Options of `send`/`recv` commands for this message's match info.
    pub fn opts(&self) -> String {
        let mut s = String::new();
        if let Some(tag) = self.m.tag {
            s += &format!(" tag={tag:#x}");
        }
        if let Some(data) = self.m.data {
            s += &format!(" data={data:#x}");
        }
        s
    }

    /// `fabric-peer` command sending this message to `dest` as `ctx`.
    pub fn send_cmd(&self, dest: u64, ctx: u64) -> String {
        format!(
            "send {dest} {} {} {ctx}{}",
            self.len,
            self.seed,
            self.opts()
        )
    }

    /// Checks a receive completion against this message.
    pub fn check_recv(&self, c: &Completion, src: u64) {
        let what = format!("{self:?} received as {c}");
        assert_eq!(c.kind, Kind::Recv, "{what}");
        assert_eq!(c.len, self.len, "length: {what}");
        assert_eq!(
            c.sum,
            payload::pattern_checksum(self.seed, self.len),
            "data: {what}"
        );
        assert!(c.guard, "wrote past the buffer: {what}");
        assert_eq!(c.src, src, "source: {what}");
        let kind = if self.m.tag.is_some() {
            ffi::FI_TAGGED
        } else {
            ffi::FI_MSG
        };
        assert!(c.has(ffi::FI_RECV | kind), "flags: {what}");
        assert_eq!(c.tag, self.m.tag.unwrap_or(0), "tag: {what}");
        assert_eq!(
            c.has(ffi::FI_REMOTE_CQ_DATA),
            self.m.data.is_some(),
            "{what}"
        );
        if let Some(data) = self.m.data {
            assert_eq!(c.data, data, "CQ data: {what}");
        }
    }
}

/// When the receives of a transfer are posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Before anything is sent.
    Posted,
    /// After the sends: every message up to the eager size has completed
    /// at the sender and every message has reached the receiver unexpected.
    Unexpected,
}

/// Context numbers of a transfer's sends and receives.
const SEND_CTX: u64 = 1_000_000;
const RECV_CTX: u64 = 2_000_000;
/// Eager limit the clusters run with (`FI_UNIMEM_EAGER_SIZE`).
pub const EAGER: usize = 16384;
/// Segment size the clusters run with (`FI_UNIMEM_SEGMENT_SIZE`).
pub const SEGMENT: usize = 65536;

struct Transfer<'a> {
    cluster: &'a mut Cluster,
    tx: usize,
    rx: usize,
}

impl Transfer<'_> {
    fn post_receives(&mut self, msgs: &[Msg]) {
        let src = self.tx; // fi_addr j is child j (connect_all)
        for (i, msg) in msgs.iter().enumerate() {
            let tag = msg.m.tag.map_or(String::new(), |t| format!(" tag={t:#x}"));
            let ctx = RECV_CTX + i as u64;
            self.cluster
                .cmd(self.rx, format!("recv {src} {} {ctx}{tag}", msg.len));
        }
    }

    /// Waits for `sends` send and `recvs` receive completions, on both
    /// children at once.
    fn wait(&mut self, sends: usize, recvs: usize) -> (Vec<Completion>, Vec<Completion>) {
        if self.tx == self.rx {
            let all = self
                .cluster
                .cmd(self.tx, format!("wait sends={sends} recvs={recvs}"))
                .completions();
            return all.into_iter().partition(|c| c.kind == Kind::Send);
        }
        let replies = self.cluster.all(&[
            (self.tx, format!("wait sends={sends}")),
            (self.rx, format!("wait recvs={recvs}")),
        ]);
        (replies[0].completions(), replies[1].completions())
    }

    fn run(mut self, msgs: &[Msg], order: Order) {
        let dest = self.rx as u64;
        if order == Order::Posted {
            self.post_receives(msgs);
        }
        for (i, msg) in msgs.iter().enumerate() {
            self.cluster
                .cmd(self.tx, msg.send_cmd(dest, SEND_CTX + i as u64));
        }
        let mut sends = Vec::new();
        if order == Order::Unexpected {
            // Sends that need no receive complete now...
            let early = msgs.iter().filter(|m| m.len <= EAGER).count();
            sends = self.wait(early, 0).0;
            let mut early_ctx: Vec<u64> = sends.iter().map(|c| c.ctx).collect();
            early_ctx.sort_unstable();
            let expected: Vec<u64> = (0..msgs.len())
                .filter(|&i| msgs[i].len <= EAGER)
                .map(|i| SEND_CTX + i as u64)
                .collect();
            assert_eq!(early_ctx, expected, "sends completed before any receive");
            // ...and the receiver takes in everything that has arrived.
            self.cluster.cmd(self.rx, "progress");
            self.post_receives(msgs);
        }
        let (more, recvs) = self.wait(msgs.len() - sends.len(), msgs.len());
        sends.extend(more);
        check_sends(&sends, msgs);
        let by_ctx: HashMap<u64, &Completion> = recvs.iter().map(|c| (c.ctx, c)).collect();
        assert_eq!(by_ctx.len(), msgs.len(), "one completion per receive");
        for (i, msg) in msgs.iter().enumerate() {
            let c = by_ctx
                .get(&(RECV_CTX + i as u64))
                .unwrap_or_else(|| panic!("no completion for receive {i} ({msg:?})"));
            msg.check_recv(c, self.tx as u64);
        }
    }
}

fn check_sends(sends: &[Completion], msgs: &[Msg]) {
    let mut ctxs: Vec<u64> = sends.iter().map(|c| c.ctx).collect();
    ctxs.sort_unstable();
    let expected: Vec<u64> = (0..msgs.len() as u64).map(|i| SEND_CTX + i).collect();
    assert_eq!(ctxs, expected, "one send completion per message");
    for c in sends {
        let msg = &msgs[(c.ctx - SEND_CTX) as usize];
        let kind = if msg.m.tag.is_some() {
            ffi::FI_TAGGED
        } else {
            ffi::FI_MSG
        };
        assert!(c.has(ffi::FI_SEND | kind), "{msg:?}: {c}");
    }
}
