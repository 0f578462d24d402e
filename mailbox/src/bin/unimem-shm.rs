//! The emulation's shared objects of this user in /dev/shm:
//!
//!   unimem-shm list       names, one per line
//!   unimem-shm reclaim    removes those whose owner process is dead
//!
//! A process killed with SIGKILL cannot remove its own objects; its live
//! peers and the next process of the user reclaim them, and job launchers
//! (`scripts/mpirun-unimem`) run `reclaim` after a job, for ranks that the
//! launcher itself killed.

use std::process::ExitCode;

use unimem_mailbox::shm::{list_objects, reclaim_dead_objects};

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("list") => {
            for name in list_objects(None) {
                println!("{name}");
            }
            ExitCode::SUCCESS
        }
        Some("reclaim") => {
            let removed = reclaim_dead_objects();
            if removed > 0 {
                eprintln!("unimem-shm: removed {removed} objects of dead processes");
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: unimem-shm list|reclaim");
            ExitCode::from(2)
        }
    }
}
