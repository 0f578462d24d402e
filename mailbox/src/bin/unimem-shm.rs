//! The emulation's shared objects of this user in /dev/shm:
//!
//!   unimem-shm list [--job TAG]   names, one per line (only the job's
//!                                 with `--job`: the `FI_UNIMEM_JOB` tag)
//!   unimem-shm reclaim            removes those whose owner process is dead
//!
//! A process killed with SIGKILL cannot remove its own objects; its live
//! peers and the next process of the user reclaim them, and job launchers
//! (`scripts/mpirun-unimem`) run `reclaim` after a job, for ranks that the
//! launcher itself killed.

use std::process::ExitCode;

use unimem_mailbox::shm::{list_objects, reclaim_dead_objects};
use unimem_mailbox::JobId;

const USAGE: &str = "usage: unimem-shm list [--job TAG] | reclaim";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["list", rest @ ..] => {
            let job = match rest {
                [] => None,
                ["--job", tag] => Some(JobId::from_name(tag)),
                _ => {
                    eprintln!("{USAGE}");
                    return ExitCode::from(2);
                }
            };
            for name in list_objects(job) {
                println!("{name}");
            }
            ExitCode::SUCCESS
        }
        ["reclaim"] => {
            let removed = reclaim_dead_objects();
            if removed > 0 {
                eprintln!("unimem-shm: removed {removed} objects of dead processes");
            }
            ExitCode::SUCCESS
        }
        ["-h" | "--help"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
