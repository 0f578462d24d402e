//! The rendezvous receive side: once a request to send is matched, the
//! receiver grants fragments a window at a time (into staging buffers, or
//! straight into a dmable, contiguous receive buffer), copies each staged
//! fragment out when the sender reports it, and ends with a FIN.
//!
//! Or it reads the message itself, when the sender offered its buffer
//! (`Offer`) and the receiver matches the request while it polls: a
//! process that polls waits, and its CPU is the one to copy with, while the
//! sender, which posted and went on, computes (what a DMA engine would
//! give both). A request matched by a post, or by the progress agent
//! while the application computes, is granted as above: the sender copies.
//!
//! Owns: `rx_xfers` (transfers in progress, addressed by `recv_id`),
//! `deferred_grants` (transfers waiting for a staging buffer) and the
//! receive-side staging pool.

use std::collections::{HashMap, VecDeque};

use unimem_dma::DmaError;

use super::super::send::Waiter;
use super::super::{Addr, Backend, Messenger, PeerIdx};
use super::Held;
use crate::iov::scatter;
use crate::matching::{Placement, Unexpected};
use crate::pool::Buffer;
use crate::wire::{MatchInfo, Wire};
use crate::{AccessCounts, ErrorKind, Event, RmaKind};

/// What a transfer in `rx_xfers` fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XferPurpose {
    /// A matched receive.
    Recv,
    /// A peer's write into a range of ours that is not dmable; with the key
    /// to report it under when the key counts accesses.
    RmaWrite { notice: Option<u64> },
    /// Our read of a peer's range that is not dmable.
    RmaRead,
}

/// The send id of a read whose target has not named its send yet.
pub(crate) const NO_SEND_ID: u16 = u16::MAX;

/// A rendezvous receive in progress.
pub(crate) struct RxXfer<A> {
    pub(crate) purpose: XferPurpose,
    pub(crate) peer: PeerIdx,
    pub(crate) src: A,
    pub(crate) send_id: u16,
    pub(crate) info: MatchInfo,
    pub(crate) placement: Placement,
    pub(crate) msg_len: usize,
    pub(crate) xfer_len: usize,
    pub(crate) fragments: u32,
    pub(crate) next_grant: u32,
    pub(crate) done: u32,
    /// Granting straight into the (dmable, contiguous) user buffer.
    pub(crate) direct: bool,
    /// The sender's offer (address, token) this transfer reads, when it
    /// does: taken when it starts.
    pub(crate) offer: Option<(u64, u16)>,
    pub(crate) staged: HashMap<u32, Buffer>,
    /// Fragments granted and not reported done yet (a window's worth): a
    /// report of any other is not the sender's to make.
    pub(crate) outstanding: Vec<u32>,
}

impl<B: Backend> Messenger<B> {
    /// Starts receive `placement` of `peer`'s send `send_id`, reading it
    /// from `offer` (the sender's buffer) if it can.
    pub(crate) fn start_rx_xfer(
        &mut self,
        peer: PeerIdx,
        src: Addr<B>,
        (send_id, offer): (u16, Option<(u64, u16)>),
        info: MatchInfo,
        msg_len: usize,
        placement: Placement,
    ) {
        if self.peers[peer].dead {
            // Its request arrived before it died; its data never will.
            self.complete_recv_error(placement, Some(src), info, 0, ErrorKind::PeerUnreachable);
            return;
        }
        let xfer_len = msg_len.min(placement.capacity());
        let (fragments, direct) = self.xfer_shape(peer, &placement.iov, xfer_len);
        // Read into the receive buffer itself: one piece of our dmable
        // memory.
        let offer = offer.filter(|_| {
            xfer_len > 0
                && placement.iov.len() == 1
                && self
                    .dma
                    .is_dmable(placement.iov[0].0 as *const u8, xfer_len)
        });
        tracing::debug!(
            len = xfer_len,
            "rendezvous receive {}",
            if direct {
                "direct: into the dmable receive buffer"
            } else {
                "staged: through staging buffers"
            }
        );
        self.insert_rx_xfer(RxXfer {
            purpose: XferPurpose::Recv,
            peer,
            src,
            send_id,
            info,
            placement,
            msg_len,
            xfer_len,
            fragments,
            next_grant: 0,
            done: 0,
            direct,
            offer,
            staged: HashMap::new(),
            outstanding: Vec::new(),
        });
    }

    /// Ids the peers' transfers may hold at once, all together: all but
    /// those kept for our own reads (at most `tx_size` of them, up to half
    /// the ids).
    pub(crate) fn peer_xfer_limit(&self) -> usize {
        self.rx_id_limit - self.cfg.tx_size.min(self.rx_id_limit / 2)
    }

    /// Ids one peer's transfers may hold at once: three quarters of those,
    /// so that a peer that starts transfers and never ends them (its
    /// writes to a key of ours, say) cannot stall everyone else's.
    pub(crate) fn per_peer_xfer_limit(&self) -> usize {
        let all = self.peer_xfer_limit();
        (all - all / 4).max(1)
    }

    /// Whether a transfer of `peer` may take an id now.
    fn xfer_id_free(&self, peer: PeerIdx) -> bool {
        self.rx_xfers.len() < self.peer_xfer_limit()
            && self.peers[peer].rx_ids < self.per_peer_xfer_limit()
    }

    /// Starts granting transfer `xfer` (once its sender is known), or
    /// finishes it at once when it moves no byte. Returns its id.
    ///
    /// A transfer a peer started (not our read) waits, behind the earlier
    /// ones of that peer, while the peers' transfers hold all the ids they
    /// may, or its peer's hold its share: an id is never reused while in
    /// use (ids are 16 bits on the wire). It then has no id yet, and
    /// `usize::MAX` is returned.
    pub(crate) fn insert_rx_xfer(&mut self, xfer: RxXfer<Addr<B>>) -> usize {
        if xfer.purpose != XferPurpose::RmaRead
            && (!self.xfer_id_free(xfer.peer)
                || self.rx_backlog.iter().any(|w| w.peer == xfer.peer))
        {
            self.rx_backlog.push_back(xfer);
            return usize::MAX;
        }
        self.start_xfer_now(xfer)
    }

    /// [`Self::insert_rx_xfer`] once `xfer` may have an id.
    fn start_xfer_now(&mut self, xfer: RxXfer<Addr<B>>) -> usize {
        let (empty, waits) = (xfer.fragments == 0, xfer.send_id == NO_SEND_ID);
        if xfer.purpose != XferPurpose::RmaRead {
            self.peers[xfer.peer].rx_ids += 1;
        }
        let id = self.rx_xfers.insert(xfer);
        debug_assert!(id < self.rx_id_limit);
        if waits {
            return id;
        }
        if empty {
            self.finish_rx(id);
        } else if !self.pull(id) {
            self.continue_granting(id);
        }
        id
    }

    /// Reads transfer `id` from the buffer its sender offered, if it holds
    /// an offer and the engine takes it (the sender's memory, checked
    /// against the offer's token); false, nothing read and the offer
    /// dropped, if not: it is then granted as any other.
    fn pull(&mut self, id: usize) -> bool {
        let gen = self.rx_xfers.generation(id);
        let Some(xfer) = self.rx_xfers.get_mut(id) else {
            return false;
        };
        let Some((addr, offer)) = xfer.offer.take() else {
            return false;
        };
        let Some(node) = self.peers[xfer.peer].node else {
            return false;
        };
        let (local, len) = (xfer.placement.iov[0].0 as *mut u8, xfer.xfer_len);
        // Nothing left to grant: it ends when the read completes (set
        // before the read, whose completion may be acted on at once).
        let fragments = std::mem::replace(&mut xfer.next_grant, xfer.fragments);
        // A sender on another host: its memory is not one load away.
        let result = if self.dma.lock().loads_reach(node) {
            self.submit_granted(
                (node, addr, len),
                |dma, reg, token| dma.get_granted(local, len, reg, addr, offer, token),
                Waiter::Pull { id, gen },
            )
        } else {
            Err(DmaError::NoLoadStore)
        };
        if let Err(e) = result {
            tracing::debug!(%node, addr, len, "offer not read ({e}): granted instead");
            if let Some(xfer) = self.rx_xfers.get_mut(id) {
                xfer.next_grant = fragments;
            }
            return false;
        }
        self.stats.pulls += 1;
        true
    }

    /// The read of transfer `id` (of generation `gen`) completed: the
    /// message is here, unless the transfer ended meanwhile (its peer
    /// died).
    pub(crate) fn on_pulled(&mut self, id: usize, gen: u16) {
        if self.rx_xfers.generation(id) == gen && self.rx_xfers.get(id).is_some() {
            self.finish_rx(id);
        }
    }

    /// Fragments of `len` bytes from `peer`, and whether `iov` can take
    /// them directly.
    pub(crate) fn xfer_shape(
        &self,
        peer: PeerIdx,
        iov: &crate::matching::IovList,
        len: usize,
    ) -> (u32, bool) {
        let fragments = len.div_ceil(self.peers[peer].fragment_size) as u32;
        // In place only where a grant holds until the data lands.
        let direct = iov.len() == 1
            && self
                .dma
                .grant_token(iov[0].0 as *const u8, len.max(1))
                .is_some();
        (fragments, direct)
    }

    /// Whether transfer `id` exists and may be granted another fragment:
    /// some are left and its window is not full.
    pub(crate) fn wants_grant(&self, id: usize) -> bool {
        let window = self.cfg.rendezvous_window.max(1) as u32;
        self.rx_xfers.get(id).is_some_and(|x| {
            x.send_id != NO_SEND_ID && x.next_grant < x.fragments && x.next_grant - x.done < window
        })
    }

    /// Staging buffers one peer's transfers may hold at once: three
    /// quarters of them, and never the last one (unless there is only
    /// one), so that a peer that is granted fragments and never puts them
    /// cannot hold every staging buffer, and stall every staged transfer
    /// of the others.
    pub(crate) fn per_peer_staging(&self) -> usize {
        let all = self.cfg.staging_buffers.max(1);
        (all - (all / 4).max(1)).max(1)
    }

    /// Whether transfer `id` wants a grant that would take a staging buffer
    /// its peer's share allows.
    fn may_stage(&self, id: usize) -> bool {
        self.wants_grant(id)
            && self.rx_xfers.get(id).is_some_and(|x| {
                !x.direct && self.peers[x.peer].staging_held < self.per_peer_staging()
            })
    }

    /// Grants fragments of transfer `id` up to its window. Transfers waiting
    /// for staging buffers are served in turn: a staged transfer queues
    /// behind those waiting that their peers' shares allow (once: a queued
    /// transfer is granted up to its window when its turn comes). A direct
    /// one needs no staging buffer, and never waits.
    pub(crate) fn continue_granting(&mut self, id: usize) {
        while self.wants_grant(id) {
            let staged = self.rx_xfers.get(id).is_some_and(|x| !x.direct);
            let queued = self.deferred_grants.iter().position(|&d| d == id);
            let ahead = queued.unwrap_or(self.deferred_grants.len());
            let behind = staged
                && self
                    .deferred_grants
                    .iter()
                    .take(ahead)
                    .any(|&d| self.may_stage(d));
            if behind || !self.grant_next(id) {
                if queued.is_none() {
                    self.deferred_grants.push_back(id);
                }
                return;
            }
        }
    }

    /// Grants the next fragment of `id` (which [`Self::wants_grant`]); false
    /// if no staging buffer is free, or its peer holds its share of them.
    pub(crate) fn grant_next(&mut self, id: usize) -> bool {
        let share = self.per_peer_staging();
        let Some(xfer) = self.rx_xfers.get_mut(id) else {
            return true;
        };
        let fragment_size = self.peers[xfer.peer].fragment_size;
        let fragment = xfer.next_grant;
        let offset = fragment as usize * fragment_size;
        let len = fragment_size.min(xfer.xfer_len - offset);
        let addr = if xfer.direct {
            (xfer.placement.iov[0].0 + offset) as u64
        } else {
            if self.peers[xfer.peer].staging_held >= share {
                return false;
            }
            let Some(staging) = self.rx_staging.get() else {
                return false;
            };
            self.peers[xfer.peer].staging_held += 1;
            xfer.staged.insert(fragment, staging);
            self.rx_staging.addr(staging) as u64
        };
        xfer.next_grant += 1;
        xfer.outstanding.push(fragment);
        let (peer, send_id) = (xfer.peer, xfer.send_id);
        // What the range's generations are now: the sender's put is refused
        // if this memory is freed before it lands (gens.rs in unimem-dma).
        let token = self
            .dma
            .grant_token(addr as *const u8, len)
            .unwrap_or_else(|| {
                debug_assert!(false, "a granted range is dmable memory of ours");
                0
            });
        let grant = Wire::Grant {
            send_id,
            fragment,
            addr,
            len: len as u32,
            recv_id: id as u16,
            recv_gen: self.rx_xfers.generation(id),
            token,
        };
        self.queue_control(peer, grant.encode());
        true
    }

    /// `peer` reports fragment `fragment` of its send `send_id` to our
    /// transfer `id` (of generation `gen`) in place; only a fragment we
    /// granted it counts: a late report for an earlier holder of the id
    /// is told apart by its generation.
    pub(crate) fn on_fragment_done(
        &mut self,
        peer: PeerIdx,
        send_id: u16,
        id: usize,
        gen: u16,
        fragment: u32,
    ) {
        let fragment_size = self.peers[peer].fragment_size;
        let current = self.rx_xfers.generation(id) == gen;
        let granted = self.rx_xfers.get(id).and_then(|x| {
            (current && x.peer == peer && x.send_id == send_id)
                .then(|| x.outstanding.iter().position(|&f| f == fragment))
                .flatten()
        });
        let Some(at) = granted else {
            self.drop_invalid(peer, "report of a fragment that was not granted to it");
            return;
        };
        let xfer = self.rx_xfers.get_mut(id).expect("checked above");
        xfer.outstanding.swap_remove(at);
        if let Some(staging) = xfer.staged.remove(&fragment) {
            let offset = fragment as usize * fragment_size;
            let len = fragment_size.min(xfer.xfer_len - offset);
            // SAFETY: the staging buffer holds the fragment (its DMA completed
            // before the sender reported it); the iov is the posted buffer.
            unsafe {
                scatter(
                    &xfer.placement.iov,
                    offset,
                    self.rx_staging.addr(staging),
                    len,
                )
            };
            self.rx_staging.put(staging);
            self.peers[peer].staging_held -= 1;
        }
        xfer.done += 1;
        if xfer.done == xfer.fragments {
            self.finish_rx(id);
        } else {
            self.continue_granting(id);
        }
    }

    pub(crate) fn finish_rx(&mut self, id: usize) {
        let xfer = self.rx_xfers.remove(id).expect("transfer exists");
        if xfer.purpose != XferPurpose::RmaRead {
            self.peers[xfer.peer].rx_ids -= 1;
        }
        self.deferred_grants.retain(|&d| d != id);
        self.queue_control(
            xfer.peer,
            Wire::Fin {
                send_id: xfer.send_id,
            }
            .encode(),
        );
        match xfer.purpose {
            XferPurpose::Recv => self.complete_recv(
                xfer.placement,
                xfer.src,
                xfer.info,
                xfer.msg_len,
                xfer.xfer_len,
            ),
            XferPurpose::RmaWrite { notice } => {
                if let Some(key) = notice {
                    self.events
                        .push_back(Event::RemoteAccess(AccessCounts::one(key, false, true)));
                }
            }
            XferPurpose::RmaRead => {
                self.outstanding_sends -= 1;
                self.report_rma(
                    xfer.placement.context,
                    RmaKind::Read,
                    xfer.placement.completion,
                );
            }
        }
    }

    /// Reports a transfer that ends without its data (its staging buffers
    /// already released).
    pub(crate) fn fail_xfer(&mut self, xfer: RxXfer<Addr<B>>, kind: ErrorKind) {
        match xfer.purpose {
            XferPurpose::Recv => {
                self.complete_recv_error(xfer.placement, Some(xfer.src), xfer.info, 0, kind)
            }
            XferPurpose::RmaWrite { .. } => {}
            XferPurpose::RmaRead => {
                self.outstanding_sends -= 1;
                self.events.push_back(Event::RmaError {
                    context: xfer.placement.context,
                    kind: RmaKind::Read,
                    error: kind,
                });
            }
        }
    }

    /// Starts the transfers that waited for an id, as far as ids allow,
    /// each peer's in order: one peer at its share does not hold back
    /// another's.
    pub(crate) fn start_backlog(&mut self) {
        let mut waiting = std::mem::take(&mut self.rx_backlog);
        let mut held: Vec<PeerIdx> = Vec::new();
        let mut kept = VecDeque::with_capacity(waiting.len());
        while let Some(xfer) = waiting.pop_front() {
            if self.rx_xfers.len() >= self.peer_xfer_limit() {
                kept.push_back(xfer);
                kept.append(&mut waiting);
                break;
            }
            if held.contains(&xfer.peer) || !self.xfer_id_free(xfer.peer) {
                if !held.contains(&xfer.peer) {
                    held.push(xfer.peer);
                }
                kept.push_back(xfer);
                continue;
            }
            self.start_xfer_now(xfer);
        }
        // Whatever queued meanwhile comes after what waited before.
        kept.append(&mut self.rx_backlog);
        self.rx_backlog = kept;
    }

    pub(crate) fn release_staged(&mut self, xfer: &RxXfer<Addr<B>>) {
        for &staging in xfer.staged.values() {
            self.rx_staging.put(staging);
        }
        self.peers[xfer.peer].staging_held -= xfer.staged.len();
    }

    /// A request to send from `peer`: the transfer starts when a receive
    /// matches it, now or later.
    pub(crate) fn on_rts(
        &mut self,
        peer: PeerIdx,
        src: Addr<B>,
        info: MatchInfo,
        send_id: u16,
        len: usize,
    ) {
        let offer = self.peers[peer]
            .offer
            .take()
            .filter(|&(id, ..)| id == send_id)
            .map(|(_, addr, token)| (addr, token));
        match self.matcher.match_arrival(&src, &info, len) {
            // Matched while we poll: read it if offered, unless the agent
            // polls for an application that computes.
            Some(placement) => {
                let offer = offer.filter(|_| !self.helping);
                self.start_rx_xfer(peer, src, (send_id, offer), info, len, placement)
            }
            None => self.matcher.push_unexpected(Unexpected {
                src,
                info,
                len,
                body: Held::Rts { peer, send_id },
                claimed_by: None,
            }),
        }
    }
}
