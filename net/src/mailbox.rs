//! The mailbox of a node that has peers on this host and on others: the
//! shared-memory emulation's for the former, the network interface's for
//! the latter, behind one address.

use std::cell::Cell;
use std::sync::Arc;

use unimem_mailbox::{Error, Mailbox, MailboxAddr, Message, NicAddr, ShmMailbox, ShmPeer};

use super::nic::{Inbox, Nic};

/// The network half: our inbox at the process's interface.
struct NetPort {
    nic: Arc<Nic>,
    inbox: Arc<Inbox>,
}

/// A mailbox reachable from this host (shared memory) and, when the
/// process has a network interface, from other hosts.
pub struct NodeMailbox {
    shm: ShmMailbox,
    net: Option<NetPort>,
    /// Alternates which half `poll` looks at first, so that neither starves
    /// the other.
    net_first: bool,
    /// The inbox was found holding messages right after a poll of the
    /// transport was tried, since `poll` last came up empty: once it is
    /// drained, the caller has what there was, and another poll (a system
    /// call on a socket transport) would only delay what it does with them.
    net_polled: Cell<bool>,
}

/// A route to a peer's mailbox.
pub enum NodePeer {
    Local(ShmPeer),
    Remote { nic: NicAddr, index: u32 },
}

impl NodeMailbox {
    /// Wraps the emulated mailbox `shm`; with `nic`, peers of other hosts
    /// reach it too.
    pub fn new(shm: ShmMailbox, nic: Option<Arc<Nic>>) -> NodeMailbox {
        let net = nic.map(|nic| NetPort {
            inbox: nic.open_inbox(shm.addr().index),
            nic,
        });
        NodeMailbox {
            shm,
            net,
            net_first: false,
            net_polled: Cell::new(false),
        }
    }

    /// The emulated mailbox (its counters).
    pub fn shm(&self) -> &ShmMailbox {
        &self.shm
    }

    fn poll_net(&mut self) -> Option<(MailboxAddr, Message)> {
        let net = self.net.as_ref()?;
        if let Some(message) = net.inbox.pop() {
            return Some(message);
        }
        if self.net_polled.replace(false) {
            return None;
        }
        net.nic.poll_from_data_path();
        let message = net.inbox.pop();
        self.net_polled.set(message.is_some());
        message
    }
}

impl Drop for NodeMailbox {
    fn drop(&mut self) {
        if let Some(net) = &self.net {
            net.nic.close_inbox(self.shm.addr().index);
        }
    }
}

impl Mailbox for NodeMailbox {
    type Addr = MailboxAddr;
    type Peer = NodePeer;

    /// The address peers of every host use: with our interface's address
    /// when we have one (peers of this host drop it, see `canonical`).
    #[inline]
    fn addr(&self) -> MailboxAddr {
        let mut addr = self.shm.addr();
        if let Some(net) = &self.net {
            if !addr.is_service() {
                addr.node.nic = Some(net.nic.name);
            }
        }
        addr
    }

    fn connect(&self, dest: &MailboxAddr) -> Result<NodePeer, Error> {
        match dest.node.nic {
            None => self.shm.connect(dest).map(NodePeer::Local),
            Some(nic) => {
                let Some(net) = self.net.as_ref() else {
                    super::warn_unreachable(dest);
                    return Err(Error::Invalid);
                };
                if dest.is_service() || dest.node.job != self.shm.addr().node.job {
                    return Err(Error::Invalid);
                }
                if !net.nic.alive(nic, dest.index) {
                    return Err(Error::Dead);
                }
                Ok(NodePeer::Remote {
                    nic,
                    index: dest.index,
                })
            }
        }
    }

    #[inline]
    fn send(&self, peer: &NodePeer, message: &Message) -> Result<(), Error> {
        match peer {
            NodePeer::Local(peer) => self.shm.send(peer, message),
            NodePeer::Remote { nic, index } => {
                let net = self.net.as_ref().ok_or(Error::Invalid)?;
                net.nic
                    .send_mailbox(&self.shm.addr(), *nic, *index, message)
            }
        }
    }

    #[inline]
    fn poll(&mut self) -> Option<(MailboxAddr, Message)> {
        if self.net.is_none() {
            return self.shm.poll();
        }
        self.net_first = !self.net_first;
        if self.net_first {
            self.poll_net().or_else(|| self.shm.poll())
        } else {
            self.shm.poll().or_else(|| self.poll_net())
        }
    }

    #[inline]
    fn has_message(&self) -> bool {
        if self.shm.has_message() {
            return true;
        }
        let Some(net) = &self.net else {
            return false;
        };
        if net.inbox.is_empty() {
            net.nic.poll_from_data_path();
            self.net_polled.set(!net.inbox.is_empty());
        }
        !net.inbox.is_empty()
    }

    #[inline]
    fn peer_alive(&self, peer: &NodePeer) -> bool {
        match peer {
            NodePeer::Local(peer) => self.shm.peer_alive(peer),
            NodePeer::Remote { nic, index } => self
                .net
                .as_ref()
                .is_some_and(|net| net.nic.alive(*nic, *index)),
        }
    }
}
