//! The third step of a Hub load whose weights are all in the cache: a local load of the
//! snapshot. What the snapshot lacks (this commit's links, a small file) is made as far as the
//! cache lets it, and nothing fails for it: a read-only cache (a mounted model volume, with no
//! `.locks/`) that holds the model loads as it is.

use std::path::PathBuf;

use crate::api::TreeFile;
use crate::counters::Counters;
use crate::facts::{HubFacts, Opened};
use crate::layout::is_documentation;
use crate::load::Load;
use crate::local::{cached_target, same_files_elsewhere};
use crate::plan::Plan;

/// What the cache does for a load.
pub(crate) enum FromCache {
    /// Not every weight is there (or the cache is off): the weights are streamed.
    Lacking,
    /// A snapshot holds every file: load it.
    Opened(Box<Opened>),
    /// Every weight is there, but no snapshot holds them all and none could be made: the
    /// weights are read from the blobs, nothing is written, and the report says so.
    ReadOnly(String),
}

/// What the cache does for `load`, reading `plan`.
pub(crate) fn from_cache(load: &Load<'_>, plan: &Plan) -> FromCache {
    let weight_files = plan.weight_files();
    let all_weights_cached = weight_files.len() == plan.weight_names.len()
        && weight_files.iter().all(|f| load.blob_cached(f));
    if !load.settings.cache || !all_weights_cached {
        return FromCache::Lacking;
    }
    let (what, commit) = (&load.what, &plan.commit);
    let small = plan.small();
    let complete = weight_files
        .iter()
        .chain(&small)
        .all(|f| load.linked(commit, f))
        && load.dirs.read_ref(what.revision_or_main()).as_deref() == Some(commit.as_str());
    // A cache whose folders cannot be made (read-only) is not written, and nothing is
    // fetched for it.
    if !complete && load.dirs.writable() {
        complete_snapshot(load, plan, weight_files.iter().chain(&small).copied());
    }
    match holder(load, plan) {
        Some((at, note)) => {
            let facts = HubFacts {
                snapshot: Some(at.clone()),
                cached: true,
                files: plan.files(),
                note,
                ..HubFacts::of(what, commit, load.counters.clone())
            };
            let local_path = at.join(what.path.as_deref().unwrap_or(""));
            FromCache::Opened(Box::new(Opened::Cached {
                path: cached_target(&local_path, &at, &plan.index, &plan.weights),
                commit: commit.clone(),
                facts,
            }))
        }
        // No snapshot holds them: the weights are read from the blobs, and nothing written.
        None => FromCache::ReadOnly(format!(
            "the cache at {} could not be updated to {commit}: the weights were read from its \
             blobs",
            load.dirs.root.display()
        )),
    }
}

/// This commit's ref and snapshot, made of `files` as far as the cache lets it: a blob there
/// linked, another fetched and written. A small file that cannot be fetched now (one
/// `huggingface_hub` never fetched, such as the README, with the network gone) does not stop
/// the load.
fn complete_snapshot<'f>(load: &Load<'_>, plan: &Plan, files: impl Iterator<Item = &'f TreeFile>) {
    let (what, commit) = (&load.what, &plan.commit);
    let _ = load.dirs.write_ref(what.revision_or_main(), commit);
    for file in files {
        if load.linked(commit, file) {
            continue;
        }
        if load.blob_cached(file) {
            let _ = load.dirs.link(commit, file);
            continue;
        }
        let bytes = match plan.index_bytes_of(file) {
            Some(bytes) => Ok(bytes.clone()),
            None => load.block_on(load.fetch_whole(commit, file)),
        };
        if let Ok(bytes) = bytes
            && let Ok(written) = load.dirs.put_whole(commit, file, &bytes)
        {
            Counters::add(&load.counters.written, written);
        }
    }
}

/// The snapshot that holds the weights, and why it is not this commit's: this commit's; else,
/// where the cache could not be updated (read-only, a mounted volume) and the Hub's revision
/// moved to a commit of the same weights, another commit's snapshot linking the same blobs at
/// the same paths. A path of this commit's snapshot that the load cannot open is never handed
/// on.
fn holder(load: &Load<'_>, plan: &Plan) -> Option<(PathBuf, Option<String>)> {
    let commit = &plan.commit;
    let index_file = plan.index.as_deref().and_then(|i| plan.file(i));
    // Another snapshot must hold every file this commit's would (the config and tokenizer
    // too: a caller reads them from the snapshot reported), but for documentation.
    let small = plan.small();
    let needed: Vec<&TreeFile> = plan
        .weight_files()
        .into_iter()
        .chain(index_file)
        .chain(small.into_iter().filter(|f| !is_documentation(&f.path)))
        .collect();
    if needed.iter().all(|f| load.linked(commit, f)) {
        return Some((load.dirs.snapshot(commit), None));
    }
    same_files_elsewhere(&load.dirs, &load.what, commit, &needed).map(|(other, at)| {
        let note = format!(
            "the cache could not be updated to {commit}: its files were read from the \
             snapshot of {other}, which holds the same blobs"
        );
        (at, Some(note))
    })
}
