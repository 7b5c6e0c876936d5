//! What `stage` says, word for word: with no argument its help, the demo behind a named flag,
//! one line per failure (a missing path, a bad size, a checkpoint that is not one), `--json`'s
//! error object, the table's column headers, counts in the singular, host memory called host
//! memory, the backends passed over behind `-v`, and the options as `key = value` lines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::path::Path;

use backend_mock::fixtures::{TensorSpec, write_file};
use common::{Output, run_stage};
use staging_core::Dtype;

fn stage(args: &[&str], scratch: &Path) -> Output {
    run_stage(args, &[], scratch)
}

/// A one-file checkpoint of two small tensors.
fn one_file(dir: &Path) -> String {
    let path = dir.join("model.safetensors");
    let specs = [
        TensorSpec::bytes("alpha", 100),
        TensorSpec::new("beta", Dtype::F16, &[4, 4]),
    ];
    write_file(&path, &specs, 9).unwrap();
    path.to_str().unwrap().to_owned()
}

fn error_json(out: &Output) -> serde_json::Value {
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", out.stdout));
    json["error"].clone()
}

#[test]
fn no_argument_prints_help_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = stage(&[], dir.path());
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("Usage: stage"), "{}", out.stderr);
    assert!(out.stderr.contains("--demo"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("writing a synthetic"),
        "{}",
        out.stderr
    );
    // Flags without a checkpoint or --demo: a usage error, not a synthetic load.
    let out = stage(&["--json"], dir.path());
    let error = error_json(&out);
    assert_eq!(error["kind"], "usage");
    assert_eq!(
        error["message"],
        "no checkpoint given: name a PATH (a file, a directory, an index or a URL), or --demo for a synthetic one"
    );
}

#[test]
fn demo_writes_loads_and_removes_a_synthetic_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = stage(&["--demo", "--synthetic-size", "4MiB"], dir.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stderr);
    let written = lines[0]
        .strip_prefix("writing a synthetic checkpoint of about 4.00 MiB to ")
        .and_then(|rest| rest.strip_suffix(" ..."))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert_eq!(lines[1], format!("removed {written}"));
    assert!(!Path::new(written).exists(), "{written} was left behind");
    assert!(out.stdout.contains(" from 4 files in "), "{}", out.stdout);
    // A demo and a path: one or the other.
    let file = one_file(dir.path());
    let out = stage(&["--demo", &file], dir.path());
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("cannot be used with"), "{}", out.stderr);
}

#[test]
fn each_failure_is_one_line_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_file(dir.path());
    let missing = dir.path().join("missing.safetensors");
    let missing = missing.to_str().unwrap();
    for (args, line) in [
        (
            vec![missing],
            format!("stage: error: {missing}: no such file or directory"),
        ),
        (
            vec![file.as_str(), "--chunk-size", "lots"],
            "stage: error: option --chunk-size=\"lots\": \"lots\" is not a size: expected bytes or a number and a unit, like 4096, 512MiB or 2GiB".to_owned(),
        ),
        (
            vec![file.as_str(), "--select", "gamma*"],
            "stage: error: the selection gamma* matches no tensor of the checkpoint".to_owned(),
        ),
    ] {
        let out = stage(&args, dir.path());
        assert_eq!(out.code, Some(1), "{args:?}");
        assert_eq!(out.stderr, format!("{line}\n"), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
}

#[test]
fn json_puts_the_error_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.safetensors");
    let missing = missing.to_str().unwrap();
    let error = error_json(&stage(&[missing, "--json"], dir.path()));
    assert_eq!(
        error,
        serde_json::json!({
            "kind": "not-found",
            "message": format!("{missing}: no such file or directory"),
            "file": missing,
            "tensor": null,
            "details": [],
        })
    );
    // A file cut short inside a tensor: the error names the tensor and the file.
    let file = one_file(dir.path());
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 8]).unwrap();
    let error = error_json(&stage(&[&file, "--json"], dir.path()));
    assert_eq!(error["kind"], "invalid-checkpoint", "{error}");
    assert_eq!(error["file"], file.as_str(), "{error}");
    let other = tempfile::tempdir().unwrap();
    let file = one_file(other.path());
    let out = stage(&[&file, "--json", "--select", "nope"], dir.path());
    assert_eq!(error_json(&out)["kind"], "selection");
}

#[test]
fn the_table_has_a_header_for_every_column_and_calls_host_memory_host() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_file(dir.path());
    let out = stage(
        &[
            &file,
            "--checksums",
            "--rows",
            "beta=1:3",
            "--device",
            "cpu",
            // Memory of our own (device cpu maps the file otherwise: the `mapped` row).
            "--map",
            "false",
        ],
        dir.path(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["name", "dtype", "shape", "bytes", "path", "rows", "sha256"]
    );
    let beta: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(beta[0], "beta");
    let [path, rows, sha] = beta[beta.len() - 3..] else {
        panic!("{}", lines[2])
    };
    assert_eq!((path, rows), ("direct", "1..3"), "{}", lines[2]);
    assert_eq!(sha.len(), 64, "a SHA-256 in hex: {}", lines[2]);
    assert!(
        out.stdout
            .contains("loaded 2 tensors, 116 B from 1 file in "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("\ndirect       host "),
        "{}",
        out.stdout
    );
    // No destination in `stage`: no row for it.
    assert!(!out.stdout.contains("destination"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("peak held: 116 B of host memory (direct), 0 B of host memory (staged)"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("device"), "{}", out.stdout);
}

#[test]
fn backends_passed_over_are_shown_with_verbose_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_file(dir.path());
    // What `auto` passed over, as the report has it (on a machine without a GPU, both GPU
    // backends; with one, perhaps none).
    let out = stage(&[&file, "--json"], dir.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let passed_over: Vec<String> = report["passed_over"]
        .as_array()
        .unwrap()
        .iter()
        .map(|why| format!("passed over: {}", why.as_str().unwrap()))
        .collect();
    let out = stage(&[&file], dir.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(!out.stdout.contains("passed over"), "{}", out.stdout);
    let out = stage(&[&file, "-v"], dir.path());
    let shown: Vec<&str> = out
        .stdout
        .lines()
        .filter(|line| line.starts_with("passed over: "))
        .collect();
    assert_eq!(shown, passed_over, "{}", out.stdout);
    if report["backend"] == "host" {
        // `auto` ended on the host backend: the GPU backends were passed over, each with why.
        assert_eq!(shown.len(), 2, "{}", out.stdout);
    }
}

#[test]
fn print_options_prints_key_value_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = stage(
        &["--print-options", "--chunk-size", "4MiB", "--select", "a.*"],
        dir.path(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "backend = auto  # default");
    assert!(lines.contains(&"chunk_size = 4MiB"), "{}", out.stdout);
    assert!(lines.contains(&"select = a.*"), "{}", out.stdout);
    assert!(
        lines.contains(&"# memory_cap = none (default)"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("Some("), "{}", out.stdout);
}

#[test]
fn a_command_line_clap_rejects_exits_2_and_json_still_gets_an_error_object() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_file(dir.path());
    let out = stage(&[&file, "--no-such-flag"], dir.path());
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with("error: unexpected argument '--no-such-flag' found"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    let out = stage(&[&file, "--synthetic-size", "8MiB", "--json"], dir.path());
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "usage");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot be used with"),
        "{json}"
    );
}

#[test]
fn a_file_of_the_demo_that_cannot_be_made_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the demo's directory should go.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"").unwrap();
    let target = blocker.join("ckpt");
    let target = target.to_str().unwrap();
    let out = stage(&["--keep-synthetic", target, "--json"], dir.path());
    let error = error_json(&out);
    assert_eq!(error["kind"], "io", "{error}");
    assert_eq!(error["file"], target, "{error}");
    assert_eq!(
        error["message"],
        format!("{target}: not a directory"),
        "{error}"
    );
}
