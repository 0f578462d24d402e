//! A process in trouble: `crash` (a fatal signal, by a real fault where
//! there is one), `exit-on-agent`, `churn` and `exhaust-fds`.

use std::time::{Duration, Instant};

use super::args::Args;
use super::{CmdResult, Peer};

impl Peer {
    /// `churn <count> <min> <max>`: small allocations come and go.
    pub(super) fn churn(&mut self, a: &Args) -> CmdResult {
        let (count, min, max) = (a.num(0)?, a.num(1)? as usize, a.num(2)? as usize);
        if min == 0 || max < min {
            return Err("churn: 0 < min <= max".into());
        }
        let blocks: Vec<Vec<u8>> = (0..count as usize)
            .map(|i| vec![i as u8; min + i % (max - min + 1)])
            .collect();
        std::hint::black_box(&blocks);
        drop(blocks);
        Ok(String::new())
    }

    /// `exhaust-fds <ms>`: progress while out of file descriptors.
    pub(super) fn exhaust_fds(&mut self, a: &Args) -> CmdResult {
        let until = Instant::now() + Duration::from_millis(a.num(0)?);
        let mut held = Vec::new();
        while let Ok(file) = std::fs::File::open("/dev/null") {
            held.push(file);
        }
        while Instant::now() < until {
            self.poll();
        }
        Ok(format!("held={}", held.len()))
    }
}

/// `crash <how>`: dies at once of a fatal signal, as a real crash does:
/// `segv` (a store to address 0), `bus` (a touch of a mapped file past its
/// truncated end), `abrt` (abort), `fpe` (an integer division by zero),
/// `ill` (an undefined instruction), or `bus-sent`, `term`, `int`, `quit`
/// (raised: no access to retry).
pub(super) fn crash(a: &Args) -> CmdResult {
    let how = a.pos.first().copied().unwrap_or("");
    // SAFETY: every arm below is meant to end the process.
    unsafe {
        match how {
            "segv" => std::ptr::write_volatile(std::ptr::null_mut::<u64>(), 1),
            "bus" => {
                let file = tempfile_of_two_pages();
                let at = libc::mmap(
                    std::ptr::null_mut(),
                    8192,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file,
                    0,
                );
                assert_ne!(at, libc::MAP_FAILED, "mmap");
                assert_eq!(libc::ftruncate(file, 0), 0, "ftruncate");
                std::ptr::write_volatile(at.cast::<u64>(), 1);
            }
            "abrt" => std::process::abort(),
            #[cfg(target_arch = "x86_64")]
            "fpe" => {
                std::arch::asm!("xor edx, edx", "div ecx", in("ecx") 0, inout("eax") 1 => _, out("edx") _)
            }
            #[cfg(target_arch = "x86_64")]
            "ill" => std::arch::asm!("ud2"),
            "bus-sent" => {
                libc::raise(libc::SIGBUS);
            }
            "term" => {
                libc::raise(libc::SIGTERM);
            }
            "int" => {
                libc::raise(libc::SIGINT);
            }
            "quit" => {
                libc::raise(libc::SIGQUIT);
            }
            other => return Err(format!("no crash {other:?}")),
        }
    }
    Err(format!("survived crash {how}"))
}

/// A file of two pages, already unlinked.
fn tempfile_of_two_pages() -> libc::c_int {
    let path =
        std::ffi::CString::new(format!("/tmp/fabric-peer-bus-{}", std::process::id())).unwrap();
    // SAFETY: a valid path; the descriptor is ours.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            0o600,
        );
        assert!(fd >= 0, "open");
        libc::unlink(path.as_ptr());
        assert_eq!(libc::ftruncate(fd, 8192), 0, "ftruncate");
        fd
    }
}

/// `exit-on-agent`: makes the progress agent's thread call `exit(3)` (from
/// a SIGUSR1 handler run on it), as a library's fatal-signal handler that
/// exits may; the process must end with status 3 and no panic.
pub(super) fn exit_on_agent() -> CmdResult {
    extern "C" fn exit_now(_: libc::c_int) {
        // SAFETY: ends the process, as the command means to.
        unsafe { libc::exit(3) };
    }
    let agent = std::fs::read_dir("/proc/self/task")
        .map_err(|e| e.to_string())?
        .filter_map(|task| task.ok())
        .find(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "unimem-agent")
        })
        .ok_or("no progress agent thread")?;
    let tid: libc::pid_t = agent
        .file_name()
        .to_string_lossy()
        .parse()
        .map_err(|_| "a task that is no number")?;
    // SAFETY: a plain handler for SIGUSR1; tgkill to a thread of ours.
    unsafe {
        libc::signal(libc::SIGUSR1, exit_now as *const () as libc::sighandler_t);
        libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR1);
    }
    std::thread::sleep(Duration::from_secs(5));
    Err("still alive 5 s after the agent's exit".into())
}
