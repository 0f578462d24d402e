//! The built libunimem-fi.so as libfabric sees it: no link dependency on
//! libfabric, `fi_info` listings and parameters, logging, configuration
//! precedence, and fabric/domain objects through a core loaded RTLD_LOCAL.
//!
//! Tests that need `fi_info` or libfabric.so.1 fail, saying what to
//! install, when they are missing (scripts/install-deps installs both).

mod common;
use common::{cdylib, provider_dir};
use std::ffi::CStr;
use std::path::Path;
use std::process::{Command, Output};

use unimem_fi::base::config::TUNABLES;
use unimem_fi::base::ffi;
use unimem_fi::info::addr::service_address;
use unimem_mailbox::JobId;

/// Fails the test, saying what to install, when `fi_info` cannot run.
fn require_fi_info() {
    if let Err(e) = Command::new("fi_info").arg("--version").output() {
        panic!(
            "fi_info cannot run ({e}): install libfabric-bin \
             (apt-get install libfabric-bin libfabric-dev, or run scripts/install-deps)"
        );
    }
}

/// Run fi_info with only our provider directory and the given environment.
fn fi_info(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("fi_info");
    cmd.args(args).env("FI_PROVIDER_PATH", dir);
    for var in [
        "FI_LOG_LEVEL",
        "FI_LOG_PROV",
        "FI_LOG_SUBSYS",
        "FI_PROVIDER",
        "FI_UNIMEM_CONF",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::output_with_hang_guard(&mut cmd)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------
// ELF: the library must not need libfabric.

struct Elf<'a>(&'a [u8]);

impl Elf<'_> {
    fn u16(&self, off: usize) -> usize {
        u16::from_le_bytes(self.0[off..off + 2].try_into().unwrap()) as usize
    }
    fn u32(&self, off: usize) -> usize {
        u32::from_le_bytes(self.0[off..off + 4].try_into().unwrap()) as usize
    }
    fn u64(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.0[off..off + 8].try_into().unwrap())
    }
    fn cstr(&self, off: usize) -> String {
        let end = self.0[off..].iter().position(|&b| b == 0).unwrap();
        String::from_utf8_lossy(&self.0[off..off + end]).into_owned()
    }

    /// Section headers as (type, offset, size, link, entsize).
    fn sections(&self) -> Vec<(usize, usize, usize, usize, usize)> {
        assert_eq!(&self.0[..4], b"\x7fELF", "not an ELF file");
        assert_eq!(self.0[4], 2, "expected ELF64");
        assert_eq!(self.0[5], 1, "expected little endian");
        let shoff = self.u64(0x28) as usize;
        let shentsize = self.u16(0x3a);
        let shnum = self.u16(0x3c);
        (0..shnum)
            .map(|i| {
                let h = shoff + i * shentsize;
                (
                    self.u32(h + 4),
                    self.u64(h + 0x18) as usize,
                    self.u64(h + 0x20) as usize,
                    self.u32(h + 0x28),
                    self.u64(h + 0x38) as usize,
                )
            })
            .collect()
    }

    /// DT_NEEDED entries.
    fn needed(&self) -> Vec<String> {
        const SHT_DYNAMIC: usize = 6;
        const DT_NEEDED: u64 = 1;
        let secs = self.sections();
        let (_, off, size, link, _) = *secs.iter().find(|s| s.0 == SHT_DYNAMIC).expect(".dynamic");
        let strtab = secs[link].1;
        (0..size / 16)
            .map(|i| (self.u64(off + i * 16), self.u64(off + i * 16 + 8)))
            .take_while(|&(tag, _)| tag != 0)
            .filter(|&(tag, _)| tag == DT_NEEDED)
            .map(|(_, val)| self.cstr(strtab + val as usize))
            .collect()
    }

    /// Dynamic symbols as (name, defined).
    fn dynamic_symbols(&self) -> Vec<(String, bool)> {
        const SHT_DYNSYM: usize = 11;
        let secs = self.sections();
        let (_, off, size, link, entsize) =
            *secs.iter().find(|s| s.0 == SHT_DYNSYM).expect(".dynsym");
        let strtab = secs[link].1;
        (1..size / entsize)
            .map(|i| {
                let s = off + i * entsize;
                let name = self.cstr(strtab + self.u32(s));
                let shndx = self.u16(s + 6);
                (name, shndx != 0)
            })
            .collect()
    }
}

#[test]
fn no_link_dependency_on_libfabric() {
    let bytes = std::fs::read(cdylib()).expect("read cdylib");
    let elf = Elf(&bytes);
    let needed = elf.needed();
    assert!(!needed.is_empty(), "no DT_NEEDED at all? parser broken");
    assert!(
        needed.iter().all(|n| !n.contains("fabric")),
        "libunimem-fi.so must not need libfabric: {needed:?}"
    );
    let symbols = elf.dynamic_symbols();
    let undefined_fi: Vec<_> = symbols
        .iter()
        .filter(|(n, def)| !def && n.starts_with("fi_"))
        .collect();
    assert!(
        undefined_fi.is_empty(),
        "undefined fi_* symbols: {undefined_fi:?}"
    );
    let exported_fi: Vec<_> = symbols
        .iter()
        .filter(|(n, def)| *def && n.starts_with("fi_"))
        .collect();
    assert_eq!(
        exported_fi,
        vec![&("fi_prov_ini".to_owned(), true)],
        "only fi_prov_ini may be exported"
    );
}

// ---------------------------------------------------------------------------
// fi_info

#[test]
fn fi_info_lists_the_rdm_endpoint() {
    require_fi_info();
    let dir = provider_dir(&[]);
    let out = fi_info(&dir, &["-p", "unimem", "-v"], &[]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "fi_info failed: {}{}",
        stdout,
        text(&out.stderr)
    );
    let anonymous = format!("src_addr: unimem://{}/svc/", JobId::from_name("default"));
    assert!(
        stdout.contains(&anonymous),
        "missing '{anonymous}' in:\n{stdout}"
    );
    for expected in [
        "type: FI_EP_RDM",
        "addr_format: FI_ADDR_STR",
        "threading: FI_THREAD_SAFE",
        "control_progress: FI_PROGRESS_MANUAL",
        "data_progress: FI_PROGRESS_MANUAL",
        "resource_mgmt: FI_RM_ENABLED",
        "av_type: FI_AV_UNSPEC",
        "msg_order: [ FI_ORDER_SAS, FI_ORDER_ATOMIC_RAR, FI_ORDER_ATOMIC_RAW, FI_ORDER_ATOMIC_WAR, FI_ORDER_ATOMIC_WAW ]",
        "mem_tag_format: 0xaaaaaaaaaaaaaaaa",
        "max_msg_size: 18446744073709551615",
        "inject_size: 16384",
        "cq_data_size: 8",
        "name: unimem",
        "prov_name: unimem",
        "mr_mode: [  ]",
        "mode: [  ]",
    ] {
        assert!(
            stdout.contains(expected),
            "missing '{expected}' in:\n{stdout}"
        );
    }
    let caps = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("caps:"))
        .unwrap();
    for cap in [
        "FI_MSG",
        "FI_TAGGED",
        "FI_MULTI_RECV",
        "FI_SOURCE",
        "FI_DIRECTED_RECV",
        "FI_SEND",
        "FI_RECV",
        "FI_LOCAL_COMM",
        "FI_REMOTE_COMM",
        "FI_RMA",
        "FI_READ",
        "FI_WRITE",
        "FI_REMOTE_READ",
        "FI_REMOTE_WRITE",
        "FI_ATOMIC",
    ] {
        assert!(caps.contains(cap), "{cap} missing from {caps}");
    }
    assert!(!caps.contains("FI_COLLECTIVE"), "{caps}");
    assert_eq!(
        stdout.matches("type: FI_EP_RDM").count(),
        1,
        "exactly one entry"
    );
}

#[test]
fn fi_info_addresses_from_node_and_service() {
    require_fi_info();
    let dir = provider_dir(&[]);
    let server = text(
        &fi_info(
            &dir,
            &["-p", "unimem", "-v", "-s", "127.0.0.1", "-P", "9228"],
            &[],
        )
        .stdout,
    );
    let svc = service_address("default", "9228").unwrap();
    assert!(server.contains(&format!("src_addr: {svc}\n")), "{server}");
    // Includes the NUL.
    assert!(
        server.contains(&format!("src_addrlen: {}\n", svc.len() + 1)),
        "{server}"
    );
    let client = text(
        &fi_info(
            &dir,
            &["-p", "unimem", "-v", "-n", "localhost", "-P", "9228"],
            &[],
        )
        .stdout,
    );
    assert!(client.contains(&format!("dest_addr: {svc}\n")), "{client}");
    let job = text(
        &fi_info(
            &dir,
            &["-p", "unimem", "-v", "-n", "localhost", "-P", "7"],
            &[("FI_UNIMEM_JOB", "j2")],
        )
        .stdout,
    );
    let j2 = format!("dest_addr: unimem://{}/svc/7\n", JobId::from_name("j2"));
    assert!(job.contains(&j2), "{job}");
}

#[test]
fn unmet_hints_give_no_data() {
    require_fi_info();
    let dir = provider_dir(&[]);
    for args in [
        &["-c", "FI_RMA|FI_TRIGGER"][..],
        &["-c", "FI_MSG|FI_COLLECTIVE"],
        &["-t", "FI_EP_MSG"],
        &["-t", "FI_EP_DGRAM"],
        &["-d", "not-unimem"],
        &["-f", "not-unimem"],
        &["-a", "FI_SOCKADDR_IN"],
        &["-n", "no-such-host.invalid", "-P", "9228"],
    ] {
        let mut full = vec!["-p", "unimem"];
        full.extend_from_slice(args);
        let out = fi_info(&dir, &full, &[("FI_LOG_LEVEL", "warn")]);
        let stdout = text(&out.stdout);
        assert!(
            !out.status.success(),
            "{args:?} unexpectedly matched:\n{stdout}"
        );
        assert!(!stdout.contains("provider: unimem"), "{args:?}: {stdout}");
        // Our own warning names the field that failed.
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("unimem_fi::info::getinfo") && stderr.contains("no match"),
            "{args:?}: {stderr}"
        );
    }
    // ...while these are fine.
    for args in [
        &["-c", "FI_MSG|FI_MULTI_RECV"][..],
        &["-t", "FI_EP_RDM"],
        &["-m", "FI_CONTEXT"],
        &["-a", "FI_ADDR_STR"],
    ] {
        let mut full = vec!["-p", "unimem"];
        full.extend_from_slice(args);
        let out = fi_info(&dir, &full, &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
}

#[test]
fn fi_info_env_lists_every_tunable() {
    require_fi_info();
    let dir = provider_dir(&[]);
    let out = text(&fi_info(&dir, &["-e"], &[]).stdout);
    for t in TUNABLES {
        let var = format!("# FI_UNIMEM_{}:", t.name.to_ascii_uppercase());
        assert_eq!(
            out.matches(&var).count(),
            1,
            "{var} listed once in fi_info -e"
        );
    }
    assert!(out.contains("# FI_UNIMEM_CONF:"));
}

#[test]
fn logging_goes_through_libfabric() {
    require_fi_info();
    let dir = provider_dir(&[]);
    let info = text(&fi_info(&dir, &["-p", "unimem"], &[("FI_LOG_LEVEL", "info")]).stderr);
    assert!(info.contains(":unimem:core:unimem_fi::prov():"), "{info}");
    assert!(info.contains("<info> unimem "), "{info}");
    // FI_LOG_PROV filters us out like any provider.
    let other = text(
        &fi_info(
            &dir,
            &["-p", "unimem"],
            &[("FI_LOG_LEVEL", "info"), ("FI_LOG_PROV", "tcp")],
        )
        .stderr,
    );
    assert!(!other.contains("unimem_fi::"), "{other}");
    // Debug lines only at debug level.
    assert!(!info.contains("<debug>"));
    let debug = text(
        &fi_info(
            &dir,
            &["-p", "unimem"],
            &[("FI_LOG_LEVEL", "debug"), ("FI_LOG_PROV", "unimem")],
        )
        .stderr,
    );
    assert!(
        debug.contains("unimem_fi::base::config():") && debug.contains("<debug> mbx_depth = 1024"),
        "{debug}"
    );
    // Nothing from us without FI_LOG_LEVEL.
    let quiet = text(&fi_info(&dir, &["-p", "unimem"], &[]).stderr);
    assert!(!quiet.contains("unimem_fi::"), "{quiet}");
}

#[test]
fn configuration_file_and_environment() {
    require_fi_info();
    // fi_info.conf next to the library.
    let dir = provider_dir(&[(
        "fi_info.conf",
        "# test\ntx_size = 77\neager_size = 4k\nrx_size = bogus\n",
    )]);
    let out = fi_info(&dir, &["-p", "unimem", "-v"], &[("FI_LOG_LEVEL", "warn")]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("size: 77"), "{stdout}");
    assert!(stdout.contains("inject_size: 4096"), "{stdout}");
    assert!(
        stdout.contains("size: 1024"),
        "rx_size falls back:\n{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad value for rx_size"), "{stderr}");

    // The environment overrides the file; a bad value warns and is ignored.
    let out = fi_info(
        &dir,
        &["-p", "unimem", "-v"],
        &[
            ("FI_UNIMEM_TX_SIZE", "99"),
            ("FI_UNIMEM_EAGER_SIZE", "lots"),
            ("FI_LOG_LEVEL", "warn"),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("size: 99"), "{stdout}");
    assert!(stdout.contains("inject_size: 4096"), "{stdout}");
    assert!(text(&out.stderr).contains("FI_UNIMEM_EAGER_SIZE=lots"));

    // FI_UNIMEM_CONF wins over the file next to the library.
    let other = std::env::temp_dir().join(format!("unimem-fi-test-{}.conf", std::process::id()));
    std::fs::write(&other, "tx_size = 55\n").unwrap();
    let out = fi_info(
        &dir,
        &["-p", "unimem", "-v"],
        &[("FI_UNIMEM_CONF", other.to_str().unwrap())],
    );
    assert!(text(&out.stdout).contains("size: 55"));
    let _ = std::fs::remove_file(other);
}

// ---------------------------------------------------------------------------
// Through a libfabric core that was dlopen'ed RTLD_LOCAL (like MPI loaded
// privately by Python): the provider must still find the core's functions.
// Runs in a child process (libfabric reads its environment once).

const CHILD_VAR: &str = "UNIMEM_FI_TEST_CHILD_DIR";

#[test]
fn objects_through_a_private_core() {
    if let Ok(dir) = std::env::var(CHILD_VAR) {
        private_core_scenario(Path::new(&dir));
        return;
    }
    let (_, stderr) = common::run_scenario_in_child(
        "objects_through_a_private_core",
        CHILD_VAR,
        &[("FI_LOG_LEVEL", "info".into())],
    );
    assert!(
        stderr.contains("core found via object that called fi_prov_ini"),
        "the provider did not find the private core:\n{stderr}"
    );
    assert!(
        stderr.contains("fabric 0x") && stderr.contains("domain 0x"),
        "{stderr}"
    );
    assert!(
        stderr.contains("fi_close(fabric): 1 child object(s) still open"),
        "{stderr}"
    );
}

fn private_core_scenario(_dir: &Path) {
    let core = common::open_core_privately();
    let common::Core {
        getinfo,
        dupinfo,
        freeinfo,
        fabric,
        version,
    } = core;
    // SAFETY: libfabric API used as documented; every pointer is from libfabric or a live local.
    unsafe {
        let hints = core.unimem_rdm_hints(ffi::FI_MSG | ffi::FI_MULTI_RECV);
        (*(*hints).domain_attr).threading = ffi::FI_THREAD_DOMAIN;
        let mut info: *mut ffi::fi_info = std::ptr::null_mut();
        let rc = getinfo(
            version(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            hints,
            &mut info,
        );
        assert_eq!(rc, 0, "fi_getinfo");
        let prov = CStr::from_ptr((*(*info).fabric_attr).prov_name)
            .to_str()
            .unwrap();
        assert_eq!(prov, "unimem");
        assert_eq!(
            (*(*info).domain_attr).threading,
            ffi::FI_THREAD_DOMAIN,
            "threading reported as asked"
        );
        assert!((*info).next.is_null());

        // The core's fi_dupinfo/fi_freeinfo on our allocation.
        let copy = dupinfo(info);
        assert!(!copy.is_null());
        freeinfo(copy);

        let mut fab: *mut ffi::fid_fabric = std::ptr::null_mut();
        assert_eq!(
            fabric((*info).fabric_attr, &mut fab, std::ptr::null_mut()),
            0,
            "fi_fabric"
        );
        assert_eq!((*fab).api_version, version());
        let mut dom: *mut ffi::fid_domain = std::ptr::null_mut();
        let domain = (*(*fab).ops).domain.unwrap();
        assert_eq!(
            domain(fab, info, &mut dom, std::ptr::null_mut()),
            0,
            "fi_domain"
        );
        let close = |f: *mut ffi::fid| ((*(*f).ops).close.unwrap())(f);
        assert_eq!(
            close(fab as *mut ffi::fid),
            -ffi::FI_EBUSY,
            "fabric busy while the domain is open"
        );
        let av_open = (*(*dom).ops).av_open.unwrap();
        assert_eq!(
            av_open(
                dom,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            -ffi::FI_EINVAL,
            "NULL attributes"
        );
        assert_eq!(close(dom as *mut ffi::fid), 0);
        assert_eq!(close(fab as *mut ffi::fid), 0);
        freeinfo(info);
        freeinfo(hints);
    }
    println!("scenario complete");
}
