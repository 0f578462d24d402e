//! Pieces shared by the provider's integration tests (`loading.rs`,
//! `objects.rs`, `data_calls.rs`): where the cdylib is and a directory that
//! offers it to libfabric, the libfabric core opened privately, child
//! processes run with a hang guard, and a test's scenario run in a child
//! process of its own.

#![allow(dead_code)] // each test binary uses its own part

use std::ffi::{c_void, CStr, CString};
use std::io::Read;
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use unimem_fi::base::ffi;

/// The cdylib built together with the tests.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    [
        deps.join("libunimem_fi.so"),
        deps.join("../libunimem_fi.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| panic!("libunimem_fi.so not found near {}", deps.display()))
}

/// A fresh directory holding `libunimem-fi.so` (the installed name) as a
/// symlink to the cargo output, plus optional extra files; removed on drop.
pub struct ProviderDir(PathBuf);

impl std::ops::Deref for ProviderDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn provider_dir(files: &[(&str, &str)]) -> ProviderDir {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "unimem-fi-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::os::unix::fs::symlink(cdylib(), dir.join("libunimem-fi.so")).expect("symlink");
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write file");
    }
    ProviderDir(dir)
}

pub type GetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const ffi::fi_info,
    *mut *mut ffi::fi_info,
) -> c_int;
pub type DupinfoFn = unsafe extern "C" fn(*const ffi::fi_info) -> *mut ffi::fi_info;
pub type FreeinfoFn = unsafe extern "C" fn(*mut ffi::fi_info);
pub type FabricFn =
    unsafe extern "C" fn(*mut ffi::fi_fabric_attr, *mut *mut ffi::fid_fabric, *mut c_void) -> c_int;
pub type VersionFn = unsafe extern "C" fn() -> u32;

/// The core's entry points the tests call (the rest are inline wrappers
/// over ops tables).
pub struct Core {
    pub getinfo: GetinfoFn,
    pub dupinfo: DupinfoFn,
    pub freeinfo: FreeinfoFn,
    pub fabric: FabricFn,
    pub version: VersionFn,
}

impl Core {
    /// Hints for unimem RDM endpoints with `caps` (`fi_allocinfo`, then
    /// the provider name, endpoint type and caps): free with `freeinfo`.
    pub fn unimem_rdm_hints(&self, caps: u64) -> *mut ffi::fi_info {
        // SAFETY: fi_dupinfo(NULL) allocates a complete, zeroed fi_info
        // whose attribute structs are allocated too; the name is strdup'ed
        // because fi_freeinfo frees it.
        unsafe {
            let hints = (self.dupinfo)(std::ptr::null());
            assert!(!hints.is_null(), "fi_allocinfo failed");
            (*(*hints).fabric_attr).prov_name = libc::strdup(c"unimem".as_ptr());
            (*(*hints).ep_attr).type_ = ffi::FI_EP_RDM;
            (*hints).caps = caps;
            hints
        }
    }
}

/// libfabric.so.1 `dlopen`ed with RTLD_LOCAL (out of the global scope).
/// Panics where it is not installed: a missing prerequisite fails the test.
pub fn open_core_privately() -> Core {
    let lib = CString::new("libfabric.so.1").unwrap();
    // SAFETY: plain dlopen; RTLD_LOCAL keeps the core out of the global scope.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a C string valid until the next dl* call.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        panic!(
            "libfabric.so.1 is not loadable ({why}): install libfabric1 \
             (apt-get install libfabric-dev libfabric-bin, or run scripts/install-deps)"
        );
    }
    let sym = |n: &str| {
        let c = CString::new(n).unwrap();
        // SAFETY: h is a live handle, c a valid C string.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        assert!(!p.is_null(), "{n} missing");
        p
    };
    // SAFETY: these are libfabric's functions (newest symbol versions) with these prototypes.
    unsafe {
        Core {
            getinfo: std::mem::transmute::<*mut c_void, GetinfoFn>(sym("fi_getinfo")),
            dupinfo: std::mem::transmute::<*mut c_void, DupinfoFn>(sym("fi_dupinfo")),
            freeinfo: std::mem::transmute::<*mut c_void, FreeinfoFn>(sym("fi_freeinfo")),
            fabric: std::mem::transmute::<*mut c_void, FabricFn>(sym("fi_fabric")),
            version: std::mem::transmute::<*mut c_void, VersionFn>(sym("fi_version")),
        }
    }
}

/// Longest a child process of these tests may run. Not a time requirement
/// (the children take a second or two): only a guard that turns a hang
/// into a failure with the child's output.
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// Runs `cmd` to its end with stdout and stderr captured, like
/// [`Command::output`], but kills it and fails the test if it is still
/// running after [`CHILD_LIMIT`].
pub fn output_with_hang_guard(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + CHILD_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = String::from_utf8_lossy(&stdout.join().unwrap_or_default()).into_owned();
            let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
            panic!("{what} still running after {CHILD_LIMIT:?} (hung?), killed it:\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Runs the test `test_name` of this test executable again, alone, in a
/// child process (libfabric reads its environment once per process) and
/// returns the child's stdout and stderr. The child finds `child_var` set
/// to a fresh [`provider_dir`], which libfabric loads the provider from,
/// only the provider (`FI_PROVIDER=unimem`), its warnings logged and no
/// `FI_UNIMEM_CONF`; `extra_env` adds to or overrides that. Fails the test
/// unless the child succeeds and prints "scenario complete".
pub fn run_scenario_in_child(
    test_name: &str,
    child_var: &str,
    extra_env: &[(&str, String)],
) -> (String, String) {
    let dir = provider_dir(&[]);
    let mut cmd = Command::new(std::env::current_exe().expect("test executable path"));
    cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(child_var, &*dir)
        .env("FI_PROVIDER_PATH", &*dir)
        .env("FI_PROVIDER", "unimem")
        .env("FI_LOG_LEVEL", "warn")
        .env("FI_LOG_PROV", "unimem")
        .env_remove("FI_UNIMEM_CONF");
    for (name, value) in extra_env {
        cmd.env(name, value);
    }
    let out = output_with_hang_guard(&mut cmd);
    drop(dir);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("scenario complete"), "{stdout}\n{stderr}");
    (stdout, stderr)
}
