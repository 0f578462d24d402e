//! `/dev/shm` and `/proc`: MPICH's own shared-memory files, and the
//! processes of a job (their start times, command lines, descendants).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

/// MPICH's own shared-memory files (`mpich_shm_*`) in /dev/shm.
pub(super) fn mpich_shm_files() -> Vec<String> {
    fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|name| name.starts_with("mpich_shm_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes MPICH's shared-memory files that appeared since `before` and
/// that no process maps: a rank that aborts leaves its `mpich_shm_*` file
/// behind (1 MiB each), even with MPICH's shared-memory module unused.
pub(super) fn remove_orphaned_mpich_files(before: &[String]) {
    let new: Vec<String> = mpich_shm_files()
        .into_iter()
        .filter(|name| !before.contains(name))
        .collect();
    if new.is_empty() {
        return;
    }
    let mut mapped = String::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if let Ok(maps) = fs::read_to_string(entry.path().join("maps")) {
                mapped.push_str(&maps);
            }
        }
    }
    for name in new {
        if !mapped.contains(&format!("/dev/shm/{name}")) {
            let _ = fs::remove_file(Path::new("/dev/shm").join(&name));
        }
    }
}

/// Parent pid and start time of a live process (not a zombie), from
/// `/proc/<pid>/stat`.
pub(super) fn stat(pid: i32) -> Option<(i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (3), ppid (4), ..., starttime (22).
    if matches!(*fields.first()?, "Z" | "X" | "x") {
        return None;
    }
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

pub(super) fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

pub(super) fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            String::from_utf8_lossy(&raw)
                .split('\0')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// Every live descendant of `root`.
pub(super) fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some((ppid, _)) = stat(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        if let Some(kids) = children.get(&pid) {
            out.extend(kids);
            todo.extend(kids);
        }
    }
    out
}
