//! Test hosts: network namespaces with a `/dev/shm` and hostname of their
//! own on one bridge (`scripts/testhosts`), for the tests whose peers run
//! on different hosts. Made on first use by a test, removed by
//! `scripts/test` when the run ends (`scripts/testhosts down`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// How many test hosts the tests use at most.
pub const HOSTS: usize = 3;

/// `scripts/testhosts` of this checkout.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/testhosts")
}

fn exists(host: &str) -> bool {
    Path::new("/run/netns").join(host).exists()
        && Path::new("/run/unimem-testhosts")
            .join(host)
            .join("mnt")
            .exists()
}

/// Held by a test that uses the test hosts: it runs alone in the test
/// binary ([`solo::alone`](crate::solo::alone); fabric and MPI tests
/// alike), as a test may cut a host's link and time how soon that is
/// noticed, and each checks what its processes left in the hosts'
/// `/dev/shm`.
pub fn exclusive() -> crate::solo::Alone {
    crate::solo::alone()
}

/// The names of the test hosts (`uh1`..), made if they are not there yet.
/// They need root (CI runs as root).
pub fn ensure() -> Vec<String> {
    static MADE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let names: Vec<String> = (1..=HOSTS).map(|i| format!("uh{i}")).collect();
    if !names.iter().all(|h| exists(h)) {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "the tests across hosts make network namespaces: run them as root"
        );
        let out = Command::new(script())
            .args(["up", &HOSTS.to_string()])
            .output()
            .expect("run scripts/testhosts");
        assert!(
            out.status.success(),
            "scripts/testhosts up {HOSTS}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    names
}

/// The address of test host `host` (`uh<i>` is 198.18.0.<10+i>).
pub fn address(host: &str) -> String {
    let i: u32 = host
        .strip_prefix("uh")
        .and_then(|n| n.parse().ok())
        .expect("a test host name");
    format!("198.18.0.{}", 10 + i)
}

/// Runs `cmd` in test host `host`; its stdout.
pub fn run_in(host: &str, cmd: &[&str]) -> String {
    let out = Command::new(script())
        .args(["exec", host])
        .args(cmd)
        .output()
        .expect("run scripts/testhosts exec");
    assert!(
        out.status.success(),
        "{host}: {cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names in test host `host`'s `/dev/shm`.
pub fn shm_objects(host: &str) -> Vec<String> {
    run_in(host, &["ls", "-A", "/dev/shm"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// Cuts test host `host`'s link to the bridge (its processes live on,
/// unreachable) until the returned guard goes, whatever happens meanwhile.
pub fn cut_off(host: &str) -> LinkCut {
    set_link(host, false);
    LinkCut {
        host: host.to_string(),
    }
}

/// A test host cut off; dropping it restores the link.
pub struct LinkCut {
    host: String,
}

impl Drop for LinkCut {
    fn drop(&mut self) {
        set_link(&self.host, true);
        // Addresses found unreachable while the link was down stay so for
        // a while (failed neighbour entries): forget them on both sides.
        for args in [
            vec!["-n", self.host.as_str(), "neigh", "flush", "all"],
            vec!["neigh", "flush", "dev", "unibr0"],
        ] {
            let _ = Command::new("ip").args(&args).status();
        }
        // Both ends must be up again before the next job starts: a Hydra
        // proxy that starts while they are not cannot reach mpiexec.
        let up = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("state UP"))
        };
        let veth = format!("{}-veth", self.host);
        for _ in 0..100 {
            if up(&["-o", "link", "show", &veth])
                && up(&["-n", &self.host, "-o", "link", "show", "uheth0"])
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

fn set_link(host: &str, up: bool) {
    let status = Command::new("ip")
        .args([
            "link",
            "set",
            &format!("{host}-veth"),
            if up { "up" } else { "down" },
        ])
        .status()
        .expect("run ip");
    assert!(status.success(), "ip link set {host}-veth");
}
