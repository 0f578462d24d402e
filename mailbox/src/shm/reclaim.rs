//! Who owns an object, and the removal of objects whose owner is gone:
//! dead, never finished making them, or left them behind when it called
//! exec.

use std::sync::atomic::Ordering;

use super::file::{c_name, file_stat, map, open_existing};
use super::{
    object_name, user_prefix, ObjectHeader, HEADER_SIZE, SHM_DIR, UNINITIALISED_GRACE_SECS,
};
use crate::node::{process_alive, JobId};

/// What [`owner_state`] found out about an object.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum OwnerState {
    /// Owned by this live process.
    Mine,
    /// Ours and closed: a thread of ours is about to unlink it.
    Closing,
    /// Owned by another live process (closed or not: a live owner unlinks
    /// what it closes).
    Alive,
    Dead,
    /// Never initialised, and too old for its creator to still be at it.
    Abandoned,
    Unknown,
}

pub(super) fn owner_state(name: &str) -> OwnerState {
    let Ok(fd) = open_existing(name) else {
        return OwnerState::Unknown;
    };
    let Ok(st) = file_stat(fd.0) else {
        return OwnerState::Unknown;
    };
    let young = {
        // SAFETY: time(NULL) has no preconditions.
        let now = unsafe { libc::time(std::ptr::null_mut()) };
        now - st.st_mtime < UNINITIALISED_GRACE_SECS
    };
    let not_initialised = if young {
        OwnerState::Unknown
    } else {
        OwnerState::Abandoned
    };
    if (st.st_size as usize) < std::mem::size_of::<ObjectHeader>() {
        return not_initialised;
    }
    let len = HEADER_SIZE.min(st.st_size as usize);
    let Ok(base) = map(fd.0, 0, len, false) else {
        return OwnerState::Unknown;
    };
    // SAFETY: the mapping covers an ObjectHeader; atomics are valid for any bits.
    let header = unsafe { &*(base.as_ptr() as *const ObjectHeader) };
    let pid = header.owner_pid();
    let start = header.owner_start.load(Ordering::Relaxed);
    // A closed object of a live owner is not dead: its owner sets the flag
    // and then unlinks the name, and may make an object under the same name
    // as soon as it is gone. Taken for dead, it was unlinked by whoever
    // looked first, and the owner's own unlink then removed the name from
    // its new object (a key table dropped by one thread while another made
    // the next one: peers found no table, and their RMA FI_EKEYREJECTED).
    let state = if pid == 0 {
        not_initialised
    } else if !process_alive(pid, start) {
        OwnerState::Dead
    } else if pid != std::process::id() {
        OwnerState::Alive
    } else if header.is_closed() {
        OwnerState::Closing
    } else {
        OwnerState::Mine
    };
    // SAFETY: unmapping the header mapping made just above.
    unsafe { libc::munmap(base.as_ptr().cast(), len) };
    state
}

fn unlink(name: &str) -> bool {
    let Ok(cname) = c_name(name) else {
        return false;
    };
    // SAFETY: cname is a valid C string.
    unsafe { libc::shm_unlink(cname.as_ptr()) == 0 }
}

/// Unlinks object `name` if its owner is dead (`state`, its
/// [`owner_state`] just read). Returns whether it did.
pub(super) fn reclaim_if_dead(name: &str, state: OwnerState) -> bool {
    match state {
        OwnerState::Dead | OwnerState::Abandoned => {
            let unlinked = unlink(name);
            if unlinked {
                tracing::info!(object = name, "reclaimed shared object of a dead process");
            }
            unlinked
        }
        OwnerState::Mine | OwnerState::Closing | OwnerState::Alive | OwnerState::Unknown => false,
    }
}

/// An object of this process that nothing in it maps: it was made before
/// the process called exec, which unmapped it. A launcher or profiler that
/// allocates between its fork and its exec (`perf record`, `valgrind`)
/// gives the program it starts its own pid, and so the names that program
/// is about to create. Nothing else can hold our pid while we live.
/// `state`: its [`owner_state`], just read.
pub(super) fn reclaim_if_left_before_exec(name: &str, state: OwnerState) -> bool {
    if !matches!(state, OwnerState::Mine | OwnerState::Closing) || mapped_here(name) {
        return false;
    }
    let unlinked = unlink(name);
    if unlinked {
        tracing::info!(
            object = name,
            "reclaimed a shared object this process made before it called exec"
        );
    }
    unlinked
}

/// Whether this process maps object `name` (when in doubt: yes).
fn mapped_here(name: &str) -> bool {
    let path = format!("{SHM_DIR}/{name}");
    let unlinked = format!("{path} (deleted)");
    std::fs::read_to_string("/proc/self/maps").map_or(true, |maps| {
        maps.lines()
            .map(str::trim_end)
            .any(|line| line.ends_with(&path) || line.ends_with(&unlinked))
    })
}

/// This user's object names in `/dev/shm`, whatever the job.
fn user_objects() -> Vec<String> {
    let prefix = user_prefix();
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

/// Removes every object of this user whose owner process is dead, in every
/// job. Returns how many were removed. Cheap enough to run at start-up.
pub fn reclaim_dead_objects() -> usize {
    user_objects()
        .iter()
        .filter(|name| reclaim_if_dead(name, owner_state(name)))
        .count()
}

/// Unlinks every object this process owns, for a process that exits
/// without closing them (an application that never calls `fi_close`).
/// Mappings stay valid until exit; peers see the objects gone.
pub fn remove_own_objects() -> usize {
    user_objects()
        .iter()
        .filter(|name| {
            matches!(owner_state(name), OwnerState::Mine | OwnerState::Closing) && unlink(name)
        })
        .count()
}

/// Names of this user's objects in `job` currently in `/dev/shm` (for tests
/// and diagnostics).
pub fn list_objects(job: Option<JobId>) -> Vec<String> {
    let prefix = job.map(|job| object_name(job, ""));
    let mut names: Vec<String> = user_objects()
        .into_iter()
        .filter(|name| prefix.as_ref().is_none_or(|p| name.starts_with(p)))
        .collect();
    names.sort();
    names
}
