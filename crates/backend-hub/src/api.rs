//! The Hub's HTTP API as `huggingface_hub` speaks it: a revision resolved to its commit, the
//! tree of files at that commit, a file's `resolve` URL (and where it redirects: the storage
//! CDN, by a signed URL), and the Hub's error codes in words.
//!
//! The client follows no redirect by itself: a `resolve` answers an LFS file with a redirect to
//! another host (the CDN), which is followed here on purpose (the one redirect to another host
//! a load follows without being told to), at most [`MAX_HOPS`] hops, and the token is sent to
//! the Hub's own host only, never to the CDN.

use std::io;
use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use crate::path::HubPath;
use backend_remote::redacted;
use backend_remote::{
    Attempt, Redirects, RetryError, RetryPolicy, transient_status, transient_transport,
    transport_failure,
};

/// Redirects followed for one request at most: a `resolve` of a renamed repository (on the
/// Hub), then the CDN's own.
pub(crate) const MAX_HOPS: usize = 5;

/// One file of the tree at a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TreeFile {
    /// Its path in the repository (`1_Pooling/config.json`).
    pub(crate) path: String,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// The git blob id (the blob's name in the cache for a file not in LFS).
    pub(crate) oid: String,
    /// The SHA-256 of an LFS file (its blob's name in the cache, and what its bytes are
    /// checked against).
    pub(crate) sha256: Option<String>,
}

impl TreeFile {
    /// The file's blob name in the cache: its SHA-256 for an LFS file, else its git blob id
    /// (what `huggingface_hub` takes from the `ETag`s of a `resolve`).
    pub(crate) fn blob(&self) -> &str {
        self.sha256.as_deref().unwrap_or(&self.oid)
    }
}

/// The Hub at one endpoint, with the caller's token.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    pub(crate) client: reqwest::Client,
    /// `HF_ENDPOINT` without a trailing `/` (`https://huggingface.co`).
    pub(crate) endpoint: url::Url,
    /// Sent as `Authorization: Bearer` to the endpoint's host only.
    token: Option<HeaderValue>,
    /// The redirects followed to other hosts (for the report), and which are allowed.
    pub(crate) redirects: Arc<Redirects>,
}

/// A failed request to the Hub, in words, of the closest kind.
pub(crate) fn hub_error(kind: io::ErrorKind, message: impl Into<String>) -> io::Error {
    io::Error::new(kind, message.into())
}

/// A request the Hub could not serve: no answer (no connection, a timeout), or the Hub down
/// or rate-limiting (5xx, 429, after the retries): the failures after which a model already in
/// the cache is loaded from it, as `huggingface_hub` does.
#[derive(Debug)]
pub(crate) struct NoAnswer(String);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoAnswer {}

/// Whether `e` is a request the Hub could not serve ([`NoAnswer`]).
pub(crate) fn unavailable(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NoAnswer>())
}

/// What a request that got no answer says.
fn transport(e: &reqwest::Error, url: &str) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else {
        io::ErrorKind::Other
    };
    let words = transport_failure(e).unwrap_or_else(|| e.to_string());
    io::Error::new(
        kind,
        NoAnswer(format!("{}: {}", redacted(url), redacted(&words))),
    )
}

/// What an answer with an error status says: the Hub's own code (`X-Error-Code`) in words
/// naming the repository, revision or file.
pub(crate) fn status_error(
    status: StatusCode,
    headers: &HeaderMap,
    what: &HubPath,
    file: Option<&str>,
    has_token: bool,
) -> io::Error {
    let code = headers
        .get("x-error-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let message = headers
        .get("x-error-message")
        .and_then(|v| v.to_str().ok())
        .map(|m| format!(" (the Hub says: {m})"))
        .unwrap_or_default();
    let repo = &what.repo;
    let revision = what.revision_or_main();
    let token_hint = if has_token {
        "the token given (HF_TOKEN or the token file) has no access to it"
    } else {
        "no token was given: set HF_TOKEN, or log in with `hf auth login`"
    };
    use io::ErrorKind as K;
    match (code, status) {
        ("GatedRepo", _) => hub_error(
            K::PermissionDenied,
            format!(
                "{repo} is a gated model: a token with access to it is needed ({token_hint}; \
                 ask for access on the model's page){message}"
            ),
        ),
        ("RepoNotFound", _) => hub_error(
            K::NotFound,
            format!("no model {repo} on the Hub, or it is private and {token_hint}{message}"),
        ),
        ("RevisionNotFound", _) => hub_error(
            K::NotFound,
            format!("{repo} has no revision {revision:?} (a branch, tag or commit){message}"),
        ),
        ("EntryNotFound", _) => hub_error(
            K::NotFound,
            format!(
                "{repo} at {revision} has no file {}{message}",
                file.unwrap_or("(unknown)")
            ),
        ),
        (_, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => hub_error(
            K::PermissionDenied,
            format!("{repo}: access refused ({status}; {token_hint}){message}"),
        ),
        (_, StatusCode::NOT_FOUND) => hub_error(
            K::NotFound,
            format!(
                "{repo}: not found ({}){message}",
                file.map_or_else(|| format!("revision {revision}"), |f| format!("file {f}"))
            ),
        ),
        _ if transient_status(status) => io::Error::other(NoAnswer(format!(
            "{repo}: the Hub answered {status}{message}"
        ))),
        _ => hub_error(
            K::Other,
            format!("{repo}: the Hub answered {status}{message}"),
        ),
    }
}

/// The longest answer of the API read (a tree listing of a very large repository is a few MB).
const API_MAX: u64 = 256 << 20;

/// The body of `response`, at most `cap` bytes (an answer longer than that is an error: a
/// server cannot make the client hold what it likes).
pub(crate) async fn body(
    mut response: reqwest::Response,
    cap: u64,
    what: &str,
) -> io::Result<Vec<u8>> {
    let url = response.url().to_string();
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport(&e, &url))? {
        if out.len() as u64 + chunk.len() as u64 > cap {
            return Err(hub_error(
                io::ErrorKind::InvalidData,
                format!("{what}: the answer is longer than {cap} bytes"),
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Where a `resolve` of a file sends its bytes from.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The URL to `GET` ranges of: the CDN's signed URL (no token goes there), or the
    /// `resolve` URL itself.
    pub(crate) url: url::Url,
}

impl Api {
    pub(crate) fn new(
        client: reqwest::Client,
        endpoint: url::Url,
        token: Option<String>,
        redirects: Arc<Redirects>,
    ) -> io::Result<Self> {
        let token = token
            .map(|t| {
                let mut value = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    hub_error(
                        io::ErrorKind::InvalidInput,
                        "the Hub token holds characters an HTTP header cannot carry",
                    )
                })?;
                value.set_sensitive(true);
                Ok::<_, io::Error>(value)
            })
            .transpose()?;
        Ok(Self {
            client,
            endpoint,
            token,
            redirects,
        })
    }

    /// Follows a redirect from `from` to `to`: from the Hub's host anywhere (the Hub sending a
    /// file to its storage, followed by design and reported), from elsewhere to another host
    /// only where allowed ([`Redirects::decide`]: the Hub's storage hosts, `allow_redirect`),
    /// reported too.
    pub(crate) fn follow(
        &self,
        from: &url::Url,
        to: &url::Url,
        file: Option<&str>,
    ) -> io::Result<()> {
        if self.on_hub(from) {
            self.redirects.record(from, to);
            return Ok(());
        }
        self.redirects.decide(from, to).map_err(|why| {
            hub_error(
                io::ErrorKind::PermissionDenied,
                match file {
                    Some(file) => format!("{file}: {why}"),
                    None => why,
                },
            )
        })
    }

    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `url` is on the endpoint's host (and port): the token may go there.
    pub(crate) fn on_hub(&self, url: &url::Url) -> bool {
        url.scheme() == self.endpoint.scheme()
            && url.host_str() == self.endpoint.host_str()
            && url.port_or_known_default() == self.endpoint.port_or_known_default()
    }

    /// `{endpoint}/{segments...}`, each segment percent-encoded as a path segment.
    pub(crate) fn url(&self, segments: &[&str]) -> url::Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty();
            for segment in segments {
                for part in segment.split('/') {
                    path.push(part);
                }
            }
        }
        url
    }

    /// A request to `url`, with the token when `url` is on the Hub's host.
    pub(crate) fn request(&self, method: Method, url: &url::Url) -> reqwest::RequestBuilder {
        let builder = self.client.request(method, url.clone());
        match &self.token {
            Some(token) if self.on_hub(url) => {
                builder.header(reqwest::header::AUTHORIZATION, token.clone())
            }
            _ => builder,
        }
    }

    /// Sends a request, retrying a transport failure or a transient status as `retry` says
    /// (`backend-remote`'s one retry loop); once the retries run out, the last answer is
    /// handed back (its status in words is the caller's), or the transport failure.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &url::Url,
        retry: RetryPolicy,
    ) -> io::Result<reqwest::Response> {
        let outcome = retry
            .retry(|| {
                let request = self.request(method.clone(), url).send();
                async move {
                    match request.await {
                        Ok(response) if transient_status(response.status()) => {
                            Attempt::Transient(Ok(response))
                        }
                        Ok(response) => Attempt::Done(response),
                        Err(e) if transient_transport(&e) => Attempt::Transient(Err(e)),
                        Err(e) => Attempt::Permanent(Err(e)),
                    }
                }
            })
            .await;
        match outcome {
            Ok(response)
            | Err(RetryError {
                error: Ok(response),
                ..
            }) => Ok(response),
            Err(RetryError { error: Err(e), .. }) => Err(transport(&e, url.as_str())),
        }
    }

    /// A `GET` of `url` that the Hub answered with success, or its error in words (about
    /// `file`, when it is a file's).
    ///
    /// A redirect on the Hub's host is followed (a renamed repository: the Hub answers its old
    /// name with a 307 to the new, a relative `Location`), at most [`MAX_HOPS`]; one to another
    /// host (the storage's signed URL of a small file) too, the token staying on the Hub.
    pub(crate) async fn get_ok(
        &self,
        url: &url::Url,
        what: &HubPath,
        file: Option<&str>,
        retry: RetryPolicy,
    ) -> io::Result<reqwest::Response> {
        let mut at = url.clone();
        let mut hops = 0;
        let response = loop {
            let response = self.send(Method::GET, &at, retry).await?;
            if !response.status().is_redirection() {
                break response;
            }
            hops += 1;
            if hops > MAX_HOPS {
                return Err(redirect_loop(url));
            }
            let target = redirect_target(&at, response.headers())?;
            self.follow(&at, &target, file)?;
            at = target;
        };
        let status = response.status();
        if !status.is_success() {
            return Err(status_error(
                status,
                response.headers(),
                what,
                file,
                self.has_token(),
            ));
        }
        Ok(response)
    }

    /// A JSON document of the API as `T`, or the Hub's error in words.
    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        url: &url::Url,
        what: &HubPath,
        retry: RetryPolicy,
    ) -> io::Result<T> {
        let response = self.get_ok(url, what, None, retry).await?;
        let body = body(response, API_MAX, url.path()).await?;
        serde_json::from_slice(&body).map_err(|e| {
            hub_error(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the Hub's answer is not what it sends: {e}",
                    redacted(url.as_str())
                ),
            )
        })
    }

    /// The commit `what`'s revision names (`GET /api/models/{repo}/revision/{rev}`).
    pub(crate) async fn commit(&self, what: &HubPath, retry: RetryPolicy) -> io::Result<String> {
        let revision = what.revision_or_main();
        let url = self.url(&["api", "models", &what.repo, "revision"]);
        // The revision is one segment (`refs/pr/1` is sent as `refs%2Fpr%2F1`).
        let mut url = url;
        if let Ok(mut path) = url.path_segments_mut() {
            path.push(revision);
        }
        let info: RevisionInfo = self.json(&url, what, retry).await?;
        let sha = info.sha.filter(|s| is_commit(s)).ok_or_else(|| {
            hub_error(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the Hub's answer names no commit (no 40-hex \"sha\")",
                    redacted(url.as_str())
                ),
            )
        })?;
        Ok(sha)
    }

    /// Every file of the repository at `commit` (`GET /api/models/{repo}/tree/{commit}?recursive=true`,
    /// following the `Link` header of a long listing).
    pub(crate) async fn tree(
        &self,
        what: &HubPath,
        commit: &str,
        retry: RetryPolicy,
    ) -> io::Result<Vec<TreeFile>> {
        let mut url = self.url(&["api", "models", &what.repo, "tree", commit]);
        url.query_pairs_mut()
            .append_pair("recursive", "true")
            .append_pair("expand", "false");
        let mut files = Vec::new();
        let mut next = Some(url);
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > 10_000 {
                return Err(hub_error(
                    io::ErrorKind::InvalidData,
                    format!("{}: the tree listing does not end", what.repo),
                ));
            }
            let response = self.get_ok(&url, what, None, retry).await?;
            next = next_link(response.headers())
                .and_then(|link| url.join(&link).ok())
                .filter(|link| self.on_hub(link));
            let body = body(response, API_MAX, url.path()).await?;
            let entries: Vec<TreeEntry> = serde_json::from_slice(&body).map_err(|e| {
                hub_error(
                    io::ErrorKind::InvalidData,
                    format!("{}: the tree listing is not the Hub's: {e}", what.repo),
                )
            })?;
            for entry in entries {
                let TreeEntry::File(entry) = entry else {
                    continue;
                };
                let shown = format!("{entry:?}");
                files.push(tree_file(entry).ok_or_else(|| {
                    hub_error(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: a tree entry is not a file as the Hub lists one: {shown}",
                            what.repo
                        ),
                    )
                })?);
            }
        }
        Ok(files)
    }

    /// Where `url` (a file's `resolve` URL) sends its bytes from: a `HEAD` without following
    /// redirects, then each redirect by hand (at most [`MAX_HOPS`]): one to another host is the
    /// CDN's signed URL.
    pub(crate) async fn resolve(
        &self,
        url: &url::Url,
        what: &HubPath,
        file: &str,
        retry: RetryPolicy,
    ) -> io::Result<Resolved> {
        let mut at = url.clone();
        for _ in 0..=MAX_HOPS {
            if !self.on_hub(&at) {
                return Ok(Resolved { url: at });
            }
            let response = self.send(Method::HEAD, &at, retry).await?;
            let status = response.status();
            if status.is_redirection() {
                let target = redirect_target(&at, response.headers())?;
                self.follow(&at, &target, Some(file))?;
                at = target;
                continue;
            }
            if status.is_success() {
                return Ok(Resolved { url: at });
            }
            return Err(status_error(
                status,
                response.headers(),
                what,
                Some(file),
                self.has_token(),
            ));
        }
        Err(redirect_loop(url))
    }
}

/// The error of a request redirected more than [`MAX_HOPS`] times.
pub(crate) fn redirect_loop(url: &url::Url) -> io::Error {
    hub_error(
        io::ErrorKind::InvalidData,
        format!(
            "{}: redirected more than {MAX_HOPS} times (a redirect loop?)",
            redacted(url.as_str())
        ),
    )
}

/// The URL a redirect answer points at, relative to `from`.
pub(crate) fn redirect_target(from: &url::Url, headers: &HeaderMap) -> io::Result<url::Url> {
    let location = headers
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            hub_error(
                io::ErrorKind::InvalidData,
                format!("{}: a redirect without a Location", redacted(from.as_str())),
            )
        })?;
    let to = from.join(location).map_err(|e| {
        hub_error(
            io::ErrorKind::InvalidData,
            format!("{}: a redirect to a bad URL: {e}", redacted(from.as_str())),
        )
    })?;
    if !matches!(to.scheme(), "http" | "https") {
        return Err(hub_error(
            io::ErrorKind::InvalidData,
            format!(
                "{}: a redirect to a {}:// URL",
                redacted(from.as_str()),
                to.scheme()
            ),
        ));
    }
    // From https to plain http only on the same host is refused too: a downgrade.
    if from.scheme() == "https" && to.scheme() == "http" {
        return Err(hub_error(
            io::ErrorKind::InvalidData,
            format!(
                "{}: a redirect from https to plain http ({}) is refused",
                redacted(from.as_str()),
                redacted(to.as_str())
            ),
        ));
    }
    Ok(to)
}

/// The `rel="next"` target of a `Link` header.
fn next_link(headers: &HeaderMap) -> Option<String> {
    let link = headers.get(reqwest::header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| {
                target
                    .trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_owned()
            })
    })
}

/// What `GET /api/models/{repo}/revision/{rev}` answers, of what is read here.
#[derive(Debug, Deserialize)]
struct RevisionInfo {
    /// The commit the revision names.
    sha: Option<String>,
}

/// One entry of a tree listing: a file, or anything else (a directory), left alone.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum TreeEntry {
    File(FileEntry),
    #[serde(other)]
    Other,
}

/// A file of a tree listing, as the Hub lists one.
#[derive(Debug, Deserialize)]
struct FileEntry {
    path: String,
    size: u64,
    /// The git blob id (of the LFS pointer, for an LFS file).
    oid: String,
    /// An LFS file's content: its SHA-256 and size.
    lfs: Option<LfsEntry>,
}

#[derive(Debug, Deserialize)]
struct LfsEntry {
    oid: String,
    size: u64,
}

/// A listed file as a [`TreeFile`]; `None` when its ids are not hex digests (a name made of
/// them becomes a path in the cache) or its LFS size is not its size.
fn tree_file(entry: FileEntry) -> Option<TreeFile> {
    if !is_hex(&entry.oid) {
        return None;
    }
    let sha256 = match entry.lfs {
        None => None,
        Some(lfs) if lfs.oid.len() == 64 && is_hex(&lfs.oid) && lfs.size == entry.size => {
            Some(lfs.oid.to_ascii_lowercase())
        }
        Some(_) => return None,
    };
    Some(TreeFile {
        path: entry.path,
        size: entry.size,
        oid: entry.oid.to_ascii_lowercase(),
        sha256,
    })
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.len() <= 128 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `text` is a full commit id (40 hex digits).
pub(crate) fn is_commit(text: &str) -> bool {
    text.len() == 40 && is_hex(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file of one tree entry, or why it is none.
    fn file_of(entry: serde_json::Value) -> Result<Option<TreeFile>, String> {
        match serde_json::from_value::<TreeEntry>(entry).map_err(|e| e.to_string())? {
            TreeEntry::File(file) => tree_file(file).map(Some).ok_or_else(|| "odd".to_owned()),
            TreeEntry::Other => Ok(None),
        }
    }

    #[test]
    fn tree_entries_parse_as_the_hub_lists_them() {
        let lfs = serde_json::json!({"type":"file","oid":"ab12","size":10,"path":"m.safetensors",
            "lfs":{"oid":"A".repeat(64),"size":10,"pointerSize":134}, "xetHash": "x"});
        let file = file_of(lfs).unwrap().unwrap();
        assert_eq!(file.sha256.as_deref(), Some("a".repeat(64).as_str()));
        assert_eq!(file.blob(), "a".repeat(64));
        let plain = serde_json::json!({"type":"file","oid":"cd34","size":3,"path":"config.json"});
        assert_eq!(file_of(plain).unwrap().unwrap().blob(), "cd34");
        let null_lfs = serde_json::json!({"type":"file","oid":"cd","size":3,"path":"a","lfs":null});
        assert_eq!(file_of(null_lfs).unwrap().unwrap().sha256, None);
        // A directory, or an entry of a kind not known yet: not a file, and no error.
        let dir = serde_json::json!({"type":"directory","oid":"ab","size":0,"path":"1_Pooling"});
        assert_eq!(file_of(dir), Ok(None));
        assert_eq!(
            file_of(serde_json::json!({"type":"submodule","path":"x"})),
            Ok(None)
        );
        for bad in [
            serde_json::json!({"type":"file","oid":"../x","size":3,"path":"a"}),
            serde_json::json!({"type":"file","oid":"ab","size":-1,"path":"a"}),
            serde_json::json!({"type":"file","oid":"ab","path":"a"}),
            serde_json::json!({"type":"file","oid":"ab","size":3,"path":"a",
                "lfs":{"oid":"../../etc/passwd","size":3}}),
            serde_json::json!({"type":"file","oid":"ab","size":3,"path":"a",
                "lfs":{"oid":"a".repeat(64),"size":4}}),
            serde_json::json!({"oid":"ab","size":3,"path":"a"}),
        ] {
            assert!(file_of(bad.clone()).is_err(), "{bad}");
        }
        let info: RevisionInfo =
            serde_json::from_value(serde_json::json!({"id": "a/b", "sha": "c", "siblings": []}))
                .unwrap();
        assert_eq!(info.sha.as_deref(), Some("c"));
    }

    #[test]
    fn next_links_are_found() {
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::LINK,
            HeaderValue::from_static("<https://hf.co/api/x?cursor=2>; rel=\"next\""),
        );
        assert_eq!(
            next_link(&headers).as_deref(),
            Some("https://hf.co/api/x?cursor=2")
        );
        assert_eq!(next_link(&HeaderMap::new()), None);
    }

    #[test]
    fn redirects_keep_to_http_and_never_downgrade() {
        let from = url::Url::parse("https://hf.co/o/n/resolve/c/f").unwrap();
        let with = |location: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                reqwest::header::LOCATION,
                HeaderValue::from_static(location),
            );
            redirect_target(&from, &headers)
        };
        assert_eq!(
            with("https://cdn.hf.co/x?sig=1").unwrap().as_str(),
            "https://cdn.hf.co/x?sig=1"
        );
        assert_eq!(
            with("/o/m/resolve/c/f").unwrap().as_str(),
            "https://hf.co/o/m/resolve/c/f"
        );
        assert!(
            with("http://cdn.hf.co/x")
                .unwrap_err()
                .to_string()
                .contains("plain http")
        );
        assert!(
            with("file:///etc/passwd")
                .unwrap_err()
                .to_string()
                .contains("file://")
        );
    }
}
