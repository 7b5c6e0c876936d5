//! # backend-remote
//!
//! Checkpoints in object storage and on HTTP servers: `s3://bucket/prefix` (S3 and
//! S3-compatible stores), `gs://`, `az://`, and `http(s)://host/path`, read through the
//! [`object_store`] crate.
//!
//! A [`Remote`] is both halves the core needs:
//!
//! - a [`Store`]: a prefix is a directory (its index if there is one, else its `.safetensors`
//!   objects in natural order) and an object is a file. Headers come with ranged `GET`s (the
//!   8-byte length, then the header), never the whole object. A plain HTTP server has no
//!   listing, so an HTTP "directory" needs its `model.safetensors.index.json` or
//!   `model.safetensors`.
//! - a [`Reader`] ([`Remote::reader`]) of host memory: each read is split into ranges of
//!   [`Options::range_size`], fetched concurrently (at most [`Options::concurrency`] requests in
//!   flight for the whole `Remote`) and streamed straight into the destination as the body
//!   arrives. Nothing is buffered beyond the body chunks in flight, so the memory held does not
//!   grow with the checkpoint. A GPU backend puts this reader behind pinned bounce buffers.
//!
//! Every request after a file's header is read is conditional on the version seen then, by the
//! strongest validator the server gives: its ETag (`If-Match`), else its `Last-Modified`
//! (`If-Unmodified-Since`), else only its size. Every response is checked too (a server may
//! ignore the condition): its size and that validator must equal the recorded ones. An object
//! replaced during the load is an error naming it; nothing read from the new object is handed
//! out. A server with neither ETag nor `Last-Modified` can only be checked by size: a
//! replacement of the same size is then not seen, and the report says so (`unchanged_by`:
//! `size`). `Last-Modified` has whole seconds: a replacement within the second of the original
//! write is invisible to it.
//!
//! Transient failures (5xx, dropped connections, a body cut short) are retried by
//! `object_store` with exponential backoff, at most [`Options::max_retries`] times within
//! [`Options::retry_timeout`]; with an ETag, a body cut short resumes from where it stopped,
//! conditional on the same ETag. Without one, a cut body is never resumed (the rest could come
//! from another version): its whole range is asked for again, conditional and checked like the
//! first, at most [`Options::max_retries`] times.
//!
//! Calls block the calling thread until their requests are done, on a runtime of the `Remote`'s
//! own: from a plain thread, or from a blocking thread of the caller's async runtime
//! (`tokio::task::spawn_blocking`); a call from an async task (a runtime worker thread, or a
//! runtime's `block_on`) is an error, since it would stall that runtime. A `Remote` may be
//! dropped anywhere, in async code too. [`Options::interrupt`] ends a call within about 50 ms
//! of its predicate turning true (the Python door ties it to Ctrl-C), however long the server
//! takes to answer.
//!
//! Configuration is each cloud's standard environment (for S3: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`; a plain
//! `http://` endpoint is allowed because it says so), then [`Options::config`] (object_store's
//! keys, such as `aws_endpoint` or `allow_http`), which wins.

mod client;
mod location;
mod pace;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{
    BackoffConfig, ClientConfigKey, ClientOptions, GetOptions, GetRange, ObjectMeta,
    ObjectStoreExt, RetryConfig,
};
use staging_core::{
    DeviceRegion, EntryKind, Error, FileIdentity, HostMemory, IoMode, ReadError, Reader, Store,
    StoreFile,
};

use client::{Connector, Redirects, RefusedRedirect};
use location::{Location, Login};
pub use location::{REDACTED, Scheme, redacted, redacted_path, redacted_text};
/// The trait of object stores, for a caller's own ([`Remote::open_with`]).
pub use object_store::ObjectStore;
use pace::Pace;
use std::future::Future;

/// How a [`Remote`] reads. `Debug` shows no secret: the value of every store option that may
/// hold one ([`is_secret_option`]) reads `<redacted>`.
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// The most ranged `GET`s in flight at once, over every read of the `Remote` (default 16).
    pub concurrency: usize,
    /// Bytes asked for by one ranged `GET` (default 8 MiB, as Run:ai Model Streamer uses).
    /// Against a loopback server on a 2-core VM (median of 6 loads of 1 GiB): 2 MiB 1.08 GB/s,
    /// 4 MiB 1.46, 8 MiB 1.50, 16 MiB 1.16; a far store, with latency per request, favours the
    /// larger ranges.
    pub range_size: usize,
    /// How many times a request that failed transiently is retried (default 5).
    pub max_retries: usize,
    /// The first retry's backoff; each later one doubles it, up to 15 s (default 100 ms).
    pub retry_backoff: Duration,
    /// No retry starts later than this after the first attempt (default 2 min).
    pub retry_timeout: Duration,
    /// A request that has not finished after this long fails (and is retried) (default 5 min;
    /// a ranged `GET` of 8 MiB takes well under a second on any working link).
    pub request_timeout: Duration,
    /// At most this many bytes per second over every request (default: no cap).
    pub bandwidth: Option<u64>,
    /// object_store configuration keys and values (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `allow_http`, `google_service_account`, `azure_storage_account_name`,
    /// ...), applied after the environment.
    pub config: Vec<(String, String)>,
    /// Asked every 50 ms while a call waits on the network: once it says true, the call ends
    /// with an error, "interrupted" (default: none).
    pub interrupt: Option<Interrupt>,
    /// Hosts a redirect may lead to besides the one asked for: a host (`cdn.example.com`),
    /// `*.domain` (its hosts) or `*` (any). A redirect on the same host, or between two hosts
    /// of one cloud's own domain (`*.amazonaws.com`, `*.googleapis.com`,
    /// `*.core.windows.net`), needs none; any other is refused with an error naming both hosts
    /// (default: none).
    pub allow_redirects: Vec<String>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("concurrency", &self.concurrency)
            .field("range_size", &self.range_size)
            .field("max_retries", &self.max_retries)
            .field("retry_backoff", &self.retry_backoff)
            .field("retry_timeout", &self.retry_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("bandwidth", &self.bandwidth)
            .field("config", &redacted_options(&self.config))
            .field("interrupt", &self.interrupt)
            .field("allow_redirects", &self.allow_redirects)
            .finish()
    }
}

/// Whether the store option `key` may hold a secret, by the stores' own keys: `key` is parsed
/// as each store's configuration key (S3's, GCS's, Azure's, the HTTP client's: aliases and
/// prefixes as object_store takes them), and only the keys this crate knows to be settings
/// (a region, an endpoint, a timeout) are not secret. A key no store knows, and every
/// credential, token, signature or customer-held encryption key, is.
pub fn is_secret_option(key: &str) -> bool {
    use object_store::aws::AmazonS3ConfigKey as S3;
    use object_store::azure::AzureConfigKey as Az;
    use object_store::gcp::GoogleConfigKey as Gcs;
    let client = |k: &ClientConfigKey| !matches!(k, ClientConfigKey::ProxyUrl);
    let s3 = key.parse::<S3>().ok().map(|k| match k {
        S3::Client(k) => client(&k),
        S3::Bucket
        | S3::Region
        | S3::DefaultRegion
        | S3::Endpoint
        | S3::S3Endpoint
        | S3::StsEndpoint
        | S3::ImdsV1Fallback
        | S3::DisableBulkDelete
        | S3::VirtualHostedStyleRequest
        | S3::S3Express
        | S3::UnsignedPayload
        | S3::Checksum
        | S3::MetadataEndpoint
        | S3::SkipSignature
        | S3::CopyIfNotExists
        | S3::ConditionalPut
        | S3::DisableTagging
        | S3::RequestPayer => true,
        _ => false,
    });
    let gcs = key.parse::<Gcs>().ok().map(|k| match k {
        Gcs::Client(k) => client(&k),
        Gcs::Bucket | Gcs::BaseUrl | Gcs::SkipSignature => true,
        _ => false,
    });
    let azure = key.parse::<Az>().ok().map(|k| match k {
        Az::Client(k) => client(&k),
        Az::AccountName
        | Az::ContainerName
        | Az::Endpoint
        | Az::UseEmulator
        | Az::UseFabricEndpoint
        | Az::UseAzureCli
        | Az::SkipSignature
        | Az::DisableTagging
        | Az::AuthorityHost
        | Az::AuthorityId
        | Az::ClientId
        | Az::ObjectId
        | Az::MsiEndpoint
        | Az::MsiResourceId => true,
        _ => false,
    });
    let http = key.parse::<ClientConfigKey>().ok().map(|k| client(&k));
    // Public only when every store that knows the key says it is a plain setting.
    let verdicts = [s3, gcs, azure, http];
    !(verdicts.iter().any(Option::is_some) && verdicts.iter().flatten().all(|public| *public))
}

/// `options` as they may be shown: the value of a secret key ([`is_secret_option`]) replaced
/// by `<redacted>`, and a login or query in any other value's URL taken off ([`redacted`]).
pub fn redacted_options(options: &[(String, String)]) -> Vec<(String, String)> {
    options
        .iter()
        .map(|(key, value)| {
            let shown = if is_secret_option(key) {
                REDACTED.to_owned()
            } else {
                redacted(value)
            };
            (key.clone(), shown)
        })
        .collect()
}

/// A predicate that interrupts a [`Remote`]'s calls ([`Options::interrupt`]).
#[derive(Clone)]
pub struct Interrupt(Arc<dyn Fn() -> bool + Send + Sync>);

impl Interrupt {
    /// Interrupts the calls once `fired` returns true (it is called from the I/O threads).
    pub fn new(fired: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(fired))
    }

    fn fired(&self) -> bool {
        (self.0)()
    }
}

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interrupt(..)")
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            concurrency: 16,
            range_size: 8 << 20,
            max_retries: 5,
            retry_backoff: Duration::from_millis(100),
            retry_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(300),
            bandwidth: None,
            config: Vec::new(),
            interrupt: None,
            allow_redirects: Vec::new(),
        }
    }
}

/// How a load knows its objects are the versions whose headers it read (the report's
/// `unchanged_by`), weakest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Validator {
    /// The server gives ETags: every request is `If-Match`, every response's ETag compared.
    Etag,
    /// A weak ETag (`W/"..."`, which no `If-Match` can rest on: a server compares it strongly
    /// and refuses every request) and `Last-Modified`: every request is
    /// `If-Unmodified-Since`, every response's `Last-Modified` and weak ETag compared.
    WeakEtagLastModified,
    /// No ETag but `Last-Modified`: every request is `If-Unmodified-Since`, every response's
    /// `Last-Modified` compared (whole seconds).
    LastModified,
    /// A weak ETag and no `Last-Modified`: every response's size and weak ETag compared.
    WeakEtagSize,
    /// Neither: only the size is compared, so a replacement of the same size is not seen.
    Size,
}

impl Validator {
    /// Its name in reports: `etag`, `weak-etag+last-modified`, `last-modified`,
    /// `weak-etag+size`, `size`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Etag => "etag",
            Self::WeakEtagLastModified => "weak-etag+last-modified",
            Self::LastModified => "last-modified",
            Self::WeakEtagSize => "weak-etag+size",
            Self::Size => "size",
        }
    }
}

/// What a file was when its header was read: the version every later request is conditional on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    size: u64,
    /// A strong ETag: the one validator that names the bytes.
    etag: Option<String>,
    /// A weak ETag (`W/"..."`): no condition can rest on it (RFC 9110 compares `If-Match`
    /// strongly, so a weak tag never matches and a conditional request always fails), but a
    /// response whose weak tag differs is another version all the same.
    weak_etag: Option<String>,
    /// `None` when the server sent no `Last-Modified` (object_store then says the epoch).
    last_modified: Option<DateTime<Utc>>,
}

impl Version {
    fn of(meta: &ObjectMeta) -> Self {
        let (weak_etag, etag) = match &meta.e_tag {
            Some(tag) if tag.starts_with("W/") => (Some(tag.clone()), None),
            tag => (None, tag.clone()),
        };
        Self {
            size: meta.size,
            etag,
            weak_etag,
            last_modified: (meta.last_modified != DateTime::<Utc>::UNIX_EPOCH)
                .then_some(meta.last_modified),
        }
    }

    fn validator(&self) -> Validator {
        match (&self.etag, self.weak_etag.is_some(), &self.last_modified) {
            (Some(_), ..) => Validator::Etag,
            (None, true, Some(_)) => Validator::WeakEtagLastModified,
            (None, false, Some(_)) => Validator::LastModified,
            (None, true, None) => Validator::WeakEtagSize,
            (None, false, None) => Validator::Size,
        }
    }

    /// The version as the core's file identity: no device, the ETag's hash for the inode, the
    /// size, and the modification time.
    fn identity(&self) -> FileIdentity {
        // FNV-1a of the ETag: equal ETags give equal identities.
        let ino = self
            .etag
            .as_deref()
            .or(self.weak_etag.as_deref())
            .unwrap_or("")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let modified = self.last_modified.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        FileIdentity {
            dev: 0,
            ino,
            size: self.size,
            mtime: modified.timestamp(),
            mtime_nsec: i64::from(modified.timestamp_subsec_nanos()),
        }
    }

    /// How `now` (what a response says) differs from this version, by its size and this
    /// version's validator; `None` when it is the same version as far as they tell.
    fn differs(&self, now: &Version) -> Option<String> {
        if now.size != self.size {
            return Some(format!("it is now {} bytes", now.size));
        }
        if let Some(was) = &self.weak_etag {
            match (&now.weak_etag, &now.etag) {
                (Some(is), _) | (None, Some(is)) if is != was => {
                    return Some(format!("it is now ETag {is}"));
                }
                _ => {}
            }
        }
        let by_date = matches!(
            self.validator(),
            Validator::LastModified | Validator::WeakEtagLastModified
        );
        match (self.validator(), &now.etag, &now.last_modified) {
            (Validator::Etag, Some(etag), _) if Some(etag) != self.etag.as_ref() => {
                Some(format!("it is now ETag {etag}"))
            }
            (Validator::Etag, None, _) => Some("a response carried no ETag".to_owned()),
            (_, _, Some(date)) if by_date && Some(date) != self.last_modified.as_ref() => {
                Some(format!("it is now Last-Modified {}", date.to_rfc2822()))
            }
            (_, _, None) if by_date => Some("a response carried no Last-Modified".to_owned()),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match (&self.etag, &self.last_modified) {
            (Some(etag), _) => format!("ETag {etag}"),
            (None, _) if self.weak_etag.is_some() => {
                let by = match &self.last_modified {
                    Some(date) => format!("Last-Modified {}", date.to_rfc2822()),
                    None => format!("{} bytes", self.size),
                };
                format!("{by} (its ETag is weak)")
            }
            (None, Some(date)) => format!("Last-Modified {}", date.to_rfc2822()),
            (None, None) => format!("{} bytes", self.size),
        }
    }
}

/// An object's version as its header was read, and the first difference any response showed.
#[derive(Debug, Clone)]
struct Tracked {
    version: Version,
    changed: Option<String>,
}

/// Counters of what a [`Remote`] asked for and received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `GET` requests made (ranged), not counting `object_store`'s own retries.
    pub gets: u64,
    /// `HEAD` and list requests made.
    pub heads: u64,
    /// Body bytes received by `GET`s.
    pub bytes: u64,
}

/// `Debug` shows no secret: the store is only named (object_store's own `Debug` of a store
/// prints its credentials, an Azure SAS token in clear, say).
struct Inner {
    root: Location,
    store: Arc<dyn ObjectStore>,
    runtime: OwnedRuntime,
    interrupt: Option<Interrupt>,
    permits: tokio::sync::Semaphore,
    pace: Option<Pace>,
    range_size: usize,
    max_retries: usize,
    retry_backoff: Duration,
    /// Every version of each object (by URL) whose header was read, the latest last: reads
    /// are opened on the latest, and a load whose header is of an older one is refused; what
    /// a response showed of one version (`changed`) is never held against another.
    versions: Mutex<HashMap<String, Vec<Tracked>>>,
    /// What each `HEAD` answered, by key, since the last [`Remote::revalidate`]: opening one
    /// checkpoint asks once per file (parsing asks whether a path is a file, then opens it; the
    /// load opens it again). The next open asks again, so a replaced object is seen.
    metas: Mutex<HashMap<String, ObjectMeta>>,
    /// Where redirects may lead, and where they led.
    redirects: Arc<Redirects>,
    /// The login of the URL the store was opened with (sent by its client).
    login: Option<Login>,
    gets: AtomicU64,
    heads: AtomicU64,
    bytes: AtomicU64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("root", &self.root.root)
            .field("store", &format_args!("<{:?} store>", self.root.scheme))
            .field("range_size", &self.range_size)
            .field("max_retries", &self.max_retries)
            .field("redirects", &self.redirects)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The `Remote`'s runtime, shut down without blocking when dropped: dropping a tokio runtime
/// from async code panics, and a `Load` may well be dropped there.
#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    fn get(&self) -> io::Result<&tokio::runtime::Runtime> {
        self.0
            .as_ref()
            .ok_or_else(|| io::Error::other("the I/O runtime was shut down"))
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

const IN_ASYNC_TASK: &str = "called from an async task, which it would block: load from a \
     blocking thread (tokio::task::spawn_blocking)";

/// Whether this thread is running an async task (a runtime worker thread, or a runtime's
/// `block_on`): there, a task is polled under tokio's cooperative budget, which runs out; on a
/// blocking thread (`spawn_blocking`) or any other thread it never does.
fn in_async_task() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for _ in 0..=1024 {
        let mut unit = std::pin::pin!(tokio::task::coop::consume_budget());
        if unit.as_mut().poll(&mut cx).is_pending() {
            return true;
        }
    }
    false
}

/// One object store or HTTP server, opened at a URL's root: the [`Store`] a checkpoint is
/// opened through and the source of its [`RemoteReader`]. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Remote {
    inner: Arc<Inner>,
}

/// An error about `path` (a URL, shown without its login or query), for the core's error type.
fn path_error(path: &Path, kind: io::ErrorKind, message: impl Into<String>) -> Error {
    at_path(path, io::Error::new(kind, message.into()))
}

/// `source`, about `path` (a URL, shown without its login or query).
fn at_path(path: &Path, source: io::Error) -> Error {
    Error::Io {
        path: redacted_path(path),
        source,
    }
}

/// The `io::ErrorKind` closest to an object_store error.
fn kind_of(e: &object_store::Error) -> io::ErrorKind {
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
fn describe(e: &object_store::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<RefusedRedirect>() {
            return refused.to_string();
        }
        source = error.source();
    }
    // object_store's messages name the request's URL, with the login of an endpoint option
    // and a query (an Azure SAS token, say) in it.
    redacted_text(&e.to_string())
}

/// An object_store error as an `io::Error` of the closest kind, saying what [`describe`] says.
fn io_error(e: &object_store::Error) -> io::Error {
    io::Error::new(kind_of(e), describe(e))
}

/// Applies `config` to a builder whose keys parse from strings.
fn configure<B, K>(
    builder: B,
    config: &[(String, String)],
    with: impl Fn(B, K, String) -> B,
) -> Result<B, String>
where
    K: FromStr<Err = object_store::Error>,
{
    config.iter().try_fold(builder, |b, (key, value)| {
        let parsed = key
            .parse::<K>()
            .map_err(|e| format!("unknown option {key:?}: {e}"))?;
        Ok(with(b, parsed, value.clone()))
    })
}

fn build_store(
    location: &Location,
    options: &Options,
    connector: Connector,
) -> Result<Arc<dyn ObjectStore>, String> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    use object_store::http::HttpBuilder;

    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: options.retry_backoff,
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: options.max_retries,
        retry_timeout: options.retry_timeout,
    };
    let client = ClientOptions::new()
        .with_timeout(options.request_timeout)
        .with_connect_timeout(Duration::from_secs(10));
    let bucket = location
        .root
        .split_once("://")
        .map_or("", |(_, authority)| authority);
    let store: Arc<dyn ObjectStore> = match location.scheme {
        Scheme::S3 => {
            let builder = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(client)
                .with_http_connector(connector);
            let mut builder = configure(builder, &options.config, |b, k: AmazonS3ConfigKey, v| {
                b.with_config(k, v)
            })?;
            // An S3-compatible endpoint given as plain http:// says it is to be used so.
            if builder
                .get_config_value(&AmazonS3ConfigKey::Endpoint)
                .is_some_and(|e| e.starts_with("http://"))
            {
                builder = builder.with_allow_http(true);
            }
            Arc::new(builder.build().map_err(|e| describe(&e))?)
        }
        Scheme::Gcs => {
            let builder = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(client)
                .with_http_connector(connector);
            let builder = configure(builder, &options.config, |b, k: GoogleConfigKey, v| {
                b.with_config(k, v)
            })?;
            Arc::new(builder.build().map_err(|e| describe(&e))?)
        }
        Scheme::Azure => {
            let builder = MicrosoftAzureBuilder::from_env()
                .with_container_name(bucket)
                .with_retry(retry)
                .with_client_options(client)
                .with_http_connector(connector);
            let builder = configure(builder, &options.config, |b, k: AzureConfigKey, v| {
                b.with_config(k, v)
            })?;
            Arc::new(builder.build().map_err(|e| describe(&e))?)
        }
        Scheme::Http => {
            let client = configure(client, &options.config, |c, k, v| c.with_config(k, v))?
                .with_allow_http(location.root.starts_with("http://"));
            let builder = HttpBuilder::new()
                .with_url(location.root.as_str())
                .with_retry(retry)
                .with_client_options(client)
                .with_http_connector(connector);
            Arc::new(builder.build().map_err(|e| describe(&e))?)
        }
    };
    Ok(store)
}

impl Remote {
    /// Opens the store `url` is in (`s3://bucket/...`: the bucket; `https://host/...`: the
    /// server). Nothing is requested yet; a URL this crate cannot read, an unknown option or a
    /// store that cannot be configured (no region, say) is an error naming `url`.
    pub fn open(url: &Path, options: &Options) -> Result<Self, Error> {
        Self::open_with(url, None, options)
    }

    /// As [`open`](Self::open), reading through the caller's `store` when one is given (its
    /// credentials, its client, its middleware) instead of one built from `url` and the
    /// options' `config`; `url` still names the objects (its bucket or host is the caller's
    /// store's business).
    pub fn open_with(
        url: &Path,
        store: Option<Arc<dyn ObjectStore>>,
        options: &Options,
    ) -> Result<Self, Error> {
        let invalid = |message: String| path_error(url, io::ErrorKind::InvalidInput, message);
        if in_async_task() {
            return Err(invalid(IN_ASYNC_TASK.to_owned()));
        }
        let location = Location::parse(url).map_err(&invalid)?;
        let login = Location::login(url).map_err(&invalid)?;
        let root = Location {
            key: Key::default(),
            ..location.clone()
        };
        let redirects = Arc::new(Redirects::new(location.scheme, &options.allow_redirects));
        let store = match store {
            Some(_) if login.is_some() => {
                return Err(invalid(
                    "a login in the URL is not sent through a caller's own object store: give \
                     the store its credentials"
                        .to_owned(),
                ));
            }
            Some(store) => store,
            None => {
                let connector = Connector {
                    redirects: Arc::clone(&redirects),
                    login: login.clone(),
                };
                build_store(&root, options, connector).map_err(&invalid)?
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("staging-remote")
            .enable_all()
            .build()
            .map_err(|e| invalid(format!("cannot start the I/O runtime: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                root,
                store,
                runtime: OwnedRuntime(Some(runtime)),
                interrupt: options.interrupt.clone(),
                permits: tokio::sync::Semaphore::new(options.concurrency.max(1)),
                pace: options.bandwidth.map(Pace::new),
                range_size: options.range_size.max(4096),
                max_retries: options.max_retries,
                retry_backoff: options.retry_backoff,
                versions: Mutex::new(HashMap::new()),
                metas: Mutex::new(HashMap::new()),
                redirects,
                login,
                gets: AtomicU64::new(0),
                heads: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
        })
    }

    /// The reader of this store's objects into host memory.
    pub fn reader(&self) -> RemoteReader {
        RemoteReader {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Whether `url` is an object of this store: the same `scheme://authority`, and no login,
    /// or the one the store was opened with (a URL with another login needs a store of its
    /// own, which sends that one).
    pub fn holds(&self, url: &Path) -> bool {
        self.inner.key(url).is_ok()
            && Location::login(url).is_ok_and(|login| login.is_none() || login == self.inner.login)
    }

    /// `scheme://authority` of the store.
    pub fn root(&self) -> &str {
        &self.inner.root.root
    }

    /// `url` as this store names it in reports and errors: its object's key under the store's
    /// root, without the login it may carry (`http://user:password@host/a%20b` is
    /// `http://host/a%20b`). An error when `url` is not of this store.
    pub fn public_path(&self, url: &Path) -> Result<PathBuf, Error> {
        let key = self.inner.key(url).map_err(|e| at_path(url, e))?;
        Ok(PathBuf::from(self.inner.root.url_of(&key)))
    }

    /// Forgets what the store's objects were (the `HEAD`s answered so far), so that the next
    /// checkpoint opened sees each object as it is now, replaced or not. A load already open
    /// keeps reading the versions its headers were read at, and fails if one was replaced.
    pub fn revalidate(&self) {
        self.inner
            .metas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // The redirects a load reports are those of its own checkpoint's objects.
        self.inner.redirects.forget();
    }

    /// Each redirect followed to another host so far, as `URL -> host[:port]`.
    pub fn redirects(&self) -> Vec<String> {
        self.inner.redirects.followed()
    }

    /// What was asked for and received so far.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

impl Inner {
    fn stats(&self) -> Stats {
        Stats {
            gets: self.gets.load(Ordering::Relaxed),
            heads: self.heads.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// The location of the URL `dir` (a prefix of this store), to join names under.
    fn at(&self, dir: &Path) -> Result<Location, String> {
        let key = self.key(dir).map_err(|e| e.to_string())?;
        Ok(Location {
            key,
            ..self.root.clone()
        })
    }

    /// `path`'s object key, when `path` is a URL under this store's root.
    fn key(&self, path: &Path) -> io::Result<Key> {
        let location = Location::parse(path).map_err(io::Error::other)?;
        if location.root != self.root.root {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "not in {} (a checkpoint is read from one store)",
                    self.root.root
                ),
            ));
        }
        Ok(location.key)
    }

    /// Runs `future` to its end on this store's runtime, blocking this thread: a plain thread
    /// or a blocking thread of another runtime, never an async task. Interruptible.
    fn block_on<T>(&self, future: impl Future<Output = io::Result<T>>) -> io::Result<T> {
        let runtime = self.runtime.get()?;
        let future = self.interruptible(future);
        if tokio::runtime::Handle::try_current().is_err() {
            return runtime.block_on(future);
        }
        if in_async_task() {
            return Err(io::Error::other(IN_ASYNC_TASK));
        }
        // A blocking thread of the caller's runtime, whose context is set here (so tokio's
        // `block_on` would refuse): the future is polled here, with this store's runtime
        // entered, and that runtime's own threads drive its I/O and timers.
        let _entered = runtime.enter();
        futures::executor::block_on(future)
    }

    /// `future`, ended early with an "interrupted" error once the interrupt predicate fires.
    async fn interruptible<T>(&self, future: impl Future<Output = io::Result<T>>) -> io::Result<T> {
        let Some(interrupt) = &self.interrupt else {
            return future.await;
        };
        let watch = async {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if interrupt.fired() {
                    // Not `ErrorKind::Interrupted`: readers retry that one, as for EINTR.
                    return io::Error::other("interrupted");
                }
            }
        };
        let future = std::pin::pin!(future);
        let watch = std::pin::pin!(watch);
        match futures::future::select(future, watch).await {
            futures::future::Either::Left((done, _)) => done,
            futures::future::Either::Right((interrupted, _)) => Err(interrupted),
        }
    }

    /// `key`'s metadata: what its first `HEAD` through this `Remote` answered (see `metas`).
    fn head(&self, key: &Key) -> io::Result<ObjectMeta> {
        let metas = || self.metas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(meta) = metas().get(key.as_ref()) {
            return Ok(meta.clone());
        }
        self.heads.fetch_add(1, Ordering::Relaxed);
        let meta = self.block_on(async { self.store.head(key).await.map_err(|e| io_error(&e)) })?;
        metas().insert(key.as_ref().to_owned(), meta.clone());
        Ok(meta)
    }

    fn list(&self, prefix: &Key) -> io::Result<object_store::ListResult> {
        self.heads.fetch_add(1, Ordering::Relaxed);
        let prefix = Some(prefix).filter(|p| !p.as_ref().is_empty());
        self.block_on(async {
            self.store
                .list_with_delimiter(prefix)
                .await
                .map_err(|e| io_error(&e))
        })
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Tracked>>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `version` as the latest of `url` (the one reads opened from now on are
    /// conditional on); a version seen before keeps what was noted of it.
    fn record(&self, url: &str, version: &Version) {
        let mut versions = self.versions();
        let seen = versions.entry(url.to_owned()).or_default();
        let tracked = match seen.iter().position(|t| t.version == *version) {
            Some(i) => seen.remove(i),
            None => Tracked {
                version: version.clone(),
                changed: None,
            },
        };
        seen.push(tracked);
    }

    /// The latest version of `url` recorded.
    fn recorded(&self, url: &str) -> Option<Version> {
        let versions = self.versions();
        versions
            .get(url)
            .and_then(|seen| seen.last())
            .map(|t| t.version.clone())
    }

    /// Notes that a response showed `object` changed (kept, so that the tensor being read is
    /// not handed out even if the error that came with it was not the one reported), and
    /// returns the error.
    fn changed(&self, object: &Object, detail: &str) -> io::Error {
        let mut versions = self.versions();
        if let Some(tracked) = versions
            .get_mut(&object.url)
            .and_then(|seen| seen.iter_mut().find(|t| t.version == object.version))
        {
            tracked.changed.get_or_insert_with(|| detail.to_owned());
        }
        object.changed(detail)
    }

    /// The weakest validator of the objects opened so far.
    fn validator(&self) -> Option<Validator> {
        self.versions()
            .values()
            .flatten()
            .map(|t| t.version.validator())
            .max()
    }

    /// Opens `path`: its version as recorded when its header was read, else as it is now.
    fn object(&self, path: &Path) -> io::Result<Object> {
        let key = self.key(path)?;
        let url = self.root.url_of(&key);
        let version = match self.recorded(&url) {
            Some(version) => version,
            None => {
                let version = Version::of(&self.head(&key)?);
                self.record(&url, &version);
                version
            }
        };
        Ok(Object { key, url, version })
    }

    /// Fills `dst` with `object`'s bytes from `offset`: ranges of `range_size`, fetched
    /// concurrently within the store's request limit. All or an error.
    async fn fetch(&self, object: &Object, offset: u64, dst: &mut [u8]) -> io::Result<()> {
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
        Ok(())
    }
}

/// Why one ranged `GET` failed: the request (not retried here: object_store already did what
/// can be done), or the body after a good answer (cut short: the whole range may be asked for
/// again when there is no ETag to resume under).
enum Failure {
    Request(io::Error),
    Body(io::Error),
}

/// An object opened for reading, at the version its reads are conditional on.
#[derive(Debug)]
pub struct Object {
    key: Key,
    url: String,
    version: Version,
}

impl Object {
    fn changed(&self, detail: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} changed during the load (it was read at {}): {detail}",
                self.url,
                self.version.describe()
            ),
        )
    }
}

/// A file of a [`Remote`], open for its header.
struct RemoteFile {
    inner: Arc<Inner>,
    path: PathBuf,
    object: Object,
}

impl StoreFile for RemoteFile {
    fn size(&self) -> u64 {
        self.object.version.size
    }

    fn identity(&self) -> FileIdentity {
        self.object.version.identity()
    }

    fn read_exact(&self, offset: u64, len: u64) -> staging_core::Result<Vec<u8>> {
        let too_long = || Error::Header {
            path: self.path.clone(),
            reason: format!("{len} bytes at {offset} are past the end"),
        };
        let end = offset.checked_add(len).ok_or_else(too_long)?;
        if end > self.object.version.size {
            return Err(too_long());
        }
        let len = usize::try_from(len).map_err(|_| too_long())?;
        let mut buf = vec![0u8; len];
        if len > 0 {
            self.inner
                .block_on(self.inner.fetch(&self.object, offset, &mut buf))
                .map_err(|e| at_path(&self.path, e))?;
        }
        Ok(buf)
    }
}

impl Store for Remote {
    fn kind(&self, path: &Path) -> staging_core::Result<EntryKind> {
        let inner = &self.inner;
        let key = inner.key(path).map_err(|e| at_path(path, e))?;
        if key.as_ref().is_empty() {
            return Ok(EntryKind::Dir);
        }
        if inner.root.scheme == Scheme::Http {
            // No listing on a plain HTTP server: a file is named like one.
            let name = Location::file_name(&key).unwrap_or("");
            if !(name.ends_with(".safetensors") || name.ends_with(".json")) {
                return Ok(EntryKind::Dir);
            }
        }
        match inner.head(&key) {
            Ok(_) => Ok(EntryKind::File),
            Err(e) if e.kind() == io::ErrorKind::NotFound && inner.root.scheme != Scheme::Http => {
                let listed = inner.list(&key).map_err(|e| at_path(path, e))?;
                if listed.objects.is_empty() && listed.common_prefixes.is_empty() {
                    Err(path_error(
                        path,
                        io::ErrorKind::NotFound,
                        "no such object or prefix",
                    ))
                } else {
                    Ok(EntryKind::Dir)
                }
            }
            Err(e) => Err(at_path(path, e)),
        }
    }

    fn exists(&self, path: &Path) -> bool {
        self.inner
            .key(path)
            .and_then(|key| self.inner.head(&key))
            .is_ok()
    }

    fn open(&self, path: &Path) -> staging_core::Result<Box<dyn StoreFile + '_>> {
        let inner = &self.inner;
        let as_error = |e| at_path(path, e);
        let key = inner.key(path).map_err(as_error)?;
        let meta = inner.head(&key).map_err(as_error)?;
        let url = inner.root.url_of(&key);
        let version = Version::of(&meta);
        inner.record(&url, &version);
        Ok(Box::new(RemoteFile {
            inner: Arc::clone(inner),
            path: path.to_path_buf(),
            object: Object { key, url, version },
        }))
    }

    fn list(&self, dir: &Path) -> staging_core::Result<Vec<String>> {
        let inner = &self.inner;
        if inner.root.scheme == Scheme::Http {
            return Ok(Vec::new());
        }
        let as_error = |e| at_path(dir, e);
        let key = inner.key(dir).map_err(as_error)?;
        let listed = inner.list(&key).map_err(as_error)?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|o| Location::file_name(&o.location).map(str::to_owned))
            .collect())
    }

    fn join(&self, dir: &Path, name: &str) -> Result<PathBuf, String> {
        self.inner.at(dir)?.join(name).map(PathBuf::from)
    }

    fn entry(&self, dir: &Path, name: &str) -> Result<PathBuf, String> {
        self.inner.at(dir)?.child(name).map(PathBuf::from)
    }

    fn canonical(&self, path: &Path) -> staging_core::Result<Option<PathBuf>> {
        let inner = &self.inner;
        let as_error = |e| at_path(path, e);
        let key = inner.key(path).map_err(as_error)?;
        match inner.head(&key) {
            Ok(_) => Ok(Some(PathBuf::from(inner.root.url_of(&key)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(as_error(e)),
        }
    }
}

/// Reads a [`Remote`]'s objects into host memory ([`Remote::reader`]).
#[derive(Debug, Clone)]
pub struct RemoteReader {
    inner: Arc<Inner>,
}

impl RemoteReader {
    /// What was asked for and received so far.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Fills `dst` with `file`'s bytes from `offset` (all of them, or an error).
    pub fn read_into(&self, file: &Object, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        self.inner.block_on(self.inner.fetch(file, offset, dst))
    }
}

impl Reader for RemoteReader {
    type Space = HostMemory;
    type File = Object;

    fn name(&self) -> &str {
        "host"
    }

    fn mode(&self) -> IoMode {
        IoMode::Remote
    }

    fn open(&self, path: &Path) -> Result<Object, ReadError> {
        Ok(self.inner.object(path)?)
    }

    fn read_at(
        &self,
        file: &Object,
        offset: u64,
        mut dst: DeviceRegion<'_, HostMemory>,
    ) -> Result<usize, ReadError> {
        let size = file.version.size;
        if offset >= size {
            return Ok(0);
        }
        let available = usize::try_from(size - offset).unwrap_or(usize::MAX);
        let len = dst.len().min(available);
        let slice = dst.as_mut_slice();
        let Some(target) = slice.get_mut(..len) else {
            return Ok(0);
        };
        self.read_into(file, offset, target)?;
        Ok(len)
    }

    fn unchanged_by(&self) -> &'static str {
        self.inner.validator().unwrap_or(Validator::Etag).as_str()
    }

    fn redirects(&self) -> Vec<String> {
        self.inner.redirects.followed()
    }

    fn verify_unchanged(&self, path: &Path, identity: &FileIdentity) -> Result<(), String> {
        // Every read was conditional on the recorded version and every response was compared
        // with it. Left to check: that no response since showed another version (its error may
        // not be the one reported: a pipelined read stops at its first failure), and that the
        // recorded version is the one whose header was read (a header read through another
        // `Remote`, as the Python door's metadata is, has its own record).
        let url = self
            .inner
            .key(path)
            .map(|key| self.inner.root.url_of(&key))
            .map_err(|e| e.to_string())?;
        // The latest version is the one a file opened now reads (`Inner::object`): the header
        // must be of that one.
        let versions = self.inner.versions();
        match versions.get(&url).and_then(|seen| seen.last()) {
            None => Err("was never opened".to_owned()),
            Some(Tracked { version, .. }) if version.identity() != *identity => Err(format!(
                "was replaced since its header was read (it is now {})",
                version.describe()
            )),
            Some(Tracked {
                changed: Some(detail),
                version,
            }) => Err(format!(
                "changed during the load (it was read at {}): {detail}",
                version.describe()
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_options_are_told_by_the_stores_own_keys() {
        for key in [
            "aws_secret_access_key",
            "secret_access_key",
            "aws_access_key_id",
            "aws_session_token",
            "token",
            "aws_sse_customer_key_base64",
            "google_service_account_key",
            "service_account_key",
            "google_application_credentials",
            "azure_storage_account_key",
            "access_key",
            "azure_storage_sas_key",
            "sas_token",
            "azure_client_secret",
            "azure_storage_token",
            "bearer_token",
            "proxy_url",
            "no_store_has_this_key",
        ] {
            assert!(is_secret_option(key), "{key} should be secret");
        }
        for key in [
            "aws_region",
            "region",
            "aws_endpoint",
            "endpoint",
            "aws_bucket",
            "allow_http",
            "aws_allow_http",
            "timeout",
            "connect_timeout",
            "azure_storage_account_name",
            "azure_container_name",
            "google_bucket",
            "aws_skip_signature",
        ] {
            assert!(!is_secret_option(key), "{key} is no secret");
        }
        let shown = redacted_options(&[
            ("aws_secret_access_key".into(), "abc".into()),
            ("aws_endpoint".into(), "http://u:p@h:1".into()),
        ]);
        assert_eq!(
            shown,
            [
                ("aws_secret_access_key".to_owned(), REDACTED.to_owned()),
                (
                    "aws_endpoint".to_owned(),
                    "http://<redacted>@h:1".to_owned()
                ),
            ]
        );
    }
}
