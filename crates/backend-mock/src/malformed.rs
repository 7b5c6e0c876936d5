//! Malformed checkpoints, by name: every kind of bad input the suites know, built on disk so
//! that the library tests and the `stage` command tests try the same ones.
//!
//! The functions panic when they cannot build a case (they are test fixtures).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::fixtures::{TensorSpec, write_file, write_index, write_raw};

/// Every malformed input this suite knows, by name.
pub const MALFORMED: &[&str] = &[
    "empty_file",
    "short_length",
    "header_over_limit",
    "huge_header_length",
    "header_past_eof",
    "invalid_json",
    "invalid_utf8",
    "unknown_dtype",
    "negative_offset",
    "offsets_outside_file",
    "overlapping_tensors",
    "gap_between_tensors",
    "shape_disagrees_with_length",
    "shape_overflow",
    "trailing_bytes",
    "truncated_file",
    "index_invalid_json",
    "index_without_weight_map",
    "index_missing_shard",
    "index_absolute_path",
    "index_parent_dir",
    "index_dot_component",
    "index_empty_component",
    "index_backslash",
    "index_shard_is_directory",
    "index_shard_is_fifo",
    "index_tensor_not_in_shard",
    "index_shard_has_unlisted_tensor",
    "duplicate_tensor_across_shards",
    "duplicate_tensor_in_directory",
    "duplicate_file_in_list",
    "empty_directory",
    "nonexistent_path",
    "fifo_path",
];

fn header_file(dir: &Path, header: &str, data_len: usize) -> PathBuf {
    let path = dir.join("model.safetensors");
    write_raw(
        &path,
        header.len() as u64,
        header.as_bytes(),
        &vec![7u8; data_len],
    )
    .unwrap();
    path
}

fn shard(dir: &Path, name: &str, tensors: &[&str]) {
    let specs: Vec<_> = tensors.iter().map(|t| TensorSpec::bytes(*t, 8)).collect();
    write_file(&dir.join(name), &specs, 1).unwrap();
}

fn index(dir: &Path, entries: &[(&str, &str)]) -> PathBuf {
    let map: BTreeMap<String, String> = entries
        .iter()
        .map(|(t, s)| (t.to_string(), s.to_string()))
        .collect();
    let path = dir.join("model.safetensors.index.json");
    write_index(&path, &map, 0).unwrap();
    path
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo failed");
}

/// Builds malformed input `case` inside `dir` (the checkpoint directory is `dir/ckpt`) and
/// returns the paths to open.
pub fn build(case: &str, dir: &Path) -> Vec<PathBuf> {
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    if let Some(path) = bad_file(case, &ckpt) {
        return vec![path];
    }
    if let Some(paths) = bad_index(case, dir, &ckpt) {
        return paths;
    }
    let one = |p: PathBuf| vec![p];
    match case {
        "duplicate_file_in_list" => {
            shard(&ckpt, "a.safetensors", &["w"]);
            vec![ckpt.join("a.safetensors"), ckpt.join("./a.safetensors")]
        }
        "empty_directory" => {
            std::fs::write(ckpt.join("README.md"), b"no weights here").unwrap();
            one(ckpt)
        }
        "nonexistent_path" => one(ckpt.join("missing.safetensors")),
        "fifo_path" => {
            let p = ckpt.join("model.safetensors");
            mkfifo(&p);
            one(p)
        }
        other => panic!("unknown malformed case {other}"),
    }
}

/// The cases of one bad safetensors file (its length prefix, header or data), built as
/// `ckpt/model.safetensors`; `None` (and nothing built) for a case of another kind.
fn bad_file(case: &str, ckpt: &Path) -> Option<PathBuf> {
    let f32_2 = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let path = match case {
        "empty_file" => {
            let p = ckpt.join("model.safetensors");
            std::fs::write(&p, b"").unwrap();
            p
        }
        "short_length" => {
            let p = ckpt.join("model.safetensors");
            std::fs::write(&p, [1u8, 2, 3, 4, 5]).unwrap();
            p
        }
        "header_over_limit" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, 100_000_001, b"{}", &[]).unwrap();
            p
        }
        "huge_header_length" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, u64::MAX, b"{}", &[]).unwrap();
            p
        }
        "header_past_eof" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, 1000, f32_2.as_bytes(), &[0; 8]).unwrap();
            p
        }
        "invalid_json" => header_file(ckpt, "{not json at all", 0),
        "invalid_utf8" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, 4, &[0xff, 0xfe, 0xfd, 0xfc], &[]).unwrap();
            p
        }
        "unknown_dtype" => header_file(
            ckpt,
            r#"{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#,
            8,
        ),
        "negative_offset" => header_file(
            ckpt,
            r#"{"w":{"dtype":"U8","shape":[8],"data_offsets":[-8,0]}}"#,
            8,
        ),
        "offsets_outside_file" => header_file(
            ckpt,
            r#"{"w":{"dtype":"U8","shape":[1000],"data_offsets":[0,1000]}}"#,
            8,
        ),
        "overlapping_tensors" => header_file(
            ckpt,
            r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#,
            12,
        ),
        "gap_between_tensors" => header_file(
            ckpt,
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#,
            12,
        ),
        "shape_disagrees_with_length" => header_file(
            ckpt,
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        ),
        "shape_overflow" => header_file(
            ckpt,
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
            8,
        ),
        "trailing_bytes" => header_file(ckpt, f32_2, 9),
        "truncated_file" => header_file(ckpt, f32_2, 5),
        _ => return None,
    };
    Some(path)
}

/// The cases of a sharded checkpoint whose index or shards disagree (the index unreadable,
/// naming shards that are missing, outside `ckpt` or not files, tensors in no shard or in two);
/// `None` (and nothing built) for a case of another kind.
fn bad_index(case: &str, dir: &Path, ckpt: &Path) -> Option<Vec<PathBuf>> {
    match case {
        "index_invalid_json" => {
            let p = ckpt.join("model.safetensors.index.json");
            std::fs::write(&p, b"{\"weight_map\": [").unwrap();
        }
        "index_without_weight_map" => {
            let p = ckpt.join("model.safetensors.index.json");
            std::fs::write(&p, b"{\"metadata\": {}}").unwrap();
        }
        "index_missing_shard" => {
            shard(ckpt, "a.safetensors", &["x"]);
            index(ckpt, &[("x", "a.safetensors"), ("y", "gone.safetensors")]);
        }
        "index_absolute_path" => {
            index(ckpt, &[("x", "/etc/passwd")]);
        }
        "index_parent_dir" => {
            shard(dir, "outside.safetensors", &["x"]);
            index(ckpt, &[("x", "../outside.safetensors")]);
        }
        "index_dot_component" => {
            shard(ckpt, "a.safetensors", &["x"]);
            index(ckpt, &[("x", "./a.safetensors")]);
        }
        "index_empty_component" => {
            std::fs::create_dir(ckpt.join("sub")).unwrap();
            shard(&ckpt.join("sub"), "a.safetensors", &["x"]);
            index(ckpt, &[("x", "sub//a.safetensors")]);
        }
        "index_backslash" => {
            shard(dir, "outside.safetensors", &["x"]);
            index(ckpt, &[("x", "..\\outside.safetensors")]);
        }
        "index_shard_is_directory" => {
            std::fs::create_dir(ckpt.join("sub.safetensors")).unwrap();
            index(ckpt, &[("x", "sub.safetensors")]);
        }
        "index_shard_is_fifo" => {
            mkfifo(&ckpt.join("pipe.safetensors"));
            index(ckpt, &[("x", "pipe.safetensors")]);
        }
        "index_tensor_not_in_shard" => {
            shard(ckpt, "a.safetensors", &["x"]);
            index(ckpt, &[("x", "a.safetensors"), ("ghost", "a.safetensors")]);
        }
        "index_shard_has_unlisted_tensor" => {
            shard(ckpt, "a.safetensors", &["x", "extra"]);
            index(ckpt, &[("x", "a.safetensors")]);
        }
        "duplicate_tensor_across_shards" => {
            shard(ckpt, "a.safetensors", &["w"]);
            shard(ckpt, "b.safetensors", &["w", "v"]);
            index(ckpt, &[("w", "a.safetensors"), ("v", "b.safetensors")]);
        }
        "duplicate_tensor_in_directory" => {
            shard(ckpt, "a.safetensors", &["w"]);
            shard(ckpt, "b.safetensors", &["w"]);
        }
        _ => return None,
    }
    Some(vec![ckpt.to_path_buf()])
}
