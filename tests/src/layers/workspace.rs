//! The workspace as a tree of source files: its members (the `[workspace]
//! members` of the root `Cargo.toml`, `*` allowed within a path segment),
//! each member's compilation targets (its library and binaries) with their
//! root files, and reading all of it from disk. The manifests are read with
//! a little TOML, enough for their tables, keys and string arrays.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Files by their path relative to the workspace root ('/'-separated).
pub type SourceTree = BTreeMap<String, String>;

/// The workspace manifest, each member's manifest and every `.rs` file under
/// each member's `src/` (and under the folder of any target `path` outside
/// it), read from disk.
pub(super) fn load_workspace(root: &Path) -> SourceTree {
    let mut tree = SourceTree::new();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("read {}/Cargo.toml: {e}", root.display()));
    let members = workspace_members(&manifest);
    assert!(
        !members.is_empty(),
        "no [workspace] members in {}/Cargo.toml",
        root.display()
    );
    tree.insert("Cargo.toml".into(), manifest);
    for pattern in &members {
        for member in expand_on_disk(root, pattern) {
            let toml_path = format!("{member}/Cargo.toml");
            let Ok(toml) = std::fs::read_to_string(root.join(&toml_path)) else {
                continue;
            };
            let mut dirs = vec![format!("{member}/src")];
            for entry in toml_entries(&toml) {
                if entry.key == "path" && (entry.table == "lib" || entry.table == "bin") {
                    if let Some(p) = toml_strings(&entry.value).first() {
                        let dir = Path::new(p)
                            .parent()
                            .map(|d| d.to_string_lossy().into_owned());
                        match dir {
                            Some(d) if !d.is_empty() => dirs.push(format!("{member}/{d}")),
                            _ => dirs.push(member.clone()),
                        }
                    }
                }
            }
            tree.insert(toml_path, toml);
            for dir in dirs {
                load_rs_files(root, &dir, &mut tree);
            }
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
        let rel = if dir.is_empty() {
            name.clone()
        } else {
            format!("{dir}/{name}")
        };
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

/// Directories matching a member pattern (`*` within a path segment).
fn expand_on_disk(root: &Path, pattern: &str) -> Vec<String> {
    let mut found = vec![String::new()];
    for segment in pattern.split('/').filter(|s| !s.is_empty() && *s != ".") {
        let mut next = Vec::new();
        for dir in &found {
            let join = |name: &str| {
                if dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{dir}/{name}")
                }
            };
            if segment.contains('*') {
                if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
                    let mut names: Vec<String> = entries
                        .flatten()
                        .filter(|e| e.path().is_dir())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| glob_match(segment, n))
                        .collect();
                    names.sort();
                    next.extend(names.iter().map(|n| join(n)));
                }
            } else {
                next.push(join(segment));
            }
        }
        found = next;
    }
    found
}

/// The member directories a pattern names in `tree` (they have a
/// `Cargo.toml`).
pub(super) fn expand_in_tree(tree: &SourceTree, pattern: &str) -> Vec<String> {
    let wanted: Vec<&str> = pattern
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    tree.keys()
        .filter_map(|k| k.strip_suffix("/Cargo.toml"))
        .filter(|dir| {
            let parts: Vec<&str> = dir.split('/').collect();
            parts.len() == wanted.len() && parts.iter().zip(&wanted).all(|(p, w)| glob_match(w, p))
        })
        .map(str::to_string)
        .collect()
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

fn toml_entries(text: &str) -> Vec<TomlEntry> {
    let mut out = Vec::new();
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
            out.push(TomlEntry {
                occurrence: occurrences.get(&table).copied().unwrap_or(0),
                table: table.clone(),
                key: key.trim().trim_matches('"').to_string(),
                value,
            });
        }
    }
    out
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

pub(super) fn workspace_members(manifest: &str) -> Vec<String> {
    toml_entries(manifest)
        .into_iter()
        .filter(|e| e.table == "workspace" && e.key == "members")
        .flat_map(|e| toml_strings(&e.value))
        .collect()
}

/// One compilation target of a member: its library or one binary.
#[derive(Clone, Debug)]
pub(super) struct Target {
    /// `unimem-mailbox` (the library) or `unimem-mailbox bin unimem-shm`.
    pub(super) name: String,
    /// The root file, a key of the tree.
    pub(super) root: String,
}

pub(super) fn member_targets(tree: &SourceTree, member: &str) -> Vec<Target> {
    let toml = &tree[&format!("{member}/Cargo.toml")];
    let entries = toml_entries(toml);
    let get = |table: &str, occurrence: usize, key: &str| {
        entries
            .iter()
            .find(|e| e.table == table && e.occurrence == occurrence && e.key == key)
            .and_then(|e| toml_strings(&e.value).into_iter().next())
    };
    let package = get("package", 0, "name").unwrap_or_else(|| member.to_string());
    let in_member = |p: &str| format!("{member}/{}", p.trim_start_matches("./"));
    let mut targets = Vec::new();
    let lib = get("lib", 0, "path").map_or_else(|| in_member("src/lib.rs"), |p| in_member(&p));
    if tree.contains_key(&lib) {
        targets.push(Target {
            name: package.clone(),
            root: lib,
        });
    }
    let mut bins: BTreeMap<String, String> = BTreeMap::new();
    let main = in_member("src/main.rs");
    if tree.contains_key(&main) {
        bins.insert(main, package.clone());
    }
    let bin_dir = in_member("src/bin/");
    for key in tree.keys() {
        let Some(rest) = key.strip_prefix(&bin_dir) else {
            continue;
        };
        if let Some(name) = rest.strip_suffix(".rs").filter(|n| !n.contains('/')) {
            bins.insert(key.clone(), name.to_string());
        } else if let Some(name) = rest.strip_suffix("/main.rs").filter(|n| !n.contains('/')) {
            bins.insert(key.clone(), name.to_string());
        }
    }
    let bin_tables = entries
        .iter()
        .filter(|e| e.table == "bin")
        .map(|e| e.occurrence);
    for occurrence in bin_tables.collect::<BTreeSet<_>>() {
        if let Some(path) = get("bin", occurrence, "path") {
            let name = get("bin", occurrence, "name").unwrap_or_else(|| package.clone());
            bins.insert(in_member(&path), name);
        }
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
