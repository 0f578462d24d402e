//! The rendezvous send side: the request to send leaves with the data
//! queue; then each grant of the receiver is answered by putting that
//! fragment (straight from the user buffer when it is dmable, else through a
//! staging buffer), and reported once its DMA completes. The receiver's FIN
//! completes the send.
//!
//! Owns: `deferred_fragments` (grants waiting for a staging buffer) and the
//! send-side staging pool. Registers the receiver's ranges through the
//! domain's registration cache ([`DmaSession::cached_registration`]).
//!
//! [`DmaSession::cached_registration`]: crate::dma::DmaSession::cached_registration

use unimem_dma::DmaError;

use super::super::{Backend, Messenger, PeerIdx};
use super::{Payload, TxKind, Waiter};
use crate::iov::gather;
use crate::matching::IovList;

/// A grant received for a rendezvous send.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grant {
    pub(crate) op: usize,
    pub(crate) fragment: u32,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) recv_id: u16,
    pub(crate) recv_gen: u16,
    /// The receiver's grant token of the range (see
    /// [`DmaEngine::grant_token`]).
    pub(crate) token: u16,
}

impl<B: Backend> Messenger<B> {
    /// Puts one granted fragment; false if no staging buffer is free.
    pub(crate) fn put_fragment(&mut self, grant: Grant) -> bool {
        let Some(tx) = self.tx_ops.get(grant.op) else {
            tracing::warn!(op = grant.op, "grant for an unknown send");
            return true;
        };
        let fragment_size = self.peers[tx.peer].fragment_size;
        let TxKind::Rendezvous(payload) = &tx.kind else {
            tracing::warn!(op = grant.op, "grant for a send that is not a rendezvous");
            return true;
        };
        // An eager send gone this way reads from its bounce buffer or copy.
        let one;
        let iov = match payload {
            Payload::User(iov) => iov,
            Payload::Bounce(bounce) => {
                one = IovList::One((self.bounce_pool.addr(*bounce) as usize, tx.len));
                &one
            }
            Payload::Copy(bytes) => {
                one = IovList::One((bytes.as_ptr() as usize, bytes.len()));
                &one
            }
        };
        let offset = grant.fragment as usize * fragment_size;
        let len = grant.len.min(tx.len.saturating_sub(offset));
        let peer = tx.peer;
        let Some(node) = self.peers[peer].node else {
            tracing::warn!(peer, "grant from a peer that never said hello");
            return true;
        };
        let direct = iov.len() == 1
            && self
                .dma
                .is_dmable((iov[0].0 + offset) as *const u8, len.max(1));
        if grant.fragment == 0 {
            tracing::debug!(
                len = tx.len,
                "rendezvous send {}",
                if direct {
                    "direct: from the dmable send buffer"
                } else {
                    "staged: through staging buffers"
                }
            );
        }
        let (src, staging) = if direct {
            ((iov[0].0 + offset) as *const u8, None)
        } else {
            let Some(staging) = self.tx_staging.get() else {
                return false;
            };
            let at = self.tx_staging.addr(staging);
            // SAFETY: the send's iov is valid until it completes; the staging buffer
            // holds fragment_size >= len bytes.
            unsafe { gather(iov, offset, at, len) };
            (at as *const u8, Some(staging))
        };
        let waiter = Waiter::Fragment {
            op: grant.op,
            peer,
            fragment: grant.fragment,
            recv_id: grant.recv_id,
            recv_gen: grant.recv_gen,
            staging,
        };
        let result = self.submit_granted(
            (node, grant.addr, len),
            |dma, reg, token| dma.put_granted(src, len, reg, grant.addr, grant.token, token),
            waiter,
        );
        if let Err(e) = result {
            if let Some(staging) = staging {
                self.tx_staging.put(staging);
            }
            if matches!(e, DmaError::Revoked) {
                // The receiver freed the memory it granted: its receive is
                // gone (its endpoint closed), or it breaks the protocol.
                // Nothing lands there either way.
                self.drop_invalid(peer, "grant of memory its owner has freed since");
            } else {
                tracing::warn!(%node, "fragment DMA refused: {e}");
            }
            self.fail_peer(peer);
        }
        true
    }

    /// A grant from `peer` arrived: put its fragment now, unless grants
    /// that came before it still wait for a staging buffer (they go first).
    /// Only a grant of a fragment of one of our rendezvous sends to that
    /// peer is acted upon.
    pub(crate) fn on_grant(&mut self, peer: PeerIdx, grant: Grant) {
        let fragment_size = self.peers[peer].fragment_size;
        let fits = self.tx_ops.get(grant.op).is_some_and(|tx| {
            tx.peer == peer
                && matches!(tx.kind, TxKind::Rendezvous(_))
                && (grant.fragment as usize)
                    .checked_mul(fragment_size)
                    .is_some_and(|offset| offset < tx.len)
                && grant.len <= fragment_size
        });
        if !fits {
            self.drop_invalid(peer, "grant that fits none of our sends to it");
            return;
        }
        if !self.deferred_fragments.is_empty() || !self.put_fragment(grant) {
            self.deferred_fragments.push_back(grant);
        }
    }
}
