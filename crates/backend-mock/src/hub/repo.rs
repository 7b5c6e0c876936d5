//! The repositories the fake Hub holds, and everything else a request reads or changes under
//! its one lock ([`State`]): each commit's files (bytes in memory or on disk, with the digests
//! the Hub reports: git blob ids, SHA-256, LFS pointers), the refs, the CDN's blobs, the faults
//! and the log. Nothing here knows HTTP.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::sync::Arc;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::{HubFaults, LFS_THRESHOLD, Logged};

/// The name endings the Hub stores in LFS.
const LFS_SUFFIXES: [&str; 4] = [".safetensors", ".bin", ".pt", ".model"];

/// Whether the Hub stores a file in LFS: by its name's ending (`.safetensors`, `.bin`, `.pt`,
/// `.model`) or its size (at least [`LFS_THRESHOLD`]).
pub fn is_lfs(path: &str, len: usize) -> bool {
    len >= LFS_THRESHOLD || LFS_SUFFIXES.iter().any(|s| path.ends_with(s))
}

/// Git's blob id of `bytes`: the SHA-1 of `blob {len}\0` followed by the bytes, in hex (what
/// the tree API calls `oid`, and the `ETag` of a plain file).
pub fn git_oid(bytes: &[u8]) -> String {
    let mut sha1 = Sha1::new();
    sha1.update(format!("blob {}\0", bytes.len()).as_bytes());
    sha1.update(bytes);
    hex(&sha1.finalize())
}

/// The SHA-256 of `bytes` in hex (an LFS file's `oid`, and its `X-Linked-Etag` unquoted).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Git LFS pointer file that stands in the repo for an LFS file.
pub(super) fn lfs_pointer(sha256: &str, len: impl std::fmt::Display) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len}\n")
}

/// `files` (path, bytes) as a commit's files.
pub(super) fn in_memory(files: &[(&str, Vec<u8>)]) -> BTreeMap<String, Arc<File>> {
    files
        .iter()
        .map(|(path, bytes)| ((*path).to_owned(), Arc::new(File::in_memory(path, bytes))))
        .collect()
}

/// A file's bytes: in memory, or in a file on disk read at each request (a checkpoint of
/// gigabytes is never held).
#[derive(Debug, Clone)]
pub(super) enum Content {
    Memory(Arc<Vec<u8>>),
    Disk(Arc<std::fs::File>, u64),
}

impl Content {
    pub(super) fn len(&self) -> u64 {
        match self {
            Self::Memory(bytes) => bytes.len() as u64,
            Self::Disk(_, len) => *len,
        }
    }

    /// `buf.len()` bytes from `offset` (within the content).
    pub(super) fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Self::Memory(bytes) => {
                let start = usize::try_from(offset).map_err(io::Error::other)?;
                let part = bytes
                    .get(start..start + buf.len())
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(part);
                Ok(())
            }
            Self::Disk(file, _) => std::os::unix::fs::FileExt::read_exact_at(&**file, buf, offset),
        }
    }
}

/// The SHA-256 and git blob id of `content`, read in pieces.
fn digests(content: &Content) -> io::Result<(String, String)> {
    let len = content.len();
    let mut sha256 = Sha256::new();
    let mut sha1 = Sha1::new();
    sha1.update(format!("blob {len}\0").as_bytes());
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0;
    while at < len {
        let n = usize::try_from((len - at).min(buf.len() as u64)).map_err(io::Error::other)?;
        content.read(at, &mut buf[..n])?;
        sha256.update(&buf[..n]);
        sha1.update(&buf[..n]);
        at += n as u64;
    }
    Ok((hex(&sha256.finalize()), hex(&sha1.finalize())))
}

/// One file of a commit.
#[derive(Debug)]
pub(super) struct File {
    pub(super) content: Content,
    /// The git blob id: of the bytes for a plain file, of the LFS pointer for an LFS file.
    pub(super) git_oid: String,
    pub(super) sha256: String,
    pub(super) lfs: bool,
}

impl File {
    pub(super) fn new(path: &str, content: Content) -> io::Result<Self> {
        let (sha256, content_oid) = digests(&content)?;
        let len = usize::try_from(content.len()).map_err(io::Error::other)?;
        let lfs = is_lfs(path, len);
        let git_oid = if lfs {
            git_oid(lfs_pointer(&sha256, len).as_bytes())
        } else {
            content_oid
        };
        Ok(Self {
            content,
            git_oid,
            sha256,
            lfs,
        })
    }

    /// A file held in memory (its digests cannot fail).
    fn in_memory(path: &str, bytes: &[u8]) -> Self {
        let sha256 = sha256_hex(bytes);
        let lfs = is_lfs(path, bytes.len());
        let git_oid = if lfs {
            git_oid(lfs_pointer(&sha256, bytes.len()).as_bytes())
        } else {
            git_oid(bytes)
        };
        Self {
            content: Content::Memory(Arc::new(bytes.to_vec())),
            git_oid,
            sha256,
            lfs,
        }
    }

    pub(super) fn len(&self) -> u64 {
        self.content.len()
    }
}

pub(super) type Files = Arc<BTreeMap<String, Arc<File>>>;

#[derive(Debug, Default)]
pub(super) struct Repo {
    /// Branches and tags -> commit.
    pub(super) refs: BTreeMap<String, String>,
    pub(super) commits: HashMap<String, Files>,
}

impl Repo {
    /// The commit a revision names: a branch, a tag or a commit of the repo.
    pub(super) fn commit_of(&self, rev: &str) -> Option<&str> {
        match self.refs.get(rev) {
            Some(commit) => Some(commit),
            None => self.commits.get_key_value(rev).map(|(c, _)| c.as_str()),
        }
    }
}

/// An LFS file's bytes as the CDN serves them, and the repo paths it is stored under (for the
/// faults, which name paths).
#[derive(Debug)]
pub(super) struct Blob {
    pub(super) content: Content,
    pub(super) etag: String,
    pub(super) paths: BTreeSet<String>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) repos: HashMap<String, Repo>,
    pub(super) gated: HashMap<String, Vec<String>>,
    pub(super) private: HashMap<String, Vec<String>>,
    /// sha256 -> blob.
    pub(super) blobs: HashMap<String, Blob>,
    pub(super) faults: HubFaults,
    /// (CDN path, range) already asked for (`fail_first`).
    pub(super) seen: HashSet<(String, Option<(u64, u64)>)>,
    /// (CDN path, range end) already cut (`truncate_first`).
    pub(super) seen_cut: HashSet<(String, Option<u64>)>,
    /// (repo, path) whose first URL was issued (`expire_once`).
    pub(super) issued: HashSet<(String, String)>,
    pub(super) log: Vec<Logged>,
    /// The `seq` of the next entry logged.
    pub(super) next_seq: u64,
    /// The most entries one page of a tree listing holds.
    pub(super) tree_page: usize,
    /// The path the Hub is served under (`/api/hf`: a mirror's), empty for none.
    pub(super) prefix: String,
    /// Old repo id -> new: a renamed repository, whose old name the Hub answers with a 307 to
    /// the same request under the new name (a relative `Location`).
    pub(super) renamed: HashMap<String, String>,
}

impl State {
    /// Registers `files` as a new commit of `repo_id` after `parent` (none: a new repo), moves
    /// `main` to it, and returns it.
    pub(super) fn commit(
        &mut self,
        repo_id: &str,
        parent: Option<String>,
        files: BTreeMap<String, Arc<File>>,
    ) -> String {
        let mut hasher = Sha256::new();
        hasher.update(format!("repo {repo_id}\n"));
        if let Some(parent) = &parent {
            hasher.update(format!("parent {parent}\n"));
        }
        for (path, file) in &files {
            hasher.update(format!("{path}\0{}\n", file.sha256));
            if file.lfs {
                let blob = self
                    .blobs
                    .entry(file.sha256.clone())
                    .or_insert_with(|| Blob {
                        content: file.content.clone(),
                        // Like S3's (an MD5), 32 hex digits that are not the sha256.
                        etag: sha256_hex(format!("cdn {}", file.sha256).as_bytes())[..32]
                            .to_owned(),
                        paths: BTreeSet::new(),
                    });
                blob.paths.insert(path.clone());
            }
        }
        let commit = hex(&hasher.finalize())[..40].to_owned();
        let repo = if parent.is_some() {
            self.repos.entry(repo_id.to_owned()).or_default()
        } else {
            self.repos.insert(repo_id.to_owned(), Repo::default());
            self.repos.entry(repo_id.to_owned()).or_default()
        };
        repo.commits.insert(commit.clone(), Arc::new(files));
        repo.refs.insert("main".to_owned(), commit.clone());
        commit
    }
}
