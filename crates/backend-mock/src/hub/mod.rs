//! A fake Hugging Face Hub on loopback, for tests of a Hub client against real sockets: the
//! Hub's API (`/api/models/{repo}/revision/{rev}`, `/api/models/{repo}/tree/{rev}[/{path}]`,
//! the tree paged as the Hub pages it: [`TREE_PAGE`] entries a page, or
//! [`FakeHub::set_tree_page`], with a `Link: <...>; rel="next"` header to the next page), its
//! `resolve` URLs (plain files served, LFS files redirected with a signed URL), and a second
//! socket that stands for the storage CDN those signed URLs point at. Repos, commits, tags,
//! gated, private and renamed repos are registered in memory, and the Hub may be served under a
//! mirror's path prefix; the errors carry the Hub's `X-Error-Code` and `X-Error-Message`;
//! faults are scripted (expired URLs, corrupt or cut bodies, redirect loops, 503s, missing
//! files, an outage of the Hub, a second hop at the CDN) and one token bucket caps the bytes per
//! second of both sockets together. Every request is logged, with its `Authorization` header, so
//! a test sees whether a login went to the CDN.
//!
//! The protocol is the one `huggingface_hub` 2.4 speaks (models only, no Xet). This is the one
//! stand-in Hub: the Python tests run it as a process (`examples/fake_hub.rs`, driven through
//! `control`'s commands).
//!
//! The files, from the bottom up: `repo` (what the Hub holds, under one lock: commits, files
//! and their digests, blobs, faults, log), `wire` (HTTP requests read, responses written),
//! `listing` (the tree API's entries and pages), `routes` (the Hub's socket: API and
//! `resolve`), `cdn` (the CDN's socket), `serve` (connections accepted, requests routed and
//! logged), `control` (the commands of another process); this file holds the public types and
//! the [`FakeHub`] handle over the state both sockets share.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

mod cdn;
mod control;
mod listing;
mod repo;
mod routes;
mod serve;
mod wire;

use repo::{Content, File, State, in_memory};
pub use repo::{git_oid, is_lfs, sha256_hex};
use serve::accept;

/// A file at least this large is stored in LFS whatever its name (10 MiB).
pub const LFS_THRESHOLD: usize = 10 << 20;

/// The entries of one page of a tree listing, unless [`FakeHub::set_tree_page`] says otherwise
/// (the Hub pages long listings; a client follows the `Link` header, whatever the size).
pub const TREE_PAGE: usize = 1000;

/// The most bytes one write of a body sends under a rate cap (and so the token bucket's step).
const CHUNK: usize = 64 << 10;

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

/// Seconds since the epoch (a signed URL's expiry).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};

    use serde_json::{Value, json};

    use super::repo::lfs_pointer;
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
