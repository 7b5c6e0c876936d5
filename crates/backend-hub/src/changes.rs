//! What changed between two commits of a Hub model ([`changes`]), for a reload that moves only
//! what changed (`load_into(..., since=)`), and the path in the repository of a file a load
//! reads ([`repository_path`]), which is what the changes are listed by.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use backend_remote::Options;
use staging_core::Error;

use crate::api::{self, is_commit};
use crate::cache::RepoCache;
use crate::config::{HubOptions, Settings};
use crate::connect::{Connection, connect};
use crate::facts::Opened;
use crate::local::open_offline;
use crate::path::{HubPath, error_at, parse};

/// What changed between two commits of a Hub model ([`changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    /// The Hub path at the commit its revision names: what to load for the changes to hold
    /// (`hf://org/name@<commit>[/path]`).
    pub path: String,
    /// That commit.
    pub commit: String,
    /// The Hub path at the commit `since` names (`hf://org/name@<since>[/path]`).
    pub since_path: String,
    /// The commit `since` names.
    pub since: String,
    /// The files at `commit` whose bytes differ from `since`'s, or that `since` lacks, as
    /// paths in the repository. Online, each file's blob in the two listings compared (an LFS
    /// file's SHA-256, another file's git id); from the cache, the blobs the two snapshots'
    /// links name, and a file that is not a link (a cache copied with `cp -rL`, a file system
    /// without symbolic links) compared byte for byte.
    pub changed: Vec<String>,
    /// Where the two commits were compared: `"hub"` (their listings) or `"cache"` (their
    /// snapshots: offline, or the Hub could not be asked).
    pub compared: &'static str,
    /// Why the cache was compared rather than the Hub's listings, when it was.
    pub note: Option<String>,
}

/// Which files of the model at `path` (`hf://org/name@new`) differ from those at the revision
/// `since` of the same repository: for a model that holds `since`'s weights, the files whose
/// tensors a move to `path`'s revision rewrites.
///
/// Both revisions are resolved and listed (two requests each), and the cache's
/// `refs/<revision>` written as a load of `path` writes it (unless the cache is off). With
/// `HF_HUB_OFFLINE`, or when the Hub cannot be asked (no answer, an outage, a rate limit), the
/// cache's refs and snapshots are compared instead, as a load falls back to the cache then: a
/// file a snapshot lacks is changed, and so is one whose bytes cannot be shown to match.
pub fn changes(
    path: &Path,
    since: &str,
    options: &Options,
    hub: &HubOptions,
) -> Result<Changes, Error> {
    let what = parse(path)?;
    let old = HubPath {
        revision: Some(since.to_owned()),
        ..what.clone()
    };
    // The environment, read once for what `hub` leaves unsaid.
    let settings = Settings::from_env(hub);
    let dirs = RepoCache::new(&settings.cache_dir, &what.cache_folder());
    let compared = if settings.offline {
        let why = "HF_HUB_OFFLINE is set: the cache's snapshots compared".to_owned();
        from_cache(&what, &old, &dirs, why)?
    } else {
        let connection = connect(&what, options, &settings)?;
        match from_hub(&connection, &what, &old, &dirs, options, &settings) {
            Ok(compared) => compared,
            Err((e, of)) if settings.cache && api::unavailable(&e) => {
                let why =
                    format!("the Hub could not be asked ({e}): the cache's snapshots compared");
                from_cache(&what, &old, &dirs, why).map_err(|_| error_at(of, e))?
            }
            Err((e, of)) => return Err(error_at(of, e)),
        }
    };
    let Compared {
        commit,
        since,
        changed,
        compared,
        note,
    } = compared;
    let pinned = |of: &HubPath, commit: &str| {
        HubPath {
            revision: Some(commit.to_owned()),
            ..of.clone()
        }
        .to_string()
    };
    Ok(Changes {
        path: pinned(&what, &commit),
        since_path: pinned(&old, &since),
        commit,
        since,
        changed,
        compared,
        note,
    })
}

/// A failed request, and the revision it was about.
type Failed<'a> = (io::Error, &'a HubPath);

/// Two commits compared.
struct Compared {
    commit: String,
    since: String,
    changed: Vec<String>,
    compared: &'static str,
    note: Option<String>,
}

/// The two revisions resolved and listed by the Hub, and the new one's ref written; `Err`
/// with the revision the failed request was about.
fn from_hub<'a>(
    connection: &Connection,
    what: &'a HubPath,
    old: &'a HubPath,
    dirs: &RepoCache,
    options: &Options,
    settings: &Settings,
) -> Result<Compared, Failed<'a>> {
    let Connection { api, runtime, .. } = connection;
    let retry = options.retry();
    let listing = |of: &'a HubPath| -> Result<(String, HashMap<String, String>), Failed<'a>> {
        let commit = runtime
            .block_on(options.interrupt.as_ref(), api.commit(of, retry))
            .map_err(|e| (e, of))?;
        let tree = runtime
            .block_on(options.interrupt.as_ref(), api.tree(of, &commit, retry))
            .map_err(|e| (e, of))?;
        let blobs = tree
            .into_iter()
            .map(|f| (f.path.clone(), f.blob().to_owned()))
            .collect();
        Ok((commit, blobs))
    };
    let (commit, new_files) = listing(what)?;
    let (since, old_files) = listing(old)?;
    // The ref a load of `what` writes (a commit asked for by its hash has none): an offline
    // start after this reload (an engine's restart, a config read by `huggingface_hub`) finds
    // the new commit. A cache that cannot be written is the load's to report.
    let revision = what.revision_or_main();
    if settings.cache && !is_commit(revision) && dirs.prepare().is_ok() {
        let _ = dirs.write_ref(revision, &commit);
    }
    let changed = sorted_changes(&new_files, |name, blob| old_files.get(name) == Some(blob));
    Ok(Compared {
        commit,
        since,
        changed,
        compared: "hub",
        note: None,
    })
}

/// The two revisions' snapshots in the cache compared (their refs, or commits given).
fn from_cache(
    what: &HubPath,
    old: &HubPath,
    dirs: &RepoCache,
    why: String,
) -> Result<Compared, Error> {
    let commit_of = |of: &HubPath| match open_offline(of, dirs, Arc::default())? {
        Opened::Cached { commit, .. } | Opened::Streamed { commit, .. } => Ok(commit),
    };
    let commit = commit_of(what)?;
    // `since`'s snapshot missing (the model came from elsewhere, or the cache was pruned):
    // nothing is known to match, and every file is changed, as a plain load reads it all.
    let (since, old_files, why) = match commit_of(old) {
        Ok(since) => {
            let files = snapshot_files(&dirs.snapshot(&since));
            (since, files, why)
        }
        Err(_) => {
            let revision = old.revision_or_main().to_owned();
            let why = format!(
                "{why}; the cache has no snapshot of {revision}: every file taken as changed"
            );
            (revision, HashMap::new(), why)
        }
    };
    let new_files = snapshot_files(&dirs.snapshot(&commit));
    let changed = sorted_changes(&new_files, |name, file| {
        old_files.get(name).is_some_and(|old| same_bytes(file, old))
    });
    Ok(Compared {
        commit,
        since,
        changed,
        compared: "cache",
        note: Some(why),
    })
}

/// The files of `new` whose bytes `same` does not say are the old ones, sorted.
fn sorted_changes<T>(new: &HashMap<String, T>, same: impl Fn(&str, &T) -> bool) -> Vec<String> {
    let mut changed: Vec<String> = new
        .iter()
        .filter(|(name, file)| !same(name, file))
        .map(|(name, _)| name.clone())
        .collect();
    changed.sort();
    changed
}

/// A file of a snapshot: a link into the blobs (by the blob's name), or a plain file.
#[derive(Debug)]
enum SnapshotFile {
    /// A symbolic link: the blob it names, and where it points.
    Link { blob: String, target: PathBuf },
    /// A file that is not a link.
    Plain(PathBuf),
}

impl SnapshotFile {
    /// Where its bytes are.
    fn bytes_at(&self) -> &Path {
        match self {
            Self::Link { target, .. } => target,
            Self::Plain(path) => path,
        }
    }
}

/// Whether two snapshot files hold the same bytes: two links to the same blob do; otherwise
/// (a plain file on either side, or two blobs) their bytes are compared. A file that cannot be
/// read (a dangling link) holds bytes not known to match.
fn same_bytes(a: &SnapshotFile, b: &SnapshotFile) -> bool {
    if let (SnapshotFile::Link { blob: x, .. }, SnapshotFile::Link { blob: y, .. }) = (a, b)
        && x == y
    {
        return true;
    }
    equal_files(a.bytes_at(), b.bytes_at()).unwrap_or(false)
}

/// Whether two files hold the same bytes (sizes first, then the bytes, a block at a time).
fn equal_files(a: &Path, b: &Path) -> io::Result<bool> {
    let (mut x, mut y) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if x.metadata()?.len() != y.metadata()?.len() {
        return Ok(false);
    }
    let (mut p, mut q) = (vec![0_u8; 1 << 20], vec![0_u8; 1 << 20]);
    loop {
        let n = read_full(&mut x, &mut p)?;
        let m = read_full(&mut y, &mut q)?;
        if n != m || p[..n] != q[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buffer` is full or the file ends; how much was read.
fn read_full(file: &mut std::fs::File, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Every file of a snapshot, by its path in the repository.
fn snapshot_files(snapshot: &Path) -> HashMap<String, SnapshotFile> {
    let mut out = HashMap::new();
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let at = entry.path();
            let (Ok(kind), Ok(rel)) = (entry.file_type(), at.strip_prefix(snapshot)) else {
                continue;
            };
            let rel = rel.to_string_lossy().into_owned();
            if kind.is_dir() {
                stack.push(at);
            } else if kind.is_symlink() {
                let Ok(target) = std::fs::read_link(&at) else {
                    continue;
                };
                let blob = target
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned();
                let target = at.parent().unwrap_or(snapshot).join(target);
                out.insert(rel, SnapshotFile::Link { blob, target });
            } else if kind.is_file() {
                out.insert(rel, SnapshotFile::Plain(at));
            }
        }
    }
    out
}

/// The path in the repository of a file a load of a Hub model at `commit` reads: a `resolve`
/// URL (`{endpoint}/{org}/{name}/resolve/{commit}/{path}`, each component of the path
/// percent-decoded) or a file in the cache's snapshot of that commit
/// (`.../snapshots/{commit}/{path}`); `None` for any other file. The files a load's tensors
/// name are these, while what changed is listed by repository path.
pub fn repository_path(file: &Path, commit: &str) -> Option<String> {
    let text = file.to_str()?;
    if let Ok(url) = url::Url::parse(text)
        && matches!(url.scheme(), "http" | "https")
    {
        let segments: Vec<&str> = url.path_segments()?.collect();
        let at = segments
            .windows(2)
            .position(|pair| pair[0] == "resolve" && pair[1].eq_ignore_ascii_case(commit))?;
        let rest = segments
            .get(at + 2..)
            .filter(|rest| !rest.is_empty() && rest.iter().all(|p| !p.is_empty()))?;
        let decoded: Option<Vec<String>> = rest
            .iter()
            .map(|part| {
                percent_encoding::percent_decode_str(part)
                    .decode_utf8()
                    .ok()
                    .map(|p| p.into_owned())
            })
            .collect();
        return Some(decoded?.join("/"));
    }
    let parts: Vec<&str> = file
        .components()
        .map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => Some(""),
        })
        .collect::<Option<_>>()?;
    let at = parts
        .windows(2)
        .rposition(|pair| pair[0] == "snapshots" && pair[1].eq_ignore_ascii_case(commit))?;
    let rest = parts
        .get(at + 2..)
        .filter(|rest| !rest.is_empty() && rest.iter().all(|p| !p.is_empty()))?;
    Some(rest.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn a_file_is_named_by_its_path_in_the_repository_whatever_a_url_escapes() {
        let url = |rest: &str| {
            PathBuf::from(format!(
                "http://127.0.0.1:9/pre/org/m/resolve/{COMMIT}/{rest}"
            ))
        };
        for (given, expected) in [
            ("part%202.safetensors", "part 2.safetensors"),
            ("sub/%C3%A9t%C3%A9.safetensors", "sub/été.safetensors"),
            ("a%23b%3Fc.safetensors", "a#b?c.safetensors"),
            ("100%25.safetensors", "100%.safetensors"),
            ("a%2Fb.safetensors", "a/b.safetensors"),
        ] {
            assert_eq!(
                repository_path(&url(given), COMMIT).as_deref(),
                Some(expected),
                "{given}"
            );
        }
        let snapshot = PathBuf::from(format!(
            "/c/models--org--m/snapshots/{COMMIT}/sub/part 2.safetensors"
        ));
        assert_eq!(
            repository_path(&snapshot, COMMIT).as_deref(),
            Some("sub/part 2.safetensors")
        );
        // Another commit's, or not a Hub file at all.
        let other = "f".repeat(40);
        assert_eq!(repository_path(&url("x.safetensors"), &other), None);
        assert_eq!(
            repository_path(Path::new("/tmp/model.safetensors"), COMMIT),
            None
        );
        assert_eq!(repository_path(&url(""), COMMIT), None);
    }

    #[test]
    fn snapshot_files_match_by_blob_or_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = dir.path().join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::write(blobs.join("aaa"), b"same bytes").unwrap();
        std::fs::write(blobs.join("bbb"), b"same bytes").unwrap();
        std::fs::write(blobs.join("ccc"), b"other byte").unwrap();
        let link = |blob: &str| SnapshotFile::Link {
            blob: blob.into(),
            target: blobs.join(blob),
        };
        let plain = |name: &str, bytes: &[u8]| {
            let at = dir.path().join(name);
            std::fs::write(&at, bytes).unwrap();
            SnapshotFile::Plain(at)
        };
        assert!(same_bytes(&link("aaa"), &link("aaa")));
        assert!(
            same_bytes(&link("aaa"), &link("bbb")),
            "two blobs of the same bytes"
        );
        assert!(!same_bytes(&link("aaa"), &link("ccc")));
        assert!(same_bytes(&plain("p1", b"same bytes"), &link("aaa")));
        assert!(
            !same_bytes(&plain("p2", b"other byte"), &link("aaa")),
            "same size, other bytes"
        );
        assert!(!same_bytes(&plain("p3", b"same bytes!"), &link("aaa")));
        assert!(same_bytes(
            &plain("p4", b"same bytes"),
            &plain("p5", b"same bytes")
        ));
        assert!(
            !same_bytes(&link("gone"), &link("aaa")),
            "a dangling link is not known to match"
        );
    }
}
