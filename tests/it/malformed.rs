//! Every malformed input the README's "Guarantees" lists gets its own clear error from
//! `Checkpoint`, naming the file, and never a panic, a hang or a partial result.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use crate::common;

use backend_mock::malformed;

use rstest::rstest;
use staging_core::Error;

fn kind(error: &Error) -> &'static str {
    match error {
        Error::Header { .. } => "header",
        Error::Index { .. } => "index",
        Error::NotAFile { .. } => "not_a_file",
        Error::DuplicateTensor { .. } => "duplicate_tensor",
        Error::DuplicateFile { .. } => "duplicate_file",
        Error::NoCheckpoint { .. } => "no_checkpoint",
        Error::Io { .. } => "io",
        _ => "other",
    }
}

#[rstest]
#[case::empty_file("empty_file", "header", "too short for the 8-byte header length")]
#[case::short_length("short_length", "header", "too short")]
#[case::header_over_limit("header_over_limit", "header", "over the format's limit")]
#[case::huge_header_length("huge_header_length", "header", "over the format's limit")]
#[case::header_past_eof("header_past_eof", "header", "runs past the end")]
#[case::invalid_json("invalid_json", "header", "key must be a string")]
#[case::invalid_utf8("invalid_utf8", "header", "invalid")]
#[case::unknown_dtype("unknown_dtype", "header", "unknown variant `Q4`")]
#[case::negative_offset("negative_offset", "header", "invalid value: integer `-8`")]
#[case::offsets_outside_file("offsets_outside_file", "header", "truncated")]
#[case::overlapping_tensors("overlapping_tensors", "header", "invalid offset")]
#[case::gap_between_tensors("gap_between_tensors", "header", "invalid offset")]
#[case::shape_disagrees_with_length(
    "shape_disagrees_with_length",
    "header",
    "invalid shape, data type, or offset"
)]
#[case::shape_overflow("shape_overflow", "header", "overflow")]
#[case::trailing_bytes("trailing_bytes", "header", "trailing bytes")]
#[case::truncated_file("truncated_file", "header", "truncated")]
#[case::index_invalid_json("index_invalid_json", "index", "expected a map")]
#[case::index_without_weight_map(
    "index_without_weight_map",
    "index",
    "no `weight_map`, so not a safetensors index (a config.json? give the checkpoint's directory or its .safetensors files)"
)]
#[case::index_missing_shard(
    "index_missing_shard",
    "index",
    "shard \"gone.safetensors\" does not exist"
)]
#[case::index_absolute_path("index_absolute_path", "index", "is absolute")]
#[case::index_parent_dir("index_parent_dir", "index", "contains '..'")]
#[case::index_dot_component("index_dot_component", "index", "has a '.' component")]
#[case::index_empty_component("index_empty_component", "index", "has an empty component")]
#[case::index_backslash("index_backslash", "index", "contains a backslash")]
#[case::index_shard_is_directory("index_shard_is_directory", "not_a_file", "not a regular file")]
#[case::index_shard_is_fifo("index_shard_is_fifo", "not_a_file", "not a regular file")]
#[case::index_tensor_not_in_shard(
    "index_tensor_not_in_shard",
    "index",
    "\"ghost\" is listed in shard"
)]
#[case::index_shard_has_unlisted_tensor(
    "index_shard_has_unlisted_tensor",
    "index",
    "which the index does not list"
)]
#[case::duplicate_tensor_across_shards(
    "duplicate_tensor_across_shards",
    "duplicate_tensor",
    "tensor \"w\" is in both"
)]
#[case::duplicate_tensor_in_directory(
    "duplicate_tensor_in_directory",
    "duplicate_tensor",
    "tensor \"w\" is in both"
)]
#[case::duplicate_file_in_list("duplicate_file_in_list", "duplicate_file", "listed more than once")]
#[case::empty_directory("empty_directory", "no_checkpoint", "no model.safetensors.index.json")]
#[case::nonexistent_path("nonexistent_path", "io", "no such file or directory")]
#[case::fifo_path("fifo_path", "not_a_file", "not a regular file")]
fn malformed_input_is_a_clear_error(
    #[case] case: &str,
    #[case] expected_kind: &str,
    #[case] expected_text: &str,
) {
    assert!(
        malformed::MALFORMED.contains(&case),
        "{case} is not in the shared list"
    );
    let dir = tempfile::tempdir().unwrap();
    let paths = malformed::build(case, dir.path());
    let error = match common::open(&paths) {
        Ok(c) => panic!(
            "{case}: opened as a checkpoint with {} tensors",
            c.tensors().len()
        ),
        Err(e) => e,
    };
    let message = error.to_string();
    assert_eq!(kind(&error), expected_kind, "{case}: {message}");
    assert!(
        message.contains(expected_text),
        "{case}: {message:?} lacks {expected_text:?}"
    );
    assert!(
        !message.contains('\n'),
        "{case}: multi-line message {message:?}"
    );
    assert!(
        message.contains(dir.path().to_str().unwrap()),
        "{case}: the message names no path: {message}"
    );
}

#[test]
fn every_shared_case_is_tested_here() {
    let source = include_str!("malformed.rs");
    for case in malformed::MALFORMED {
        assert!(
            source.contains(&format!("#[case::{case}(")),
            "{case} has no case here"
        );
    }
}

#[test]
fn header_is_read_alone_not_the_whole_file() {
    // A 64 MiB data section after a valid header: opening must not read it. We prove it by
    // making the data unreadable holes in a sparse file and checking the open is instant in
    // bytes read: /proc/thread-self/io counts what this thread read (the other tests of this
    // binary read files meanwhile, on other threads).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let header = br#"{"w":{"dtype":"U8","shape":[67108864],"data_offsets":[0,67108864]}}"#;
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(8 + header.len() as u64 + (64 << 20)).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&(header.len() as u64).to_le_bytes(), 0)
        .unwrap();
    file.write_all_at(header, 8).unwrap();
    drop(file);
    let read_before = rchar();
    let checkpoint = staging_core::Checkpoint::open(&path).unwrap();
    let read = rchar() - read_before;
    assert_eq!(checkpoint.tensors()[0].len, 64 << 20);
    assert!(read < 1 << 20, "opening read {read} bytes");
}

fn rchar() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
