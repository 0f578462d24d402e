//! Layering of the workspace's crates: no circle of imports between the
//! modules of a crate, at two granularities:
//!
//! - files: each source file is a node (`foo/mod.rs` is module `foo`);
//! - top-level modules: the first path segment under `crate::`, i.e. a file
//!   `src/x.rs` or a whole folder `src/x/`, is a node (edges inside one
//!   folder do not count); the crate root (`lib.rs`, `main.rs`) is the node
//!   `crate`, for the items it defines itself.
//!
//! The members come from the workspace `Cargo.toml` (`[workspace] members`,
//! globs allowed); each member's library and binaries are separate crates,
//! read by following `mod` declarations from their root files. Test code is
//! left out: items under `#[cfg(test)]` (the `mod tests` blocks and the
//! files they declare) and the members' `tests/` folders.
//!
//! An edge `a -> b` means code in `a` uses an item defined in `b`: a `use`
//! of `crate::…`, `super::…` (and `self::…` or a child module's name), or
//! such a path in code (`crate::foo::bar(…)`). Paths are followed through
//! re-exports to the module that defines the item, so a facade's `pub use`
//! is not itself an edge (unless the facade's own code uses the name).
//! Containment is no import: neither a `mod x;` declaration nor a module's
//! use of what it contains (`mod.rs` or the crate root using its child
//! modules' items); only uses that go up (`super::`) or sideways count.
//! Parsing is a small
//! hand-written tokenizer (comments and literals skipped) and a scanner for
//! `mod`, `use`, attributes and paths; it is no full Rust parser, but enough
//! for this codebase, and the unit tests below show what it understands.
//!
//! `workspace_has_no_import_cycles` prints each crate's top-level modules
//! in dependency order (lowest layer first) and the edges, then fails
//! listing every circle. `scripts/check-layers` runs just this test.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::Path;

// ===========================================================================
// Source tree: files by path relative to the workspace root ('/'-separated)

type Tree = BTreeMap<String, String>;

/// The workspace manifest, each member's manifest and every `.rs` file under
/// each member's `src/` (and under the folder of any target `path` outside
/// it), read from disk.
fn load_workspace(root: &Path) -> Tree {
    let mut tree = Tree::new();
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

fn load_rs_files(root: &Path, dir: &str, tree: &mut Tree) {
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
fn expand_in_tree(tree: &Tree, pattern: &str) -> Vec<String> {
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
// A little TOML: enough for the manifests' tables, keys and string arrays

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

fn workspace_members(manifest: &str) -> Vec<String> {
    toml_entries(manifest)
        .into_iter()
        .filter(|e| e.table == "workspace" && e.key == "members")
        .flat_map(|e| toml_strings(&e.value))
        .collect()
}

/// One compilation target of a member: its library or one binary.
#[derive(Clone, Debug)]
struct Target {
    /// `unimem-mailbox` (the library) or `unimem-mailbox bin unimem-shm`.
    name: String,
    /// The root file, a key of the tree.
    root: String,
}

fn member_targets(tree: &Tree, member: &str) -> Vec<Target> {
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

// ===========================================================================
// Tokenizer

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A string, char or number literal; strings keep their (raw) text.
    Lit(String),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Rust tokens without comments and whitespace; literals as one token.
fn tokenize(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    while i < c.len() {
        let ch = c[i];
        let start_line = line;
        let mut push = |tok: Tok| {
            out.push(Token {
                tok,
                line: start_line,
            })
        };
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if is_ident_start(ch) {
            let mut j = i;
            while j < c.len() && j - i < 2 && matches!(c[j], 'b' | 'c' | 'r') {
                j += 1;
            }
            let prefix: String = c[i..j].iter().collect();
            let is_prefix = matches!(prefix.as_str(), "b" | "c" | "r" | "br" | "cr");
            let raw = prefix.contains('r');
            let mut hashes = 0;
            while raw && at(j + hashes) == '#' {
                hashes += 1;
            }
            if is_prefix && raw && at(j + hashes) == '"' {
                // r"…", r#"…"#, br"…", cr#"…"#
                let body = j + hashes + 1;
                let mut k = body;
                loop {
                    if k >= c.len() {
                        break;
                    }
                    if c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                        break;
                    }
                    if c[k] == '\n' {
                        line += 1;
                    }
                    k += 1;
                }
                push(Tok::Lit(c[body..k.min(c.len())].iter().collect()));
                i = k + 1 + hashes;
            } else if (is_prefix && !raw && at(j) == '"') || (prefix == "b" && at(j) == '\'') {
                // "…" after b or c; b'…'.
                let (text, end, lines) = quoted(&c, j);
                push(Tok::Lit(text));
                line += lines;
                i = end;
            } else {
                // An identifier, r#raw or not.
                let mut s = i;
                if ch == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
                    s = i + 2;
                }
                let mut k = s;
                while k < c.len() && is_ident_continue(c[k]) {
                    k += 1;
                }
                push(Tok::Ident(c[s..k].iter().collect()));
                i = k;
            }
        } else if ch == '"' {
            let (text, end, lines) = quoted(&c, i);
            push(Tok::Lit(text));
            line += lines;
            i = end;
        } else if ch == '\'' {
            if at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\n') {
                let (text, end, lines) = quoted(&c, i);
                push(Tok::Lit(text));
                line += lines;
                i = end;
            } else {
                // A lifetime or label: 'a, 'static.
                i += 1;
                while i < c.len() && is_ident_continue(c[i]) {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            let s = i;
            while i < c.len()
                && (is_ident_continue(c[i]) || (c[i] == '.' && at(i + 1).is_ascii_digit()))
            {
                i += 1;
            }
            push(Tok::Lit(c[s..i].iter().collect()));
        } else if ch == ':' && at(i + 1) == ':' {
            push(Tok::PathSep);
            i += 2;
        } else {
            push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// A literal quoted with `c[open]` (`"` or `'`), backslash escapes allowed:
/// its text, the index after it and the newlines in it.
fn quoted(c: &[char], open: usize) -> (String, usize, usize) {
    let quote = c[open];
    let mut k = open + 1;
    let mut lines = 0;
    let mut text = String::new();
    while k < c.len() && c[k] != quote {
        if c[k] == '\\' {
            text.push(c[k]);
            k += 1;
        }
        if k < c.len() {
            if c[k] == '\n' {
                lines += 1;
            }
            text.push(c[k]);
        }
        k += 1;
    }
    (text, k + 1, lines)
}

// ===========================================================================
// Scanner: `mod`, `use`, attributes and paths of one file

/// `mod name;` or `mod name { … }`.
#[derive(Clone, Debug)]
struct ModDecl {
    /// The inline modules of the file it is in (empty: the file's module).
    scope: Vec<String>,
    name: String,
    inline: bool,
    path_attr: Option<String>,
    line: usize,
}

/// One leaf of a `use` tree.
#[derive(Clone, Debug)]
struct Import {
    scope: Vec<String>,
    /// As written: `crate`/`self`/`super`/a name, then the rest (no `self`
    /// at the end, no `*`).
    segs: Vec<String>,
    /// The name it brings into scope (`None`: `as _`, or a glob).
    name: Option<String>,
    glob: bool,
    /// `pub`, `pub(crate)`, …: may be a re-export.
    public: bool,
    line: usize,
    /// The module it is written in (set when the crate is read).
    ctx: Vec<String>,
}

/// A path in code: `crate::a::f`, `super::X`, `name::item`.
#[derive(Clone, Debug)]
struct PathRef {
    scope: Vec<String>,
    segs: Vec<String>,
    line: usize,
}

#[derive(Clone, Debug, Default)]
struct Scanned {
    /// `#![cfg(test)]`: the whole file is test code.
    test_only: bool,
    mods: Vec<ModDecl>,
    imports: Vec<Import>,
    paths: Vec<PathRef>,
    /// Identifiers in code outside `use` declarations and attributes.
    idents: BTreeSet<String>,
}

fn ident(t: &[Token], i: usize) -> Option<&str> {
    match t.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn punct(t: &[Token], i: usize, p: char) -> bool {
    matches!(t.get(i).map(|t| &t.tok), Some(Tok::Punct(c)) if *c == p)
}

fn path_sep(t: &[Token], i: usize) -> bool {
    matches!(t.get(i).map(|t| &t.tok), Some(Tok::PathSep))
}

/// Index of the bracket closing the one at `open` (or the end).
fn closing(t: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, token) in t.iter().enumerate().skip(open) {
        match token.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    t.len()
}

/// Splits tokens at the commas outside brackets.
fn split_commas(t: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (k, token) in t.iter().enumerate() {
        match token.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => depth = depth.saturating_sub(1),
            Tok::Punct(',') if depth == 0 => {
                parts.push(&t[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    if start < t.len() {
        parts.push(&t[start..]);
    }
    parts
}

/// Whether a `cfg` predicate holds only in test builds: `test`,
/// `all(…, test, …)`, `any(a, b)` with every branch test-only.
fn test_only_predicate(t: &[Token]) -> bool {
    match (ident(t, 0), t.len()) {
        (Some("test"), 1) => true,
        (Some(op @ ("all" | "any")), n) if n >= 3 && punct(t, 1, '(') => {
            let inner = &t[2..n - 1];
            let parts = split_commas(inner);
            if op == "all" {
                parts.iter().any(|p| test_only_predicate(p))
            } else {
                !parts.is_empty() && parts.iter().all(|p| test_only_predicate(p))
            }
        }
        _ => false,
    }
}

/// Attribute contents (between `#[` and `]`): `cfg(<test-only>)`?
fn is_cfg_test(attr: &[Token]) -> bool {
    ident(attr, 0) == Some("cfg")
        && punct(attr, 1, '(')
        && attr.len() >= 3
        && test_only_predicate(&attr[2..attr.len() - 1])
}

/// Attribute contents `path = "…"`.
fn path_attr(attr: &[Token]) -> Option<String> {
    match (ident(attr, 0), attr.get(1).map(|t| &t.tok), attr.get(2)) {
        (
            Some("path"),
            Some(Tok::Punct('=')),
            Some(Token {
                tok: Tok::Lit(p), ..
            }),
        ) => Some(p.clone()),
        _ => None,
    }
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "mod",
    "impl",
    "struct",
    "enum",
    "union",
    "trait",
    "use",
    "const",
    "static",
    "type",
    "let",
    "macro_rules",
    "extern",
];

/// Skips the item (or field, statement, match arm) that starts at `i`,
/// after a test-only attribute; returns the index after it.
fn skip_item(t: &[Token], mut i: usize) -> usize {
    // More attributes first.
    while punct(t, i, '#') {
        let open = if punct(t, i + 1, '!') { i + 2 } else { i + 1 };
        if !punct(t, open, '[') {
            break;
        }
        i = closing(t, open) + 1;
    }
    // What kind of item: skip visibility and qualifiers.
    let mut j = i;
    let mut keyword = None;
    while let Some(tok) = t.get(j) {
        match &tok.tok {
            Tok::Ident(w) if w == "pub" => {
                j += 1;
                if punct(t, j, '(') {
                    j = closing(t, j) + 1;
                }
            }
            Tok::Ident(w) if matches!(w.as_str(), "unsafe" | "async" | "default") => j += 1,
            Tok::Ident(w) if w == "extern" && !matches!(ident(t, j + 1), Some("crate")) => {
                j += 1;
                if matches!(t.get(j).map(|t| &t.tok), Some(Tok::Lit(_))) {
                    j += 1;
                }
                if !punct(t, j, '{') {
                    continue;
                }
                keyword = Some("extern");
                break;
            }
            Tok::Ident(w) if ITEM_KEYWORDS.contains(&w.as_str()) => {
                keyword = Some(w.as_str());
                break;
            }
            _ => break,
        }
    }
    let const_fn = keyword == Some("const")
        && matches!(ident(t, j + 1), Some("fn" | "unsafe" | "async" | "extern"));
    let semicolon_only =
        matches!(keyword, Some("use" | "const" | "static" | "type" | "let")) && !const_fn;
    let is_item = keyword.is_some();
    let mut depth = 0usize;
    while let Some(tok) = t.get(i) {
        match tok.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(c @ (')' | ']' | '}')) => {
                if depth == 0 {
                    return i; // the end of the enclosing block
                }
                depth -= 1;
                if c == '}' && depth == 0 && is_item && !semicolon_only {
                    return if punct(t, i + 1, ';') { i + 2 } else { i + 1 };
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct(',') if depth == 0 && !is_item => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// One `use` tree, `t[i]` being its first token; leaves go to `out` as
/// (segments, name, glob). Returns the index after the tree.
fn use_tree(
    t: &[Token],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>, bool)>,
) -> usize {
    if punct(t, i, '{') {
        i += 1;
        loop {
            if punct(t, i, '}') || i >= t.len() {
                return i + 1;
            }
            let next = use_tree(t, i, prefix.clone(), out);
            if next <= i {
                return t.len();
            }
            i = next;
            if punct(t, i, ',') {
                i += 1;
            }
        }
    }
    if punct(t, i, '*') {
        out.push((prefix, None, true));
        return i + 1;
    }
    let Some(segment) = ident(t, i) else {
        return i + 1; // not a use tree: move on
    };
    let mut segs = prefix;
    segs.push(segment.to_string());
    i += 1;
    if path_sep(t, i) {
        return use_tree(t, i + 1, segs, out);
    }
    let mut name = Some(segment.to_string());
    if segment == "self" {
        segs.pop();
        name = segs.last().cloned();
    }
    if ident(t, i) == Some("as") {
        name = ident(t, i + 1).filter(|a| *a != "_").map(str::to_string);
        i += 2;
    }
    out.push((segs, name, false));
    i
}

/// Scans one file: its `mod`s, `use`s and paths, test code left out.
fn scan(src: &str) -> Scanned {
    let t = tokenize(src);
    let mut s = Scanned::default();
    // Inline modules we are in: name, brace depth of their body.
    let mut scopes: Vec<(String, usize)> = Vec::new();
    let scope_of = |scopes: &[(String, usize)]| scopes.iter().map(|(n, _)| n.clone()).collect();
    let mut depth = 0usize;
    let mut pending_path: Option<String> = None;
    let mut i = 0;
    while i < t.len() {
        let module_level = depth == scopes.last().map_or(0, |s| s.1);
        match &t[i].tok {
            Tok::Punct('#') => {
                let inner = punct(&t, i + 1, '!');
                let open = i + 1 + usize::from(inner);
                if !punct(&t, open, '[') {
                    i += 1;
                    continue;
                }
                let close = closing(&t, open);
                let attr = &t[open + 1..close.min(t.len())];
                i = close + 1;
                if is_cfg_test(attr) {
                    if !inner {
                        i = skip_item(&t, i);
                        pending_path = None;
                    } else if scopes.is_empty() {
                        s.test_only = true;
                        return s;
                    } else {
                        // `#![cfg(test)]` inside an inline module: skip its body.
                        while i < t.len() && depth >= scopes.last().map_or(0, |s| s.1) {
                            match t[i].tok {
                                Tok::Punct('{') => depth += 1,
                                Tok::Punct('}') => depth -= 1,
                                _ => {}
                            }
                            i += 1;
                        }
                        scopes.pop();
                    }
                } else if let Some(p) = path_attr(attr) {
                    pending_path = Some(p);
                }
            }
            Tok::Punct('{') => {
                depth += 1;
                pending_path = None;
                i += 1;
            }
            Tok::Punct('}') => {
                if scopes.last().is_some_and(|s| s.1 == depth) {
                    scopes.pop();
                }
                depth = depth.saturating_sub(1);
                pending_path = None;
                i += 1;
            }
            Tok::Punct(';') => {
                pending_path = None;
                i += 1;
            }
            Tok::Ident(w) if w == "pub" => {
                i += 1;
                if punct(&t, i, '(') {
                    // pub(crate), pub(in crate::x): not paths of code.
                    i = closing(&t, i) + 1;
                }
                if ident(&t, i) == Some("use") && !punct(&t, i + 1, '<') {
                    i = scan_use(&t, i + 1, scope_of(&scopes), true, &mut s);
                }
            }
            Tok::Ident(w) if w == "use" && !punct(&t, i + 1, '<') => {
                i = scan_use(&t, i + 1, scope_of(&scopes), false, &mut s);
            }
            Tok::Ident(w) if w == "mod" && module_level && ident(&t, i + 1).is_some() => {
                let name = ident(&t, i + 1).unwrap_or_default().to_string();
                let inline = punct(&t, i + 2, '{');
                s.mods.push(ModDecl {
                    scope: scope_of(&scopes),
                    name: name.clone(),
                    inline,
                    path_attr: pending_path.take(),
                    line: t[i].line,
                });
                if inline {
                    depth += 1;
                    scopes.push((name, depth));
                    i += 3;
                } else {
                    i += 2;
                }
            }
            Tok::Ident(w) => {
                let after_sep = i > 0 && path_sep(&t, i - 1);
                let dollar = i > 0 && punct(&t, i - 1, '$');
                if !after_sep && path_sep(&t, i + 1) && ident(&t, i + 2).is_some() {
                    let mut segs = vec![if dollar && w == "crate" {
                        "crate".to_string()
                    } else {
                        w.clone()
                    }];
                    let mut j = i + 1;
                    while path_sep(&t, j) {
                        let Some(next) = ident(&t, j + 1) else { break };
                        segs.push(next.to_string());
                        j += 2;
                    }
                    s.idents.extend(segs.iter().cloned());
                    s.paths.push(PathRef {
                        scope: scope_of(&scopes),
                        segs,
                        line: t[i].line,
                    });
                    i = j;
                } else {
                    s.idents.insert(w.clone());
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    s
}

/// A `use` declaration whose tree starts at `t[i]`; returns the index after
/// its `;`.
fn scan_use(t: &[Token], i: usize, scope: Vec<String>, public: bool, s: &mut Scanned) -> usize {
    let line = t.get(i).map_or(0, |t| t.line);
    let mut end = i;
    if !path_sep(t, i) {
        // `use ::x` is an external crate: nothing of ours.
        let mut leaves = Vec::new();
        end = use_tree(t, i, Vec::new(), &mut leaves);
        for (segs, name, glob) in leaves {
            if !segs.is_empty() {
                s.imports.push(Import {
                    scope: scope.clone(),
                    segs,
                    name,
                    glob,
                    public,
                    line,
                    ctx: Vec::new(),
                });
            }
        }
    }
    while end < t.len() && !punct(t, end, ';') {
        end += 1;
    }
    end + 1
}

// ===========================================================================
// Module tree of one crate, and what each file uses

type ModPath = Vec<String>;

#[derive(Debug, Default)]
struct Module {
    /// The file it is written in (inline modules: the enclosing file).
    file: String,
    children: BTreeSet<String>,
    /// Names brought in by `use` (any visibility), by name.
    imports: BTreeMap<String, Import>,
}

#[derive(Debug)]
struct FileInfo {
    module: ModPath,
    scanned: Scanned,
}

/// Where a path leads: the module that defines the item, or the module the
/// path names (`item == false`).
#[derive(Debug, PartialEq, Eq)]
struct Resolved {
    module: ModPath,
    item: bool,
}

struct Crate {
    modules: BTreeMap<ModPath, Module>,
    files: BTreeMap<String, FileInfo>,
    notes: Vec<String>,
}

fn parent_dir(file: &str) -> &str {
    file.rfind('/').map_or("", |k| &file[..k])
}

fn join(dir: &str, rest: &str) -> String {
    let mut parts: Vec<&str> = if dir.is_empty() {
        Vec::new()
    } else {
        dir.split('/').collect()
    };
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

impl Crate {
    /// Reads the crate from its root file, following `mod` declarations.
    fn load(tree: &Tree, target: &Target) -> Crate {
        let mut krate = Crate {
            modules: BTreeMap::new(),
            files: BTreeMap::new(),
            notes: Vec::new(),
        };
        // (file, its module, whether it is a "mod-rs" file)
        let mut queue = VecDeque::from([(target.root.clone(), ModPath::new(), true)]);
        while let Some((file, module, mod_rs)) = queue.pop_front() {
            if krate.files.contains_key(&file) {
                krate.notes.push(format!("{file} is included twice"));
                continue;
            }
            let Some(text) = tree.get(&file) else {
                continue;
            };
            let scanned = scan(text);
            if scanned.test_only {
                continue;
            }
            krate.modules.entry(module.clone()).or_default().file = file.clone();
            // Child modules of this file go to `dir` (plus inline modules).
            let dir = if mod_rs {
                parent_dir(&file).to_string()
            } else {
                file.trim_end_matches(".rs").to_string()
            };
            for decl in &scanned.mods {
                let parent: ModPath = module.iter().chain(&decl.scope).cloned().collect();
                let mut child = parent.clone();
                child.push(decl.name.clone());
                krate
                    .modules
                    .entry(parent)
                    .or_default()
                    .children
                    .insert(decl.name.clone());
                if decl.inline {
                    let m = krate.modules.entry(child).or_default();
                    m.file = file.clone();
                    continue;
                }
                let scope_dir = decl.scope.iter().fold(dir.clone(), |d, s| join(&d, s));
                let candidates = match &decl.path_attr {
                    Some(p) if decl.scope.is_empty() => vec![join(parent_dir(&file), p)],
                    Some(p) => vec![join(&scope_dir, p)],
                    None => vec![
                        join(&scope_dir, &format!("{}.rs", decl.name)),
                        join(&scope_dir, &format!("{}/mod.rs", decl.name)),
                    ],
                };
                match candidates.into_iter().find(|c| tree.contains_key(c)) {
                    Some(found) => {
                        let child_mod_rs = decl.path_attr.is_some() || found.ends_with("/mod.rs");
                        queue.push_back((found, child, child_mod_rs));
                    }
                    None => krate.notes.push(format!(
                        "{file}:{}: no file for `mod {}`",
                        decl.line, decl.name
                    )),
                }
            }
            for import in &scanned.imports {
                if let Some(name) = &import.name {
                    let ctx: ModPath = module.iter().chain(&import.scope).cloned().collect();
                    let import = Import {
                        ctx: ctx.clone(),
                        ..import.clone()
                    };
                    krate
                        .modules
                        .entry(ctx)
                        .or_default()
                        .imports
                        .insert(name.clone(), import);
                }
            }
            krate.files.insert(file, FileInfo { module, scanned });
        }
        krate
    }

    /// Follows `segs`, written in module `ctx`, to where it leads; `None`
    /// for paths outside the crate (other crates, std, local types …).
    fn resolve(&self, ctx: &[String], segs: &[String], hops: usize) -> Option<Resolved> {
        if hops > 32 || segs.is_empty() {
            return None;
        }
        let (start, rest): (ModPath, &[String]) = match segs[0].as_str() {
            "crate" => (ModPath::new(), &segs[1..]),
            "self" => (ctx.to_vec(), &segs[1..]),
            "super" => {
                let mut cur = ctx.to_vec();
                let mut k = 0;
                while segs.get(k).is_some_and(|s| s == "super") {
                    cur.pop()?;
                    k += 1;
                }
                (cur, &segs[k..])
            }
            first => {
                let m = self.modules.get(ctx)?;
                if m.children.contains(first) {
                    let mut cur = ctx.to_vec();
                    cur.push(first.to_string());
                    (cur, &segs[1..])
                } else {
                    let import = m.imports.get(first)?;
                    return self.follow(import, &segs[1..], hops);
                }
            }
        };
        self.walk(start, rest, hops)
    }

    fn follow(&self, import: &Import, rest: &[String], hops: usize) -> Option<Resolved> {
        let full: Vec<String> = import.segs.iter().chain(rest).cloned().collect();
        self.resolve(&import.ctx, &full, hops + 1)
    }

    fn walk(&self, mut cur: ModPath, rest: &[String], hops: usize) -> Option<Resolved> {
        for (k, seg) in rest.iter().enumerate() {
            let m = self.modules.get(&cur)?;
            if m.children.contains(seg) {
                cur.push(seg.clone());
            } else if let Some(import) = m.imports.get(seg) {
                return self.follow(import, &rest[k + 1..], hops);
            } else {
                return Some(Resolved {
                    module: cur,
                    item: true,
                });
            }
        }
        Some(Resolved {
            module: cur,
            item: false,
        })
    }

    /// The file a module is written in.
    fn file_of(&self, module: &[String]) -> Option<&str> {
        self.modules
            .get(module)
            .map(|m| m.file.as_str())
            .filter(|f| !f.is_empty())
    }

    /// Every use of another file's items: (from file, to file, evidence).
    /// A module using its own descendants' items is containment, not an
    /// import: no edge.
    fn file_edges(&self) -> Vec<(String, String, String)> {
        let mut edges = Vec::new();
        for (file, info) in &self.files {
            let mut add = |resolved: Option<Resolved>, line: usize, what: String| {
                let Some(resolved) = resolved else { return };
                if resolved.module.starts_with(&info.module) {
                    return; // this file's module or one it contains
                }
                if let Some(to) = self.file_of(&resolved.module) {
                    if to != file {
                        edges.push((
                            file.clone(),
                            to.to_string(),
                            format!("{file}:{line}: {what}"),
                        ));
                    }
                }
            };
            for import in &info.scanned.imports {
                let ctx: ModPath = info.module.iter().chain(&import.scope).cloned().collect();
                let written = format!(
                    "use {}{}",
                    import.segs.join("::"),
                    if import.glob { "::*" } else { "" }
                );
                if import.glob {
                    // `use x::*` uses x's items; `pub use x::*` re-exports them.
                    if !import.public {
                        add(self.resolve(&ctx, &import.segs, 0), import.line, written);
                    }
                    continue;
                }
                // A `pub use` whose name the file's code never mentions is a
                // re-export only: its users are traced to the item itself.
                let used_here = import
                    .name
                    .as_ref()
                    .is_none_or(|n| info.scanned.idents.contains(n));
                if import.public && !used_here {
                    continue;
                }
                // A module import (`use crate::m;`) is no edge by itself: the
                // paths through it (`m::f()`) are.
                match self.resolve(&ctx, &import.segs, 0) {
                    Some(r) if r.item => add(Some(r), import.line, written),
                    _ => {}
                }
            }
            for path in &info.scanned.paths {
                let ctx: ModPath = info.module.iter().chain(&path.scope).cloned().collect();
                add(
                    self.resolve(&ctx, &path.segs, 0),
                    path.line,
                    path.segs.join("::"),
                );
            }
        }
        edges
    }
}

// ===========================================================================
// Graphs

/// A directed graph of named nodes; each edge keeps the first place that
/// made it.
#[derive(Debug, Default)]
struct Graph {
    nodes: BTreeSet<String>,
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    fn add_edge(&mut self, from: &str, to: &str, evidence: &str) {
        if from == to {
            return;
        }
        self.nodes.insert(from.to_string());
        self.nodes.insert(to.to_string());
        self.edges
            .entry(from.to_string())
            .or_default()
            .entry(to.to_string())
            .or_insert_with(|| evidence.to_string());
    }

    fn targets(&self, node: &str) -> impl Iterator<Item = &String> {
        self.edges.get(node).into_iter().flat_map(|m| m.keys())
    }

    /// Strongly connected components (Tarjan), each sorted.
    fn components(&self) -> Vec<Vec<String>> {
        struct State<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            out: Vec<Vec<String>>,
        }
        fn visit<'g>(s: &mut State<'g>, v: &'g str) {
            let n = s.index.len();
            s.index.insert(v, n);
            s.low.insert(v, n);
            s.stack.push(v);
            s.on_stack.insert(v);
            for w in s.graph.targets(v) {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if s.low[v] == s.index[v] {
                let mut component = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                s.out.push(component);
            }
        }
        let mut s = State {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for v in &self.nodes {
            if !s.index.contains_key(v.as_str()) {
                visit(&mut s, v);
            }
        }
        s.out
    }

    /// The components with more than one node: the import circles.
    fn cycles(&self) -> Vec<Vec<String>> {
        let mut cycles: Vec<Vec<String>> = self
            .components()
            .into_iter()
            .filter(|c| c.len() > 1)
            .collect();
        cycles.sort();
        cycles
    }

    /// Components in layers: layer 0 uses nothing else, layer n uses only
    /// lower layers (at least one of n-1).
    fn layers(&self) -> Vec<Vec<Vec<String>>> {
        let components = self.components();
        let of: BTreeMap<&str, usize> = components
            .iter()
            .enumerate()
            .flat_map(|(k, c)| c.iter().map(move |n| (n.as_str(), k)))
            .collect();
        // Tarjan emits a component after everything it reaches: one pass.
        let mut layer = vec![0usize; components.len()];
        for (k, component) in components.iter().enumerate() {
            for node in component {
                for target in self.targets(node) {
                    let t = of[target.as_str()];
                    if t != k {
                        layer[k] = layer[k].max(layer[t] + 1);
                    }
                }
            }
        }
        let mut layers: Vec<Vec<Vec<String>>> =
            vec![Vec::new(); layer.iter().max().map_or(0, |m| m + 1)];
        for (k, component) in components.into_iter().enumerate() {
            layers[layer[k]].push(component);
        }
        for l in &mut layers {
            l.sort();
        }
        layers
    }

    /// A shortest circle through the first node of `component`, as
    /// `a, b, …, a`.
    fn example_cycle(&self, component: &[String]) -> Vec<String> {
        let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
        let start = component[0].as_str();
        let mut previous: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(v) = queue.pop_front() {
            for w in self.targets(v).map(String::as_str) {
                if w == start {
                    // Back from v to the start, then turned around.
                    let mut cycle = vec![start.to_string()];
                    let mut at = v;
                    while at != start {
                        cycle.push(at.to_string());
                        at = previous[at];
                    }
                    cycle.push(start.to_string());
                    cycle.reverse();
                    return cycle;
                }
                if inside.contains(w) && !previous.contains_key(w) {
                    previous.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        component.to_vec()
    }
}

// ===========================================================================
// The check

/// What the check found in one crate (library or binary).
struct CrateReport {
    name: String,
    root: String,
    file_graph: Graph,
    top_graph: Graph,
    /// Files by node name, for the listing.
    files: BTreeMap<String, String>,
    notes: Vec<String>,
}

impl CrateReport {
    fn file_cycles(&self) -> Vec<Vec<String>> {
        self.file_graph.cycles()
    }

    fn top_cycles(&self) -> Vec<Vec<String>> {
        self.top_graph.cycles()
    }
}

fn module_name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

fn check(tree: &Tree) -> Vec<CrateReport> {
    let manifest = tree.get("Cargo.toml").expect("workspace Cargo.toml");
    let mut reports = Vec::new();
    for pattern in workspace_members(manifest) {
        for member in expand_in_tree(tree, &pattern) {
            for target in member_targets(tree, &member) {
                reports.push(check_crate(tree, &target));
            }
        }
    }
    reports
}

fn check_crate(tree: &Tree, target: &Target) -> CrateReport {
    let krate = Crate::load(tree, target);
    let node_of_file: BTreeMap<&str, &ModPath> = krate
        .files
        .iter()
        .map(|(f, info)| (f.as_str(), &info.module))
        .collect();
    let mut report = CrateReport {
        name: target.name.clone(),
        root: target.root.clone(),
        file_graph: Graph::default(),
        top_graph: Graph::default(),
        files: BTreeMap::new(),
        notes: krate.notes.clone(),
    };
    for (file, module) in &node_of_file {
        let name = module_name(module);
        report.file_graph.nodes.insert(name.clone());
        report
            .top_graph
            .nodes
            .insert(module_name(&module[..module.len().min(1)]));
        report.files.insert(name, file.to_string());
    }
    for (from, to, evidence) in krate.file_edges() {
        let (a, b) = (node_of_file[from.as_str()], node_of_file[to.as_str()]);
        report
            .file_graph
            .add_edge(&module_name(a), &module_name(b), &evidence);
        report.top_graph.add_edge(
            &module_name(&a[..a.len().min(1)]),
            &module_name(&b[..b.len().min(1)]),
            &evidence,
        );
    }
    report
}

fn render_layers(graph: &Graph) -> String {
    let mut s = String::new();
    for (k, layer) in graph.layers().iter().enumerate() {
        let names: Vec<String> = layer
            .iter()
            .map(|c| {
                if c.len() == 1 {
                    c[0].clone()
                } else {
                    format!("{{{}}} (CIRCLE)", c.join(" "))
                }
            })
            .collect();
        let _ = writeln!(s, "    {k}: {}", names.join(", "));
    }
    s
}

fn render_edges(graph: &Graph) -> String {
    let mut s = String::new();
    for (from, to) in &graph.edges {
        let targets: Vec<&str> = to.keys().map(String::as_str).collect();
        let _ = writeln!(s, "    {from} -> {}", targets.join(", "));
    }
    if graph.edges.is_empty() {
        s.push_str("    (none)\n");
    }
    s
}

/// The circles of one granularity, with one example loop and the edges
/// inside each (with where they come from).
fn render_cycles(graph: &Graph, what: &str, crate_name: &str) -> String {
    let mut s = String::new();
    for cycle in graph.cycles() {
        let _ = writeln!(
            s,
            "{crate_name}: import circle of {} {what}: {}",
            cycle.len(),
            cycle.join(", ")
        );
        let _ = writeln!(s, "  e.g. {}", graph.example_cycle(&cycle).join(" -> "));
        let inside: BTreeSet<&String> = cycle.iter().collect();
        for from in &cycle {
            for (to, evidence) in graph.edges.get(from).into_iter().flatten() {
                if inside.contains(to) {
                    let _ = writeln!(s, "    {from} -> {to}   ({evidence})");
                }
            }
        }
    }
    s
}

fn render(reports: &[CrateReport]) -> String {
    let mut s = String::new();
    for r in reports {
        let _ = writeln!(
            s,
            "== {} ({}): {} files, {} top-level modules",
            r.name,
            r.root,
            r.file_graph.nodes.len(),
            r.top_graph.nodes.len()
        );
        s.push_str("  top-level modules, lowest layer first:\n");
        s.push_str(&render_layers(&r.top_graph));
        s.push_str("  top-level edges (a -> b: a uses b):\n");
        s.push_str(&render_edges(&r.top_graph));
        for note in &r.notes {
            let _ = writeln!(s, "  note: {note}");
        }
    }
    s
}

fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf()
}

#[test]
fn workspace_has_no_import_cycles() {
    let root = repo_root();
    let tree = load_workspace(&root);
    let reports = check(&tree);
    assert!(
        reports.iter().any(|r| r.file_graph.nodes.len() > 1),
        "found no crate with modules: is {} the workspace?",
        root.display()
    );
    println!("{}", render(&reports));
    let mut failures = String::new();
    for r in &reports {
        failures.push_str(&render_cycles(&r.file_graph, "files", &r.name));
        failures.push_str(&render_cycles(&r.top_graph, "top-level modules", &r.name));
    }
    assert!(failures.is_empty(), "import circles:\n{failures}");
    println!("no import circles in {} crates", reports.len());
}

// ===========================================================================
// The checker itself, on small trees

fn fixture(files: &[(&str, &str)]) -> Tree {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

/// A workspace of one member `a` with the given files under `a/src/`.
fn one_crate(files: &[(&str, &str)]) -> CrateReport {
    let mut tree = fixture(&[
        ("Cargo.toml", "[workspace]\nmembers = [\"a\"]\n"),
        ("a/Cargo.toml", "[package]\nname = \"a\"\n"),
    ]);
    for (path, text) in files {
        tree.insert(format!("a/src/{path}"), text.to_string());
    }
    let mut reports = check(&tree);
    assert_eq!(reports.len(), 1, "one crate");
    reports.remove(0)
}

fn edges(graph: &Graph) -> Vec<String> {
    graph
        .edges
        .iter()
        .flat_map(|(f, to)| to.keys().map(move |t| format!("{f}->{t}")))
        .collect()
}

#[test]
fn a_circle_of_files_is_reported() {
    let r = one_crate(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        ("b.rs", "pub struct B;\npub fn f() { crate::c::g(); }\n"),
        ("c.rs", "pub fn g() { let _ = super::a::A; }\n"),
    ]);
    assert_eq!(r.file_cycles(), vec![vec!["a", "b", "c"]]);
    assert_eq!(r.top_cycles(), vec![vec!["a", "b", "c"]]);
    let text = render_cycles(&r.file_graph, "files", "a");
    assert!(
        text.contains("a -> b   (a/src/a.rs:1: use crate::b::B)"),
        "{text}"
    );
    assert!(text.contains("e.g. a -> b -> c -> a"), "{text}");
}

#[test]
fn layered_modules_pass_and_come_in_order() {
    let r = one_crate(&[
        (
            "lib.rs",
            "pub mod low;\npub mod mid;\npub mod high;\npub use high::H;\n",
        ),
        ("low.rs", "pub struct L;\n"),
        ("mid.rs", "use crate::low::L;\npub struct M(pub L);\n"),
        (
            "high.rs",
            "use crate::{low::L, mid::M};\npub struct H(L, M);\n",
        ),
    ]);
    assert!(r.file_cycles().is_empty());
    assert!(r.top_cycles().is_empty());
    let layers = render_layers(&r.top_graph);
    assert_eq!(
        layers, "    0: crate, low\n    1: mid\n    2: high\n",
        "{layers}"
    );
    assert_eq!(edges(&r.top_graph), ["high->low", "high->mid", "mid->low"]);
}

#[test]
fn grouped_imports_and_self() {
    let r = one_crate(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n"),
        ("b.rs", "pub mod inner;\n"),
        ("b/inner.rs", "pub struct X;\n"),
        ("c.rs", "pub struct Y;\n"),
        ("d.rs", "pub fn f() {}\n"),
        (
            "a.rs",
            "use crate::{\n    b::{self, inner::{X}},\n    c::Y as Why,\n    d,\n    self as _,\n};\n\
             fn g(_: X, _: Why) { d::f(); let _ = b::inner::X; }\n",
        ),
    ]);
    assert_eq!(edges(&r.file_graph), ["a->b::inner", "a->c", "a->d"]);
    // At the top level b/inner.rs is part of b.
    assert_eq!(edges(&r.top_graph), ["a->b", "a->c", "a->d"]);
}

#[test]
fn super_paths_resolve_from_the_files_module() {
    let r = one_crate(&[
        ("lib.rs", "mod x;\nmod z;\n"),
        ("x/mod.rs", "mod y;\nmod w;\npub struct P;\n"),
        (
            "x/y.rs",
            "use super::super::z::Q;\nfn f() { super::w::g(); let _ = super::P; }\n",
        ),
        ("x/w.rs", "pub fn g() {}\n"),
        ("z.rs", "pub struct Q;\n"),
    ]);
    assert_eq!(edges(&r.file_graph), ["x::y->x", "x::y->x::w", "x::y->z"]);
    // The parent declaring its children is no import: no circle.
    assert!(r.file_cycles().is_empty());
    // Edges within the folder x do not count at the top level.
    assert_eq!(edges(&r.top_graph), ["x->z"]);
}

#[test]
fn folders_are_one_node_at_the_top_level() {
    // No circle of files, but one between the folder a and c.
    let r = one_crate(&[
        ("lib.rs", "mod a;\nmod c;\n"),
        ("a/mod.rs", "mod b;\nmod d;\n"),
        ("a/b.rs", "use crate::c::C;\n"),
        ("a/d.rs", "pub struct D;\n"),
        (
            "c.rs",
            "pub struct C;\nfn f() { let _ = crate::a::d::D; }\n",
        ),
    ]);
    assert!(r.file_cycles().is_empty(), "{:?}", r.file_cycles());
    assert_eq!(r.top_cycles(), vec![vec!["a", "c"]]);
}

#[test]
fn comments_strings_and_test_code_are_no_imports() {
    let r = one_crate(&[
        ("lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n"),
        (
            "a.rs",
            r####"pub struct A;
// use crate::b::B;
/* outer /* crate::b::B nested */ still a comment crate::b::f() */
/// Doc: [`crate::b::B`]
const S: &str = "crate::b::B \" crate::b::f()";
const R: &str = r#"crate::b::B "# ;
const C: char = '"';
fn f<'a>(x: &'a str) -> &'a str { let _ = b'\''; x }
#[cfg(test)]
mod tests {
    use crate::b::B;
    #[test]
    fn t() { let _ = crate::b::B; }
}
#[cfg(all(test, unix))]
fn helper() { crate::b::f(); }
"####,
        ),
        (
            "b.rs",
            "pub struct B;\npub fn f() { let _ = crate::a::A; }\n",
        ),
        ("tests.rs", "use crate::b::B;\nuse crate::a::A;\n"),
    ]);
    assert_eq!(edges(&r.file_graph), ["b->a"]);
    assert!(!r.files.values().any(|f| f.ends_with("tests.rs")));
}

#[test]
fn re_exports_lead_to_the_defining_module() {
    // The root defines Error and re-exports Addr; a and b use both through
    // the root. Only the root's own items make edges to it.
    let r = one_crate(&[
        (
            "lib.rs",
            "pub mod addr;\npub mod node;\npub use addr::Addr;\npub enum Error { Dead }\n",
        ),
        ("addr.rs", "use crate::Error;\npub struct Addr;\n"),
        (
            "node.rs",
            "pub fn f() -> Result<crate::Addr, crate::Error> { Err(crate::Error::Dead) }\n",
        ),
    ]);
    assert_eq!(
        edges(&r.file_graph),
        ["addr->crate", "node->addr", "node->crate"]
    );
    assert!(r.file_cycles().is_empty());
    // A re-export that the module's own code uses is an import too.
    let r = one_crate(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a.rs", "pub struct A;\npub fn f() { crate::b::g(); }\n"),
        ("b.rs", "pub use crate::a::A;\npub fn g() -> A { A }\n"),
    ]);
    assert_eq!(r.file_cycles(), vec![vec!["a", "b"]]);
    // ...and one it does not use is none.
    let r = one_crate(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        (
            "a.rs",
            "pub struct A;\npub fn f() { crate::b::g(); let _ = crate::b::A; }\n",
        ),
        ("b.rs", "pub use crate::a::A;\npub fn g() {}\n"),
    ]);
    assert_eq!(edges(&r.file_graph), ["a->b"]);
}

#[test]
fn a_module_using_what_it_contains_is_no_circle() {
    // ep/mod.rs wires up its child's tables, the child uses a helper of its
    // parent; the crate root uses a type of region, which uses the root's
    // error type. Containment both, no import circle.
    let r = one_crate(&[
        (
            "lib.rs",
            "mod ep;\nmod region;\npub use region::Buf;\npub enum Error {}\n\
             pub trait Engine { fn alloc(&self) -> Result<Buf, Error>; }\n",
        ),
        ("region.rs", "use crate::Error;\npub struct Buf;\n"),
        (
            "ep/mod.rs",
            "mod data;\npub fn ep_of() {}\npub static OPS: u8 = data::MSG_OPS;\n",
        ),
        (
            "ep/data.rs",
            "use super::ep_of;\npub static MSG_OPS: u8 = 0;\n",
        ),
    ]);
    assert_eq!(edges(&r.file_graph), ["ep::data->ep", "region->crate"]);
    assert!(r.file_cycles().is_empty());
    // But a child in a circle with a sibling of its parent is one.
    let r = one_crate(&[
        ("lib.rs", "mod ep;\nmod cq;\n"),
        ("ep/mod.rs", "pub mod data;\n"),
        (
            "ep/data.rs",
            "pub fn f() { crate::cq::g(); }\npub fn h() {}\n",
        ),
        ("cq.rs", "pub fn g() { crate::ep::data::h(); }\n"),
    ]);
    assert_eq!(r.file_cycles(), vec![vec!["cq", "ep::data"]]);
    assert_eq!(r.top_cycles(), vec![vec!["cq", "ep"]]);
}

#[test]
fn macro_paths_turbofish_and_visibility() {
    let r = one_crate(&[
        ("lib.rs", "pub mod m;\npub mod n;\npub mod o;\n"),
        (
            "m.rs",
            "macro_rules! mk { () => { $crate::n::N::new() } }\n\
             pub(in crate::o) fn f() { let _ = crate::o::make::<u8>(); }\n\
             pub(crate) fn g() { let _ = <u8 as Default>::default(); let _ = ::std::mem::size_of::<u8>(); }\n",
        ),
        ("n.rs", "pub struct N;\nimpl N { pub fn new() -> N { N } }\n"),
        ("o.rs", "pub fn make<T>() {}\n"),
    ]);
    assert_eq!(edges(&r.file_graph), ["m->n", "m->o"]);
}

#[test]
fn members_come_from_the_workspace_manifest() {
    let tree = fixture(&[
        (
            "Cargo.toml",
            "[workspace]\nresolver = \"2\"\nmembers = [\n    \"one\", # a comment\n    \"nested/two\",\n    \"many/*\",\n]\n\n[workspace.package]\nversion = \"0.1.0\"\n",
        ),
        ("one/Cargo.toml", "[package]\nname = \"one\"\n[lib]\nname = \"uno\"\n"),
        ("one/src/lib.rs", "mod a;\nmod b;\n"),
        ("one/src/a.rs", "use crate::b::B;\n"),
        ("one/src/b.rs", "pub struct B;\nuse crate::a;\n"),
        ("one/src/bin/tool.rs", "fn main() {}\n"),
        ("nested/two/Cargo.toml", "[package]\nname = \"two\"\n"),
        ("nested/two/src/main.rs", "mod x;\nmod y;\nfn main() { x::f() }\n"),
        ("nested/two/src/x.rs", "pub fn f() { crate::y::g() }\n"),
        ("nested/two/src/y.rs", "pub fn g() {}\n"),
        ("many/three/Cargo.toml", "[package]\nname = \"three\"\n[[bin]]\nname = \"t\"\npath = \"main.rs\"\n"),
        ("many/three/main.rs", "fn main() {}\n"),
        ("many/not-a-crate/README", ""),
        ("one/tests/it.rs", "use one::a;\n"),
    ]);
    let names: Vec<String> = check(&tree).iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, ["one", "one bin tool", "two bin", "three bin t"]);
    let reports = check(&tree);
    // `use crate::a;` is a module import: no edge by itself.
    assert!(reports[0].file_cycles().is_empty());
    // The binary's root using its modules is containment; x uses y.
    assert_eq!(edges(&reports[2].file_graph), ["x->y"]);
}

#[test]
fn tokenizer_keeps_lines_and_skips_literals() {
    let t = tokenize("a::b // c::d\n/* e\n f */ \"g::h\n\" r#\"i\"# 'j' 'k x\n");
    let toks: Vec<(Tok, usize)> = t.into_iter().map(|t| (t.tok, t.line)).collect();
    assert_eq!(
        toks,
        [
            (Tok::Ident("a".into()), 1),
            (Tok::PathSep, 1),
            (Tok::Ident("b".into()), 1),
            (Tok::Lit("g::h\n".into()), 3),
            (Tok::Lit("i".into()), 4),
            (Tok::Lit("j".into()), 4),
            (Tok::Ident("x".into()), 4),
        ]
    );
}
