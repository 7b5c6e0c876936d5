//! Files that change under the load: truncated, replaced or written after their headers were
//! read. The load ends with an error naming the file; no tensor of the changed file is handed
//! out with bytes that differ from what the header described.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::os::unix::fs::FileExt;
use std::path::Path;

use backend_mock::fixtures::{Contents, ShardedFixture, TensorSpec, write_sharded};
use rstest::rstest;
use staging_core::host::{HostAllocator, HostReader};
use staging_core::{Checkpoint, Dtype, Error, Stager, StagingPolicy, TensorData};

fn fixture(dir: &Path) -> ShardedFixture {
    let shards = vec![
        vec![
            TensorSpec::new("one.a", Dtype::F32, &[5000]),
            TensorSpec::bytes("one.b", 30000),
        ],
        vec![
            TensorSpec::new("two.a", Dtype::F16, &[7000]),
            TensorSpec::bytes("two.b", 9000),
        ],
    ];
    write_sharded(dir, &shards, 8).unwrap()
}

fn policy(threads: usize) -> StagingPolicy {
    StagingPolicy::builder()
        .chunk_size(4096)
        .staging_size(4096)
        .io_threads(threads)
        .build()
        .unwrap()
}

/// Runs the load to its end: the good tensors (checked against `contents`) and the error.
fn load(
    checkpoint: Checkpoint,
    threads: usize,
    contents: &Contents,
    between: impl Fn(usize),
) -> (Vec<String>, Option<Error>) {
    let mut stager = Stager::new(
        checkpoint,
        HostReader,
        HostAllocator::new(),
        policy(threads),
    )
    .unwrap();
    let mut names = Vec::new();
    let mut index = 0;
    loop {
        match stager.next() {
            Some(Ok(t)) => {
                let bytes = match t.data() {
                    TensorData::Device(d) => d.buffer().as_slice().to_vec(),
                    TensorData::Host(h) => h.to_vec(),
                    TensorData::Destination { .. } => unreachable!(),
                };
                assert!(
                    bytes == contents[t.name()],
                    "{} handed out with changed bytes",
                    t.name()
                );
                names.push(t.name().to_owned());
                between(index);
                index += 1;
            }
            Some(Err(e)) => {
                assert!(stager.next().is_none(), "a tensor after the error");
                return (names, Some(e));
            }
            None => return (names, None),
        }
    }
}

fn changed(error: Option<Error>, file: &Path, what: &str) {
    match error {
        Some(Error::FileChanged { file: f, detail }) => {
            assert_eq!(f, file);
            assert!(detail.contains(what), "{detail}");
        }
        other => panic!("expected FileChanged ({what}), got {other:?}"),
    }
}

#[rstest]
fn a_file_truncated_after_its_header_was_read(#[values(1, 3)] threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture(dir.path());
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let shard = &f.files[1];
    std::fs::OpenOptions::new()
        .write(true)
        .open(shard)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let (names, error) = load(checkpoint, threads, &f.contents, |_| {});
    assert_eq!(names, ["one.a", "one.b"], "the untouched file loads");
    changed(error, shard, "changed size");
}

#[rstest]
fn a_file_replaced_after_its_header_was_read(#[values(1, 3)] threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture(dir.path());
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    // Same size, same header, other bytes: only the identity tells them apart.
    let shard = &f.files[0];
    let mut bytes = std::fs::read(shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let replacement = dir.path().join("replacement.tmp");
    std::fs::write(&replacement, &bytes).unwrap();
    std::fs::rename(&replacement, shard).unwrap();
    let (names, error) = load(checkpoint, threads, &f.contents, |_| {});
    assert!(names.is_empty());
    changed(error, shard, "replaced");
}

#[test]
fn a_file_written_while_it_is_being_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture(dir.path());
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let shard = f.files[0].clone();
    let size = std::fs::metadata(&shard).unwrap().len();
    // After the first tensor is handed out, overwrite the second tensor's last byte in place.
    // The file system's timestamps are coarse (a few ms): wait so that mtime moves.
    let (names, error) = load(checkpoint, 1, &f.contents, |index| {
        if index == 0 {
            std::thread::sleep(std::time::Duration::from_millis(30));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&shard)
                .unwrap();
            file.write_all_at(&[0xAB], size - 1).unwrap();
        }
    });
    assert_eq!(names, ["one.a"]);
    changed(error, &shard, "was modified");
}
