//! Malformed checkpoints, shared by the library tests and the `stage` command tests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use backend_mock::fixtures::{TensorSpec, write_file, write_index, write_raw};

/// Every malformed input this suite knows, by name.
pub(crate) const MALFORMED: &[&str] = &[
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
    "index_symlink_escape",
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
pub(crate) fn build(case: &str, dir: &Path) -> Vec<PathBuf> {
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let one = |p: PathBuf| vec![p];
    let f32_2 = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    match case {
        "empty_file" => {
            let p = ckpt.join("model.safetensors");
            std::fs::write(&p, b"").unwrap();
            one(p)
        }
        "short_length" => {
            let p = ckpt.join("model.safetensors");
            std::fs::write(&p, [1u8, 2, 3, 4, 5]).unwrap();
            one(p)
        }
        "header_over_limit" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, 100_000_001, b"{}", &[]).unwrap();
            one(p)
        }
        "huge_header_length" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, u64::MAX, b"{}", &[]).unwrap();
            one(p)
        }
        "header_past_eof" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, 1000, f32_2.as_bytes(), &[0; 8]).unwrap();
            one(p)
        }
        "invalid_json" => one(header_file(&ckpt, "{not json at all", 0)),
        "invalid_utf8" => {
            let p = ckpt.join("model.safetensors");
            write_raw(&p, 4, &[0xff, 0xfe, 0xfd, 0xfc], &[]).unwrap();
            one(p)
        }
        "unknown_dtype" => one(header_file(
            &ckpt,
            r#"{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#,
            8,
        )),
        "negative_offset" => one(header_file(
            &ckpt,
            r#"{"w":{"dtype":"U8","shape":[8],"data_offsets":[-8,0]}}"#,
            8,
        )),
        "offsets_outside_file" => one(header_file(
            &ckpt,
            r#"{"w":{"dtype":"U8","shape":[1000],"data_offsets":[0,1000]}}"#,
            8,
        )),
        "overlapping_tensors" => one(header_file(
            &ckpt,
            r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#,
            12,
        )),
        "gap_between_tensors" => one(header_file(
            &ckpt,
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#,
            12,
        )),
        "shape_disagrees_with_length" => one(header_file(
            &ckpt,
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        )),
        "shape_overflow" => one(header_file(
            &ckpt,
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
            8,
        )),
        "trailing_bytes" => one(header_file(&ckpt, f32_2, 9)),
        "truncated_file" => one(header_file(&ckpt, f32_2, 5)),
        "index_invalid_json" => {
            let p = ckpt.join("model.safetensors.index.json");
            std::fs::write(&p, b"{\"weight_map\": [").unwrap();
            one(ckpt)
        }
        "index_without_weight_map" => {
            let p = ckpt.join("model.safetensors.index.json");
            std::fs::write(&p, b"{\"metadata\": {}}").unwrap();
            one(ckpt)
        }
        "index_missing_shard" => {
            shard(&ckpt, "a.safetensors", &["x"]);
            index(&ckpt, &[("x", "a.safetensors"), ("y", "gone.safetensors")]);
            one(ckpt)
        }
        "index_absolute_path" => {
            index(&ckpt, &[("x", "/etc/passwd")]);
            one(ckpt)
        }
        "index_parent_dir" => {
            shard(dir, "outside.safetensors", &["x"]);
            index(&ckpt, &[("x", "../outside.safetensors")]);
            one(ckpt)
        }
        "index_symlink_escape" => {
            shard(dir, "outside.safetensors", &["x"]);
            std::os::unix::fs::symlink(
                dir.join("outside.safetensors"),
                ckpt.join("link.safetensors"),
            )
            .unwrap();
            index(&ckpt, &[("x", "link.safetensors")]);
            one(ckpt)
        }
        "index_shard_is_directory" => {
            std::fs::create_dir(ckpt.join("sub.safetensors")).unwrap();
            index(&ckpt, &[("x", "sub.safetensors")]);
            one(ckpt)
        }
        "index_shard_is_fifo" => {
            mkfifo(&ckpt.join("pipe.safetensors"));
            index(&ckpt, &[("x", "pipe.safetensors")]);
            one(ckpt)
        }
        "index_tensor_not_in_shard" => {
            shard(&ckpt, "a.safetensors", &["x"]);
            index(&ckpt, &[("x", "a.safetensors"), ("ghost", "a.safetensors")]);
            one(ckpt)
        }
        "index_shard_has_unlisted_tensor" => {
            shard(&ckpt, "a.safetensors", &["x", "extra"]);
            index(&ckpt, &[("x", "a.safetensors")]);
            one(ckpt)
        }
        "duplicate_tensor_across_shards" => {
            shard(&ckpt, "a.safetensors", &["w"]);
            shard(&ckpt, "b.safetensors", &["w", "v"]);
            index(&ckpt, &[("w", "a.safetensors"), ("v", "b.safetensors")]);
            one(ckpt)
        }
        "duplicate_tensor_in_directory" => {
            shard(&ckpt, "a.safetensors", &["w"]);
            shard(&ckpt, "b.safetensors", &["w"]);
            one(ckpt)
        }
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

/// Opens paths the way the `stage` command does.
pub(crate) fn open(paths: &[PathBuf]) -> staging_core::Result<staging_core::Checkpoint> {
    match paths {
        [one] => staging_core::Checkpoint::open(one),
        many => staging_core::Checkpoint::from_files(many),
    }
}

/// The `stage` example binary, built (once per test process) into this target directory's
/// debug profile, so a partial run such as `cargo test --test cli` never uses a stale binary.
pub(crate) fn stage_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            // target/<profile>/deps/<test binary>
            let target_dir = exe.ancestors().nth(3).unwrap().to_path_buf();
            let status = std::process::Command::new(env!("CARGO"))
                .args(["build", "--quiet", "--example", "stage", "--manifest-path"])
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
                .arg("--target-dir")
                .arg(&target_dir)
                .status()
                .unwrap();
            assert!(status.success(), "building the stage example failed");
            let path = target_dir.join("debug").join("examples").join("stage");
            assert!(path.exists(), "{} is missing", path.display());
            path
        })
        .clone()
}

/// What a `stage` run printed and returned.
pub(crate) struct Output {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) elapsed: std::time::Duration,
}

/// Runs `stage` with `args` and extra environment variables, writing its output under
/// `scratch`; kills it and fails if it has not exited within 60 s.
pub(crate) fn run_stage(args: &[&str], env: &[(&str, &str)], scratch: &Path) -> Output {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let out_path = scratch.join("stdout.txt");
    let err_path = scratch.join("stderr.txt");
    let start = Instant::now();
    let mut child = Command::new(stage_binary())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            child.wait().ok();
            panic!("stage {args:?} hung for 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
        elapsed: start.elapsed(),
    }
}

/// Checks every `sha256` in a `stage --json --checksums` report against the bytes the
/// `safetensors` crate reads from the same files; returns how many tensors were checked.
pub(crate) fn assert_checksums(report: &serde_json::Value) -> usize {
    use sha2::{Digest, Sha256};
    let list = report["tensor_list"].as_array().unwrap();
    let mut files = std::collections::HashMap::new();
    for t in list {
        let file = t["file"].as_str().unwrap().to_owned();
        let bytes = files
            .entry(file.clone())
            .or_insert_with(|| std::fs::read(&file).unwrap());
        let reference = safetensors::SafeTensors::deserialize(bytes).unwrap();
        let name = t["name"].as_str().unwrap();
        let view = reference.tensor(name).unwrap();
        assert_eq!(
            t["dtype"].as_str(),
            Some(format!("{:?}", view.dtype()).as_str()),
            "{name}"
        );
        assert_eq!(t["shape"], serde_json::json!(view.shape()), "{name}");
        let expected: String = Sha256::digest(view.data())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(t["sha256"].as_str(), Some(expected.as_str()), "{name}");
    }
    list.len()
}

/// The JSON report of a `stage` run that must have succeeded.
pub(crate) fn report(out: &Output) -> serde_json::Value {
    assert_eq!(out.code, Some(0), "stage failed: {}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// Checks a `stage` run failed with exit 1 and one stderr line containing `text`, no panic.
pub(crate) fn fails_with(out: &Output, text: &str) {
    assert_eq!(
        out.code,
        Some(1),
        "expected failure, got {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(lines[0].contains(text), "{:?} lacks {text:?}", lines[0]);
    assert!(!out.stderr.contains("panicked"));
}

/// Reads the `size_t (void)` counter `symbol` of the stub library at `library` (already loaded
/// by the test; opening it again returns the same instance).
pub(crate) fn stub_counter(library: &Path, symbol: &[u8]) -> usize {
    // SAFETY: the stub's initializers are trivial and `symbol` is a `size_t (void)` function.
    unsafe {
        let lib = libloading::Library::new(library).unwrap();
        let counter: libloading::Symbol<unsafe extern "C" fn() -> usize> = lib.get(symbol).unwrap();
        counter()
    }
}

/// Loads one 64 KiB tensor with `harness`'s backend on one thread, checks its bytes, and
/// returns by how much `counter` grew meanwhile (other tests may add to it, never take away).
pub(crate) fn counted_load<H: backend_mock::conformance::Harness>(
    harness: &H,
    counter: impl Fn() -> usize,
) -> usize {
    use staging_core::{
        Checkpoint, DeviceAllocator, DeviceBuffer, Stager, StagingPolicy, TensorData,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let contents = write_file(&path, &[TensorSpec::bytes("w", 64 << 10)], 21).unwrap();
    let (reader, allocator) = harness.backend();
    let policy = StagingPolicy {
        io_threads: 1,
        ..StagingPolicy::default()
    };
    let before = counter();
    let mut stager =
        Stager::new(Checkpoint::open(&path).unwrap(), reader, allocator, policy).unwrap();
    let tensor = stager.next().unwrap().unwrap();
    let grew = counter() - before;
    let TensorData::Device(d) = tensor.data() else {
        panic!("expected the device path, got {:?}", tensor.path());
    };
    let mut bytes = vec![0u8; d.buffer().len()];
    stager
        .allocator()
        .copy_to_host(d.buffer(), 0, &mut bytes)
        .unwrap();
    assert_eq!(bytes, contents["w"]);
    grew
}
