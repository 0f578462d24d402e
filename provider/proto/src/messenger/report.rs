//! What a messenger has in flight, said when nothing has moved for long: a
//! job that hangs tells, in its log, what each process waits for.
//!
//! Owns nothing; reads every table.

use std::fmt::Write as _;
use std::hash::Hash;

use unimem_dma::DmaEngine;
use unimem_mailbox::Mailbox;

use super::send::{EagerState, TxClass, TxKind};
use super::Messenger;
use crate::WireNode;

/// Operations and peers named one by one; beyond, only counted.
const LISTED: usize = 8;

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode<M::Addr>,
{
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
