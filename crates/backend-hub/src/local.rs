//! Loads from the Hugging Face cache alone: a snapshot that holds the weights a load reads
//! (offline, the Hub not answering, or every file already there), found as `huggingface_hub`
//! finds it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use staging_core::{Error, Layout, SINGLE_FILE_NAME, checkpoint_files};

use crate::api::{TreeFile, is_commit};
use crate::cache::RepoCache;
use crate::counters::Counters;
use crate::facts::{HubFacts, Opened};
use crate::layout::shards_of;
use crate::path::{HubPath, error_at};

/// A snapshot of another commit than `commit` that links every file of `files` to its blob
/// (the one the Hub lists for it at `commit`), the cache's ref of the revision first: that
/// commit and its snapshot.
pub(crate) fn same_files_elsewhere(
    dirs: &RepoCache,
    what: &HubPath,
    commit: &str,
    files: &[&TreeFile],
) -> Option<(String, PathBuf)> {
    let mut candidates: Vec<String> = dirs.read_ref(what.revision_or_main()).into_iter().collect();
    if let Ok(entries) = std::fs::read_dir(dirs.repo.join("snapshots")) {
        let mut others: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|name| is_commit(name))
            .collect();
        others.sort();
        candidates.extend(others);
    }
    candidates
        .into_iter()
        .filter(|c| c != commit)
        .find_map(|other| {
            let at = dirs.snapshot(&other);
            let holds = |f: &&TreeFile| {
                std::fs::read_link(at.join(&f.path)).is_ok_and(|target| {
                    target.file_name().and_then(|n| n.to_str()) == Some(f.blob())
                        && at.join(&f.path).is_file()
                })
            };
            files.iter().all(holds).then_some((other, at))
        })
}

/// What to load locally of a snapshot that holds everything: the index or the files chosen.
pub(crate) fn cached_target(
    local_path: &Path,
    snapshot: &Path,
    index: &Option<String>,
    weights: &[String],
) -> PathBuf {
    match (index, weights) {
        (Some(index), _) => snapshot.join(index),
        (None, [one]) => snapshot.join(one),
        _ => local_path.to_path_buf(),
    }
}

/// The weight files a local load of `path` (in the snapshot `snapshot`) reads, as paths in
/// the repository: the index and every shard it names, else the weights of a folder as core
/// chooses them ([`checkpoint_files`]), else the file. `None` when they are not all there.
fn snapshot_files(snapshot: &Path, path: &Path) -> Option<Vec<String>> {
    let in_repo = |p: &Path| {
        p.strip_prefix(snapshot)
            .ok()
            .map(|rel| rel.to_string_lossy().into_owned())
    };
    let index = if path.is_dir() {
        path.join(staging_core::INDEX_FILE_NAME)
    } else {
        path.to_path_buf()
    };
    if index.is_file() && index.extension().is_some_and(|e| e == "json") {
        let bytes = std::fs::read(&index).ok()?;
        let name = index.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let dir = index.parent().unwrap_or(path);
        let shards = shards_of(&bytes, name).ok()?;
        let mut files = vec![in_repo(&index)?];
        for shard in shards {
            let at = dir.join(&shard);
            if !at.is_file() {
                return None;
            }
            files.push(in_repo(&at)?);
        }
        return Some(files);
    }
    if path.is_dir() {
        // The files there, chosen as core's open of the folder chooses them.
        let names: Vec<String> = std::fs::read_dir(path)
            .ok()?
            .flatten()
            .filter(|e| e.path().is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect();
        let found = match checkpoint_files(names.iter().map(String::as_str)) {
            Layout::Single => vec![SINGLE_FILE_NAME],
            Layout::Files(found) => found,
            // An index that is a file was read above.
            Layout::Index | Layout::Nothing => return None,
        };
        return found
            .into_iter()
            .map(|name| in_repo(&path.join(name)))
            .collect();
    }
    path.is_file()
        .then(|| in_repo(path))
        .flatten()
        .map(|f| vec![f])
}

/// A local load of the snapshot of `commit` at the path `what` asks for, with its facts.
fn local_load(what: &HubPath, dirs: &RepoCache, commit: String, counters: Arc<Counters>) -> Opened {
    let snapshot = dirs.snapshot(&commit);
    let path = snapshot.join(what.path.as_deref().unwrap_or(""));
    let facts = HubFacts {
        files: snapshot_files(&snapshot, &path).unwrap_or_default(),
        snapshot: Some(snapshot),
        cached: true,
        ..HubFacts::of(what, &commit, counters)
    };
    Opened::Cached {
        path,
        commit,
        facts,
    }
}

/// The snapshot of `commit` (else of the commit the cache's `refs/<revision>`, or the revision
/// given as a commit, names), when it holds the weights a load of `what` reads.
pub(crate) fn cached_snapshot(
    what: &HubPath,
    dirs: &RepoCache,
    commit: Option<&str>,
    counters: Arc<Counters>,
) -> Option<Opened> {
    let opened = match commit {
        Some(commit) => local_load(what, dirs, commit.to_owned(), counters),
        None => open_offline(what, dirs, counters).ok()?,
    };
    let Opened::Cached { path, commit, .. } = &opened else {
        return None;
    };
    snapshot_files(&dirs.snapshot(commit), path).map(|_| opened)
}

/// With `HF_HUB_OFFLINE`: the snapshot the cache's `refs/<revision>` (or the commit given)
/// names, with no request at all.
pub(crate) fn open_offline(
    what: &HubPath,
    dirs: &RepoCache,
    counters: Arc<Counters>,
) -> Result<Opened, Error> {
    let revision = what.revision_or_main();
    let commit = if is_commit(revision) {
        Some(revision.to_ascii_lowercase())
    } else {
        dirs.read_ref(revision)
    };
    let found = commit.filter(|c| dirs.snapshot(c).is_dir());
    let Some(commit) = found else {
        return Err(error_at(
            what,
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "HF_HUB_OFFLINE is set and the Hugging Face cache at {} has no snapshot of \
                     {} at {revision}: download it once online, or unset HF_HUB_OFFLINE",
                    dirs.root.display(),
                    what.repo
                ),
            ),
        ));
    };
    Ok(local_load(what, dirs, commit, counters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_folder_s_files_are_those_core_opens() {
        let snapshot = tempfile::tempdir().unwrap();
        let sub = snapshot.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        for name in ["b-10.safetensors", "b-9.safetensors", ".b-0.safetensors"] {
            std::fs::write(sub.join(name), b"").unwrap();
        }
        assert_eq!(
            snapshot_files(snapshot.path(), &sub).unwrap(),
            ["sub/b-9.safetensors", "sub/b-10.safetensors"]
        );
        // The single file wins over the others, as core's open of the folder reads it alone.
        std::fs::write(sub.join("model.safetensors"), b"").unwrap();
        assert_eq!(
            snapshot_files(snapshot.path(), &sub).unwrap(),
            ["sub/model.safetensors"]
        );
        // The index wins, and names the shards read, in natural order.
        let index = br#"{"weight_map":{"a":"b-10.safetensors","b":"b-9.safetensors"}}"#;
        std::fs::write(sub.join(INDEX), index).unwrap();
        assert_eq!(
            snapshot_files(snapshot.path(), &sub).unwrap(),
            [
                "sub/model.safetensors.index.json",
                "sub/b-9.safetensors",
                "sub/b-10.safetensors"
            ]
        );
        // Weights the index names that are not there: not a snapshot to load from.
        let missing = br#"{"weight_map":{"a":"gone.safetensors"}}"#;
        std::fs::write(sub.join(INDEX), missing).unwrap();
        assert_eq!(snapshot_files(snapshot.path(), &sub), None);
        let empty = snapshot.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        std::fs::write(empty.join(".hidden.safetensors"), b"").unwrap();
        assert_eq!(snapshot_files(snapshot.path(), &empty), None);
    }

    const INDEX: &str = staging_core::INDEX_FILE_NAME;
}
