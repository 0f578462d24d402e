//! The provider under test: which `libunimem_fi.so` the children load (see
//! the [module](super) comment), staged alone in a directory of its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

fn target_profile_dir() -> Option<PathBuf> {
    // <target>/<profile>/deps/<test>-<hash>
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// The `libunimem_fi.so` the fabric tests load (see the module docs),
/// [pinned](crate::pinned) at first use: a rebuild during the run does not
/// reach the children.
pub fn provider_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| crate::pinned::pin(&built_library()))
        .clone()
}

/// The build [`provider_library`] pins: the path cargo (or
/// `$UNIMEM_FI_LIB`) gives it.
pub fn built_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(find_provider_library).clone()
}

fn find_provider_library() -> PathBuf {
    const NAME: &str = "libunimem_fi.so";
    if let Some(lib) = std::env::var_os("UNIMEM_FI_LIB") {
        let lib = PathBuf::from(lib);
        assert!(
            lib.is_file(),
            "UNIMEM_FI_LIB={} is not a file",
            lib.display()
        );
        return lib;
    }
    let profile_dir = target_profile_dir().expect("test executable in <target>/<profile>/deps");
    let beside_test = profile_dir.join("deps").join(NAME);
    if beside_test.is_file() {
        return beside_test;
    }
    let release = profile_dir.ends_with("release");
    let targets: Vec<PathBuf> = [
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
        profile_dir.parent().map(Path::to_path_buf),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let profiles = if release {
        ["release", "debug"]
    } else {
        ["debug", "release"]
    };
    let candidates = || {
        targets
            .iter()
            .flat_map(|t| profiles.iter().map(move |p| t.join(p).join(NAME)))
    };
    if let Some(found) = candidates().find(|p| p.is_file()) {
        eprintln!("fabric tests: using {}", found.display());
        return found;
    }
    eprintln!(
        "fabric tests: {NAME} not found; running `cargo build -p unimem-provider{}`",
        if release { " --release" } else { "" }
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "unimem-provider"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build -p unimem-provider failed");
    candidates()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{NAME} still missing after cargo build"))
}

/// A temporary directory holding the provider as `libunimem-fi.so`.
pub(super) struct ProviderDir(pub(super) PathBuf);

impl ProviderDir {
    pub(super) fn new() -> ProviderDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "unimem-fabric-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create provider dir");
        std::os::unix::fs::symlink(provider_library(), dir.join("libunimem-fi.so"))
            .expect("symlink provider");
        ProviderDir(dir)
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
