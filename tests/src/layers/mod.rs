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
//! crate (`graph.rs`). A [`CrateReport`] prints each crate's top-level
//! modules in dependency order (lowest layer first) and the edges; its
//! [`circles`](CrateReport::circles) list every circle with the places that
//! make it. `tests/tests/integration/layers.rs` runs the check on this
//! workspace (alone: `scripts/check-layers`) and shows on small trees what
//! it understands.

mod graph;
mod resolve;
mod scan;
mod tokens;
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::path::Path;

pub use graph::Graph;
pub use workspace::{crate_dependencies, SourceTree};

use resolve::Crate;
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

    /// The import circles between files and between top-level modules, as
    /// [`render_cycles`] shows them; empty where there are none.
    pub fn circles(&self) -> String {
        render_cycles(&self.file_graph, "files", &self.name)
            + &render_cycles(&self.top_graph, "top-level modules", &self.name)
    }
}

/// The listing: the crate's top-level modules, lowest layer first, their
/// edges, and the notes.
impl fmt::Display for CrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "== {} ({}): {} files, {} top-level modules",
            self.name,
            self.root,
            self.file_graph.nodes().len(),
            self.top_graph.nodes().len()
        )?;
        f.write_str("  top-level modules, lowest layer first:\n")?;
        f.write_str(&render_layers(&self.top_graph))?;
        f.write_str("  top-level edges (a -> b: a uses b):\n")?;
        f.write_str(&render_edges(&self.top_graph))?;
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}

/// The workspace at `workspace_root` as the checker reads it (manifests
/// and sources).
pub fn read(workspace_root: &Path) -> SourceTree {
    workspace::load(workspace_root)
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
    let mut report = CrateReport {
        name: target.name.clone(),
        root: target.root.clone(),
        file_graph: Graph::default(),
        top_graph: Graph::default(),
        files: BTreeMap::new(),
        notes: krate.notes.clone(),
    };
    for (file, info) in &krate.files {
        let (file_node, top_node) = nodes_of(&info.module);
        report.file_graph.add_node(file_node.clone());
        report.top_graph.add_node(top_node);
        report.files.insert(file_node, file.clone());
    }
    for used in krate.file_uses() {
        let (from_file, from_top) = nodes_of(&krate.files[&used.from].module);
        let (to_file, to_top) = nodes_of(&krate.files[&used.to].module);
        let evidence = &used.evidence;
        report.file_graph.add_edge(&from_file, &to_file, evidence);
        report.top_graph.add_edge(&from_top, &to_top, evidence);
    }
    report
}

/// A module's node in the file graph and in the top-level graph.
fn nodes_of(module: &[String]) -> (String, String) {
    let name = |m: &[String]| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    (name(module), name(&module[..module.len().min(1)]))
}

// ===========================================================================
// Printing

/// One line a layer, lowest first: `    0: a, b`, circles in braces.
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
    for from in graph.nodes() {
        let targets: Vec<&str> = graph.targets(from).map(String::as_str).collect();
        if !targets.is_empty() {
            let _ = writeln!(s, "    {from} -> {}", targets.join(", "));
        }
    }
    if s.is_empty() {
        s.push_str("    (none)\n");
    }
    s
}

/// The circles of one granularity (`what`), with one example loop and the
/// edges inside each (with where they come from).
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
        let inside: BTreeSet<&str> = cycle.iter().map(String::as_str).collect();
        for (from, to, evidence) in graph.edges() {
            if inside.contains(from) && inside.contains(to) {
                let _ = writeln!(s, "    {from} -> {to}   ({evidence})");
            }
        }
    }
    s
}
