//! What a messenger carried ([`Stats`], for the log when it closes) and
//! what it has in flight, said when nothing has moved for long: a job that
//! hangs tells, in its log, what each process waits for (and the fuzz
//! harness, what a hang waited for).
//!
//! Owns nothing; reads every table.

use std::fmt::Write as _;

use super::send::{EagerState, TxClass, TxKind};
use super::{Backend, Messenger};

/// Operations and peers named one by one; beyond, only counted.
const LISTED: usize = 8;

/// What a messenger carried, for the log: messages, and which path its RMA
/// and atomic operations took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sends completed.
    pub sends: u64,
    /// Receives completed with their data.
    pub receives: u64,
    /// RMA and atomics moved by DMA (or the atomic unit) with no action of
    /// the target.
    pub one_sided: u64,
    /// Of the one-sided ones, those done inside their call by loads and
    /// stores (the direct path of small operations).
    pub direct: u64,
    /// Carried out by the target's progress (target memory not dmable).
    pub assisted: u64,
    /// Eager messages whose data we stored into the receiver's slot with
    /// the CPU (a peer of this host), not put by DMA.
    pub stored: u64,
    /// Of both, atomics.
    pub atomics: u64,
    /// Notices of one-sided accesses sent to targets whose key counts them
    /// (`FI_RMA_EVENT`).
    pub notices: u64,
    /// Rendezvous receives whose data we read from the sender's offered
    /// buffer (the receiver waited), not granted to the sender.
    pub pulls: u64,
    /// Transfers of the domain's engine copied by its own thread while
    /// their submitter went on (filled in by [`Messenger::stats`]).
    pub moved_async: u64,
    /// Most unexpected message data held from one sender at once (bytes,
    /// with the per-message overhead).
    pub unexpected_peak: usize,
    /// Times a sender was asked to throttle (it held too much of that).
    pub throttles: u64,
    /// The domain's registration cache: lookups served and not, and
    /// registrations found stale (their owner freed the memory since) and
    /// made again (filled in by [`Messenger::stats`]).
    pub regcache_hits: u64,
    pub regcache_misses: u64,
    pub stale_registrations: u64,
    /// Peers met so far (each made on first contact), and the dmable
    /// memory set aside: the eager rings of those peers, and the
    /// endpoint's own buffers (bounce and staging), whatever the peers.
    pub peers: usize,
    pub ring_bytes: usize,
    pub buffer_bytes: usize,
}

impl<B: Backend> Messenger<B> {
    /// What the messenger carried so far.
    pub fn stats(&self) -> Stats {
        let domain = self.dma.domain();
        let cache = domain.regcache_stats();
        Stats {
            regcache_hits: cache.hits,
            regcache_misses: cache.misses,
            stale_registrations: domain.stale_registrations(),
            moved_async: domain.moved_async(),
            peers: self.peers.len(),
            ring_bytes: self
                .peers
                .iter()
                .filter_map(|p| p.rx.as_ref())
                .map(|rx| rx.memory.len())
                .sum(),
            buffer_bytes: self.bounce_pool.memory_len()
                + self.tx_staging.memory_len()
                + self.rx_staging.memory_len(),
            ..self.stats
        }
    }

    /// What waits for what inside, for the fuzz harness's failure reports.
    #[doc(hidden)]
    pub fn debug_state(&self) -> String {
        let peers: Vec<String> = self
            .peers
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.dead)
            .map(|(i, p)| {
                format!(
                    "peer {i}: ids {} staging {} reads {} atomics {} control {} data {} throttled {} throttling {} tx credits {:?}",
                    p.rx_ids,
                    p.staging_held,
                    p.reads_served,
                    p.atomics_pending,
                    p.control.len(),
                    p.data.len(),
                    p.throttled,
                    p.throttling,
                    p.tx.as_ref().map(|t| t.credits)
                )
            })
            .collect();
        // The transfers (the first hundred), with their peer's state.
        let xfers: Vec<String> = self
            .rx_xfers
            .ids_where(|_| true)
            .into_iter()
            .take(100)
            .filter_map(|id| self.rx_xfers.get(id).map(|x| (id, x)))
            .map(|(id, x)| {
                format!(
                    "{id}: peer {}{} {:?} sid {} granted/done/all {}/{}/{} direct {}",
                    x.peer,
                    if self.peers[x.peer].dead {
                        " (dead)"
                    } else {
                        ""
                    },
                    x.purpose,
                    x.send_id,
                    x.next_grant,
                    x.done,
                    x.fragments,
                    x.direct
                )
            })
            .collect();
        format!(
            "xfers [{}] sends {} rx_xfers {} backlog {} deferred grants {:?} deferred fragments {} deferred reads {} rma pending {} staging rx {} tx {} dma waiters {}; {}",
            xfers.join(", "),
            self.outstanding_sends,
            self.rx_xfers.len(),
            self.rx_backlog.len(),
            self.deferred_grants,
            self.deferred_fragments.len(),
            self.deferred_reads.len(),
            self.rma_pending.len(),
            self.rx_staging.available(),
            self.tx_staging.available(),
            self.dma_waiters.len(),
            peers.join("; ")
        )
    }

    /// What is in flight, if anything: counts of every table, then the
    /// first sends, rendezvous receives and busy peers one by one.
    pub fn in_flight(&self) -> Option<String> {
        let posted = self.matcher.posted_len();
        let busy_peers: Vec<usize> = (0..self.peers.len())
            .filter(|&i| {
                let p = &self.peers[i];
                !p.control.is_empty() || !p.data.is_empty() || p.throttled || p.rx_ids > 0
            })
            .collect();
        let nothing = self.tx_ops.is_empty()
            && self.rx_xfers.is_empty()
            && self.rx_backlog.is_empty()
            && self.rma_ops.is_empty()
            && self.dma_waiters.is_empty()
            && self.deferred_grants.is_empty()
            && self.deferred_fragments.is_empty()
            && self.deferred_reads.is_empty()
            && self.atomic_rx.is_empty()
            && busy_peers.is_empty()
            && posted == 0
            && self.matcher.unexpected_len() == 0;
        if nothing {
            return None;
        }
        let mut out = String::new();
        let _ = write!(
            out,
            "{} sends, {} rendezvous receives ({} waiting for an id), {} RMA operations ({} waiting), {} DMA transfers, {} events not reported; {} receives posted, {} unexpected messages held; deferred: {} grants, {} fragments, {} reads; {} atomics being applied; {} peers",
            self.tx_ops.len(),
            self.rx_xfers.len(),
            self.rx_backlog.len(),
            self.rma_ops.len(),
            self.rma_pending.len(),
            self.dma_waiters.len(),
            self.events.len(),
            posted,
            self.matcher.unexpected_len(),
            self.deferred_grants.len(),
            self.deferred_fragments.len(),
            self.deferred_reads.len(),
            self.atomic_rx.len(),
            self.peers.len(),
        );
        for id in self.tx_ops.ids_where(|_| true).into_iter().take(LISTED) {
            let op = self.tx_ops.get(id).expect("listed above");
            let kind = match &op.kind {
                TxKind::Inline => "inline",
                TxKind::Eager(EagerState::Waiting(_)) => "eager, waiting for a slot",
                TxKind::Eager(EagerState::InFlight(_)) => "eager, copy in flight",
                TxKind::Eager(EagerState::Done) => "eager, waiting for its Fin",
                TxKind::Rendezvous(_) => "rendezvous",
            };
            let class = match op.class {
                TxClass::Msg => "message",
                TxClass::Write { .. } => "RMA write",
                TxClass::ReadResponse { .. } => "answer to a read",
            };
            let _ = write!(
                out,
                "; send {id}: {class} of {} B to {}, {kind}{}",
                op.len,
                self.peers[op.peer].addr,
                if op.ack { ", delivery complete" } else { "" }
            );
        }
        for id in self.rx_xfers.ids_where(|_| true).into_iter().take(LISTED) {
            let x = self.rx_xfers.get(id).expect("listed above");
            let _ = write!(
                out,
                "; receive {id}: {} B from {} (its send {}), fragments {} granted {} done {}{}",
                x.msg_len,
                self.peers[x.peer].addr,
                x.send_id,
                x.fragments,
                x.next_grant,
                x.done,
                if x.offer.is_some() {
                    ", reading its offer"
                } else {
                    ""
                }
            );
        }
        for &i in busy_peers.iter().take(LISTED) {
            let p = &self.peers[i];
            let _ = write!(
                out,
                "; peer {}: {} control and {} data messages queued{}{}, {} of its sends being received{}",
                p.addr,
                p.control.len(),
                p.data.len(),
                if p.throttled { ", throttled" } else { "" },
                if p.hello_sent && !p.hello_received { ", no Hello from it yet" } else { "" },
                p.rx_ids,
                if p.dead { ", dead" } else { "" },
            );
        }
        Some(out)
    }
}
