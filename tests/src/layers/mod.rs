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
//!
//! [`check`] is the entry: it reads the workspace (`workspace.rs`), scans
//! each file (`scan.rs`, over `tokens.rs`), resolves what each file uses to
//! the file that defines it (`resolve.rs`) and builds the two graphs of each
//! crate (`graph.rs`). [`render`] prints each crate's top-level modules in
//! dependency order (lowest layer first) and the edges, [`render_cycles`]
//! every circle with the places that make it. `tests/tests/layers.rs` runs the check on this workspace (alone:
//! `scripts/check-layers`) and shows on small trees what it understands.

mod graph;
mod resolve;
mod scan;
mod tokens;
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

pub use graph::Graph;
pub use workspace::SourceTree;

use resolve::{Crate, FileUse, ModPath};
use workspace::Target;

/// What the check found in one crate (library or binary).
#[derive(Debug)]
pub struct CrateReport {
    /// `unimem-mailbox` (the library) or `unimem-mailbox bin unimem-shm`.
    pub name: String,
    /// The root file, relative to the workspace root.
    pub root: String,
    /// The files, named by their module (`crate`, `a`, `a::b`).
    pub file_graph: Graph,
    /// The top-level modules (`crate`, `a`).
    pub top_graph: Graph,
    /// The file of each node of `file_graph`.
    pub files: BTreeMap<String, String>,
    /// What could not be read (`mod` without a file, a file included twice).
    pub notes: Vec<String>,
}

impl CrateReport {
    pub fn file_cycles(&self) -> Vec<Vec<String>> {
        self.file_graph.cycles()
    }

    pub fn top_cycles(&self) -> Vec<Vec<String>> {
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

/// Checks every crate (library, binaries) of the workspace at
/// `workspace_root`, read from disk.
pub fn check(workspace_root: &Path) -> Vec<CrateReport> {
    check_tree(&workspace::load(workspace_root))
}

/// Checks every crate of a workspace given as its files (the workspace
/// `Cargo.toml`, the members' manifests and sources).
pub fn check_tree(tree: &SourceTree) -> Vec<CrateReport> {
    workspace::targets(tree)
        .iter()
        .map(|target| check_crate(tree, target))
        .collect()
}

fn check_crate(tree: &SourceTree, target: &Target) -> CrateReport {
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
    for FileUse { from, to, evidence } in krate.file_uses() {
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

pub fn render_layers(graph: &Graph) -> String {
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
pub fn render_cycles(graph: &Graph, what: &str, crate_name: &str) -> String {
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

pub fn render(reports: &[CrateReport]) -> String {
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
