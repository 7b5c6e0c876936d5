//! A fake Hugging Face Hub on loopback, for tests of a Hub client against real sockets: the
//! Hub's API (`/api/models/{repo}/revision/{rev}`, `/api/models/{repo}/tree/{rev}[/{path}]`),
//! its `resolve` URLs (plain files served, LFS files redirected with a signed URL), and a
//! second socket that stands for the storage CDN those signed URLs point at. Repos, commits,
//! tags, gated and private repos are registered in memory; the errors carry the Hub's
//! `X-Error-Code` and `X-Error-Message`; faults are scripted (expired URLs, corrupt or cut
//! bodies, redirect loops, 503s, missing files) and one token bucket caps the bytes per second
//! of both sockets together. Every request is logged, with its `Authorization` header, so a
//! test sees whether a login went to the CDN.
//!
//! The protocol is the one `huggingface_hub` 2.4 speaks (models only, no Xet, no pagination);
//! the Python tests' fake Hub answers the same way.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::http::{parse_range, query_param, resolve as resolve_range};

mod control;

/// A file at least this large is stored in LFS whatever its name (10 MiB).
pub const LFS_THRESHOLD: usize = 10 << 20;

/// The entries of one page of a tree listing, unless [`FakeHub::set_tree_page`] says otherwise
/// (the Hub pages long listings; a client follows the `Link` header, whatever the size).
pub const TREE_PAGE: usize = 1000;

/// The most bytes one write of a body sends under a rate cap (and so the token bucket's step).
const CHUNK: usize = 64 << 10;

/// The name endings the Hub stores in LFS.
const LFS_SUFFIXES: [&str; 4] = [".safetensors", ".bin", ".pt", ".model"];

/// Which of the two sockets answered (`"hub"`, `"cdn"` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Server {
    /// The Hub (`HF_ENDPOINT`): the API and `resolve`.
    Hub,
    /// The storage CDN that LFS files are redirected to.
    Cdn,
}

/// One request either socket answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HubLogged {
    /// The socket that answered.
    pub server: Server,
    /// `HEAD`, `GET`, ...
    pub method: String,
    /// The request path without its query (`/org/name/resolve/main/config.json`), as sent
    /// (percent-encoded).
    pub path: String,
    /// Whether the request had a query (`?...`).
    pub has_query: bool,
    /// The byte range asked for, inclusive end as HTTP writes it; open ends (`bytes=10-`,
    /// `bytes=-10`) resolved against the file's length where the file was found.
    pub range: Option<(u64, u64)>,
    /// The status answered.
    pub status: u16,
    /// The request's `Authorization` header, if any (on both sockets: a CDN should never get
    /// one).
    pub authorization: Option<String>,
    /// Body bytes sent so far (each piece counted before it is sent; a `HEAD` sends none).
    pub sent: u64,
}

/// A log entry and its place in the log.
#[derive(Debug)]
struct Logged {
    seq: u64,
    entry: HubLogged,
}

/// What the fake Hub does wrong, on purpose. Paths are paths in a repo (`config.json`,
/// `model-00001-of-00002.safetensors`), in any repo that has them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HubFaults {
    /// Seconds a signed CDN URL stays valid (3600 by default); 0: every URL has expired by the
    /// time it is used.
    pub expire_after: u64,
    /// The first signed URL issued for each file (repo and path) has already expired; later
    /// ones are valid, so a client that resolves again succeeds.
    pub expire_once: bool,
    /// Path -> byte offset: that byte of the file is served XORed with 0xFF, every time,
    /// wherever the file's bytes are served (the CDN for LFS files, `resolve` for the others).
    pub corrupt: HashMap<String, u64>,
    /// Paths whose every `GET` sends its headers and half its body, then closes (the CDN for
    /// LFS files, `resolve` for the others).
    pub truncate: HashSet<String>,
    /// Paths whose `resolve` answers 302 to the same `resolve` URL.
    pub redirect_loop: HashSet<String>,
    /// The first `GET` of each (CDN path, range) answers 503.
    pub fail_first: bool,
    /// The first `GET` of each (CDN path, range end) sends its headers and half its body, then
    /// closes (a client that resumes asks for the rest of the same range, which then comes
    /// whole).
    pub truncate_first: bool,
    /// Paths listed by the tree API but answered 404 `EntryNotFound` by `resolve`.
    pub missing: HashSet<String>,
    /// An outage: every request to the Hub's socket (the API and `resolve`) answers this
    /// status (500, 503 or 504: the Hub down; 429: a rate limit), the CDN still answering.
    pub outage: Option<u16>,
    /// A second hop: the CDN answers a `GET` of a signed URL with a 302 to the same URL on
    /// this host (`localhost`: the same socket by another name), where it then serves it, as
    /// a storage service that sends a client on to another of its hosts.
    pub cdn_hop: Option<String>,
}

impl Default for HubFaults {
    fn default() -> Self {
        Self {
            expire_after: 3600,
            expire_once: false,
            corrupt: HashMap::new(),
            truncate: HashSet::new(),
            redirect_loop: HashSet::new(),
            fail_first: false,
            truncate_first: false,
            missing: HashSet::new(),
            outage: None,
            cdn_hop: None,
        }
    }
}

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
fn lfs_pointer(sha256: &str, len: impl std::fmt::Display) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len}\n")
}

/// `files` (path, bytes) as a commit's files.
fn in_memory(files: &[(&str, Vec<u8>)]) -> BTreeMap<String, Arc<File>> {
    files
        .iter()
        .map(|(path, bytes)| ((*path).to_owned(), Arc::new(File::in_memory(path, bytes))))
        .collect()
}

/// A file's bytes: in memory, or in a file on disk read at each request (a checkpoint of
/// gigabytes is never held).
#[derive(Debug, Clone)]
enum Content {
    Memory(Arc<Vec<u8>>),
    Disk(Arc<std::fs::File>, u64),
}

impl Content {
    fn len(&self) -> u64 {
        match self {
            Self::Memory(bytes) => bytes.len() as u64,
            Self::Disk(_, len) => *len,
        }
    }

    /// `buf.len()` bytes from `offset` (within the content).
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
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
struct File {
    content: Content,
    /// The git blob id: of the bytes for a plain file, of the LFS pointer for an LFS file.
    git_oid: String,
    sha256: String,
    lfs: bool,
}

impl File {
    fn new(path: &str, content: Content) -> io::Result<Self> {
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

    fn len(&self) -> u64 {
        self.content.len()
    }
}

type Files = Arc<BTreeMap<String, Arc<File>>>;

#[derive(Debug, Default)]
struct Repo {
    /// Branches and tags -> commit.
    refs: BTreeMap<String, String>,
    commits: HashMap<String, Files>,
}

impl Repo {
    /// The commit a revision names: a branch, a tag or a commit of the repo.
    fn commit_of(&self, rev: &str) -> Option<&str> {
        match self.refs.get(rev) {
            Some(commit) => Some(commit),
            None => self.commits.get_key_value(rev).map(|(c, _)| c.as_str()),
        }
    }
}

/// An LFS file's bytes as the CDN serves them, and the repo paths it is stored under (for the
/// faults, which name paths).
#[derive(Debug)]
struct Blob {
    content: Content,
    etag: String,
    paths: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct State {
    repos: HashMap<String, Repo>,
    gated: HashMap<String, Vec<String>>,
    private: HashMap<String, Vec<String>>,
    /// sha256 -> blob.
    blobs: HashMap<String, Blob>,
    faults: HubFaults,
    /// (CDN path, range) already asked for (`fail_first`).
    seen: HashSet<(String, Option<(u64, u64)>)>,
    /// (CDN path, range end) already cut (`truncate_first`).
    seen_cut: HashSet<(String, Option<u64>)>,
    /// (repo, path) whose first URL was issued (`expire_once`).
    issued: HashSet<(String, String)>,
    log: Vec<Logged>,
    /// The `seq` of the next entry logged.
    next_seq: u64,
    /// The most entries one page of a tree listing holds.
    tree_page: usize,
    /// The path the Hub is served under (`/api/hf`: a mirror's), empty for none.
    prefix: String,
    /// Old repo id -> new: a renamed repository, whose old name the Hub answers with a 307 to
    /// the same request under the new name (a relative `Location`).
    renamed: HashMap<String, String>,
}

impl State {
    /// Registers `files` as a new commit of `repo_id` after `parent` (none: a new repo), moves
    /// `main` to it, and returns it.
    fn commit(
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

/// One token bucket for every connection of both sockets.
#[derive(Debug)]
struct Bucket {
    rate: Option<u64>,
    /// May go negative: a connection that takes more than there is waits for the debt.
    tokens: f64,
    last: Instant,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    bucket: Mutex<Bucket>,
    stop: AtomicBool,
    hub: SocketAddr,
    cdn: SocketAddr,
    /// Signs the CDN URLs.
    secret: String,
    /// Every open connection, to shut down when the server stops.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The most bytes one write of a body sends: 64 KiB under a rate cap (the bucket's
    /// step), 1 MiB without.
    fn piece(&self) -> usize {
        if lock(&self.bucket).rate.is_some() {
            CHUNK
        } else {
            1 << 20
        }
    }

    /// Counts `n` more body bytes sent for the log entry `seq` (gone if the log was cleared).
    fn count_sent(&self, seq: u64, n: u64) {
        let mut state = self.state();
        let at = state.log.partition_point(|l| l.seq < seq);
        if let Some(logged) = state.log.get_mut(at).filter(|l| l.seq == seq) {
            logged.entry.sent += n;
        }
    }

    /// Waits until `n` more bytes may be sent under the rate cap (at once without one). The
    /// bucket holds at most 20 ms of credit (or 64 KiB), so a sender that overslept catches
    /// up, and over a second or more the bytes sent are the rate's.
    fn throttle(&self, n: u64) -> io::Result<()> {
        let wait = {
            let mut bucket = lock(&self.bucket);
            let Some(rate) = bucket.rate else {
                return Ok(());
            };
            let rate = rate.max(1) as f64;
            let now = Instant::now();
            let refill = now.duration_since(bucket.last).as_secs_f64() * rate;
            bucket.tokens = (bucket.tokens + refill).min((rate * 0.02).max(CHUNK as f64));
            bucket.last = now;
            bucket.tokens -= n as f64;
            if bucket.tokens >= 0.0 {
                return Ok(());
            }
            Duration::try_from_secs_f64(-bucket.tokens / rate).unwrap_or(Duration::from_secs(3600))
        };
        let start = Instant::now();
        while let Some(left) = wait.checked_sub(start.elapsed()) {
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("the fake Hub stopped"));
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
        Ok(())
    }

    /// The signature of a CDN URL for `path` that expires at `expires` after being valid for
    /// `life` seconds (every parameter signed, as S3 signs its query).
    fn sign(&self, path: &str, expires: u64, life: u64) -> String {
        sha256_hex(format!("{path}\n{expires}\n{life}\n{}", self.secret).as_bytes())
    }
}

/// The fake Hub: two loopback sockets, the Hub and its CDN. It stops when dropped: both
/// listeners close, open connections are shut down, and every thread is joined.
#[derive(Debug)]
pub struct FakeHub {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl FakeHub {
    /// Starts both sockets on ephemeral loopback ports.
    pub fn start() -> io::Result<Self> {
        let hub = TcpListener::bind("127.0.0.1:0")?;
        let cdn = TcpListener::bind("127.0.0.1:0")?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                tree_page: TREE_PAGE,
                ..State::default()
            }),
            bucket: Mutex::new(Bucket {
                rate: None,
                tokens: 0.0,
                last: Instant::now(),
            }),
            stop: AtomicBool::new(false),
            hub: hub.local_addr()?,
            cdn: cdn.local_addr()?,
            secret: sha256_hex(format!("secret {nanos} {}", std::process::id()).as_bytes()),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        });
        let threads = [(hub, Server::Hub), (cdn, Server::Cdn)]
            .into_iter()
            .map(|(listener, server)| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || accept(&listener, server, &shared))
            })
            .collect();
        Ok(Self { shared, threads })
    }

    /// The Hub's URL, `http://127.0.0.1:PORT` and its path prefix if one is set (what
    /// `HF_ENDPOINT` is set to).
    pub fn endpoint(&self) -> String {
        format!("http://{}{}", self.shared.hub, self.shared.state().prefix)
    }

    /// Serves the Hub under `prefix` (`/api/huggingfaceml/hf`, as an Artifactory or Nexus
    /// mirror is addressed): a request whose path does not start with it is answered 404.
    /// `""` serves it at the root again.
    pub fn set_prefix(&self, prefix: &str) {
        self.shared.state().prefix = prefix.trim_end_matches('/').to_owned();
    }

    /// Renames `old` to `new` (registered under `new` from now on): requests naming `old` are
    /// answered 307 to the same request naming `new`, with a relative `Location`, as the Hub
    /// answers a renamed repository.
    pub fn rename(&self, old: &str, new: &str) {
        let mut state = self.shared.state();
        if let Some(repo) = state.repos.remove(old) {
            state.repos.insert(new.to_owned(), repo);
        }
        state.renamed.insert(old.to_owned(), new.to_owned());
    }

    /// Pages tree listings by `entries` (at least 1) from the next request on.
    pub fn set_tree_page(&self, entries: usize) {
        self.shared.state().tree_page = entries.max(1);
    }

    /// The CDN's URL, `http://127.0.0.1:PORT` (another port: another host).
    pub fn cdn(&self) -> String {
        format!("http://{}", self.shared.cdn)
    }

    /// Registers `repo_id` (`org/name` or `name`) with one commit of `files` (path in the repo,
    /// bytes), `main` at it, and returns that commit (40 hex digits). A repo registered before
    /// under that id is replaced (its gate and privacy stay).
    pub fn add_repo(&self, repo_id: &str, files: &[(&str, Vec<u8>)]) -> String {
        self.shared.state().commit(repo_id, None, in_memory(files))
    }

    /// Adds a newer commit to `repo_id` (registering the repo if it is new) whose files are
    /// exactly `files` (a whole snapshot, not changes), moves `main` to it and returns it. The
    /// older commits stay reachable by their id (and by their tags).
    pub fn add_commit(&self, repo_id: &str, files: &[(&str, Vec<u8>)]) -> String {
        self.commit_files(repo_id, in_memory(files), false)
    }

    /// As [`add_repo`](Self::add_repo) (`new_repo`) or [`add_commit`](Self::add_commit), with
    /// the files of the directory `dir`, walked recursively (`.git/` left out): LFS files are
    /// read from disk at each request (a checkpoint of gigabytes is never held in memory), the
    /// others held. An error when `dir` cannot be read.
    pub fn commit_dir(&self, repo_id: &str, dir: &Path, new_repo: bool) -> io::Result<String> {
        let mut files = BTreeMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(at) = stack.pop() {
            for entry in std::fs::read_dir(&at)? {
                let path = entry?.path();
                let rel = path.strip_prefix(dir).map_err(io::Error::other)?;
                let name = rel
                    .to_str()
                    .ok_or_else(|| io::Error::other(format!("{} is not UTF-8", rel.display())))?
                    .replace(std::path::MAIN_SEPARATOR, "/");
                if name == ".git" || name.starts_with(".git/") {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let handle = std::fs::File::open(&path)?;
                let len = handle.metadata()?.len();
                let content = if is_lfs(&name, usize::try_from(len).unwrap_or(usize::MAX)) {
                    Content::Disk(Arc::new(handle), len)
                } else {
                    Content::Memory(Arc::new(std::fs::read(&path)?))
                };
                files.insert(name.clone(), Arc::new(File::new(&name, content)?));
            }
        }
        Ok(self.commit_files(repo_id, files, new_repo))
    }

    fn commit_files(
        &self,
        repo_id: &str,
        files: BTreeMap<String, Arc<File>>,
        new_repo: bool,
    ) -> String {
        let mut state = self.shared.state();
        let parent = state
            .repos
            .get(repo_id)
            .filter(|_| !new_repo)
            .and_then(|repo| repo.refs.get("main").cloned());
        state.commit(repo_id, parent, files)
    }

    /// Points the branch or tag `name` of `repo_id` at `commit` (a commit of the repo, or a
    /// revision name that resolves to one). `NotFound` if the repo or the commit is unknown.
    pub fn tag(&self, repo_id: &str, name: &str, commit: &str) -> io::Result<()> {
        let mut state = self.shared.state();
        let repo = state
            .repos
            .get_mut(repo_id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no repo {repo_id}")))?;
        let commit = repo.commit_of(commit).map(str::to_owned).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no commit {commit} in {repo_id}"),
            )
        })?;
        repo.refs.insert(name.to_owned(), commit);
        Ok(())
    }

    /// Gates `repo_id`: `resolve` answers 401 `GatedRepo` without a token and 403 with a token
    /// not in `tokens`; the revision and tree API answer as usual (`"gated": "auto"`).
    pub fn gate(&self, repo_id: &str, tokens: &[&str]) {
        let tokens = tokens.iter().map(|t| (*t).to_owned()).collect();
        self.shared.state().gated.insert(repo_id.to_owned(), tokens);
    }

    /// Makes `repo_id` private: without one of `tokens`, every endpoint answers 401
    /// `RepoNotFound` (the Hub does not say a private repo exists).
    pub fn make_private(&self, repo_id: &str, tokens: &[&str]) {
        let tokens = tokens.iter().map(|t| (*t).to_owned()).collect();
        self.shared
            .state()
            .private
            .insert(repo_id.to_owned(), tokens);
    }

    /// The faults in force.
    pub fn faults(&self) -> HubFaults {
        self.shared.state().faults.clone()
    }

    /// Sets the faults, effective from the next request, and forgets which URLs were issued
    /// (`expire_once`) and which ranges were asked for (`fail_first`).
    pub fn set_faults(&self, faults: HubFaults) {
        let mut state = self.shared.state();
        state.faults = faults;
        state.seen.clear();
        state.seen_cut.clear();
        state.issued.clear();
    }

    /// Caps the bytes per second of every body sent, by both sockets together (`None`: no
    /// cap; `Some(0)` is one byte per second). Effective from the next 64 KiB.
    pub fn set_rate(&self, bytes_per_second: Option<u64>) {
        let mut bucket = lock(&self.shared.bucket);
        bucket.rate = bytes_per_second;
        bucket.tokens = 0.0;
        bucket.last = Instant::now();
    }

    /// Every request answered so far, both sockets, in order.
    pub fn log(&self) -> Vec<HubLogged> {
        let state = self.shared.state();
        state.log.iter().map(|l| l.entry.clone()).collect()
    }

    /// Forgets the log.
    pub fn clear_log(&self) {
        self.shared.state().log.clear();
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for conn in lock(&self.shared.conns).values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        // Wakes the accept loops so they see the flag.
        let _ = TcpStream::connect(self.shared.hub);
        let _ = TcpStream::connect(self.shared.cdn);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until the server stops, a thread each; then joins them.
fn accept(listener: &TcpListener, server: Server, shared: &Arc<Shared>) {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            // Registered under the lock `drop` sweeps with, after checking the flag it sets
            // first: a connection is either shut down by `drop` or never served.
            let mut conns = lock(&shared.conns);
            if shared.stop.load(Ordering::Acquire) {
                break;
            }
            if let Ok(clone) = stream.try_clone() {
                conns.insert(id, clone);
            }
        }
        threads.retain(|t| !t.is_finished());
        let shared = Arc::clone(shared);
        threads.push(std::thread::spawn(move || {
            let _ = serve(stream, server, &shared);
            lock(&shared.conns).remove(&id);
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
}

/// One request as read.
#[derive(Debug)]
struct Request {
    method: String,
    /// Path and query as sent.
    target: String,
    path: String,
    query: Option<String>,
    range: Option<(u64, u64)>,
    authorization: Option<String>,
    close: bool,
}

impl Request {
    /// The token of `Authorization: Bearer <token>`.
    fn token(&self) -> Option<&str> {
        let value = self.authorization.as_deref()?;
        let (scheme, token) = value.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then_some(token.trim())
    }
}

/// Reads one request (its body, if it has one, is read and dropped); `None` at end of stream.
fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut line = String::new();
    while line.trim().is_empty() {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let target = parts.next().unwrap_or("/");
    // The absolute form (`GET http://host:port/path`) names the same path.
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
        None => target,
    };
    let mut close = parts.next() == Some("HTTP/1.0");
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (target, None),
    };
    let mut request = Request {
        method,
        target: target.to_owned(),
        path: path.to_owned(),
        query,
        range: None,
        authorization: None,
        close: false,
    };
    let mut body_len = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            return Ok(None);
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => request.range = parse_range(value),
                "authorization" => request.authorization = Some(value.to_owned()),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                "content-length" => body_len = value.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    io::copy(&mut reader.take(body_len), &mut io::sink())?;
    request.close = close;
    Ok(Some(request))
}

/// A path segment, percent-decoded (`+` is not a space in a path).
fn decode_segment(text: &str) -> String {
    crate::http::percent_decode(text, false)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response's body.
#[derive(Debug)]
enum Body {
    Owned(Vec<u8>),
    /// `content[start..end]` of a file.
    Slice(Content, u64, u64),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Owned(bytes) => bytes.len() as u64,
            Body::Slice(_, start, end) => end - start,
        }
    }
}

/// One answer, before it is written.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Body,
    /// The range served, open ends resolved (for the log).
    range: Option<(u64, u64)>,
    /// Send the headers and half the body, then close.
    cut: bool,
    /// The body's byte at this index is sent XORed with 0xFF.
    corrupt: Option<u64>,
}

impl Response {
    fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Owned(Vec::new()),
            range: None,
            cut: false,
            corrupt: None,
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn json(status: u16, value: &Value) -> Self {
        let mut response =
            Self::new(status).header("Content-Type", "application/json; charset=utf-8");
        response.body = Body::Owned(value.to_string().into_bytes());
        response
    }

    /// The Hub's error: `X-Error-Code`, `X-Error-Message` and `{"error": message}`.
    fn hub_error(status: u16, code: &str, message: &str) -> Self {
        Self::json(status, &json!({ "error": message }))
            .header("X-Error-Code", code)
            .header("X-Error-Message", message)
    }

    /// S3's error document.
    fn s3_error(status: u16, code: &str, message: &str) -> Self {
        let mut response = Self::new(status).header("Content-Type", "application/xml");
        response.body = Body::Owned(
            format!("<Error><Code>{code}</Code><Message>{message}</Message></Error>").into_bytes(),
        );
        response
    }

    /// A file's bytes, or the range of them asked for (206), or 416.
    fn file(content: &Content, range: Option<(u64, u64)>) -> Self {
        let total = content.len();
        let Some(range) = range else {
            let mut response = Self::new(200);
            response.body = Body::Slice(content.clone(), 0, total);
            return response;
        };
        let (a, b) = resolve_range(range, total);
        if a > b || b >= total {
            let mut response = Self::new(416).header("Content-Range", format!("bytes */{total}"));
            response.range = Some((a, b));
            return response;
        }
        let mut response = Self::new(206).header("Content-Range", format!("bytes {a}-{b}/{total}"));
        response.body = Body::Slice(content.clone(), a, b + 1);
        response.range = Some((a, b));
        response
    }

    /// Applies the `corrupt` and `truncate` faults of the files at `paths` to a file body.
    fn faulted<'a>(
        mut self,
        faults: &HubFaults,
        paths: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let Body::Slice(_, start, end) = self.body else {
            return self;
        };
        let paths: Vec<&String> = paths.into_iter().collect();
        self.cut = paths.iter().any(|p| faults.truncate.contains(*p));
        self.corrupt = paths
            .iter()
            .find_map(|p| faults.corrupt.get(*p))
            .filter(|&&at| at >= start && at < end)
            .map(|at| at - start);
        self
    }

    /// Writes the answer (only its headers to a `HEAD`); `false` if the connection must close.
    /// Each piece of the body is counted in the log entry `seq` before it is sent, so a client
    /// that has the bytes finds them counted. A file on disk goes by `sendfile` (no copy
    /// through this process) where no byte of the piece is to be corrupted.
    fn write(
        self,
        out: &mut BufWriter<TcpStream>,
        head: bool,
        shared: &Shared,
        seq: u64,
    ) -> io::Result<bool> {
        let len = self.body.len();
        let mut text = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str(&format!("Content-Length: {len}\r\n\r\n"));
        out.write_all(text.as_bytes())?;
        if head {
            out.flush()?;
            return Ok(true);
        }
        let (content, start) = match &self.body {
            Body::Owned(bytes) => {
                shared.count_sent(seq, len);
                out.write_all(bytes)?;
                out.flush()?;
                return Ok(true);
            }
            Body::Slice(content, start, _) => (content, *start),
        };
        let sent = if self.cut { len / 2 } else { len };
        let mut buf = Vec::new();
        let mut done = 0;
        while done < sent {
            let piece = (sent - done).min(shared.piece() as u64);
            shared.throttle(piece)?;
            shared.count_sent(seq, piece);
            let at = start + done;
            let corrupt = self.corrupt.filter(|&c| c >= done && c < done + piece);
            match (content, corrupt) {
                (Content::Disk(file, _), None) => {
                    out.flush()?;
                    send_file(out.get_ref(), file, at, piece)?;
                }
                (Content::Memory(bytes), None) => {
                    let range = usize::try_from(at).map_err(io::Error::other)?
                        ..usize::try_from(at + piece).map_err(io::Error::other)?;
                    out.write_all(bytes.get(range).unwrap_or(&[]))?;
                }
                (_, corrupt) => {
                    buf.resize(usize::try_from(piece).map_err(io::Error::other)?, 0);
                    content.read(at, &mut buf)?;
                    if let Some(c) = corrupt
                        && let Some(byte) =
                            usize::try_from(c - done).ok().and_then(|i| buf.get_mut(i))
                    {
                        *byte ^= 0xFF;
                    }
                    out.write_all(&buf)?;
                }
            }
            done += piece;
        }
        out.flush()?;
        Ok(!self.cut)
    }
}

/// Sends `len` bytes of `file` from `offset` on `socket`, by `sendfile`.
fn send_file(socket: &TcpStream, file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    let mut offset = offset;
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(1 << 30)).map_err(io::Error::other)?;
        let sent = rustix::fs::sendfile(socket, file, Some(&mut offset), want)?;
        if sent == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file is shorter than when it was registered",
            ));
        }
        left -= sent as u64;
    }
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        307 => "Temporary Redirect",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        416 => "Range Not Satisfiable",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn serve(stream: TcpStream, server: Server, shared: &Shared) -> io::Result<()> {
    // Each answer's headers and small bodies go in one write: without TCP_NODELAY a response
    // split over several small writes waits on the client's delayed ACK.
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = BufWriter::with_capacity(CHUNK, stream);
    while let Some(request) = read_request(&mut reader)? {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let (response, seq) = {
            let mut state = shared.state();
            let response = match server {
                Server::Hub => route_hub(shared, &mut state, &request),
                Server::Cdn => route_cdn(shared, &mut state, &request),
            };
            let seq = state.next_seq;
            state.next_seq += 1;
            state.log.push(Logged {
                seq,
                entry: HubLogged {
                    server,
                    method: request.method.clone(),
                    path: request.path.clone(),
                    has_query: request.query.is_some(),
                    range: response.range.or(request.range),
                    status: response.status,
                    authorization: request.authorization.clone(),
                    sent: 0,
                },
            });
            (response, seq)
        };
        let keep = response.write(&mut out, request.method == "HEAD", shared, seq)?;
        if !keep || request.close {
            return Ok(());
        }
    }
    Ok(())
}

/// Splits `segments` into a repo id (one or two segments), the endpoint word after it (one of
/// `kinds`) and the rest. Prefers a registered repo; else the two-segment reading.
fn split_repo<'a>(
    state: &State,
    segments: &'a [String],
    kinds: &[&str],
) -> Option<(String, &'a str, &'a [String])> {
    let mut found = None;
    for n in [2, 1] {
        if let Some(kind) = segments.get(n)
            && kinds.contains(&kind.as_str())
            && segments[..n].iter().all(|s| !s.is_empty())
        {
            let candidate = (segments[..n].join("/"), kind.as_str(), &segments[n + 1..]);
            if state.repos.contains_key(&candidate.0) {
                return Some(candidate);
            }
            found.get_or_insert(candidate);
        }
    }
    found
}

fn repo_not_found(status: u16) -> Response {
    Response::hub_error(status, "RepoNotFound", "Repository not found")
}

fn revision_not_found(rev: &str) -> Response {
    Response::hub_error(404, "RevisionNotFound", &format!("Invalid rev id: {rev}"))
}

fn route_hub(shared: &Shared, state: &mut State, request: &Request) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::new(405);
    }
    if let Some(status) = state.faults.outage {
        let (code, message) = match status {
            429 => ("RateLimited", "You have been rate-limited"),
            _ => ("ServiceUnavailable", "The service is unavailable"),
        };
        return Response::hub_error(status, code, message);
    }
    let Some(path) = request.path.strip_prefix(state.prefix.as_str()) else {
        return Response::hub_error(404, "NotFound", "Not Found");
    };
    if !state.prefix.is_empty() && !path.is_empty() && !path.starts_with('/') {
        return Response::hub_error(404, "NotFound", "Not Found");
    }
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(decode_segment)
        .collect();
    if let Some(moved) = renamed(state, &segments) {
        let query = request
            .query
            .as_ref()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        return Response::new(307).header("Location", format!("{}{moved}{query}", state.prefix));
    }
    if let Some(rest) = segments.strip_prefix(&["api".to_owned(), "models".to_owned()]) {
        return match split_repo(state, rest, &["revision", "tree"]) {
            Some((repo_id, "revision", [rev])) => api(shared, state, request, &repo_id, rev, None),
            Some((repo_id, "tree", [rev, path @ ..])) => {
                api(shared, state, request, &repo_id, rev, Some(&path.join("/")))
            }
            // `/api/models/{repo}`: the repo at `main`.
            None if (1..=2).contains(&rest.len()) => {
                api(shared, state, request, &rest.join("/"), "main", None)
            }
            _ => Response::hub_error(404, "NotFound", "Not Found"),
        };
    }
    match split_repo(state, &segments, &["resolve"]) {
        Some((repo_id, _, [rev, path @ ..])) if !path.is_empty() => {
            resolve(shared, state, request, &repo_id, rev, &path.join("/"))
        }
        _ => Response::hub_error(404, "NotFound", "Not Found"),
    }
}

/// The path `segments` (decoded) name under a repository's new name, if they name a renamed
/// one (`/api/models/{old}/...` or `/{old}/resolve/...`), encoded as the Hub writes a path.
fn renamed(state: &State, segments: &[String]) -> Option<String> {
    let (api, rest) = match segments {
        [a, m, rest @ ..] if a == "api" && m == "models" => (true, rest),
        rest => (false, rest),
    };
    for n in [2, 1] {
        let (Some(id), Some(tail)) = (rest.get(..n), rest.get(n..)) else {
            continue;
        };
        if let Some(new) = state.renamed.get(&id.join("/")) {
            let encode = |s: &String| crate::http::percent_encode_segment(s);
            let tail: Vec<String> = tail.iter().map(encode).collect();
            let head = if api { "/api/models/" } else { "/" };
            return Some(format!("{head}{new}/{}", tail.join("/")));
        }
    }
    None
}

/// The repo if it exists and the request may see it.
fn visible<'s>(state: &'s State, repo_id: &str, request: &Request) -> Result<&'s Repo, Response> {
    let repo = state
        .repos
        .get(repo_id)
        .ok_or_else(|| repo_not_found(404))?;
    if let Some(tokens) = state.private.get(repo_id)
        && !request
            .token()
            .is_some_and(|t| tokens.iter().any(|k| k == t))
    {
        return Err(repo_not_found(401));
    }
    Ok(repo)
}

/// The revision endpoint (`tree` None) or the tree endpoint (`tree` the directory, "" for the
/// root).
fn api(
    shared: &Shared,
    state: &State,
    request: &Request,
    repo_id: &str,
    rev: &str,
    tree: Option<&str>,
) -> Response {
    let repo = match visible(state, repo_id, request) {
        Ok(repo) => repo,
        Err(response) => return response,
    };
    let Some((commit, files)) = repo
        .commit_of(rev)
        .and_then(|c| repo.commits.get_key_value(c))
    else {
        return revision_not_found(rev);
    };
    let Some(dir) = tree else {
        let siblings: Vec<Value> = files.keys().map(|p| json!({ "rfilename": p })).collect();
        let gated = if state.gated.contains_key(repo_id) {
            json!("auto")
        } else {
            json!(false)
        };
        return Response::json(
            200,
            &json!({
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "siblings": siblings,
                "private": state.private.contains_key(repo_id),
                "gated": gated,
            }),
        )
        .header("X-Repo-Commit", commit.clone());
    };
    let recursive = request
        .query
        .as_deref()
        .and_then(|q| query_param(q, "recursive"))
        .is_some_and(|v| v == "true" || v == "1");
    let dir = dir.trim_matches('/');
    match tree_listing(files, dir, recursive) {
        Some(entries) => tree_page(shared, state, request, entries),
        None => Response::hub_error(
            404,
            "EntryNotFound",
            &format!("{dir} does not exist on \"{rev}\""),
        )
        .header("X-Repo-Commit", commit.clone()),
    }
}

/// One page of a tree listing: `tree_page` entries from the request's `cursor` (the first
/// page without one), and a `Link: <URL>; rel="next"` to the next page (the same request with
/// its `cursor`) while there are more, as the Hub paginates a long listing.
fn tree_page(shared: &Shared, state: &State, request: &Request, entries: Vec<Value>) -> Response {
    let query = request.query.as_deref().unwrap_or("");
    let start: usize = match query_param(query, "cursor") {
        None => 0,
        Some(cursor) => match cursor.strip_prefix("page-").and_then(|n| n.parse().ok()) {
            Some(start) => start,
            None => return Response::hub_error(400, "BadRequest", "Invalid cursor"),
        },
    };
    let page = state.tree_page.max(1);
    let end = entries.len().min(start.saturating_add(page));
    let shown: Vec<Value> = entries
        .get(start..end)
        .map(<[Value]>::to_vec)
        .unwrap_or_default();
    let response = Response::json(200, &Value::Array(shown));
    if end >= entries.len() {
        return response;
    }
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("cursor="))
        .collect();
    let cursor = format!("cursor=page-{end}");
    pairs.push(&cursor);
    let next = format!("http://{}{}?{}", shared.hub, request.path, pairs.join("&"));
    response.header("Link", format!("<{next}>; rel=\"next\""))
}

/// The tree API's entries under `dir` ("" for the root), sorted by path; `None` if `dir` is
/// not a directory of the commit.
fn tree_listing(
    files: &BTreeMap<String, Arc<File>>,
    dir: &str,
    recursive: bool,
) -> Option<Vec<Value>> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    let mut any = false;
    for (path, file) in files.range(prefix.clone()..) {
        let Some(rel) = path.strip_prefix(&prefix) else {
            break;
        };
        any = true;
        // Each directory on the way to the file.
        for (at, _) in rel.match_indices('/') {
            let first = !rel[..at].contains('/');
            if recursive || first {
                let dir_path = format!("{prefix}{}", &rel[..at]);
                let oid = sha256_hex(format!("tree {dir_path}").as_bytes())[..40].to_owned();
                entries.entry(dir_path.clone()).or_insert_with(
                    || json!({ "type": "directory", "oid": oid, "size": 0, "path": dir_path }),
                );
            }
        }
        if recursive || !rel.contains('/') {
            let mut entry = json!({
                "type": "file",
                "oid": file.git_oid,
                "size": file.len(),
                "path": path,
            });
            if file.lfs {
                let pointer = lfs_pointer(&file.sha256, file.len());
                entry["lfs"] = json!({
                    "oid": file.sha256,
                    "size": file.len(),
                    "pointerSize": pointer.len(),
                });
            }
            entries.insert(path.clone(), entry);
        }
    }
    (any || dir.is_empty()).then(|| entries.into_values().collect())
}

/// `HEAD` or `GET /{repo}/resolve/{rev}/{path}`.
fn resolve(
    shared: &Shared,
    state: &mut State,
    request: &Request,
    repo_id: &str,
    rev: &str,
    path: &str,
) -> Response {
    let repo = match visible(state, repo_id, request) {
        Ok(repo) => repo,
        Err(response) => return response,
    };
    if let Some(tokens) = state.gated.get(repo_id) {
        let restricted = match request.token() {
            None => Some((
                401,
                format!(
                    "Access to model {repo_id} is restricted. You must have access to it and \
                     be authenticated to access it. Please log in."
                ),
            )),
            Some(token) if !tokens.iter().any(|t| t == token) => Some((
                403,
                format!(
                    "Access to model {repo_id} is restricted and you are not in the authorized \
                     list. Visit https://huggingface.co/{repo_id} to ask for access."
                ),
            )),
            Some(_) => None,
        };
        if let Some((status, message)) = restricted {
            return Response::hub_error(status, "GatedRepo", &message);
        }
    }
    let Some((commit, files)) = repo
        .commit_of(rev)
        .and_then(|c| repo.commits.get_key_value(c))
    else {
        return revision_not_found(rev);
    };
    let (commit, files) = (commit.clone(), Arc::clone(files));
    let faults = &state.faults;
    let file = match files.get(path) {
        Some(file) if !faults.missing.contains(path) => file,
        _ => {
            return Response::hub_error(404, "EntryNotFound", "Entry not found")
                .header("X-Repo-Commit", commit);
        }
    };
    if faults.redirect_loop.contains(path) {
        return Response::new(302)
            .header(
                "Location",
                format!("http://{}{}", shared.hub, request.target),
            )
            .header("X-Repo-Commit", commit);
    }
    if !file.lfs {
        let paths = [path.to_owned()];
        return Response::file(&file.content, request.range)
            .faulted(faults, paths.iter())
            .header("ETag", format!("\"{}\"", file.git_oid))
            .header("X-Repo-Commit", commit)
            .header("Accept-Ranges", "bytes")
            .header("Content-Type", "application/octet-stream");
    }
    let expire_after = faults.expire_after;
    let now = unix_now();
    let first = state.issued.insert((repo_id.to_owned(), path.to_owned()));
    let expires = if state.faults.expire_once && first {
        now.saturating_sub(1)
    } else {
        now.saturating_add(expire_after)
    };
    let cdn_path = format!("/repos/{}", file.sha256);
    let signature = shared.sign(&cdn_path, expires, expire_after);
    Response::new(302)
        .header(
            "Location",
            format!(
                "http://{}{cdn_path}?X-Amz-Expires={expire_after}&Expires={expires}&X-Amz-Signature={signature}",
                shared.cdn
            ),
        )
        .header("X-Linked-Etag", format!("\"{}\"", file.sha256))
        .header("X-Linked-Size", file.len().to_string())
        .header("X-Repo-Commit", commit)
        .header("ETag", format!("\"{}\"", file.git_oid))
}

/// `HEAD` or `GET /repos/<sha256>?<signed query>` at the CDN.
fn route_cdn(shared: &Shared, state: &mut State, request: &Request) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::s3_error(
            405,
            "MethodNotAllowed",
            "The specified method is not allowed",
        );
    }
    let query = request.query.as_deref().unwrap_or("");
    let number = |name| query_param(query, name).and_then(|e| e.parse::<u64>().ok());
    let signature = query_param(query, "X-Amz-Signature");
    let Some(expires) = number("Expires").filter(|&e| {
        number("X-Amz-Expires").is_some_and(|life| {
            signature.as_deref() == Some(shared.sign(&request.path, e, life).as_str())
        })
    }) else {
        return Response::s3_error(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        );
    };
    if unix_now() >= expires {
        return Response::s3_error(403, "AccessDenied", "Request has expired");
    }
    if let Some(host) = state.faults.cdn_hop.as_deref()
        && query_param(query, "hop").is_none()
    {
        let port = shared.cdn.port();
        return Response::new(302).header(
            "Location",
            format!("http://{host}:{port}{}?{query}&hop=1", request.path),
        );
    }
    let sha = request.path.strip_prefix("/repos/").unwrap_or("");
    if !state.blobs.contains_key(sha) {
        return Response::s3_error(404, "NoSuchKey", "The specified key does not exist.");
    }
    if request.method == "GET"
        && state.faults.fail_first
        && state.seen.insert((request.path.clone(), request.range))
    {
        return Response::s3_error(503, "SlowDown", "Please reduce your request rate.");
    }
    let Some(blob) = state.blobs.get(sha) else {
        return Response::s3_error(404, "NoSuchKey", "The specified key does not exist.");
    };
    let response = Response::file(&blob.content, request.range)
        .header("ETag", format!("\"{}\"", blob.etag))
        .header("Accept-Ranges", "bytes")
        .header("Content-Type", "application/octet-stream");
    if request.method == "GET" {
        let cut_once = state.faults.truncate_first
            && state
                .seen_cut
                .insert((request.path.clone(), request.range.map(|(_, end)| end)));
        let mut response = response.faulted(&state.faults, blob.paths.iter());
        response.cut |= cut_once;
        response
    } else {
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One answer as a raw client reads it.
    #[derive(Debug)]
    pub(super) struct Reply {
        pub(super) status: u16,
        headers: Vec<(String, String)>,
        pub(super) body: Vec<u8>,
    }

    impl Reply {
        pub(super) fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        fn json(&self) -> Value {
            serde_json::from_slice(&self.body).unwrap()
        }
    }

    /// `(host:port, /target)` of `http://host:port/target`.
    fn split_url(url: &str) -> (String, String) {
        let rest = url.strip_prefix("http://").unwrap();
        let at = rest.find('/').unwrap_or(rest.len());
        (rest[..at].to_owned(), rest[at..].to_owned())
    }

    fn send(stream: &mut TcpStream, method: &str, target: &str, headers: &[(&str, &str)]) {
        let mut text = format!("{method} {target} HTTP/1.1\r\nHost: test\r\n");
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        stream.write_all(text.as_bytes()).unwrap();
    }

    /// Reads one answer: its headers, then `Content-Length` bytes or up to the end of stream.
    fn read_reply(reader: &mut BufReader<TcpStream>, head: bool) -> Reply {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        let mut reply = Reply {
            status,
            headers,
            body: Vec::new(),
        };
        if !head {
            let len: u64 = reply.header("Content-Length").unwrap().parse().unwrap();
            reader.take(len).read_to_end(&mut reply.body).unwrap();
        }
        reply
    }

    /// One request on a new connection to `url`.
    fn call(method: &str, url: &str, headers: &[(&str, &str)]) -> Reply {
        let (host, target) = split_url(url);
        let mut stream = TcpStream::connect(host).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        send(&mut stream, method, &target, headers);
        read_reply(&mut BufReader::new(stream), method == "HEAD")
    }

    pub(super) fn get(url: &str) -> Reply {
        call("GET", url, &[])
    }

    fn error_code(reply: &Reply) -> (u16, &str, &str) {
        (
            reply.status,
            reply.header("X-Error-Code").unwrap_or(""),
            reply.header("X-Error-Message").unwrap_or(""),
        )
    }

    const CONFIG: &[u8] = b"{\"hidden_size\": 8}\n";

    fn weights() -> Vec<u8> {
        (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// A hub with `org/model`: config.json, 1_Pooling/config.json and one LFS file.
    fn hub() -> (FakeHub, String) {
        let hub = FakeHub::start().unwrap();
        let commit = hub.add_repo(
            "org/model",
            &[
                ("config.json", CONFIG.to_vec()),
                ("1_Pooling/config.json", b"{}".to_vec()),
                ("model.safetensors", weights()),
            ],
        );
        (hub, commit)
    }

    fn location(hub: &FakeHub, repo: &str, path: &str, headers: &[(&str, &str)]) -> String {
        let reply = call(
            "HEAD",
            &format!("{}/{repo}/resolve/main/{path}", hub.endpoint()),
            headers,
        );
        assert_eq!(reply.status, 302, "{reply:?}");
        reply.header("Location").unwrap().to_owned()
    }

    #[test]
    fn hub_git_oid_and_sha256_match_git_and_sha256sum() {
        // `git hash-object` of an empty file and of "hello\n".
        assert_eq!(git_oid(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        assert_eq!(
            git_oid(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(is_lfs("a/model.safetensors", 1));
        assert!(is_lfs("pytorch_model.bin", 1));
        assert!(is_lfs("tokenizer.model", 1));
        assert!(is_lfs("big.json", LFS_THRESHOLD));
        assert!(!is_lfs("config.json", LFS_THRESHOLD - 1));
    }

    #[test]
    fn hub_revision_api() {
        let (hub, commit) = hub();
        assert_eq!(commit.len(), 40);
        assert!(commit.bytes().all(|b| b.is_ascii_hexdigit()));
        let reply = get(&format!(
            "{}/api/models/org/model/revision/main",
            hub.endpoint()
        ));
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("Content-Type"),
            Some("application/json; charset=utf-8")
        );
        let info = reply.json();
        assert_eq!(info["id"], "org/model");
        assert_eq!(info["sha"], commit.as_str());
        assert_eq!(info["private"], false);
        assert_eq!(info["gated"], false);
        assert_eq!(
            info["siblings"],
            json!([
                {"rfilename": "1_Pooling/config.json"},
                {"rfilename": "config.json"},
                {"rfilename": "model.safetensors"},
            ])
        );
        // By commit, and by a tag whose name needs encoding.
        hub.tag("org/model", "refs/pr/1", &commit).unwrap();
        for rev in [commit.as_str(), "refs%2Fpr%2F1"] {
            let reply = get(&format!(
                "{}/api/models/org/model/revision/{rev}",
                hub.endpoint()
            ));
            assert_eq!(
                (reply.status, reply.json()["sha"].clone()),
                (200, json!(commit))
            );
        }
        // `/api/models/{repo}`: the repo at `main`; an endpoint the fake does not have.
        let reply = get(&format!("{}/api/models/org/model", hub.endpoint()));
        assert_eq!(
            (reply.status, reply.json()["sha"].clone()),
            (200, json!(commit))
        );
        let reply = get(&format!("{}/api/models/org/model/refs", hub.endpoint()));
        assert_eq!(reply.status, 404);
        // A repo id of one segment.
        let gpt2 = hub.add_repo("gpt2", &[("config.json", b"{}".to_vec())]);
        let reply = get(&format!("{}/api/models/gpt2/revision/main", hub.endpoint()));
        assert_eq!(
            (reply.json()["id"].clone(), reply.json()["sha"].clone()),
            (json!("gpt2"), json!(gpt2))
        );
        assert_eq!(
            hub.tag("org/model", "v1", "nope").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn hub_tree_api_recursive_and_not() {
        let (hub, commit) = hub();
        let w = weights();
        let sha = sha256_hex(&w);
        let pointer = lfs_pointer(&sha, w.len());
        let url = format!("{}/api/models/org/model/tree/{commit}", hub.endpoint());
        let reply = get(&format!("{url}?recursive=true&expand=false"));
        assert_eq!(reply.status, 200);
        let entries = reply.json();
        let entries = entries.as_array().unwrap();
        let paths: Vec<&str> = entries
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "1_Pooling",
                "1_Pooling/config.json",
                "config.json",
                "model.safetensors"
            ]
        );
        assert_eq!(entries[0]["type"], "directory");
        assert_eq!(entries[0]["size"], 0);
        assert_eq!(entries[0]["oid"].as_str().unwrap().len(), 40);
        assert_eq!(
            entries[2],
            json!({"type": "file", "oid": git_oid(CONFIG), "size": CONFIG.len(), "path": "config.json"})
        );
        assert_eq!(
            entries[3],
            json!({
                "type": "file",
                "oid": git_oid(pointer.as_bytes()),
                "size": w.len(),
                "path": "model.safetensors",
                "lfs": {"oid": sha, "size": w.len(), "pointerSize": pointer.len()},
            })
        );
        // Not recursive: the top level only; `recursive=1` as `true`.
        let top = get(&url).json();
        let top: Vec<&str> = top
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(top, ["1_Pooling", "config.json", "model.safetensors"]);
        assert_eq!(
            get(&format!("{url}?recursive=1"))
                .json()
                .as_array()
                .unwrap()
                .len(),
            4
        );
        // A directory, and one that is not there.
        let sub = get(&format!("{url}/1_Pooling")).json();
        assert_eq!(sub.as_array().unwrap().len(), 1);
        assert_eq!(sub[0]["path"], "1_Pooling/config.json");
        let reply = get(&format!("{url}/2_Dense"));
        assert_eq!(reply.status, 404);
        assert_eq!(reply.header("X-Error-Code"), Some("EntryNotFound"));
    }

    #[test]
    fn hub_resolve_plain_file_whole_and_ranged() {
        let (hub, commit) = hub();
        let url = format!("{}/org/model/resolve/main/config.json", hub.endpoint());
        let reply = get(&url);
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, CONFIG);
        let etag = format!("\"{}\"", git_oid(CONFIG));
        assert_eq!(reply.header("ETag"), Some(etag.as_str()));
        assert_eq!(reply.header("X-Repo-Commit"), Some(commit.as_str()));
        assert_eq!(reply.header("Accept-Ranges"), Some("bytes"));
        let head = call("HEAD", &url, &[]);
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("Content-Length"),
            Some(CONFIG.len().to_string().as_str())
        );
        assert_eq!(head.header("ETag"), Some(etag.as_str()));
        let ranged = call("GET", &url, &[("Range", "bytes=2-7")]);
        assert_eq!(ranged.status, 206);
        assert_eq!(ranged.body, &CONFIG[2..=7]);
        let range = format!("bytes 2-7/{}", CONFIG.len());
        assert_eq!(ranged.header("Content-Range"), Some(range.as_str()));
        let tail = call("GET", &url, &[("Range", "bytes=10-")]);
        assert_eq!((tail.status, tail.body.as_slice()), (206, &CONFIG[10..]));
        let past = call("GET", &url, &[("Range", "bytes=100-200")]);
        assert_eq!(past.status, 416);
        // By commit and in a directory.
        let nested = get(&format!(
            "{}/org/model/resolve/{commit}/1_Pooling/config.json",
            hub.endpoint()
        ));
        assert_eq!(
            (nested.status, nested.body.as_slice()),
            (200, b"{}".as_slice())
        );
    }

    #[test]
    fn hub_resolve_lfs_redirects_to_the_cdn() {
        let (hub, commit) = hub();
        let w = weights();
        let sha = sha256_hex(&w);
        for method in ["HEAD", "GET"] {
            let reply = call(
                method,
                &format!(
                    "{}/org/model/resolve/main/model.safetensors",
                    hub.endpoint()
                ),
                &[],
            );
            assert_eq!(reply.status, 302);
            let location = reply.header("Location").unwrap();
            assert!(
                location.starts_with(&format!(
                    "{}/repos/{sha}?X-Amz-Expires=3600&Expires=",
                    hub.cdn()
                )),
                "{location}"
            );
            assert!(location.contains("&X-Amz-Signature="), "{location}");
            let linked = format!("\"{sha}\"");
            assert_eq!(reply.header("X-Linked-Etag"), Some(linked.as_str()));
            assert_eq!(
                reply.header("X-Linked-Size"),
                Some(w.len().to_string().as_str())
            );
            assert_eq!(reply.header("X-Repo-Commit"), Some(commit.as_str()));
            let pointer = format!("\"{}\"", git_oid(lfs_pointer(&sha, w.len()).as_bytes()));
            assert_eq!(reply.header("ETag"), Some(pointer.as_str()));
            assert_eq!(reply.header("Content-Length"), Some("0"));
        }
        let location = location(&hub, "org/model", "model.safetensors", &[]);
        let whole = get(&location);
        assert_eq!(whole.status, 200);
        assert_eq!(whole.body, w);
        let etag = whole.header("ETag").unwrap().trim_matches('"');
        assert_eq!(etag.len(), 32);
        assert!(etag.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!sha.starts_with(etag));
        assert_eq!(whole.header("Accept-Ranges"), Some("bytes"));
        let ranged = call("GET", &location, &[("Range", "bytes=70000-70099")]);
        assert_eq!(ranged.status, 206);
        assert_eq!(ranged.body, &w[70_000..70_100]);
        let range = format!("bytes 70000-70099/{}", w.len());
        assert_eq!(ranged.header("Content-Range"), Some(range.as_str()));
        let head = call("HEAD", &location, &[]);
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("Content-Length"),
            Some(w.len().to_string().as_str())
        );
        // A tampered signature, and a URL of a blob the CDN does not have.
        let bad = get(&location.replace("X-Amz-Signature=", "X-Amz-Signature=0"));
        assert_eq!(bad.status, 403);
        assert!(String::from_utf8_lossy(&bad.body).contains("<Code>SignatureDoesNotMatch</Code>"));
        let unsigned = get(&format!("{}/repos/{sha}", hub.cdn()));
        assert_eq!(unsigned.status, 403);
    }

    #[test]
    fn hub_keeps_connections_alive() {
        let (hub, _) = hub();
        let (host, _) = split_url(&hub.endpoint());
        let mut stream = TcpStream::connect(host).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        for _ in 0..3 {
            send(
                &mut stream,
                "GET",
                "/org/model/resolve/main/config.json",
                &[],
            );
            let reply = read_reply(&mut reader, false);
            assert_eq!((reply.status, reply.body.as_slice()), (200, CONFIG));
        }
        // Stopping shuts the open connection: the client reads the end of stream.
        drop(hub);
        reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut rest = Vec::new();
        assert_eq!(reader.read_to_end(&mut rest).unwrap(), 0);
    }

    #[test]
    fn hub_errors_repo_revision_entry() {
        let (hub, commit) = hub();
        let e = hub.endpoint();
        for url in [
            format!("{e}/api/models/org/none/revision/main"),
            format!("{e}/api/models/org/none/tree/main"),
            format!("{e}/org/none/resolve/main/config.json"),
        ] {
            let reply = get(&url);
            assert_eq!(
                error_code(&reply),
                (404, "RepoNotFound", "Repository not found"),
                "{url}"
            );
            assert_eq!(reply.json(), json!({"error": "Repository not found"}));
        }
        for url in [
            format!("{e}/api/models/org/model/revision/v9"),
            format!("{e}/api/models/org/model/tree/v9"),
            format!("{e}/org/model/resolve/v9/config.json"),
        ] {
            assert_eq!(
                error_code(&get(&url)),
                (404, "RevisionNotFound", "Invalid rev id: v9"),
                "{url}"
            );
        }
        let reply = call(
            "HEAD",
            &format!("{e}/org/model/resolve/main/nope.json"),
            &[],
        );
        assert_eq!(
            error_code(&reply),
            (404, "EntryNotFound", "Entry not found")
        );
        assert_eq!(reply.header("X-Repo-Commit"), Some(commit.as_str()));
    }

    #[test]
    fn hub_gated_repo() {
        let (hub, _) = hub();
        hub.gate("org/model", &["hf_good"]);
        let e = hub.endpoint();
        let info = get(&format!("{e}/api/models/org/model/revision/main"));
        assert_eq!(
            (info.status, info.json()["gated"].clone()),
            (200, json!("auto"))
        );
        assert_eq!(
            get(&format!("{e}/api/models/org/model/tree/main")).status,
            200
        );
        let url = format!("{e}/org/model/resolve/main/config.json");
        assert_eq!(
            error_code(&call("HEAD", &url, &[])),
            (
                401,
                "GatedRepo",
                "Access to model org/model is restricted. You must have access to it and be \
                 authenticated to access it. Please log in."
            )
        );
        let wrong = call("GET", &url, &[("Authorization", "Bearer hf_bad")]);
        assert_eq!(
            (wrong.status, wrong.header("X-Error-Code")),
            (403, Some("GatedRepo"))
        );
        let right = call("GET", &url, &[("Authorization", "Bearer hf_good")]);
        assert_eq!((right.status, right.body.as_slice()), (200, CONFIG));
    }

    #[test]
    fn hub_private_repo() {
        let (hub, commit) = hub();
        hub.make_private("org/model", &["hf_mine"]);
        let e = hub.endpoint();
        for url in [
            format!("{e}/api/models/org/model/revision/main"),
            format!("{e}/api/models/org/model/tree/main"),
            format!("{e}/org/model/resolve/main/config.json"),
        ] {
            for headers in [&[][..], &[("Authorization", "Bearer hf_other")][..]] {
                assert_eq!(
                    error_code(&call("GET", &url, headers)),
                    (401, "RepoNotFound", "Repository not found"),
                    "{url} {headers:?}"
                );
            }
            let reply = call("GET", &url, &[("Authorization", "Bearer hf_mine")]);
            assert_eq!(reply.status, 200, "{url}");
        }
        let info = call(
            "GET",
            &format!("{e}/api/models/org/model/revision/main"),
            &[("Authorization", "Bearer hf_mine")],
        )
        .json();
        assert_eq!(
            (info["private"].clone(), info["sha"].clone()),
            (json!(true), json!(commit))
        );
    }

    #[test]
    fn hub_new_commit_moves_main_and_keeps_the_old() {
        let (hub, first) = hub();
        let second = hub.add_commit("org/model", &[("config.json", b"{\"v\": 2}".to_vec())]);
        assert_ne!(first, second);
        hub.tag("org/model", "v1", &first).unwrap();
        let e = hub.endpoint();
        let info = get(&format!("{e}/api/models/org/model/revision/main")).json();
        assert_eq!(info["sha"], second.as_str());
        assert_eq!(info["siblings"], json!([{"rfilename": "config.json"}]));
        let new = get(&format!("{e}/org/model/resolve/main/config.json"));
        assert_eq!(new.body, b"{\"v\": 2}");
        for rev in [first.as_str(), "v1"] {
            let old = get(&format!("{e}/org/model/resolve/{rev}/config.json"));
            assert_eq!(old.header("X-Repo-Commit"), Some(first.as_str()));
            assert_eq!(old.body, CONFIG);
            let old = get(&format!("{e}/org/model/resolve/{rev}/model.safetensors"));
            assert_eq!(old.status, 302);
        }
        let gone = get(&format!("{e}/org/model/resolve/main/model.safetensors"));
        assert_eq!(gone.header("X-Error-Code"), Some("EntryNotFound"));
    }

    const EXPIRED: &[u8] =
        b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>";

    #[test]
    fn hub_fault_expired_urls() {
        let (hub, _) = hub();
        hub.set_faults(HubFaults {
            expire_after: 0,
            ..HubFaults::default()
        });
        assert_eq!(hub.faults().expire_after, 0);
        let url = location(&hub, "org/model", "model.safetensors", &[]);
        assert!(url.contains("X-Amz-Expires=0&"), "{url}");
        let reply = get(&url);
        assert_eq!((reply.status, reply.body.as_slice()), (403, EXPIRED));
        // Expired once: the first URL of each file, then valid ones.
        hub.set_faults(HubFaults {
            expire_once: true,
            ..HubFaults::default()
        });
        let first = location(&hub, "org/model", "model.safetensors", &[]);
        assert_eq!(get(&first).body, EXPIRED);
        let second = location(&hub, "org/model", "model.safetensors", &[]);
        let reply = get(&second);
        assert_eq!((reply.status, reply.body), (200, weights()));
    }

    #[test]
    fn hub_fault_corrupt_byte() {
        let (hub, _) = hub();
        let w = weights();
        let mut faults = HubFaults::default();
        faults.corrupt.insert("model.safetensors".into(), 70_000);
        faults.corrupt.insert("config.json".into(), 1);
        hub.set_faults(faults);
        let url = location(&hub, "org/model", "model.safetensors", &[]);
        let reply = get(&url);
        let mut want = w.clone();
        want[70_000] ^= 0xFF;
        assert_eq!((reply.status, reply.body.len()), (200, w.len()));
        assert!(reply.body == want);
        // Every time; a range with the byte, and one without.
        assert!(get(&url).body == want);
        let with = call("GET", &url, &[("Range", "bytes=69999-70001")]);
        assert_eq!(with.body, [w[69_999], w[70_000] ^ 0xFF, w[70_001]]);
        let without = call("GET", &url, &[("Range", "bytes=0-69999")]);
        assert!(without.body == w[..70_000]);
        // A plain file is corrupted where it is served, by resolve.
        let config = get(&format!(
            "{}/org/model/resolve/main/config.json",
            hub.endpoint()
        ));
        assert_eq!(config.body[1], CONFIG[1] ^ 0xFF);
        assert_eq!(config.body[2..], CONFIG[2..]);
    }

    #[test]
    fn hub_fault_truncate() {
        let (hub, _) = hub();
        let w = weights();
        let mut faults = HubFaults::default();
        faults.truncate.insert("model.safetensors".into());
        hub.set_faults(faults);
        let url = location(&hub, "org/model", "model.safetensors", &[]);
        for _ in 0..2 {
            let reply = get(&url);
            assert_eq!(reply.status, 200);
            assert_eq!(
                reply.header("Content-Length"),
                Some(w.len().to_string().as_str())
            );
            assert!(reply.body == w[..w.len() / 2]);
        }
        // A HEAD is whole, and so is another file.
        assert_eq!(call("HEAD", &url, &[]).status, 200);
        assert_eq!(
            get(&format!(
                "{}/org/model/resolve/main/config.json",
                hub.endpoint()
            ))
            .body,
            CONFIG
        );
    }

    #[test]
    fn hub_fault_redirect_loop_fail_first_and_missing() {
        let (hub, commit) = hub();
        let mut faults = HubFaults {
            fail_first: true,
            ..HubFaults::default()
        };
        faults.redirect_loop.insert("config.json".into());
        faults.missing.insert("1_Pooling/config.json".into());
        hub.set_faults(faults);
        let e = hub.endpoint();
        let url = format!("{e}/org/model/resolve/main/config.json");
        let looped = get(&url);
        assert_eq!(
            (looped.status, looped.header("Location")),
            (302, Some(url.as_str()))
        );
        // Listed, but not found.
        let tree = get(&format!(
            "{e}/api/models/org/model/tree/main?recursive=true"
        ))
        .json();
        assert!(
            tree.as_array()
                .unwrap()
                .iter()
                .any(|e| e["path"] == "1_Pooling/config.json")
        );
        let missing = get(&format!("{e}/org/model/resolve/main/1_Pooling/config.json"));
        assert_eq!(
            error_code(&missing),
            (404, "EntryNotFound", "Entry not found")
        );
        assert_eq!(missing.header("X-Repo-Commit"), Some(commit.as_str()));
        // 503 for the first GET of each range, then the bytes.
        let cdn = location(&hub, "org/model", "model.safetensors", &[]);
        assert_eq!(call("HEAD", &cdn, &[]).status, 200);
        assert_eq!(get(&cdn).status, 503);
        assert_eq!(get(&cdn).body, weights());
        let range = [("Range", "bytes=0-9")];
        assert_eq!(call("GET", &cdn, &range).status, 503);
        assert_eq!(call("GET", &cdn, &range).body, weights()[..10]);
    }

    #[test]
    fn hub_rate_cap_is_shared_by_all_connections() {
        const RATE: f64 = 20_000_000.0;
        let hub = FakeHub::start().unwrap();
        let big: Vec<u8> = (0..7_000_000u32).map(|i| (i % 253) as u8).collect();
        hub.add_repo("org/big", &[("big.safetensors", big)]);
        let url = location(&hub, "org/big", "big.safetensors", &[]);
        hub.set_rate(Some(RATE as u64));
        let start = Instant::now();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || get(&url).body.len())
            })
            .collect();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let seconds = start.elapsed().as_secs_f64();
        assert_eq!(total, 21_000_000);
        let rate = total as f64 / seconds;
        assert!(
            (rate - RATE).abs() < RATE * 0.2,
            "{rate:.0} B/s over {seconds:.2} s, cap {RATE}"
        );
        // Lifted: no longer a second per 20 MB.
        hub.set_rate(None);
        let start = Instant::now();
        assert_eq!(get(&url).body.len(), 7_000_000);
        assert!(
            start.elapsed() < Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn hub_log() {
        let (hub, _) = hub();
        let token = [("Authorization", "Bearer hf_x")];
        let url = location(&hub, "org/model", "model.safetensors", &token);
        call("GET", &url, &[("Range", "bytes=5-")]);
        let sha = sha256_hex(&weights());
        let tree = get(&format!(
            "{}/api/models/org/model/tree/main?recursive=1",
            hub.endpoint()
        ));
        let log = hub.log();
        assert_eq!(
            log,
            [
                HubLogged {
                    server: Server::Hub,
                    method: "HEAD".into(),
                    path: "/org/model/resolve/main/model.safetensors".into(),
                    has_query: false,
                    range: None,
                    status: 302,
                    authorization: Some("Bearer hf_x".into()),
                    sent: 0,
                },
                HubLogged {
                    server: Server::Cdn,
                    method: "GET".into(),
                    path: format!("/repos/{sha}"),
                    has_query: true,
                    range: Some((5, 99_999)),
                    status: 206,
                    authorization: None,
                    sent: 99_995,
                },
                HubLogged {
                    server: Server::Hub,
                    method: "GET".into(),
                    path: "/api/models/org/model/tree/main".into(),
                    has_query: true,
                    range: None,
                    status: 200,
                    authorization: None,
                    sent: tree.body.len() as u64,
                },
            ]
        );
        hub.clear_log();
        assert!(hub.log().is_empty());
    }
}
