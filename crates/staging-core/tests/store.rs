//! Opening a checkpoint through a `Store` other than the file system: an in-memory one whose
//! paths look like object-store URLs. The same discovery and the same checks as a local open;
//! and a reader's own `verify_unchanged` is what a load consults.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use staging_core::host::{HostAllocator, HostReader};
use staging_core::{
    Checkpoint, DeviceRegion, EntryKind, Error, FileIdentity, HostMemory, IoMode, ReadError,
    Reader, Result, Stager, StagingPolicy, Store, StoreFile,
};

/// Objects by full name; a "directory" is any prefix ending before a `/`.
#[derive(Default)]
struct Objects(BTreeMap<PathBuf, Vec<u8>>);

struct Object<'a> {
    path: &'a Path,
    bytes: &'a [u8],
}

impl StoreFile for Object<'_> {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn identity(&self) -> FileIdentity {
        FileIdentity {
            dev: 0,
            ino: 0,
            size: self.bytes.len() as u64,
            mtime: 0,
            mtime_nsec: 0,
        }
    }

    fn read_exact(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let (start, end) = (offset as usize, (offset + len) as usize);
        self.bytes
            .get(start..end)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| Error::Io {
                path: self.path.to_path_buf(),
                source: std::io::Error::other(format!(
                    "range {start}..{end} past the end of {} bytes",
                    self.bytes.len()
                )),
            })
    }
}

impl Store for Objects {
    fn kind(&self, path: &Path) -> Result<EntryKind> {
        if self.0.contains_key(path) {
            Ok(EntryKind::File)
        } else if self.0.keys().any(|k| k.starts_with(path)) {
            Ok(EntryKind::Dir)
        } else {
            Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other("no such object or prefix"),
            })
        }
    }

    fn exists(&self, path: &Path) -> bool {
        self.0.contains_key(path)
    }

    fn open(&self, path: &Path) -> Result<Box<dyn StoreFile + '_>> {
        let (path, bytes) = self.0.get_key_value(path).ok_or_else(|| Error::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other("no such object"),
        })?;
        Ok(Box::new(Object { path, bytes }))
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        Ok(self
            .0
            .keys()
            .filter(|k| k.parent() == Some(dir))
            .filter_map(|k| k.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn canonical(&self, path: &Path) -> Result<Option<PathBuf>> {
        Ok(self.0.contains_key(path).then(|| path.to_path_buf()))
    }
}

/// A safetensors file of F32 tensors `(name, elements)`, values 0, 1, 2, ...
fn file(tensors: &[(&str, usize)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut offset = 0;
    for (i, (name, n)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""{name}":{{"dtype":"F32","shape":[{n}],"data_offsets":[{offset},{}]}}"#,
            offset + n * 4
        ));
        offset += n * 4;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for (_, n) in tensors {
        for v in 0..*n {
            out.extend_from_slice(&(v as f32).to_le_bytes());
        }
    }
    out
}

fn sharded() -> Objects {
    let mut objects = Objects::default();
    let root = Path::new("s3://bucket/model");
    objects.0.insert(
        root.join("model-00001-of-00002.safetensors"),
        file(&[("a", 10), ("b", 3)]),
    );
    objects.0.insert(
        root.join("model-00002-of-00002.safetensors"),
        file(&[("c", 7)]),
    );
    objects.0.insert(
        root.join("model.safetensors.index.json"),
        br#"{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#.to_vec(),
    );
    objects
}

fn summary(checkpoint: &Checkpoint) -> Vec<(String, u64, usize, String)> {
    checkpoint
        .tensors()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.offset,
                t.len,
                t.file.display().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_prefix_opens_by_its_index_like_a_directory() {
    let objects = sharded();
    let checkpoint = Checkpoint::open_in(&objects, Path::new("s3://bucket/model")).unwrap();
    let first = "s3://bucket/model/model-00001-of-00002.safetensors".to_owned();
    let second = "s3://bucket/model/model-00002-of-00002.safetensors".to_owned();
    let data_start =
        |f: &str| 8 + u64::from_le_bytes(objects.0[Path::new(f)][..8].try_into().unwrap());
    assert_eq!(
        summary(&checkpoint),
        vec![
            ("a".into(), data_start(&first), 40, first.clone()),
            ("b".into(), data_start(&first) + 40, 12, first.clone()),
            ("c".into(), data_start(&second), 28, second.clone()),
        ]
    );
    // The same files on disk open to the same tensors.
    let dir = tempfile::tempdir().unwrap();
    for (path, bytes) in &objects.0 {
        std::fs::write(dir.path().join(path.file_name().unwrap()), bytes).unwrap();
    }
    let local = Checkpoint::open(dir.path()).unwrap();
    let names = |c: &Checkpoint| -> Vec<(String, u64, usize)> {
        c.tensors()
            .iter()
            .map(|t| (t.name.clone(), t.offset, t.len))
            .collect()
    };
    assert_eq!(names(&local), names(&checkpoint));
}

#[test]
fn without_an_index_the_objects_load_in_natural_order_and_one_object_alone() {
    let mut objects = sharded();
    objects
        .0
        .remove(Path::new("s3://bucket/model/model.safetensors.index.json"));
    let checkpoint = Checkpoint::open_in(&objects, Path::new("s3://bucket/model")).unwrap();
    assert_eq!(
        checkpoint
            .tensors()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    let one = Path::new("s3://bucket/model/model-00002-of-00002.safetensors");
    let single = Checkpoint::open_in(&objects, one).unwrap();
    assert_eq!(single.tensors().len(), 1);
}

#[test]
fn every_check_of_a_local_open_applies() {
    let root = Path::new("s3://bucket/model");
    // An object cut short: its header says more data than it has.
    let mut cut = sharded();
    let shard = root.join("model-00002-of-00002.safetensors");
    cut.0.get_mut(&shard).unwrap().truncate(30);
    match Checkpoint::open_in(&cut, root) {
        Err(Error::Header { path, reason }) => {
            assert_eq!(path, shard);
            assert!(
                reason.contains("truncated") || reason.contains("runs past"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // An index naming a shard outside its prefix, or one that is not there.
    for (name, why) in [
        ("../other/x.safetensors", "contains '..'"),
        ("gone.safetensors", "does not exist"),
    ] {
        let mut bad = sharded();
        bad.0.insert(
            root.join("model.safetensors.index.json"),
            format!(r#"{{"weight_map":{{"a":"{name}"}}}}"#).into_bytes(),
        );
        match Checkpoint::open_in(&bad, root) {
            Err(Error::Index { reason, .. }) => assert!(reason.contains(why), "{reason}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    // Nothing there.
    assert!(matches!(
        Checkpoint::open_in(&sharded(), Path::new("s3://bucket/none")),
        Err(Error::Io { .. })
    ));
}

/// The host reader, except that every file looks changed (an object whose version tag moved).
struct Moved(HostReader);

impl Reader for Moved {
    type Space = HostMemory;
    type File = <HostReader as Reader>::File;

    fn name(&self) -> &str {
        "moved"
    }

    fn mode(&self) -> IoMode {
        self.0.mode()
    }

    fn open(&self, path: &Path) -> std::result::Result<Self::File, ReadError> {
        self.0.open(path)
    }

    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        dst: DeviceRegion<'_, HostMemory>,
    ) -> std::result::Result<usize, ReadError> {
        self.0.read_at(file, offset, dst)
    }

    fn verify_unchanged(&self, _: &Path, _: &FileIdentity) -> std::result::Result<(), String> {
        Err("its version tag is no longer the one whose header was read".into())
    }
}

#[test]
fn a_load_asks_the_reader_whether_a_file_changed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, file(&[("w", 16)])).unwrap();
    let checkpoint = Checkpoint::open(&path).unwrap();
    let mut stager = Stager::new(
        checkpoint,
        Moved(HostReader),
        HostAllocator::new(),
        StagingPolicy::default(),
    )
    .unwrap();
    match stager.next() {
        Some(Err(Error::FileChanged { file, detail })) => {
            assert_eq!(file, path);
            assert!(detail.contains("version tag"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert!(stager.next().is_none(), "nothing after the error");
}
