//! Descriptors a load or a reader holds, whatever the number of files: a few, not one a shard
//! (a checkpoint of more shards than the descriptor limit loads); and a reader bound to the
//! files as their headers were read (a file renamed over one is not read, one changed in place
//! is refused), mapped or not.
//!
//! Descriptors are counted in `/proc/self/fd` by where they point: only this test's files, so
//! the tests running beside it on other threads do not move the count.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::os::unix::fs::FileExt;
use std::path::Path;

use backend_mock::fixtures::{ShardedFixture, TensorSpec, write_sharded};
use safetensors_staging::{
    Backend, Device, Error, HostOptions, Loader, MapFiles, Prepared, StagingPath,
};
use staging_core::{Checkpoint, Dtype, OpenFiles, StagingPolicy};

/// `shards` shards of two small tensors each.
fn many(dir: &Path, shards: usize) -> ShardedFixture {
    let specs: Vec<Vec<TensorSpec>> = (0..shards)
        .map(|s| {
            vec![
                TensorSpec::new(format!("s{s}.a"), Dtype::F32, &[3]),
                TensorSpec::bytes(format!("s{s}.b"), 100 + s),
            ]
        })
        .collect();
    write_sharded(dir, &specs, 5).unwrap()
}

/// Descriptors this process holds on files under `dir`.
fn descriptors_in(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

fn loader(map: MapFiles, threads: usize) -> Loader<'static> {
    Loader::new()
        .device(Device::Cpu)
        .policy(
            StagingPolicy::builder()
                .io_threads(threads)
                .build()
                .unwrap(),
        )
        .backend(Backend::Host(HostOptions::default().map(map)))
}

#[test]
fn a_load_of_300_shards_holds_a_few_descriptors_at_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = many(dir.path(), 300);
    for (map, threads, path) in [
        (MapFiles::Auto, 1, StagingPath::Mapped),
        (MapFiles::Never, 1, StagingPath::Device),
        (MapFiles::Never, 4, StagingPath::Device),
    ] {
        let mut load = loader(map, threads).open(dir.path()).unwrap();
        let mut most = 0;
        let mut kept = Vec::new();
        for tensor in load.by_ref() {
            let tensor = tensor.unwrap();
            assert_eq!(tensor.path(), path);
            assert_eq!(
                tensor.to_vec().unwrap(),
                fixture.contents[tensor.name()],
                "{}",
                tensor.name()
            );
            most = most.max(descriptors_in(dir.path()));
            kept.push(tensor);
        }
        assert_eq!(kept.len(), 600);
        assert!(
            most <= 3,
            "{map:?}, {threads} threads: {most} descriptors at once"
        );
        drop(load);
        // The tensors live on (mapped: each holds its mapping, not a descriptor).
        assert_eq!(descriptors_in(dir.path()), 0, "{map:?}");
        assert!(
            kept.iter()
                .all(|t| t.to_vec().unwrap() == fixture.contents[t.name()])
        );
    }
}

/// A reader's handle: the headers read, then bound to the files as they are.
fn reader(dir: &Path, map: MapFiles) -> (Prepared<'static>, Checkpoint) {
    let mut prepared = loader(map, 1).prepare().unwrap();
    let checkpoint = prepared.read_headers(&[dir]).unwrap();
    prepared.keep_files_open_for(&checkpoint).unwrap();
    (prepared, checkpoint)
}

fn read(prepared: &mut Prepared<'static>, checkpoint: &Checkpoint, name: &str) -> Vec<u8> {
    let mut load = prepared
        .open_checkpoint(checkpoint.only(name, None).unwrap())
        .unwrap();
    load.next().unwrap().unwrap().to_vec().unwrap()
}

/// The tensor `name` read by one load of the reader, or why not (a mapped load maps its file
/// when it opens, a load that reads opens it at the tensor).
fn first(
    prepared: &mut Prepared<'static>,
    checkpoint: &Checkpoint,
    name: &str,
) -> Result<safetensors_staging::Tensor, Error> {
    prepared
        .open_checkpoint(checkpoint.only(name, None).unwrap())?
        .next()
        .unwrap()
}

#[test]
fn a_reader_of_300_shards_holds_a_few_descriptors_whatever_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = many(dir.path(), 300);
    for map in [MapFiles::Auto, MapFiles::Never] {
        let (mut prepared, checkpoint) = reader(dir.path(), map);
        let bound = descriptors_in(dir.path());
        assert!(bound <= OpenFiles::KEPT, "{map:?}: {bound} at open");
        assert_eq!(prepared.descriptors_open(), bound, "{map:?}");
        let mut most = 0;
        // Every tensor, and again in another order: files closed are opened again.
        for round in 0..2 {
            for s in 0..300 {
                let s = if round == 0 { s } else { (s * 7) % 300 };
                let name = format!("s{s}.b");
                assert_eq!(
                    read(&mut prepared, &checkpoint, &name),
                    fixture.contents[&name]
                );
                most = most.max(descriptors_in(dir.path()));
            }
        }
        assert!(
            most <= OpenFiles::KEPT,
            "{map:?}: {most} descriptors at once"
        );
        prepared.close_files();
        assert_eq!(descriptors_in(dir.path()), 0, "{map:?}");
    }
}

#[test]
fn a_reader_serves_the_files_it_opened_and_refuses_a_file_changed_in_place() {
    for map in [MapFiles::Auto, MapFiles::Never] {
        let dir = tempfile::tempdir().unwrap();
        let fixture = many(dir.path(), 2);
        let (mut prepared, checkpoint) = reader(dir.path(), map);
        // A new file renamed over the first shard before anything was read from it: the
        // handle reads the file it opened (as `safetensors` reads the file it mapped).
        let replacement = dir.path().join("new");
        std::fs::write(&replacement, vec![0u8; 4096]).unwrap();
        std::fs::rename(&replacement, &fixture.files[0]).unwrap();
        for name in ["s0.a", "s0.b", "s1.b"] {
            assert_eq!(
                read(&mut prepared, &checkpoint, name),
                fixture.contents[name],
                "{map:?} {name}"
            );
        }
        // The second shard written in place (its size kept): refused, naming it.
        std::thread::sleep(std::time::Duration::from_millis(20)); // mtime moves
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&fixture.files[1])
            .unwrap();
        file.write_all_at(b"changed", 8).unwrap();
        drop(file);
        let refused = first(&mut prepared, &checkpoint, "s1.a");
        assert!(
            matches!(
                &refused,
                Err(Error::Load(staging_core::Error::FileChanged { file, .. }))
                    if *file == fixture.files[1]
            ),
            "{map:?}: {refused:?}"
        );
        // Closed, then asked again: the path names another file, refused, never read.
        prepared.close_files();
        let refused = first(&mut prepared, &checkpoint, "s0.a");
        assert!(
            matches!(
                &refused,
                Err(Error::Load(staging_core::Error::FileChanged { .. }))
            ),
            "{map:?}: {refused:?}"
        );
    }
}

/// The headers of `dir` read again by `prepared` (a file renamed over one since is read under
/// its own header).
fn reread(prepared: &mut Prepared<'static>, dir: &Path) -> Checkpoint {
    prepared.read_headers(&[dir]).unwrap()
}

#[test]
fn a_file_kept_under_an_older_header_is_never_read_under_a_newer_one() {
    // One shard, and 20 (past the descriptors kept): the shard renamed over after a read, its
    // headers read again by the same reader. A load of the new header reads the new file, never
    // the kept mapping or descriptor of the old one; a load of the old header reads the old file
    // while it is kept, or is refused.
    for (shards, map) in [
        (1, MapFiles::Auto),
        (1, MapFiles::Never),
        (20, MapFiles::Auto),
        (20, MapFiles::Never),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let fixture = many(dir.path(), shards);
        let (mut prepared, old) = reader(dir.path(), map);
        for s in 0..shards {
            let name = format!("s{s}.b");
            assert_eq!(read(&mut prepared, &old, &name), fixture.contents[&name]);
        }
        // The first shard written again with other bytes (same names, shapes and size), and
        // renamed over the old.
        let replacement = dir.path().join("replacement");
        let specs = vec![
            TensorSpec::new("s0.a", Dtype::F32, &[3]),
            TensorSpec::bytes("s0.b", 100),
        ];
        let new_contents = backend_mock::fixtures::write_file(&replacement, &specs, 999).unwrap();
        assert_ne!(new_contents["s0.b"], fixture.contents["s0.b"]);
        std::fs::rename(&replacement, &fixture.files[0]).unwrap();
        let new = reread(&mut prepared, dir.path());
        for name in ["s0.a", "s0.b"] {
            let got = first(&mut prepared, &new, name).unwrap().to_vec().unwrap();
            assert_eq!(got, new_contents[name], "{shards} shards, {map:?}: {name}");
        }
        match first(&mut prepared, &old, "s0.b") {
            Ok(tensor) => assert_eq!(
                tensor.to_vec().unwrap(),
                fixture.contents["s0.b"],
                "{shards} shards, {map:?}: the old header's bytes or nothing"
            ),
            Err(Error::Load(staging_core::Error::FileChanged { .. })) => {}
            Err(other) => panic!("{shards} shards, {map:?}: {other}"),
        }
    }
}

#[test]
fn a_handle_of_more_files_than_it_keeps_refuses_one_closed_and_renamed_over() {
    // Past the files a handle keeps, the least recently read are closed; one of them renamed
    // over since is refused when asked for again (never read under the old header).
    let dir = tempfile::tempdir().unwrap();
    let shards = OpenFiles::KEPT + 4;
    let fixture = many(dir.path(), shards);
    let (mut prepared, checkpoint) = reader(dir.path(), MapFiles::Never);
    for s in 0..shards {
        read(&mut prepared, &checkpoint, &format!("s{s}.b"));
    }
    let replacement = dir.path().join("replacement");
    std::fs::copy(&fixture.files[0], &replacement).unwrap();
    std::fs::rename(&replacement, &fixture.files[0]).unwrap();
    let refused = first(&mut prepared, &checkpoint, "s0.b");
    assert!(
        matches!(
            &refused,
            Err(Error::Load(staging_core::Error::FileChanged { .. }))
        ),
        "{refused:?}"
    );
    // The last files read are still kept: served, whatever their paths name now.
    let last = format!("s{}.b", shards - 1);
    let replacement = dir.path().join("replacement");
    std::fs::write(&replacement, b"another file").unwrap();
    std::fs::rename(&replacement, &fixture.files[shards - 1]).unwrap();
    assert_eq!(
        read(&mut prepared, &checkpoint, &last),
        fixture.contents[&last]
    );
}
