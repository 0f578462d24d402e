//! The dmable heap under test: the release build that `scripts/build`
//! stages and `scripts/mpirun-unimem` preloads,
//! `target/release/libfabric/libunimem-heap.so` (built if missing; a
//! warning says when it is older than the sources it is built from),
//! [pinned](crate::pinned) at first use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::mpi::repo_root;

/// The staged heap library.
pub fn library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = repo_root().join("target/release/libfabric/libunimem-heap.so");
        if !lib.exists() {
            let status = Command::new(repo_root().join("scripts/build"))
                .arg("--quiet")
                .status()
                .expect("run scripts/build");
            assert!(status.success(), "scripts/build failed");
        }
        assert!(
            lib.exists(),
            "{} missing after scripts/build",
            lib.display()
        );
        warn_if_stale(&lib);
        crate::pinned::pin(&lib)
    })
    .clone()
}

fn warn_if_stale(lib: &Path) {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = mtime(lib) else { return };
    let mut dirs = vec![repo_root().join("dma"), repo_root().join("mailbox")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && mtime(&path).is_some_and(|t| t > built)
            {
                eprintln!(
                    "warning: {} is older than {}: run scripts/build",
                    lib.display(),
                    path.display()
                );
                return;
            }
        }
    }
}
