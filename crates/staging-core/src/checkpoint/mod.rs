//! Opening a checkpoint: finding its files, reading and validating each header, and listing its
//! tensors in file-offset order.
//!
//! Each header is read alone (8 + n bytes, never the whole file) and validated by the
//! `safetensors` crate's `Metadata`, then against the file's real size ([`header`]). An index
//! names its shards by plain relative paths ([`index`]). Nothing here allocates from an
//! untrusted length before checking it against the file, or opens anything but a regular file
//! (a fifo would block).

mod header;
mod index;
mod layout;
mod partition;
mod select;
mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

pub use safetensors::Dtype;

pub use header::FileIdentity;
pub use layout::{
    INDEX_FILE_NAME, Layout, SINGLE_FILE_NAME, checkpoint_files, checkpoint_files_with,
    index_shard_names, natural_cmp,
};
pub use partition::{Piece, Plan};
pub use select::{RowRange, Selection};
pub use store::{EntryKind, LocalFiles, Store, StoreFile, checked_components, is_hub, is_url};

use crate::error::{Error, Result};
use header::{ParsedFile, read_header};

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
    /// The rows of dimension 0 this tensor holds when only a range of them was asked for
    /// ([`Selection::rows`]); `shape[0]` is then the range's length and `offset`/`len` cover
    /// just those rows. `None` for the whole tensor.
    pub row_range: Option<Range<usize>>,
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
    /// The header's `__metadata__` (free-form strings, such as `{"format": "pt"}`), if any.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The validated table of contents of a checkpoint: its files and tensors, in load order (file
/// order, then offset within each file).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    files: Vec<ShardFile>,
    tensors: Vec<TensorMeta>,
    by_name: HashMap<String, usize>,
    /// The headers read to make it (an index narrowed to the tensors wanted reads only the
    /// shards holding them).
    headers_read: usize,
}

/// Which tensors a checkpoint is opened for: those whose names it accepts. An index then reads
/// only the headers of the shards holding one (see [`Checkpoint::open_for_in`]).
pub type Wanted<'a> = &'a dyn Fn(&str) -> bool;

impl Checkpoint {
    /// Opens a checkpoint from a directory (its index, else its `model.safetensors`, else its
    /// `*.safetensors` files in natural order), an index file (`*.json`), or one safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(&LocalFiles, path.as_ref())
    }

    /// [`open`](Self::open) with the files of `store` (an object store's prefix as a
    /// directory, say): the same discovery and every check of a local open.
    pub fn open_in(store: &dyn Store, path: &Path) -> Result<Self> {
        Self::open_for_in(store, path, None)
    }

    /// [`open_in`](Self::open_in) for the tensors `wanted` accepts (all when `None`): a
    /// checkpoint with an index reads only the headers of the shards the index says hold one
    /// of them, and holds only those shards and their tensors (every tensor of each, wanted or
    /// not: the caller's selection narrows further). The index is checked against the headers
    /// read, both ways; a shard it names must exist whether read or not. One file, or a
    /// directory without an index, is read whole (nothing says where a tensor lies without
    /// its header).
    pub fn open_for_in(store: &dyn Store, path: &Path, wanted: Option<Wanted<'_>>) -> Result<Self> {
        match store.kind(path)? {
            EntryKind::Dir => Self::open_dir(store, path, wanted),
            EntryKind::Other => Err(Error::NotAFile { path: path.into() }),
            EntryKind::File if path.extension().is_some_and(|ext| ext == "json") => {
                Self::from_index_for_in(store, path, wanted)
            }
            EntryKind::File => Self::from_files_in(store, [path]),
        }
    }

    /// Opens the listed safetensors files as one checkpoint, in the order given.
    pub fn from_files<I, P>(paths: I) -> Result<Self>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        Self::from_files_in(&LocalFiles, paths)
    }

    /// [`from_files`](Self::from_files) with the files of `store`.
    pub fn from_files_in<I, P>(store: &dyn Store, paths: I) -> Result<Self>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let mut seen = HashSet::new();
        let mut parsed = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let canonical = store
                .canonical(path)?
                .ok_or_else(|| Error::io(path, std::io::Error::from_raw_os_error(libc::ENOENT)))?;
            if !seen.insert(canonical) {
                return Err(Error::DuplicateFile { path: path.into() });
            }
            parsed.push(read_header(store, path)?);
        }
        Self::assemble(parsed)
    }

    fn open_dir(store: &dyn Store, dir: &Path, wanted: Option<Wanted<'_>>) -> Result<Self> {
        let entry = |name: &str| {
            store.entry(dir, name).map_err(|why| {
                Error::io(
                    dir,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("entry {name:?} {why}"),
                    ),
                )
            })
        };
        let layout =
            checkpoint_files_with(|name| Ok(store.exists(&entry(name)?)), || store.list(dir))?;
        match layout {
            Layout::Index => Self::from_index_for_in(store, &entry(INDEX_FILE_NAME)?, wanted),
            Layout::Single => Self::from_files_in(store, [entry(SINGLE_FILE_NAME)?]),
            Layout::Files(found) => {
                let files = found
                    .iter()
                    .map(|name| entry(name))
                    .collect::<Result<Vec<_>>>()?;
                Self::from_files_in(store, files)
            }
            Layout::Nothing => Err(Error::NoCheckpoint { path: dir.into() }),
        }
    }

    fn assemble(parsed: Vec<ParsedFile>) -> Result<Self> {
        let headers_read = parsed.len();
        let mut owner: HashMap<String, usize> = HashMap::new();
        let mut files: Vec<ShardFile> = Vec::with_capacity(parsed.len());
        let mut tensors = Vec::new();
        for (file_index, mut p) in parsed.into_iter().enumerate() {
            for mut t in p.tensors.drain(..) {
                if let Some(first) = owner.get(&t.name).and_then(|&i| tensors.get(i)) {
                    let first: &TensorMeta = first;
                    return Err(Error::DuplicateTensor {
                        name: t.name,
                        first: first.file.to_path_buf(),
                        second: p.file.path.to_path_buf(),
                    });
                }
                owner.insert(t.name.clone(), tensors.len());
                t.file_index = file_index;
                tensors.push(t);
            }
            files.push(p.file);
        }
        Ok(Self {
            files,
            tensors,
            by_name: owner,
            headers_read,
        })
    }

    /// The files, in load order.
    pub fn files(&self) -> &[ShardFile] {
        &self.files
    }

    /// The tensors, in load order: file order, then offset.
    pub fn tensors(&self) -> &[TensorMeta] {
        &self.tensors
    }

    /// The tensor called `name`, if the checkpoint has one.
    pub fn tensor(&self, name: &str) -> Option<&TensorMeta> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// A checkpoint of `files` and `tensors` (names unique, each tensor's `file_index` pointing
    /// into `files`), made from one whose opening read `headers_read` headers.
    fn from_parts(files: Vec<ShardFile>, tensors: Vec<TensorMeta>, headers_read: usize) -> Self {
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Self {
            files,
            tensors,
            by_name,
            headers_read,
        }
    }

    /// The headers read to open it: its files', or, for an index opened for some tensors
    /// ([`open_for_in`](Self::open_for_in)), those of the shards holding them.
    pub fn headers_read(&self) -> usize {
        self.headers_read
    }

    /// Total tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len as u64).sum()
    }

    /// The first file's `__metadata__` (like `safe_open(...).metadata()` on a single file;
    /// sharded checkpoints usually carry the same in every shard, see [`ShardFile::metadata`]).
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.files.first().and_then(|f| f.metadata.as_ref())
    }
}
