//! One child: a `fabric-peer` process, its commands and their answers, each
//! with a deadline.

use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{parse_num, Completion};

thread_local! {
    /// Seconds set by [`set_answer_timeout`] for this thread's test; 0:
    /// the default. Per test, not per process: every test of the binary
    /// shares the process.
    static ANSWER_TIMEOUT: Cell<u64> = const { Cell::new(0) };
}

/// Raises the deadline of every read from a child of the calling test's
/// clusters (tests of operations that take long by nature, such as
/// messages of several GiB).
pub fn set_answer_timeout(timeout: Duration) {
    ANSWER_TIMEOUT.with(|set| set.set(timeout.as_secs().max(1)));
}

pub(super) fn timeout() -> Duration {
    let set = ANSWER_TIMEOUT.with(Cell::get);
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
    pub(super) child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    pub(super) exited: bool,
    /// Killed on purpose ([`Cluster::kill`]): no part of the finish.
    pub(super) killed: bool,
}

impl FabricPeer {
    /// Starts a child, in test host `host` if given; [`Self::read_addr`]
    /// waits until it is ready.
    pub(super) fn start(
        exe: &str,
        name: &str,
        env: &[(String, String)],
        host: Option<&str>,
    ) -> FabricPeer {
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
    pub(super) fn read_addr(&mut self) {
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
    pub(super) fn stderr_tail(&self) -> String {
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
    pub(super) fn next_line(&mut self, wait: Duration) -> Result<Option<String>, String> {
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
    pub(super) fn post(&mut self, command: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{command}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("cannot send '{command}': {e}"))
    }

    pub(super) fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, which has not been reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.name);
    }

    pub(super) fn kill(&mut self) {
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
