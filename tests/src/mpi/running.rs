//! A job that runs: its output as it comes, its processes tracked so that
//! none outlives it, killed at its timeout or when dropped.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use unimem_mailbox::shm::reclaim_dead_objects;

use super::output::{clip, Captured};
use super::procfs::{cmdline, descendants, remove_orphaned_mpich_files, start_time};
use super::{Line, Output};

/// A job that runs: its output comes line by line, and it can be killed.
/// Dropping it kills whatever is left of the job.
pub struct RunningJob {
    pub(super) describe: String,
    pub(super) unimem_job: String,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) child: Option<Child>,
    /// Processes of the job seen so far: pid -> start time (clock ticks
    /// since boot), so that a reused pid is never signalled.
    pub(super) known: HashMap<i32, u64>,
    pub(super) last_track: Option<Instant>,
    pub(super) capture: Arc<Mutex<Captured>>,
    pub(super) lines: Receiver<Line>,
    pub(super) readers: Vec<JoinHandle<()>>,
    pub(super) status: Option<ExitStatus>,
    /// MPICH's shared-memory files in /dev/shm before the job.
    pub(super) mpich_files_before: Vec<String>,
    pub(super) _guard: MutexGuard<'static, ()>,
    /// Dropped after the job's processes are gone and their objects
    /// reclaimed (see [`crate::solo`]).
    pub(super) _solo: crate::solo::Shared,
}

impl RunningJob {
    /// Pid of the job helper (the root of the job's processes).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn unimem_job(&self) -> &str {
        &self.unimem_job
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The job's processes now (launcher, proxies, ranks): pid and command
    /// line. Hydra starts ranks in sessions of their own, so they are found
    /// by parentage, not by process group.
    pub fn processes(&mut self) -> Vec<(i32, String)> {
        self.track_now();
        let mut procs: Vec<(i32, String)> = self
            .known
            .iter()
            .filter(|(pid, start)| start_time(**pid) == Some(**start))
            .map(|(pid, _)| (*pid, cmdline(*pid)))
            .collect();
        procs.sort();
        procs
    }

    /// Pids of the job's running processes that execute `program` (the
    /// ranks, when it is the job's program).
    pub fn pids_of(&mut self, program: &Path) -> Vec<i32> {
        let wanted = program
            .canonicalize()
            .unwrap_or_else(|_| program.to_path_buf());
        self.processes()
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == wanted))
            .collect()
    }

    /// The next line of output (either stream), waiting at most `timeout`;
    /// `None` if none came (the job may have ended: see [`Self::has_ended`]).
    pub fn next_line(&mut self, timeout: Duration) -> Option<Line> {
        let until = Instant::now() + timeout;
        loop {
            self.track();
            let slice = until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            match self.lines.recv_timeout(slice) {
                Ok(line) => return Some(line),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) if Instant::now() >= until => return None,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Reads lines until one satisfies `pred` and returns it; panics with
    /// the output so far if none does within `timeout` or before the job
    /// ends. `what` names the awaited line in that message.
    pub fn wait_for_line(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Line) -> bool,
    ) -> Line {
        let until = Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.next_line(left) {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => {
                    let why = if self.has_ended() {
                        "the job ended first".to_string()
                    } else {
                        format!("not within {timeout:?}")
                    };
                    let report = self.report_so_far();
                    self.kill();
                    panic!("no {what}: {why}\n{report}");
                }
            }
        }
    }

    /// Waits until `done` holds for all the lines read so far; panics with
    /// the output (and kills the job) if it does not within `timeout` or
    /// before the job ends. `what` names the awaited state in that message.
    pub fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Line]) -> bool,
    ) {
        let until = Instant::now() + timeout;
        loop {
            if done(&self.lines_so_far()) {
                return;
            }
            let now = Instant::now();
            let ended = self.readers_done() && self.has_ended();
            if now >= until || ended {
                // the last lines may have come since the check above
                if done(&self.lines_so_far()) {
                    return;
                }
                let why = if ended {
                    "the job ended first".to_string()
                } else {
                    format!("not within {timeout:?}")
                };
                let mut report = self.report_so_far();
                if !ended {
                    self.track_now();
                    report += "\n--- where its processes were ---\n";
                    report += &self.where_they_are();
                }
                self.kill();
                panic!("no {what}: {why}\n{report}");
            }
            if self.next_line(until - now).is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn readers_done(&self) -> bool {
        self.readers.iter().all(JoinHandle::is_finished)
    }

    /// All lines read so far (by the readers, whether or not
    /// [`Self::next_line`] returned them yet).
    pub fn lines_so_far(&self) -> Vec<Line> {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines
            .clone()
    }

    /// Whether the job helper has exited.
    pub fn has_ended(&mut self) -> bool {
        self.poll_exit().is_some()
    }

    /// Waits for the end of the job, at most `timeout` (and never past the
    /// job's own timeout); kills it and panics with its output otherwise.
    pub fn wait_timeout(mut self, timeout: Duration) -> Output {
        let until = (Instant::now() + timeout).min(self.deadline);
        loop {
            if let Some(status) = self.poll_exit() {
                return self.finish(status);
            }
            if Instant::now() >= until {
                let waited = if until == self.deadline {
                    format!("its timeout of {:?}", self.timeout)
                } else {
                    format!("{timeout:?}")
                };
                self.track_now();
                let stuck = self.where_they_are();
                self.kill();
                let status = self.poll_exit().unwrap_or_else(|| ExitStatus::from_raw(9));
                let output = self.finish(status);
                panic!(
                    "the MPI job did not end within {waited}: killed it\n{}\n\
                     --- where its processes were ---\n{stuck}",
                    output.report()
                );
            }
            self.track();
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the end of the job within its own timeout.
    pub fn wait(self) -> Output {
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.wait_timeout(left)
    }

    /// Kills the whole job with SIGKILL: the helper's process group and
    /// every process of the job seen; waits until they are gone, then
    /// removes what they left in `/dev/shm` (unimem objects of dead
    /// processes, and MPICH's `mpich_shm_*` files that nobody maps).
    pub fn kill(&mut self) {
        self.track_now();
        if let Some(child) = &self.child {
            // SAFETY: kill(2) has no memory effects; the group is the job's.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        }
        let victims: Vec<(i32, u64)> = self.known.iter().map(|(p, s)| (*p, *s)).collect();
        for &(pid, start) in &victims {
            if start_time(pid) == Some(start) {
                // SAFETY: as above; the pid is a process of this job (same
                // start time as when it was seen as a descendant).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if let Some(child) = &mut self.child {
            let _ = child.wait();
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until
            && victims
                .iter()
                .any(|&(pid, start)| start_time(pid) == Some(start))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        reclaim_dead_objects();
        remove_orphaned_mpich_files(&self.mpich_files_before);
    }

    /// The output so far, as a report (for failure messages).
    pub fn report_so_far(&self) -> String {
        let c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        format!(
            "command: {}\nrunning for {:.2} s (unimem job {})\n--- stdout ---\n{}--- stderr ---\n{}",
            self.describe,
            self.started.elapsed().as_secs_f64(),
            self.unimem_job,
            clip(&c.stdout),
            clip(&c.stderr)
        )
    }

    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.status = Some(status);
                }
            }
        }
        self.status
    }

    /// Records the job's current processes, at most every 100 ms (a scan
    /// of /proc takes CPU time from the job).
    fn track(&mut self) {
        if self
            .last_track
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
        {
            self.track_now();
        }
    }

    /// Where each live process of the job is, thread by thread: state,
    /// kernel wait channel, system call and (as root) kernel stack; read
    /// from /proc only, so that a process stuck in the kernel cannot stop
    /// the report. For a job that hangs.
    fn where_they_are(&self) -> String {
        let mut out = String::new();
        let mut pids: Vec<i32> = self.known.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            if start_time(pid) != self.known.get(&pid).copied() {
                continue;
            }
            let _ = writeln!(out, "pid {pid}: {}", cmdline(pid));
            let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let dir = task.path();
                let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
                let stat = read("stat");
                // The state follows the command's closing parenthesis.
                let state = stat.rsplit_once(") ").map_or("?", |(_, r)| &r[..1]);
                let _ = writeln!(
                    out,
                    "  tid {} {} state {state} wchan {} syscall {}",
                    task.file_name().to_string_lossy(),
                    read("comm").trim(),
                    read("wchan").trim(),
                    read("syscall").split_whitespace().next().unwrap_or("?"),
                );
                for frame in read("stack").lines().take(12) {
                    let _ = writeln!(out, "    {frame}");
                }
            }
        }
        out
    }

    /// Records the job's current processes (descendants of the helper).
    fn track_now(&mut self) {
        self.last_track = Some(Instant::now());
        let Some(child) = &self.child else { return };
        if self.status.is_some() {
            return;
        }
        for pid in descendants(child.id() as i32) {
            if let Some(start) = start_time(pid) {
                self.known.entry(pid).or_insert(start);
            }
        }
    }

    fn finish(&mut self, status: ExitStatus) -> Output {
        // The readers end when every process holding the pipes is gone;
        // a stray one must not hang the test.
        let until = Instant::now() + Duration::from_secs(5);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        for reader in std::mem::take(&mut self.readers) {
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        if !status.success() {
            remove_orphaned_mpich_files(&self.mpich_files_before);
        }
        let c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        Output {
            command: self.describe.clone(),
            unimem_job: self.unimem_job.clone(),
            status,
            stdout: c.stdout.clone(),
            stderr: c.stderr.clone(),
            lines: c.lines.clone(),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        if self.poll_exit().is_none() {
            self.kill();
        }
    }
}
