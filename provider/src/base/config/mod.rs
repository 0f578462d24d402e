//! Provider tunables.
//!
//! One table (the `tunables!` invocation below) lists every tunable with its
//! type, default and one-line help; adding a tunable is adding one line.
//! Each is also a libfabric parameter (so `fi_info -e` lists it and
//! `FI_UNIMEM_<NAME>` sets it).
//!
//! Effective value, lowest to highest precedence:
//! 1. the built-in default;
//! 2. the configuration file: `$FI_UNIMEM_CONF` if set, else `fi_info.conf`
//!    next to the loaded libunimem-fi.so;
//! 3. the environment, read through `fi_param_get` (or `std::env` when no
//!    libfabric core is around, e.g. in unit tests).
//!
//! A bad value is reported with FI_WARN and ignored, so the value of the
//! layer below stays. All values use the same syntax in the file and the
//! environment (which is why every parameter is registered as a libfabric
//! *string*: libfabric's own int/size parsing is `strtol` with no error
//! check and no `k/m/g` suffixes).
//!
//! The configuration is read once, when the core first calls us (after
//! registration, so warnings obey `FI_LOG_PROV`), and dropped at `cleanup`;
//! fabrics and domains keep the snapshot they were opened with.
//!
//! Here: the table, the layering and the loaded configuration; the syntax
//! of values and of the file is in `parse.rs`, the libfabric parameters
//! and the file's path in `params.rs`.

mod params;
mod parse;

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use params::{conf_path, param_text};
pub use params::{define_params, env_name};
pub use parse::{parse_file, parse_size, show_size, FileEntry};
use parse::{show, GIB, KIB, MIB, TIB};

/// File name looked up next to the loaded library.
pub const CONF_FILE_NAME: &str = "fi_info.conf";
/// libfabric parameter (env `FI_UNIMEM_CONF`) naming the configuration file.
pub const CONF_PARAM: &str = "conf";

/// The type of a tunable, with its accepted range.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// `true/false`, `1/0`, `yes/no`, `on/off`.
    Bool,
    /// Decimal integer in `min..=max`.
    Int { min: i64, max: i64 },
    /// Byte count in `min..=max`; suffixes `k`, `m`, `g`, `t` (KiB, MiB, ...).
    Size { min: u64, max: u64 },
    /// A name: 1 to 64 characters from `[A-Za-z0-9._-]` (used in
    /// shared-memory object names and addresses).
    Str,
    /// A name that may be empty (nothing chosen), of up to 64 characters
    /// from `[A-Za-z0-9._;-]` (`;` joins layered libfabric providers).
    OptName,
    /// One of the listed words.
    Enum(&'static [&'static str]),
}

/// One row of the table.
#[derive(Debug)]
pub struct Tunable {
    pub name: &'static str,
    pub kind: Kind,
    /// In the file/environment syntax, e.g. `"64m"`.
    pub default: &'static str,
    pub help: &'static str,
}

/// A parsed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Size(u64),
    Str(String),
    Enum(&'static str),
}

/// Conversion from a parsed [`Value`] to a `Config` field type. The table's
/// kinds and field types must agree; a unit test builds the defaults.
pub trait FromValue: Sized {
    fn from_value(v: &Value) -> Self;
}

impl FromValue for bool {
    fn from_value(v: &Value) -> Self {
        match v {
            Value::Bool(b) => *b,
            other => panic!("tunable type mismatch: bool from {other:?}"),
        }
    }
}

impl FromValue for usize {
    fn from_value(v: &Value) -> Self {
        match v {
            // Ranges in the table keep these within usize.
            Value::Int(i) => usize::try_from(*i).expect("range-checked int"),
            Value::Size(s) => usize::try_from(*s).expect("range-checked size"),
            other => panic!("tunable type mismatch: usize from {other:?}"),
        }
    }
}

impl FromValue for String {
    fn from_value(v: &Value) -> Self {
        match v {
            Value::Str(s) => s.clone(),
            Value::Enum(s) => (*s).to_owned(),
            other => panic!("tunable type mismatch: String from {other:?}"),
        }
    }
}

impl FromValue for &'static str {
    fn from_value(v: &Value) -> Self {
        match v {
            Value::Enum(s) => s,
            other => panic!("tunable type mismatch: enum from {other:?}"),
        }
    }
}

macro_rules! tunables {
    ($($name:ident: $ty:ty = $kind:expr, $default:literal, $help:literal;)+) => {
        /// Effective configuration (one field per tunable).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct Config {
            $(#[doc = $help] pub $name: $ty,)+
        }

        /// Every tunable, in declaration order.
        pub static TUNABLES: &[Tunable] = &[
            $(Tunable { name: stringify!($name), kind: $kind, default: $default, help: $help },)+
        ];

        impl Config {
            /// `values[i]` belongs to `TUNABLES[i]`.
            fn from_values(values: &[Value]) -> Self {
                let mut it = values.iter();
                Config {
                    $($name: FromValue::from_value(it.next().expect("one value per tunable")),)+
                }
            }
        }
    };
}

/// Most dmable memory one peer's eager ring may take (eager_size x
/// eager_credits).
const MAX_EAGER_RING: usize = 64 << 20;
/// Most dmable memory one endpoint's own buffers may take.
const MAX_ENDPOINT_BUFFERS: usize = 256 << 20;

tunables! {
    profile: &'static str = Kind::Enum(&["native", "paper"]), "native", "hardware timing profile of the emulation: native (as fast as this host allows) or paper (the prototype board: mailbox 1 us, DMA 1 GB/s + 1 us, registration 10 us)";
    job: String = Kind::Str, "default", "job tag used in shared-memory object names and addresses";
    mbx_depth: usize = Kind::Int { min: 2, max: 1 << 16 }, "1024", "mailbox depth in 192-bit messages";
    dma_segment_size: usize = Kind::Size { min: 64 * KIB, max: GIB }, "64m", "size of one dmable shared-memory segment";
    dma_max_size: usize = Kind::Size { min: 64 * KIB, max: 64 * GIB }, "1g", "bound on a process's dmable memory";
    eager_size: usize = Kind::Size { min: 0, max: MIB }, "16k", "largest message sent eagerly (DMA into pre-allocated receiver buffers); bigger ones use rendezvous; also the inject size";
    eager_credits: usize = Kind::Int { min: 0, max: 255 }, "64", "eager receive buffers a receiver pre-allocates per peer (flow-control credits); 0: none, eager messages come by rendezvous";
    bounce_buffers: usize = Kind::Int { min: 1, max: 4096 }, "64", "eager_size bounce buffers per endpoint: an eager send copies its data into one when it leaves (it has a credit) and frees it when its DMA is done";
    max_msg_size: usize = Kind::Size { min: 0, max: u64::MAX }, "0", "largest message and RMA operation (ep_attr->max_msg_size); 0: every length (the wire carries 64-bit lengths)";
    segment_size: usize = Kind::Size { min: 4 * KIB, max: 8 * MIB }, "256k", "rendezvous fragment: what one DMA of a rendezvous transfer moves";
    rendezvous_window: usize = Kind::Int { min: 1, max: 1024 }, "4", "rendezvous fragments a receiver grants ahead per transfer";
    inline_parts: usize = Kind::Int { min: 1, max: 4 }, "4", "most mailbox messages a message may take that does not fit one (192 bits): one that fits sends them back to back instead of a DMA and its announcement (MPICH's active messages carry a 72-byte header), unless a free eager slot of a process of this host takes its data (native profile); 1: never";
    staging_segments: usize = Kind::Int { min: 1, max: 1024 }, "8", "staging buffers (of segment_size bytes) per endpoint on each side, for rendezvous with ordinary memory";
    regcache_enable: bool = Kind::Bool, "true", "cache remote DMA registrations (one costs > 10 us on the hardware)";
    regcache_max_entries: usize = Kind::Int { min: 1, max: 1 << 20 }, "1024", "most registrations the cache keeps";
    regcache_max_size: usize = Kind::Size { min: 4 * KIB, max: TIB }, "1g", "most registered bytes the cache keeps";
    unexpected_per_peer: usize = Kind::Size { min: 4 * KIB, max: TIB }, "1m", "unexpected message data a receiver holds per sender; past it the sender is throttled (its messages come by rendezvous, data left with it) until receives take the held ones below half";
    tx_size: usize = Kind::Int { min: 1, max: 65535 }, "1024", "transmit queue depth per endpoint (tx_attr->size): sends outstanding at once, queued for a slow peer or in flight; only a full queue refuses a post (-FI_EAGAIN), never a slow peer";
    rx_size: usize = Kind::Int { min: 1, max: 1 << 20 }, "1024", "posted-receive queue depth advertised per endpoint (rx_attr->size); more receives may be posted, they only cost memory";
    cq_size: usize = Kind::Int { min: 1, max: 1 << 20 }, "8192", "completion queue size when fi_cq_open asks for the default (0)";
    spin_yield: usize = Kind::Int { min: 0, max: 1 << 30 }, "64", "busy-poll iterations before yielding the CPU in blocking waits, and in polling reads as idle_yield says";
    wait_spin_us: usize = Kind::Int { min: 0, max: 1_000_000 }, "50", "microseconds a blocking wait (fi_cq_sread, fi_cntr_wait) polls before it sleeps, while this host has a CPU for every unimem process: what comes meanwhile wakes no one (OpenSHMEM sleeps in fi_cntr_wait for each remote write it waits on); 0: spin_yield rounds only";
    idle_yield: &'static str = Kind::Enum(&["auto", "always", "never"]), "auto", "whether fi_cq_read that found nothing spin_yield times in a row yields the CPU: auto (when this host runs more unimem processes than CPUs), always, never";
    async_progress: bool = Kind::Bool, "false", "start the progress agent for every domain, whatever progress the application asked for: a thread per process, asleep until a message comes while the application computes, that completes transfers, credits and target-assisted RMA without the application's calls (domains that ask for FI_PROGRESS_AUTO get it anyway); scripts/mpirun-unimem --async sets it";
    async_copy_min: usize = Kind::Size { min: 0, max: u64::MAX }, "128k", "with the progress agent, one-sided DMA transfers (RMA puts and gets) of at least this many bytes are copied by the engine's own thread while the application computes (as Unimem's DMA engine moves data), not inside the call that submits them; a message's rendezvous is copied by whichever side progresses it; 0: every copy inside its call";
    peer_check_ms: usize = Kind::Int { min: 0, max: 3_600_000 }, "100", "how often (ms) progress checks that known peers are alive; operations with a dead peer fail (0: never)";
    net_provider: String = Kind::OptName, "auto", "libfabric provider that carries traffic to peers on other hosts (tcp, or verbs;ofi_rxm on an RDMA cluster), opened through the running libfabric; auto (the default): tcp, unless the launcher put every process of the job on this host (Open MPI's, Hydra's or Slurm's variables say so); off: this host only";
    net_iface: String = Kind::OptName, "", "IPv4 address or interface name the network backend binds to; empty: the first up, non-loopback IPv4 interface (loopback if there is none)";
    net_timeout_ms: usize = Kind::Int { min: 100, max: 3_600_000 }, "10000", "a peer on another host not heard from for this long (ms) is dead: its operations fail with FI_EHOSTUNREACH (every process says it is alive twice a second)";
    net_write_max: usize = Kind::Size { min: 0, max: 16 * KIB }, "16k", "largest put to another host carried in a write packet, in one transport message with the mailbox messages sent after it (an eager message: one message on the network, not an RMA write and a send); 0: none, every put is the transport's RMA write; the same in every process of a job (receive buffers are sized by it); capped by the transport's in-order limit";
}

impl Config {
    /// The largest message and RMA operation: `max_msg_size`, 0 meaning
    /// every length.
    pub fn message_limit(&self) -> usize {
        match self.max_msg_size {
            0 => usize::MAX,
            limit => limit,
        }
    }
}

impl Config {
    /// The emulation's timing profile (`profile`; validated when parsed).
    pub fn timing_profile(&self) -> unimem_mailbox::Profile {
        self.profile.parse().unwrap_or_default()
    }

    /// Built-in defaults only.
    pub fn defaults() -> Self {
        let values: Vec<Value> = TUNABLES.iter().map(Tunable::default_value).collect();
        Config::from_values(&values)
    }

    /// Defaults, then `file` (path and text, if any), then `env` (a lookup of
    /// the raw environment text by tunable name). Problems are logged.
    pub fn layered(file: Option<(&Path, &str)>, env: impl Fn(&str) -> Option<String>) -> Self {
        let mut values: Vec<Value> = TUNABLES.iter().map(Tunable::default_value).collect();
        let mut origin: Vec<&'static str> = vec!["built-in default"; TUNABLES.len()];

        if let Some((path, text)) = file {
            let (entries, errors) = parse_file(text);
            for (line, msg) in errors {
                tracing::warn!("{}:{line}: {msg}; line ignored", path.display());
            }
            for e in entries {
                let Some(i) = TUNABLES.iter().position(|t| t.name == e.name) else {
                    tracing::warn!(
                        "{}:{}: unknown tunable '{}'; ignored",
                        path.display(),
                        e.line,
                        e.name
                    );
                    continue;
                };
                match TUNABLES[i].parse(&e.value) {
                    Ok(v) => {
                        values[i] = v;
                        origin[i] = "configuration file";
                    }
                    Err(msg) => tracing::warn!(
                        "{}:{}: bad value for {}: {msg}; using the built-in default {}",
                        path.display(),
                        e.line,
                        e.name,
                        TUNABLES[i].default
                    ),
                }
            }
        }

        for (i, t) in TUNABLES.iter().enumerate() {
            let Some(text) = env(t.name) else { continue };
            match t.parse(&text) {
                Ok(v) => {
                    values[i] = v;
                    origin[i] = "environment";
                }
                Err(msg) => tracing::warn!(
                    "{}={text}: {msg}; keeping the value from the {} ({})",
                    env_name(t.name),
                    origin[i],
                    show(&values[i])
                ),
            }
        }

        for (i, t) in TUNABLES.iter().enumerate() {
            tracing::debug!("{} = {} ({})", t.name, show(&values[i]), origin[i]);
        }
        let mut cfg = Config::from_values(&values);
        cfg.reconcile();
        cfg
    }

    /// Cross-tunable rules.
    fn reconcile(&mut self) {
        let defaults = Config::defaults();
        // What one peer's eager ring takes of our dmable memory: the ranges
        // alone allow 255 MiB, which no region holds for many peers.
        let eager_ring = self.eager_size.saturating_mul(self.eager_credits);
        if eager_ring > MAX_EAGER_RING {
            tracing::warn!(
                "eager_size ({}) x eager_credits ({}) = {eager_ring} bytes per peer exceeds {}: \
                 using the defaults ({} x {})",
                self.eager_size,
                self.eager_credits,
                show_size(MAX_EAGER_RING as u64),
                defaults.eager_size,
                defaults.eager_credits
            );
            self.eager_size = defaults.eager_size;
            self.eager_credits = defaults.eager_credits;
        }
        // An endpoint's own buffers: bounce buffers and staging on both sides.
        let endpoint = self
            .eager_size
            .saturating_mul(self.bounce_buffers)
            .saturating_add(
                self.segment_size
                    .saturating_mul(self.staging_segments)
                    .saturating_mul(2),
            );
        if endpoint > MAX_ENDPOINT_BUFFERS {
            tracing::warn!(
                "eager_size x bounce_buffers + 2 x segment_size x staging_segments = {endpoint} \
                 bytes per endpoint exceeds {}: using the defaults of bounce_buffers ({}), \
                 segment_size ({}) and staging_segments ({})",
                show_size(MAX_ENDPOINT_BUFFERS as u64),
                defaults.bounce_buffers,
                defaults.segment_size,
                defaults.staging_segments
            );
            self.bounce_buffers = defaults.bounce_buffers;
            self.segment_size = defaults.segment_size;
            self.staging_segments = defaults.staging_segments;
        }
        if self.dma_max_size < self.dma_segment_size {
            tracing::warn!(
                "dma_max_size ({}) is below dma_segment_size ({}); raising it to one segment",
                self.dma_max_size,
                self.dma_segment_size
            );
            self.dma_max_size = self.dma_segment_size;
        }
    }
}

/// Read file + environment (see the module comment).
pub fn load() -> Config {
    let file = conf_path().and_then(|path| match std::fs::read_to_string(&path) {
        Ok(text) => {
            tracing::info!("configuration file: {}", path.display());
            Some((path, text))
        }
        Err(e) => {
            tracing::warn!(
                "cannot read configuration file {}: {e}; using built-in defaults",
                path.display()
            );
            None
        }
    });
    Config::layered(
        file.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
        param_text,
    )
}

static CURRENT: Mutex<Option<Arc<Config>>> = Mutex::new(None);

/// The configuration, loaded on first use.
pub fn get() -> Arc<Config> {
    let mut cur = CURRENT.lock();
    cur.get_or_insert_with(|| Arc::new(load())).clone()
}

/// Forget the configuration (at `cleanup`; a re-load reads it again).
pub fn reset() {
    *CURRENT.lock() = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_build() {
        let c = Config::defaults();
        assert_eq!(c.profile, "native");
        assert_eq!(c.job, "default");
        assert_eq!(c.mbx_depth, 1024);
        assert_eq!(c.dma_segment_size, 64 << 20);
        assert_eq!(c.dma_max_size, 1 << 30);
        assert_eq!(c.eager_size, 16 << 10);
        assert_eq!(c.eager_credits, 64);
        assert_eq!(c.segment_size, 256 << 10);
        assert!(c.regcache_enable);
        assert_eq!(c.regcache_max_entries, 1024);
        assert_eq!(c.regcache_max_size, 1 << 30);
        assert_eq!((c.tx_size, c.rx_size, c.cq_size), (1024, 1024, 8192));
        assert_eq!(c.spin_yield, 64);
        assert_eq!(c.peer_check_ms, 100);
        assert_eq!(c.idle_yield, "auto");
    }

    #[test]
    fn names_are_unique_and_env_friendly() {
        for (i, t) in TUNABLES.iter().enumerate() {
            assert!(t
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            assert!(
                TUNABLES[i + 1..].iter().all(|o| o.name != t.name),
                "duplicate {}",
                t.name
            );
            assert!(!t.help.is_empty());
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("16k"), Some(16 << 10));
        assert_eq!(parse_size("16K"), Some(16 << 10));
        assert_eq!(parse_size("64m"), Some(64 << 20));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("1 GB"), Some(1 << 30));
        assert_eq!(parse_size("12b"), Some(12));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("m"), None);
        assert_eq!(parse_size("12x"), None);
        assert_eq!(parse_size("12ib"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999t"), None);
        assert_eq!(parse_size("99999999t"), None); // overflow
    }

    fn tunable(name: &str) -> &'static Tunable {
        TUNABLES.iter().find(|t| t.name == name).unwrap()
    }

    #[test]
    fn typed_parsing_and_ranges() {
        assert_eq!(
            tunable("regcache_enable").parse("off"),
            Ok(Value::Bool(false))
        );
        assert_eq!(
            tunable("regcache_enable").parse("YES"),
            Ok(Value::Bool(true))
        );
        assert!(tunable("regcache_enable").parse("maybe").is_err());
        assert_eq!(tunable("mbx_depth").parse(" 64 "), Ok(Value::Int(64)));
        assert!(tunable("mbx_depth").parse("0").is_err());
        assert!(tunable("mbx_depth").parse("1k").is_err());
        assert_eq!(tunable("profile").parse("Paper"), Ok(Value::Enum("paper")));
        assert!(tunable("profile").parse("fast").is_err());
        assert!(tunable("job").parse("a/b").is_err());
        assert!(tunable("job").parse("").is_err());
        assert_eq!(
            tunable("job").parse("run-1.x_2"),
            Ok(Value::Str("run-1.x_2".into()))
        );
        assert!(tunable("dma_segment_size").parse("1").is_err());
    }

    #[test]
    fn file_syntax() {
        let text =
            "# comment\n\nprofile = paper\n  job=\"j1\"  # trailing\n# mbx_depth = 8\nbogus line\n";
        let (entries, errors) = parse_file(text);
        let got: Vec<(usize, &str, &str)> = entries
            .iter()
            .map(|e| (e.line, e.name.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(got, [(3, "profile", "paper"), (4, "job", "j1")]);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, 6);
    }

    #[test]
    fn layering_env_over_file_over_default() {
        let file = "eager_size = 32k\njob = fromfile\ntx_size = nonsense\nunknown = 1\n";
        let env = |name: &str| match name {
            "job" => Some("fromenv".to_owned()),
            "eager_size" => Some("lots".to_owned()), // bad: keeps the file's 32k
            "rx_size" => Some("77".to_owned()),
            _ => None,
        };
        let c = Config::layered(Some((Path::new("test.conf"), file)), env);
        assert_eq!(c.job, "fromenv");
        assert_eq!(c.eager_size, 32 << 10);
        assert_eq!(c.tx_size, 1024); // bad file value → default
        assert_eq!(c.rx_size, 77);
    }

    /// The region's own limits (which the dmable heap applies to the same
    /// variables) are the tunables' ranges.
    #[test]
    fn dma_ranges_match_the_region() {
        let Kind::Size { min, max } = tunable("dma_segment_size").kind else {
            panic!("dma_segment_size is a size");
        };
        assert_eq!(
            (min as usize, max as usize),
            (unimem_dma::SEGMENT_SIZE_MIN, unimem_dma::SEGMENT_SIZE_MAX)
        );
        let Kind::Size { min, max } = tunable("dma_max_size").kind else {
            panic!("dma_max_size is a size");
        };
        assert_eq!(
            (min as usize, max as usize),
            (unimem_dma::REGION_SIZE_MIN, unimem_dma::REGION_SIZE_MAX)
        );
        let Kind::Int { max, .. } = tunable("mbx_depth").kind else {
            panic!("mbx_depth is an int");
        };
        assert!(max as usize <= unimem_mailbox::MAX_DEPTH);
    }

    #[test]
    fn out_of_range_values_fall_back() {
        for (name, text) in [
            ("dma_segment_size", "1t"),
            ("dma_segment_size", "4k"),
            ("dma_max_size", "1t"),
            ("mbx_depth", "16777216"),
            ("eager_size", "64m"),
            ("cq_size", "16777216"),
        ] {
            assert!(tunable(name).parse(text).is_err(), "{name}={text}");
        }
        let env = |name: &str| (name == "dma_segment_size").then(|| "1t".to_owned());
        assert_eq!(Config::layered(None, env).dma_segment_size, 64 << 20);
        // In range one by one, too much together: both back to defaults.
        let env = |name: &str| match name {
            "eager_size" => Some("1m".to_owned()),
            "eager_credits" => Some("255".to_owned()),
            _ => None,
        };
        let c = Config::layered(None, env);
        assert_eq!((c.eager_size, c.eager_credits), (16 << 10, 64));
        let env = |name: &str| match name {
            "segment_size" => Some("64m".to_owned()),
            "staging_segments" => Some("1024".to_owned()),
            _ => None,
        };
        let c = Config::layered(None, env);
        assert_eq!((c.segment_size, c.staging_segments), (256 << 10, 8));
        assert_eq!(show_size(64 << 20), "64m");
        assert_eq!(show_size(4097), "4097");
    }

    #[test]
    fn reconcile_raises_dma_max() {
        let env = |name: &str| (name == "dma_max_size").then(|| "4m".to_owned());
        let c = Config::layered(None, env);
        assert_eq!(c.dma_max_size, c.dma_segment_size);
    }

    /// fi_info.conf at the repository top level must list exactly the
    /// tunables of the table, with the table's defaults. Entries may be
    /// active (`name = value`) or commented out (`# name = value`).
    #[test]
    fn shipped_fi_info_conf_matches_table() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(CONF_FILE_NAME);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut found: Vec<(String, String)> = Vec::new();
        for raw in text.lines() {
            let uncommented = raw.trim_start().trim_start_matches('#');
            let (entries, _) = parse_file(uncommented);
            // A commented-out entry is `# name = value` with a tunable name;
            // prose in help lines never has that exact shape for a known name.
            for e in entries {
                let active = !raw.trim_start().starts_with('#');
                if active || TUNABLES.iter().any(|t| t.name == e.name) {
                    found.push((e.name, e.value));
                }
            }
        }
        for t in TUNABLES {
            let listed: Vec<&(String, String)> =
                found.iter().filter(|(n, _)| n == t.name).collect();
            assert_eq!(
                listed.len(),
                1,
                "{} must be listed exactly once in {}",
                t.name,
                path.display()
            );
            assert_eq!(
                t.parse(&listed[0].1),
                Ok(t.default_value()),
                "{}: {} in the file, {} in the table",
                t.name,
                listed[0].1,
                t.default
            );
        }
        for (name, _) in &found {
            assert!(
                TUNABLES.iter().any(|t| t.name == name),
                "{name} in {} is not a tunable",
                path.display()
            );
        }
        // Every range is documented, as `fi_info -e` shows it.
        for t in TUNABLES {
            if let Some(range) = t.range_text() {
                assert!(
                    text.contains(&format!("({range})")),
                    "{}: '({range})' is not in {}",
                    t.name,
                    path.display()
                );
            }
        }
    }
}
