//! No module of the facade (`src/`) uses one that uses it back: the modules form a hierarchy
//! (errors and devices at the bottom, the loader above the backends and tensors, the options
//! above the loader, the CUDA and HIP hand-overs beside the tensor they extend). Checked by
//! reading every `crate::module` path in `src/*.rs` and `src/*/*.rs` (a directory is one module),
//! code and doc links alike.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            modules.insert(name, std::fs::read_to_string(&path).unwrap());
        } else if path.join("mod.rs").is_file() {
            // A module cut into files (`src/loader/`): one module, the text of all its files.
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let mut text = String::new();
            for file in std::fs::read_dir(&path).unwrap() {
                let file = file.unwrap().path();
                if file.extension().is_some_and(|e| e == "rs") {
                    text.push_str(&std::fs::read_to_string(&file).unwrap());
                }
            }
            modules.insert(name, text);
        }
    }
    modules.remove("lib"); // the root re-exports everything; it is no module of the hierarchy
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, text)| {
            let uses = text
                .match_indices("crate::")
                .map(|(at, _)| {
                    text[at + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .filter(|used| used != name && names.contains(used))
                .collect();
            (name.clone(), uses)
        })
        .collect()
}

/// The modules reachable from `start`.
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&String> = graph[start].iter().collect();
    while let Some(next) = stack.pop() {
        if seen.insert(next.clone()) {
            stack.extend(graph[next].iter());
        }
    }
    seen
}

#[test]
fn no_module_uses_one_that_uses_it_back() {
    let graph = graph();
    assert!(graph.len() >= 8, "{graph:?}");
    for name in graph.keys() {
        assert!(
            !reachable(&graph, name).contains(name),
            "module {name} reaches itself: {graph:#?}"
        );
    }
    // The hand-overs extend the tensor, never the other way round.
    assert!(graph["cuda"].contains("tensor") && !reachable(&graph, "tensor").contains("cuda"));
    assert!(graph["hip"].contains("tensor") && !reachable(&graph, "tensor").contains("hip"));
}
