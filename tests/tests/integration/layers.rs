//! The workspace's crates have no circle of imports, by the checker in
//! `unimem_tests::layers` (its module comment says what counts as an
//! import): `workspace_has_no_import_cycles` prints each crate's top-level
//! modules in dependency order (lowest layer first) and the edges, then
//! fails listing every circle. `scripts/check-layers` runs just this file.
//!
//! The other tests run the checker on small trees: what it understands.

use std::path::Path;

use unimem_tests::layers::{self, check_tree, render_cycles, render_layers, CrateReport};
use unimem_tests::layers::{Graph, SourceTree};

#[test]
fn workspace_has_no_import_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace");
    let reports = layers::check(root);
    assert!(
        reports.iter().any(|r| r.file_graph.nodes().len() > 1),
        "found no crate with modules: is {} the workspace?",
        root.display()
    );
    for r in &reports {
        print!("{r}");
    }
    println!();
    let failures: String = reports.iter().map(CrateReport::circles).collect();
    assert!(failures.is_empty(), "import circles:\n{failures}");
    println!("no import circles in {} crates", reports.len());
}

/// The provider's layers, lowest first, as provider/ARCHITECTURE.md draws
/// them. A circle is caught above; this catches an arrow that runs up
/// without closing one (base reaching for an object, say).
const PROVIDER_LAYERS: &[&[&str]] = &[
    &["base"],
    &["info"],
    &["state"],
    &[
        "wait", "eq", "cq", "cntr", "av", "mr", "poll", "ep", "domain", "fabric",
    ],
    &["prov"],
];

/// The workspace's crates, lowest first, as provider/ARCHITECTURE.md
/// draws them: a crate depends only on crates of lower layers. A new crate
/// must be placed here.
const CRATE_LAYERS: &[&[&str]] = &[
    &["unimem-fi-sys", "unimem-mailbox", "unimem-regcache"],
    &["unimem-dma"],
    &["unimem-heap", "unimem-proto"],
    &["unimem-net"],
    &["unimem-provider"],
    &["unimem-tests"],
];

#[test]
fn crates_depend_only_on_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace");
    let deps = layers::crate_dependencies(&layers::read(root));
    for name in [
        "unimem-fi-sys",
        "unimem-net",
        "unimem-provider",
        "unimem-proto",
    ] {
        assert!(deps.contains_key(name), "{name} is not a member: {deps:?}");
    }
    let rank = |name: &str| CRATE_LAYERS.iter().position(|l| l.contains(&name));
    let mut wrong = Vec::new();
    for (name, uses) in &deps {
        let Some(own) = rank(name) else {
            wrong.push(format!("{name}: in no layer of CRATE_LAYERS"));
            continue;
        };
        for dep in uses {
            if rank(dep).is_none_or(|r| r >= own) {
                wrong.push(format!("{name} -> {dep} does not point down"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The seam, not the provider, gives the tests their libfabric types.
    assert!(!deps["unimem-tests"].iter().any(|d| d == "unimem-provider"));
    assert!(deps["unimem-tests"].iter().any(|d| d == "unimem-fi-sys"));
}

#[test]
fn provider_imports_point_down_its_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace");
    let reports = layers::check(root);
    let provider = reports
        .iter()
        .find(|r| r.name == "unimem-provider")
        .expect("the provider crate is checked");
    let rank = |module: &str| PROVIDER_LAYERS.iter().position(|l| l.contains(&module));
    let mut upward = Vec::new();
    for module in provider.top_graph.nodes() {
        if module != "crate" && rank(module).is_none() {
            upward.push(format!("{module}: in no layer of PROVIDER_LAYERS"));
        }
    }
    for (from, to, evidence) in provider.top_graph.edges() {
        if let (Some(a), Some(b)) = (rank(from), rank(to)) {
            if a < b {
                upward.push(format!("{from} -> {to} runs up ({evidence})"));
            }
        }
    }
    assert!(upward.is_empty(), "{}", upward.join("\n"));
}

// ===========================================================================
// The checker itself, on small trees

fn fixture(files: &[(&str, &str)]) -> SourceTree {
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
    let mut reports = check_tree(&tree);
    assert_eq!(reports.len(), 1, "one crate");
    reports.remove(0)
}

fn edges(graph: &Graph) -> Vec<String> {
    graph.edges().map(|(f, t, _)| format!("{f}->{t}")).collect()
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
    let names: Vec<String> = check_tree(&tree).iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, ["one", "one bin tool", "two bin", "three bin t"]);
    let reports = check_tree(&tree);
    // `use crate::a;` is a module import: no edge by itself.
    assert!(reports[0].file_cycles().is_empty());
    // The binary's root using its modules is containment; x uses y.
    assert_eq!(edges(&reports[2].file_graph), ["x->y"]);
}
