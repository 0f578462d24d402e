//! Inline sends: the whole message inside one mailbox message, sent at once
//! when nothing is queued ahead of it, else queued (encoded) behind it. The
//! mailbox-only hot path: no DMA, no lock, no allocation.
//!
//! Owns: nothing; it uses the peer's data queue and `tx_ops` when the
//! message has to wait.

use std::hash::Hash;

use unimem_dma::DmaEngine;
use unimem_mailbox::{Error as MailboxError, Mailbox};

use super::super::peers::DataItem;
use super::super::{post_error, Messenger, PeerIdx, SendReq};
use super::{TxClass, TxKind, TxOp};
use crate::iov::gather;
use crate::wire::{InlineBytes, Wire};
use crate::{Event, PostError, WireNode};

impl<M, D> Messenger<M, D>
where
    M: Mailbox,
    M::Addr: Hash,
    D: DmaEngine,
    D::Node: WireNode,
{
    pub(crate) fn send_inline(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<M::Addr>,
        len: usize,
    ) -> Result<(), PostError> {
        let mut bytes = [0u8; 24];
        // SAFETY: the iov is valid (caller of send); len fits the buffer.
        unsafe { gather(&req.iov, 0, bytes.as_mut_ptr(), len) };
        let message = Wire::Inline {
            info: req.info,
            payload: InlineBytes::new(&bytes[..len]),
        }
        .encode();
        let state = &self.peers[peer];
        if state.data.is_empty() {
            let route = state.route.as_ref().expect("live peers have a route");
            match self.mbx.send(route, &message) {
                Ok(()) => {
                    self.stats.sends += 1;
                    // An inject still counts (send counters), without a CQ entry.
                    self.events.push_back(Event::Send {
                        context: req.context,
                        tagged: req.info.tag.is_some(),
                        completion: req.completion && !req.inject,
                    });
                    return Ok(());
                }
                Err(MailboxError::Busy) => {}
                Err(e) => {
                    self.fail_peer(peer);
                    return Err(post_error(e));
                }
            }
        }
        // Behind earlier data, or the peer's mailbox is full: queue it, in
        // order (the message is encoded: an inject's data is copied). Injects
        // too get an op: they complete (and count) when they leave.
        self.outstanding_sends += 1;
        let op = self.tx_ops.insert(TxOp {
            class: TxClass::Msg,
            peer,
            context: req.context,
            info: req.info,
            len,
            completion: req.completion && !req.inject,
            ack: false,
            kind: TxKind::Inline,
        });
        self.peers[peer]
            .data
            .push_back(DataItem::Inline { message, op });
        self.mark_active(peer);
        Ok(())
    }
}
