//! Reading an object's bytes: ranged `GET`s, as many at once as the store's permits allow,
//! each conditional on the version the header was read at and checked against it, streamed into
//! the destination under the bandwidth cap; a body cut short without an ETag to resume under is
//! asked for again. Also how an object_store error is told as an `io::Error`.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStoreExt};

use crate::client::RefusedRedirect;
use crate::location::redacted_text;
use crate::reader::Object;
use crate::store::Inner;
use crate::version::Version;

/// An error of a store of a caller's own making ([`Remote::with_store`]), carried through
/// object_store's error as its source: its kind is the one the load reports, and its words are
/// shown as they are (redacted).
///
/// [`Remote::with_store`]: crate::Remote::with_store
#[derive(Debug)]
pub struct StoreFailure(pub io::Error);

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StoreFailure {}

/// The `io::ErrorKind` closest to an object_store error.
fn kind_of(e: &object_store::Error) -> io::ErrorKind {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(failure) = error.downcast_ref::<StoreFailure>() {
            return failure.0.kind();
        }
        source = error.source();
    }
    match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        object_store::Error::InvalidPath { .. } => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    }
}

/// What an object_store error says, or what the redirect policy said when it was a refused
/// redirect (reqwest reports that one only as "error following redirect").
pub(crate) fn describe(e: &object_store::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<RefusedRedirect>() {
            return refused.to_string();
        }
        // A store's own words (the Hub's error codes, a signed URL refused) as they are.
        if let Some(failure) = error.downcast_ref::<StoreFailure>() {
            return redacted_text(&failure.to_string());
        }
        source = error.source();
    }
    if let Some(words) = transport_failure(e) {
        return words;
    }
    // object_store's messages name the request's URL, with the login of an endpoint option
    // and a query (an Azure SAS token, say) in it.
    redacted_text(&e.to_string())
}

/// `host:port` of a URL.
fn host_port(url: &url::Url) -> String {
    let name = url.host_str().unwrap_or_default();
    match url.port_or_known_default() {
        Some(port) => format!("{name}:{port}"),
        None => name.to_owned(),
    }
}

/// The first `http(s)://` URL in `text`.
fn url_in(text: &str) -> Option<url::Url> {
    let start = text.find("https://").or_else(|| text.find("http://"))?;
    let end = text[start..]
        .find(char::is_whitespace)
        .map_or(text.len(), |n| start + n);
    url::Url::parse(&text[start..end]).ok()
}

/// What kept a request from getting an answer, in words, and where: `connection refused by
/// 127.0.0.1:9`, `DNS lookup of example.invalid failed`, `timed out talking to host:443`, `TLS
/// handshake with host:443 failed: ...`; `None` when the server answered (its status says
/// what went wrong) or the cause is none of these. object_store and reqwest say all of these
/// as "error sending request".
pub fn transport_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut host = None;
    let mut words: Option<&str> = None;
    let mut tls_detail = None;
    // Words are looked for from reqwest's error down: above it, object_store's messages may
    // quote what a server answered.
    let mut below_reqwest = false;
    let mut source = Some(e);
    while let Some(error) = source {
        if let Some(request) = error.downcast_ref::<reqwest::Error>() {
            if request.status().is_some() {
                // The server answered: its status says what went wrong.
                return None;
            }
            below_reqwest = true;
            if let Some(url) = request.url() {
                host.get_or_insert_with(|| host_port(url));
            }
            if request.is_timeout() {
                words.get_or_insert("timed out");
            }
        }
        if let Some(io) = error.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::ConnectionRefused => words = Some("connection refused"),
                io::ErrorKind::ConnectionReset => words = Some("connection reset"),
                io::ErrorKind::TimedOut => words = Some("timed out"),
                _ => {}
            }
        }
        let text = error.to_string();
        // object_store drops the URL from reqwest's error but names it in its own message.
        if host.is_none() {
            host = url_in(&text).map(|url| host_port(&url));
        }
        let dns = text.contains("dns error") || text.contains("failed to lookup address");
        let tls = error.downcast_ref::<rustls::Error>().is_some()
            || text.contains("tls handshake")
            || text.contains("invalid peer certificate");
        if below_reqwest && dns {
            words = Some("dns");
        } else if below_reqwest && tls {
            words = Some("tls");
            tls_detail = Some(text);
        }
        source = error.source();
    }
    let host = host?;
    Some(match words? {
        "dns" => format!(
            "DNS lookup of {} failed (no such host?)",
            host.rsplit_once(':')
                .map_or(host.as_str(), |(name, _)| name)
        ),
        "tls" => format!(
            "TLS handshake with {host} failed: {}",
            tls_detail.unwrap_or_default()
        ),
        "connection refused" => format!("connection refused by {host}"),
        "connection reset" => format!("connection reset by {host}"),
        other => format!("{other} talking to {host}"),
    })
}

/// An object_store error as an `io::Error` of the closest kind, saying what [`describe`] says.
pub(crate) fn io_error(e: &object_store::Error) -> io::Error {
    io::Error::new(kind_of(e), describe(e))
}

impl Inner {
    /// Fills `dst` with `object`'s bytes from `offset`: ranges of `range_size`, fetched
    /// concurrently within the store's request limit. All or an error.
    pub(crate) async fn fetch(
        &self,
        object: &Object,
        offset: u64,
        dst: &mut [u8],
    ) -> io::Result<()> {
        let ranges = dst
            .chunks_mut(self.range_size)
            .scan(offset, |at, piece| {
                let start = *at;
                *at += piece.len() as u64;
                Some(self.fetch_range(object, start, piece))
            })
            .collect::<Vec<_>>();
        futures::future::try_join_all(ranges).await.map(|_| ())
    }

    /// `error` from a request for `object`, or that the object changed, when it did (a server
    /// without ETags answers a read past a shrunk object with 416, say).
    async fn diagnose(&self, object: &Object, error: io::Error) -> io::Error {
        self.heads.fetch_add(1, Ordering::Relaxed);
        match self.store.head(&object.key).await {
            Ok(meta) => match object.version.differs(&Version::of(&meta)) {
                Some(detail) => self.changed(object, &detail),
                None => error,
            },
            Err(_) => error,
        }
    }

    /// One ranged `GET`, conditional on `object`'s version, streamed into `dst`. Without an
    /// ETag a body cut short is not resumed: the whole range is asked for again, at most
    /// `max_retries` times (with an ETag object_store resumes it, conditional on the ETag).
    async fn fetch_range(&self, object: &Object, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        let mut retries = 0;
        loop {
            match self.fetch_range_once(object, offset, dst).await {
                Err(Failure::Body(_))
                    if object.version.etag.is_none() && retries < self.max_retries =>
                {
                    let doubling = 1u32 << retries.min(8);
                    let backoff = self
                        .retry_backoff
                        .saturating_mul(doubling)
                        .min(Duration::from_secs(15));
                    retries += 1;
                    tokio::time::sleep(backoff).await;
                }
                Err(Failure::Body(e) | Failure::Request(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }

    async fn fetch_range_once(
        &self,
        object: &Object,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Failure> {
        let end = offset + dst.len() as u64;
        let url = &object.url;
        let at = |what: String| format!("GET {url} bytes {offset}..{end}: {what}");
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| Failure::Request(io::Error::other(at(e.to_string()))))?;
        self.gets.fetch_add(1, Ordering::Relaxed);
        let version = &object.version;
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: version.etag.clone(),
            // Only without an ETag: If-Match is the stronger condition, and a server evaluates
            // If-Unmodified-Since only when If-Match is absent.
            if_unmodified_since: version.last_modified.filter(|_| version.etag.is_none()),
            ..GetOptions::default()
        };
        let result = match self.store.get_opts(&object.key, options).await {
            Ok(result) => result,
            Err(e @ object_store::Error::Precondition { .. }) => {
                return Err(Failure::Request(self.changed(object, &describe(&e))));
            }
            Err(e) => {
                let error = io::Error::new(kind_of(&e), at(describe(&e)));
                return Err(Failure::Request(self.diagnose(object, error).await));
            }
        };
        // Every response is checked: a server may ignore the condition.
        if let Some(detail) = version.differs(&Version::of(&result.meta)) {
            return Err(Failure::Request(self.changed(object, &detail)));
        }
        if result.range != (offset..end) {
            return Err(Failure::Request(io::Error::new(
                io::ErrorKind::InvalidData,
                at(format!("the server sent bytes {:?}", result.range)),
            )));
        }
        let mut body = result.into_stream();
        let mut filled = 0usize;
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| Failure::Body(io::Error::new(kind_of(&e), at(describe(&e)))))?;
            if let Some(pace) = &self.pace {
                pace.take(chunk.len()).await;
            }
            let Some(target) = dst.get_mut(filled..filled + chunk.len()) else {
                return Err(Failure::Request(io::Error::new(
                    io::ErrorKind::InvalidData,
                    at("the body is longer than the range".to_owned()),
                )));
            };
            target.copy_from_slice(&chunk);
            filled += chunk.len();
            self.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        if filled != dst.len() {
            return Err(Failure::Body(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                at(format!("the body ended after {filled} bytes")),
            )));
        }
        // Where a caller asked: the bytes go there too (the Hugging Face cache).
        if let Some(tee) = self.tee.get() {
            tee.received(object.key.as_ref(), offset, dst)
                .map_err(Failure::Request)?;
        }
        Ok(())
    }

    /// After a read of `object`: where a caller asked, the object may now be complete there
    /// (the Hugging Face cache commits a file once it is whole and its SHA-256 is right, or
    /// fails naming it).
    pub(crate) fn settle(&self, object: &Object) -> io::Result<()> {
        match self.tee.get() {
            Some(tee) => tee.settle(object.key.as_ref()),
            None => Ok(()),
        }
    }
}

/// Why one ranged `GET` failed: the request (not retried here: object_store already did what
/// can be done), or the body after a good answer (cut short: the whole range may be asked for
/// again when there is no ETag to resume under).
enum Failure {
    Request(io::Error),
    Body(io::Error),
}
