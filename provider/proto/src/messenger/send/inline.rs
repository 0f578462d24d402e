//! Inline sends: the whole message inside one mailbox message, or (a
//! little longer) in a few back to back (`Wire::InlineFirst` and
//! `Wire::InlineMore`), sent at once when nothing is queued ahead, else
//! queued (encoded) behind it. The mailbox-only hot path: no DMA, no lock,
//! no allocation.
//!
//! Owns: nothing; it uses the peer's data queue and `tx_ops` when the
//! message has to wait.

use unimem_mailbox::{Error as MailboxError, Mailbox, Message};

use super::super::peers::DataItem;
use super::super::{post_error, Addr, Backend, Messenger, PeerIdx, SendReq};
use super::{TxClass, TxKind, TxOp};
use crate::iov::gather;
use crate::wire::{InlineBytes, Wire, MAX_INLINE_PARTS, MAX_PARTED_LEN, MORE_LEN};
use crate::PostError;

impl<B: Backend> Messenger<B> {
    pub(crate) fn send_inline(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<Addr<B>>,
        len: usize,
    ) -> Result<(), PostError> {
        let mut payload = InlineBytes::zeroed(len);
        // SAFETY: the iov is valid (caller of send); len fits the payload.
        unsafe { gather(&req.iov, 0, payload.bytes_mut().as_mut_ptr(), len) };
        let message = Wire::encode_inline(&req.info, &payload);
        self.send_message(peer, req, len, &message)
    }

    /// Longest message that goes in parts with match information `info`.
    #[cfg(test)]
    pub(crate) fn parted_capacity(&self, info: &crate::wire::MatchInfo) -> usize {
        self.parted_after(crate::wire::inline_capacity(info))
    }

    /// [`Self::parted_capacity`] for a first message that carries `first`
    /// bytes (the match information's `inline_capacity`).
    pub(crate) fn parted_after(&self, first: usize) -> usize {
        first + self.cfg.inline_parts.saturating_sub(1) * MORE_LEN
    }

    /// Sends a message longer than one mailbox message and no longer than
    /// [`Self::parted_capacity`] in parts, the first carrying `first` bytes
    /// (`inline_capacity` of its match information).
    pub(crate) fn send_parted(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<Addr<B>>,
        len: usize,
        first: usize,
    ) -> Result<(), PostError> {
        let mut bytes = [0u8; MAX_PARTED_LEN];
        // SAFETY: the iov is valid (caller of send); len fits the buffer
        // (parted_capacity).
        unsafe { gather(&req.iov, 0, bytes.as_mut_ptr(), len) };
        let mut parts: [Message; MAX_INLINE_PARTS] = Default::default();
        parts[0] =
            Wire::encode_inline_first(&req.info, len as u8, &InlineBytes::new(&bytes[..first]));
        let mut count = 1;
        for chunk in bytes[first..len].chunks(MORE_LEN) {
            let mut payload = [0u8; MORE_LEN];
            payload[..chunk.len()].copy_from_slice(chunk);
            parts[count] = Wire::encode_inline_more(&payload);
            count += 1;
        }
        self.send_messages(peer, req, len, &parts[..count])
    }

    /// [`Self::send_messages`] of one message (every inline send, and every
    /// eager one stored at once): inlined where it is sent, no loop.
    #[inline(always)]
    pub(super) fn send_message(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<Addr<B>>,
        len: usize,
        message: &Message,
    ) -> Result<(), PostError> {
        let state = &self.peers[peer];
        if state.data.is_empty() {
            let route = state.route.as_ref().expect("live peers have a route");
            match self.mbx.send(route, message) {
                Ok(()) => {
                    self.report_sent_now(req);
                    return Ok(());
                }
                Err(MailboxError::Busy) => {}
                Err(e) => {
                    self.fail_peer(peer);
                    return Err(post_error(e));
                }
            }
        }
        self.queue_messages(peer, req, len, std::slice::from_ref(message));
        Ok(())
    }

    /// Sends `messages` (one send's, in order) at once as far as the
    /// mailbox takes them when nothing is queued ahead; the rest wait in
    /// the peer's data queue, the send completing when its last leaves.
    pub(super) fn send_messages(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<Addr<B>>,
        len: usize,
        messages: &[Message],
    ) -> Result<(), PostError> {
        let mut sent = 0;
        let state = &self.peers[peer];
        if state.data.is_empty() {
            let route = state.route.as_ref().expect("live peers have a route");
            while sent < messages.len() {
                match self.mbx.send(route, &messages[sent]) {
                    Ok(()) => sent += 1,
                    Err(MailboxError::Busy) => break,
                    Err(e) => {
                        self.fail_peer(peer);
                        return Err(post_error(e));
                    }
                }
            }
            if sent == messages.len() {
                self.report_sent_now(req);
                return Ok(());
            }
        }
        self.queue_messages(peer, req, len, &messages[sent..]);
        Ok(())
    }

    /// Reports a send whose messages all left within its call. An inject
    /// still counts (send counters), without a CQ entry.
    #[inline(always)]
    fn report_sent_now(&mut self, req: &SendReq<Addr<B>>) {
        let completion = req.completion && !req.inject;
        self.report_send(req.context, req.info.tag.is_some(), completion);
    }

    /// Behind earlier data, or the peer's mailbox is full: queues the rest
    /// of a send's `messages`, in order (encoded: an inject's data is
    /// copied). Injects too get an op: they complete (and count) when they
    /// leave. Out of line: the send that leaves at once does not carry it.
    #[inline(never)]
    fn queue_messages(
        &mut self,
        peer: PeerIdx,
        req: &SendReq<Addr<B>>,
        len: usize,
        messages: &[Message],
    ) {
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
        let (last, before) = messages.split_last().expect("a message is left");
        let queue = &mut self.peers[peer].data;
        queue.extend(before.iter().map(|&message| DataItem::Part { message }));
        queue.push_back(DataItem::Inline { message: *last, op });
        self.mark_active(peer);
    }
}
