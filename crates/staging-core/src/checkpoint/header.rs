//! Reading one safetensors header: the 8-byte length, then exactly that many bytes of JSON,
//! validated by the `safetensors` crate's [`Metadata`] and then against the file's real size.
//!
//! Nothing here reads more than the header, allocates from an untrusted length before checking
//! it against the file, or opens anything but a regular file (a fifo would block).

use std::cmp::Ordering;
use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::Metadata;

use super::store::Store;
use super::{MAX_HEADER_SIZE, ShardFile, TensorMeta};
use crate::error::{Error, Result};

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
        self.compare(&now)
    }

    /// Checks that `now` (a file's identity as it is now: of its path, or of a descriptor open
    /// on it) is this file, unchanged; says what changed otherwise.
    pub fn compare(&self, now: &FileIdentity) -> std::result::Result<(), String> {
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

/// A file's header, parsed: the file and its tensors in offset order.
pub(super) struct ParsedFile {
    pub(super) file: ShardFile,
    pub(super) tensors: Vec<TensorMeta>,
}

/// Opens `path` for reading only if it is a regular file, without blocking on a fifo.
pub(super) fn read_header(store: &dyn Store, path: &Path) -> Result<ParsedFile> {
    let file = store.open(path)?;
    let identity = file.identity();
    let size = file.size();
    if size < 8 {
        return Err(Error::header(
            path,
            format!("file is {size} bytes, too short for the 8-byte header length"),
        ));
    }
    let len_bytes = file.read_exact(0, 8)?;
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
    let header = file.read_exact(8, n)?;
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
            row_range: None,
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
            metadata: metadata
                .metadata()
                .as_ref()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        },
        tensors,
    })
}
