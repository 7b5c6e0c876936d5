//! Opening a sharded checkpoint from its `model.safetensors.index.json`.
//!
//! The protection that matters is on the names as written: a shard must be named by a plain
//! relative path (no root, no `..`, no empty or `.` components, no backslashes or NULs), so an
//! index cannot reach outside its directory by what it says. Symlinks are followed wherever they
//! point, as Python `safetensors` and `transformers` do, so hub-cache snapshots load as they are.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::header::{ParsedFile, read_header};
use super::layout::IndexFile;
use super::store::{LocalFiles, Store};
use super::{Checkpoint, MAX_INDEX_SIZE, Wanted};
use crate::error::{Error, Result};

impl Checkpoint {
    /// Opens a sharded checkpoint from its index file. Every shard name, as written, must be a
    /// plain relative path inside the index's directory ([`Store::join`]) naming a
    /// regular file; where a symlink of that name then points is the file system's business, as
    /// for Python `safetensors` (a Hugging Face hub-cache snapshot links every file into
    /// `../../blobs/`). The index and the shards' headers must agree tensor for tensor.
    pub fn from_index(index_path: impl AsRef<Path>) -> Result<Self> {
        Self::from_index_in(&LocalFiles, index_path.as_ref())
    }

    /// [`from_index`](Self::from_index) with the files of `store`.
    pub fn from_index_in(store: &dyn Store, index_path: &Path) -> Result<Self> {
        Self::from_index_for_in(store, index_path, None)
    }

    /// [`from_index_in`](Self::from_index_in) for the tensors `wanted` accepts (all when
    /// `None`): only the shards the index says hold one of them are read and kept, and the
    /// index is checked against those (see [`open_for_in`](Self::open_for_in)).
    pub fn from_index_for_in(
        store: &dyn Store,
        index_path: &Path,
        wanted: Option<Wanted<'_>>,
    ) -> Result<Self> {
        let root = match index_path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let index = read_index(store, index_path)?;
        let (shard_paths, shard_of_name) = shards_of(store, &root, index_path, &index)?;

        // The shards to read: those holding a tensor wanted (every one when all are).
        let read: Vec<bool> = match wanted {
            None => vec![true; shard_paths.len()],
            Some(wanted) => {
                let mut read = vec![false; shard_paths.len()];
                for (tensor, shard_name) in &index.weight_map {
                    if let Some(&slot) = shard_of_name.get(shard_name.as_str())
                        && !read[slot]
                        && wanted(tensor)
                    {
                        read[slot] = true;
                    }
                }
                read
            }
        };
        // Each slot's place among the shards read (`None`: not read).
        let mut place: Vec<Option<usize>> = Vec::with_capacity(shard_paths.len());
        let mut parsed = Vec::new();
        for (path, read) in shard_paths.iter().zip(&read) {
            place.push(read.then_some(parsed.len()));
            if *read {
                parsed.push(read_header(store, path)?);
            }
        }
        check_agreement(index_path, &index, &shard_of_name, &place, &parsed)?;
        Self::assemble(parsed)
    }
}

/// Reads and parses the index file (at most [`MAX_INDEX_SIZE`] bytes).
fn read_index(store: &dyn Store, index_path: &Path) -> Result<IndexFile> {
    let file = store.open(index_path)?;
    let size = file.size();
    if size > MAX_INDEX_SIZE {
        return Err(Error::index(
            index_path,
            format!("{size} bytes is over the {MAX_INDEX_SIZE}-byte limit"),
        ));
    }
    let text = file.read_exact(0, size)?;
    IndexFile::parse(&text).map_err(|reason| Error::index(index_path, reason))
}

/// The index's shards: their paths in natural order of their names (names resolving to one file
/// are one shard, at the place of the first), and each name's place among them. Every name must
/// be a plain relative path under `root` ([`Store::join`]) naming a file that exists.
fn shards_of<'i>(
    store: &dyn Store,
    root: &Path,
    index_path: &Path,
    index: &'i IndexFile,
) -> Result<(Vec<PathBuf>, HashMap<&'i str, usize>)> {
    let names = index
        .shard_names()
        .map_err(|reason| Error::index(index_path, reason))?;
    let mut shard_of_name: HashMap<&str, usize> = HashMap::new();
    let mut shard_paths: Vec<PathBuf> = Vec::new();
    let mut canonical_seen: HashMap<PathBuf, usize> = HashMap::new();
    for name in names {
        let joined = store
            .join(root, name)
            .map_err(|why| Error::index(index_path, format!("shard path {name:?} {why}")))?;
        let Some(canonical) = store.canonical(&joined)? else {
            return Err(Error::index(
                index_path,
                format!("shard {name:?} does not exist"),
            ));
        };
        let slot = *canonical_seen.entry(canonical).or_insert_with(|| {
            shard_paths.push(joined);
            shard_paths.len() - 1
        });
        shard_of_name.insert(name, slot);
    }
    Ok((shard_paths, shard_of_name))
}

/// Checks that the index and the headers read (`parsed`; `place` gives each shard's place among
/// them, `None` for one not read) agree both ways: every tensor listed in a shard read is in
/// its header, and every tensor of a header read is listed.
fn check_agreement(
    index_path: &Path,
    index: &IndexFile,
    shard_of_name: &HashMap<&str, usize>,
    place: &[Option<usize>],
    parsed: &[ParsedFile],
) -> Result<()> {
    // The index and the headers read must agree both ways. Each shard's names as a set: a
    // scan of the shard per name listed was quadratic in the tensors of a shard (60,000
    // tensors in one file: 6.3 s of a 6.6 s load).
    let held: Vec<HashSet<&str>> = parsed
        .iter()
        .map(|p| p.tensors.iter().map(|t| t.name.as_str()).collect())
        .collect();
    for (tensor, shard_name) in &index.weight_map {
        let slot = shard_of_name.get(shard_name.as_str()).copied();
        let Some(place) = slot.map(|s| place[s]) else {
            return Err(Error::index(
                index_path,
                format!(
                    "tensor {tensor:?} is listed in shard {shard_name:?}, which does not hold it"
                ),
            ));
        };
        let Some(place) = place else {
            continue; // a shard not read: nothing of it is loaded
        };
        let found = held
            .get(place)
            .is_some_and(|names| names.contains(tensor.as_str()));
        if !found {
            return Err(Error::index(
                index_path,
                format!(
                    "tensor {tensor:?} is listed in shard {shard_name:?}, which does not hold it"
                ),
            ));
        }
    }
    for shard in parsed {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::store::checked_relative;
    use rstest::rstest;
    use std::path::PathBuf;

    #[rstest]
    #[case("", Err("is empty"))]
    #[case("../x.safetensors", Err("contains '..'"))]
    #[case("a/../../x", Err("contains '..'"))]
    #[case("/etc/passwd", Err("is absolute"))]
    #[case(".", Err("has a '.' component"))]
    #[case("./a.safetensors", Err("has a '.' component"))]
    #[case("a//b.safetensors", Err("has an empty component"))]
    #[case("sub/", Err("has an empty component"))]
    #[case("..\\x.safetensors", Err("contains a backslash"))]
    #[case("a\0b", Err("contains a NUL byte"))]
    #[case("a\nb.safetensors", Err("contains a control character"))]
    #[case("sub/\u{7f}", Err("contains a control character"))]
    #[case("a.safetensors", Ok(PathBuf::from("a.safetensors")))]
    #[case("sub/a.safetensors", Ok(PathBuf::from("sub/a.safetensors")))]
    fn shard_paths(#[case] name: &str, #[case] expected: std::result::Result<PathBuf, &str>) {
        assert_eq!(checked_relative(name), expected.map_err(str::to_owned));
    }
}
