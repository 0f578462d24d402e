//! Mailbox addresses: position-independent, meaningful in every process of
//! the same user on the host, and, with the network address of their node
//! (`@<ipv4>:<port>`), on every host of the job.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use crate::node::{BadAddress, JobId, NodeId};

/// Size of an encoded [`MailboxAddr`] of this host (what the shared-memory
/// mailbox carries): the node's network address is not part of it.
pub const ADDR_LEN: usize = 16;

/// The address of one mailbox: the node that owns it and the mailbox's index
/// on that node. A *service* mailbox has a well-known index (a port number)
/// and no owner in its address, so that peers can reach it knowing only the
/// job and the service.
#[derive(Clone, Copy, Eq, PartialOrd, Ord, Debug)]
pub struct MailboxAddr {
    pub node: NodeId,
    pub index: u32,
}

/// Field by field, as derived, but the four words of this host's part in
/// one test: every message's source and every send's destination is
/// compared with the peer looked up last, and each receive's source with
/// the message's.
impl PartialEq for MailboxAddr {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&self.node, &other.node);
        ((a.job.0 ^ b.job.0) | (a.pid ^ b.pid) | (a.nonce ^ b.nonce) | (self.index ^ other.index))
            == 0
            && a.nic == b.nic
    }
}

/// As derived: the fields `eq` compares.
impl Hash for MailboxAddr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.node.hash(state);
        self.index.hash(state);
    }
}

impl MailboxAddr {
    /// The well-known mailbox of `service` in `job`. Numeric services (ports)
    /// map to themselves, names to a hash.
    pub fn for_service(job: JobId, service: &str) -> MailboxAddr {
        let index = service
            .parse::<u32>()
            .unwrap_or_else(|_| JobId::from_name(service).0);
        MailboxAddr {
            node: NodeId {
                job,
                pid: 0,
                nonce: 0,
                nic: None,
            },
            index,
        }
    }

    pub fn is_service(&self) -> bool {
        self.node.pid == 0
    }

    /// Name of the shared object behind this mailbox (without the user/job
    /// prefix; [`crate::shm::object_name`] adds it).
    pub fn object_tail(&self) -> String {
        if self.is_service() {
            format!("svc{}", self.index)
        } else {
            format!("{}-mbx{}", self.node.pid, self.index)
        }
    }

    /// The address as this host names it (without the node's network
    /// address).
    #[inline]
    pub fn to_bytes(&self) -> [u8; ADDR_LEN] {
        let mut out = [0u8; ADDR_LEN];
        out[0..4].copy_from_slice(&self.node.job.0.to_le_bytes());
        out[4..8].copy_from_slice(&self.node.pid.to_le_bytes());
        out[8..12].copy_from_slice(&self.node.nonce.to_le_bytes());
        out[12..16].copy_from_slice(&self.index.to_le_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8; ADDR_LEN]) -> MailboxAddr {
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        MailboxAddr {
            node: NodeId {
                job: JobId(word(0)),
                pid: word(4),
                nonce: word(8),
                nic: None,
            },
            index: word(12),
        }
    }
}

/// `unimem://<job>/<pid>.<nonce>/<index>`, or `unimem://<job>/svc/<index>`,
/// followed by `@<ipv4>:<port>` for a node that has a network address.
impl fmt::Display for MailboxAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_service() {
            write!(f, "unimem://{}/svc/{}", self.node.job, self.index)?;
        } else {
            write!(
                f,
                "unimem://{}/{}.{:08x}/{}",
                self.node.job, self.node.pid, self.node.nonce, self.index
            )?;
        }
        match self.node.nic {
            Some(nic) => write!(f, "@{nic}"),
            None => Ok(()),
        }
    }
}

impl FromStr for MailboxAddr {
    type Err = BadAddress;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s.strip_prefix("unimem://").ok_or(BadAddress)?;
        let (rest, nic) = match rest.split_once('@') {
            Some((rest, nic)) => (rest, Some(nic.parse()?)),
            None => (rest, None),
        };
        let mut parts = rest.split('/');
        let (Some(job), Some(owner), Some(index), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(BadAddress);
        };
        let job = JobId(u32::from_str_radix(job, 16).map_err(|_| BadAddress)?);
        let index: u32 = index.parse().map_err(|_| BadAddress)?;
        let (pid, nonce) = if owner == "svc" {
            (0, 0)
        } else {
            let (pid, nonce) = owner.split_once('.').ok_or(BadAddress)?;
            let pid: u32 = pid.parse().map_err(|_| BadAddress)?;
            if pid == 0 {
                return Err(BadAddress);
            }
            (pid, u32::from_str_radix(nonce, 16).map_err(|_| BadAddress)?)
        };
        Ok(MailboxAddr {
            node: NodeId {
                job,
                pid,
                nonce,
                nic,
            },
            index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NicAddr;

    /// Equal exactly when every field is, the network address included.
    #[test]
    fn equality_is_field_by_field() {
        let base = MailboxAddr {
            node: NodeId {
                job: JobId(1),
                pid: 2,
                nonce: 3,
                nic: None,
            },
            index: 4,
        };
        let nic = |ip: [u8; 4], port| Some(NicAddr { ip, port });
        let mut others = Vec::new();
        for change in 0..7 {
            let mut a = base;
            match change {
                0 => a.node.job = JobId(9),
                1 => a.node.pid = 9,
                2 => a.node.nonce = 9,
                3 => a.index = 9,
                4 => a.node.nic = nic([10, 0, 0, 1], 7),
                5 => a.node.nic = nic([10, 0, 0, 2], 7),
                _ => a.node.nic = nic([10, 0, 0, 1], 8),
            }
            others.push(a);
        }
        let same = base;
        assert_eq!(base, same);
        for (i, a) in others.iter().enumerate() {
            assert_ne!(base, *a, "change {i}");
            for (j, b) in others.iter().enumerate() {
                assert_eq!(a == b, i == j, "changes {i} and {j}");
            }
        }
    }

    #[test]
    fn bytes_round_trip() {
        let addr = MailboxAddr {
            node: NodeId {
                job: JobId(0xdead_beef),
                pid: 4242,
                nonce: 0x1234_5678,
                nic: None,
            },
            index: 7,
        };
        assert_eq!(MailboxAddr::from_bytes(&addr.to_bytes()), addr);
    }

    #[test]
    fn string_round_trip() {
        let addr = MailboxAddr {
            node: NodeId {
                job: JobId(0xab),
                pid: 99,
                nonce: 0xff,
                nic: None,
            },
            index: 3,
        };
        let text = addr.to_string();
        assert_eq!(text, "unimem://000000ab/99.000000ff/3");
        assert_eq!(text.parse(), Ok(addr));
        let service = MailboxAddr::for_service(JobId(1), "9228");
        assert_eq!(service.to_string(), "unimem://00000001/svc/9228");
        assert_eq!(service.to_string().parse(), Ok(service));
        assert!(service.is_service());
        let remote = MailboxAddr {
            node: NodeId {
                nic: Some("198.18.0.11:40000".parse().unwrap()),
                ..addr.node
            },
            ..addr
        };
        let text = remote.to_string();
        assert_eq!(text, "unimem://000000ab/99.000000ff/3@198.18.0.11:40000");
        assert_eq!(text.parse(), Ok(remote));
        // The longest address of a node of another host fits libfabric's
        // FI_NAME_MAX (64 bytes with the NUL).
        let longest = MailboxAddr {
            node: NodeId {
                job: JobId(u32::MAX),
                pid: 4_194_304,
                nonce: u32::MAX,
                nic: Some("255.255.255.255:65535".parse().unwrap()),
            },
            index: 999,
        };
        assert!(longest.to_string().len() < 64, "{longest}");
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "unimem://",
            "tcp://1/2.3/4",
            "unimem://zz/1.2/3",
            "unimem://1/0.2/3",
            "unimem://1/1.2/3/4",
            "unimem://1/12/3",
            "unimem://1/1.2/3@",
            "unimem://1/1.2/3@1.2.3.4",
            "unimem://1/1.2/3@1.2.3.4:0",
            "unimem://1/1.2/3@1.2.3:5",
            "unimem://1/1.2/3@::1:5",
        ] {
            assert_eq!(bad.parse::<MailboxAddr>(), Err(BadAddress), "{bad}");
        }
    }
}
