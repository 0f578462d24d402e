//! A process that made shared objects and then called exec (what a
//! launcher or profiler that allocates between its fork and its exec does
//! to the program it starts, `perf record` and `valgrind` among them) makes
//! the same names again after the exec: the leftovers of its old image,
//! which nothing maps any more, are reclaimed instead of refused.

use std::os::unix::process::CommandExt;
use std::process::Command;

use unimem_mailbox::shm::{object_name, SharedObject};
use unimem_mailbox::JobId;

const STAGE: &str = "UNIMEM_EXEC_TEST_STAGE";
const JOB: &str = "UNIMEM_EXEC_TEST_JOB";

fn name(job: &str) -> String {
    object_name(
        JobId::from_name(job),
        &format!("{}-dma", std::process::id()),
    )
}

#[test]
fn objects_made_before_exec_are_made_again_after_it() {
    let exe = std::env::current_exe().unwrap();
    let this = "objects_made_before_exec_are_made_again_after_it";
    match std::env::var(STAGE).as_deref() {
        Ok("before") => {
            let job = std::env::var(JOB).unwrap();
            // Made, kept (leaked, as a process that execs keeps it), then
            // the image is replaced.
            std::mem::forget(SharedObject::create(&name(&job), 1 << 16).unwrap());
            let err = Command::new(exe)
                .args([this, "--exact", "--nocapture"])
                .env(STAGE, "after")
                .exec();
            panic!("exec: {err}");
        }
        Ok("after") => {
            let job = std::env::var(JOB).unwrap();
            let object = SharedObject::create(&name(&job), 1 << 16)
                .expect("the name this process held before exec is free again");
            // A name this image does map is still refused.
            let again = SharedObject::create(&name(&job), 1 << 16);
            assert!(again.is_err(), "a live object of ours was replaced");
            drop(object);
        }
        _ => {
            let job = format!("exec-test-{}", std::process::id());
            let out = Command::new(exe)
                .args([this, "--exact", "--nocapture"])
                .env(STAGE, "before")
                .env(JOB, &job)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "child failed:\n{text}");
            assert!(text.contains("1 passed"), "{text}");
            let prefix = object_name(JobId::from_name(&job), "");
            let left: Vec<_> = std::fs::read_dir("/dev/shm")
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect();
            assert!(left.is_empty(), "left in /dev/shm: {left:?}");
        }
    }
}
