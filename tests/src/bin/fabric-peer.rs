//! `fabric-peer`: one libfabric application on the unimem provider, driven
//! over stdin/stdout by the fabric tests (`tests/tests/integration/fabric/`, through
//! `unimem_tests::cluster`). The provider is loaded by the real libfabric
//! core from `FI_PROVIDER_PATH`; everything else comes from the environment.
//!
//! At start it opens, through `fi_getinfo` (hints: `FI_MSG | FI_TAGGED |
//! FI_SOURCE | FI_DIRECTED_RECV | FI_MULTI_RECV | FI_RMA | FI_ATOMIC`, and
//! `FI_RMA_EVENT` with `$FABRIC_PEER_RMA_EVENT=1`; `FI_EP_RDM`,
//! provider `unimem`), a fabric, a domain, an `FI_AV_TABLE` AV, a CQ of the
//! tagged format and an endpoint bound to both, enables it and prints
//! `addr <fi_getname>`. `$FABRIC_PEER_PROGRESS=auto` asks for
//! `FI_PROGRESS_AUTO` (data and control), `$FABRIC_PEER_THREADING=domain|safe`
//! `FI_THREAD_DOMAIN` or `FI_THREAD_SAFE`. `$FABRIC_PEER_TX_OP_FLAGS` (named as for `send`'s
//! `flags`) asks for those `tx_attr.op_flags`, the endpoint's default send
//! flags. With `$FABRIC_PEER_CNTR=1` it also opens two counters, bound to
//! the endpoint with `FI_WRITE` and `FI_READ` (see `cntr`; with
//! `$FABRIC_PEER_CNTR=msg`, with `FI_SEND` and `FI_RECV`, named `send` and
//! `recv` by `cntr`); with
//! `$FABRIC_PEER_RMA_EVENT=1`, two more bound with `FI_REMOTE_WRITE` and
//! `FI_REMOTE_READ` (see `rcntr`); `$FABRIC_PEER_RMA_EVENT=mr` asks for
//! `FI_RMA_EVENT` without them (counters on regions only, `mr-cntr`).
//!
//! Then it runs one command per input line. A command answers with data
//! lines (completions, as `unimem_tests::cluster::Completion`), then
//! `ok [result]` or `fail <why>`. Between commands it keeps reading the CQ
//! (manual progress: peers may need it) and queues what completes, for
//! `wait`. End of input closes every object (each `fi_close` must succeed),
//! prints `closed` and exits.
//!
//! | command | does |
//! |---|---|
//! | `insert <addr>` | `fi_av_insert`; `ok <fi_addr>` |
//! | `send <dest> <len> <seed> <ctx> [tag=T] [data=D] [flags=a\|b]` | posts `len` bytes of pattern `seed` (`fi_send`/`fi_senddata`/`fi_tsend`/`fi_tsenddata`; with `flags`, `fi_sendmsg`/`fi_tsendmsg` with those: `completion`, `inject`, `inject-complete`, `transmit-complete`, `match-complete`, `delivery-complete`, `commit-complete`), retrying `-FI_EAGAIN` while progressing |
//! | `recv <src\|any> <len> <ctx> [tag=T [ignore=I]]` | posts a receive (`fi_recv`/`fi_trecv`) into a fresh buffer followed by guard bytes |
//! | `try-recv <src\|any> <len> <ctx> [tag=T [ignore=I]]` | one raw receive call; `ok <rc>` |
//! | `multi-recv <src\|any> <len> <ctx>` | `fi_recvmsg(FI_MULTI_RECV)` |
//! | `min-multi <n>` | `fi_setopt(FI_OPT_MIN_MULTI_RECV)`; `ok <fi_getopt's value>` |
//! | `cancel <ctx>` | `fi_cancel`; `ok <rc>` |
//! | `progress` | reads the CQ a few times |
//! | `wait [sends=N] [recvs=N] [errors=N] [writes=N] [reads=N] [remote=N] [within=ms]` | prints that many queued completions of each kind, waiting for them (at most `ms`, default `$FABRIC_PEER_WAIT`); an error completion nobody waits for fails it |
//! | `quiet <ms>` | progresses for `ms`; fails if anything completes |
//! | `pending` | `ok sends=S recvs=R errors=E writes=W reads=R remote=C`: completions queued and not yet taken by `wait` |
//! | `inject <dest> <len> <seed> [tag=T] [data=D]` | injects `len` bytes of pattern `seed`, retrying `-FI_EAGAIN` while progressing |
//! | `try-send <dest> <len> [buf=N] [seed=S] [ctx=C] [tag=T] [data=D] [inject\|flags=a\|b]` | one raw send or inject call (no retry, no progress), from a buffer of `N` bytes (default `len`) of pattern `S` (default 7), freed right after an inject; with `flags`, `fi_sendmsg`/`fi_tsendmsg` as for `send`; `ok <rc>` |
//! | `bad-send <dest>` | sends the provider must refuse unread: `fi_send` of a NULL buffer of 100 bytes, `fi_sendv` of iov lengths that wrap past 2^64, `fi_sendv` with a NULL `iov_base` of 5 bytes; `ok null=<rc> wrap=<rc> null-iov=<rc>` |
//! | `limits` | `ok inject=<inject_size> max=<max_msg_size>` of the endpoint's `fi_info` |
//! | `getinfo [caps=a\|b] [ep=msg\|rdm\|dgram] [tx-flags=a\|b]` | `fi_getinfo` with those hints (`tx-flags`: `tx_attr.op_flags`, named as for `send`); `ok <rc>` |
//! | `close-domain` | `fi_close` on the domain, which is still in use; `ok <rc>` |
//! | `disabled-ep` | opens a second endpoint, posts on it before binding and bound but not enabled, closes it; `ok send=.. recv=.. ...` |
//! | `mr <key> <len> [access=read\|write\|rw\|none] [seed=S]` | `fi_mr_reg` (remote access as `access`, default `rw`; `requested_key` `key`) of a fresh region of `len` bytes between guard bytes, filled with the pattern of `S` (default zeros); `ok <rc>`; the region stays until `unreg` or the end |
//! | `unreg <key>` | `fi_close` of the region registered as `key`; `ok <rc>` |
//! | `fill-mr <key> <seed\|zero>` | fills the region with the pattern of `seed` (or zeros) |
//! | `check-mr <key> <offset> <len> <seed\|zero> [at=A]` | fails unless the region's `len` bytes at `offset` are bytes `A..A+len` (default `A` = 0) of the pattern of `seed` (or zeros) and its guard bytes are intact |
//! | `mr-sum <key> [<offset> <len>]` | `ok sum=<checksum> guard=<0\|1>`: the checksum of the region's bytes (all, or `len` at `offset`), and whether its guard bytes are intact |
//! | `watch <key> <offset> <len>` | from now on, a `remote` completion reports in `sum` the checksum that range of the region had when the completion was read (and in `guard` the region's guards) |
//! | `write <dest> <key> <offset> <len> <seed> <ctx> [data=D] [inject] [msg[=a\|b]] [rma-iovs=N] [v] [try]` | an RMA write of `len` bytes of pattern `seed` to `offset` of the region `key` at `dest`: `fi_write` (`fi_writedata` with `data`), `fi_writev` (`v`, three buffers), `fi_writemsg` (`msg`, flags named as for `send`, the target range in `N` pieces, default 1), `fi_inject_write`/`fi_inject_writedata` (`inject`), retrying `-FI_EAGAIN` while progressing; with `try`, one call and `ok <rc>` |
//! | `read <src> <key> <offset> <len> <ctx> [msg[=a\|b]] [rma-iovs=N] [v] [try]` | an RMA read (`fi_read`, `fi_readv`, `fi_readmsg`) into a fresh buffer between guard bytes; its completion reports the checksum of the bytes read and whether the guards (for an error: the whole buffer) are untouched |
//! | `cntr` | `ok write=W write-err=E read=R read-err=F`: the counters (`$FABRIC_PEER_CNTR`; `send=..`, `recv=..` with `msg`) |
//! | `cntr-wait [write=W] [read=R] [write-err=E] [read-err=F]` | reads the counters until each is at least the value given; `ok` with the values as `cntr` |
//! | `sleep-no-progress <ms\|wake>` | prints `sleeping`, then makes no libfabric call for `ms` milliseconds, or until the input line `wake`; meanwhile it answers `mr-sum`, `get` and `recv-sum <ctx> <len>` (the checksum of the first `len` bytes of the buffer of receive `ctx`) lines, which make no libfabric call, with a data line (their `ok` text) |
//! | `atomic <dest> <key> <offset> <write\|fetch\|compare> <dt> <op> <count> [ops=a,b,..] [cmp=a,b,..] [ctx=C] [v\|msg[=a\|b]\|inject] [rma-iovs=N] [null-ops] [try] [nowait]` | an atomic of `count` elements of datatype `dt` (`i8`..`u64`, `float`, `double`, `fcomplex`, `dcomplex`, `ldouble`, `ldcomplex`, or a number) and operation `op` (`min`, `max`, `sum`, `prod`, `lor`, `land`, `bor`, `band`, `lxor`, `bxor`, `read`, `write`, `cswap`, `cswap-ne`, `cswap-le`, `cswap-lt`, `cswap-ge`, `cswap-gt`, `mswap`, or a number) at `offset` of region `key` at `dest`: `fi_atomic`/`fi_fetch_atomic`/`fi_compare_atomic`, their `v` and `msg` forms (flags named as for `send`; the target range in `N` entries, default 1), or `fi_inject_atomic`; operand and compare elements are the bits given (one value: every element), with `null-ops` the operand buffers are NULL (for `FI_ATOMIC_READ`, which ignores them); the result buffer starts as guard bytes. Retries `-FI_EAGAIN` while progressing (`try`: one call); then (not for an inject, nor with `nowait`) waits for its completion: `ok rc=R flags=F err=E old=a,b,.. guard=G` (`err` 0 for success; `guard`: nothing written past the result, for an error nothing at all) |
//! | `sread <ms>` | one `fi_cq_sread` with timeout `ms` (the CQ has a wait object with `$FABRIC_PEER_CQ_WAIT=unspec`); `ok rc=R wall_ms=W cpu_ms=C`, `C` the process's CPU time meanwhile |
//! | `cntr-sleep <write\|read> <threshold> <ms>` | one `fi_cntr_wait` on that counter (`$FABRIC_PEER_CNTR=1`; a wait object with `$FABRIC_PEER_CNTR_WAIT=unspec`) with timeout `ms`; `ok rc=R wall_ms=W cpu_ms=C` as `sread` |
//! | `crash <segv\|bus\|bus-sent\|abrt\|fpe\|ill\|term\|int\|quit>` | dies at once of that fatal signal, by a real fault where there is one (see `crash`) |
//! | `exit-on-agent` | has the progress agent's thread call `exit(3)` from a SIGUSR1 handler (`$FABRIC_PEER_PROGRESS=auto`) |
//! | `churn <count> <min> <max>` | allocates `count` blocks of `min` to `max` bytes (written), then frees them all: a program's own small allocations beside a small exposed region; `ok` |
//! | `exhaust-fds <ms>` | opens `/dev/null` until the process is out of file descriptors, progresses for `ms` milliseconds so, then closes them; `ok held=N` |
//! | `atomic-wait <ctx>` | waits for the completion of atomic `ctx` (an inject's error: `0`), answered as `atomic` |
//! | `valid <dt> <op>` | `ok write=rc/count fetch=rc/count compare=rc/count qwrite=rc/count/size qfetch=.. qcompare=..`: the three `*valid` queries and `fi_query_atomic` with flags 0, `FI_FETCH_ATOMIC`, `FI_COMPARE_ATOMIC` |
//! | `get <key> <offset> <dt> <count>` | `ok a,b,..`: the elements of the region (little-endian bits, decimal) |
//! | `set <key> <offset> <dt> <a,b,..>` | stores those elements in the region (plain stores) |
//! | `flag-wait <key> <flag-offset> <value> <offset> <len>` | progresses until the region's u64 at `flag-offset` holds `value`, then at once `ok sum=<checksum> polls=N`: the checksum of `len` bytes at `offset` (what a program that waits for a signal reads) |
//! | `fetch-add-loop <dest> <key> <offset> <n> [window=W] [local]` | `n` `fi_fetch_atomic(FI_UINT64, FI_SUM)` of 1 on the element, `W` (default 4) in flight at once; with `local`, `n` CPU fetch-adds on the process's own region instead (reading the CQ after each, for the peers); `ok tickets=a,b,..`: the old values, in completion order |
//! | `mr-cntr <key> <read\|write\|rw>` | opens a counter and binds it to region `key` (`fi_mr_bind`) with `FI_REMOTE_READ`/`FI_REMOTE_WRITE` |
//! | `rcntr` | `ok remote-write=W remote-read=R mr0=M ..`: the remote counters (`$FABRIC_PEER_RMA_EVENT`) and those of `mr-cntr`, in order |
//! | `rcntr-wait [remote-write=W] [remote-read=R] [mr0=M ..]` | reads them until each is at least the value given; `ok` as `rcntr` |
//! | `traffic rank=R [to=a,b] [from=N] count=C lens=l,m [tagged] [window=W] [hold=ms] [within=ms]` | sends `C` stamped messages to each `to` (retrying `-FI_EAGAIN` while progressing) while receiving `C` from each of `N` senders, checking contents and per-sender order; `ok sent=.. received=.. eagain=..`; with `hold`, once its first sends are posted it makes no libfabric call for `ms` milliseconds (a sender that stalls with its transfers started) |
//!
//! Numbers are decimal or `0x` hexadecimal; `ctx` numbers name operations
//! in completions. A watchdog ends the process after
//! `$FABRIC_PEER_WATCHDOG` seconds (default 150); a command waits at most
//! `$FABRIC_PEER_WAIT` seconds (default 30).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use unimem_fi::base::ffi;
use unimem_tests::cluster::{parse_num, Completion, Kind};
use unimem_tests::fabric::{
    self, rc, Api, AtomicBufs, AtomicFamily, AtomicForm, AtomicTarget, Av, Cntr, Cq, CqEntry,
    CqError, Domain, Ep, Fabric, Hints, Info, Match, Mr, Object, RmaCall, RmaTarget,
    FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};
use unimem_tests::payload;

/// Bytes after every receive buffer that must stay untouched.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xa5;
/// Context bits of the `traffic` command's operations.
const TRAFFIC_SEND: u64 = 1 << 62;
const TRAFFIC_RECV: u64 = 1 << 61;

type CmdResult = Result<String, String>;

fn env_secs(name: &str, default: u64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(secs)
}

/// A registered region: `len` bytes between two guards of `GUARD` bytes,
/// in `mem`.
struct Region {
    key: u64,
    mr: Mr,
    mem: Vec<u8>,
    len: usize,
}

impl Region {
    fn bytes(&self) -> &[u8] {
        &self.mem[GUARD..GUARD + self.len]
    }

    fn guards_intact(&self) -> bool {
        let (before, rest) = self.mem.split_at(GUARD);
        before
            .iter()
            .chain(&rest[self.len..])
            .all(|&b| b == GUARD_BYTE)
    }
}

/// CPU time of the whole process (every thread), in milliseconds.
fn process_cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

/// The counters of `$FABRIC_PEER_CNTR`: completed writes and reads (with
/// `msg`: sends in `write`, receives in `read`).
struct Counters {
    write: Cntr,
    read: Cntr,
}

impl Counters {
    /// `write`, `write-err`, `read`, `read-err`.
    fn values(&self) -> [u64; 4] {
        [
            self.write.read(),
            self.write.read_err(),
            self.read.read(),
            self.read.read_err(),
        ]
    }
}

const CNTR_NAMES: [&str; 4] = ["write", "write-err", "read", "read-err"];
const MSG_CNTR_NAMES: [&str; 4] = ["send", "send-err", "recv", "recv-err"];

/// The libfabric objects of the process, in closing order.
struct Objects {
    ep: Ep,
    /// Registered regions (a key may appear twice should the provider
    /// wrongly accept a duplicate).
    mrs: Vec<Region>,
    cntrs: Option<Counters>,
    /// How `cntr` names the values of `cntrs`.
    cntr_names: [&'static str; 4],
    /// `$FABRIC_PEER_RMA_EVENT`: counters bound with `FI_REMOTE_WRITE` and
    /// `FI_REMOTE_READ` (in `write` and `read`).
    remote_cntrs: Option<Counters>,
    /// Counters of `mr-cntr` (closed after the regions they are bound to).
    mr_cntrs: Vec<Cntr>,
    cq: Cq,
    av: Av,
    /// `None` only while `close-domain` tries to close it.
    domain: Option<Domain>,
    fabric: Fabric,
    info: Info,
}

impl Objects {
    fn open(api: &'static Api) -> Result<Objects, String> {
        let step =
            |what: &str, code: i32| format!("{what}: {code} ({})", api.strerror(code as isize));
        // "mr": FI_RMA_EVENT with counters on regions only (`mr-cntr`).
        let rma_event_var = std::env::var("FABRIC_PEER_RMA_EVENT").unwrap_or_default();
        let rma_event = rma_event_var == "1" || rma_event_var == "mr";
        let mut hints = Hints {
            tx_op_flags: send_flags(&std::env::var("FABRIC_PEER_TX_OP_FLAGS").unwrap_or_default())?,
            ..Hints::default()
        };
        if rma_event {
            hints.caps |= ffi::FI_RMA_EVENT;
        }
        if std::env::var("FABRIC_PEER_PROGRESS").as_deref() == Ok("auto") {
            hints.progress = ffi::FI_PROGRESS_AUTO;
        }
        hints.threading = match std::env::var("FABRIC_PEER_THREADING").as_deref() {
            Ok("domain") => ffi::FI_THREAD_DOMAIN,
            Ok("safe") => ffi::FI_THREAD_SAFE,
            _ => ffi::FI_THREAD_UNSPEC,
        };
        let info = Info::get(api, &hints).map_err(|c| step("fi_getinfo", c))?;
        if info.prov_name() != "unimem" {
            return Err(format!("fi_getinfo gave provider {}", info.prov_name()));
        }
        let fabric = Fabric::open(&info).map_err(|c| step("fi_fabric", c))?;
        let domain = fabric.domain(&info).map_err(|c| step("fi_domain", c))?;
        let av = domain.av().map_err(|c| step("fi_av_open", c))?;
        let cq_wait = match std::env::var("FABRIC_PEER_CQ_WAIT").as_deref() {
            Ok("unspec") => ffi::FI_WAIT_UNSPEC,
            _ => ffi::FI_WAIT_NONE,
        };
        let cq = domain
            .cq_waiting_on(cq_wait)
            .map_err(|c| step("fi_cq_open", c))?;
        let cntr_wait = match std::env::var("FABRIC_PEER_CNTR_WAIT").as_deref() {
            Ok("unspec") => ffi::FI_WAIT_UNSPEC,
            _ => ffi::FI_WAIT_NONE,
        };
        // What the two counters count: as bound, and as `cntr` names them.
        let (cntr_flags, cntr_names) = match std::env::var("FABRIC_PEER_CNTR").as_deref() {
            Ok("1") => (Some((ffi::FI_WRITE, ffi::FI_READ)), CNTR_NAMES),
            Ok("msg") => (Some((ffi::FI_SEND, ffi::FI_RECV)), MSG_CNTR_NAMES),
            _ => (None, CNTR_NAMES),
        };
        let cntrs = match cntr_flags {
            Some(_) => Some(Counters {
                write: domain
                    .cntr_waiting_on(cntr_wait)
                    .map_err(|c| step("fi_cntr_open", c))?,
                read: domain
                    .cntr_waiting_on(cntr_wait)
                    .map_err(|c| step("fi_cntr_open", c))?,
            }),
            None => None,
        };
        let remote_cntrs = match rma_event_var == "1" {
            true => Some(Counters {
                write: domain.cntr().map_err(|c| step("fi_cntr_open", c))?,
                read: domain.cntr().map_err(|c| step("fi_cntr_open", c))?,
            }),
            false => None,
        };
        let ep = domain.endpoint(&info).map_err(|c| step("fi_endpoint", c))?;
        ep.bind(&av, 0).map_err(|c| step("fi_ep_bind(av)", c))?;
        ep.bind(&cq, ffi::FI_TRANSMIT | ffi::FI_RECV)
            .map_err(|c| step("fi_ep_bind(cq)", c))?;
        if let (Some(c), Some((write, read))) = (&cntrs, cntr_flags) {
            ep.bind(&c.write, write)
                .map_err(|c| step("fi_ep_bind(cntr)", c))?;
            ep.bind(&c.read, read)
                .map_err(|c| step("fi_ep_bind(cntr)", c))?;
        }
        if let Some(c) = &remote_cntrs {
            ep.bind(&c.write, ffi::FI_REMOTE_WRITE)
                .map_err(|c| step("fi_ep_bind(cntr, FI_REMOTE_WRITE)", c))?;
            ep.bind(&c.read, ffi::FI_REMOTE_READ)
                .map_err(|c| step("fi_ep_bind(cntr, FI_REMOTE_READ)", c))?;
        }
        ep.enable().map_err(|c| step("fi_enable", c))?;
        Ok(Objects {
            ep,
            mrs: Vec::new(),
            cntrs,
            cntr_names,
            remote_cntrs,
            mr_cntrs: Vec::new(),
            cq,
            av,
            domain: Some(domain),
            fabric,
            info,
        })
    }

    /// Closes everything, children first; each close must succeed.
    fn close(self) -> Result<(), String> {
        let Objects {
            ep,
            mrs,
            cntrs,
            cntr_names: _,
            remote_cntrs,
            mr_cntrs,
            cq,
            av,
            domain,
            fabric,
            info,
        } = self;
        let closed =
            |what: &str, r: Result<(), i32>| r.map_err(|c| format!("fi_close({what}): {c}"));
        closed("ep", ep.close().map_err(|e| e.1))?;
        for region in mrs {
            // The memory outlives its region.
            closed("mr", region.mr.close().map_err(|e| e.1))?;
            drop(region.mem);
        }
        for c in mr_cntrs {
            closed("mr cntr", c.close().map_err(|e| e.1))?;
        }
        for c in [cntrs, remote_cntrs].into_iter().flatten() {
            closed("write cntr", c.write.close().map_err(|e| e.1))?;
            closed("read cntr", c.read.close().map_err(|e| e.1))?;
        }
        closed("cq", cq.close().map_err(|e| e.1))?;
        closed("av", av.close().map_err(|e| e.1))?;
        if let Some(domain) = domain {
            closed("domain", domain.close().map_err(|e| e.1))?;
        }
        closed("fabric", fabric.close().map_err(|e| e.1))?;
        drop(info);
        Ok(())
    }
}

/// The buffers of sends in flight, by context, each kept until its
/// completion (the provider may read it until then). A context may name
/// several sends at once (tests reuse them): its buffers are all kept until
/// as many completions came.
#[derive(Default)]
struct SendBufs(HashMap<u64, (usize, Vec<Vec<u8>>)>);

impl SendBufs {
    fn keep(&mut self, ctx: u64, buf: Vec<u8>) {
        let (pending, bufs) = self.0.entry(ctx).or_default();
        *pending += 1;
        bufs.push(buf);
    }

    /// A send of `ctx` completed (or was refused).
    fn done(&mut self, ctx: u64) {
        if let Some((pending, _)) = self.0.get_mut(&ctx) {
            *pending -= 1;
            if *pending == 0 {
                self.0.remove(&ctx);
            }
        }
    }
}

/// A posted receive buffer: `len` bytes for the provider, then the guard.
struct RecvBuf {
    mem: Vec<u8>,
    len: usize,
    multi: bool,
}

/// The buffer of an RMA read in flight: `len` bytes between two guards of
/// `GUARD` bytes, all `GUARD_BYTE` when posted.
struct ReadBuf {
    mem: Vec<u8>,
    len: usize,
}

/// The buffers of an atomic in flight: the result (`len` bytes, then
/// `GUARD` guard bytes, all `GUARD_BYTE` when posted) and the operands.
struct AtomicBuf {
    result: Vec<u8>,
    len: usize,
    size: usize,
    _operands: (Vec<u8>, Vec<u8>),
}

/// What the `traffic` command hears from the CQ.
enum TrafficEvent {
    Sent,
    Received(CqEntry),
    Failed(CqError),
}

struct Peer {
    api: &'static Api,
    obj: Objects,
    recv_bufs: HashMap<u64, RecvBuf>,
    /// Multi-receive buffers after their release, by context.
    released: Vec<(u64, RecvBuf)>,
    send_bufs: SendBufs,
    sends: VecDeque<Completion>,
    recvs: VecDeque<Completion>,
    errors: VecDeque<Completion>,
    writes: VecDeque<Completion>,
    reads: VecDeque<Completion>,
    remote: VecDeque<Completion>,
    /// The buffers of RMA writes in flight, by context.
    write_bufs: SendBufs,
    /// The buffers of RMA reads in flight, by context.
    read_bufs: HashMap<u64, ReadBuf>,
    /// `watch`: (key, offset, len) of the range a remote completion reports.
    watch: Option<(u64, usize, usize)>,
    /// Atomic completions not yet taken, by context: (flags, err), err 0
    /// for success.
    atomic_done: HashMap<u64, VecDeque<(u64, i32)>>,
    /// The buffers of atomics in flight, by context.
    atomic_bufs: HashMap<u64, AtomicBuf>,
    traffic: Vec<TrafficEvent>,
    wait_limit: Duration,
    commands: Receiver<String>,
}

/// The completion queues of `wait`, in the order it prints them.
const QUEUES: [&str; 6] = ["sends", "recvs", "errors", "writes", "reads", "remote"];

/// A command line: positional words and `key=value` options.
struct Args<'a> {
    pos: Vec<&'a str>,
    opts: HashMap<&'a str, &'a str>,
}

impl<'a> Args<'a> {
    fn parse(words: impl Iterator<Item = &'a str>) -> Args<'a> {
        let mut args = Args {
            pos: Vec::new(),
            opts: HashMap::new(),
        };
        for w in words {
            match w.split_once('=') {
                Some((k, v)) => {
                    args.opts.insert(k, v);
                }
                None => args.pos.push(w),
            }
        }
        args
    }

    fn num(&self, i: usize) -> Result<u64, String> {
        let word = self.pos.get(i).ok_or(format!("argument {i} missing"))?;
        parse_num(word).ok_or(format!("bad number '{word}'"))
    }

    fn addr(&self, i: usize) -> Result<u64, String> {
        match self.pos.get(i) {
            Some(&"any") => Ok(FI_ADDR_UNSPEC),
            _ => self.num(i),
        }
    }

    fn opt(&self, key: &str) -> Result<Option<u64>, String> {
        self.opts
            .get(key)
            .map(|v| parse_num(v).ok_or(format!("bad number {key}={v}")))
            .transpose()
    }

    fn flag(&self, word: &str) -> bool {
        self.pos.contains(&word)
    }

    fn list(&self, key: &str) -> Result<Vec<u64>, String> {
        match self.opts.get(key) {
            None => Ok(Vec::new()),
            Some(v) => v
                .split(',')
                .map(|x| parse_num(x).ok_or(format!("bad number in {key}={v}")))
                .collect(),
        }
    }

    fn matching(&self) -> Result<Match, String> {
        Ok(Match {
            tag: self.opt("tag")?,
            data: self.opt("data")?,
        })
    }
}

impl Peer {
    fn rc_text(&self, code: isize) -> String {
        format!("{code} ({})", self.api.strerror(code))
    }

    // --- Completions ------------------------------------------------------

    /// Reads everything the CQ has (which also progresses the endpoint).
    /// Returns whether anything completed.
    fn poll(&mut self) -> bool {
        let mut any = false;
        for _ in 0..16 {
            let mut entries = Vec::new();
            match self.obj.cq.read_from(&mut entries) {
                Ok(0) => break,
                Ok(_) => {
                    any = true;
                    entries.into_iter().for_each(|e| self.on_entry(e));
                }
                Err(n) if n == rc::EAVAIL as isize => match self.obj.cq.read_err() {
                    Ok(e) => {
                        any = true;
                        self.on_error(e);
                    }
                    Err(n) => fatal(&format!("fi_cq_readerr: {}", self.rc_text(n))),
                },
                Err(n) => fatal(&format!("fi_cq_readfrom: {}", self.rc_text(n))),
            }
        }
        any
    }

    fn on_entry(&mut self, e: CqEntry) {
        let ctx = e.context as u64;
        if e.flags & ffi::FI_ATOMIC != 0 {
            self.atomic_done
                .entry(ctx)
                .or_default()
                .push_back((e.flags, 0));
        } else if e.flags & ffi::FI_REMOTE_WRITE != 0 {
            let mut c = Completion::new(Kind::Remote, ctx, e.flags);
            (c.len, c.data, c.src) = (e.len, e.data, e.src);
            if let Some((key, off, len)) = self.watch {
                match self.obj.mrs.iter().find(|r| r.key == key) {
                    Some(r) if off + len <= r.len => {
                        c.off = off;
                        c.sum = payload::checksum(&r.bytes()[off..off + len]);
                        c.guard = r.guards_intact();
                    }
                    _ => fatal(&format!("watch: no range {off}+{len} of region {key}")),
                }
            }
            self.remote.push_back(c);
        } else if e.flags & (ffi::FI_RMA | ffi::FI_WRITE) == ffi::FI_RMA | ffi::FI_WRITE {
            self.write_bufs.done(ctx);
            self.writes
                .push_back(Completion::new(Kind::Write, ctx, e.flags));
        } else if e.flags & (ffi::FI_RMA | ffi::FI_READ) == ffi::FI_RMA | ffi::FI_READ {
            let c = self.read_done(Kind::Read, ctx, e.flags);
            self.reads.push_back(c);
        } else if e.flags & ffi::FI_SEND != 0 {
            self.send_bufs.done(ctx);
            if ctx & TRAFFIC_SEND != 0 {
                self.traffic.push(TrafficEvent::Sent);
            } else {
                self.sends
                    .push_back(Completion::new(Kind::Send, ctx, e.flags));
            }
        } else if ctx & TRAFFIC_RECV != 0 {
            self.traffic.push(TrafficEvent::Received(e));
        } else {
            let mut c = self.received(Kind::Recv, ctx, e.flags, e.buf, e.len);
            (c.tag, c.data, c.src) = (e.tag, e.data, e.src);
            self.recvs.push_back(c);
        }
    }

    fn on_error(&mut self, e: CqError) {
        let ctx = e.context as u64;
        if ctx & (TRAFFIC_SEND | TRAFFIC_RECV) != 0 {
            self.traffic.push(TrafficEvent::Failed(e));
            return;
        }
        if e.flags & ffi::FI_ATOMIC != 0 {
            self.atomic_done
                .entry(ctx)
                .or_default()
                .push_back((e.flags, e.err));
            return;
        }
        let rma = e.flags & ffi::FI_RMA != 0;
        let mut c = if rma && e.flags & ffi::FI_WRITE != 0 {
            self.write_bufs.done(ctx);
            Completion::new(Kind::Error, ctx, e.flags)
        } else if rma && e.flags & ffi::FI_READ != 0 {
            self.read_done(Kind::Error, ctx, e.flags)
        } else if e.flags & ffi::FI_SEND != 0 {
            self.send_bufs.done(ctx);
            Completion::new(Kind::Error, ctx, e.flags)
        } else {
            self.received(Kind::Error, ctx, e.flags, e.buf, e.len)
        };
        (c.tag, c.data, c.err, c.olen) = (e.tag, e.data, e.err, e.olen);
        self.errors.push_back(c);
    }

    /// The end of the read posted as `ctx`: its length and the checksum of
    /// what it read, and whether the guards are intact; for an error, whether
    /// the whole buffer is (no byte may land). The buffer is freed.
    fn read_done(&mut self, kind: Kind, ctx: u64, flags: u64) -> Completion {
        let mut c = Completion::new(kind, ctx, flags);
        let Some(rb) = self.read_bufs.remove(&ctx) else {
            eprintln!("fabric-peer: completion for unknown read {ctx}");
            c.guard = false;
            return c;
        };
        c.len = rb.len;
        let (before, rest) = rb.mem.split_at(GUARD);
        let (data, after) = rest.split_at(rb.len);
        c.sum = payload::checksum(data);
        let untouched = |b: &[u8]| b.iter().all(|&x| x == GUARD_BYTE);
        c.guard = untouched(before) && untouched(after) && (kind != Kind::Error || untouched(data));
        c
    }

    /// A completion for data that landed in the buffer posted as `ctx`:
    /// where, its checksum, the guard. A buffer is freed with its
    /// completion; a released multi-receive buffer is kept until the end
    /// (`released`), so that a piece reported after its release is still
    /// seen, and written to memory that is still ours.
    fn received(&mut self, kind: Kind, ctx: u64, flags: u64, buf: usize, len: usize) -> Completion {
        let mut c = Completion::new(kind, ctx, flags);
        c.len = len;
        let rb = match self.recv_bufs.get(&ctx) {
            Some(rb) => rb,
            None => match self.released.iter().rev().find(|(c, _)| *c == ctx) {
                Some((_, rb)) => rb,
                None => {
                    eprintln!("fabric-peer: completion for unknown receive {ctx}");
                    c.guard = false;
                    return c;
                }
            },
        };
        c.off = buf.wrapping_sub(rb.mem.as_ptr() as usize);
        let in_bounds = c.off.checked_add(len).is_some_and(|end| end <= rb.len);
        c.guard = in_bounds && rb.mem[rb.len..].iter().all(|&b| b == GUARD_BYTE);
        c.sum = if in_bounds {
            payload::checksum(&rb.mem[c.off..c.off + len])
        } else {
            0
        };
        let multi = rb.multi;
        if !multi {
            self.recv_bufs.remove(&ctx);
        } else if flags & ffi::FI_MULTI_RECV != 0 {
            if let Some(rb) = self.recv_bufs.remove(&ctx) {
                self.released.push((ctx, rb));
            }
        }
        c
    }

    // --- Posting ----------------------------------------------------------

    /// Repeats `post` while it says -FI_EAGAIN, progressing in between.
    fn retry(&mut self, what: &str, mut post: impl FnMut(&Ep) -> isize) -> Result<(), String> {
        let deadline = Instant::now() + self.wait_limit;
        loop {
            match post(&self.obj.ep) {
                0 => return Ok(()),
                n if n == rc::EAGAIN as isize && Instant::now() < deadline => {
                    if !self.poll() {
                        std::thread::yield_now();
                    }
                }
                n => return Err(format!("{what}: {}", self.rc_text(n))),
            }
        }
    }

    fn send(&mut self, a: &Args) -> CmdResult {
        let (dest, len, seed, ctx) = (a.num(0)?, a.num(1)? as usize, a.num(2)?, a.num(3)?);
        let m = a.matching()?;
        let flags = a
            .opts
            .get("flags")
            .map(|names| send_flags(names))
            .transpose()?;
        let buf = payload::pattern(seed, len);
        let ptr = buf.as_ptr();
        // The heap block does not move with the Vec: it stays valid while
        // the map holds it, until the completion.
        self.send_bufs.keep(ctx, buf);
        // SAFETY: `len` bytes at ptr, kept in send_bufs until completion.
        let posted = self.retry("send", |ep| unsafe {
            match flags {
                Some(flags) => ep.sendmsg(ptr, len, dest, m, ctx as usize, flags),
                None => ep.send(ptr, len, dest, m, ctx as usize),
            }
        });
        if posted.is_err() {
            self.send_bufs.done(ctx);
        }
        posted.map(|()| String::new())
    }

    /// An inject, retried while the provider says -FI_EAGAIN (it may, until
    /// the peer's eager ring is known, since an inject must leave at once).
    fn inject(&mut self, a: &Args) -> CmdResult {
        let (dest, len, seed) = (a.num(0)?, a.num(1)? as usize, a.num(2)?);
        let m = a.matching()?;
        let buf = payload::pattern(seed, len);
        // SAFETY: buf holds len bytes; an inject copies them before returning.
        self.retry("inject", |ep| unsafe {
            ep.inject(buf.as_ptr(), len, dest, m)
        })
        .map(|()| String::new())
    }

    /// Posts a receive; with `once`, makes one call and returns its code
    /// instead of retrying.
    fn post_recv(&mut self, a: &Args, multi: bool, once: bool) -> CmdResult {
        let (src, len, ctx) = (a.addr(0)?, a.num(1)? as usize, a.num(2)?);
        let tag = match a.opt("tag")? {
            Some(tag) => Some((tag, a.opt("ignore")?.unwrap_or(0))),
            None => None,
        };
        let mut mem = vec![GUARD_BYTE; len + GUARD];
        let ptr = mem.as_mut_ptr();
        if self
            .recv_bufs
            .insert(ctx, RecvBuf { mem, len, multi })
            .is_some()
        {
            return Err(format!("receive {ctx} is already posted"));
        }
        let post = |ep: &Ep| {
            // SAFETY: `len` writable bytes at ptr, kept in recv_bufs until
            // the completion that releases them.
            unsafe {
                if multi {
                    ep.recv_multi(ptr, len, src, ctx as usize)
                } else {
                    ep.recv(ptr, len, src, tag, ctx as usize)
                }
            }
        };
        if once {
            let code = post(&self.obj.ep);
            if code != 0 {
                self.recv_bufs.remove(&ctx);
            }
            return Ok(code.to_string());
        }
        let posted = self.retry("recv", post);
        if posted.is_err() {
            self.recv_bufs.remove(&ctx);
        }
        posted.map(|()| String::new())
    }

    /// One raw send or inject, for the bad-input checks.
    fn try_send(&mut self, a: &Args) -> CmdResult {
        let (dest, len) = (a.num(0)?, a.num(1)? as usize);
        let buf_len = a.opt("buf")?.map_or(len, |n| n as usize);
        let ctx = a.opt("ctx")?.unwrap_or(999_999);
        let m = a.matching()?;
        let seed = a.opt("seed")?.unwrap_or(7);
        let buf = payload::pattern(seed, buf_len);
        let inject = a.flag("inject");
        let flags = a
            .opts
            .get("flags")
            .map(|names| send_flags(names))
            .transpose()?;
        // SAFETY: when len > buf_len the provider must refuse the call
        // without reading (that is what is being checked); otherwise buf
        // holds len bytes, kept until the completion below.
        let code = unsafe {
            match flags {
                _ if inject => self.obj.ep.inject(buf.as_ptr(), len, dest, m),
                Some(flags) => self
                    .obj
                    .ep
                    .sendmsg(buf.as_ptr(), len, dest, m, ctx as usize, flags),
                None => self.obj.ep.send(buf.as_ptr(), len, dest, m, ctx as usize),
            }
        };
        if code == 0 && !inject {
            self.send_bufs.keep(ctx, buf);
        }
        Ok(code.to_string())
    }

    /// `bad-send <dest>`: sends the provider must refuse before reading a
    /// byte: a NULL buffer with a length (`fi_send`), iov lengths whose sum
    /// wraps past 2^64, and a NULL iov_base with a length (`fi_sendv`).
    /// Prints `null=<rc> wrap=<rc> null-iov=<rc>`.
    fn bad_send(&mut self, a: &Args) -> CmdResult {
        let dest = a.num(0)?;
        let buf = [7u8; 16];
        let ep = &self.obj.ep;
        // SAFETY: each call must be refused without reading its buffers
        // (that is what is checked); buf lives through the calls.
        let (null, wrap, null_iov) = unsafe {
            (
                ep.send(std::ptr::null(), 100, dest, Match::default(), 1),
                ep.sendv(&[(buf.as_ptr(), usize::MAX), (buf.as_ptr(), 2)], dest, 2),
                ep.sendv(&[(buf.as_ptr(), 4), (std::ptr::null(), 5)], dest, 3),
            )
        };
        Ok(format!("null={null} wrap={wrap} null-iov={null_iov}"))
    }

    // --- Waiting ----------------------------------------------------------

    /// The completion queues, in the order of [`QUEUES`].
    fn queues(&mut self) -> [&mut VecDeque<Completion>; 6] {
        [
            &mut self.sends,
            &mut self.recvs,
            &mut self.errors,
            &mut self.writes,
            &mut self.reads,
            &mut self.remote,
        ]
    }

    fn queue_lens(&mut self) -> [usize; 6] {
        self.queues().map(|q| q.len())
    }

    fn wait(&mut self, a: &Args) -> CmdResult {
        let mut want = [0usize; 6];
        for (n, name) in want.iter_mut().zip(QUEUES) {
            *n = a.opt(name)?.unwrap_or(0) as usize;
        }
        let errors = want[2];
        let limit = a
            .opt("within")?
            .map_or(self.wait_limit, Duration::from_millis);
        let deadline = Instant::now() + limit;
        while self
            .queue_lens()
            .iter()
            .zip(want)
            .any(|(&have, w)| have < w)
        {
            if errors == 0 {
                if let Some(e) = self.errors.front() {
                    return Err(format!("unexpected error completion: {e}"));
                }
            }
            if Instant::now() > deadline {
                let have: Vec<String> = QUEUES
                    .iter()
                    .zip(self.queue_lens())
                    .map(|(name, n)| format!("{name}={n}"))
                    .collect();
                return Err(format!("timed out with {}", have.join(" ")));
            }
            if !self.poll() {
                std::thread::yield_now();
            }
        }
        for (q, n) in self.queues().into_iter().zip(want) {
            for c in q.drain(..n) {
                println!("{c}");
            }
        }
        Ok(String::new())
    }

    fn quiet(&mut self, a: &Args) -> CmdResult {
        let until = Instant::now() + Duration::from_millis(a.num(0)?);
        let before = self.queue_lens();
        while Instant::now() < until {
            if !self.poll() {
                std::thread::yield_now();
            }
        }
        let new: Vec<String> = self
            .queues()
            .iter()
            .zip(before)
            .flat_map(|(q, n)| q.iter().skip(n).map(ToString::to_string))
            .collect();
        if new.is_empty() {
            Ok(String::new())
        } else {
            Err(format!("unexpected completions: {new:?}"))
        }
    }

    // --- RMA --------------------------------------------------------------

    fn region(&self, key: u64) -> Result<&Region, String> {
        self.obj
            .mrs
            .iter()
            .find(|r| r.key == key)
            .ok_or(format!("no region {key}"))
    }

    fn mr_sum(&self, a: &Args) -> CmdResult {
        let region = self.region(a.num(0)?)?;
        let (off, len) = match a.pos.len() {
            1 => (0, region.len),
            _ => (a.num(1)? as usize, a.num(2)? as usize),
        };
        let bytes = region
            .bytes()
            .get(off..off.saturating_add(len))
            .ok_or(format!("{off}+{len} is beyond the region"))?;
        Ok(format!(
            "sum={:#x} guard={}",
            payload::checksum(bytes),
            u8::from(region.guards_intact())
        ))
    }

    fn mr_reg(&mut self, a: &Args) -> CmdResult {
        let (key, len) = (a.num(0)?, a.num(1)? as usize);
        let access = match a.opts.get("access").copied().unwrap_or("rw") {
            "read" => ffi::FI_REMOTE_READ,
            "write" => ffi::FI_REMOTE_WRITE,
            "rw" => ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE,
            "none" => 0,
            other => return Err(format!("unknown access {other}")),
        };
        let mut mem = vec![GUARD_BYTE; GUARD + len + GUARD];
        match a.opt("seed")? {
            Some(seed) => payload::fill(&mut mem[GUARD..GUARD + len], seed),
            None => mem[GUARD..GUARD + len].fill(0),
        }
        let domain = self.obj.domain.as_ref().expect("domain open");
        // SAFETY: the region's memory is kept with it in `mrs` and freed
        // only after fi_close (unreg, or the end).
        let mr = unsafe { domain.mr_reg(mem[GUARD..].as_mut_ptr(), len, access, key) };
        match mr {
            Ok(mr) => {
                if mr.key() != key {
                    return Err(format!("key {:#x}, asked for {key:#x}", mr.key()));
                }
                self.obj.mrs.push(Region { key, mr, mem, len });
                Ok("0".into())
            }
            Err(code) => Ok(code.to_string()),
        }
    }

    fn unreg(&mut self, a: &Args) -> CmdResult {
        let key = a.num(0)?;
        let i = self
            .obj
            .mrs
            .iter()
            .position(|r| r.key == key)
            .ok_or(format!("no region {key}"))?;
        let region = self.obj.mrs.remove(i);
        match region.mr.close() {
            Ok(()) => Ok("0".into()),
            Err((mr, code)) => {
                // Still open: the memory stays with it.
                let Region { key, mem, len, .. } = region;
                self.obj.mrs.insert(i, Region { key, mr, mem, len });
                Ok(code.to_string())
            }
        }
    }

    fn fill_mr(&mut self, a: &Args) -> CmdResult {
        let key = a.num(0)?;
        let seed = seed_arg(a, 1)?;
        let region = self
            .obj
            .mrs
            .iter_mut()
            .find(|r| r.key == key)
            .ok_or(format!("no region {key}"))?;
        let bytes = &mut region.mem[GUARD..GUARD + region.len];
        match seed {
            Some(seed) => payload::fill(bytes, seed),
            None => bytes.fill(0),
        }
        Ok(String::new())
    }

    fn check_mr(&mut self, a: &Args) -> CmdResult {
        let (key, off, len) = (a.num(0)?, a.num(1)? as usize, a.num(2)? as usize);
        let seed = seed_arg(a, 3)?;
        let at = a.opt("at")?.unwrap_or(0) as usize;
        let region = self.region(key)?;
        if !region.guards_intact() {
            return Err(format!("region {key}: guard bytes overwritten"));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= region.len)
            .ok_or(format!("{off}+{len} is beyond region {key}"))?;
        let expected = match seed {
            Some(seed) => payload::pattern(seed, at + len).split_off(at),
            None => vec![0; len],
        };
        let got = &region.bytes()[off..end];
        match got.iter().zip(&expected).position(|(g, e)| g != e) {
            None => Ok(String::new()),
            Some(i) => {
                let differ = got.iter().zip(&expected).filter(|(g, e)| g != e).count();
                Err(format!(
                    "region {key}: byte {} is {:#04x}, expected {:#04x} ({differ} of {len} differ)",
                    off + i,
                    got[i],
                    expected[i]
                ))
            }
        }
    }

    /// The target of an RMA command: `<peer> <key> <offset>` from word `i`.
    fn rma_target(a: &Args, i: usize) -> Result<RmaTarget, String> {
        Ok(RmaTarget {
            peer: a.num(i)?,
            key: a.num(i + 1)?,
            addr: a.num(i + 2)?,
        })
    }

    /// The entry point an RMA command asks for (`v`, `msg[=flags]`,
    /// `rma-iovs=N`).
    fn rma_call(a: &Args) -> Result<RmaCall, String> {
        let msg = match a.opts.get("msg") {
            Some(names) => Some(send_flags(names)?),
            None => a.flag("msg").then_some(0),
        };
        let rma_iovs = a.opt("rma-iovs")?.unwrap_or(1) as usize;
        Ok(match msg {
            Some(flags) => RmaCall::Msg { flags, rma_iovs },
            None if a.flag("v") => RmaCall::Vector,
            None => RmaCall::Plain,
        })
    }

    fn rma_write(&mut self, a: &Args) -> CmdResult {
        let t = Self::rma_target(a, 0)?;
        let (len, seed, ctx) = (a.num(3)? as usize, a.num(4)?, a.num(5)?);
        let data = a.opt("data")?;
        let call = Self::rma_call(a)?;
        let once = a.flag("try");
        let buf = payload::pattern(seed, len);
        let ptr = buf.as_ptr();
        if a.flag("inject") {
            // SAFETY: buf holds len bytes; an inject copies them before
            // returning.
            let inject = |ep: &Ep| unsafe { ep.inject_write(ptr, len, t, data) };
            return if once {
                Ok(inject(&self.obj.ep).to_string())
            } else {
                self.retry("inject write", inject).map(|()| String::new())
            };
        }
        if data.is_some() && call == RmaCall::Vector {
            return Err("fi_writev has no CQ data".into());
        }
        let bufs: Vec<(*const u8, usize)> = match call {
            RmaCall::Plain => vec![(ptr, len)],
            // SAFETY: the pieces lie inside buf.
            _ => pieces(len)
                .map(|(at, n)| (unsafe { ptr.add(at) }, n))
                .collect(),
        };
        // The heap block does not move with the Vec: it stays valid while
        // the map holds it, until the completion.
        self.write_bufs.keep(ctx, buf);
        // SAFETY: the buffers lie in the block kept in write_bufs until
        // the completion.
        let post = |ep: &Ep| unsafe { ep.write(&bufs, t, data, call, ctx as usize) };
        if once {
            let code = post(&self.obj.ep);
            if code != 0 {
                self.write_bufs.done(ctx);
            }
            return Ok(code.to_string());
        }
        let posted = self.retry("write", post);
        if posted.is_err() {
            self.write_bufs.done(ctx);
        }
        posted.map(|()| String::new())
    }

    fn rma_read(&mut self, a: &Args) -> CmdResult {
        let t = Self::rma_target(a, 0)?;
        let (len, ctx) = (a.num(3)? as usize, a.num(4)?);
        let call = Self::rma_call(a)?;
        let mut mem = vec![GUARD_BYTE; GUARD + len + GUARD];
        // SAFETY: GUARD + len bytes follow the start of mem.
        let ptr = unsafe { mem.as_mut_ptr().add(GUARD) };
        let bufs: Vec<(*mut u8, usize)> = match call {
            RmaCall::Plain => vec![(ptr, len)],
            // SAFETY: the pieces lie inside the len bytes at ptr.
            _ => pieces(len)
                .map(|(at, n)| (unsafe { ptr.add(at) }, n))
                .collect(),
        };
        if self.read_bufs.insert(ctx, ReadBuf { mem, len }).is_some() {
            return Err(format!("read {ctx} is already posted"));
        }
        // SAFETY: the buffers lie in the block kept in read_bufs until the
        // completion (the heap block does not move with the map).
        let post = |ep: &Ep| unsafe { ep.read(&bufs, t, call, ctx as usize) };
        if a.flag("try") {
            let code = post(&self.obj.ep);
            if code != 0 {
                self.read_bufs.remove(&ctx);
            }
            return Ok(code.to_string());
        }
        let posted = self.retry("read", post);
        if posted.is_err() {
            self.read_bufs.remove(&ctx);
        }
        posted.map(|()| String::new())
    }

    /// `cntr` (no thresholds) and `cntr-wait`.
    fn cntr_wait(&mut self, a: &Args) -> CmdResult {
        let names = self.obj.cntr_names;
        let mut want = [0u64; 4];
        for (w, name) in want.iter_mut().zip(names) {
            *w = a.opt(name)?.unwrap_or(0);
        }
        let deadline = Instant::now() + self.wait_limit;
        let show = |v: [u64; 4]| {
            names
                .iter()
                .zip(v)
                .map(|(name, n)| format!("{name}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        loop {
            let cntrs = self
                .obj
                .cntrs
                .as_ref()
                .ok_or("no counters (FABRIC_PEER_CNTR=1)")?;
            // Reading a counter progresses the endpoint.
            let values = cntrs.values();
            if values.iter().zip(want).all(|(&v, w)| v >= w) {
                return Ok(show(values));
            }
            if Instant::now() > deadline {
                return Err(format!("timed out with {}", show(values)));
            }
            std::thread::yield_now();
        }
    }

    /// `cntr-sleep <write|read> <threshold> <ms>`: one `fi_cntr_wait` on
    /// that counter, timed as `sread`: `ok rc=R wall_ms=W cpu_ms=C`.
    fn cntr_sleep(&mut self, a: &Args) -> CmdResult {
        let cntrs = self
            .obj
            .cntrs
            .as_ref()
            .ok_or("no counters (FABRIC_PEER_CNTR=1)")?;
        let cntr = match a.pos.first().copied() {
            Some("write") => &cntrs.write,
            Some("read") => &cntrs.read,
            other => return Err(format!("no counter {other:?}")),
        };
        let (threshold, ms) = (a.num(1)?, a.num(2)? as i32);
        let (cpu0, wall0) = (process_cpu_ms(), Instant::now());
        let rc = cntr.wait(threshold, ms);
        let (cpu_ms, wall_ms) = (process_cpu_ms() - cpu0, wall0.elapsed().as_secs_f64() * 1e3);
        Ok(format!("rc={rc} wall_ms={wall_ms:.1} cpu_ms={cpu_ms:.2}"))
    }

    /// `fi_cq_sread` of one entry with a timeout of `ms`, timed:
    /// `ok rc=R wall_ms=W cpu_ms=C` (the process's CPU time while it
    /// waited, every thread's); an entry read is queued as any other.
    fn sread(&mut self, a: &Args) -> CmdResult {
        let ms = a.num(0)? as i32;
        let cpu = process_cpu_ms;
        let (cpu0, wall0) = (cpu(), Instant::now());
        let mut entries = Vec::new();
        let rc = match self.obj.cq.sread(&mut entries, ms) {
            Ok(n) => n as isize,
            Err(n) => n,
        };
        let (cpu_ms, wall_ms) = (cpu() - cpu0, wall0.elapsed().as_secs_f64() * 1e3);
        entries.into_iter().for_each(|e| self.on_entry(e));
        Ok(format!("rc={rc} wall_ms={wall_ms:.1} cpu_ms={cpu_ms:.2}"))
    }

    /// `ok sum=S`: the checksum of the first `len` bytes of the buffer
    /// posted as receive `ctx` (no libfabric call: what is there now).
    fn recv_sum(&self, a: &Args) -> CmdResult {
        let ctx: u64 = a.num(0)?;
        let len = a.num(1)? as usize;
        let rb = self
            .recv_bufs
            .get(&ctx)
            .ok_or_else(|| format!("no receive {ctx} posted"))?;
        if len > rb.len {
            return Err(format!("receive {ctx} has {} bytes", rb.len));
        }
        // Volatile: the provider's agent thread writes the buffer behind
        // the compiler's back.
        let bytes: Vec<u8> = (0..len)
            .map(|i| {
                // SAFETY: i < len <= the buffer's length; a byte read.
                unsafe { std::ptr::read_volatile(rb.mem.as_ptr().add(i)) }
            })
            .collect();
        Ok(format!("sum={}", payload::checksum(&bytes)))
    }

    fn sleep_no_progress(&mut self, a: &Args) -> CmdResult {
        let until_wake = a.pos.first() == Some(&"wake");
        let ms = if until_wake { 0 } else { a.num(0)? };
        println!("sleeping");
        if !until_wake {
            std::thread::sleep(Duration::from_millis(ms));
            return Ok(String::new());
        }
        loop {
            let line = self
                .commands
                .recv_timeout(self.wait_limit)
                .map_err(|e| format!("no 'wake': {e}"))?;
            let mut words = line.split_whitespace();
            match words.next() {
                Some("wake") => return Ok(String::new()),
                Some("mr-sum") => println!("{}", self.mr_sum(&Args::parse(words))?),
                Some("get") => println!("{}", self.get(&Args::parse(words))?),
                Some("recv-sum") => println!("{}", self.recv_sum(&Args::parse(words))?),
                _ => {
                    return Err(format!(
                        "expected 'wake', 'mr-sum', 'get' or 'recv-sum', got '{line}'"
                    ))
                }
            }
        }
    }

    // --- Bad input --------------------------------------------------------

    fn getinfo(&mut self, a: &Args) -> CmdResult {
        let mut hints = Hints::default();
        if let Some(caps) = a.opts.get("caps") {
            hints.caps = caps.split('|').map(cap_bit).sum::<Result<u64, _>>()?;
        }
        if let Some(flags) = a.opts.get("tx-flags") {
            hints.tx_op_flags = send_flags(flags)?;
        }
        if let Some(ep) = a.opts.get("ep") {
            hints.ep_type = match *ep {
                "msg" => ffi::FI_EP_MSG,
                "rdm" => ffi::FI_EP_RDM,
                "dgram" => ffi::FI_EP_DGRAM,
                other => return Err(format!("unknown endpoint type {other}")),
            };
        }
        Ok(match Info::get(self.api, &hints) {
            Ok(_) => "0".into(),
            Err(code) => code.to_string(),
        })
    }

    fn close_domain(&mut self) -> CmdResult {
        let domain = self.obj.domain.take().expect("domain open");
        match domain.close() {
            Ok(()) => fatal("fi_close(domain) succeeded while its endpoint is open"),
            Err((domain, code)) => {
                self.obj.domain = Some(domain);
                Ok(code.to_string())
            }
        }
    }

    fn disabled_ep(&mut self) -> CmdResult {
        let domain = self.obj.domain.as_ref().expect("domain open");
        let ep = domain
            .endpoint(&self.obj.info)
            .map_err(|c| format!("fi_endpoint: {c}"))?;
        // Leaked: should the provider wrongly accept a receive, the buffer
        // must outlive the endpoint.
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 64].into_boxed_slice());
        let ptr = buf.as_mut_ptr();
        let tag = Match {
            tag: Some(1),
            data: None,
        };
        // SAFETY: 64 bytes at ptr, alive forever.
        let unbound = unsafe { ep.send(ptr, 8, 0, Match::default(), 1) };
        ep.bind(&self.obj.av, 0)
            .map_err(|c| format!("bind av: {c}"))?;
        ep.bind(&self.obj.cq, ffi::FI_TRANSMIT | ffi::FI_RECV)
            .map_err(|c| format!("bind cq: {c}"))?;
        // SAFETY: as above.
        let results = unsafe {
            [
                ("unbound", unbound),
                ("send", ep.send(ptr, 8, 0, Match::default(), 2)),
                ("tsend", ep.send(ptr, 8, 0, tag, 3)),
                ("inject", ep.inject(ptr, 8, 0, Match::default())),
                ("recv", ep.recv(ptr, 64, FI_ADDR_UNSPEC, None, 4)),
                ("trecv", ep.recv(ptr, 64, FI_ADDR_UNSPEC, Some((1, 0)), 5)),
            ]
        };
        ep.close()
            .map_err(|(_, c)| format!("fi_close(second ep): {c}"))?;
        Ok(results
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "))
    }

    // --- Traffic ----------------------------------------------------------

    fn traffic(&mut self, a: &Args) -> CmdResult {
        let spec = Traffic {
            rank: a.opt("rank")?.ok_or("rank= missing")? as u32,
            to: a.list("to")?,
            from: a.opt("from")?.unwrap_or(0),
            count: a.opt("count")?.ok_or("count= missing")?,
            lens: a.list("lens")?.into_iter().map(|l| l as usize).collect(),
            tagged: a.flag("tagged"),
            window: a.opt("window")?.unwrap_or(256) as usize,
            hold: Duration::from_millis(a.opt("hold")?.unwrap_or(0)),
            within: a
                .opt("within")?
                .map_or(self.wait_limit, Duration::from_millis),
        };
        if spec.lens.is_empty() || spec.lens.iter().any(|&l| l < payload::STAMP_LEN) {
            return Err(format!("lens= must list sizes >= {}", payload::STAMP_LEN));
        }
        spec.run(self)
    }
}

// --- Atomics ----------------------------------------------------------------

/// A datatype word: `enum fi_datatype` and the element size in bytes.
fn datatype_arg(word: &str) -> Result<(u32, usize), String> {
    const NAMES: [(&str, usize); 14] = [
        ("i8", 1),
        ("u8", 1),
        ("i16", 2),
        ("u16", 2),
        ("i32", 4),
        ("u32", 4),
        ("i64", 8),
        ("u64", 8),
        ("float", 4),
        ("double", 8),
        ("fcomplex", 8),
        ("dcomplex", 16),
        ("ldouble", 16),
        ("ldcomplex", 32),
    ];
    let index = match NAMES.iter().position(|&(n, _)| n == word) {
        Some(i) => i,
        None => parse_num(word).ok_or(format!("unknown datatype {word}"))? as usize,
    };
    // Beyond the names: a datatype nobody knows, 8 bytes for the buffers.
    let size = NAMES.get(index).map_or(8, |&(_, size)| size);
    Ok((index as u32, size))
}

/// An operation word: `enum fi_op`.
fn op_arg(word: &str) -> Result<u32, String> {
    const NAMES: [&str; 19] = [
        "min", "max", "sum", "prod", "lor", "land", "bor", "band", "lxor", "bxor", "read", "write",
        "cswap", "cswap-ne", "cswap-le", "cswap-lt", "cswap-ge", "cswap-gt", "mswap",
    ];
    match NAMES.iter().position(|&n| n == word) {
        Some(i) => Ok(i as u32),
        None => parse_num(word)
            .map(|n| n as u32)
            .ok_or(format!("unknown operation {word}")),
    }
}

fn family_arg(word: &str) -> Result<AtomicFamily, String> {
    Ok(match word {
        "write" => AtomicFamily::Write,
        "fetch" => AtomicFamily::Fetch,
        "compare" => AtomicFamily::Compare,
        other => return Err(format!("unknown atomic family {other}")),
    })
}

/// `count` elements of `size` bytes from the values of list `key` (one
/// value: all of them; none: zeros); elements wider than 8 bytes get the
/// value in their low 8 bytes.
fn elements(a: &Args, key: &str, count: usize, size: usize) -> Result<Vec<u8>, String> {
    let values = a.list(key)?;
    let mut bytes = vec![0u8; count * size];
    for i in 0..count {
        let v = match values.len() {
            0 => 0,
            1 => values[0],
            n if i < n => values[i],
            n => return Err(format!("{key}= has {n} values for {count} elements")),
        };
        let w = size.min(8);
        bytes[i * size..i * size + w].copy_from_slice(&v.to_le_bytes()[..w]);
    }
    Ok(bytes)
}

/// The low 8 bytes of each `size`-byte element of `bytes`, as decimal
/// numbers separated by commas.
fn show_elements(bytes: &[u8], size: usize) -> String {
    bytes
        .chunks(size)
        .map(|e| {
            let mut word = [0u8; 8];
            let w = e.len().min(8);
            word[..w].copy_from_slice(&e[..w]);
            u64::from_le_bytes(word).to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Context bit of the `fetch-add-loop` command's atomics.
const LOOP_ATOMIC: u64 = 1 << 60;

impl Peer {
    fn atomic(&mut self, a: &Args) -> CmdResult {
        let (peer, key, addr) = (a.num(0)?, a.num(1)?, a.num(2)?);
        let family = family_arg(a.pos.get(3).ok_or("family missing")?)?;
        let (datatype, size) = datatype_arg(a.pos.get(4).ok_or("datatype missing")?)?;
        let op = op_arg(a.pos.get(5).ok_or("operation missing")?)?;
        let count = a.num(6)? as usize;
        let ctx = a.opt("ctx")?.unwrap_or(1);
        let form = if a.flag("inject") {
            AtomicForm::Inject
        } else if let Some(names) = a.opts.get("msg") {
            AtomicForm::Msg {
                flags: send_flags(names)?,
                rma_iovs: a.opt("rma-iovs")?.unwrap_or(1) as usize,
            }
        } else if a.flag("msg") {
            AtomicForm::Msg {
                flags: 0,
                rma_iovs: a.opt("rma-iovs")?.unwrap_or(1) as usize,
            }
        } else if a.flag("v") {
            AtomicForm::Vector
        } else {
            AtomicForm::Plain
        };
        let operands = elements(a, "ops", count, size)?;
        let compares = elements(a, "cmp", count, size)?;
        let len = count * size;
        let mut result = vec![GUARD_BYTE; len + GUARD];
        let t = AtomicTarget {
            peer,
            addr,
            key,
            datatype,
            op,
        };
        let b = AtomicBufs {
            operand: if a.flag("null-ops") {
                std::ptr::null()
            } else {
                operands.as_ptr()
            },
            compare: compares.as_ptr(),
            result: result.as_mut_ptr(),
            count,
            size,
        };
        let inject = form == AtomicForm::Inject;
        if !inject {
            // The heap blocks do not move with the Vecs: they stay valid
            // while the map holds them, until the completion.
            let kept = AtomicBuf {
                result,
                len,
                size,
                _operands: (operands, compares),
            };
            if self.atomic_bufs.insert(ctx, kept).is_some() {
                return Err(format!("atomic {ctx} is already posted"));
            }
        }
        // SAFETY: operands, compares and the result buffer hold count
        // elements; the first two live until the end of this function (the
        // provider copies them) and all three, in atomic_bufs, until the
        // completion (an inject has none; its operands live in this frame).
        let post = |ep: &Ep| unsafe { ep.atomic(family, form, b, t, ctx as usize) };
        let code = if a.flag("try") {
            post(&self.obj.ep)
        } else {
            match self.retry("atomic", post) {
                Ok(()) => 0,
                Err(why) => {
                    self.atomic_bufs.remove(&ctx);
                    return Err(why);
                }
            }
        };
        if code != 0 {
            self.atomic_bufs.remove(&ctx);
            return Ok(format!("rc={code}"));
        }
        if inject || a.flag("nowait") {
            return Ok("rc=0".into());
        }
        self.atomic_wait(ctx)
    }

    /// Waits for the completion of atomic `ctx` (see `atomic`).
    fn atomic_wait(&mut self, ctx: u64) -> CmdResult {
        let deadline = Instant::now() + self.wait_limit;
        let (flags, err) = loop {
            if let Some(done) = self.atomic_done.get_mut(&ctx).and_then(VecDeque::pop_front) {
                break done;
            }
            if Instant::now() > deadline {
                return Err(format!("atomic {ctx}: no completion"));
            }
            if !self.poll() {
                std::thread::yield_now();
            }
        };
        let (old, guard) = match self.atomic_bufs.remove(&ctx) {
            Some(ab) => {
                let (data, after) = ab.result.split_at(ab.len);
                let untouched = |b: &[u8]| b.iter().all(|&x| x == GUARD_BYTE);
                let guard = untouched(after) && (err == 0 || untouched(data));
                (show_elements(data, ab.size), guard)
            }
            None => (String::new(), true),
        };
        Ok(format!(
            "rc=0 flags={flags:#x} err={err} old={old} guard={}",
            u8::from(guard)
        ))
    }

    fn valid(&mut self, a: &Args) -> CmdResult {
        let (datatype, _) = datatype_arg(a.pos.first().ok_or("datatype missing")?)?;
        let op = op_arg(a.pos.get(1).ok_or("operation missing")?)?;
        let mut out = Vec::new();
        for (name, family) in [
            ("write", AtomicFamily::Write),
            ("fetch", AtomicFamily::Fetch),
            ("compare", AtomicFamily::Compare),
        ] {
            let (rc, count) = self.obj.ep.atomic_valid(family, datatype, op);
            out.push(format!("{name}={rc}/{count}"));
        }
        let domain = self.obj.domain.as_ref().expect("domain open");
        for (name, flags) in [
            ("qwrite", 0),
            ("qfetch", ffi::FI_FETCH_ATOMIC),
            ("qcompare", ffi::FI_COMPARE_ATOMIC),
        ] {
            let (rc, count, size) = domain.query_atomic(datatype, op, flags);
            out.push(format!("{name}={rc}/{count}/{size}"));
        }
        Ok(out.join(" "))
    }

    /// The `count` elements of `size` bytes at `off` of region `key`.
    fn elements_of(
        &self,
        key: u64,
        off: usize,
        count: usize,
        size: usize,
    ) -> Result<&[u8], String> {
        self.region(key)?
            .bytes()
            .get(off..off.saturating_add(count * size))
            .ok_or(format!("{count} elements at {off} are beyond region {key}"))
    }

    fn get(&self, a: &Args) -> CmdResult {
        let (key, off) = (a.num(0)?, a.num(1)? as usize);
        let (_, size) = datatype_arg(a.pos.get(2).ok_or("datatype missing")?)?;
        let count = a.num(3)? as usize;
        Ok(show_elements(
            self.elements_of(key, off, count, size)?,
            size,
        ))
    }

    fn set(&mut self, a: &Args) -> CmdResult {
        let (key, off) = (a.num(0)?, a.num(1)? as usize);
        let (_, size) = datatype_arg(a.pos.get(2).ok_or("datatype missing")?)?;
        let values: Vec<u64> = a
            .pos
            .get(3)
            .ok_or("values missing")?
            .split(',')
            .map(|v| parse_num(v).ok_or(format!("bad value {v}")))
            .collect::<Result<_, _>>()?;
        let region = self
            .obj
            .mrs
            .iter_mut()
            .find(|r| r.key == key)
            .ok_or(format!("no region {key}"))?;
        let len = region.len;
        let bytes = region.mem[GUARD..GUARD + len]
            .get_mut(off..off.saturating_add(values.len() * size))
            .ok_or(format!(
                "{} elements at {off} are beyond region {key}",
                values.len()
            ))?;
        for (e, v) in bytes.chunks_mut(size).zip(values) {
            let w = size.min(8);
            e[..w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
        Ok(String::new())
    }

    /// `flag-wait`: progresses until the region's u64 at the flag's offset
    /// holds the value, then takes the checksum of the data range at once
    /// (before any other libfabric call), as a program that waits for a
    /// signal and then reads what was put before it.
    fn flag_wait(&mut self, a: &Args) -> CmdResult {
        let (key, flag, value) = (a.num(0)?, a.num(1)? as usize, a.num(2)?);
        let (off, len) = (a.num(3)? as usize, a.num(4)? as usize);
        let region = self.region(key)?;
        if flag.checked_add(8).is_none_or(|end| end > region.len) || flag % 8 != 0 {
            return Err(format!("no aligned u64 at {flag} of region {key}"));
        }
        if off.checked_add(len).is_none_or(|end| end > region.len) {
            return Err(format!("{off}+{len} is beyond region {key}"));
        }
        let at = region.bytes()[flag..].as_ptr() as *const u64;
        let deadline = Instant::now() + self.wait_limit;
        let mut polls = 0u64;
        loop {
            // SAFETY: `at` is an aligned u64 inside the region, which lives
            // in `mrs` while this runs; peers write it, hence the volatile
            // read.
            if u64::from_le(unsafe { at.read_volatile() }) == value {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "flag at {flag} of region {key} never became {value}"
                ));
            }
            polls += 1;
            if !self.poll() {
                std::hint::spin_loop();
            }
        }
        std::sync::atomic::fence(Ordering::Acquire);
        let region = self.region(key)?;
        Ok(format!(
            "sum={:#x} polls={polls}",
            payload::checksum(&region.bytes()[off..off + len])
        ))
    }

    /// `fetch-add-loop`: tickets from one counter.
    fn fetch_add_loop(&mut self, a: &Args) -> CmdResult {
        let (peer, key, addr, n) = (a.num(0)?, a.num(1)?, a.num(2)?, a.num(3)?);
        let mut tickets = Vec::with_capacity(n as usize);
        if a.flag("local") {
            let bytes = self.elements_of(key, addr as usize, 1, 8)?;
            let ptr = bytes.as_ptr();
            if !(ptr as usize).is_multiple_of(8) {
                return Err(format!(
                    "offset {addr} of region {key} is not 8-byte aligned"
                ));
            }
            // SAFETY: 8 aligned bytes of a live region, which every access
            // (ours, peers' DMA and the provider's) updates atomically.
            let counter = unsafe { &*ptr.cast::<AtomicU64>() };
            for _ in 0..n {
                tickets.push(counter.fetch_add(1, Ordering::SeqCst));
                // Peers' atomics to ordinary memory need our progress.
                self.poll();
            }
        } else {
            let window = a.opt("window")?.unwrap_or(4).clamp(1, 64) as usize;
            let one = 1u64.to_le_bytes();
            // One result word per slot; the Vec is never resized.
            let mut results = vec![0u64; window];
            let base = results.as_mut_ptr();
            let t = AtomicTarget {
                peer,
                addr,
                key,
                datatype: ffi::FI_UINT64,
                op: ffi::FI_SUM,
            };
            let post = |this: &mut Peer, slot: usize| {
                let b = AtomicBufs {
                    operand: one.as_ptr(),
                    compare: std::ptr::null(),
                    result: base.wrapping_add(slot).cast(),
                    count: 1,
                    size: 8,
                };
                let ctx = (LOOP_ATOMIC | slot as u64) as usize;
                // SAFETY: the operand lives through the call; the result
                // word of the slot lives until the command ends, after
                // every completion, and a slot is reposted only after its
                // completion.
                this.retry("fetch-add", |ep| unsafe {
                    ep.atomic(AtomicFamily::Fetch, AtomicForm::Plain, b, t, ctx)
                })
            };
            let mut posted = 0u64;
            for slot in 0..window.min(n as usize) {
                post(self, slot)?;
                posted += 1;
            }
            let deadline = Instant::now() + self.wait_limit;
            while (tickets.len() as u64) < n {
                let busy = self.poll();
                for slot in 0..window {
                    let ctx = LOOP_ATOMIC | slot as u64;
                    let Some((flags, err)) =
                        self.atomic_done.get_mut(&ctx).and_then(VecDeque::pop_front)
                    else {
                        continue;
                    };
                    if err != 0 {
                        return Err(format!("fetch-add error {err} (flags {flags:#x})"));
                    }
                    // SAFETY: the slot's word, written by the provider
                    // before the completion we just read.
                    tickets.push(unsafe { std::ptr::read_volatile(base.add(slot)) });
                    if posted < n {
                        post(self, slot)?;
                        posted += 1;
                    }
                }
                if Instant::now() > deadline {
                    return Err(format!("timed out after {} of {n} tickets", tickets.len()));
                }
                if !busy {
                    std::thread::yield_now();
                }
            }
            // Every slot completed: the provider is done with the words.
            drop(results);
        }
        let list: Vec<String> = tickets.iter().map(u64::to_string).collect();
        Ok(format!("tickets={}", list.join(",")))
    }

    fn mr_cntr(&mut self, a: &Args) -> CmdResult {
        let key = a.num(0)?;
        let flags = match a.pos.get(1).copied() {
            Some("read") => ffi::FI_REMOTE_READ,
            Some("write") => ffi::FI_REMOTE_WRITE,
            Some("rw") => ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE,
            other => return Err(format!("unknown counter flags {other:?}")),
        };
        let domain = self.obj.domain.as_ref().expect("domain open");
        let cntr = domain.cntr().map_err(|c| format!("fi_cntr_open: {c}"))?;
        self.region(key)?
            .mr
            .bind(&cntr, flags)
            .map_err(|c| format!("fi_mr_bind: {c}"))?;
        self.obj.mr_cntrs.push(cntr);
        Ok(String::new())
    }

    /// `churn <count> <min> <max>`: small allocations come and go.
    fn churn(&mut self, a: &Args) -> CmdResult {
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
    fn exhaust_fds(&mut self, a: &Args) -> CmdResult {
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

    /// `rcntr` (no thresholds) and `rcntr-wait`.
    fn rcntr_wait(&mut self, a: &Args) -> CmdResult {
        let deadline = Instant::now() + self.wait_limit;
        loop {
            // Reading a counter progresses the endpoint.
            let mut values = Vec::new();
            if let Some(c) = &self.obj.remote_cntrs {
                values.push(("remote-write".to_string(), c.write.read()));
                values.push(("remote-read".to_string(), c.read.read()));
            } else if self.obj.mr_cntrs.is_empty() {
                return Err("no remote counters (FABRIC_PEER_RMA_EVENT=1, or mr-cntr)".into());
            }
            for (i, m) in self.obj.mr_cntrs.iter().enumerate() {
                values.push((format!("mr{i}"), m.read()));
            }
            let show = values
                .iter()
                .map(|(name, n)| format!("{name}={n}"))
                .collect::<Vec<_>>()
                .join(" ");
            let mut reached = true;
            for (name, n) in &values {
                reached &= a.opt(name)?.is_none_or(|want| *n >= want);
            }
            if reached {
                return Ok(show);
            }
            if Instant::now() > deadline {
                return Err(format!("timed out with {show}"));
            }
            std::thread::yield_now();
        }
    }
}

/// Send flags named `a|b` (`send`'s `flags=`, `getinfo`'s `tx-flags=`,
/// `$FABRIC_PEER_TX_OP_FLAGS`); empty: none.
fn send_flags(names: &str) -> Result<u64, String> {
    names
        .split('|')
        .filter(|name| !name.is_empty())
        .map(send_flag)
        .sum()
}

/// One flag of [`send_flags`].
fn send_flag(name: &str) -> Result<u64, String> {
    Ok(match name {
        "completion" => ffi::FI_COMPLETION,
        "inject" => ffi::FI_INJECT,
        "inject-complete" => ffi::FI_INJECT_COMPLETE,
        "transmit-complete" => ffi::FI_TRANSMIT_COMPLETE,
        "match-complete" => ffi::FI_MATCH_COMPLETE,
        "delivery-complete" => ffi::FI_DELIVERY_COMPLETE,
        "commit-complete" => ffi::FI_COMMIT_COMPLETE,
        other => return Err(format!("unknown send flag {other}")),
    })
}

/// A seed word: a number, or `zero` (`None`) for zeros.
fn seed_arg(a: &Args, i: usize) -> Result<Option<u64>, String> {
    match a.pos.get(i) {
        Some(&"zero") => Ok(None),
        _ => a.num(i).map(Some),
    }
}

/// Three consecutive pieces (offset, length) covering `len` bytes, for the
/// vector calls (some empty when `len` < 3).
fn pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let cuts = [0, len / 3, 2 * len / 3, len];
    (0..3).map(move |i| (cuts[i], cuts[i + 1] - cuts[i]))
}

fn cap_bit(name: &str) -> Result<u64, String> {
    Ok(match name {
        "msg" => ffi::FI_MSG,
        "tagged" => ffi::FI_TAGGED,
        "rma" => ffi::FI_RMA,
        "rma-event" => ffi::FI_RMA_EVENT,
        "collective" => ffi::FI_COLLECTIVE,
        "atomic" => ffi::FI_ATOMIC,
        "source" => ffi::FI_SOURCE,
        "directed" => ffi::FI_DIRECTED_RECV,
        "multi" => ffi::FI_MULTI_RECV,
        other => return Err(format!("unknown capability {other}")),
    })
}

/// The `traffic` command: stamped messages to and from many peers at once.
struct Traffic {
    rank: u32,
    to: Vec<u64>,
    from: u64,
    count: u64,
    lens: Vec<usize>,
    tagged: bool,
    window: usize,
    /// No libfabric call for this long once the first sends are posted.
    hold: Duration,
    /// How long it may take.
    within: Duration,
}

fn tag_of(rank: u32, seq: u64) -> u64 {
    (u64::from(rank) << 48) | seq
}

/// The receiving half of `traffic`: a window of receive buffers, reposted
/// as they complete, and what each sender's messages looked like.
struct Receiving {
    /// Buffers, and the number of the post each is in (posts are numbered
    /// in order).
    slots: Vec<(Vec<u8>, u64)>,
    posts: u64,
    /// Per sender: its source address, and (sequence, post number) of each
    /// message in completion order.
    heard: HashMap<u32, (u64, Vec<(u64, u64)>)>,
    /// Completion order must be send order too: every message fits one
    /// mailbox message (inline), so none can be overtaken. (Eager-sized
    /// ones can: a receiver that holds too much unexpected data throttles
    /// its sender, whose eager messages then go by rendezvous and complete
    /// after later inline ones; their matching order is still checked.)
    strict: bool,
}

impl Traffic {
    /// What the provider carries inline, with a tag of 8 significant bytes
    /// at most (ranks and sequence numbers) when tagged.
    fn inline_capacity(&self) -> usize {
        unimem_proto::wire::inline_capacity(&unimem_proto::wire::MatchInfo {
            tag: self.tagged.then_some(u64::MAX),
            data: None,
        })
    }

    fn len_of(&self, seq: u64) -> usize {
        self.lens[(seq % self.lens.len() as u64) as usize]
    }

    fn run(&self, peer: &mut Peer) -> CmdResult {
        let expected = self.from * self.count;
        let max_len = *self.lens.iter().max().expect("lens checked");
        let mut rx = Receiving {
            slots: vec![(vec![0; max_len], 0); self.window.min(expected as usize)],
            posts: 0,
            heard: HashMap::new(),
            strict: max_len <= self.inline_capacity(),
        };
        for slot in 0..rx.slots.len() {
            self.post_recv(peer, &mut rx, slot)?;
        }
        let mut next_send = vec![0u64; self.to.len()];
        let total_sends = self.to.len() as u64 * self.count;
        let (mut sent, mut received, mut refused) = (0u64, 0u64, 0u64);
        let deadline = Instant::now() + self.within;
        let mut hold = self.hold;
        while received < expected || sent < total_sends {
            let mut busy = self.post_sends(peer, &mut next_send, &mut refused)?;
            if !hold.is_zero() {
                std::thread::sleep(std::mem::take(&mut hold));
            }
            busy |= peer.poll();
            for event in std::mem::take(&mut peer.traffic) {
                match event {
                    TrafficEvent::Sent => sent += 1,
                    TrafficEvent::Failed(e) => return Err(format!("traffic error entry: {e:?}")),
                    TrafficEvent::Received(e) => {
                        let slot = (e.context as u64 & !TRAFFIC_RECV) as usize;
                        self.check(&e, &mut rx, slot)?;
                        received += 1;
                        if rx.posts < expected {
                            self.post_recv(peer, &mut rx, slot)?;
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "timed out: sent {sent} of {total_sends} (posted {next_send:?}), \
                     received {received} of {expected}"
                ));
            }
            if !busy {
                std::thread::yield_now();
            }
        }
        self.check_order(&rx)?;
        Ok(format!("sent={sent} received={received} eagain={refused}"))
    }

    fn post_recv(&self, peer: &mut Peer, rx: &mut Receiving, slot: usize) -> Result<(), String> {
        let tag = self.tagged.then_some((0, u64::MAX));
        let (buf, post) = &mut rx.slots[slot];
        *post = rx.posts;
        rx.posts += 1;
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: the slot buffers live until the command ends, after every
        // receive completed, and a slot is reposted only after completing.
        peer.retry("traffic recv", |ep| unsafe {
            ep.recv(ptr, len, FI_ADDR_UNSPEC, tag, TRAFFIC_RECV as usize | slot)
        })
    }

    /// Posts sends round-robin until every destination is done or the
    /// provider says -FI_EAGAIN (counted in `refused`). Returns whether it
    /// posted any.
    fn post_sends(
        &self,
        peer: &mut Peer,
        next: &mut [u64],
        refused: &mut u64,
    ) -> Result<bool, String> {
        let mut posted = false;
        loop {
            let mut round = false;
            for (d, &dest) in self.to.iter().enumerate() {
                let seq = next[d];
                if seq == self.count {
                    continue;
                }
                let mut buf = vec![0u8; self.len_of(seq)];
                payload::stamp(&mut buf, self.rank, seq);
                let ctx = TRAFFIC_SEND | (d as u64) << 40 | seq;
                let m = Match {
                    tag: self.tagged.then(|| tag_of(self.rank, seq)),
                    data: None,
                };
                // SAFETY: the buffer is kept in send_bufs until completion.
                let code = unsafe {
                    peer.obj
                        .ep
                        .send(buf.as_ptr(), buf.len(), dest, m, ctx as usize)
                };
                match code {
                    0 => {
                        peer.send_bufs.keep(ctx, buf);
                        next[d] += 1;
                        round = true;
                    }
                    n if n == rc::EAGAIN as isize => {
                        *refused += 1;
                        return Ok(posted);
                    }
                    n => return Err(format!("traffic send: {}", peer.rc_text(n))),
                }
            }
            if !round {
                return Ok(posted);
            }
            posted = true;
        }
    }

    /// Checks one received message: contents, length, tag, source.
    fn check(&self, e: &CqEntry, rx: &mut Receiving, slot: usize) -> Result<(), String> {
        let (buf, post) = &rx.slots[slot];
        let data = buf
            .get(..e.len)
            .ok_or("completion longer than the buffer")?;
        let (rank, seq) =
            payload::unstamp(data).ok_or_else(|| format!("corrupt message: {e:?}"))?;
        let what = format!("message {seq} from {rank}");
        if e.len != self.len_of(seq) {
            return Err(format!(
                "{what}: {} bytes, sent {}",
                e.len,
                self.len_of(seq)
            ));
        }
        if self.tagged && (e.tag != tag_of(rank, seq) || e.flags & ffi::FI_TAGGED == 0) {
            return Err(format!("{what}: tag {:#x}", e.tag));
        }
        if e.src == FI_ADDR_NOTAVAIL {
            return Err(format!("{what}: no source"));
        }
        let (src, seen) = rx.heard.entry(rank).or_insert((e.src, Vec::new()));
        if e.src != *src {
            return Err(format!("{what}: source {} after {src}", e.src));
        }
        if rx.strict && seen.last().map_or(0, |&(s, _)| s + 1) != seq {
            return Err(format!("{what} completed after {:?}", seen.last()));
        }
        seen.push((seq, *post));
        Ok(())
    }

    /// Every sender's messages all arrived, once each, and took the
    /// receives in the order they were posted (FI_ORDER_SAS).
    fn check_order(&self, rx: &Receiving) -> Result<(), String> {
        let sources: HashSet<u64> = rx.heard.values().map(|h| h.0).collect();
        if rx.heard.len() as u64 != self.from || sources.len() != rx.heard.len() {
            return Err(format!(
                "heard {} senders from {} sources, expected {}",
                rx.heard.len(),
                sources.len(),
                self.from
            ));
        }
        for (rank, (_, seen)) in &rx.heard {
            let mut seen = seen.clone();
            seen.sort_unstable();
            for (i, w) in seen.iter().enumerate() {
                if w.0 != i as u64 {
                    return Err(format!("from {rank}: message {} where {i} was due", w.0));
                }
            }
            if let Some(w) = seen.windows(2).find(|w| w[0].1 > w[1].1) {
                return Err(format!(
                    "from {rank}: message {} matched post {}, message {} the earlier post {}",
                    w[0].0, w[0].1, w[1].0, w[1].1
                ));
            }
        }
        Ok(())
    }
}

fn fatal(why: &str) -> ! {
    println!("fail {why}");
    eprintln!("fabric-peer: {why}");
    std::process::exit(2)
}

impl Peer {
    fn run(&mut self, line: &str) -> CmdResult {
        let mut words = line.split_whitespace();
        let Some(command) = words.next() else {
            return Ok(String::new());
        };
        let a = Args::parse(words);
        match command {
            "insert" => {
                let addr = a.pos.first().ok_or("address missing")?;
                self.obj
                    .av
                    .insert(addr)
                    .map(|f| f.to_string())
                    .map_err(|c| format!("fi_av_insert: {c}"))
            }
            "send" => self.send(&a),
            "inject" => self.inject(&a),
            "recv" => self.post_recv(&a, false, false),
            "try-recv" => self.post_recv(&a, false, true),
            "multi-recv" => self.post_recv(&a, true, false),
            "min-multi" => {
                let min = a.num(0)? as usize;
                self.obj
                    .ep
                    .set_min_multi_recv(min)
                    .map_err(|c| format!("fi_setopt: {c}"))?;
                let got = self
                    .obj
                    .ep
                    .min_multi_recv()
                    .map_err(|c| format!("fi_getopt: {c}"))?;
                Ok(got.to_string())
            }
            "cancel" => Ok(self.obj.ep.cancel(a.num(0)? as usize).to_string()),
            "progress" => {
                for _ in 0..4 {
                    self.poll();
                }
                Ok(String::new())
            }
            "wait" => self.wait(&a),
            "quiet" => self.quiet(&a),
            "pending" => Ok(QUEUES
                .iter()
                .zip(self.queue_lens())
                .map(|(name, n)| format!("{name}={n}"))
                .collect::<Vec<_>>()
                .join(" ")),
            "mr" => self.mr_reg(&a),
            "unreg" => self.unreg(&a),
            "fill-mr" => self.fill_mr(&a),
            "check-mr" => self.check_mr(&a),
            "mr-sum" => self.mr_sum(&a),
            "watch" => {
                self.watch = Some((a.num(0)?, a.num(1)? as usize, a.num(2)? as usize));
                Ok(String::new())
            }
            "write" => self.rma_write(&a),
            "read" => self.rma_read(&a),
            "cntr" => self.cntr_wait(&Args::parse(std::iter::empty())),
            "cntr-wait" => self.cntr_wait(&a),
            "sleep-no-progress" => self.sleep_no_progress(&a),
            "sread" => self.sread(&a),
            "cntr-sleep" => self.cntr_sleep(&a),
            "exhaust-fds" => self.exhaust_fds(&a),
            "churn" => self.churn(&a),
            "crash" => crash(&a),
            "exit-on-agent" => exit_on_agent(),
            "atomic" => self.atomic(&a),
            "atomic-wait" => self.atomic_wait(a.num(0)?),
            "valid" => self.valid(&a),
            "get" => self.get(&a),
            "set" => self.set(&a),
            "flag-wait" => self.flag_wait(&a),
            "fetch-add-loop" => self.fetch_add_loop(&a),
            "mr-cntr" => self.mr_cntr(&a),
            "rcntr" => self.rcntr_wait(&Args::parse(std::iter::empty())),
            "rcntr-wait" => self.rcntr_wait(&a),
            "try-send" => self.try_send(&a),
            "bad-send" => self.bad_send(&a),
            "limits" => Ok(format!(
                "inject={} max={}",
                self.obj.info.inject_size(),
                self.obj.info.max_msg_size()
            )),
            "getinfo" => self.getinfo(&a),
            "close-domain" => self.close_domain(),
            "disabled-ep" => self.disabled_ep(),
            "traffic" => self.traffic(&a),
            other => Err(format!("unknown command '{other}'")),
        }
    }
}

/// Lines of stdin, read by a thread so that the main loop can progress.
fn stdin_lines() -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn main() {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fabric-peer".into());
    let watchdog = env_secs("FABRIC_PEER_WATCHDOG", 150);
    let who = name.clone();
    std::thread::spawn(move || {
        std::thread::sleep(watchdog);
        eprintln!("{who}: watchdog: still running after {watchdog:?}; exiting");
        std::process::exit(124);
    });
    let api = fabric::api().unwrap_or_else(|e| fatal(&e));
    let obj = Objects::open(api).unwrap_or_else(|e| fatal(&e));
    let addr = obj
        .ep
        .name()
        .unwrap_or_else(|c| fatal(&format!("fi_getname: {c}")));
    println!("addr {addr}");
    let mut peer = Peer {
        api,
        obj,
        recv_bufs: HashMap::new(),
        released: Vec::new(),
        send_bufs: SendBufs::default(),
        sends: VecDeque::new(),
        recvs: VecDeque::new(),
        errors: VecDeque::new(),
        writes: VecDeque::new(),
        reads: VecDeque::new(),
        remote: VecDeque::new(),
        write_bufs: SendBufs::default(),
        read_bufs: HashMap::new(),
        watch: None,
        atomic_done: HashMap::new(),
        atomic_bufs: HashMap::new(),
        traffic: Vec::new(),
        wait_limit: env_secs("FABRIC_PEER_WAIT", 30),
        commands: stdin_lines(),
    };
    loop {
        let line = match peer.commands.try_recv() {
            Ok(line) => line,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // Idle: keep the endpoint progressing for the others.
                if peer.poll() {
                    continue;
                }
                match peer.commands.recv_timeout(Duration::from_millis(1)) {
                    Ok(line) => line,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        };
        match peer.run(&line) {
            Ok(result) if result.is_empty() => println!("ok"),
            Ok(result) => println!("ok {result}"),
            Err(why) => println!("fail {why}"),
        }
    }
    let Peer {
        obj,
        recv_bufs,
        released,
        send_bufs,
        write_bufs,
        read_bufs,
        atomic_bufs,
        ..
    } = peer;
    // Close first: the provider may still hold the buffers.
    if let Err(why) = obj.close() {
        fatal(&why);
    }
    drop((
        recv_bufs,
        released,
        send_bufs,
        write_bufs,
        read_bufs,
        atomic_bufs,
    ));
    println!("closed");
}

/// `crash <how>`: dies at once of a fatal signal, as a real crash does:
/// `segv` (a store to address 0), `bus` (a touch of a mapped file past its
/// truncated end), `abrt` (abort), `fpe` (an integer division by zero),
/// `ill` (an undefined instruction), or `bus-sent`, `term`, `int`, `quit`
/// (raised: no access to retry).
fn crash(a: &Args) -> CmdResult {
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
fn exit_on_agent() -> CmdResult {
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
