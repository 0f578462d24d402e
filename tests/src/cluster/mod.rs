//! The test side of the fabric tests: `fabric-peer` processes driven over
//! stdin/stdout, each a libfabric application on the unimem provider.
//!
//! # Which provider is tested
//!
//! [`built_library`] picks, in order:
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
//! [`provider_library`], the one the children load, is that build
//! [pinned](crate::pinned) at first use: cargo deletes a library it
//! rebuilds for as long as the compile takes, and a child started then
//! would find no provider (`fi_getinfo: -61`). Each [`Cluster`] stages
//! the pinned library as `libunimem-fi.so` in a temporary directory of its
//! own (`FI_PROVIDER_PATH`), so that libfabric's directory scan sees
//! exactly one provider and no stray `fi_info.conf`.
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

mod completion;
mod logs;
mod peer;
mod provider;
mod region;
mod transfer;

pub use completion::{parse_num, Completion, Kind};
pub use logs::{carried, carried_direct, carried_notices, carried_pulls, is_provider_warning};
pub use peer::{set_answer_timeout, FabricPeer, Reply};
pub use provider::{built_library, provider_library};
pub use region::Region;
pub use transfer::{Msg, Order, EAGER, SEGMENT};

use std::time::{Duration, Instant};

use unimem_mailbox::shm::list_objects;
use unimem_mailbox::JobId;

use crate::fabric;
use peer::timeout;
use provider::ProviderDir;
use transfer::Transfer;

/// `fabric-peer` processes of one test, in a job of their own.
pub struct Cluster {
    exe: String,
    job: String,
    /// Test hosts the children run in, in turn (none: this host).
    hosts: Vec<String>,
    env: Vec<(String, String)>,
    pub peers: Vec<FabricPeer>,
    _dir: ProviderDir,
    /// Dropped after the children are gone (see [`crate::solo`]).
    _solo: crate::solo::Shared,
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
            _solo: crate::solo::shared(),
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
