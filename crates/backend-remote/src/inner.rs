//! What a [`Remote`](crate::Remote) and its readers share ([`Inner`]): the store, its runtime,
//! the versions of the objects read, the `HEAD`s answered, the redirects, the counters and the
//! tee, with the calls every part makes on them (keys, `HEAD`s, listings, blocking on the
//! runtime, recording versions). The parts above it (`fetch`, `reader`, `store`) add their own.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::path::Path as Key;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::client::Redirects;
use crate::errors::io_error;
use crate::location::{Location, Login};
use crate::options::Interrupt;
use crate::pace::Pace;
use crate::retry::RetryPolicy;
use crate::runtime::OwnedRuntime;
use crate::version::{Object, Tracked, Validator, Version};

/// Counters of what a [`Remote`](crate::Remote) asked for and received.
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
pub(crate) struct Inner {
    pub(crate) root: Location,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) runtime: OwnedRuntime,
    pub(crate) interrupt: Option<Interrupt>,
    pub(crate) permits: tokio::sync::Semaphore,
    pub(crate) pace: Option<Pace>,
    pub(crate) range_size: usize,
    pub(crate) retry: RetryPolicy,
    /// Every version of each object (by URL) whose header was read, the latest last: reads
    /// are opened on the latest, and a load whose header is of an older one is refused; what
    /// a response showed of one version (`changed`) is never held against another.
    pub(crate) versions: Mutex<HashMap<String, Vec<Tracked>>>,
    /// What each `HEAD` answered, by key, since the last [`Remote::revalidate`](crate::Remote::revalidate): opening one
    /// checkpoint asks once per file (parsing asks whether a path is a file, then opens it; the
    /// load opens it again). The next open asks again, so a replaced object is seen.
    pub(crate) metas: Mutex<HashMap<String, ObjectMeta>>,
    /// Where redirects may lead, and where they led.
    pub(crate) redirects: Arc<Redirects>,
    /// The login of the URL the store was opened with (sent by its client).
    pub(crate) login: Option<Login>,
    pub(crate) gets: AtomicU64,
    pub(crate) heads: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// Where every byte read is also written, when a caller asked ([`Remote::set_tee`](crate::Remote::set_tee)).
    pub(crate) tee: OnceLock<Box<dyn Tee>>,
}

/// Where a [`Remote`](crate::Remote) also writes every byte it reads (a cache of the objects, say): told of
/// each range as it arrives, and asked after each read whether the object is now complete.
/// An error from either fails that read, naming the object.
pub trait Tee: Send + Sync + std::fmt::Debug {
    /// `bytes` of the object at `key` (its store key) arrived, from `offset`.
    fn received(&self, key: &str, offset: u64, bytes: &[u8]) -> io::Result<()>;

    /// A read of the object at `key` ended: what it has of it may now be complete.
    fn settle(&self, key: &str) -> io::Result<()>;
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("root", &self.root.root)
            .field("store", &format_args!("<{:?} store>", self.root.scheme))
            .field("range_size", &self.range_size)
            .field("retry", &self.retry)
            .field("redirects", &self.redirects)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            gets: self.gets.load(Ordering::Relaxed),
            heads: self.heads.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// The location of the URL `dir` (a prefix of this store), to join names under.
    pub(crate) fn at(&self, dir: &Path) -> Result<Location, String> {
        let key = self.key(dir).map_err(|e| e.to_string())?;
        Ok(Location {
            key,
            ..self.root.clone()
        })
    }

    /// `path`'s object key, when `path` is a URL under this store's root.
    pub(crate) fn key(&self, path: &Path) -> io::Result<Key> {
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

    /// `key`'s metadata: what its first `HEAD` through this `Remote` answered (see `metas`).
    pub(crate) fn head(&self, key: &Key) -> io::Result<ObjectMeta> {
        let metas = || self.metas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(meta) = metas().get(key.as_ref()) {
            return Ok(meta.clone());
        }
        self.heads.fetch_add(1, Ordering::Relaxed);
        let meta = self.block_on(async { self.store.head(key).await.map_err(|e| io_error(&e)) })?;
        metas().insert(key.as_ref().to_owned(), meta.clone());
        Ok(meta)
    }

    pub(crate) fn list(&self, prefix: &Key) -> io::Result<object_store::ListResult> {
        self.heads.fetch_add(1, Ordering::Relaxed);
        let prefix = Some(prefix).filter(|p| !p.as_ref().is_empty());
        self.block_on(async {
            self.store
                .list_with_delimiter(prefix)
                .await
                .map_err(|e| io_error(&e))
        })
    }

    /// Runs `future` to its end on this store's runtime, blocking this thread: a plain thread
    /// or a blocking thread of another runtime, never an async task. Interruptible.
    pub(crate) fn block_on<T>(&self, future: impl Future<Output = io::Result<T>>) -> io::Result<T> {
        self.runtime.block_on(self.interrupt.as_ref(), future)
    }

    pub(crate) fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Tracked>>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `version` as the latest of `url` (the one reads opened from now on are
    /// conditional on); a version seen before keeps what was noted of it.
    pub(crate) fn record(&self, url: &str, version: &Version) {
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
    pub(crate) fn recorded(&self, url: &str) -> Option<Version> {
        let versions = self.versions();
        versions
            .get(url)
            .and_then(|seen| seen.last())
            .map(|t| t.version.clone())
    }

    /// Notes that a response showed `object` changed (kept, so that the tensor being read is
    /// not handed out even if the error that came with it was not the one reported), and
    /// returns the error.
    pub(crate) fn changed(&self, object: &Object, detail: &str) -> io::Error {
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
    pub(crate) fn validator(&self) -> Option<Validator> {
        self.versions()
            .values()
            .flatten()
            .map(|t| t.version.validator())
            .max()
    }
}
