//! The scan of one source file: its `mod` declarations (with `#[path]`),
//! the leaves of its `use` trees, the paths its code writes (`a::b`,
//! `crate::x::f`, `$crate::…` in macros) and the identifiers it mentions,
//! all with the inline modules they are in, and with test code
//! (`#[cfg(test)]` items, `#![cfg(test)]` files and modules) left out. No
//! full Rust parser: enough for this codebase, and the checker's tests show
//! what it understands.

use std::collections::BTreeSet;

use super::tokens::{closing, ident, path_sep, punct, split_commas, tokenize, Tok, Token};

/// `mod name;` or `mod name { … }`.
#[derive(Clone, Debug)]
pub(super) struct ModDecl {
    /// The inline modules of the file it is in (empty: the file's module).
    pub(super) scope: Vec<String>,
    pub(super) name: String,
    pub(super) inline: bool,
    pub(super) path_attr: Option<String>,
    pub(super) line: usize,
}

/// One leaf of a `use` tree.
#[derive(Clone, Debug)]
pub(super) struct Import {
    pub(super) scope: Vec<String>,
    /// As written: `crate`/`self`/`super`/a name, then the rest (no `self`
    /// at the end, no `*`).
    pub(super) segs: Vec<String>,
    /// The name it brings into scope (`None`: `as _`, or a glob).
    pub(super) name: Option<String>,
    pub(super) glob: bool,
    /// `pub`, `pub(crate)`, …: may be a re-export.
    pub(super) public: bool,
    pub(super) line: usize,
}

/// A path in code: `crate::a::f`, `super::X`, `name::item`.
#[derive(Clone, Debug)]
pub(super) struct PathRef {
    pub(super) scope: Vec<String>,
    pub(super) segs: Vec<String>,
    pub(super) line: usize,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Scanned {
    /// `#![cfg(test)]`: the whole file is test code.
    pub(super) test_only: bool,
    pub(super) mods: Vec<ModDecl>,
    pub(super) imports: Vec<Import>,
    pub(super) paths: Vec<PathRef>,
    /// Identifiers in code outside `use` declarations and attributes.
    pub(super) idents: BTreeSet<String>,
}

/// Scans one file: its `mod`s, `use`s and paths, test code left out.
pub(super) fn scan(src: &str) -> Scanned {
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
                let Some((inner, open)) = attribute_at(&t, i) else {
                    i += 1;
                    continue;
                };
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

// ===========================================================================
// Attributes

/// An attribute, `#[…]` or `#![…]`, at `t[i]`: whether it is an inner one,
/// and the index of its `[`.
fn attribute_at(t: &[Token], i: usize) -> Option<(bool, usize)> {
    let inner = punct(t, i + 1, '!');
    let open = i + 1 + usize::from(inner);
    (punct(t, i, '#') && punct(t, open, '[')).then_some((inner, open))
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
    while let Some((_, open)) = attribute_at(t, i) {
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
    while let Some(token) = t.get(i) {
        if token.opens() {
            depth += 1;
        } else if token.closes() {
            if depth == 0 {
                return i; // the end of the enclosing block
            }
            depth -= 1;
            if token.tok == Tok::Punct('}') && depth == 0 && is_item && !semicolon_only {
                return if punct(t, i + 1, ';') { i + 2 } else { i + 1 };
            }
        } else if depth == 0 && (punct(t, i, ';') || (punct(t, i, ',') && !is_item)) {
            return i + 1;
        }
        i += 1;
    }
    i
}

// ===========================================================================
// `use` declarations

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
                });
            }
        }
    }
    while end < t.len() && !punct(t, end, ';') {
        end += 1;
    }
    end + 1
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
