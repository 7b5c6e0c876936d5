//! The C++ example (`examples/cpp/loader.cpp` with its RAII wrapper) compiled with the system
//! C++ compiler against the cdylib, run on a checkpoint written here, and checked tensor by
//! tensor against the bytes written; then run again under valgrind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use backend_mock::fixtures::{ShardedFixture, TensorSpec, write_sharded};
use staging_core::Dtype;

/// Builds the cdylib and the C++ loader once.
fn loader() -> &'static Path {
    static LOADER: OnceLock<PathBuf> = OnceLock::new();
    LOADER.get_or_init(|| {
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        common::compile(
            &common::workspace().join("examples/cpp/loader.cpp"),
            "loader",
            &cxx,
            &["-std=c++17"],
        )
    })
}

fn fixture(dir: &Path) -> ShardedFixture {
    let shards = vec![
        vec![
            TensorSpec::new("model.embed", Dtype::F16, &[300, 64]),
            TensorSpec::new("model.layers.0.a", Dtype::F32, &[1000]),
            TensorSpec::new("model.layers.0.b", Dtype::BF16, &[33, 17]),
        ],
        vec![
            TensorSpec::new("model.layers.1.w", Dtype::U8, &[70000]),
            TensorSpec::new("model.norm", Dtype::F32, &[64]),
            TensorSpec::bytes("empty", 0),
        ],
    ];
    write_sharded(dir, &shards, 99).unwrap()
}

fn fnv1a(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

struct Run {
    tensors: BTreeMap<String, (String, usize, String)>,
    took: Option<String>,
    report: String,
    plan: String,
}

fn run_loader(
    prefix: &str,
    extra: &[&str],
    valgrind: bool,
) -> (Run, ShardedFixture, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let mut command = if valgrind {
        common::valgrind(loader())
    } else {
        Command::new(loader())
    };
    command
        .arg(dir.path())
        .args(["--prefix", prefix])
        .args(extra);
    let output = command.output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        output.status.success(),
        "loader failed ({:?}):\n{stdout}\n{stderr}",
        output.status
    );
    let mut run = Run {
        tensors: BTreeMap::new(),
        took: None,
        report: String::new(),
        plan: String::new(),
    };
    for line in stdout.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["tensor", name, path, bytes, hash] => {
                run.tensors.insert(
                    name.to_string(),
                    (path.to_string(), bytes.parse().unwrap(), hash.to_string()),
                );
            }
            ["took", name, _] => run.took = Some(name.to_string()),
            ["report", ..] => run.report = line.to_owned(),
            ["plan", ..] => run.plan = line.to_owned(),
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (run, fixture, dir)
}

#[test]
fn cpp_loader_matches_the_rust_api_tensor_by_tensor() {
    let (run, fixture, _dir) = run_loader("model.layers.0.", &["--threads", "2"], false);
    assert_eq!(run.tensors.len(), fixture.contents.len());
    for (name, bytes) in &fixture.contents {
        let (path, len, hash) = &run.tensors[name];
        assert_eq!(*len, bytes.len(), "{name}");
        assert_eq!(*hash, fnv1a(bytes), "{name}: bytes differ");
        let expected = if name.starts_with("model.layers.0.") {
            "destination"
        } else {
            "device"
        };
        assert_eq!(path, expected, "{name}");
    }
    assert_eq!(
        run.took.as_deref(),
        Some("model.embed"),
        "the first device tensor was taken"
    );
    assert!(run.report.contains("tensors=6 "), "{}", run.report);
    assert!(
        run.report.contains("destination=2 device=4 host=0"),
        "{}",
        run.report
    );
    assert!(
        run.report.contains("backend=host mode=posix"),
        "{}",
        run.report
    );
}

#[test]
fn cpp_loader_runs_clean_under_valgrind() {
    common::require_valgrind();
    // One I/O thread: the pool's worker threads outlive a load briefly, which valgrind would
    // report as possibly lost thread stacks, not as leaks of ours.
    let (run, fixture, _dir) = run_loader("model.layers.0.", &["--threads", "1"], true);
    for (name, bytes) in &fixture.contents {
        assert_eq!(run.tensors[name].2, fnv1a(bytes), "{name}");
    }
}

/// The value of `key=` in a line of the loader's output.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

#[test]
fn cpp_ranks_plan_alike_and_together_read_every_byte_once() {
    let ranks = 3;
    let runs: Vec<_> = (0..ranks)
        .map(|r| {
            let rank = r.to_string();
            // The first rank under valgrind: the plan's handles are freed, nothing leaks.
            let args = ["--threads", "1", "--rank", rank.as_str(), "--ranks", "3"];
            run_loader("", &args, r == 0)
        })
        .collect();
    let fixture = &runs[0].1;
    let total: usize = fixture.contents.values().map(Vec::len).sum();
    let mut read = 0;
    let mut per_tensor: BTreeMap<&str, usize> = BTreeMap::new();
    for (run, _, _) in &runs {
        assert_eq!(
            field(&run.plan, "fingerprint"),
            field(&runs[0].0.plan, "fingerprint"),
            "every rank plans the same"
        );
        // What the plan gives the rank is what its load read.
        assert_eq!(field(&run.plan, "bytes"), field(&run.report, "read"));
        read += field(&run.report, "read").parse::<usize>().unwrap();
        for (name, (_, len, hash)) in &run.tensors {
            *per_tensor.entry(name.as_str()).or_default() += len;
            if *len == fixture.contents[name].len() {
                assert_eq!(*hash, fnv1a(&fixture.contents[name]), "{name}");
            }
        }
    }
    assert_eq!(read, total, "every byte read once across the ranks");
    for (name, bytes) in &fixture.contents {
        if !bytes.is_empty() {
            assert_eq!(
                per_tensor[name.as_str()],
                bytes.len(),
                "{name} covered once"
            );
        }
    }
}

#[test]
fn cpp_loader_reports_a_bad_checkpoint_with_the_library_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\x05\0\0\0\0\0\0\0{bad}",
    )
    .unwrap();
    let output = Command::new(loader()).arg(dir.path()).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    // The library's one line, not prefixed with the status's description as well.
    let file = dir.path().join("model.safetensors");
    assert!(
        stderr.starts_with(&format!(
            "error: {}: invalid safetensors header",
            file.display()
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn cpp_loader_help_says_prefix_routes_and_bad_arguments_are_usage_errors() {
    for args in [
        &["--help"][..],
        &["/no/such/checkpoint", "--prefix", "x", "-h"],
    ] {
        let output = Command::new(loader()).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(stdout.starts_with("usage: loader CHECKPOINT"), "{stdout}");
        assert!(
            stdout.contains("(the destination callback). It does not filter: every other tensor"),
            "{stdout}"
        );
        assert!(output.stderr.is_empty(), "--help is not opened as a path");
    }
    for (args, message) in [
        (
            &["/x", "--bogus", "1"][..],
            "loader: unknown option --bogus\n",
        ),
        (&["/x", "--prefix"], "loader: --prefix needs a value\n"),
        (&["--threads", "2"], "loader: no CHECKPOINT\n"),
        (&["/x", "/y"], "loader: a second CHECKPOINT: /y\n"),
    ] {
        let output = Command::new(loader()).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.starts_with(message), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: loader CHECKPOINT"), "{stderr}");
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn cpp_loader_select_filters_where_prefix_only_routes() {
    let args = ["--threads", "1", "--select", "model.layers.*"];
    let (run, fixture, _dir) = run_loader("model.layers.0.", &args, false);
    let names: Vec<&str> = run.tensors.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["model.layers.0.a", "model.layers.0.b", "model.layers.1.w"]
    );
    for (name, (path, _, hash)) in &run.tensors {
        assert_eq!(*hash, fnv1a(&fixture.contents[name]), "{name}");
        let expected = if name.starts_with("model.layers.0.") {
            "destination"
        } else {
            "device"
        };
        assert_eq!(path, expected, "{name}");
    }
}
