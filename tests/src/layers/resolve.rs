//! One crate as a tree of modules, read from its root file by following
//! `mod` declarations (test code left out), and where the paths its files
//! write lead: through child modules, `crate`, `self`, `super` and the
//! names `use` brings in, so that a re-export leads on to the module that
//! defines the item. [`Crate::file_uses`] turns that into which file uses
//! which.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::scan::{scan, Scanned};
use super::workspace::{join, parent_dir, SourceTree, Target};

/// A module by its names below the crate root (empty: the root).
pub(super) type ModPath = Vec<String>;

#[derive(Debug, Default)]
struct Module {
    /// The file it is written in (inline modules: the enclosing file).
    file: String,
    children: BTreeSet<String>,
    /// Names brought in by `use` (any visibility).
    imports: BTreeMap<String, Binding>,
}

/// What a name brought in by `use` stands for: a path, written in a module.
#[derive(Debug)]
struct Binding {
    ctx: ModPath,
    segs: Vec<String>,
}

#[derive(Debug)]
pub(super) struct FileInfo {
    pub(super) module: ModPath,
    scanned: Scanned,
}

/// Where a path leads: the module that defines the item, or the module the
/// path names (`item == false`).
#[derive(Debug, PartialEq, Eq)]
struct Resolved {
    module: ModPath,
    item: bool,
}

/// What a name means in a module.
enum Name<'a> {
    Child,
    Import(&'a Binding),
    /// An item of the module itself, or nothing of ours.
    Other,
}

/// Code in file `from` uses an item defined in file `to`.
pub(super) struct FileUse {
    pub(super) from: String,
    pub(super) to: String,
    /// `file:line: what is written there`.
    pub(super) evidence: String,
}

pub(super) struct Crate {
    modules: BTreeMap<ModPath, Module>,
    /// The crate's files by path, with the module each one is.
    pub(super) files: BTreeMap<String, FileInfo>,
    /// What could not be read (`mod` without a file, a file included twice).
    pub(super) notes: Vec<String>,
}

/// The module a file's `scope` (inline modules) is, in the file's module.
fn within(module: &[String], scope: &[String]) -> ModPath {
    module.iter().chain(scope).cloned().collect()
}

impl Crate {
    /// Reads the crate from its root file, following `mod` declarations.
    pub(super) fn load(tree: &SourceTree, target: &Target) -> Crate {
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
            krate.module(&module).file = file.clone();
            // Child modules of this file go to `dir` (plus inline modules).
            let dir = if mod_rs {
                parent_dir(&file).to_string()
            } else {
                file.trim_end_matches(".rs").to_string()
            };
            for decl in &scanned.mods {
                let parent = within(&module, &decl.scope);
                let child = within(&parent, std::slice::from_ref(&decl.name));
                krate.module(&parent).children.insert(decl.name.clone());
                if decl.inline {
                    krate.module(&child).file = file.clone();
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
                    let ctx = within(&module, &import.scope);
                    let binding = Binding {
                        ctx: ctx.clone(),
                        segs: import.segs.clone(),
                    };
                    krate.module(&ctx).imports.insert(name.clone(), binding);
                }
            }
            krate.files.insert(file, FileInfo { module, scanned });
        }
        krate
    }

    fn module(&mut self, path: &[String]) -> &mut Module {
        self.modules.entry(path.to_vec()).or_default()
    }

    /// What `name` means in module `ctx` (`None`: no such module).
    fn lookup(&self, ctx: &[String], name: &str) -> Option<Name<'_>> {
        let m = self.modules.get(ctx)?;
        Some(if m.children.contains(name) {
            Name::Child
        } else if let Some(binding) = m.imports.get(name) {
            Name::Import(binding)
        } else {
            Name::Other
        })
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
            first => match self.lookup(ctx, first)? {
                Name::Child => (within(ctx, &segs[..1]), &segs[1..]),
                Name::Import(binding) => return self.follow(binding, &segs[1..], hops),
                Name::Other => return None,
            },
        };
        self.walk(start, rest, hops)
    }

    fn follow(&self, binding: &Binding, rest: &[String], hops: usize) -> Option<Resolved> {
        let full: Vec<String> = binding.segs.iter().chain(rest).cloned().collect();
        self.resolve(&binding.ctx, &full, hops + 1)
    }

    fn walk(&self, mut cur: ModPath, rest: &[String], hops: usize) -> Option<Resolved> {
        for (k, seg) in rest.iter().enumerate() {
            match self.lookup(&cur, seg)? {
                Name::Child => cur.push(seg.clone()),
                Name::Import(binding) => return self.follow(binding, &rest[k + 1..], hops),
                Name::Other => {
                    return Some(Resolved {
                        module: cur,
                        item: true,
                    })
                }
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

    /// Every use of another file's items. A module using what it contains
    /// (its own descendants' items) is containment, not an import: no use.
    pub(super) fn file_uses(&self) -> Vec<FileUse> {
        let mut uses = Vec::new();
        for (file, info) in &self.files {
            let mut add = |resolved: Option<Resolved>, line: usize, what: String| {
                let Some(resolved) = resolved else { return };
                if resolved.module.starts_with(&info.module) {
                    return; // this file's module or one it contains
                }
                if let Some(to) = self.file_of(&resolved.module) {
                    if to != file {
                        uses.push(FileUse {
                            from: file.clone(),
                            to: to.to_string(),
                            evidence: format!("{file}:{line}: {what}"),
                        });
                    }
                }
            };
            for import in &info.scanned.imports {
                let ctx = within(&info.module, &import.scope);
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
                // A module import (`use crate::m;`) is no use by itself: the
                // paths through it (`m::f()`) are.
                match self.resolve(&ctx, &import.segs, 0) {
                    Some(r) if r.item => add(Some(r), import.line, written),
                    _ => {}
                }
            }
            for path in &info.scanned.paths {
                let ctx = within(&info.module, &path.scope);
                let resolved = self.resolve(&ctx, &path.segs, 0);
                add(resolved, path.line, path.segs.join("::"));
            }
        }
        uses
    }
}
