//! `stage hf://org/name` against a fake Hugging Face Hub on loopback (`backend_mock::hub`),
//! configured as a user configures `huggingface_hub`: `HF_ENDPOINT`, `HF_HUB_CACHE`,
//! `HF_TOKEN`, `HF_HUB_OFFLINE`. The library's Hub behaviour is tested in `tests/it/hub.rs`;
//! here, what the command makes of it: the report, the cache it leaves, `--cache false`, and
//! the error object of `--json`.

#![cfg(feature = "remote")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::path::Path;

use backend_mock::fixtures::{TensorSpec, write_sharded};
use backend_mock::hub::FakeHub;
use serde_json::Value;

use common::Output;

/// A fake Hub serving a two-shard model as `org/tiny`, and the checksums of its tensors.
fn hub_with_model(dir: &Path) -> (FakeHub, String) {
    let fixture = write_sharded(
        dir,
        &[
            vec![TensorSpec::bytes("a", 3000), TensorSpec::bytes("b", 17)],
            vec![TensorSpec::bytes("c", 70_000)],
        ],
        3,
    )
    .unwrap();
    let mut files: Vec<(String, Vec<u8>)> = fixture
        .files
        .iter()
        .chain([&fixture.index])
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(p).unwrap(),
            )
        })
        .collect();
    files.push(("config.json".into(), b"{}".to_vec()));
    let hub = FakeHub::start().unwrap();
    let borrowed: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let commit = hub.add_repo("org/tiny", &borrowed);
    (hub, commit)
}

fn stage(args: &[&str], env: &[(&str, &str)], scratch: &Path) -> Output {
    common::run_stage(args, env, scratch)
}

fn report(output: &Output) -> Value {
    assert_eq!(output.code, Some(0), "stage failed: {}", output.stderr);
    serde_json::from_str(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", output.stdout))
}

#[test]
fn stage_streams_a_hub_model_then_loads_it_from_the_cache() {
    let work = tempfile::tempdir().unwrap();
    let (hub, commit) = hub_with_model(work.path());
    let cache = work.path().join("hf-cache");
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "0"),
    ];
    let args = [
        "hf://org/tiny",
        "--backend",
        "host",
        "--json",
        "--checksums",
    ];
    let cold = report(&stage(&args, &env, work.path()));
    assert_eq!(cold["mode"], "remote");
    assert_eq!(cold["tensors"], 3);
    let snapshot = cache.join("models--org--tiny/snapshots").join(&commit);
    for name in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
    ] {
        assert!(
            snapshot.join(name).is_file(),
            "{name} is not in the snapshot"
        );
    }
    hub.clear_log();
    let warm = report(&stage(&args, &env, work.path()));
    assert_eq!(warm["mode"], "posix", "a warm cache is a local load");
    let sums = |r: &Value| -> Vec<(String, String)> {
        r["tensor_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["name"].to_string(), t["sha256"].to_string()))
            .collect()
    };
    assert_eq!(sums(&warm), sums(&cold), "the same bytes");
    // The cold load names the Hub's files, the warm one the snapshot's.
    assert!(
        cold["tensor_list"][0]["file"]
            .as_str()
            .unwrap()
            .contains("/org/tiny/resolve/")
    );
    assert!(
        warm["tensor_list"][0]["file"]
            .as_str()
            .unwrap()
            .contains("snapshots")
    );
    assert!(
        hub.log()
            .iter()
            .all(|l| l.server == backend_mock::hub::Server::Hub && l.path.starts_with("/api/"))
    );

    // --cache false: nothing written.
    let elsewhere = work.path().join("other-cache");
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HUB_CACHE", elsewhere.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "0"),
    ];
    let streamed = report(&stage(
        &[
            "hf://org/tiny",
            "--backend",
            "host",
            "--json",
            "--cache",
            "false",
        ],
        &env,
        work.path(),
    ));
    assert_eq!(streamed["mode"], "remote");
    assert!(!elsewhere.exists());
}

#[test]
fn stage_names_a_gated_model_and_an_offline_miss() {
    let work = tempfile::tempdir().unwrap();
    let (hub, _) = hub_with_model(work.path());
    hub.gate("org/tiny", &["hf_yes"]);
    let cache = work.path().join("hf-cache");
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "0"),
        ("HF_TOKEN", ""),
        ("HF_TOKEN_PATH", "/nonexistent/token"),
    ];
    let out = stage(
        &["hf://org/tiny", "--backend", "host", "--json"],
        &env,
        work.path(),
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let error: Value = serde_json::from_str(&out.stdout).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("org/tiny is a gated model"), "{message}");
    assert_eq!(error["error"]["kind"], "permission-denied");

    let mut with_token = env.to_vec();
    with_token[3] = ("HF_TOKEN", "hf_yes");
    let loaded = report(&stage(
        &["hf://org/tiny", "--backend", "host", "--json"],
        &with_token,
        work.path(),
    ));
    assert_eq!(loaded["tensors"], 3);

    let offline = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "1"),
    ];
    let out = stage(&["hf://org/other"], &offline, work.path());
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("HF_HUB_OFFLINE is set") && out.stderr.contains("org/other"),
        "{}",
        out.stderr
    );
}
