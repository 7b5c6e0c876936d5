//! Opening a checkpoint: finding its files, reading and validating each header, and listing its
//! tensors in file-offset order.
//!
//! Each header is read alone (8 + n bytes, never the whole file) and validated by the
//! `safetensors` crate's [`Metadata`], then against the file's real size. This module never
//! allocates from an untrusted length before checking it against the file, never follows an
//! index entry outside the checkpoint directory, and never opens anything but a regular file
//! (a fifo would block).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

pub use safetensors::Dtype;

use safetensors::tensor::Metadata;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The index file name Hugging Face uses for sharded checkpoints.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
/// The single-file checkpoint name.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";
/// The largest header the `safetensors` format allows, in bytes.
pub const MAX_HEADER_SIZE: u64 = 100_000_000;
/// The largest index file this library reads, in bytes (a million entries fit well inside).
pub const MAX_INDEX_SIZE: u64 = 256 * 1024 * 1024;

/// One tensor of a checkpoint: where its bytes are and what they mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// The file that holds it.
    pub file: Arc<Path>,
    /// The file's position in [`Checkpoint::files`].
    pub file_index: usize,
    /// Absolute byte offset of its first byte in the file.
    pub offset: u64,
    /// Its length in bytes.
    pub len: usize,
}

impl TensorMeta {
    /// The dtype's name as the safetensors format writes it ("BF16").
    pub fn dtype_name(&self) -> String {
        format!("{:?}", self.dtype)
    }
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFile {
    /// The file's path.
    pub path: Arc<Path>,
    /// Its size in bytes when the header was checked.
    pub size: u64,
    /// Offset of the first data byte (8 + header length).
    pub data_start: u64,
    /// How many tensors it holds.
    pub tensors: usize,
    /// What the file was when its header was read; a load checks it is still that file.
    pub identity: FileIdentity,
}

/// A file's identity and version: device, inode, size and modification time. A file replaced
/// (another inode), truncated or extended (another size) or written (another mtime) since its
/// header was read no longer matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds.
    pub mtime: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: i64,
}

impl FileIdentity {
    /// The identity in `metadata`.
    pub fn of(metadata: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: metadata.mtime(),
            mtime_nsec: metadata.mtime_nsec(),
        }
    }

    /// Checks that `path` is still this file, unchanged; says what changed otherwise.
    pub fn check(&self, path: &Path) -> std::result::Result<(), String> {
        let now = std::fs::metadata(path)
            .map(|m| Self::of(&m))
            .map_err(|e| format!("cannot be inspected any more: {e}"))?;
        if (now.dev, now.ino) != (self.dev, self.ino) {
            Err("was replaced by another file".into())
        } else if now.size != self.size {
            Err(format!(
                "changed size from {} to {} bytes",
                self.size, now.size
            ))
        } else if (now.mtime, now.mtime_nsec) != (self.mtime, self.mtime_nsec) {
            Err("was modified".into())
        } else {
            Ok(())
        }
    }
}

/// The validated table of contents of a checkpoint: its files and tensors, in load order (file
/// order, then offset within each file).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    files: Vec<ShardFile>,
    tensors: Vec<TensorMeta>,
}

#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Opens a checkpoint from a directory (its index, else its `model.safetensors`, else its
    /// `*.safetensors` files in natural order), an index file (`*.json`), or one safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            return Self::open_dir(path);
        }
        if !meta.is_file() {
            return Err(Error::NotAFile { path: path.into() });
        }
        if path.extension().is_some_and(|ext| ext == "json") {
            Self::from_index(path)
        } else {
            Self::from_files([path])
        }
    }

    /// Opens the listed safetensors files as one checkpoint, in the order given.
    pub fn from_files<I, P>(paths: I) -> Result<Self>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let mut seen = HashSet::new();
        let mut parsed = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let canonical = path.canonicalize().map_err(|e| Error::io(path, e))?;
            if !seen.insert(canonical) {
                return Err(Error::DuplicateFile { path: path.into() });
            }
            parsed.push(read_header(path)?);
        }
        Self::assemble(parsed)
    }

    /// Opens a sharded checkpoint from its index file. Every shard path must be relative, stay
    /// inside the index's directory (after resolving symlinks), and name a regular file; the index
    /// and the shards' headers must agree tensor for tensor.
    pub fn from_index(index_path: impl AsRef<Path>) -> Result<Self> {
        let index_path = index_path.as_ref();
        let root = match index_path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let canonical_root = root.canonicalize().map_err(|e| Error::io(&root, e))?;
        let file = open_regular(index_path)?;
        let size = file.metadata().map_err(|e| Error::io(index_path, e))?.len();
        if size > MAX_INDEX_SIZE {
            return Err(Error::index(
                index_path,
                format!("{size} bytes is over the {MAX_INDEX_SIZE}-byte limit"),
            ));
        }
        let text = read_exact_vec(&file, 0, size, index_path)?;
        let index: IndexFile =
            serde_json::from_slice(&text).map_err(|e| Error::index(index_path, e.to_string()))?;

        // Shards in natural order of their names; names resolving to one file are one shard.
        let mut names: Vec<&str> = index.weight_map.values().map(String::as_str).collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        names.dedup();
        let mut shard_of_name: HashMap<&str, usize> = HashMap::new();
        let mut shard_paths: Vec<PathBuf> = Vec::new();
        let mut canonical_seen: HashMap<PathBuf, usize> = HashMap::new();
        for name in names {
            let relative = checked_relative(name)
                .map_err(|why| Error::index(index_path, format!("shard path {name:?} {why}")))?;
            let joined = root.join(&relative);
            let canonical = match joined.canonicalize() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::index(
                        index_path,
                        format!("shard {name:?} does not exist"),
                    ));
                }
                Err(e) => return Err(Error::io(joined, e)),
            };
            if !canonical.starts_with(&canonical_root) {
                return Err(Error::index(
                    index_path,
                    format!(
                        "shard {name:?} resolves to {} outside the checkpoint directory {}",
                        canonical.display(),
                        canonical_root.display()
                    ),
                ));
            }
            let slot = *canonical_seen.entry(canonical).or_insert_with(|| {
                shard_paths.push(joined);
                shard_paths.len() - 1
            });
            shard_of_name.insert(name, slot);
        }

        let mut parsed = Vec::with_capacity(shard_paths.len());
        for path in &shard_paths {
            parsed.push(read_header(path)?);
        }
        // The index and the headers must agree both ways.
        for (tensor, shard_name) in &index.weight_map {
            let slot = shard_of_name.get(shard_name.as_str()).copied();
            let found = slot
                .and_then(|s| parsed.get(s))
                .is_some_and(|p| p.tensors.iter().any(|t| &t.name == tensor));
            if !found {
                return Err(Error::index(
                    index_path,
                    format!(
                        "tensor {tensor:?} is listed in shard {shard_name:?}, which does not hold it"
                    ),
                ));
            }
        }
        for shard in &parsed {
            if let Some(extra) = shard
                .tensors
                .iter()
                .find(|t| !index.weight_map.contains_key(&t.name))
            {
                // A tensor the index lists under another shard is not "extra": when that shard
                // holds it too, `assemble` reports the duplicate.
                return Err(Error::index(
                    index_path,
                    format!(
                        "shard {} holds tensor {:?}, which the index does not list",
                        shard.file.path.display(),
                        extra.name
                    ),
                ));
            }
        }
        Self::assemble(parsed)
    }

    fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join(INDEX_FILE_NAME);
        if index.symlink_metadata().is_ok() {
            return Self::from_index(index);
        }
        let single = dir.join(SINGLE_FILE_NAME);
        if single.symlink_metadata().is_ok() {
            return Self::from_files([single]);
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".safetensors") && !name.starts_with('.') {
                found.push(name.to_owned());
            }
        }
        if found.is_empty() {
            return Err(Error::NoCheckpoint { path: dir.into() });
        }
        found.sort_by(|a, b| natural_cmp(a, b));
        Self::from_files(found.iter().map(|name| dir.join(name)))
    }

    fn assemble(parsed: Vec<ParsedFile>) -> Result<Self> {
        let mut owner: HashMap<String, Arc<Path>> = HashMap::new();
        let mut files = Vec::with_capacity(parsed.len());
        let mut tensors = Vec::new();
        for (file_index, mut p) in parsed.into_iter().enumerate() {
            for mut t in p.tensors.drain(..) {
                if let Some(first) = owner.get(&t.name) {
                    return Err(Error::DuplicateTensor {
                        name: t.name,
                        first: first.to_path_buf(),
                        second: p.file.path.to_path_buf(),
                    });
                }
                owner.insert(t.name.clone(), Arc::clone(&p.file.path));
                t.file_index = file_index;
                tensors.push(t);
            }
            files.push(p.file);
        }
        Ok(Self { files, tensors })
    }

    /// The files, in load order.
    pub fn files(&self) -> &[ShardFile] {
        &self.files
    }

    /// The tensors, in load order: file order, then offset.
    pub fn tensors(&self) -> &[TensorMeta] {
        &self.tensors
    }

    /// The tensor called `name`, if the checkpoint has one (a linear search).
    pub fn tensor(&self, name: &str) -> Option<&TensorMeta> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len as u64).sum()
    }
}

struct ParsedFile {
    file: ShardFile,
    tensors: Vec<TensorMeta>,
}

/// Opens `path` for reading only if it is a regular file, without blocking on a fifo.
pub(crate) fn open_regular(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile { path: path.into() });
    }
    Ok(file)
}

fn read_exact_vec(file: &File, offset: u64, len: u64, path: &Path) -> Result<Vec<u8>> {
    let len = usize::try_from(len)
        .map_err(|_| Error::header(path, format!("{len} bytes do not fit in memory")))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::header(path, "file shrank while its header was read")
        } else {
            Error::io(path, e)
        }
    })?;
    Ok(buf)
}

fn read_header(path: &Path) -> Result<ParsedFile> {
    let file = open_regular(path)?;
    let metadata = file.metadata().map_err(|e| Error::io(path, e))?;
    let identity = FileIdentity::of(&metadata);
    let size = metadata.len();
    if size < 8 {
        return Err(Error::header(
            path,
            format!("file is {size} bytes, too short for the 8-byte header length"),
        ));
    }
    let len_bytes = read_exact_vec(&file, 0, 8, path)?;
    let mut n_le = [0u8; 8];
    n_le.copy_from_slice(&len_bytes);
    let n = u64::from_le_bytes(n_le);
    if n > MAX_HEADER_SIZE {
        return Err(Error::header(
            path,
            format!("header length {n} is over the format's limit of {MAX_HEADER_SIZE} bytes"),
        ));
    }
    if n > size - 8 {
        return Err(Error::header(
            path,
            format!("header length {n} runs past the end of the {size}-byte file"),
        ));
    }
    let header = read_exact_vec(&file, 8, n, path)?;
    let metadata: Metadata =
        serde_json::from_slice(&header).map_err(|e| Error::header(path, e.to_string()))?;
    let data_start = 8 + n;
    let data_len = metadata.data_len() as u64;
    let data_end = data_start
        .checked_add(data_len)
        .ok_or_else(|| Error::header(path, format!("tensor data length {data_len} overflows")))?;
    match data_end.cmp(&size) {
        Ordering::Greater => {
            return Err(Error::header(
                path,
                format!(
                    "tensor data ends at byte {data_end} but the file has {size} bytes (truncated?)"
                ),
            ));
        }
        Ordering::Less => {
            return Err(Error::header(
                path,
                format!(
                    "tensor data ends at byte {data_end} but the file has {size} bytes (trailing bytes)"
                ),
            ));
        }
        Ordering::Equal => {}
    }
    let shared: Arc<Path> = Arc::from(path);
    let mut tensors = Vec::new();
    for name in metadata.offset_keys() {
        let Some(info) = metadata.info(&name) else {
            continue;
        };
        let (start, end) = info.data_offsets;
        tensors.push(TensorMeta {
            offset: data_start + start as u64,
            len: end - start,
            dtype: info.dtype,
            shape: info.shape.clone(),
            file: Arc::clone(&shared),
            file_index: 0,
            name,
        });
    }
    Ok(ParsedFile {
        file: ShardFile {
            path: shared,
            size,
            data_start,
            tensors: tensors.len(),
            identity,
        },
        tensors,
    })
}

/// Checks that an index's shard path is a plain relative path: no root, no `..`, not empty.
fn checked_relative(name: &str) -> std::result::Result<PathBuf, &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    let mut out = PathBuf::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("contains '..'"),
            Component::RootDir | Component::Prefix(_) => return Err("is absolute"),
        }
    }
    if out.as_os_str().is_empty() {
        return Err("names no file");
    }
    Ok(out)
}

/// Compares names the way people count: "shard-2" before "shard-10".
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let dx = x.iter().take_while(|c| c.is_ascii_digit()).count();
                let dy = y.iter().take_while(|c| c.is_ascii_digit()).count();
                let (nx, ny) = (&x[..dx], &y[..dy]);
                let trim = |s: &'_ [u8]| -> usize { s.iter().take_while(|&&c| c == b'0').count() };
                let (tx, ty) = (&nx[trim(nx)..], &ny[trim(ny)..]);
                let ord = tx.len().cmp(&ty.len()).then_with(|| tx.cmp(ty));
                if ord != Ordering::Equal {
                    return ord;
                }
                x = &x[dx..];
                y = &y[dy..];
            }
            (Some(c), Some(d)) => {
                if c != d {
                    return c.cmp(d);
                }
                x = &x[1..];
                y = &y[1..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("a-2", "a-10", Ordering::Less)]
    #[case("model-00002-of-00003", "model-00010-of-00003", Ordering::Less)]
    #[case("x10", "x9", Ordering::Greater)]
    #[case("x010", "x10", Ordering::Less)]
    #[case("abc", "abd", Ordering::Less)]
    #[case("ab", "ab1", Ordering::Less)]
    fn natural_order(#[case] a: &str, #[case] b: &str, #[case] expected: Ordering) {
        assert_eq!(natural_cmp(a, b), expected);
        assert_eq!(natural_cmp(b, a), expected.reverse());
    }

    #[rstest]
    #[case("", Err("is empty"))]
    #[case("../x.safetensors", Err("contains '..'"))]
    #[case("a/../../x", Err("contains '..'"))]
    #[case("/etc/passwd", Err("is absolute"))]
    #[case(".", Err("names no file"))]
    #[case("./a.safetensors", Ok(PathBuf::from("a.safetensors")))]
    #[case("sub/a.safetensors", Ok(PathBuf::from("sub/a.safetensors")))]
    fn shard_paths(#[case] name: &str, #[case] expected: std::result::Result<PathBuf, &str>) {
        assert_eq!(checked_relative(name), expected);
    }
}
