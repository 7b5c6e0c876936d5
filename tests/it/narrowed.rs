//! A selection on a checkpoint with an index reads only the headers of the shards holding a
//! selected tensor (issue 50): the shards not read may be anything, even unreadable, and the
//! report's `headers_read` counts the headers read. The index is still checked against what is
//! read, and names no missing shard.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::collections::BTreeMap;
use std::path::Path;

use backend_mock::fixtures::{Contents, TensorSpec, write_file, write_index};
use safetensors_staging::{Backend, Error, HostOptions, Loader, Selection};

/// Five shards of three tensors each (`s{i}.t{j}`), with an index; the bytes by name.
fn five_shards(dir: &Path) -> Contents {
    let mut map = BTreeMap::new();
    let mut contents = Contents::new();
    for i in 0..5 {
        let file = format!("model-{:05}-of-00005.safetensors", i + 1);
        let specs: Vec<TensorSpec> = (0..3)
            .map(|j| TensorSpec::bytes(format!("s{i}.t{j}"), 64 + j))
            .collect();
        contents.extend(write_file(&dir.join(&file), &specs, i as u64).unwrap());
        for spec in &specs {
            map.insert(spec.name.clone(), file.clone());
        }
    }
    write_index(&dir.join("model.safetensors.index.json"), &map, 0).unwrap();
    contents
}

/// Every shard but the second made unreadable as safetensors (its header length huge).
fn break_all_but_the_second(dir: &Path) {
    for i in [1, 3, 4, 5] {
        let path = dir.join(format!("model-{i:05}-of-00005.safetensors"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
    }
}

fn load(
    dir: &Path,
    selection: Selection,
) -> Result<(Contents, safetensors_staging::LoadReport), Error> {
    let mut load = Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .select(selection)
        .open(dir)?;
    let mut out = Contents::new();
    for tensor in load.by_ref() {
        let tensor = tensor?;
        out.insert(tensor.name().to_owned(), tensor.to_vec().unwrap());
    }
    Ok((out, load.report()))
}

#[test]
fn a_selection_reads_only_the_headers_of_the_shards_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let contents = five_shards(dir.path());
    break_all_but_the_second(dir.path());
    // A whole load reads every header, and fails on the first broken one.
    let whole = load(dir.path(), Selection::all()).unwrap_err();
    assert!(
        whole.to_string().contains("model-00001-of-00005"),
        "{whole}"
    );

    for selection in [
        Selection::names(["s1.t2"]),
        Selection::matching(|name| name.starts_with("s1.")),
        Selection::names(["s1.t0"]).requiring(["s1.t1"]),
    ] {
        let (loaded, report) = load(dir.path(), selection).unwrap();
        assert!(!loaded.is_empty());
        for (name, bytes) in &loaded {
            assert!(name.starts_with("s1."), "{name}");
            assert_eq!(bytes, &contents[name], "{name}");
        }
        assert_eq!((report.headers_read, report.files), (1, 1));
        assert_eq!(
            report.bytes_read,
            loaded.values().map(|b| b.len() as u64).sum::<u64>()
        );
    }
}

#[test]
fn a_selection_over_two_shards_reads_two_headers_and_the_rest_still_fails_whole() {
    let dir = tempfile::tempdir().unwrap();
    let contents = five_shards(dir.path());
    let (loaded, report) = load(
        dir.path(),
        Selection::matching(|name| name.ends_with(".t1") && (name < "s3")),
    )
    .unwrap();
    assert_eq!(
        loaded.keys().collect::<Vec<_>>(),
        ["s0.t1", "s1.t1", "s2.t1"]
    );
    assert!(loaded.iter().all(|(n, b)| b == &contents[n]));
    assert_eq!((report.headers_read, report.files), (3, 3));
    let (_, whole) = load(dir.path(), Selection::all()).unwrap();
    assert_eq!((whole.headers_read, whole.files, whole.tensors), (5, 5, 15));
}

#[test]
fn the_index_is_still_checked_against_the_headers_read_and_names_no_missing_shard() {
    // A shard the index lists a tensor under that does not hold it: refused when read.
    let dir = tempfile::tempdir().unwrap();
    five_shards(dir.path());
    let index = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let lying = text.replace(
        "\"s3.t0\": \"model-00004-of-00005.safetensors\"",
        "\"s3.t0\": \"model-00002-of-00005.safetensors\"",
    );
    assert_ne!(lying, text);
    std::fs::write(&index, lying).unwrap();
    let error = load(dir.path(), Selection::names(["s1.t0"])).unwrap_err();
    assert!(error.to_string().contains("\"s3.t0\""), "{error}");
    // Not read, the fourth shard's own listing is not checked: the selection there is fine.
    let (loaded, _) = load(dir.path(), Selection::names(["s4.t0"])).unwrap();
    assert_eq!(loaded.len(), 1);

    // A shard named by the index that is missing: an error, whether read or not.
    let dir = tempfile::tempdir().unwrap();
    five_shards(dir.path());
    std::fs::remove_file(dir.path().join("model-00005-of-00005.safetensors")).unwrap();
    let error = load(dir.path(), Selection::names(["s1.t0"])).unwrap_err();
    assert!(error.to_string().contains("does not exist"), "{error}");

    // A name the index does not list: unknown, as before.
    let dir = tempfile::tempdir().unwrap();
    five_shards(dir.path());
    let error = load(dir.path(), Selection::names(["s1.t9"])).unwrap_err();
    assert!(
        matches!(&error, Error::Load(staging_core::Error::UnknownTensor { name }) if name == "s1.t9"),
        "{error}"
    );
}

/// A selection of names and globs that keeps no tensor is refused by the library, whichever door
/// spelled it (issue 58: only `stage` refused it, Python and C loaded nothing): the error is a
/// selection error naming the patterns, and no tensor is handed out. A selection a program
/// builds may keep nothing, and a typed one narrowed to nothing (`within`) is not refused.
#[test]
fn a_typed_selection_that_keeps_nothing_is_refused_in_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let contents = five_shards(dir.path());

    let mut options = safetensors_staging::LoadOptions::new();
    options.set("select", "gamma*").unwrap();
    options.set("select", "s9.*").unwrap();
    options.set("backend", "host").unwrap();
    let err = match options.loader().unwrap().open(dir.path()) {
        Ok(mut opened) => panic!(
            "loaded {:?}",
            opened.next().map(|t| t.map(|t| t.name().to_owned()))
        ),
        Err(e) => e,
    };
    assert_eq!(
        err.kind(),
        safetensors_staging::ErrorKind::Selection,
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "the selection gamma*, s9.* matches no tensor of the checkpoint"
    );

    // One pattern that matches is enough: the load is what it keeps.
    options.set("select", "s3.*").unwrap();
    let mut names = Vec::new();
    for tensor in options.loader().unwrap().open(dir.path()).unwrap() {
        let tensor = tensor.unwrap();
        assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
        names.push(tensor.name().to_owned());
    }
    assert_eq!(names, ["s3.t0", "s3.t1", "s3.t2"]);

    // Built by a program: a predicate keeping nothing loads nothing.
    let (loaded, _) = load(dir.path(), Selection::matching(|_| false)).unwrap();
    assert!(loaded.is_empty());
    // A typed selection narrowed to nothing once the headers are read (as `load_into` narrows
    // to its targets) is not refused: its patterns matched.
    let typed = Selection::matching(|name| name.starts_with("s3.")).refusing_nothing("s3.*");
    let headers = Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .select(typed.clone())
        .read_headers(&[dir.path()])
        .unwrap();
    let kept = headers.select(&typed.within(Vec::<String>::new())).unwrap();
    assert!(kept.tensors().is_empty());
}
