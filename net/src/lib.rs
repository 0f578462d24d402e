//! The network backend: Unimem nodes on other hosts.
//!
//! A Unimem system spans many hosts; the shared-memory emulation reaches
//! only the processes of one. This backend reaches the others through an
//! existing libfabric provider (`net_provider`, `tcp` by default), opened
//! through the libfabric core that loaded us, as libfabric's own utility
//! providers layer over its core providers:
//!
//! - `transport`: that provider's endpoint, called through its operation
//!   tables;
//! - `packet`: what processes say to each other over it, checked in full;
//! - `nic`: the process's one interface (endpoint, peers, liveness, its
//!   thread);
//! - `mailbox`, `dma`: the hardware interfaces the protocol runs on
//!   ([`NodeMailbox`], [`NodeDma`]), each the emulation's for nodes of this
//!   host and the interface's for nodes of other hosts. The protocol does
//!   not know which it talks to.
//!
//! Which is which: a node of another host has a network address in its id
//! (`NodeId::nic`), which its addresses carry (`…@<ip>:<port>`); an address
//! of this host's interface is taken without it ([`canonical`]), so that
//! every process of a host names its neighbours the same way.

mod dma;
mod mailbox;
mod nic;
mod packet;
mod transport;

pub use dma::NodeDma;
pub use mailbox::NodeMailbox;
pub use nic::{Nic, IDLE_TICK};

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use unimem_dma::DmaRegion;
use unimem_mailbox::MailboxAddr;

/// The provider's tunables this backend reads (`net_provider`, `net_iface`,
/// `net_timeout_ms`, `net_write_max`: fi_unimem(7) says what each means),
/// borrowed from the provider's configuration: building one allocates
/// nothing, and every AV insert asks ([`canonical`]).
#[derive(Clone, Copy, Debug)]
pub struct Settings<'a> {
    pub provider: &'a str,
    pub iface: &'a str,
    pub timeout_ms: usize,
    pub write_max: usize,
}

/// The process's interface, once opened (`None` inside: opening failed or
/// the backend is off; not tried again).
static NIC: Mutex<Option<Option<Arc<Nic>>>> = Mutex::new(None);
/// Why the interface did not open, if it failed.
static OFF_BECAUSE: Mutex<Option<String>> = Mutex::new(None);

/// Says, once per process, that a peer of another host cannot be reached
/// and why.
pub(crate) fn warn_unreachable(peer: &MailboxAddr) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let why = OFF_BECAUSE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| "not opened".into());
    tracing::warn!(
        "{peer} is on another host, and this process has no network interface ({why}); with libfabric 1.x, also set FI_PROVIDER=unimem,tcp"
    );
}

/// The process's network interface, opened on first call if the backend is
/// on (`net_provider`). A failure to open it is a warning, once: the
/// process then reaches this host only.
pub fn interface(cfg: &Settings, region: &Arc<DmaRegion>) -> Option<Arc<Nic>> {
    let mut slot = NIC.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(nic)) = slot.as_ref() {
        if !nic.is_own() {
            // A forked child: its parent's interface is not its own.
            *slot = None;
        }
    }
    if let Some(opened) = slot.as_ref() {
        return opened.clone();
    }
    let opened = open(cfg, region);
    *slot = Some(opened.clone());
    opened
}

/// The process's interface if it is open (no attempt to open it).
pub fn current() -> Option<Arc<Nic>> {
    let slot = NIC.lock().unwrap_or_else(|e| e.into_inner());
    slot.as_ref()
        .and_then(|opened| opened.clone())
        .filter(|nic| nic.is_own())
}

/// Why the network backend stays off (see [`chosen_transport`]).
enum Off {
    /// `FI_UNIMEM_NET_PROVIDER=off` (or empty).
    Setting,
    /// `auto`, and the launcher says every process is on this host.
    OneHost(&'static str),
}

impl std::fmt::Display for Off {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Off::Setting => write!(f, "FI_UNIMEM_NET_PROVIDER=off"),
            Off::OneHost(why) => write!(
                f,
                "the launcher put every process of the job on this host ({why}); \
                 FI_UNIMEM_NET_PROVIDER=tcp opens it anyway"
            ),
        }
    }
}

/// The transport `net_provider` asks for, or why the backend stays off:
/// `off` (or empty), `auto` (`tcp`, unless the launcher put every process
/// of the job on this host), or a provider name (always). Allocates
/// nothing: every AV insert asks (`canonical`).
fn chosen_transport<'a>(cfg: &Settings<'a>) -> Result<&'a str, Off> {
    match cfg.provider {
        "" | "off" => Err(Off::Setting),
        "auto" => match one_host_job() {
            Some(why) => Err(Off::OneHost(why)),
            None => Ok("tcp"),
        },
        name => Ok(name),
    }
}

/// What the launcher says that puts every process of the job on this
/// host, if it says so: Open MPI's and Hydra's (MPICH, Intel MPI) local
/// and world sizes, or Slurm's node count. Read once: launchers set them
/// before the process starts.
fn one_host_job() -> Option<&'static str> {
    static ANSWER: OnceLock<Option<String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            let num = |name: &str| std::env::var(name).ok()?.trim().parse::<u64>().ok();
            for (local, world) in [
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"),
                ("MPI_LOCALNRANKS", "PMI_SIZE"),
            ] {
                if let (Some(l), Some(w)) = (num(local), num(world)) {
                    return (l == w).then(|| format!("{local} = {world} = {w}"));
                }
            }
            ["SLURM_STEP_NUM_NODES", "SLURM_NNODES"]
                .into_iter()
                .find_map(|name| num(name).map(|n| (name, n)))
                .and_then(|(name, n)| (n == 1).then(|| format!("{name} = 1")))
        })
        .as_deref()
}

fn open(cfg: &Settings, region: &Arc<DmaRegion>) -> Option<Arc<Nic>> {
    let transport = match chosen_transport(cfg) {
        Ok(transport) => transport,
        Err(why) => {
            tracing::info!(
                "network backend not opened: {why}; peers on other hosts are unreachable"
            );
            *OFF_BECAUSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
            return None;
        }
    };
    let Some(ip) = host_ip(cfg) else {
        tracing::warn!(
            "net_iface {:?}: no such IPv4 address or interface; peers on other hosts are unreachable",
            cfg.iface
        );
        return None;
    };
    let timeout = Duration::from_millis(cfg.timeout_ms as u64);
    match Nic::open(transport, ip, Arc::clone(region), timeout, cfg.write_max) {
        Ok(nic) => {
            tracing::info!(
                "network backend: {} at {} (peers silent for {} ms are dead; puts up to {} bytes go in packets)",
                nic.provider,
                nic.name,
                cfg.timeout_ms,
                nic.write_max
            );
            Some(nic)
        }
        Err(e) => {
            // Said at info level: a job on one host needs no network (and
            // libfabric 1.x hides tcp from its rxm layer under
            // FI_PROVIDER=unimem). A peer of another host is a warning
            // when one is asked for (`NodeMailbox::connect`).
            tracing::info!("network backend off ({e}); peers on other hosts are unreachable");
            *OFF_BECAUSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            None
        }
    }
}

/// Stops the interface's thread (the provider is about to be unloaded).
pub fn shutdown() {
    let mut slot = NIC.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(nic)) = slot.take() {
        nic.stop();
        // The transport's objects belong to a core that is going away:
        // leaked, not closed behind its back.
        std::mem::forget(nic);
    }
}

/// This host's address for the backend: `net_iface` (an address or an
/// interface name), else the first up, non-loopback IPv4 interface, else
/// loopback.
fn host_ip(cfg: &Settings) -> Option<[u8; 4]> {
    static AUTO: OnceLock<[u8; 4]> = OnceLock::new();
    let wanted = cfg.iface.trim();
    if let Ok(ip) = wanted.parse::<Ipv4Addr>() {
        return Some(ip.octets());
    }
    let interfaces = ipv4_interfaces();
    if wanted.is_empty() {
        return Some(*AUTO.get_or_init(|| {
            interfaces
                .iter()
                .find(|(_, ip, up)| *up && !Ipv4Addr::from(*ip).is_loopback())
                .map_or([127, 0, 0, 1], |(_, ip, _)| *ip)
        }));
    }
    interfaces
        .iter()
        .find(|(name, _, _)| name == wanted)
        .map(|(_, ip, _)| *ip)
}

/// Every IPv4 interface: name, address, whether it is up.
fn ipv4_interfaces() -> Vec<(String, [u8; 4], bool)> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills in a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return out;
    }
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs made; its name is a C
        // string and its address, when non-null, a sockaddr of its family.
        unsafe {
            let entry = &*at;
            if !entry.ifa_addr.is_null() && (*entry.ifa_addr).sa_family == libc::AF_INET as u16 {
                let addr = &*entry.ifa_addr.cast::<libc::sockaddr_in>();
                let name = std::ffi::CStr::from_ptr(entry.ifa_name)
                    .to_string_lossy()
                    .into_owned();
                let up = entry.ifa_flags & libc::IFF_UP as u32 != 0;
                out.push((name, addr.sin_addr.s_addr.to_ne_bytes(), up));
            }
            at = entry.ifa_next;
        }
    }
    // SAFETY: the list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// `addr` as this host names it: an address of a node behind this host's
/// own interface address is a node of this host (reached through shared
/// memory), and loses its network address.
pub fn canonical(addr: MailboxAddr, cfg: &Settings) -> MailboxAddr {
    let Some(nic) = addr.node.nic else {
        return addr;
    };
    if chosen_transport(cfg).is_err() || host_ip(cfg) == Some(nic.ip) {
        return MailboxAddr {
            node: addr.node.local(),
            ..addr
        };
    }
    addr
}
