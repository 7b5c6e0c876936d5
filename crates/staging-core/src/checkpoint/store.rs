//! Where a checkpoint's files are read from while it is opened: the local file system
//! ([`LocalFiles`], what [`Checkpoint::open`](super::Checkpoint::open) uses), or anything else
//! that can say what a path is, list a directory, and read exact byte ranges (an object store,
//! say: `s3://bucket/prefix` as a directory, its objects as files).
//!
//! Opening through a [`Store`] applies every check of a local open (header limits and
//! validation, index names, index and headers agreeing, duplicates) to whatever the store
//! returns: nothing here trusts a length or a name from it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::FileIdentity;
use crate::error::{Error, Result};

/// What a path is, as a [`Store`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A file that can be opened and read.
    File,
    /// A directory (or a prefix of objects).
    Dir,
    /// Something else: a fifo, a socket, a device.
    Other,
}

/// A source of checkpoint files.
pub trait Store: Send + Sync {
    /// What `path` is, following symlinks; an error naming `path` when it does not exist.
    fn kind(&self, path: &Path) -> Result<EntryKind>;

    /// Whether anything is at `path` (a dangling symlink counts: opening it then fails).
    fn exists(&self, path: &Path) -> bool;

    /// Opens the file at `path`; an error when it is not a regular file.
    fn open(&self, path: &Path) -> Result<Box<dyn StoreFile + '_>>;

    /// The names of the entries directly in the directory `dir`.
    fn list(&self, dir: &Path) -> Result<Vec<String>>;

    /// A name equal for every path of one file (two index names linking to one blob are one
    /// shard); `None` when nothing is at `path`.
    fn canonical(&self, path: &Path) -> Result<Option<PathBuf>>;

    /// The path of `name` (`/`-separated, as an index writes its shard names) inside the
    /// directory `dir`, joined by this store's own rules, one component at a time: what comes
    /// back names an entry under `dir` and nothing else, or `Err` says why `name` cannot be
    /// one. By default a plain relative path
    /// (no root, empty, `.` or `..` component, backslash or control character) joined onto `dir` as the
    /// local file system does; a store whose paths are parsed again later (a URL) refuses what
    /// its parser would turn into something else, and checks the parsed result.
    fn join(&self, dir: &Path, name: &str) -> std::result::Result<PathBuf, String> {
        Ok(dir.join(checked_relative(name)?))
    }

    /// The path of `name`, an entry of the directory `dir` as this store names it (from
    /// [`list`](Self::list), or a well-known name such as `model.safetensors`): not an index's
    /// word, so not held to [`join`](Self::join)'s rules, but joined so that it names that entry
    /// and nothing else (a URL store encodes it as its path needs).
    fn entry(&self, dir: &Path, name: &str) -> std::result::Result<PathBuf, String> {
        Ok(dir.join(name))
    }
}

/// Checks that `name` is a plain relative path and returns it: `/`-separated components, each a
/// real name (not empty, not `.` or `..`, without a backslash, a NUL or another control
/// character), and no leading `/`.
pub(crate) fn checked_relative(name: &str) -> std::result::Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for part in checked_components(name)? {
        out.push(part);
    }
    Ok(out)
}

/// The components of `name` when it is a plain relative path: refused when empty or absolute,
/// or with an empty, `.` or `..` component, a backslash or a control character.
pub fn checked_components(name: &str) -> std::result::Result<Vec<&str>, String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.starts_with('/') {
        return Err("is absolute".into());
    }
    name.split('/')
        .map(|part| match part {
            "" => Err("has an empty component".to_owned()),
            "." => Err("has a '.' component".to_owned()),
            ".." => Err("contains '..'".to_owned()),
            _ if part.contains('\\') => Err("contains a backslash".to_owned()),
            _ if part.contains('\0') => Err("contains a NUL byte".to_owned()),
            _ if part.contains(char::is_control) => Err("contains a control character".to_owned()),
            _ => Ok(part),
        })
        .collect()
}

/// A file open in a [`Store`].
pub trait StoreFile {
    /// Its size in bytes when it was opened.
    fn size(&self) -> u64;

    /// What it was when it was opened: a load checks it is still that file.
    fn identity(&self) -> FileIdentity;

    /// Exactly `len` bytes at `offset`; an error (naming the file) when there are fewer.
    fn read_exact(&self, offset: u64, len: u64) -> Result<Vec<u8>>;
}

/// The local file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalFiles;

struct LocalFile {
    file: File,
    path: PathBuf,
    identity: FileIdentity,
}

impl StoreFile for LocalFile {
    fn size(&self) -> u64 {
        self.identity.size
    }

    fn identity(&self) -> FileIdentity {
        self.identity
    }

    fn read_exact(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let len = usize::try_from(len)
            .map_err(|_| Error::header(&self.path, format!("{len} bytes do not fit in memory")))?;
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::header(&self.path, "file shrank while its header was read")
            } else {
                Error::io(&self.path, e)
            }
        })?;
        Ok(buf)
    }
}

impl Store for LocalFiles {
    fn kind(&self, path: &Path) -> Result<EntryKind> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        Ok(if meta.is_dir() {
            EntryKind::Dir
        } else if meta.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        })
    }

    fn exists(&self, path: &Path) -> bool {
        path.symlink_metadata().is_ok()
    }

    fn open(&self, path: &Path) -> Result<Box<dyn StoreFile + '_>> {
        // O_NONBLOCK: opening a fifo must not wait for a writer; it is refused just below.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::NotAFile { path: path.into() });
        }
        Ok(Box::new(LocalFile {
            file,
            path: path.to_path_buf(),
            identity: FileIdentity::of(&meta),
        }))
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn canonical(&self, path: &Path) -> Result<Option<PathBuf>> {
        match path.canonicalize() {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }
}

/// Whether `path` is written as a URL (`scheme://...`, the scheme a letter then letters, digits,
/// `+`, `-` or `.`): the one test every door and the loader use to tell a checkpoint in object
/// storage from a local path. Such a path is never taken for a local file, so an unsupported
/// scheme (`file://`), or a build without remote support, says so instead of "not found".
pub fn is_url(path: &std::path::Path) -> bool {
    path.to_str()
        .and_then(|s| s.split_once("://"))
        .is_some_and(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
}

/// Whether `path` names a model on the Hugging Face Hub (`hf://...`): a URL whose scheme is `hf`
/// (any case), the scheme alone deciding, as for every URL. The one answer the loader, the Hub
/// backend and every door use.
pub fn is_hub(path: &std::path::Path) -> bool {
    is_url(path)
        && path
            .to_str()
            .and_then(|s| s.split_once("://"))
            .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("hf"))
}

#[cfg(test)]
mod url_tests {
    use super::{is_hub, is_url};
    use std::path::Path;

    #[test]
    fn urls_are_told_from_paths() {
        for url in [
            "s3://b/k",
            "HTTPS://h/k",
            "gs://b",
            "file:///models",
            "s3+x://b",
        ] {
            assert!(is_url(Path::new(url)), "{url}");
        }
        for path in [
            "/models/s3://x",
            "models/model.safetensors",
            "://x",
            "1s3://b",
            "C:\\models",
        ] {
            assert!(!is_url(Path::new(path)), "{path}");
        }
    }

    #[test]
    fn the_hub_is_the_hf_scheme_of_a_url() {
        for hub in [
            "hf://org/name",
            "HF://gpt2",
            "Hf://org/name@main/model.safetensors",
        ] {
            assert!(is_hub(Path::new(hub)), "{hub}");
        }
        for other in [
            "hf:/org/name",
            "hff://org/name",
            "https://huggingface.co/org/name",
            "models/hf://x",
            "org/name",
            "",
        ] {
            assert!(!is_hub(Path::new(other)), "{other}");
        }
    }
}
