//! The Hub's files at one commit as an [`ObjectStore`]: what the
//! [`Remote`](backend_remote::Remote) reads a load through, so that every reader of this crate (concurrency, bandwidth cap,
//! interrupt, the GPU backends' bounce buffers) serves the Hub unchanged.
//!
//! A key is a file's `resolve` path (`org/name/resolve/<commit>/<path>` under the endpoint).
//! Its metadata is the tree listing's (no request): its size, and its blob name as the ETag. A
//! ranged `GET` goes to where the file's `resolve` redirects (the CDN's signed URL, asked for
//! once per file and kept), with no token; a signed URL that has expired (the CDN answers 400,
//! 401, 403 or 410) is asked for again, at most [`RERESOLVE`] times in a row. A body cut short
//! is resumed from where it stopped; a transient failure (5xx, 429, no answer) is retried, both
//! under the load's [`RetryPolicy`] (its waits jittered) by `backend-remote`'s one retry loop
//! ([`RetryContext::run`]): the re-resolve and the resumption are the operations it retries, not
//! loops of their own.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path as Key;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use reqwest::{Method, StatusCode};

use crate::api::{Api, MAX_HOPS, Resolved, TreeFile, redirect_loop, redirect_target, status_error};
use crate::counters::Counters;
use crate::path::HubPath;

/// Signed URLs asked for again in a row for one request, at most.
const RERESOLVE: usize = 3;

use backend_remote::{
    Attempt, RetryContext, RetryError, RetryPolicy, StoreFailure, transient_status,
    transient_transport, transport_failure,
};

/// An error of the Hub, carried through object_store's error as its source: its words are
/// shown as they are.
fn failure(e: io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "Hugging Face Hub",
        source: Box::new(StoreFailure(e)),
    }
}

/// The files of one commit.
#[derive(Debug)]
pub(crate) struct HubStore {
    inner: Arc<Shared>,
}

/// A file's bytes at hand, served without asking the Hub.
#[derive(Debug, Clone)]
pub(crate) enum Local {
    /// Its blob in the Hugging Face cache (complete: its size the listing's, checked when it
    /// was committed).
    Blob(std::path::PathBuf),
    /// Read already (the index, read to learn the shards).
    Bytes(Bytes),
}

#[derive(Debug)]
struct Shared {
    api: Api,
    what: HubPath,
    /// The commit the files are read at.
    commit: String,
    /// By key.
    files: HashMap<String, TreeFile>,
    /// The files at hand, by key.
    local: HashMap<String, Local>,
    /// Where each file's bytes come from, once asked (by key).
    resolved: Mutex<HashMap<String, Resolved>>,
    retry: RetryPolicy,
    /// Bytes received and read from the cache are counted here.
    counters: Arc<Counters>,
}

impl HubStore {
    pub(crate) fn new(
        api: Api,
        what: HubPath,
        commit: String,
        files: HashMap<String, TreeFile>,
        local: HashMap<String, Local>,
        retry: RetryPolicy,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            inner: Arc::new(Shared {
                api,
                what,
                commit,
                files,
                local,
                resolved: Mutex::new(HashMap::new()),
                retry,
                counters,
            }),
        }
    }
}

impl fmt::Display for HubStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HubStore({})", self.inner.what.repo)
    }
}

impl Shared {
    fn file(&self, key: &Key) -> object_store::Result<&TreeFile> {
        self.files
            .get(key.as_ref())
            .ok_or_else(|| object_store::Error::NotFound {
                path: key.to_string(),
                source: Box::new(StoreFailure(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} has no file {}", self.what.repo, key.as_ref()),
                ))),
            })
    }

    fn meta(&self, key: &Key, file: &TreeFile) -> ObjectMeta {
        ObjectMeta {
            location: key.clone(),
            last_modified: DateTime::<Utc>::UNIX_EPOCH,
            size: file.size,
            e_tag: Some(file.blob().to_owned()),
            version: None,
        }
    }

    /// Where the file at `key` is read from: asked of the Hub once, then kept (`fresh`: asked
    /// again, the kept URL having expired).
    async fn source(&self, key: &Key, file: &TreeFile, fresh: bool) -> io::Result<Resolved> {
        if !fresh {
            let kept = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(resolved) = kept.get(key.as_ref()) {
                return Ok(resolved.clone());
            }
        }
        // The file's `resolve` URL under the endpoint (whatever path a mirror's endpoint has:
        // the key is that URL's whole path, the endpoint's included).
        let url = self
            .api
            .url(&[&self.what.repo, "resolve", &self.commit, &file.path]);
        let resolved = self
            .api
            .resolve(&url, &self.what, &file.path, self.retry)
            .await?;
        self.resolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.as_ref().to_owned(), resolved.clone());
        Ok(resolved)
    }

    /// A response with the bytes `range` of the file at `key`: its body is exactly them. Tried
    /// under the load's retry policy (`backend-remote`'s one retry loop), the operation retried
    /// being [`Shared::try_open`]: a signed URL that has expired is asked for afresh and the
    /// request re-issued at once, at most [`RERESOLVE`] times in a row.
    async fn open(
        &self,
        key: &Key,
        file: &TreeFile,
        range: Range<u64>,
    ) -> io::Result<reqwest::Response> {
        let mut context = RetryContext::new(&self.retry);
        let range = &range;
        let run = context.run(Reissue::default(), |mut state: Reissue| async move {
            let attempt = match self.try_open(key, file, range, &mut state).await {
                Ok(attempt) => attempt,
                Err(e) => Attempt::Permanent(e),
            };
            (state, attempt)
        });
        run.await.1.map_err(|e| e.error)
    }

    /// One try of [`Shared::open`]: the file's source (asked afresh when `state` says the kept
    /// one expired), a ranged `GET` of it, and its redirects followed. `Err`: a permanent
    /// failure.
    async fn try_open(
        &self,
        key: &Key,
        file: &TreeFile,
        range: &Range<u64>,
        state: &mut Reissue,
    ) -> io::Result<Attempt<reqwest::Response, io::Error>> {
        let source = self
            .source(key, file, std::mem::take(&mut state.fresh))
            .await?;
        let mut url = source.url.clone();
        let mut hops = 0;
        let response = loop {
            let request = self.api.request(Method::GET, &url).header(
                reqwest::header::RANGE,
                format!("bytes={}-{}", range.start, range.end - 1),
            );
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) => {
                    let words = transport_failure(&e).unwrap_or_else(|| e.to_string());
                    let error = io::Error::other(format!("{}: {words}", file.path));
                    return Ok(if transient_transport(&e) {
                        Attempt::Transient(error)
                    } else {
                        Attempt::Permanent(error)
                    });
                }
            };
            if !response.status().is_redirection() {
                break response;
            }
            hops += 1;
            if hops > MAX_HOPS {
                return Err(redirect_loop(&source.url));
            }
            let target = redirect_target(&url, response.headers())?;
            self.api.follow(&url, &target, Some(&file.path))?;
            url = target;
        };
        let status = response.status();
        if status == StatusCode::PARTIAL_CONTENT || status == StatusCode::OK {
            check_range(&response, range, file)?;
            return Ok(Attempt::Done(response));
        }
        let error = status_error(
            status,
            response.headers(),
            &self.what,
            Some(&file.path),
            self.api.has_token(),
        );
        if transient_status(status) {
            return Ok(Attempt::Transient(error));
        }
        let expired = !self.api.on_hub(&url)
            && matches!(
                status,
                StatusCode::BAD_REQUEST
                    | StatusCode::UNAUTHORIZED
                    | StatusCode::FORBIDDEN
                    | StatusCode::GONE
            );
        if !expired {
            return Err(error);
        }
        if state.reresolved < RERESOLVE {
            state.reresolved += 1;
            state.fresh = true;
            return Ok(Attempt::Reissue);
        }
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: the storage server refused the Hub's signed URL {} times in a row \
                 ({status}), asked for afresh each time",
                file.path,
                RERESOLVE + 1
            ),
        ))
    }
}

/// What a ranged read carries from one try to the next: whether the signed URL kept has
/// expired (the next try asks for it afresh), and how often it was asked for afresh.
#[derive(Debug, Default)]
struct Reissue {
    fresh: bool,
    reresolved: usize,
}

/// Whether `response` carries exactly `range` of `file`.
fn check_range(
    response: &reqwest::Response,
    range: &Range<u64>,
    file: &TreeFile,
) -> io::Result<()> {
    let wrong = |what: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: asked for bytes {}..{}, {what}",
                file.path, range.start, range.end
            ),
        )
    };
    if response.status() == StatusCode::OK {
        // The whole file: only right when the whole file was asked for.
        return if range.start == 0 && range.end == file.size {
            Ok(())
        } else {
            Err(wrong("the server sent the whole file".into()))
        };
    }
    let content_range = response
        .headers()
        .get(reqwest::header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let parsed = content_range
        .strip_prefix("bytes ")
        .and_then(|r| r.split_once('/'))
        .and_then(|(span, total)| {
            let (a, b) = span.split_once('-')?;
            Some((
                a.parse::<u64>().ok()?,
                b.parse::<u64>().ok()?,
                total.parse::<u64>().ok(),
            ))
        });
    match parsed {
        Some((a, b, total)) if a == range.start && b + 1 == range.end => match total {
            Some(total) if total != file.size => Err(wrong(format!(
                "the server's copy is {total} bytes, the Hub lists {}",
                file.size
            ))),
            _ => Ok(()),
        },
        _ => Err(wrong(format!(
            "the server sent Content-Range {content_range:?}"
        ))),
    }
}

/// The body of one ranged read, resumed from where it stopped when cut short: each chunk is
/// the operation retried ([`Reading::chunk`]), under one [`RetryContext`] for the whole body.
struct Body {
    reading: Reading,
    /// The waits before each resumption (the retry policy's), across the body's chunks.
    context: RetryContext,
    done: bool,
}

/// Where a body's reading has got to: what a resumption starts from.
struct Reading {
    shared: Arc<Shared>,
    key: Key,
    file: TreeFile,
    range: Range<u64>,
    received: u64,
    stream: Option<BoxStream<'static, reqwest::Result<Bytes>>>,
}

/// Why a chunk could not be read: the request for the rest failed (for good: it was retried
/// already), or the body was cut short (in these words).
enum Stop {
    Open(io::Error),
    Cut(String),
}

impl Body {
    async fn next(mut self) -> Option<(object_store::Result<Bytes>, Self)> {
        let len = self.reading.range.end - self.reading.range.start;
        if self.done || self.reading.received >= len {
            return None;
        }
        let (reading, outcome) = self.context.run(self.reading, Reading::chunk).await;
        self.reading = reading;
        let e = match outcome {
            Ok(chunk) => return Some((Ok(chunk), self)),
            Err(RetryError {
                error: Stop::Open(e),
                ..
            }) => e,
            Err(RetryError {
                error: Stop::Cut(cut),
                ..
            }) => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: the body was cut short {} times ({cut})",
                    self.reading.file.path,
                    self.context.retries() + 1
                ),
            ),
        };
        self.done = true;
        Some((Err(failure(e)), self))
    }
}

impl Reading {
    /// The next chunk: the rest of the range asked for first where no body is being read (the
    /// first, or the last cut short).
    async fn chunk(mut self) -> (Self, Attempt<Bytes, Stop>) {
        let len = self.range.end - self.range.start;
        let stream = match self.stream.as_mut() {
            Some(stream) => stream,
            None => {
                let from = self.range.start + self.received;
                match self
                    .shared
                    .open(&self.key, &self.file, from..self.range.end)
                    .await
                {
                    Ok(response) => self.stream.insert(response.bytes_stream().boxed()),
                    Err(e) => return (self, Attempt::Permanent(Stop::Open(e))),
                }
            }
        };
        let cut = match stream.next().await {
            Some(Ok(chunk)) => {
                let left = len - self.received;
                let chunk = if chunk.len() as u64 > left {
                    chunk.slice(..left as usize)
                } else {
                    chunk
                };
                self.received += chunk.len() as u64;
                Counters::add(&self.shared.counters.downloaded, chunk.len() as u64);
                return (self, Attempt::Done(chunk));
            }
            Some(Err(e)) => e.to_string(),
            None => "the body ended early".to_owned(),
        };
        self.stream = None;
        (self, Attempt::Transient(Stop::Cut(cut)))
    }
}

/// `range` of a file at hand.
async fn read_local(local: &Local, range: &Range<u64>, file: &TreeFile) -> io::Result<Bytes> {
    let (Ok(start), Ok(end)) = (usize::try_from(range.start), usize::try_from(range.end)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a range past memory",
        ));
    };
    match local {
        Local::Bytes(bytes) => bytes
            .get(start..end)
            .map(|_| bytes.slice(start..end))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: bytes {range:?} are past what was read", file.path),
                )
            }),
        Local::Blob(path) => {
            let path = path.clone();
            let name = file.path.clone();
            tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let blob = std::fs::File::open(&path)?;
                let mut out = vec![0u8; end - start];
                blob.read_exact_at(&mut out, start as u64).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "{name}: its blob in the Hugging Face cache, {}: {}",
                            path.display(),
                            staging_core::io_words(&e)
                        ),
                    )
                })?;
                Ok(Bytes::from(out))
            })
            .await
            .map_err(|e| io::Error::other(format!("reading a cached blob: {e}")))?
        }
    }
}

fn not_supported(what: &str) -> object_store::Error {
    object_store::Error::NotSupported {
        source: format!("the Hugging Face Hub is read here, not written ({what})").into(),
    }
}

#[async_trait::async_trait]
impl ObjectStore for HubStore {
    async fn put_opts(
        &self,
        _location: &Key,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(not_supported("put"))
    }

    async fn put_multipart_opts(
        &self,
        _location: &Key,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(not_supported("put"))
    }

    async fn get_opts(
        &self,
        location: &Key,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let shared = &self.inner;
        let file = shared.file(location)?;
        let meta = shared.meta(location, file);
        if let Some(expected) = &options.if_match
            && meta.e_tag.as_ref() != Some(expected)
        {
            return Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: format!("its blob is {}, not {expected}", file.blob()).into(),
            });
        }
        let size = file.size;
        let range = match options.range {
            None => 0..size,
            Some(GetRange::Bounded(r)) => r,
            Some(GetRange::Offset(start)) => start..size,
            Some(GetRange::Suffix(n)) => size.saturating_sub(n)..size,
        };
        if range.start > range.end || range.end > size {
            return Err(failure(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: bytes {range:?} are not in its {size} bytes", file.path),
            )));
        }
        let stream = if options.head || range.is_empty() {
            futures::stream::empty().boxed()
        } else if let Some(local) = shared.local.get(location.as_ref()) {
            let bytes = read_local(local, &range, file).await.map_err(failure)?;
            if matches!(local, Local::Blob(_)) {
                Counters::add(&shared.counters.from_cache, bytes.len() as u64);
            }
            futures::stream::once(async move { Ok(bytes) }).boxed()
        } else {
            let body = Body {
                reading: Reading {
                    shared: Arc::clone(shared),
                    key: location.clone(),
                    file: file.clone(),
                    range: range.clone(),
                    received: 0,
                    stream: None,
                },
                context: RetryContext::new(&shared.retry),
                done: false,
            };
            futures::stream::unfold(body, Body::next).boxed()
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Key>>,
    ) -> BoxStream<'static, object_store::Result<Key>> {
        locations.map(|_| Err(not_supported("delete"))).boxed()
    }

    fn list(&self, _prefix: Option<&Key>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        futures::stream::once(async { Err(not_supported("list")) }).boxed()
    }

    async fn list_with_delimiter(&self, _prefix: Option<&Key>) -> object_store::Result<ListResult> {
        Err(not_supported("list"))
    }

    async fn copy_opts(
        &self,
        _from: &Key,
        _to: &Key,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(not_supported("copy"))
    }
}
