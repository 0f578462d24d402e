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
//! | `remove <fi_addr>` | `fi_av_remove` of that entry |
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
//!
//! The commands live in modules by family: [`messages`] (completions,
//! posting, waiting), [`rma`] (regions, RMA, counters), [`atomic`],
//! [`traffic`], [`bad_input`] and [`faults`]; [`objects`] holds the
//! process's libfabric objects and the buffers in flight, [`args`] a
//! command's words. This file keeps the process's state ([`Peer`]), the
//! command table (`Peer::run`) and the main loop.

mod args;
mod atomic;
mod bad_input;
mod faults;
mod messages;
mod objects;
mod rma;
mod traffic;

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use unimem_tests::cluster::Completion;
use unimem_tests::fabric::{self, Api, CqEntry, CqError};

use args::Args;
use faults::{crash, exit_on_agent};
use objects::{AtomicBuf, Objects, ReadBuf, RecvBuf, SendBufs};

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
            "remove" => self
                .obj
                .av
                .remove(a.num(0)?)
                .map(|()| String::new())
                .map_err(|c| format!("fi_av_remove: {c}")),
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
