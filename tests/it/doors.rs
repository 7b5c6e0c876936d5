//! The doors (`stage`, the C ABI, Python, candle) reach the library only through the facade
//! (`safetensors-staging`) and core (`staging-core`): a door that named a backend crate directly
//! could decide again what the facade decides (which store a URL is, what the Hub is). Checked
//! on what cargo itself reads, `cargo metadata`: every normal (not dev, not build) dependency of a
//! door that is a crate of this workspace, and every workspace crate a door's feature turns on.
//! A door's tests may use anything (the mock backend, the stubs): dev-dependencies are left out.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

/// The doors, and what a door may depend on among the workspace's crates.
const DOORS: [&str; 4] = ["staging-cli", "staging-ffi", "staging-py", "staging-candle"];
const ALLOWED: [&str; 2] = ["safetensors-staging", "staging-core"];

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What each door reaches of the workspace, by normal dependency or by a feature of its own.
fn reached(meta: &Value) -> Vec<(String, BTreeSet<String>)> {
    let packages = meta["packages"].as_array().unwrap();
    let members: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    DOORS
        .iter()
        .map(|door| {
            let package = packages
                .iter()
                .find(|p| p["name"] == *door)
                .unwrap_or_else(|| panic!("no package {door} in the workspace"));
            let mut names = BTreeSet::new();
            for dep in package["dependencies"].as_array().unwrap() {
                let name = dep["name"].as_str().unwrap();
                if dep["kind"].is_null() && members.contains(name) {
                    names.insert(name.to_owned());
                }
            }
            // `feature = ["crate/feature", "dep:crate", "crate?/feature"]` turns crates on too.
            for enabled in package["features"].as_object().unwrap().values() {
                for item in enabled.as_array().unwrap() {
                    let item = item.as_str().unwrap();
                    let name = item.trim_start_matches("dep:");
                    let name = name.split('/').next().unwrap().trim_end_matches('?');
                    if members.contains(name) {
                        names.insert(name.to_owned());
                    }
                }
            }
            (door.to_string(), names)
        })
        .collect()
}

#[test]
fn the_doors_reach_only_the_facade_and_core() {
    let meta = metadata();
    let mut wrong = Vec::new();
    for (door, names) in reached(&meta) {
        assert!(
            names.contains("safetensors-staging"),
            "{door} does not depend on the facade: is this test reading the right manifest?"
        );
        for name in names {
            if !ALLOWED.contains(&name.as_str()) {
                wrong.push(format!("{door} -> {name}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a door depends on a workspace crate other than {ALLOWED:?} (reach it through the \
         facade's re-exports instead): {wrong:?}"
    );
}

/// The check sees what it is meant to: the facade itself depends on backends, and a backend
/// crate is a workspace member that `reached` would report for a door that named it.
#[test]
fn the_check_sees_a_backend_dependency() {
    let meta = metadata();
    let packages = meta["packages"].as_array().unwrap();
    let facade = packages
        .iter()
        .find(|p| p["name"] == "safetensors-staging")
        .unwrap();
    let backends: BTreeSet<&str> = facade["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap())
        .filter(|n| n.starts_with("backend-"))
        .collect();
    assert!(
        backends.contains("backend-hub") && backends.contains("backend-remote"),
        "{backends:?}"
    );
    // A door's dev-dependencies on backends (the stubs, the mock) exist and are not counted.
    let cli = packages
        .iter()
        .find(|p| p["name"] == "staging-cli")
        .unwrap();
    assert!(
        cli["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "backend-mock" && d["kind"] == "dev")
    );
    let reached = reached(&meta);
    let (_, cli_reached) = reached.iter().find(|(d, _)| d == "staging-cli").unwrap();
    assert!(!cli_reached.contains("backend-mock"), "{cli_reached:?}");
}
