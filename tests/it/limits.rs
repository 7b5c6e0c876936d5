//! Limits: a header near the format's 100 MB limit and an index with a million entries open in
//! bounded time; symlink loops and fifos in a checkpoint directory end in errors, not hangs.
//! Times are printed (run with --nocapture), not asserted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::collections::BTreeMap;
use std::time::Instant;

use backend_mock::fixtures::{TensorSpec, write_file, write_index, write_raw};
use staging_core::{Checkpoint, Error};

#[test]
fn a_header_near_the_format_limit_opens() {
    let dir = tempfile::tempdir().unwrap();
    // 99.9 MB of header: metadata padding plus one tensor.
    let pad = "x".repeat(99_900_000);
    let header = format!(
        r#"{{"__metadata__":{{"pad":"{pad}"}},"w":{{"dtype":"U8","shape":[16],"data_offsets":[0,16]}}}}"#
    );
    assert!(header.len() < 100_000_000);
    let path = dir.path().join("model.safetensors");
    write_raw(&path, header.len() as u64, header.as_bytes(), &[7; 16]).unwrap();
    let start = Instant::now();
    let checkpoint = Checkpoint::open(&path).unwrap();
    eprintln!(
        "a {}-byte header opened in {:?}",
        header.len(),
        start.elapsed()
    );
    assert_eq!(checkpoint.tensors()[0].len, 16);
}

#[test]
fn an_index_with_a_million_entries_is_checked_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    write_file(
        &dir.path().join("a.safetensors"),
        &[TensorSpec::bytes("t.0", 4)],
        1,
    )
    .unwrap();
    let mut map = BTreeMap::new();
    for i in 0..1_000_000 {
        map.insert(format!("t.{i}"), "a.safetensors".to_string());
    }
    write_index(&dir.path().join("model.safetensors.index.json"), &map, 4).unwrap();
    let start = Instant::now();
    let error = Checkpoint::open(dir.path()).unwrap_err();
    eprintln!("a 1,000,000-entry index checked in {:?}", start.elapsed());
    assert!(matches!(error, Error::Index { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("is listed in shard \"a.safetensors\", which does not hold it"),
        "{error}"
    );
}

#[test]
fn a_symlink_loop_in_the_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("b.safetensors"),
        dir.path().join("a.safetensors"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    )
    .unwrap();
    let error = Checkpoint::open(dir.path()).unwrap_err();
    assert!(error.to_string().contains("symbolic links"), "{error}");
}

#[test]
fn a_symlink_loop_named_by_an_index_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("loop.safetensors"),
        dir.path().join("loop.safetensors"),
    )
    .unwrap();
    let map = BTreeMap::from([("w".to_string(), "loop.safetensors".to_string())]);
    write_index(&dir.path().join("model.safetensors.index.json"), &map, 0).unwrap();
    let error = Checkpoint::open(dir.path()).unwrap_err();
    assert!(error.to_string().contains("symbolic links"), "{error}");
}

#[test]
fn a_fifo_found_by_a_directory_scan_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    write_file(
        &dir.path().join("a.safetensors"),
        &[TensorSpec::bytes("w", 4)],
        1,
    )
    .unwrap();
    let fifo = dir.path().join("b.safetensors");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let error = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(error, Error::NotAFile { .. }), "{error}");
}
