//! Models on the Hugging Face Hub (`hf://org/name[@revision][/path]`), streamed onto the
//! device while they download, and written into the Hugging Face cache as `huggingface_hub`
//! would have written them, so every other tool finds them there.
//!
//! [`open`] does what `snapshot_download` followed by a load does, in one pass:
//!
//! 1. the revision is resolved to a commit (`GET /api/models/{repo}/revision/{rev}`), or, with
//!    `HF_HUB_OFFLINE`, read from the cache's `refs/`;
//! 2. the files at that commit are listed (`/tree/{commit}?recursive=true`) and the weights
//!    chosen as the loaders choose them: under the path given (the repository's root by
//!    default), `model.safetensors.index.json`, else `model.safetensors`, else every
//!    `*.safetensors` there in natural order;
//! 3. when the cache already holds every one of them (and the small files), the load is a
//!    local load of the snapshot: no byte of the weights goes over the network
//!    ([`Opened::Cached`]);
//! 4. else the small files a model needs beside its weights (`config.json`, the tokenizer:
//!    every file that is not a weight) are fetched into the snapshot, `refs/<revision>` is
//!    written, and the weights are read through a [`Remote`] whose store is the Hub
//!    (`store`), each byte written into the cache as it arrives (`cache`) and each file
//!    committed once its SHA-256 is the one the Hub lists ([`Opened::Streamed`]).
//!
//! Configuration is `huggingface_hub`'s environment: `HF_ENDPOINT` (a mirror), `HF_TOKEN`
//! (else `HUGGING_FACE_HUB_TOKEN`, else the token file `hf auth login` writes:
//! `HF_TOKEN_PATH`, default `$HF_HOME/token`), `HF_HUB_CACHE` (else `HUGGINGFACE_HUB_CACHE`,
//! else `$HF_HOME/hub`; `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, else
//! `~/.cache/huggingface`), `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), and the proxy
//! variables (`HTTPS_PROXY`, `NO_PROXY`). [`HubOptions::cache`] off streams without writing
//! anything; [`HubOptions::cache_dir`] puts the cache elsewhere.
//!
//! Built over `backend-remote`'s reader (its concurrency, bandwidth cap, interrupts, the GPU
//! backends' bounce buffers): the Hub is a store of this crate's making behind a
//! [`Remote`] ([`Remote::with_store`]), which tees the bytes it reads into the cache
//! ([`backend_remote::Tee`]); `backend-remote` knows nothing of the Hub.
//!
//! Not spoken: the Xet protocol (files the Hub stores in Xet are read through the same
//! `resolve` redirect as LFS files, which the Hub serves for every file), datasets and spaces.

mod api;
mod cache;
mod changes;
mod path;
mod store;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) use cache::HubCache;
pub use changes::{Changes, changes, repository_path};
pub use path::{HubPath, is_hub, is_repo_id};

use api::{Api, TreeFile, is_commit};
use cache::RepoCache;
use staging_core::Error;

use backend_remote::{Options, OwnedRuntime, Redirects, Remote, RetryPolicy};

/// How a Hub path is read, besides the remote reader's options (`backend_remote::Options`).
#[derive(Clone)]
pub struct HubOptions {
    /// A model is written into the Hugging Face cache as it streams, as `huggingface_hub`
    /// would have written it (default true); off, it streams without writing anything, and a
    /// model already in the cache is read from the network.
    pub cache: bool,
    /// The Hugging Face cache (default: `HF_HUB_CACHE`, else `$HF_HOME/hub`, as
    /// `huggingface_hub` finds it).
    pub cache_dir: Option<PathBuf>,
    /// The Hub's endpoint (default: `HF_ENDPOINT`, else `https://huggingface.co`).
    pub endpoint: Option<String>,
    /// The Hub token (default: `HF_TOKEN`, else the token file `huggingface_hub` writes).
    /// Never shown.
    pub token: Option<String>,
    /// Whether to ask nothing of the Hub and load from the cache (default: `HF_HUB_OFFLINE`).
    pub offline: Option<bool>,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            cache: true,
            cache_dir: None,
            endpoint: None,
            token: None,
            offline: None,
        }
    }
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubOptions")
            .field("cache", &self.cache)
            .field("cache_dir", &self.cache_dir)
            .field("endpoint", &self.endpoint)
            .field(
                "token",
                &self.token.as_ref().map(|_| backend_remote::REDACTED),
            )
            .field("offline", &self.offline)
            .finish()
    }
}

/// The Hugging Face Hub's own hosts, where it keeps its files: `huggingface.co`, `hf.co` and
/// their subdomains (`cdn-lfs.hf.co`, `cdn-lfs-us-1.hf.co`, `cdn-lfs.huggingface.co`,
/// `cas-bridge.xethub.hf.co`, `transfer.xethub.hf.co`, as of 2026-12): a redirect onwards from
/// the storage may go there without being allowed.
pub const STORAGE_HOSTS: [&str; 4] = ["huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co"];

/// The redirects of a Hub load: to the hosts `allowed`, and to the Hub's own
/// ([`STORAGE_HOSTS`]).
fn hub_redirects(allowed: &[String]) -> Redirects {
    let mut hosts = allowed.to_vec();
    hosts.extend(STORAGE_HOSTS.iter().map(|h| (*h).to_owned()));
    Redirects::new(backend_remote::Scheme::Http, &hosts)
}

/// A Hub path opened ([`open`]).
#[derive(Debug)]
pub enum Opened {
    /// Every file is in the cache: load this local path (a directory, index or file in the
    /// snapshot).
    Cached {
        /// What to load.
        path: PathBuf,
        /// The commit the revision named.
        commit: String,
        /// What the load reads, for its report.
        facts: HubFacts,
    },
    /// Read through `remote` (its store is the Hub at `commit`).
    Streamed {
        /// The store the files are read through.
        remote: Remote,
        /// What to open: one index, or the weight files in order.
        paths: Vec<PathBuf>,
        /// The commit the revision named.
        commit: String,
        /// What the load reads, for its report.
        facts: HubFacts,
    },
}

/// Bytes counted as a Hub model is opened and read.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Received from the Hub and its storage.
    pub(crate) downloaded: AtomicU64,
    /// Read from blobs already in the cache (by the store; a snapshot read alone counts its
    /// load's bytes instead).
    pub(crate) from_cache: AtomicU64,
    /// Written into the cache's blobs.
    pub(crate) written: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, bytes: u64) {
        counter.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// What a Hub path opened to: the repository, the revision and the commit it named, the path
/// inside, the snapshot in the cache, the files read, and the bytes counted since ([`report`]:
/// the load report's `hub`).
///
/// [`report`]: HubFacts::report
#[derive(Debug, Clone)]
pub struct HubFacts {
    repo: String,
    revision: String,
    commit: String,
    path: String,
    snapshot: Option<PathBuf>,
    cached: bool,
    files: Vec<String>,
    counters: Arc<Counters>,
    /// What did not go as asked (the report's `note`).
    note: Option<String>,
}

impl HubFacts {
    /// The report's `hub` for a load that has read `bytes_read` bytes so far.
    pub fn report(&self, bytes_read: u64) -> staging_core::HubReport {
        let from_cache = if self.cached {
            bytes_read
        } else {
            self.counters.from_cache.load(Ordering::Relaxed)
        };
        staging_core::HubReport {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            commit: self.commit.clone(),
            path: self.path.clone(),
            snapshot: self.snapshot.clone(),
            cached: self.cached,
            files: self.files.clone(),
            bytes_downloaded: self.counters.downloaded.load(Ordering::Relaxed),
            bytes_from_cache: from_cache,
            bytes_written: self.counters.written.load(Ordering::Relaxed),
            note: self.note.clone(),
        }
    }
}

/// The largest file fetched whole beside the weights (a tokenizer is tens of MB at most): a
/// larger one that is not a weight (a dataset sample, an archive) is not fetched.
const SMALL_FILE_MAX: u64 = 256 << 20;

/// `huggingface_hub`'s idea of true (`1`, `ON`, `YES`, `TRUE`, any case).
fn is_true(value: Option<String>) -> bool {
    value.is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

/// A variable of the environment, when set and not empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `~` at the start of `path` as the home directory.
fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), var("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ if path == "~" => var("HOME").map_or_else(|| PathBuf::from(path), PathBuf::from),
        _ => PathBuf::from(path),
    }
}

/// `HF_HOME`, as `huggingface_hub` finds it.
fn hf_home() -> PathBuf {
    if let Some(home) = var("HF_HOME") {
        return expand_home(&home);
    }
    let cache = var("XDG_CACHE_HOME").map_or_else(|| expand_home("~/.cache"), |c| expand_home(&c));
    cache.join("huggingface")
}

/// The Hub cache `huggingface_hub` uses: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else
/// `$HF_HOME/hub`.
pub fn default_cache_dir() -> PathBuf {
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .map_or_else(|| hf_home().join("hub"), |dir| expand_home(&dir))
}

/// The token `huggingface_hub` sends: `HF_TOKEN`, else `HUGGING_FACE_HUB_TOKEN`, else the
/// token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`).
fn token() -> Option<String> {
    let clean = |t: String| Some(t.trim().to_owned()).filter(|t| !t.is_empty());
    if let Some(token) = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")) {
        return clean(token);
    }
    let path = var("HF_TOKEN_PATH").map_or_else(|| hf_home().join("token"), |p| expand_home(&p));
    std::fs::read_to_string(path).ok().and_then(clean)
}

/// The endpoint given, else `HF_ENDPOINT`, else `https://huggingface.co`, without a trailing
/// `/`.
fn endpoint(given: Option<&str>) -> Result<url::Url, String> {
    let text = given
        .map(str::to_owned)
        .or_else(|| var("HF_ENDPOINT"))
        .unwrap_or_else(|| "https://huggingface.co".to_owned());
    let trimmed = text.trim_end_matches('/');
    let url =
        url::Url::parse(trimmed).map_err(|e| format!("HF_ENDPOINT={text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("HF_ENDPOINT={text:?} is not an http(s) URL"));
    }
    if url.query().is_some() || !url.username().is_empty() {
        return Err(format!(
            "HF_ENDPOINT={text:?}: a query or login is not supported"
        ));
    }
    Ok(url)
}

/// Whether `name` is a weight file of a format other than the safetensors chosen (these are
/// never fetched as small files).
fn is_weight(name: &str) -> bool {
    const WEIGHTS: &[&str] = &[
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".h5",
        ".msgpack",
        ".onnx",
        ".onnx_data",
        ".gguf",
        ".ot",
        ".tflite",
        ".mlmodel",
        ".npz",
        ".pkl",
        ".tar",
        ".zip",
        ".mlpackage",
        ".nemo",
        ".engine",
        ".plan",
    ];
    let lower = name.to_ascii_lowercase();
    WEIGHTS.iter().any(|ext| lower.ends_with(ext))
        || lower.contains(".safetensors.")
        || lower.ends_with(".index.json") && lower.contains("safetensors")
        || lower.ends_with(".index.json") && lower.contains("pytorch_model")
}

/// The weight files the loaders would read under `dir` (`""`: the root), and the index, if
/// one names them: `model.safetensors.index.json`, else `model.safetensors`, else every
/// `*.safetensors` there in natural order. `Err` says what is there instead.
fn choose(files: &[TreeFile], what: &HubPath) -> Result<(Option<String>, Vec<String>), String> {
    let given = what.path.as_deref().unwrap_or("");
    let exact = files.iter().find(|f| f.path == given);
    if let Some(file) = exact {
        if given.ends_with(".json") {
            return Ok((Some(file.path.clone()), Vec::new()));
        }
        return Ok((None, vec![file.path.clone()]));
    }
    let dir = if given.is_empty() {
        String::new()
    } else {
        format!("{given}/")
    };
    let in_dir = |name: &str| {
        name.strip_prefix(dir.as_str())
            .filter(|rest| !rest.contains('/'))
            .is_some()
    };
    let index = format!("{dir}model.safetensors.index.json");
    if files.iter().any(|f| f.path == index) {
        return Ok((Some(index), Vec::new()));
    }
    let single = format!("{dir}model.safetensors");
    if files.iter().any(|f| f.path == single) {
        return Ok((None, vec![single]));
    }
    let mut found: Vec<String> = files
        .iter()
        .map(|f| f.path.clone())
        .filter(|p| in_dir(p) && p.ends_with(".safetensors"))
        .filter(|p| !p.rsplit('/').next().unwrap_or("").starts_with('.'))
        .collect();
    if found.is_empty() {
        if !given.is_empty() && !files.iter().any(|f| f.path.starts_with(&dir)) {
            return Err(format!("{} has no file or folder {given}", what.repo));
        }
        let others: Vec<&str> = files
            .iter()
            .map(|f| f.path.as_str())
            .filter(|p| in_dir(p) && is_weight(p))
            .take(5)
            .collect();
        let there = if others.is_empty() {
            String::new()
        } else {
            format!(" (weights in other formats: {})", others.join(", "))
        };
        return Err(format!(
            "{} has no safetensors weights in {}{there}",
            what.repo,
            if given.is_empty() { "its root" } else { given }
        ));
    }
    found.sort_by(|a, b| staging_core::natural_cmp(a, b));
    Ok((None, found))
}

/// An error about `what`, as the core reports one.
fn error_at(what: &HubPath, e: io::Error) -> Error {
    Error::Io {
        path: PathBuf::from(what.to_string()),
        source: e,
    }
}

/// `path` as a Hub path, or why not.
fn parse(path: &Path) -> Result<HubPath, Error> {
    let text = path.to_str().ok_or_else(|| Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "a Hub path must be UTF-8"),
    })?;
    HubPath::parse(text).map_err(|why| Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, why),
    })
}

/// The cache folders of `what`'s repository.
fn repo_cache(what: &HubPath, hub: &HubOptions) -> RepoCache {
    let root = hub.cache_dir.clone().unwrap_or_else(default_cache_dir);
    RepoCache::new(&root, &what.cache_folder())
}

/// Whether no request may be made (`HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE`, or the option).
fn offline(hub: &HubOptions) -> bool {
    hub.offline
        .unwrap_or_else(|| is_true(var("HF_HUB_OFFLINE")) || is_true(var("TRANSFORMERS_OFFLINE")))
}

/// The Hub at the endpoint the options and environment name, ready for requests.
struct Connection {
    api: Api,
    /// Serves the API's requests, and the store's.
    runtime: OwnedRuntime,
    /// Each redirect to another host (a file's to the storage CDN, followed by design) is in
    /// the report; onwards from there, only to hosts allowed.
    redirects: Arc<Redirects>,
    /// `scheme://host[:port]` of the endpoint: the store's root.
    root: String,
}

fn connect(what: &HubPath, options: &Options, hub: &HubOptions) -> Result<Connection, Error> {
    let endpoint = endpoint(hub.endpoint.as_deref())
        .map_err(|why| error_at(what, io::Error::new(io::ErrorKind::InvalidInput, why)))?;
    let client = hub_client(options).map_err(|e| error_at(what, e))?;
    let token = hub.token.clone().or_else(token);
    let redirects = Arc::new(hub_redirects(&options.allow_redirects));
    let api = Api::new(client, endpoint.clone(), token, Arc::clone(&redirects))
        .map_err(|e| error_at(what, e))?;
    let root = format!(
        "{}://{}",
        endpoint.scheme(),
        endpoint.host_str().unwrap_or_default()
    ) + &endpoint.port().map(|p| format!(":{p}")).unwrap_or_default();
    let runtime = OwnedRuntime::start().map_err(|source| Error::Resource {
        what: "the I/O runtime's 2 threads".into(),
        source,
    })?;
    Ok(Connection {
        api,
        runtime,
        redirects,
        root,
    })
}

/// Opens `path` (`hf://...`): resolves its revision, and either finds every file in the cache
/// or prepares the load that streams them (writing the cache as they arrive, unless
/// [`HubOptions::cache`] is off). Errors name the repository, revision or file, in the Hub's
/// own terms (a gated model needs a token with access; no such model, revision or file).
pub fn open(path: &Path, options: &Options, hub: &HubOptions) -> Result<Opened, Error> {
    let what = parse(path)?;
    let invalid = |why: String| error_at(&what, io::Error::new(io::ErrorKind::InvalidInput, why));
    let dirs = repo_cache(&what, hub);
    let counters = Arc::new(Counters::default());
    if offline(hub) {
        return open_offline(&what, &dirs, counters);
    }
    let Connection {
        api,
        runtime,
        redirects,
        root,
    } = connect(&what, options, hub)?;
    let retry = options.retry();
    // The Hub cannot serve (no answer, down, rate-limiting): a snapshot in the cache that holds
    // the weights serves, as `huggingface_hub`'s own fallback does (`HF_HUB_OFFLINE` asks
    // first); else the Hub's answer is the error.
    let from_cache = |commit: Option<&str>, e: io::Error| {
        if hub.cache
            && api::unavailable(&e)
            && let Some(opened) = cached_snapshot(&what, &dirs, commit, Arc::clone(&counters))
        {
            return Ok(opened.noted(format!(
                "the Hub could not be asked ({e}): loaded from the cache"
            )));
        }
        Err(error_at(&what, e))
    };
    let commit = match runtime.block_on(options.interrupt.as_ref(), api.commit(&what, retry)) {
        Ok(commit) => commit,
        Err(e) => return from_cache(None, e),
    };
    let tree = match runtime.block_on(options.interrupt.as_ref(), api.tree(&what, &commit, retry)) {
        Ok(tree) => tree,
        Err(e) => return from_cache(Some(&commit), e),
    };
    let (index, weights) = choose(&tree, &what)
        .map_err(|why| error_at(&what, io::Error::new(io::ErrorKind::NotFound, why)))?;
    let by_path: HashMap<&str, &TreeFile> = tree.iter().map(|f| (f.path.as_str(), f)).collect();
    // The files read whole: every file that is not a weight, and the index.
    let small: Vec<&TreeFile> = tree
        .iter()
        .filter(|f| {
            (!is_weight(&f.path) && f.size <= SMALL_FILE_MAX) || Some(&f.path) == index.as_ref()
        })
        .collect();
    let mut index_bytes = None;
    let weight_names: Vec<String> = match &index {
        Some(index) => {
            // The index's shards are known once it is read; it is small, and read whole.
            let file = by_path
                .get(index.as_str())
                .copied()
                .ok_or_else(|| invalid(format!("{} lists no {index}", what.repo)))?;
            // From the cache when it has it, under this commit or any other (its blob is
            // named by its content): a warm start asks nothing more of the Hub.
            let cached = std::fs::read(dirs.blob(file.blob()))
                .ok()
                .filter(|bytes| hub.cache && cache::check_whole(file, bytes).is_ok());
            let bytes = match cached {
                Some(bytes) => {
                    Counters::add(&counters.from_cache, bytes.len() as u64);
                    bytes
                }
                None => runtime
                    .block_on(
                        options.interrupt.as_ref(),
                        fetch_whole(&api, &what, &commit, file, retry, &counters),
                    )
                    .map_err(|e| error_at(&what, e))?,
            };
            let shards = shards_of(&bytes, index)
                .map_err(|why| error_at(&what, io::Error::new(io::ErrorKind::InvalidData, why)))?;
            index_bytes = Some(bytes);
            shards
        }
        None => weights.clone(),
    };
    let snapshot = dirs.snapshot(&commit);
    // A file's blob is in the cache when a file of its name and size is there: it was checked
    // when it was committed (LFS: named by its SHA-256), whichever commit it was read at, as
    // `huggingface_hub` takes it.
    let blob_cached = |f: &TreeFile| {
        std::fs::metadata(dirs.blob(f.blob())).is_ok_and(|m| m.is_file() && m.len() == f.size)
    };
    let linked = |f: &TreeFile| blob_cached(f) && snapshot.join(&f.path).is_file();
    let weight_files: Vec<&TreeFile> = weight_names
        .iter()
        .filter_map(|name| by_path.get(name.as_str()).copied())
        .collect();
    let all_weights_cached =
        weight_files.len() == weight_names.len() && weight_files.iter().all(|f| blob_cached(f));
    // Set where the cache holds every weight but cannot be updated: read from it, write nothing.
    let mut read_only: Option<String> = None;
    if hub.cache && all_weights_cached {
        // A local load of the snapshot. What it lacks (this commit's links, a small file) is
        // made as far as the cache lets it, and nothing fails for it: a read-only cache (a
        // mounted model volume, with no `.locks/`) that holds the model loads as it is.
        let complete = weight_files.iter().chain(&small).all(|f| linked(f))
            && dirs.read_ref(what.revision_or_main()).as_deref() == Some(commit.as_str());
        // A cache whose folders cannot be made (read-only) is not written, and nothing is
        // fetched for it.
        if !complete && dirs.writable() {
            let _ = dirs.write_ref(what.revision_or_main(), &commit);
            for file in weight_files.iter().chain(&small) {
                if linked(file) {
                    continue;
                }
                if blob_cached(file) {
                    let _ = dirs.link(&commit, file);
                    continue;
                }
                let bytes = match index_bytes
                    .as_ref()
                    .filter(|_| Some(&file.path) == index.as_ref())
                {
                    Some(bytes) => Ok(bytes.clone()),
                    None => runtime.block_on(
                        options.interrupt.as_ref(),
                        fetch_whole(&api, &what, &commit, file, retry, &counters),
                    ),
                };
                // A small file that cannot be fetched now (one `huggingface_hub` never
                // fetched, such as the README, with the network gone) does not stop the load.
                if let Ok(bytes) = bytes
                    && let Ok(written) = dirs.put_whole(&commit, file, &bytes)
                {
                    Counters::add(&counters.written, written);
                }
            }
        }
        // The snapshot that holds the weights: this commit's; else, where the cache could not
        // be updated (read-only, a mounted volume) and the Hub's revision moved to a commit of
        // the same weights, another commit's snapshot linking the same blobs at the same paths.
        // A path of this commit's snapshot that the load cannot open is never handed on.
        let index_file = index
            .as_ref()
            .and_then(|i| by_path.get(i.as_str()).copied());
        // Another snapshot must hold every file this commit's would (the config and tokenizer
        // too: a caller reads them from the snapshot reported), but for documentation.
        let needed: Vec<&TreeFile> = weight_files
            .iter()
            .copied()
            .chain(index_file)
            .chain(small.iter().copied().filter(|f| !is_documentation(&f.path)))
            .collect();
        let holder = if needed.iter().all(|f| linked(f)) {
            Some((snapshot.clone(), None))
        } else {
            same_files_elsewhere(&dirs, &what, &commit, &needed).map(|(other, at)| {
                let note = format!(
                    "the cache could not be updated to {commit}: its files were read from the \
                     snapshot of {other}, which holds the same blobs"
                );
                (at, Some(note))
            })
        };
        if let Some((at, note)) = holder {
            let facts = HubFacts {
                repo: what.repo.clone(),
                revision: what.revision_or_main().to_owned(),
                commit: commit.clone(),
                path: what.path.clone().unwrap_or_default(),
                snapshot: Some(at.clone()),
                cached: true,
                files: index.iter().chain(&weight_names).cloned().collect(),
                counters,
                note,
            };
            let local_path = at.join(what.path.as_deref().unwrap_or(""));
            return Ok(Opened::Cached {
                path: cached_target(&local_path, &at, &index, &weights),
                commit,
                facts,
            });
        }
        // No snapshot holds them: the weights are read from the blobs, and nothing written.
        read_only = Some(format!(
            "the cache at {} could not be updated to {commit}: the weights were read from its \
             blobs",
            dirs.root.display()
        ));
    }
    if hub.cache && read_only.is_none() {
        dirs.prepare().map_err(|e| error_at(&what, e))?;
        dirs.write_ref(what.revision_or_main(), &commit)
            .map_err(|e| error_at(&what, e))?;
        // The small files the cache lacks are asked for at once (a dozen requests of a few
        // kB each: their round trips, not their bytes, are what they cost), then written.
        let mut fetch = Vec::new();
        for file in &small {
            if linked(file) {
                continue;
            }
            let fetched = if blob_cached(file) {
                dirs.link(&commit, file).map(|()| 0)
            } else {
                match index_bytes
                    .as_ref()
                    .filter(|_| Some(&file.path) == index.as_ref())
                {
                    Some(bytes) => dirs.put_whole(&commit, file, bytes),
                    None => {
                        fetch.push(*file);
                        Ok(0)
                    }
                }
            };
            Counters::add(&counters.written, fetched.map_err(|e| error_at(&what, e))?);
        }
        let fetched = runtime
            .block_on(options.interrupt.as_ref(), async {
                use futures::{StreamExt, TryStreamExt};
                futures::stream::iter(fetch.iter().map(|file| async {
                    let bytes = fetch_whole(&api, &what, &commit, file, retry, &counters).await?;
                    Ok::<_, io::Error>((*file, bytes))
                }))
                .buffer_unordered(SMALL_FILES_AT_ONCE)
                .try_collect::<Vec<_>>()
                .await
            })
            .map_err(|e| error_at(&what, e))?;
        for (file, bytes) in fetched {
            let written = dirs
                .put_whole(&commit, file, &bytes)
                .map_err(|e| error_at(&what, e))?;
            Counters::add(&counters.written, written);
        }
        // Weights already in the cache (read at another commit, or by an earlier load that
        // stopped) are linked, and read from the cache, not the network.
        for file in &weight_files {
            if blob_cached(file) && !linked(file) {
                dirs.link(&commit, file).map_err(|e| error_at(&what, e))?;
            }
        }
    }
    // The Remote's keys: each file's resolve path under the endpoint.
    let key_of = |name: &str| -> String {
        let url = api.url(&[&what.repo, "resolve", &commit, name]);
        url.path().trim_start_matches('/').to_owned()
    };
    let mut files = HashMap::new();
    let mut local = HashMap::new();
    for name in weight_names.iter().chain(index.iter()) {
        let file = by_path.get(name.as_str()).copied().ok_or_else(|| {
            error_at(
                &what,
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{} at {commit} has no file {name} (its index names it)",
                        what.repo
                    ),
                ),
            )
        })?;
        let decoded = percent_encoding::percent_decode_str(&key_of(name))
            .decode_utf8_lossy()
            .into_owned();
        // What is at hand is not asked of the Hub again: the index read, a blob in the cache.
        if Some(name) == index.as_ref()
            && let Some(bytes) = &index_bytes
        {
            local.insert(decoded.clone(), store::Local::Bytes(bytes.clone().into()));
        } else if hub.cache && blob_cached(file) {
            local.insert(decoded.clone(), store::Local::Blob(dirs.blob(file.blob())));
        }
        files.insert(decoded, file.clone());
    }
    let store = store::HubStore::new(
        api.clone(),
        what.clone(),
        commit.clone(),
        files.clone(),
        local,
        retry,
        Arc::clone(&counters),
    );
    let remote = Remote::with_store(
        Path::new(&root),
        Arc::new(store),
        options,
        runtime,
        redirects,
    )?;
    if hub.cache && read_only.is_none() {
        // Weights already in the cache (from an earlier, partial load) are linked, not read
        // again into it.
        let cache_files = files
            .into_iter()
            .filter(|(_, f)| !is_weight(&f.path) || f.path.ends_with(".safetensors"))
            .collect();
        remote.set_tee(Box::new(HubCache::new(
            dirs.clone(),
            commit.clone(),
            cache_files,
            Arc::clone(&counters),
        )));
    }
    let url_of =
        |name: &str| PathBuf::from(api.url(&[&what.repo, "resolve", &commit, name]).as_str());
    let paths = match &index {
        Some(index) => vec![url_of(index)],
        None => weights.iter().map(|w| url_of(w)).collect(),
    };
    let facts = HubFacts {
        repo: what.repo.clone(),
        revision: what.revision_or_main().to_owned(),
        commit: commit.clone(),
        path: what.path.clone().unwrap_or_default(),
        // Not this commit's snapshot where the cache could not be updated: it was not made.
        snapshot: (hub.cache && read_only.is_none()).then_some(snapshot),
        cached: false,
        files: index.iter().chain(&weight_names).cloned().collect(),
        counters,
        note: read_only.clone(),
    };
    Ok(Opened::Streamed {
        remote,
        paths,
        commit,
        facts,
    })
}

/// Whether `path` is a repository's documentation (`README.md`, any `*.md`, `.gitattributes`),
/// which no load or loader reads.
fn is_documentation(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.to_ascii_lowercase().ends_with(".md") || name == ".gitattributes"
}

impl Opened {
    /// This, its report saying `note`.
    fn noted(mut self, note: String) -> Self {
        match &mut self {
            Self::Cached { facts, .. } | Self::Streamed { facts, .. } => facts.note = Some(note),
        }
        self
    }
}

/// A snapshot of another commit than `commit` that links every file of `files` to its blob
/// (the one the Hub lists for it at `commit`), the cache's ref of the revision first: that
/// commit and its snapshot.
fn same_files_elsewhere(
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
fn cached_target(
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
/// the repository: the index and every shard it names, else the `.safetensors` files of a
/// folder in natural order, else the file. `None` when they are not all there.
fn snapshot_files(snapshot: &Path, path: &Path) -> Option<Vec<String>> {
    let in_repo = |p: &Path| {
        p.strip_prefix(snapshot)
            .ok()
            .map(|rel| rel.to_string_lossy().into_owned())
    };
    let index = if path.is_dir() {
        path.join("model.safetensors.index.json")
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
        let mut found: Vec<String> = std::fs::read_dir(path)
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
            .filter(|e| e.path().is_file())
            .filter_map(|e| in_repo(&e.path()))
            .collect();
        found.sort_by(|a, b| staging_core::natural_cmp(a, b));
        return (!found.is_empty()).then_some(found);
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
        repo: what.repo.clone(),
        revision: what.revision_or_main().to_owned(),
        commit: commit.clone(),
        path: what.path.clone().unwrap_or_default(),
        files: snapshot_files(&snapshot, &path).unwrap_or_default(),
        snapshot: Some(snapshot),
        cached: true,
        counters,
        note: None,
    };
    Opened::Cached {
        path,
        commit,
        facts,
    }
}

/// The snapshot of `commit` (else of the commit the cache's `refs/<revision>`, or the revision
/// given as a commit, names), when it holds the weights a load of `what` reads.
fn cached_snapshot(
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
fn open_offline(
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

/// Small files (configs, tokenizer) asked for at once, at most.
const SMALL_FILES_AT_ONCE: usize = 8;

/// A small file's bytes, whole, checked against the listing.
async fn fetch_whole(
    api: &Api,
    what: &HubPath,
    commit: &str,
    file: &TreeFile,
    retry: RetryPolicy,
    counters: &Counters,
) -> io::Result<Vec<u8>> {
    let url = api.url(&[&what.repo, "resolve", commit, &file.path]);
    let source = api.resolve(&url, what, &file.path, retry).await?;
    let response = api
        .get_ok(&source.url, what, Some(&file.path), retry)
        .await?;
    let bytes = api::body(response, file.size.saturating_add(1), &file.path).await?;
    Counters::add(&counters.downloaded, bytes.len() as u64);
    cache::check_whole(file, &bytes)?;
    Ok(bytes)
}

/// The shard files an index names (joined under the index's folder), in the order first named.
fn shards_of(bytes: &[u8], index: &str) -> Result<Vec<String>, String> {
    /// An index as far as it is read here: which file holds each tensor.
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: std::collections::BTreeMap<String, String>,
    }
    let doc: Index = serde_json::from_slice(bytes)
        .map_err(|e| format!("{index} is not an index (a weight_map of file names): {e}"))?;
    let dir = index.rsplit_once('/').map_or("", |(d, _)| d);
    let mut seen = std::collections::HashSet::new();
    let mut shards = Vec::new();
    for name in doc.weight_map.values() {
        staging_core::checked_components(name)
            .map_err(|why| format!("{index} names a shard {name:?}, which {why}"))?;
        let joined = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        if seen.insert(joined.clone()) {
            shards.push(joined);
        }
    }
    Ok(shards)
}

/// The HTTP client of the Hub: no redirect followed by itself (the API follows the `resolve`
/// redirect by hand), the environment's proxies, the store's timeouts.
fn hub_client(options: &Options) -> io::Result<reqwest::Client> {
    backend_remote::install_crypto();
    reqwest::ClientBuilder::new()
        .user_agent(concat!("safetensors-staging/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(options.request_timeout)
        .connect_timeout(std::time::Duration::from_secs(10))
        .no_gzip()
        .no_brotli()
        .no_zstd()
        .no_deflate()
        .build()
        .map_err(|e| io::Error::other(format!("cannot build the HTTP client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> TreeFile {
        TreeFile {
            path: path.into(),
            size: 1,
            oid: "ab".into(),
            sha256: None,
        }
    }

    fn what(path: Option<&str>) -> HubPath {
        HubPath {
            repo: "org/name".into(),
            revision: None,
            path: path.map(str::to_owned),
        }
    }

    #[test]
    fn weights_are_chosen_as_the_loaders_choose_them() {
        let tree: Vec<TreeFile> = [
            "config.json",
            "model-00002-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
            "consolidated.safetensors",
            "model.safetensors.index.json",
            "sub/model-10.safetensors",
            "sub/model-9.safetensors",
            "onnx/model.onnx",
        ]
        .iter()
        .map(|p| file(p))
        .collect();
        assert_eq!(
            choose(&tree, &what(None)).unwrap(),
            (Some("model.safetensors.index.json".into()), vec![])
        );
        assert_eq!(
            choose(&tree, &what(Some("sub"))).unwrap(),
            (
                None,
                vec![
                    "sub/model-9.safetensors".into(),
                    "sub/model-10.safetensors".into()
                ]
            )
        );
        assert_eq!(
            choose(&tree, &what(Some("consolidated.safetensors"))).unwrap(),
            (None, vec!["consolidated.safetensors".into()])
        );
        let e = choose(&tree, &what(Some("onnx"))).unwrap_err();
        assert!(
            e.contains("no safetensors weights in onnx") && e.contains("onnx/model.onnx"),
            "{e}"
        );
        let e = choose(&tree, &what(Some("nope"))).unwrap_err();
        assert!(e.contains("no file or folder nope"), "{e}");
        let single = [file("model.safetensors"), file("other.safetensors")];
        assert_eq!(
            choose(&single, &what(None)).unwrap(),
            (None, vec!["model.safetensors".into()])
        );
    }

    #[test]
    fn small_files_are_everything_but_weights() {
        for name in [
            "config.json",
            "tokenizer.json",
            "tokenizer.model",
            "1_Pooling/config.json",
            "README.md",
        ] {
            assert!(!is_weight(name), "{name}");
        }
        for name in [
            "model.safetensors",
            "pytorch_model.bin",
            "x.gguf",
            "model.safetensors.index.json",
            "pytorch_model.bin.index.json",
            "flax_model.msgpack",
        ] {
            assert!(is_weight(name), "{name}");
        }
    }

    #[test]
    fn an_index_names_its_shards_under_its_folder_and_nothing_outside() {
        let index = br#"{"weight_map":{"a":"s-1.safetensors","b":"s-2.safetensors","c":"s-1.safetensors"}}"#;
        assert_eq!(
            shards_of(index, "sub/model.safetensors.index.json").unwrap(),
            ["sub/s-1.safetensors", "sub/s-2.safetensors"]
        );
        let hostile = br#"{"weight_map":{"a":"../../etc/passwd"}}"#;
        assert!(shards_of(hostile, "i.json").unwrap_err().contains("'..'"));
        for bad in [&b"{}"[..], br#"{"weight_map":{"a":1}}"#, b"[]", b"not json"] {
            let error = shards_of(bad, "i.json").unwrap_err();
            assert!(error.starts_with("i.json is not an index"), "{error}");
        }
        // Other keys (`metadata`) are the index's business.
        let with_metadata = br#"{"metadata":{"total_size":8},"weight_map":{"a":"s.safetensors"}}"#;
        assert_eq!(
            shards_of(with_metadata, "i.json").unwrap(),
            ["s.safetensors"]
        );
    }
}
