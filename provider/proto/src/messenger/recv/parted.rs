//! Receiving a message sent in parts (`Wire::InlineFirst`, then
//! `Wire::InlineMore` until its length is reached): the parts of one
//! sender arrive in order, so a peer has at most one such message being
//! put together, delivered as an inline message once whole.
//!
//! Owns: each peer's `parted` (the message being put together).

use super::super::{Addr, Backend, Messenger, PeerIdx};
use crate::wire::{InlineBytes, MatchInfo, MAX_PARTED_LEN, MORE_LEN};

/// A message in parts, as far as it arrived.
pub(crate) struct Parted {
    info: MatchInfo,
    len: usize,
    have: usize,
    bytes: [u8; MAX_PARTED_LEN],
}

impl<B: Backend> Messenger<B> {
    /// The first part of a message of `len` bytes from `peer` (the wire
    /// checked `len` against what its parts can carry).
    pub(crate) fn on_inline_first(
        &mut self,
        peer: PeerIdx,
        info: MatchInfo,
        len: usize,
        first: &InlineBytes,
    ) {
        let first = first.as_slice();
        if len > MAX_PARTED_LEN || first.len() >= len {
            self.drop_invalid(peer, "message in parts of a length its parts cannot carry");
            return;
        }
        // In place: a message in parts allocates nothing.
        let unfinished = self.peers[peer].parted.is_some();
        let parted = self.peers[peer].parted.insert(Parted {
            info,
            len,
            have: first.len(),
            bytes: [0; MAX_PARTED_LEN],
        });
        parted.bytes[..first.len()].copy_from_slice(first);
        if unfinished {
            self.drop_invalid(peer, "message in parts that it left unfinished");
        }
    }

    /// The next part of `peer`'s message in parts: delivered once whole.
    pub(crate) fn on_inline_more(&mut self, peer: PeerIdx, src: Addr<B>, payload: &[u8; MORE_LEN]) {
        let Some(parted) = self.peers[peer].parted.as_mut() else {
            self.drop_invalid(peer, "part of no message in parts");
            return;
        };
        let take = (parted.len - parted.have).min(MORE_LEN);
        parted.bytes[parted.have..parted.have + take].copy_from_slice(&payload[..take]);
        parted.have += take;
        if parted.have == parted.len {
            let parted = self.peers[peer].parted.take().expect("looked at above");
            self.deliver(peer, src, parted.info, parted.len, parted.bytes.as_ptr());
        }
    }
}
