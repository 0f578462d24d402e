//! `fi_unimem(7)` (`provider/man/fi_unimem.7`) renders cleanly and keeps up
//! with the provider:
//!
//! - groff (`groff -man -ww -z`) and man-db (`man --warnings -l`) render it
//!   without a single warning;
//! - its RUNTIME PARAMETERS section has one entry per parameter the
//!   provider defines (the tunables table, `unimem_fi::base::config`, plus
//!   `conf`), each opening with the parameter's type, accepted range and
//!   default exactly as the table has them, and one entry per variable the
//!   dmable heap reads (`dma/heap/src/config.rs`);
//! - every `FI_UNIMEM_*` name anywhere in the page is one of those;
//! - `fi_info -e` with the built provider lists exactly those parameters
//!   (what users see is what the table says);
//! - `.TH` names the workspace's version;
//! - `scripts/install-provider` installs the page.
//!
//! The page is parsed as rendered (groff, plain text), not as roff source:
//! a name lost to a markup slip is a name the reader does not see.
//!
//! Needs `groff-base` and `man-db` (scripts/install-deps) and `fi_info`
//! (libfabric-bin); a missing tool fails the test rather than skipping it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use unimem_fi::base::config::{env_name, Kind, Tunable, CONF_PARAM, TUNABLES};
use unimem_tests::cluster::provider_library;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

fn page() -> PathBuf {
    repo().join("provider/man/fi_unimem.7")
}

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {shown}: {e} (scripts/install-deps installs groff-base, man-db and libfabric-bin)")
    })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The page as plain text: no bold, underline or colour, no hyphenation
/// (the page turns it off; `-rHY=0` keeps it so), 80 columns.
fn rendered() -> String {
    let out = run(Command::new("groff")
        .args(["-man", "-Tutf8", "-rHY=0", "-rLL=80n", "-P-cbou"])
        .arg(page()));
    assert!(out.status.success(), "groff failed: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn groff_renders_it_without_warnings() {
    let out = run(Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(page()));
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "groff failed:\n{stderr}");
    assert!(stderr.is_empty(), "groff warnings:\n{stderr}");
}

#[test]
fn man_renders_it_without_warnings() {
    let out = run(Command::new("man")
        .args(["--warnings", "-l"])
        .arg(page())
        .env("MANWIDTH", "80")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("LC_ALL", "C.UTF-8")
        // man-db's sandbox is refused in some containers; rendering a
        // file of our own needs none.
        .env("MAN_DISABLE_SECCOMP", "1"));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "man -l failed:\n{stderr}");
    assert!(stderr.is_empty(), "man -l warnings:\n{stderr}");
    for heading in [
        "FI_UNIMEM(7)",
        "NAME",
        "OVERVIEW",
        "SUPPORTED FEATURES",
        "LIMITATIONS",
        "RUNTIME PARAMETERS",
        "FAILURE SEMANTICS",
        "SECURITY",
        "SEE ALSO",
    ] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(heading)),
            "man -l output lacks {heading}:\n{stdout}"
        );
    }
}

/// One entry of the RUNTIME PARAMETERS section: the name and its body
/// on one line, whitespace collapsed.
fn parameter_entries(page: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = page.lines().collect();
    let start = lines
        .iter()
        .position(|l| *l == "RUNTIME PARAMETERS")
        .expect("a RUNTIME PARAMETERS section");
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in &lines[start + 1..] {
        let indent = line.len() - line.trim_start().len();
        let content = line.trim();
        if content.is_empty() {
            continue;
        }
        if indent == 0 {
            break; // the next section
        }
        if indent < 14 && is_env_name(content) {
            entries.push((content.to_string(), String::new()));
        } else if indent >= 14 {
            if let Some((_, body)) = entries.last_mut() {
                body.push(' ');
                body.push_str(content);
            }
        } else if let Some((_, body)) = entries.last_mut() {
            // A paragraph or subsection heading ends the entry's body.
            body.push('\u{0}');
        }
    }
    entries
        .into_iter()
        .map(|(name, body)| {
            let body = body.split('\u{0}').next().unwrap_or_default();
            (name, body.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn is_env_name(word: &str) -> bool {
    word.strip_prefix("FI_UNIMEM_").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// Every `FI_UNIMEM_[A-Z0-9_]+` in `text`.
fn env_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("FI_UNIMEM_") {
        let tail = &rest[at + "FI_UNIMEM_".len()..];
        let len = tail
            .bytes()
            .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
            .count();
        if len > 0 {
            names.insert(format!("FI_UNIMEM_{}", &tail[..len]));
        }
        rest = &tail[len..];
    }
    names
}

/// A size bound as the page writes it: `4k`, `64m`, `1t`.
fn size_text(bytes: u64) -> String {
    for (shift, suffix) in [(40, "t"), (30, "g"), (20, "m"), (10, "k")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// How the page must open a tunable's entry: its type, range and default.
fn expected_head(t: &Tunable) -> String {
    let kind = match t.kind {
        Kind::Bool => "boolean".to_string(),
        Kind::Int { min, max } => format!("integer, {min} to {max}"),
        Kind::Size { max: u64::MAX, .. } => "size".to_string(),
        Kind::Size { min, max } => format!("size, {} to {}", size_text(min), size_text(max)),
        Kind::Str => "name".to_string(),
        Kind::OptName => "name or empty".to_string(),
        Kind::Enum(words) => match words {
            [] => String::new(),
            [one] => (*one).to_string(),
            [init @ .., last] => format!("{} or {last}", init.join(", ")),
        },
    };
    let default = if t.default.is_empty() {
        "empty"
    } else {
        t.default
    };
    format!("({kind}; default {default})")
}

/// The variables the dmable heap reads, from its source (the heap is a
/// preloaded allocator: linking it into a test would replace malloc).
fn heap_variables() -> BTreeSet<String> {
    let path = repo().join("dma/heap/src/config.rs");
    let source =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let names: BTreeSet<String> = source
        .split("c\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|s| is_env_name(s))
        .map(str::to_string)
        .collect();
    assert!(
        names.contains("FI_UNIMEM_HEAP_THRESHOLD"),
        "found no heap variables in {}",
        path.display()
    );
    names
}

fn provider_parameters() -> BTreeSet<String> {
    TUNABLES
        .iter()
        .map(|t| env_name(t.name))
        .chain([env_name(CONF_PARAM)])
        .collect()
}

#[test]
fn every_parameter_has_an_entry_with_its_type_range_and_default() {
    let page = rendered();
    let entries = parameter_entries(&page);
    let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, body) in &entries {
        by_name.entry(name).or_default().push(body);
    }
    let mut problems = BTreeSet::new();
    for (name, bodies) in &by_name {
        if bodies.len() > 1 {
            problems.insert(format!("{name}: {} entries", bodies.len()));
        }
    }
    for t in TUNABLES {
        let name = env_name(t.name);
        let Some(bodies) = by_name.get(name.as_str()) else {
            continue; // reported below
        };
        let head = expected_head(t);
        if !bodies[0].starts_with(&head) {
            problems.insert(format!(
                "{name}: the entry must open with {head:?}, it reads {:?}",
                bodies[0]
            ));
        }
    }
    let heap = heap_variables();
    let provider = provider_parameters();
    for name in provider.iter().chain(&heap) {
        if !by_name.contains_key(name.as_str()) {
            problems.insert(format!("{name}: no entry"));
        }
    }
    for name in by_name.keys() {
        if !provider.contains(*name) && !heap.contains(*name) {
            problems.insert(format!(
                "{name}: an entry for something that is no parameter"
            ));
        }
    }
    for (name, body) in &entries {
        // A parenthesis and a sentence at least.
        if body.len() < 40 {
            problems.insert(format!("{name}: the entry says almost nothing: {body:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "provider/man/fi_unimem.7 is behind the provider:\n  {}",
        problems.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    assert_eq!(entries.len(), provider.union(&heap).count());
}

#[test]
fn every_variable_the_page_names_exists() {
    let known: BTreeSet<String> = provider_parameters()
        .into_iter()
        .chain(heap_variables())
        .collect();
    let unknown: Vec<String> = env_names_in(&rendered())
        .into_iter()
        .filter(|n| !known.contains(n))
        .collect();
    assert!(
        unknown.is_empty(),
        "the page names variables that nothing reads: {unknown:?}"
    );
}

#[test]
fn fi_info_lists_the_same_parameters() {
    // fi_info loads the provider, which reclaims dead processes' objects.
    let _solo = unimem_tests::solo::shared();
    let dir = std::env::temp_dir().join(format!("unimem-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::os::unix::fs::symlink(provider_library(), dir.join("libunimem-fi.so"))
        .expect("symlink the provider");
    let out = run(Command::new("fi_info")
        .args(["-e", "-p", "unimem"])
        .env("FI_PROVIDER_PATH", &dir)
        .env_remove("FI_PROVIDER"));
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "fi_info -e failed:\n{}",
        text(&out.stderr)
    );
    // `# FI_UNIMEM_<NAME>: String` heads each parameter.
    let listed: BTreeSet<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter_map(|l| l.split(':').next())
        .filter(|n| is_env_name(n))
        .map(str::to_string)
        .collect();
    assert_eq!(
        listed,
        provider_parameters(),
        "fi_info -e and the tunables table disagree"
    );
}

#[test]
fn the_title_names_this_version() {
    let source = std::fs::read_to_string(page()).expect("the page");
    let th = source
        .lines()
        .find(|l| l.starts_with(".TH "))
        .expect("a .TH line");
    let version = format!("\"unimem {}\"", env!("CARGO_PKG_VERSION"));
    assert!(
        th.starts_with(".TH FI_UNIMEM 7 ") && th.contains(&version),
        "{th:?} must be `.TH FI_UNIMEM 7 <date> {version} ...`"
    );
}

/// `scripts/install-provider --prefix P --no-build` puts the page in
/// `P/share/man/man7`. A stand-in target directory (`CARGO_TARGET_DIR`,
/// which the script asks cargo for) holds placeholder libraries, so the
/// script runs without a release build.
#[test]
fn install_provider_installs_the_page() {
    let root = std::env::temp_dir().join(format!("unimem-man-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let release = root.join("target/release");
    std::fs::create_dir_all(&release).expect("temp dir");
    for lib in ["libunimem_fi.so", "libunimem_heap.so"] {
        std::fs::write(release.join(lib), b"placeholder").expect("placeholder library");
    }
    let prefix = root.join("prefix");
    let out = run(Command::new(repo().join("scripts/install-provider"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--no-build")
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env_remove("DESTDIR"));
    let installed = prefix.join("share/man/man7/fi_unimem.7");
    let copy = std::fs::read(&installed);
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        out.status.success(),
        "install-provider failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let copy = copy.unwrap_or_else(|e| panic!("{}: {e}", installed.display()));
    assert_eq!(
        copy,
        std::fs::read(page()).expect("the page"),
        "the installed page differs from the source"
    );
}
