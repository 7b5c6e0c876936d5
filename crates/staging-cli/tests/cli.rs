//! The `stage` command end to end: the JSON report's keys, checksums against the `safetensors`
//! crate, the device-memory cap, selection and row ranges, one-line errors for every malformed
//! input, and a quiet end when stdout is closed.
//!
//! Length: one test per behaviour of the command, sharing the helpers that run it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use backend_mock::fixtures::{TensorSpec, every_dtype, write_file, write_sharded};
use backend_mock::malformed;
use serde_json::Value;
use staging_core::Dtype;

use common::Output;

/// Runs `stage` with `args`, killing it (and failing) if it has not exited within 60 s.
fn stage(args: &[&str], scratch: &Path) -> Output {
    common::run_stage(args, &[], scratch)
}

fn json(output: &Output) -> Value {
    assert_eq!(output.code, Some(0), "stage failed: {}", output.stderr);
    serde_json::from_str(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", output.stdout))
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn synthetic_load_reports_every_tensor_and_cleans_up() {
    let scratch = tempfile::tempdir().unwrap();
    let report = json(&stage(
        &["--synthetic-size", "8MiB", "--json"],
        scratch.path(),
    ));
    assert_eq!(
        keys(&report),
        set(&[
            "backend",
            "mode",
            "files",
            "headers_read",
            "tensors",
            "bytes",
            "seconds",
            "bytes_per_second",
            "paths",
            "fallbacks",
            "peak_device_bytes",
            "peak_host_bytes",
            "read_requests",
            "tensor_list",
            "passed_over",
            "mode_reason",
            "taken_device_bytes",
            "bytes_read",
            "unchanged_by",
            "redirects",
        ])
    );
    assert_eq!(report["unchanged_by"], "file-identity");
    assert_eq!(
        keys(&report["paths"]),
        set(&["destination", "device", "host", "mapped"])
    );
    assert_eq!(keys(&report["paths"]["device"]), set(&["tensors", "bytes"]));
    assert_eq!(
        keys(&report["fallbacks"]),
        set(&["insufficient_memory", "allocation_race"])
    );
    assert_eq!(report["backend"], "host");
    assert_eq!(report["mode"], "posix");
    assert!(
        report["files"].as_u64().unwrap() > 1,
        "the synthetic checkpoint is sharded"
    );
    let list = report["tensor_list"].as_array().unwrap();
    assert_eq!(list.len() as u64, report["tensors"].as_u64().unwrap());
    let total: u64 = list.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(total, report["bytes"].as_u64().unwrap());
    for t in list {
        assert_eq!(
            keys(t),
            set(&["name", "file", "dtype", "shape", "bytes", "path"])
        );
        assert_eq!(t["path"], "device");
    }
    assert_eq!(report["paths"]["device"]["bytes"], report["bytes"]);
    assert_eq!(report["peak_host_bytes"], 0);
    assert_eq!(
        report["bytes_read"], report["bytes"],
        "a full load reads every byte once"
    );
    // The temporary checkpoint is removed after the load.
    let file = PathBuf::from(list[0]["file"].as_str().unwrap());
    assert!(!file.exists(), "{} was left behind", file.display());
}

#[test]
fn checksums_match_the_safetensors_crate_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = every_dtype();
    first.push(TensorSpec::new("big.bf16", Dtype::BF16, &[300, 1001]));
    let second = vec![
        TensorSpec::new("other.f32", Dtype::F32, &[77, 13]),
        TensorSpec::bytes("empty", 0),
    ];
    let fixture = write_sharded(dir.path(), &[first, second], 42).unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    for extra in [
        &["--backend", "host"][..],
        &[
            "--backend",
            "host",
            "--threads",
            "2",
            "--coalesce-below",
            "0",
        ],
        &[
            "--backend",
            "host",
            "--threads",
            "2",
            "--coalesce-below",
            "1MiB",
        ],
        &[
            "--backend",
            "host",
            "--device-memory",
            "1MiB",
            "--chunk-size",
            "64KiB",
        ],
    ] {
        let scratch = tempfile::tempdir().unwrap();
        let mut args = vec![dir_arg, "--json", "--checksums"];
        args.extend_from_slice(extra);
        let report = json(&stage(&args, scratch.path()));
        assert_eq!(
            common::assert_checksums(&report),
            fixture.contents.len(),
            "{extra:?}"
        );
        if extra.contains(&"--device-memory") {
            assert!(
                report["paths"]["host"]["tensors"].as_u64().unwrap() > 0,
                "the cap forces host paths"
            );
            assert!(report["peak_device_bytes"].as_u64().unwrap() <= 1 << 20);
        }
    }
}

#[test]
fn device_memory_cap_sends_the_large_tensor_to_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut specs = vec![TensorSpec::new("embed", Dtype::BF16, &[150 << 10, 1024])]; // 300 MiB
    for i in 0..4 {
        specs.push(TensorSpec::new(
            format!("layer.{i}.weight"),
            Dtype::BF16,
            &[1024, 512],
        ));
    }
    write_file(&path, &specs, 5).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let report = json(&stage(
        &[
            path.to_str().unwrap(),
            "--device-memory",
            "512MiB",
            "--json",
        ],
        scratch.path(),
    ));
    let list = report["tensor_list"].as_array().unwrap();
    assert_eq!(list[0]["name"], "embed");
    assert_eq!(list[0]["bytes"], 300u64 << 20);
    assert_eq!(list[0]["path"], "host");
    for t in &list[1..] {
        assert_eq!(t["path"], "device", "{}", t["name"]);
    }
    assert_eq!(report["fallbacks"]["insufficient_memory"], 1);
    let peak = report["peak_device_bytes"].as_u64().unwrap();
    assert!(peak <= 512 << 20, "peak device bytes {peak}");
    assert!(peak >= 4 << 20, "the small tensors are on the device");
}

#[test]
fn malformed_inputs_fail_with_one_line_and_no_panic() {
    for case in malformed::MALFORMED {
        let dir = tempfile::tempdir().unwrap();
        let paths = malformed::build(case, dir.path());
        let args: Vec<&str> = paths.iter().map(|p| p.to_str().unwrap()).collect();
        let out = stage(&args, dir.path());
        assert_eq!(
            out.code,
            Some(1),
            "{case}: exit {:?}, stderr {}",
            out.code,
            out.stderr
        );
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{case}: stderr {:?}", out.stderr);
        assert!(
            lines[0].starts_with("stage: error: "),
            "{case}: {}",
            lines[0]
        );
        assert!(
            lines[0].contains(dir.path().to_str().unwrap()),
            "{case}: names no path: {}",
            lines[0]
        );
        assert!(!out.stderr.contains("panicked"), "{case}: {}", out.stderr);
        assert!(
            out.stdout.is_empty(),
            "{case}: partial output {}",
            out.stdout
        );
        eprintln!("{case}: exited in {:?}", out.elapsed);
    }
}

#[test]
fn human_output_lists_every_tensor_and_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        TensorSpec::bytes("alpha", 100),
        TensorSpec::new("beta", Dtype::F16, &[4, 4]),
    ];
    let path = dir.path().join("model.safetensors");
    write_file(&path, &specs, 9).unwrap();
    let out = stage(&[path.to_str().unwrap(), "--backend", "host"], dir.path());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("alpha"));
    assert!(out.stdout.contains("beta"));
    assert!(out.stdout.contains("loaded 2 tensors"), "{}", out.stdout);
    assert!(out.stdout.contains("backend host"), "{}", out.stdout);
}

/// Built with `--features mock` (CI runs this file so too): the mock backend, its ledger checked
/// by the command itself.
#[cfg(feature = "mock")]
#[test]
fn the_mock_backend_is_there_when_built_in() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_file(&path, &[TensorSpec::bytes("alpha", 100)], 9).unwrap();
    let out = stage(
        &[
            path.to_str().unwrap(),
            "--backend",
            "mock",
            "--device-memory",
            "1MiB",
        ],
        dir.path(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("backend mock"), "{}", out.stdout);
}

/// A release build (no `mock` feature) has no mock backend, and says how to get one.
#[cfg(not(feature = "mock"))]
#[test]
fn the_mock_backend_is_not_in_a_plain_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_file(&path, &[TensorSpec::bytes("alpha", 100)], 9).unwrap();
    let out = stage(&[path.to_str().unwrap(), "--backend", "mock"], dir.path());
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(
        out.stderr
            .contains("the mock backend is not built into this library (cargo feature `mock`)"),
        "{}",
        out.stderr
    );
}

#[test]
fn sizes_parse_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_file(&path, &[TensorSpec::bytes("w", 5000)], 1).unwrap();
    let p = path.to_str().unwrap();
    for good in ["4096", "64k", "64KiB", "1MiB", "0.5MiB", "2GiB", "1MB"] {
        let out = stage(&[p, "--chunk-size", good, "--json"], dir.path());
        assert_eq!(out.code, Some(0), "{good}: {}", out.stderr);
    }
    for bad in ["12XB", "lots", "-1", "1.3"] {
        let out = stage(&[p, "--chunk-size", bad], dir.path());
        assert_ne!(out.code, Some(0), "{bad} was accepted");
    }
    let out = stage(&[p, "--chunk-size", "0"], dir.path());
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("chunk size must be at least 1 byte"),
        "{}",
        out.stderr
    );
    let out = stage(&[p, "--threads", "0"], dir.path());
    assert_eq!(out.code, Some(1));
}

#[test]
fn threads_give_the_same_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_file(
        &path,
        &[
            TensorSpec::bytes("w", 1 << 20),
            TensorSpec::bytes("v", 12345),
        ],
        1,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let one = json(&stage(&[p, "--json", "--checksums"], dir.path()));
    let four = json(&stage(
        &[
            p,
            "--json",
            "--checksums",
            "--threads",
            "4",
            "--chunk-size",
            "64KiB",
        ],
        dir.path(),
    ));
    assert_eq!(one["tensor_list"], four["tensor_list"]);
}

#[test]
fn coalescing_makes_fewer_requests_for_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs: Vec<TensorSpec> = (0..40)
        .map(|i| TensorSpec::new(format!("norm.{i}"), Dtype::F32, &[64 * (i % 4 + 1)]))
        .collect();
    write_file(&path, &specs, 3).unwrap();
    let p = path.to_str().unwrap();
    let run = |below: &str| {
        json(&stage(
            &[
                p,
                "--json",
                "--checksums",
                "--threads",
                "2",
                "--coalesce-below",
                below,
            ],
            dir.path(),
        ))
    };
    let (off, on) = (run("0"), run("1MiB"));
    assert_eq!(
        off["tensor_list"], on["tensor_list"],
        "same bytes, same paths"
    );
    assert_eq!(off["read_requests"], 40, "one request per tensor");
    assert_eq!(
        on["read_requests"], 1,
        "40 back-to-back small tensors, one run"
    );
}

#[test]
fn select_loads_exactly_the_matching_tensors_and_reads_only_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let shards = vec![
        vec![
            TensorSpec::new("model.embed_tokens.weight", Dtype::BF16, &[256, 64]),
            TensorSpec::new(
                "model.layers.0.self_attn.q_proj.weight",
                Dtype::BF16,
                &[64, 64],
            ),
            TensorSpec::new("model.layers.0.mlp.up_proj.weight", Dtype::BF16, &[128, 64]),
        ],
        vec![
            TensorSpec::new(
                "model.layers.1.self_attn.q_proj.weight",
                Dtype::BF16,
                &[64, 64],
            ),
            TensorSpec::new(
                "model.layers.10.mlp.up_proj.weight",
                Dtype::BF16,
                &[128, 64],
            ),
            TensorSpec::new("model.norm.weight", Dtype::F32, &[64]),
        ],
    ];
    let fixture = write_sharded(dir.path(), &shards, 21).unwrap();
    let d = dir.path().to_str().unwrap();
    let report = json(&stage(
        &[d, "--select", "model.layers.0.*", "--json", "--checksums"],
        dir.path(),
    ));
    let names: Vec<&str> = report["tensor_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.up_proj.weight"
        ]
    );
    let selected: usize = names.iter().map(|n| fixture.contents[*n].len()).sum();
    assert_eq!(report["bytes"], selected as u64);
    assert_eq!(report["bytes_read"], selected as u64);
    assert_eq!(common::assert_checksums(&report), 2);
    // Any of several globs; a glob that matches nothing is an error, not an empty load.
    let report = json(&stage(
        &[d, "--select", "*.norm.*", "--select", "*embed*", "--json"],
        dir.path(),
    ));
    assert_eq!(report["tensors"], 2);
    let out = stage(&[d, "--select", "model.layer.*"], dir.path());
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("matches no tensor"), "{}", out.stderr);
}

#[test]
fn rows_are_narrowed_in_the_report_and_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let contents = write_file(
        &path,
        &[
            TensorSpec::new("w", Dtype::F16, &[100, 30]),
            TensorSpec::new("v", Dtype::F32, &[10]),
        ],
        2,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let report = json(&stage(
        &[
            p,
            "--rows",
            "w=20:50",
            "--rows",
            "v=1/2",
            "--json",
            "--checksums",
        ],
        dir.path(),
    ));
    let list = report["tensor_list"].as_array().unwrap();
    assert_eq!(list[0]["shape"], serde_json::json!([30, 30]));
    assert_eq!(list[0]["rows"], serde_json::json!([20, 50]));
    assert_eq!(list[1]["rows"], serde_json::json!([5, 10]));
    let expected = 30 * 30 * 2 + 5 * 4;
    assert_eq!(report["bytes_read"], expected);
    use sha2::Digest;
    let sha = |b: &[u8]| -> String {
        sha2::Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    };
    assert_eq!(list[0]["sha256"], sha(&contents["w"][20 * 60..50 * 60]));
    assert_eq!(list[1]["sha256"], sha(&contents["v"][20..40]));
    let out = stage(&[p, "--rows", "w=90:101"], dir.path());
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr
            .contains("cannot read rows 90..101: they are not inside its 100 rows"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_hub_cache_snapshot_loads_byte_exact() {
    let cache = tempfile::tempdir().unwrap();
    let shards = vec![
        vec![TensorSpec::new(
            "model.embed_tokens.weight",
            Dtype::BF16,
            &[300, 64],
        )],
        vec![TensorSpec::new("model.norm.weight", Dtype::F32, &[64])],
    ];
    let written =
        backend_mock::fixtures::write_hub_cache(cache.path(), "org/name", "f00d", &shards, 6)
            .unwrap();
    let snapshot = written.dir.to_str().unwrap();
    assert!(
        snapshot.ends_with("models--org--name/snapshots/f00d"),
        "{snapshot}"
    );
    let report = json(&stage(&[snapshot, "--json", "--checksums"], cache.path()));
    assert_eq!(report["files"], 2);
    assert_eq!(common::assert_checksums(&report), 2);
}

#[test]
fn a_closed_stdout_ends_stage_quietly() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs: Vec<TensorSpec> = (0..2000)
        .map(|i| TensorSpec::bytes(format!("tensor.with.a.long.name.{i}"), 8))
        .collect();
    write_file(&path, &specs, 1).unwrap();
    for extra in [&[][..], &["--json"]] {
        // The reader goes away before `stage` writes its table: `stage ... | head -0`.
        let mut child = Command::new(env!("CARGO_BIN_EXE_stage"))
            .arg(&path)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {stderr}");
        assert!(stderr.is_empty(), "{extra:?}: {stderr}");
    }
}

/// URLs need the `remote` feature (CI's AddressSanitizer run builds without it).
#[cfg(feature = "remote")]
#[test]
fn no_secret_in_any_output_of_stage() {
    // A login in the URL and secret store options: in the JSON report, the human output, an
    // error and the option dump, none of them is shown (the login is sent, as Basic
    // authentication, to its host).
    let scratch = tempfile::tempdir().unwrap();
    let server = backend_mock::http::RangeServer::start().unwrap();
    let file = scratch.path().join("model.safetensors");
    write_file(&file, &[TensorSpec::bytes("w", 4096)], 1).unwrap();
    server.put("/private/model.safetensors", std::fs::read(&file).unwrap());
    let url = server
        .url("/private/model.safetensors")
        .replace("http://", "http://alice:SECRET-PW@");
    let secrets = [
        "--store-option",
        "aws_secret_access_key=SECRET-KEY",
        "--store-option",
        "azure_storage_sas_key=SECRET-SAS",
        "--store-option",
        "google_service_account_key=SECRET-GCS",
    ];
    let mut outputs = Vec::new();
    for extra in [&["--json"][..], &[][..]] {
        let mut args = vec![url.as_str()];
        args.extend_from_slice(extra);
        let output = stage(&args, scratch.path());
        assert_eq!(output.code, Some(0), "{}", output.stderr);
        outputs.push(output);
    }
    // The option dump, and a load the HTTP store refuses for options it does not take.
    for extra in [&["--print-options"][..], &["--json"][..]] {
        let mut args = vec![url.as_str()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&secrets);
        outputs.push(stage(&args, scratch.path()));
    }
    assert_eq!(outputs[2].code, Some(0), "{}", outputs[2].stderr);
    assert!(
        outputs[3].stderr.contains("aws_secret_access_key"),
        "{}",
        outputs[3].stderr
    );
    let missing = url.replace("model.safetensors", "missing.safetensors");
    let failed = stage(&[missing.as_str(), "--json"], scratch.path());
    assert_ne!(failed.code, Some(0));
    assert!(
        failed.stderr.contains("missing.safetensors"),
        "{}",
        failed.stderr
    );
    outputs.push(failed);
    for output in &outputs {
        for text in [&output.stdout, &output.stderr] {
            assert!(!text.contains("SECRET"), "a secret is shown: {text}");
            assert!(!text.contains("alice"), "the login is shown: {text}");
        }
    }
    assert!(
        outputs[0]
            .stdout
            .contains(&server.url("/private/model.safetensors"))
    );
    assert!(
        outputs[2].stdout.contains("<redacted>"),
        "{}",
        outputs[2].stdout
    );
    let log = server.log();
    assert!(
        log.iter()
            .all(|l| l.authorization.as_deref() == Some("Basic YWxpY2U6U0VDUkVULVBX")),
        "{log:#?}"
    );
}
