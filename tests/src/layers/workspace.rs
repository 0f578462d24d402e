//! The workspace as a tree of source files: its members (the `[workspace]
//! members` of the root `Cargo.toml`, `*` allowed within a path segment),
//! each member's compilation targets (its library and binaries) with their
//! root files, and reading all of it from disk. The manifests are read with
//! a little TOML, enough for their tables, keys and string arrays.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Files by their path relative to the workspace root ('/'-separated).
pub type SourceTree = BTreeMap<String, String>;

/// One compilation target of a member: its library or one binary.
#[derive(Clone, Debug)]
pub(super) struct Target {
    /// `unimem-mailbox` (the library) or `unimem-mailbox bin unimem-shm`.
    pub(super) name: String,
    /// The root file, a key of the tree.
    pub(super) root: String,
}

/// The workspace manifest, each member's manifest and every `.rs` file under
/// each member's `src/` (and under the folder of any target `path` outside
/// it), read from disk.
pub(super) fn load(root: &Path) -> SourceTree {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("read {}/Cargo.toml: {e}", root.display()));
    let patterns = Manifest::parse(&manifest).strings("workspace", "members");
    assert!(
        !patterns.is_empty(),
        "no [workspace] members in {}/Cargo.toml",
        root.display()
    );
    let subdirs = |dir: &str| {
        let mut names: Vec<String> = std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut tree = SourceTree::from([("Cargo.toml".to_string(), manifest)]);
    for member in patterns.iter().flat_map(|p| expand(p, subdirs)) {
        let toml_path = format!("{member}/Cargo.toml");
        let Ok(toml) = std::fs::read_to_string(root.join(&toml_path)) else {
            continue;
        };
        let mut dirs = vec![format!("{member}/src")];
        dirs.extend(
            Manifest::parse(&toml)
                .target_paths()
                .iter()
                .map(|path| join(&member, parent_dir(path))),
        );
        tree.insert(toml_path, toml);
        for dir in dirs {
            load_rs_files(root, &dir, &mut tree);
        }
    }
    tree
}

fn load_rs_files(root: &Path, dir: &str, tree: &mut SourceTree) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = join(dir, &name);
        let path = entry.path();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                load_rs_files(root, &rel, tree);
            }
        } else if name.ends_with(".rs") && !tree.contains_key(&rel) {
            if let Ok(text) = std::fs::read_to_string(&path) {
                tree.insert(rel, text);
            }
        }
    }
}

/// Every target of every member of the workspace in `tree`, in the order
/// the manifest lists the members.
pub(super) fn targets(tree: &SourceTree) -> Vec<Target> {
    let manifest = tree.get("Cargo.toml").expect("workspace Cargo.toml");
    // The folders directly under `dir` that hold a file of the tree.
    let subdirs = |dir: &str| {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let names: BTreeSet<&str> = tree
            .keys()
            .filter_map(|k| Some(k.strip_prefix(&prefix)?.split_once('/')?.0))
            .collect();
        names.into_iter().map(str::to_string).collect()
    };
    Manifest::parse(manifest)
        .strings("workspace", "members")
        .iter()
        .flat_map(|pattern| expand(pattern, subdirs))
        .filter(|member| tree.contains_key(&format!("{member}/Cargo.toml")))
        .flat_map(|member| member_targets(tree, &member))
        .collect()
}

/// The folders a member pattern names, `subdirs` listing (sorted) the
/// folders in a folder for the segments with a `*`.
fn expand(pattern: &str, subdirs: impl Fn(&str) -> Vec<String>) -> Vec<String> {
    let mut found = vec![String::new()];
    for segment in pattern.split('/').filter(|s| !s.is_empty() && *s != ".") {
        let mut next = Vec::new();
        for dir in &found {
            if segment.contains('*') {
                let names = subdirs(dir).into_iter().filter(|n| glob_match(segment, n));
                next.extend(names.map(|n| join(dir, &n)));
            } else {
                next.push(join(dir, segment));
            }
        }
        found = next;
    }
    found
}

/// `*` matches any run of characters; everything else itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| glob_match(tail, &rest[i..]))
        }
    }
}

/// The library and binaries of one member, by its manifest and the files
/// cargo finds by convention (`src/lib.rs`, `src/main.rs`, `src/bin/`).
fn member_targets(tree: &SourceTree, member: &str) -> Vec<Target> {
    let manifest = Manifest::parse(&tree[&format!("{member}/Cargo.toml")]);
    let package = manifest
        .string("package", 0, "name")
        .unwrap_or_else(|| member.to_string());
    let mut targets = Vec::new();
    let lib = join(
        member,
        &manifest.lib_path().unwrap_or_else(|| "src/lib.rs".into()),
    );
    if tree.contains_key(&lib) {
        targets.push(Target {
            name: package.clone(),
            root: lib,
        });
    }
    // Binaries by root file; a `[[bin]]` table names the one at its path.
    let mut bins = BTreeMap::from([(join(member, "src/main.rs"), package.clone())]);
    let bin_dir = format!("{}/", join(member, "src/bin"));
    for key in tree.keys() {
        let Some(rest) = key.strip_prefix(&bin_dir) else {
            continue;
        };
        let name = [".rs", "/main.rs"]
            .iter()
            .find_map(|suffix| rest.strip_suffix(suffix).filter(|n| !n.contains('/')));
        if let Some(name) = name {
            bins.insert(key.clone(), name.to_string());
        }
    }
    for (name, path) in manifest.bins() {
        bins.insert(join(member, &path), name.unwrap_or_else(|| package.clone()));
    }
    for (root, name) in bins {
        if tree.contains_key(&root) {
            let name = if name == package {
                format!("{package} bin")
            } else {
                format!("{package} bin {name}")
            };
            targets.push(Target { name, root });
        }
    }
    targets
}

// ===========================================================================
// Paths of the tree

/// The folder of a file ("" at the top).
pub(super) fn parent_dir(file: &str) -> &str {
    file.rfind('/').map_or("", |k| &file[..k])
}

/// `rest` ('/'-separated, `.` and `..` allowed) taken from folder `dir`.
pub(super) fn join(dir: &str, rest: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

// ===========================================================================
// A little TOML

struct TomlEntry {
    /// `workspace`, `package`, `lib`, `bin` (for `[[bin]]`), ...
    table: String,
    /// Which occurrence of an array table (`[[bin]]`) the key is in.
    occurrence: usize,
    key: String,
    value: String,
}

/// Each member's package name and the workspace crates it depends on
/// (`[dependencies]`, not dev or build ones), from the manifests in `tree`
/// (as [`load`] reads them).
pub fn crate_dependencies(tree: &SourceTree) -> BTreeMap<String, Vec<String>> {
    let manifests: Vec<(String, Manifest)> = tree
        .iter()
        .filter(|(path, _)| path.ends_with("/Cargo.toml"))
        .filter_map(|(_, toml)| {
            let manifest = Manifest::parse(toml);
            Some((manifest.string("package", 0, "name")?, manifest))
        })
        .collect();
    let members: BTreeSet<&str> = manifests.iter().map(|(name, _)| name.as_str()).collect();
    manifests
        .iter()
        .map(|(name, manifest)| {
            let deps = manifest
                .0
                .iter()
                .filter(|e| e.table == "dependencies")
                // `name = ...` or a dotted key, `name.workspace = true`.
                .filter_map(|e| e.key.split('.').next())
                .filter(|key| members.contains(key))
                .map(str::to_owned)
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

/// The keys of a manifest, in order.
struct Manifest(Vec<TomlEntry>);

impl Manifest {
    fn parse(text: &str) -> Manifest {
        let mut entries = Vec::new();
        let mut table = String::new();
        let mut occurrences: BTreeMap<String, usize> = BTreeMap::new();
        let mut lines = text.lines().map(strip_toml_comment);
        while let Some(line) = lines.next() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
                table = name.trim().to_string();
                *occurrences.entry(table.clone()).or_insert(0) += 1;
            } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                table = name.trim().to_string();
            } else if let Some((key, value)) = line.split_once('=') {
                let mut value = value.trim().to_string();
                let depth = |v: &str| {
                    v.chars().filter(|&c| c == '[').count() as isize
                        - v.chars().filter(|&c| c == ']').count() as isize
                };
                while depth(&value) > 0 {
                    match lines.next() {
                        Some(more) => {
                            value.push(' ');
                            value.push_str(more.trim());
                        }
                        None => break,
                    }
                }
                entries.push(TomlEntry {
                    occurrence: occurrences.get(&table).copied().unwrap_or(0),
                    table: table.clone(),
                    key: key.trim().trim_matches('"').to_string(),
                    value,
                });
            }
        }
        Manifest(entries)
    }

    /// The strings of every `key` in `table` (a string or arrays of them).
    fn strings(&self, table: &str, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|e| e.table == table && e.key == key)
            .flat_map(|e| toml_strings(&e.value))
            .collect()
    }

    /// The first string of `key` in the given occurrence of `table`.
    fn string(&self, table: &str, occurrence: usize, key: &str) -> Option<String> {
        self.0
            .iter()
            .find(|e| e.table == table && e.occurrence == occurrence && e.key == key)
            .and_then(|e| toml_strings(&e.value).into_iter().next())
    }

    /// `[lib] path`.
    fn lib_path(&self) -> Option<String> {
        self.string("lib", 0, "path")
    }

    /// Each `[[bin]]` with a `path`: its `name`, if any, and the path.
    fn bins(&self) -> Vec<(Option<String>, String)> {
        let occurrences: BTreeSet<usize> = self
            .0
            .iter()
            .filter(|e| e.table == "bin")
            .map(|e| e.occurrence)
            .collect();
        occurrences
            .into_iter()
            .filter_map(|k| {
                Some((
                    self.string("bin", k, "name"),
                    self.string("bin", k, "path")?,
                ))
            })
            .collect()
    }

    /// The root files the manifest gives its targets (`[lib]`, `[[bin]]`).
    fn target_paths(&self) -> Vec<String> {
        let bins = self.bins().into_iter().map(|(_, path)| path);
        self.lib_path().into_iter().chain(bins).collect()
    }
}

fn strip_toml_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// The string literals in a TOML value (`"a"`, `'b'`, arrays of them).
fn toml_strings(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '"' || c == '\'' {
            let mut s = String::new();
            for d in chars.by_ref() {
                if d == c {
                    break;
                }
                s.push(d);
            }
            out.push(s);
        }
    }
    out
}
