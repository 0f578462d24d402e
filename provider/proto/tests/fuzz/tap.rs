//! A mailbox with a tap: H's real messages caught on their way out, and
//! what every endpoint sent lately, for mutations and forged answers.

use super::*;

// --- a mailbox with a tap ------------------------------------------------------------

const HISTORY: usize = 256;

/// What an endpoint's mailbox saw, shared between its messenger and the
/// harness.
pub(crate) struct TapState {
    /// `None` once closed (H at the end of its round).
    pub(crate) mbx: Option<ShmMailbox>,
    /// The last messages sent, oldest overwritten.
    pub(crate) sent: Vec<Message>,
    sent_next: usize,
    /// Catch the next outgoing message instead of sending it (H).
    pub(crate) intercept: bool,
    pub(crate) intercepted: Option<Message>,
    /// The eager ring the peer set aside for us, from its hello: address
    /// and length (H learns A's).
    pub(crate) peer_ring: Option<(usize, usize)>,
}

/// The mailbox a messenger of the harness runs over: a `ShmMailbox` whose
/// traffic the harness records, and that it can send through itself.
pub(crate) struct Tap {
    addr: MailboxAddr,
    pub(crate) state: Arc<Mutex<TapState>>,
}

impl Tap {
    pub(crate) fn open(job: JobId) -> Tap {
        let mbx = ShmMailbox::open(&ShmMailboxConfig {
            job,
            depth: 256,
            profile: Profile::Native,
        })
        .expect("mailbox");
        Tap {
            addr: mbx.addr(),
            state: Arc::new(Mutex::new(TapState {
                mbx: Some(mbx),
                sent: Vec::with_capacity(HISTORY),
                sent_next: 0,
                intercept: false,
                intercepted: None,
                peer_ring: None,
            })),
        }
    }
}

impl TapState {
    /// The message sent `back` messages before the last one.
    pub(crate) fn recent(&self, back: usize) -> Message {
        let len = self.sent.len();
        let back = back.min(len - 1);
        let newest = if len < HISTORY {
            len - 1
        } else {
            (self.sent_next + HISTORY - 1) % HISTORY
        };
        self.sent[(newest + len - back) % len]
    }

    fn record(&mut self, message: &Message) {
        if self.sent.len() < HISTORY {
            self.sent.push(*message);
        } else {
            self.sent[self.sent_next] = *message;
            self.sent_next = (self.sent_next + 1) % HISTORY;
        }
    }
}

impl Mailbox for Tap {
    type Addr = MailboxAddr;
    type Peer = ShmPeer;

    fn addr(&self) -> MailboxAddr {
        self.addr
    }

    fn connect(&self, dest: &MailboxAddr) -> Result<ShmPeer, MailboxError> {
        match &self.state.lock().mbx {
            Some(mbx) => mbx.connect(dest),
            None => Err(MailboxError::Invalid),
        }
    }

    fn send(&self, peer: &ShmPeer, message: &Message) -> Result<(), MailboxError> {
        let mut state = self.state.lock();
        if state.mbx.is_none() {
            return Err(MailboxError::Dead);
        }
        if state.intercept {
            state.intercept = false;
            state.intercepted = Some(*message);
            return Ok(());
        }
        let sent = state.mbx.as_ref().expect("open").send(peer, message);
        if sent.is_ok() {
            state.record(message);
        }
        sent
    }

    fn poll(&mut self) -> Option<(MailboxAddr, Message)> {
        let mut state = self.state.lock();
        let (src, message) = state.mbx.as_mut()?.poll()?;
        if state.peer_ring.is_none() {
            if let Some(Wire::Hello {
                ring,
                slot_shift,
                slots,
                ..
            }) = Wire::decode(&message)
            {
                let len = (slots as usize) << slot_shift;
                state.peer_ring = (len > 0).then_some((ring as usize, len));
            }
        }
        Some((src, message))
    }

    fn has_message(&self) -> bool {
        self.state
            .lock()
            .mbx
            .as_ref()
            .is_some_and(|m| m.has_message())
    }

    fn peer_alive(&self, peer: &ShmPeer) -> bool {
        self.state
            .lock()
            .mbx
            .as_ref()
            .is_some_and(|m| m.peer_alive(peer))
    }
}
