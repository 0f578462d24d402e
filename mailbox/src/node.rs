//! Node identity: which process of which job is an emulated Unimem node.
//!
//! A node is a process. Its identity is the job it belongs to, its pid and a
//! nonce taken from the process start time, so that an address stays wrong
//! rather than silently reaching a new process that happens to reuse the pid.

use std::fmt;
use std::io;

/// A job tag, hashed to 32 bits so that it fits in fixed-size addresses and
/// object names. Processes talk only within one job.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct JobId(pub u32);

impl JobId {
    /// FNV-1a of the job name: stable across processes and builds.
    pub fn from_name(name: &str) -> JobId {
        let mut hash: u32 = 0x811c_9dc5;
        for byte in name.bytes() {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        JobId(hash)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// Where a node on another host is reached: the IPv4 address and port of
/// its network interface (the network backend's endpoint in that process).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct NicAddr {
    pub ip: [u8; 4],
    pub port: u16,
}

impl fmt::Display for NicAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.ip;
        write!(f, "{a}.{b}.{c}.{d}:{}", self.port)
    }
}

impl std::str::FromStr for NicAddr {
    type Err = BadAddress;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ip, port) = s.rsplit_once(':').ok_or(BadAddress)?;
        let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| BadAddress)?;
        let port: u16 = port.parse().map_err(|_| BadAddress)?;
        if port == 0 {
            return Err(BadAddress);
        }
        Ok(NicAddr {
            ip: ip.octets(),
            port,
        })
    }
}

/// One emulated node: a process of a job, on this host or another.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct NodeId {
    pub job: JobId,
    pub pid: u32,
    /// Low 32 bits of the process start time, in clock ticks since boot.
    pub nonce: u32,
    /// `None`: a node of this host, reached through shared memory. `Some`:
    /// a node of another host, reached through the network at this
    /// address. A node's own id has `None`; it gets its address only in
    /// what it tells peers of other hosts (see the provider's AV).
    pub nic: Option<NicAddr>,
}

impl NodeId {
    /// This process as a node of `job`.
    pub fn current(job: JobId) -> NodeId {
        // Not cached: a forked child is a node of its own.
        let pid = std::process::id();
        NodeId {
            job,
            pid,
            nonce: process_start_time(pid).unwrap_or(0) as u32,
            nic: None,
        }
    }

    /// Whether this node lives on another host.
    pub fn is_remote(&self) -> bool {
        self.nic.is_some()
    }

    /// The same node as named on its own host (no network address).
    pub fn local(self) -> NodeId {
        NodeId { nic: None, ..self }
    }

    /// Whether the process this id names is still running. A pid now used by
    /// another process (different start time) counts as dead; a look that
    /// fails (see [`read_start_time`]) counts as alive. Only meaningful for
    /// a node of this host: one of another host counts as alive here (the
    /// network backend watches those).
    pub fn is_alive(&self) -> bool {
        if self.is_remote() {
            return true;
        }
        match read_start_time(self.pid) {
            Ok(Some(start)) => start as u32 == self.nonce,
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{:08x}", self.job, self.pid, self.nonce)?;
        match self.nic {
            Some(nic) => write!(f, "@{nic}"),
            None => Ok(()),
        }
    }
}

/// Start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), or `None` when no such process exists or the look
/// fails.
pub fn process_start_time(pid: u32) -> Option<u64> {
    read_start_time(pid).ok().flatten()
}

/// Start time of process `pid`: `Ok(None)` when no such process runs (or
/// it is a zombie), `Err` when we could not look (out of file
/// descriptors, `/proc` unreadable): "unknown", which liveness checks must
/// never take for "dead".
pub fn read_start_time(pid: u32) -> io::Result<Option<u64>> {
    use std::io::{Read, Write};
    if pid == 0 {
        return Ok(None);
    }
    // Without allocating: peers are checked from the data path's polls,
    // which allocate nothing. The path fits std's on-stack C string, the
    // file (52 numeric fields and a name of 15 bytes at most) the buffer.
    let mut path = [0u8; 32];
    let path_len = {
        let mut at = &mut path[..];
        write!(at, "/proc/{pid}/stat")?;
        32 - at.len()
    };
    let path = std::str::from_utf8(&path[..path_len]).map_err(|_| io::ErrorKind::InvalidData)?;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let mut stat = [0u8; 2048];
    let mut len = 0;
    loop {
        match file.read(&mut stat[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            // The process went away while we read.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if len == stat.len() {
            return Err(io::ErrorKind::InvalidData.into());
        }
    }
    let stat = std::str::from_utf8(&stat[..len]).map_err(|_| io::ErrorKind::InvalidData)?;
    Ok(parse_start_time(stat))
}

/// Field 22 of a `/proc/<pid>/stat` text; `None` for a zombie or a text
/// that does not parse.
fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields
    // after it are counted from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (state); start time is field 22.
    let start = rest.split_ascii_whitespace().nth(19)?;
    // A zombie has exited: its memory is gone and it will never poll again.
    if rest.split_ascii_whitespace().next()? == "Z" {
        return None;
    }
    start.parse().ok()
}

/// Whether a process `pid` exists (whichever it is: a pid can be reused;
/// [`process_alive`] tells). One system call; a pid of 0 (unknown) or one
/// we may not signal counts as existing, and so does a process that died
/// and waits for its parent to reap it (a zombie), which only
/// [`process_alive`] sees as gone.
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid == 0 {
        return true;
    }
    // SAFETY: signal 0 sends nothing: kill only checks the pid.
    let gone = unsafe { libc::kill(pid, 0) } != 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    !gone
}

/// Whether some process with this pid and start time exists and is not a
/// zombie (or we could not look: see [`read_start_time`]).
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    match read_start_time(pid) {
        Ok(start) => start == Some(start_time),
        Err(_) => true,
    }
}

/// Monotonic time in nanoseconds, comparable between processes of one host
/// (CLOCK_MONOTONIC is system-wide).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Parses the `job:pid:nonce` form that `Display` prints.
impl std::str::FromStr for NodeId {
    type Err = BadAddress;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |_| BadAddress;
        let (s, nic) = match s.split_once('@') {
            Some((id, nic)) => (id, Some(nic.parse()?)),
            None => (s, None),
        };
        let mut parts = s.split(':');
        let (Some(job), Some(pid), Some(nonce), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(BadAddress);
        };
        Ok(NodeId {
            job: JobId(u32::from_str_radix(job, 16).map_err(bad)?),
            pid: pid.parse().map_err(bad)?,
            nonce: u32::from_str_radix(nonce, 16).map_err(bad)?,
            nic,
        })
    }
}

/// A node id or mailbox address that does not parse.
#[derive(Debug, PartialEq, Eq)]
pub struct BadAddress;

impl fmt::Display for BadAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed unimem address (expected unimem://<job>/<pid>.<nonce>/<index>[@<ipv4>:<port>])")
    }
}

impl std::error::Error for BadAddress {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quick check sees this process and its parent, and not a child
    /// that exited and was reaped (nor does the thorough one).
    #[test]
    fn a_reaped_child_does_not_exist() {
        assert!(process_exists(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = read_start_time(pid).ok().flatten();
        child.wait().unwrap();
        assert!(!process_exists(pid));
        if let Some(start) = start {
            assert!(!process_alive(pid, start));
        }
        assert!(process_exists(0), "an unknown owner counts as there");
    }

    #[test]
    fn job_hash_is_stable() {
        assert_eq!(JobId::from_name(""), JobId(0x811c_9dc5));
        assert_eq!(JobId::from_name("a"), JobId(0xe40c_292c));
        assert_ne!(JobId::from_name("job1"), JobId::from_name("job2"));
    }

    #[test]
    fn current_process_is_alive() {
        let me = NodeId::current(JobId(1));
        assert_eq!(me.pid, std::process::id());
        assert!(me.is_alive());
        let other_incarnation = NodeId {
            nonce: me.nonce.wrapping_add(1),
            ..me
        };
        assert!(!other_incarnation.is_alive());
    }

    #[test]
    fn node_id_text_round_trip() {
        let node = NodeId::current(JobId(0xabc));
        assert_eq!(node.to_string().parse(), Ok(node));
        assert!("1:2".parse::<NodeId>().is_err());
        let remote = NodeId {
            nic: Some("198.18.0.12:4242".parse().unwrap()),
            ..node
        };
        assert_eq!(remote.to_string().parse(), Ok(remote));
        assert!(
            remote.is_alive(),
            "another host's node is watched elsewhere"
        );
        assert_eq!(remote.local(), node);
    }

    #[test]
    fn exited_process_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_start_time(pid).is_none());
    }

    #[test]
    fn monotonic_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
    }
}
