//! What a job printed, line by line and as a whole, and what it proves:
//! that unimem carried it, endpoint by endpoint.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use unimem_mailbox::shm::list_objects;
use unimem_mailbox::JobId;

use super::SUMMARY_PROVIDER_LINE;

/// Which output stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of a job's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub stream: Stream,
    pub text: String,
}

#[derive(Default)]
pub(super) struct Captured {
    pub(super) stdout: String,
    pub(super) stderr: String,
    pub(super) lines: Vec<Line>,
}

pub(super) fn read_lines(
    pipe: Box<dyn Read + Send>,
    stream: Stream,
    capture: &Mutex<Captured>,
    tx: &mpsc::Sender<Line>,
) {
    let mut reader = BufReader::new(pipe);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match reader.read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches(['\n', '\r']).to_string();
        let line = Line { stream, text };
        {
            let mut c = capture.lock().unwrap_or_else(|p| p.into_inner());
            let buf = match stream {
                Stream::Stdout => &mut c.stdout,
                Stream::Stderr => &mut c.stderr,
            };
            buf.push_str(&line.text);
            buf.push('\n');
            c.lines.push(line.clone());
        }
        let _ = tx.send(line);
    }
}

/// What a finished job did.
#[derive(Clone, Debug)]
pub struct Output {
    /// The command line, for messages.
    pub command: String,
    /// The unimem job name it ran under (`FI_UNIMEM_JOB`).
    pub unimem_job: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Both streams, line by line, in the order the lines were read.
    pub lines: Vec<Line>,
    pub elapsed: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Whether a line of stdout is exactly `line`.
    pub fn has_stdout_line(&self, line: &str) -> bool {
        self.stdout.lines().any(|l| l == line)
    }

    /// Whether either stream contains `text`.
    pub fn contains(&self, text: &str) -> bool {
        self.stdout.contains(text) || self.stderr.contains(text)
    }

    /// This job's shared-memory objects still in `/dev/shm`.
    pub fn leftover_objects(&self) -> Vec<String> {
        list_objects(Some(JobId::from_name(&self.unimem_job)))
    }

    /// Command, status, time and both streams, for a failure message.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "command: {}", self.command);
        let _ = writeln!(
            s,
            "status: {} after {:.2} s (unimem job {})",
            describe_status(self.status),
            self.elapsed.as_secs_f64(),
            self.unimem_job
        );
        let _ = writeln!(s, "--- stdout ---\n{}", clip(&self.stdout));
        let _ = write!(s, "--- stderr ---\n{}", clip(&self.stderr));
        s
    }

    /// Panics with the report unless the job exited with status 0.
    pub fn assert_success(&self) {
        assert!(self.success(), "the MPI job failed\n{}", self.report());
    }
}

pub(super) fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => format!("{status}"),
    }
}

/// At most the first 100 and the last 300 lines of `text`.
pub(super) fn clip(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 400 {
        return text.to_string();
    }
    format!(
        "{}\n[... {} lines left out ...]\n{}",
        lines[..100].join("\n"),
        lines.len() - 400,
        lines[lines.len() - 300..].join("\n")
    )
}

/// Whether MPICH's debug summary (the job needs [`Job::summary`], on by
/// default) names unimem as its libfabric provider.
pub fn unimem_carried(output: &Output) -> bool {
    output.lines.iter().any(|l| {
        l.text.starts_with(SUMMARY_PROVIDER_LINE)
            && l.text[SUMMARY_PROVIDER_LINE.len()..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_')
    })
}

/// What one unimem endpoint carried, from the line the provider logs as it
/// closes the endpoint (at `FI_LOG_LEVEL=info`, which [`Job::prove`] turns
/// on): `libfabric:<pid>:<time>::unimem:ep_ctrl:...<info> endpoint 0x...
/// closed: S sends, R receives; RMA and atomics: O one-sided, T through the
/// target (A atomics)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointTraffic {
    /// The process (rank) that closed it.
    pub pid: u32,
    pub sends: u64,
    pub receives: u64,
    /// RMA and atomic operations done by DMA alone.
    pub one_sided: u64,
    /// RMA and atomic operations carried out by the target's progress.
    pub through_target: u64,
    /// Atomics among them.
    pub atomics: u64,
}

impl EndpointTraffic {
    /// The endpoint line in `line`, if it is one.
    pub fn parse(line: &str) -> Option<EndpointTraffic> {
        let pid = line
            .strip_prefix("libfabric:")?
            .split(':')
            .next()?
            .parse()
            .ok()?;
        if !line.contains("::unimem:") {
            return None;
        }
        let tail = &line[line.find("> endpoint 0x")?..];
        let counts = &tail[tail.find(" closed: ")? + " closed: ".len()..];
        let n: Vec<u64> = counts
            .split(|c: char| !c.is_ascii_digit())
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().ok())
            .collect::<Option<_>>()?;
        let [sends, receives, one_sided, through_target, atomics] = n[..] else {
            return None;
        };
        Some(EndpointTraffic {
            pid,
            sends,
            receives,
            one_sided,
            through_target,
            atomics,
        })
    }

    /// RMA and atomic operations, however carried.
    pub fn rma(&self) -> u64 {
        self.one_sided + self.through_target
    }
}

/// The start of the job helper's verdict line when `--prove` found that
/// unimem carried the job.
pub const PROOF_LINE: &str = "mpirun-unimem: proof (";

impl Output {
    /// Every unimem endpoint line of the job, in the order they came.
    pub fn endpoints(&self) -> Vec<EndpointTraffic> {
        self.lines
            .iter()
            .filter_map(|l| EndpointTraffic::parse(&l.text))
            .collect()
    }

    /// Whether the job (run with [`Job::prove`]) shows that unimem carried
    /// it: the helper's verdict says so, `ranks` processes closed unimem
    /// endpoints, and each of them sent and received through them and,
    /// with `rma`, did RMA or atomics through them. `Ok` has a summary;
    /// `Err` what is missing.
    pub fn proof(&self, ranks: usize, rma: bool) -> Result<String, String> {
        let mut problems = Vec::new();
        let verdict = self.lines.iter().find(|l| l.text.starts_with(PROOF_LINE));
        match verdict {
            None => problems.push("no verdict line of mpirun-unimem --prove".to_string()),
            Some(l) if !l.text.contains("): unimem carried the job: ") => {
                problems.push(format!("mpirun-unimem says: {}", l.text))
            }
            Some(_) => {}
        }
        let mut per_rank: Vec<EndpointTraffic> = Vec::new();
        for ep in self.endpoints() {
            match per_rank.iter_mut().find(|r| r.pid == ep.pid) {
                Some(r) => {
                    r.sends += ep.sends;
                    r.receives += ep.receives;
                    r.one_sided += ep.one_sided;
                    r.through_target += ep.through_target;
                    r.atomics += ep.atomics;
                }
                None => per_rank.push(ep),
            }
        }
        if per_rank.len() != ranks {
            problems.push(format!(
                "{} processes closed unimem endpoints, expected {ranks} ranks",
                per_rank.len()
            ));
        }
        for r in &per_rank {
            if r.sends == 0 || r.receives == 0 || (rma && r.rma() == 0) {
                problems.push(format!(
                    "rank pid {} carried {} sends, {} receives, {} RMA and atomics through unimem",
                    r.pid,
                    r.sends,
                    r.receives,
                    r.rma()
                ));
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let sum = |f: fn(&EndpointTraffic) -> u64| per_rank.iter().map(f).sum::<u64>();
        Ok(format!(
            "{} ranks: {} sends, {} receives, {} RMA and atomics ({} one-sided)",
            per_rank.len(),
            sum(|r| r.sends),
            sum(|r| r.receives),
            sum(EndpointTraffic::rma),
            sum(|r| r.one_sided)
        ))
    }
}

/// Panics unless MPICH's debug summary names unimem as its libfabric
/// provider ([`unimem_carried`]).
pub fn assert_unimem_carried(output: &Output) {
    assert!(
        unimem_carried(output),
        "MPICH's debug summary does not name unimem (no line '{SUMMARY_PROVIDER_LINE}')\n{}",
        output.report()
    );
}
