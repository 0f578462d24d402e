//! Mailbox messages that came for one mailbox of this process, sorted
//! there by whoever polls the interface.

use super::*;

/// Mailbox messages that came for one mailbox of this process.
#[derive(Default)]
pub struct Inbox {
    queue: Mutex<VecDeque<(MailboxAddr, Message)>>,
    len: AtomicUsize,
}

impl Inbox {
    pub fn pop(&self) -> Option<(MailboxAddr, Message)> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut queue = self.queue.lock();
        let got = queue.pop_front();
        self.len.store(queue.len(), Ordering::Release);
        got
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    pub(super) fn push(&self, from: MailboxAddr, messages: &[Message]) {
        let mut queue = self.queue.lock();
        queue.extend(messages.iter().map(|m| (from, *m)));
        self.len.store(queue.len(), Ordering::Release);
    }
}
