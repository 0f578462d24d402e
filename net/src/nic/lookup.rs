//! Questions to another process: where its dmable memory is (its
//! directory of segments) and what a key of its means, asked over the
//! transport and answered by the owner.

use super::*;

impl Nic {
    /// The registered segment of the process at `nic` that holds
    /// `[addr, addr + len)`, asking it for its directory if we do not know
    /// one that does: its key, the address to use with it, and the
    /// segment's first address and length.
    pub fn segment(&self, nic: NicAddr, addr: u64, len: u64) -> Result<(Segment, bool), DmaError> {
        let end = addr.checked_add(len).ok_or(DmaError::LengthOverflow)?;
        let find = |st: &mut State| -> Result<Option<(Segment, bool)>, DmaError> {
            let process = st.process(self, nic)?;
            if process.dead {
                return Err(DmaError::DeadNode);
            }
            Ok(process.segments.as_ref().and_then(|(virt, segments)| {
                segments
                    .iter()
                    .find(|s| addr >= s.base && end <= s.base.saturating_add(s.len))
                    .map(|s| (*s, *virt))
            }))
        };
        if let Some(found) = find(&mut self.state.lock())? {
            return Ok(found);
        }
        let reply = self.ask(nic, |req| Packet::DirQuery { req })?;
        let Packet::DirReply {
            virt_addr,
            segments,
            ..
        } = reply
        else {
            return Err(DmaError::Invalid);
        };
        let mut st = self.state.lock();
        if let Some(process) = st.processes.get_mut(&nic) {
            process.segments = Some((virt_addr, segments));
        }
        find(&mut st)?.ok_or(DmaError::OutOfBounds)
    }

    /// What the process at `nic` exposes under `key`.
    pub fn key(&self, nic: NicAddr, key: u64) -> Result<unimem_dma::Exposure, DmaError> {
        match self.ask(nic, |req| Packet::KeyQuery { req, key })? {
            Packet::KeyReply {
                found: true,
                addr,
                len,
                access,
                ..
            } => Ok(unimem_dma::Exposure {
                addr,
                len,
                access: unimem_dma::Access::from_bits_truncate(u64::from(access)),
            }),
            Packet::KeyReply { found: false, .. } => Err(DmaError::NoSuchKey),
            _ => Err(DmaError::Invalid),
        }
    }

    /// Sends a question and waits for its answer (the peer's progress or
    /// its interface thread answers within milliseconds), as long as the
    /// peer lives.
    pub(super) fn ask(
        &self,
        nic: NicAddr,
        question: impl Fn(u32) -> Packet,
    ) -> Result<Packet, DmaError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            st.process(self, nic)?;
            st.send_owned(self.name, nic, &question(req));
        }
        loop {
            self.progress();
            {
                let mut st = self.state.lock();
                if let Some(reply) = st.replies.remove(&req) {
                    return Ok(reply);
                }
                if st.processes.get(&nic).is_none_or(|p| p.dead) {
                    return Err(DmaError::DeadNode);
                }
            }
            std::thread::yield_now();
        }
    }
}
