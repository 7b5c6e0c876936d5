//! The second step of a Hub load: which files it reads, decided from the listing as the
//! loaders decide it ([`choose`]), the index read (from the cache when it holds it) to learn
//! the shards, and the small files fetched beside the weights.

use std::collections::HashMap;
use std::io;

use staging_core::Error;

use crate::api::TreeFile;
use crate::cache;
use crate::counters::Counters;
use crate::layout::{SMALL_FILE_MAX, choose, is_weight, shards_of};
use crate::load::Load;

/// What a load reads at its commit.
pub(crate) struct Plan {
    /// The commit its revision named.
    pub(crate) commit: String,
    /// Every file at the commit.
    tree: Vec<TreeFile>,
    /// Each file's place in `tree`, by path.
    by_path: HashMap<String, usize>,
    /// The index read, if the weights have one.
    pub(crate) index: Option<String>,
    /// The weights chosen without an index (none with one).
    pub(crate) weights: Vec<String>,
    /// The weight files read: the index's shards, else `weights`.
    pub(crate) weight_names: Vec<String>,
    /// The index's bytes, read already.
    pub(crate) index_bytes: Option<Vec<u8>>,
    /// The files read whole (places in `tree`): every file that is not a weight, and the index.
    small: Vec<usize>,
}

impl Plan {
    /// The listed file at `path`.
    pub(crate) fn file(&self, path: &str) -> Option<&TreeFile> {
        self.by_path.get(path).map(|&at| &self.tree[at])
    }

    /// The files read whole.
    pub(crate) fn small(&self) -> Vec<&TreeFile> {
        self.small.iter().map(|&at| &self.tree[at]).collect()
    }

    /// The weight files read that the listing holds.
    pub(crate) fn weight_files(&self) -> Vec<&TreeFile> {
        self.weight_names
            .iter()
            .filter_map(|name| self.file(name))
            .collect()
    }

    /// The index's bytes, when `file` is the index.
    pub(crate) fn index_bytes_of(&self, file: &TreeFile) -> Option<&Vec<u8>> {
        self.index_bytes
            .as_ref()
            .filter(|_| Some(&file.path) == self.index.as_ref())
    }

    /// The files the report lists: the index, then the weights.
    pub(crate) fn files(&self) -> Vec<String> {
        self.index
            .iter()
            .chain(&self.weight_names)
            .cloned()
            .collect()
    }
}

/// What `load` reads of `tree`, the files at `commit`.
pub(crate) fn plan(load: &Load<'_>, commit: String, tree: Vec<TreeFile>) -> Result<Plan, Error> {
    let (index, weights) =
        choose(&tree, &load.what).map_err(|why| load.fail(io::ErrorKind::NotFound, why))?;
    let by_path: HashMap<String, usize> = tree
        .iter()
        .enumerate()
        .map(|(at, f)| (f.path.clone(), at))
        .collect();
    let small = tree
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            (!is_weight(&f.path) && f.size <= SMALL_FILE_MAX) || Some(&f.path) == index.as_ref()
        })
        .map(|(at, _)| at)
        .collect();
    let (weight_names, index_bytes) = match &index {
        Some(index) => {
            // The index's shards are known once it is read; it is small, and read whole.
            let file = by_path
                .get(index.as_str())
                .map(|&at| &tree[at])
                .ok_or_else(|| {
                    load.fail(
                        io::ErrorKind::InvalidInput,
                        format!("{} lists no {index}", load.what.repo),
                    )
                })?;
            let bytes = read_index(load, &commit, file)?;
            let shards = shards_of(&bytes, index)
                .map_err(|why| load.fail(io::ErrorKind::InvalidData, why))?;
            (shards, Some(bytes))
        }
        None => (weights.clone(), None),
    };
    Ok(Plan {
        commit,
        tree,
        by_path,
        index,
        weights,
        weight_names,
        index_bytes,
        small,
    })
}

/// The index `file`'s bytes: from the cache when it has them, under this commit or any other
/// (its blob is named by its content: a warm start asks nothing more of the Hub), else from
/// the Hub.
fn read_index(load: &Load<'_>, commit: &str, file: &TreeFile) -> Result<Vec<u8>, Error> {
    let cached = std::fs::read(load.blob(file))
        .ok()
        .filter(|bytes| load.settings.cache && cache::check_whole(file, bytes).is_ok());
    match cached {
        Some(bytes) => {
            Counters::add(&load.counters.from_cache, bytes.len() as u64);
            Ok(bytes)
        }
        None => load
            .block_on(load.fetch_whole(commit, file))
            .map_err(|e| load.error(e)),
    }
}
