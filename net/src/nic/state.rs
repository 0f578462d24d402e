//! The interface's state behind its lock: peers, batches, receive
//! buffers, and what a completion or a packet does to them.

use super::*;
use unimem_fi_sys::{core, Error};

impl State {
    /// The process at `nic`, known from now on.
    pub(super) fn process(
        &mut self,
        nic_: &Nic,
        nic: NicAddr,
    ) -> Result<&mut RemoteProcess, DmaError> {
        if !self.processes.contains_key(&nic) {
            let fi_addr = self.transport.insert(nic).map_err(|e| {
                tracing::warn!(%nic, "{e}");
                DmaError::NoSuchNode
            })?;
            let now = Instant::now();
            self.processes.insert(
                nic,
                RemoteProcess {
                    fi_addr,
                    last_heard: now,
                    last_sent: now,
                    dead: false,
                    gone: HashSet::new(),
                    segments: None,
                },
            );
            nic_.remote_processes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(self.processes.get_mut(&nic).expect("inserted above"))
    }

    pub(super) fn repost(&mut self, index: usize) -> Result<(), String> {
        let buffer = &mut self.recv_buffers[index];
        let (buf, len) = (buffer.as_mut_ptr(), buffer.len());
        let ret = self
            .transport
            .post_recv(buf, len, RECV << KIND_SHIFT | index as u64);
        if ret != 0 {
            return Err(format!(
                "cannot post a network receive: {}",
                core::strerror(ret as i32)
            ));
        }
        Ok(())
    }

    pub(super) fn inject(&mut self, nic: NicAddr, bytes: &[u8]) -> isize {
        let Some(process) = self.processes.get_mut(&nic) else {
            return Error::EINVAL.ssize();
        };
        process.last_sent = Instant::now();
        let fi_addr = process.fi_addr;
        let ret = self.send_packet(fi_addr, bytes);
        if ret == 0 {
            self.counters.packets_out += 1;
        }
        ret
    }

    pub(super) fn send_packet(&mut self, fi_addr: ffi::fi_addr_t, bytes: &[u8]) -> isize {
        if bytes.len() <= self.transport.inject_size {
            self.transport.inject(bytes, fi_addr)
        } else {
            let slot = match self.free_sends.pop() {
                Some(slot) => slot,
                None => {
                    self.sends.push(None);
                    self.sends.len() - 1
                }
            };
            // The transport reads the bytes until the completion: they
            // go from a buffer of their own, kept until then.
            let owned = bytes.to_vec();
            let ret = self.transport.send(
                owned.as_ptr(),
                owned.len(),
                fi_addr,
                SEND << KIND_SHIFT | slot as u64,
            );
            if ret == 0 {
                self.sends[slot] = Some(owned);
            } else {
                self.free_sends.push(slot);
            }
            ret
        }
    }

    /// Sends the gathered write and mailbox messages, as one transport
    /// message; false if the transport had no room (they wait for the next
    /// try, and nothing may pass them).
    pub(super) fn flush_batch(&mut self, nic: &Nic) -> bool {
        let (mut write, batch) = (self.write.take(), self.batch.take());
        let to = match (&write, &batch) {
            (Some(w), _) => w.nic,
            (None, Some(b)) => b.nic,
            (None, None) => return true,
        };
        let packet = batch.as_ref().map(|batch| Packet::Mailbox {
            dst_index: batch.dst_index,
            src_index: batch.from.index,
            job: batch.from.node.job,
            pid: batch.from.node.pid,
            nonce: batch.from.node.nonce,
            count: batch.count,
            messages: batch.messages,
        });
        // The write packet's own buffer with the mailbox packet appended,
        // or the mailbox packet alone, encoded in place.
        let (mut bytes, write_len) = match write.as_mut() {
            Some(w) => {
                let bytes = std::mem::take(&mut w.bytes);
                let len = bytes.len();
                (bytes, len)
            }
            None => (std::mem::take(&mut self.scratch), 0),
        };
        match (&packet, write.is_some()) {
            (Some(packet), true) => {
                let mut encoded = std::mem::take(&mut self.mailbox_scratch);
                packet.encode(nic.name, &mut encoded);
                bytes.extend_from_slice(&encoded);
                self.mailbox_scratch = encoded;
            }
            (Some(packet), false) => packet.encode(nic.name, &mut bytes),
            (None, _) => {}
        }
        // Behind our own packets waiting for room, if any.
        let sent = if self.backlog.is_empty() {
            self.inject(to, &bytes)
        } else {
            Error::EAGAIN.ssize()
        };
        if sent == Error::EAGAIN.ssize() {
            bytes.truncate(write_len);
            match write.as_mut() {
                Some(w) => w.bytes = bytes,
                None => self.scratch = bytes,
            }
            self.write = write;
            self.batch = batch;
            return false;
        }
        match write {
            Some(_) => self.write_spare = bytes,
            None => self.scratch = bytes,
        }
        if sent != 0 {
            let why = core::strerror(sent as i32);
            self.mark_dead(to, &format!("send failed: {why}"));
        }
        true
    }

    /// Sends one of our own packets (`from` is our name) to `to`, now or,
    /// if the transport is full, from the backlog.
    pub(super) fn send_owned(&mut self, from: NicAddr, to: NicAddr, packet: &Packet) {
        let mut bytes = Vec::new();
        packet.encode(from, &mut bytes);
        if self.backlog.is_empty() && self.inject(to, &bytes) == 0 {
            return;
        }
        self.backlog.push_back((to, bytes));
    }

    pub(super) fn flush_backlog(&mut self) {
        while let Some((nic, bytes)) = self.backlog.pop_front() {
            match self.inject(nic, &bytes) {
                0 => {}
                e if e == Error::EAGAIN.ssize() => {
                    self.backlog.push_front((nic, bytes));
                    return;
                }
                _ => self.mark_dead(nic, "send failed"),
            }
        }
    }

    pub(super) fn progress(&mut self, nic: &Nic) {
        self.flush_backlog();
        self.flush_batch(nic);
        let mut completions = std::mem::take(&mut self.completions);
        // Polls again only after a full batch, or an error (which comes
        // alone): another poll of a socket transport that has nothing is a
        // system call on the way of what just came.
        for _ in 0..8 {
            self.transport.poll(&mut completions);
            let more =
                completions.len() == POLL_MAX || completions.iter().any(|c| c.error.is_some());
            for c in completions.drain(..) {
                self.complete(nic, c);
            }
            if !more {
                break;
            }
        }
        self.completions = completions;
    }

    pub(super) fn complete(&mut self, nic: &Nic, c: Completion) {
        let kind = c.context >> KIND_SHIFT;
        let index = c.context & ((1 << KIND_SHIFT) - 1);
        match kind {
            RECV => {
                let index = index as usize;
                if index >= self.recv_buffers.len() {
                    return;
                }
                if c.error.is_none() {
                    self.counters.packets_in += 1;
                    let buffer = std::mem::take(&mut self.recv_buffers[index]);
                    let bytes = &buffer[..c.len.min(buffer.len())];
                    match Write::decode(bytes) {
                        Some(Ok((from, write, then))) => {
                            self.heard(nic, from);
                            self.on_write(write);
                            if let Some(packet) = then {
                                self.on_packet(nic, from, packet);
                            }
                        }
                        Some(Err(())) => self.drop_invalid("malformed write packet"),
                        None => match Packet::decode(bytes) {
                            Some((from, packet)) => {
                                self.heard(nic, from);
                                self.on_packet(nic, from, packet);
                            }
                            None => self.drop_invalid("malformed packet"),
                        },
                    }
                    self.recv_buffers[index] = buffer;
                } else if c.error == Some(ffi::FI_ETRUNC as i32) {
                    // Receive buffers are as long as this process's
                    // net_write_max wants; a sender with a larger one
                    // loses its packets here.
                    self.drop_invalid(
                        "a packet longer than this process's receive buffers: FI_UNIMEM_NET_WRITE_MAX must be the same in every process of the job",
                    );
                }
                if let Err(e) = self.repost(index) {
                    tracing::warn!("{e}");
                }
            }
            SEND => {
                let slot = index as usize;
                if let Some(buf) = self.sends.get_mut(slot) {
                    if buf.take().is_some() {
                        self.free_sends.push(slot);
                    }
                }
            }
            DMA => {
                let dest = self.dma_dest.remove(&c.context);
                if let (Some(err), Some(dest)) = (c.error, dest) {
                    self.mark_dead(dest, &core::strerror(err));
                }
                let engine = (index >> DMA_ID_BITS) as u16;
                let id = DmaId(index & ((1 << DMA_ID_BITS) - 1));
                // Reported done even if it failed: the peer is dead, and
                // the protocol fails what it left behind.
                self.dma_done.entry(engine).or_default().push(id);
            }
            _ => {}
        }
    }

    /// A short put into our memory: it must lie inside one segment we
    /// opened to the network, under that segment's key, as the transport
    /// checks an RMA write.
    pub(super) fn on_write(&mut self, write: Write<'_>) {
        let segments = self.own.iter().map(|own| &own.segment);
        if write_target(segments, write.key, write.addr, write.bytes.len()).is_none() {
            return self.drop_invalid("write outside the memory opened to the network");
        }
        // SAFETY: [addr, addr + len) lies inside one of our dmable
        // segments registered with the transport (checked above), which
        // stay mapped while the interface runs; the packet's bytes are a
        // receive buffer of ours, which cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                write.bytes.as_ptr(),
                write.addr as *mut u8,
                write.bytes.len(),
            )
        };
    }

    /// A whole packet (with what rode behind it) came from `from`.
    pub(super) fn heard(&mut self, nic: &Nic, from: NicAddr) {
        if let Ok(process) = self.process(nic, from) {
            process.last_heard = Instant::now();
        }
    }

    pub(super) fn on_packet(&mut self, nic: &Nic, from: NicAddr, packet: Packet) {
        match packet {
            Packet::Mailbox {
                dst_index,
                src_index,
                job,
                pid,
                nonce,
                count,
                messages,
            } => {
                let source = MailboxAddr {
                    node: NodeId {
                        job,
                        pid,
                        nonce,
                        nic: Some(from),
                    },
                    index: src_index,
                };
                // A process names only itself as the source: its pid 0
                // would be a service address, another host's interface
                // another process.
                if pid == 0 {
                    return self.drop_invalid("mailbox message from a service address");
                }
                match self.inboxes.get(&dst_index) {
                    Some(inbox) => {
                        nic.mark_active();
                        inbox.push(source, &messages[..count]);
                    }
                    None => {
                        self.send_owned(nic.name, from, &Packet::Gone { index: dst_index });
                    }
                }
            }
            Packet::Alive => {}
            Packet::DirQuery { req } => {
                let segments = self.own_segments();
                let reply = Packet::DirReply {
                    req,
                    virt_addr: self.transport.virt_addr,
                    segments,
                };
                self.send_owned(nic.name, from, &reply);
            }
            Packet::KeyQuery { req, key } => {
                let node = unimem_dma::DmaEngine::local_node(&self.local);
                let reply = match unimem_dma::DmaEngine::resolve_key(&mut self.local, node, key) {
                    Ok(e) => Packet::KeyReply {
                        req,
                        found: true,
                        addr: e.addr,
                        len: e.len,
                        access: e.access.bits() as u32,
                    },
                    Err(_) => Packet::KeyReply {
                        req,
                        found: false,
                        addr: 0,
                        len: 0,
                        access: 0,
                    },
                };
                self.send_owned(nic.name, from, &reply);
            }
            reply @ (Packet::DirReply { req, .. } | Packet::KeyReply { req, .. }) => {
                // Only an answer to a question we asked is kept.
                if req != 0 && req < nic.next_req.load(Ordering::Relaxed) {
                    self.replies.insert(req, reply);
                } else {
                    self.drop_invalid("answer to no question");
                }
            }
            Packet::Gone { index } => {
                if let Some(p) = self.processes.get_mut(&from) {
                    p.gone.insert(index);
                }
            }
        }
    }

    /// Our dmable memory as peers may use it: every committed segment,
    /// registered with the transport (a segment that grew since is
    /// registered again, whole).
    pub(super) fn own_segments(&mut self) -> Vec<Segment> {
        let node = unimem_dma::DmaEngine::local_node(&self.local);
        let committed = self.local.segments(node).unwrap_or_default();
        let mut out = Vec::with_capacity(committed.len());
        for (base, len) in committed {
            if len == 0 {
                continue;
            }
            let known = self
                .own
                .iter()
                .rev()
                .find(|s| s.segment.base == base && s.segment.len == len);
            let segment = match known {
                Some(s) => s.segment,
                None => {
                    let key = self.next_key;
                    self.next_key += 1;
                    match self.transport.register(base, len as usize, key) {
                        Ok(registration) => {
                            let segment = Segment {
                                base,
                                len,
                                key: registration.key,
                            };
                            self.own.push(OwnSegment {
                                segment,
                                _registration: registration,
                            });
                            segment
                        }
                        Err(e) => {
                            tracing::warn!("cannot open dmable memory to the network: {e}");
                            continue;
                        }
                    }
                }
            };
            out.push(segment);
        }
        out
    }

    pub(super) fn drop_invalid(&mut self, what: &str) {
        self.dropped += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|last| now.duration_since(last) < Duration::from_secs(1))
        {
            return;
        }
        self.last_warning = Some(now);
        tracing::warn!(
            total = self.dropped,
            "dropped invalid network packet(s): {what}"
        );
    }
}
