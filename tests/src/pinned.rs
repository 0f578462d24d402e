//! The libraries the tests' children load (the provider, the dmable heap),
//! pinned for the whole test process.
//!
//! Cargo deletes a library it rebuilds when the crate's compile starts and
//! puts the new one in place only when the link ends: for seconds, for
//! minutes on a loaded machine, the path names nothing. A child started
//! then through a symlink to `<target>/<profile>/deps/libunimem_fi.so`
//! finds no provider, and libfabric answers `fi_getinfo` with
//! -FI_ENODATA. The tests themselves start such builds midway through a
//! run (`heap::library` and `scripts/mpirun-unimem` run `scripts/build`
//! when nothing is staged yet, which rebuilds the provider if a source
//! changed since the test was built), and so may the developer. So the
//! first use takes a hard link (a copy across file systems) of each
//! library into a directory of this process: a rebuild replaces the name
//! in the target directory, never the file the children load, and every
//! child of a run loads the build the run started with.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const PREFIX: &str = "unimem-tests-pinned-";

/// `lib` as of now, under a name of this process that no build replaces.
/// Call it once per library (the callers keep the answer).
pub fn pin(lib: &Path) -> PathBuf {
    let name = lib
        .file_name()
        .unwrap_or_else(|| panic!("{} names no file", lib.display()));
    let pinned = dir().join(name);
    pin_as(lib, &pinned);
    pinned
}

/// Links (or copies) the file `lib` resolves to as `pinned`.
fn pin_as(lib: &Path, pinned: &Path) {
    // A hard link to a symlink is a second symlink, still resolved by name.
    let file = std::fs::canonicalize(lib).unwrap_or_else(|e| panic!("pin {}: {e}", lib.display()));
    let _ = std::fs::remove_file(pinned);
    if std::fs::hard_link(&file, pinned).is_err() {
        std::fs::copy(&file, pinned)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", file.display(), pinned.display()));
    }
}

/// This process's directory of pinned libraries, made once; those of
/// processes that are gone are removed first (nothing else removes them:
/// a test process has no end of its own to clean up at).
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        remove_dead(&tmp);
        let dir = tmp.join(format!("{PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        dir
    })
}

/// Removes the pinned directories in `tmp` of processes that are gone.
fn remove_dead(tmp: &Path) {
    for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("unimem-pin-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// What cargo does to a library it rebuilds (delete it, later put a new
    /// file in its place) leaves the pinned one as it was.
    #[test]
    fn a_rebuild_does_not_reach_the_pinned_file() {
        let dir = scratch("rebuild");
        let lib = dir.join("libx.so");
        std::fs::write(&lib, b"old build").unwrap();
        let link = dir.join("libx-link.so");
        std::os::unix::fs::symlink(&lib, &link).unwrap();
        let pinned = dir.join("pinned.so");
        pin_as(&link, &pinned);
        assert!(!pinned.is_symlink(), "the file is pinned, not the name");

        std::fs::remove_file(&lib).unwrap();
        assert_eq!(std::fs::read(&pinned).unwrap(), b"old build");
        std::fs::write(&lib, b"new build").unwrap();
        assert_eq!(std::fs::read(&pinned).unwrap(), b"old build");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn directories_of_dead_processes_go_and_others_stay() {
        let tmp = scratch("dead");
        // Beyond any pid_max (at most 2^22).
        let dead = tmp.join(format!("{PREFIX}{}", 1u32 << 30));
        let alive = tmp.join(format!("{PREFIX}{}", std::process::id()));
        let other = tmp.join("unimem-tests-pinned-notapid");
        for d in [&dead, &alive, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        remove_dead(&tmp);
        assert!(!dead.exists());
        assert!(alive.exists());
        assert!(other.exists());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
