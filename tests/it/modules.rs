//! No module uses one that uses it back, in any crate of the workspace: the modules of each crate
//! form a hierarchy (in the facade: errors and devices at the bottom, the loader above the
//! backends and tensors, the options above the loader, the CUDA and HIP hand-overs beside the
//! tensor they extend). Checked by reading every `crate::module` path of a crate's `src/` (a
//! directory is one module), and inside a directory module every `super::sibling` and
//! `crate::dir::sibling` path between its files, code and doc links alike. A file's unit tests
//! (`#[cfg(test)] mod tests`, at its end) are left out: a test may use anything.
//!
//! Python's modules are checked the same way by `crates/staging-py/tests/doors/test_modules.py`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// A file's text without its unit tests.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

/// The identifiers that follow `prefix` in `text`.
fn after<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = String> + 'a {
    text.match_indices(prefix).map(move |(at, _)| {
        text[at + prefix.len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    })
}

/// The graph of `modules` (name to text): which of them each one names through `prefixes`.
fn edges(modules: &BTreeMap<String, String>, prefixes: &[String]) -> Graph {
    let names: BTreeSet<&String> = modules.keys().collect();
    modules
        .iter()
        .map(|(name, text)| {
            let uses = prefixes
                .iter()
                .flat_map(|prefix| after(text, prefix))
                .filter(|used| used != name && names.contains(used))
                .collect();
            (name.clone(), uses)
        })
        .collect()
}

/// A crate's graphs: its top-level modules', then each directory module's files'.
fn graphs(src: &Path) -> Vec<(String, Graph)> {
    let mut top = BTreeMap::new();
    let mut inner = Vec::new();
    for file in rust_files(src) {
        top.insert(stem(&file), code_of(&file));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("mod.rs").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = stem(&dir);
        let files: BTreeMap<String, String> = rust_files(&dir)
            .iter()
            .map(|file| (stem(file), code_of(file)))
            .collect();
        top.insert(name.clone(), files.values().cloned().collect());
        // Between a directory's files; `mod.rs` is the directory itself (it declares the others
        // and re-exports them), as `lib.rs` is the crate.
        let mut files = files;
        files.remove("mod");
        let prefixes = vec!["super::".to_owned(), format!("crate::{name}::")];
        inner.push((
            format!("{}/{name}", src.display()),
            edges(&files, &prefixes),
        ));
    }
    // The crate's root declares and re-exports every module; the binary's `main` uses the crate.
    top.remove("lib");
    top.remove("main");
    let mut all = vec![(
        src.display().to_string(),
        edges(&top, &["crate::".to_owned()]),
    )];
    all.extend(inner);
    all
}

/// The modules reachable from `start`.
fn reachable(graph: &Graph, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&String> = graph[start].iter().collect();
    while let Some(next) = stack.pop() {
        if seen.insert(next.clone()) {
            stack.extend(graph[next].iter());
        }
    }
    seen
}

fn cycles(graph: &Graph) -> Vec<String> {
    graph
        .keys()
        .filter(|name| reachable(graph, name).contains(*name))
        .cloned()
        .collect()
}

/// Every crate of the workspace: the root package and `crates/*`.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("src")];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    sources.extend(crates);
    sources
}

#[test]
fn no_module_of_any_crate_uses_one_that_uses_it_back() {
    let sources = crate_sources();
    assert!(sources.len() >= 12, "{sources:?}");
    let mut checked = 0;
    let mut found = Vec::new();
    for src in &sources {
        for (place, graph) in graphs(src) {
            checked += graph.len();
            let cycles = cycles(&graph);
            if !cycles.is_empty() {
                found.push(format!(
                    "{place}: {cycles:?} reach themselves in {graph:#?}"
                ));
            }
        }
    }
    assert!(checked >= 80, "only {checked} modules read");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_facade_hand_overs_extend_the_tensor() {
    let (_, graph) = graphs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).remove(0);
    assert!(graph.len() >= 8, "{graph:?}");
    assert!(graph["cuda"].contains("tensor") && !reachable(&graph, "tensor").contains("cuda"));
    assert!(graph["hip"].contains("tensor") && !reachable(&graph, "tensor").contains("hip"));
    assert!(
        graph["options"].contains("loader") && !reachable(&graph, "loader").contains("options")
    );
}

/// The checker finds a cycle where there is one (a test that could not fail would prove nothing).
#[test]
fn a_cycle_is_found() {
    let modules: BTreeMap<String, String> = [
        ("a", "use crate::b::X;"),
        ("b", "/// see [`crate::c::Y`]"),
        ("c", "fn f() { crate::a::g() }"),
        ("d", "use crate::a;"),
    ]
    .into_iter()
    .map(|(name, text)| (name.to_owned(), text.to_owned()))
    .collect();
    let graph = edges(&modules, &["crate::".to_owned()]);
    assert_eq!(cycles(&graph), ["a", "b", "c"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("x.rs"),
        "use crate::y;\n#[cfg(test)]\nmod tests { use crate::z; }",
    )
    .unwrap();
    std::fs::write(dir.path().join("y.rs"), "").unwrap();
    std::fs::write(dir.path().join("z.rs"), "use crate::x;").unwrap();
    let (_, graph) = graphs(dir.path()).remove(0);
    assert!(
        cycles(&graph).is_empty(),
        "a unit test's use is no edge: {graph:?}"
    );
    assert_eq!(graph["z"], BTreeSet::from(["x".to_owned()]));
}
