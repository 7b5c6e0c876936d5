//! The [`Remote`]: one object store or HTTP server, opened from a URL and [`Options`] (or the
//! caller's own [`ObjectStore`]), and the core's [`Store`] over it: what a path is (`HEAD`s, a
//! listing for a prefix), the names in a directory, and the files a header is read from.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use object_store::path::Path as Key;
use object_store::{ClientOptions, ObjectStore};
use staging_core::{EntryKind, Error, FileIdentity, Store, StoreFile};

use crate::client::{Connector, Redirects};
use crate::errors::describe;
use crate::inner::{Inner, Stats, Tee};
use crate::location::{Location, Login, Scheme, redacted_path};
use crate::options::Options;
use crate::pace::Pace;
use crate::reader::RemoteReader;
use crate::runtime::{IN_ASYNC_TASK, OwnedRuntime, in_async_task};
use crate::version::{Object, Version};

/// One object store or HTTP server, opened at a URL's root: the [`Store`] a checkpoint is
/// opened through and the source of its [`RemoteReader`]. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Remote {
    pub(crate) inner: Arc<Inner>,
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

    let retry = options.retry().object_store();
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
        let runtime = OwnedRuntime::start().map_err(|source| Error::Resource {
            what: "the I/O runtime's 2 threads".into(),
            source,
        })?;
        Ok(Self::assemble(
            root, store, options, runtime, redirects, login,
        ))
    }

    /// A `Remote` of a store of the caller's own making at `root` (`scheme://host[:port]`: the
    /// URLs it reads are under it), on `runtime` (which the caller may have used already), whose
    /// redirects to other hosts are followed and recorded by `redirects`: a protocol built on
    /// this crate's reader (the Hugging Face Hub's, in `backend-hub`).
    pub fn with_store(
        root: &Path,
        store: Arc<dyn ObjectStore>,
        options: &Options,
        runtime: OwnedRuntime,
        redirects: Arc<Redirects>,
    ) -> Result<Self, Error> {
        let invalid = |message: String| path_error(root, io::ErrorKind::InvalidInput, message);
        let location = Location::parse(root).map_err(&invalid)?;
        Ok(Self::assemble(
            location, store, options, runtime, redirects, None,
        ))
    }

    fn assemble(
        root: Location,
        store: Arc<dyn ObjectStore>,
        options: &Options,
        runtime: OwnedRuntime,
        redirects: Arc<Redirects>,
        login: Option<Login>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                root,
                store,
                runtime,
                interrupt: options.interrupt.clone(),
                permits: tokio::sync::Semaphore::new(options.concurrency.max(1)),
                pace: options.bandwidth.map(Pace::new),
                range_size: options.range_size.max(4096),
                retry: options.retry(),
                versions: Mutex::new(HashMap::new()),
                metas: Mutex::new(HashMap::new()),
                redirects,
                login,
                gets: AtomicU64::new(0),
                heads: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                tee: OnceLock::new(),
            }),
        }
    }

    /// Writes every byte read into `tee` too (only the first one given is kept).
    pub fn set_tee(&self, tee: Box<dyn Tee>) {
        let _ = self.inner.tee.set(tee);
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
                .and_then(|()| self.inner.settle(&self.object))
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
