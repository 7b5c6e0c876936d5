//! One Hub load under way, once connected: what it reads ([`HubPath`]), how ([`Settings`],
//! the remote reader's options), the cache folders of its repository, its counters, and the
//! connection its requests go through. What resolving, planning and reading share.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use backend_remote::{Options, RetryPolicy};
use staging_core::Error;

use crate::api::{self, TreeFile};
use crate::cache::{self, RepoCache};
use crate::config::Settings;
use crate::connect::Connection;
use crate::counters::Counters;
use crate::path::{HubPath, error_at};

/// A load of `what`, connected to the Hub.
pub(crate) struct Load<'a> {
    pub(crate) what: HubPath,
    pub(crate) settings: Settings,
    pub(crate) options: &'a Options,
    /// The cache folders of `what`'s repository.
    pub(crate) dirs: RepoCache,
    pub(crate) counters: Arc<Counters>,
    pub(crate) connection: Connection,
}

impl Load<'_> {
    /// The retry policy of every request of the load.
    pub(crate) fn retry(&self) -> RetryPolicy {
        self.options.retry()
    }

    /// `future`'s outcome, on the connection's runtime, ended early by the load's interrupt.
    pub(crate) fn block_on<T>(
        &self,
        future: impl std::future::Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        self.connection
            .runtime
            .block_on(self.options.interrupt.as_ref(), future)
    }

    /// `e` about the load's path, as the core reports one.
    pub(crate) fn error(&self, e: io::Error) -> Error {
        error_at(&self.what, e)
    }

    /// An error of the kind `kind` saying `why`, about the load's path.
    pub(crate) fn fail(&self, kind: io::ErrorKind, why: String) -> Error {
        self.error(io::Error::new(kind, why))
    }

    /// Where `file`'s blob is in the cache.
    pub(crate) fn blob(&self, file: &TreeFile) -> PathBuf {
        self.dirs.blob(file.blob())
    }

    /// Whether `file`'s blob is in the cache: a file of its name and size is there. It was
    /// checked when it was committed (LFS: named by its SHA-256), whichever commit it was read
    /// at, as `huggingface_hub` takes it.
    pub(crate) fn blob_cached(&self, file: &TreeFile) -> bool {
        std::fs::metadata(self.blob(file)).is_ok_and(|m| m.is_file() && m.len() == file.size)
    }

    /// Whether `file` is in the snapshot of `commit`, its blob in the cache.
    pub(crate) fn linked(&self, commit: &str, file: &TreeFile) -> bool {
        self.blob_cached(file) && self.dirs.snapshot(commit).join(&file.path).is_file()
    }

    /// A small file's bytes at `commit`, whole, checked against the listing.
    pub(crate) async fn fetch_whole(&self, commit: &str, file: &TreeFile) -> io::Result<Vec<u8>> {
        let (api, what, retry) = (&self.connection.api, &self.what, self.retry());
        let url = api.url(&[&what.repo, "resolve", commit, &file.path]);
        let source = api.resolve(&url, what, &file.path, retry).await?;
        let response = api
            .get_ok(&source.url, what, Some(&file.path), retry)
            .await?;
        let bytes = api::body(response, file.size.saturating_add(1), &file.path).await?;
        Counters::add(&self.counters.downloaded, bytes.len() as u64);
        cache::check_whole(file, &bytes)?;
        Ok(bytes)
    }
}
