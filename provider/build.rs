//! Generates the libfabric FFI *types and constants* from the installed
//! headers (src/base/ffi.rs includes the result).
//!
//! Functions are deliberately not generated: the provider must have no
//! link-time dependency on libfabric (see src/base/core.rs), and the headers'
//! `static inline` wrappers (fi_domain(), fi_close(), ...) are for
//! applications, not providers.
//!
//! Header search order: $LIBFABRIC_INCLUDE_DIR, `pkg-config --cflags-only-I
//! libfabric`, /usr/include, /usr/local/include.
//!
//! Side job: place a symlink `fi_info.conf -> <repo>/fi_info.conf` in the
//! profile directory, so a provider loaded straight from `target/<profile>`
//! (`FI_PROVIDER_PATH=target/<profile>`) finds the configuration file "next
//! to the library" like an installed one. (No `libunimem-fi.so` link there:
//! libfabric's directory scan accepts any file name ending in `fi.so`, so
//! cargo's `libunimem_fi.so` already loads, and a second name for the same
//! file would register the provider twice. scripts/build stages the
//! conventional name in `target/<profile>/libfabric/`.)

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Headers whose types and constants the provider uses.
const HEADERS: &[&str] = &[
    "rdma/fabric.h",
    "rdma/fi_domain.h",
    "rdma/fi_endpoint.h",
    "rdma/fi_cm.h",
    "rdma/fi_tagged.h",
    "rdma/fi_rma.h",
    "rdma/fi_errno.h",
    "rdma/fi_eq.h",
    "rdma/fi_atomic.h",
    "rdma/fi_collective.h",
    "rdma/providers/fi_prov.h",
    "rdma/providers/fi_log.h",
];

const INSTALL_HINT: &str = "install the libfabric headers and libclang: \
     `apt-get install libfabric-dev libclang-dev` \
     (or point LIBFABRIC_INCLUDE_DIR at the directory containing rdma/fabric.h)";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBFABRIC_INCLUDE_DIR");

    let include_dir =
        find_include_dir().unwrap_or_else(|| fail("libfabric headers (rdma/fabric.h) not found"));
    for h in HEADERS {
        let path = include_dir.join(h);
        if !path.exists() {
            fail(&format!(
                "{} is missing (libfabric incomplete?)",
                path.display()
            ));
        }
        println!("cargo:rerun-if-changed={}", path.display());
    }

    let wrapper: String = HEADERS
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    let builder = bindgen::Builder::default()
        .header_contents("unimem_fi_wrapper.h", &wrapper)
        .clang_arg(format!("-I{}", include_dir.display()))
        // Types and constants only: no extern fn declarations at all.
        .with_codegen_config(bindgen::CodegenConfig::TYPES | bindgen::CodegenConfig::VARS)
        .allowlist_file(r".*/rdma/.*")
        .rust_target(
            bindgen::RustTarget::stable(75, 0)
                .unwrap_or_else(|_| unreachable!("1.75 is a valid target")),
        )
        .rust_edition(bindgen::RustEdition::Edition2021)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(MacroTypes));

    // libclang missing makes bindgen panic deep inside clang-sys; turn that
    // into an actionable message.
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match generated {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail(&format!("bindgen failed on the libfabric headers: {e}")),
        Err(_) => fail("bindgen could not run (libclang missing?)"),
    };

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR set by cargo"));
    bindings
        .write_to_file(out_dir.join("fi_bindings.rs"))
        .expect("write fi_bindings.rs");

    link_conf(&out_dir);
}

/// Stop the build with an actionable message.
fn fail(what: &str) -> ! {
    panic!("\n\nunimem-provider: {what}\nTo fix: {INSTALL_HINT}\n\n")
}

/// Integer macro types: errno-style codes become `c_int` (they are returned
/// negated from every entry point), everything else (`FI_MSG`, `FI_CONTEXT`,
/// ...) `u64`, because they are OR-ed into 64-bit caps/mode/flags words.
#[derive(Debug)]
struct MacroTypes;

impl bindgen::callbacks::ParseCallbacks for MacroTypes {
    fn int_macro(&self, name: &str, value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        if !name.starts_with("FI_") {
            return None;
        }
        let errno_like = name == "FI_SUCCESS"
            || name == "FI_ERRNO_OFFSET"
            || (name.starts_with("FI_E") && name != "FI_EVENT" && (0..1024).contains(&value));
        if errno_like {
            Some(IntKind::Int)
        } else if name == "FI_MAJOR_VERSION" || name == "FI_MINOR_VERSION" {
            Some(IntKind::U32)
        } else {
            Some(IntKind::U64)
        }
    }
}

fn find_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = env::var_os("LIBFABRIC_INCLUDE_DIR") {
        candidates.push(dir.into());
    }
    if let Ok(out) = Command::new("pkg-config")
        .args(["--cflags-only-I", "libfabric"])
        .output()
    {
        if out.status.success() {
            let flags = String::from_utf8_lossy(&out.stdout);
            candidates.extend(
                flags
                    .split_whitespace()
                    .filter_map(|f| f.strip_prefix("-I"))
                    .map(PathBuf::from),
            );
        }
    }
    candidates.push("/usr/include".into());
    candidates.push("/usr/local/include".into());
    candidates
        .into_iter()
        .find(|d| d.join("rdma/fabric.h").exists())
}

/// Best-effort: `<target>/<profile>/fi_info.conf -> <repo>/fi_info.conf`.
///
/// OUT_DIR is `<target>/<profile>/build/<pkg>-<hash>/out`; we only touch the
/// directory if the path has exactly that shape (a custom `build-dir` makes
/// it differ; then there is simply no link).
fn link_conf(out_dir: &Path) {
    let Some(profile_dir) = out_dir.ancestors().nth(3).filter(|d| {
        out_dir
            .ancestors()
            .nth(2)
            .is_some_and(|b| b.ends_with("build") && b.parent() == Some(d))
    }) else {
        return;
    };
    let Some(manifest) = env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let Ok(conf) = Path::new(&manifest).join("../fi_info.conf").canonicalize() else {
        return;
    };
    let link = profile_dir.join("fi_info.conf");
    // Replace an old link; leave anything else (a real file) alone.
    match std::fs::symlink_metadata(&link) {
        Ok(m) if !m.file_type().is_symlink() => return,
        Ok(_) => {
            let _ = std::fs::remove_file(&link);
        }
        Err(_) => {}
    }
    if let Err(e) = std::os::unix::fs::symlink(&conf, &link) {
        println!("cargo:warning=could not create {}: {e}", link.display());
    }
}
