//! Messages beyond 32-bit lengths between two `fabric-peer` processes,
//! through the real libfabric core: 2^31 + 100 bytes and 5 GiB, untagged
//! and tagged with CQ data, every byte checked (checksum of the whole
//! receive buffer, guard bytes after it). They need about 11 GiB of memory
//! at once, so they run one at a time and alone in the test binary
//! (`unimem_tests::solo::alone`); they are long-running (tens of
//! seconds in a debug build) and CI runs them.

use std::time::Duration;

use unimem_tests::cluster::{set_answer_timeout, Msg, Order};

fn transfer(test: &str, msg: Msg) {
    // One huge transfer at a time, and no other test meanwhile: each holds
    // two copies of its message.
    let _alone = unimem_tests::solo::alone();
    // Filling, moving and checking 5 GiB in a debug build takes minutes
    // on a loaded machine: a hang guard, not a time requirement.
    set_answer_timeout(Duration::from_secs(400));
    let mut c = super::cluster(test);
    c.env("FABRIC_PEER_WAIT", "300");
    c.env("FABRIC_PEER_WATCHDOG", "600");
    c.spawn(2).connect_all();
    let limits = c.cmd(0, "limits");
    assert_eq!(limits.field("max"), -1, "max_msg_size is SIZE_MAX");
    c.transfer(0, 1, &[msg], Order::Posted);
    c.finish();
}

#[test]
fn a_message_of_two_gib_and_a_hundred_bytes() {
    transfer("huge-2g", Msg::new((1 << 31) + 100, 31));
}

#[test]
fn a_tagged_message_of_five_gib_with_cq_data() {
    transfer("huge-5g", Msg::new(5 << 30, 5).tag(0x5e).data(0xda7a));
}
