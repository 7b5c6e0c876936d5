//! [`Source`]: where a checkpoint's bytes come from (the local file system, or an object store
//! or HTTP server for a URL), and how a path is named in reports and errors.

use std::path::{Path, PathBuf};

use staging_core::{Checkpoint, Wanted};

#[cfg(not(feature = "remote"))]
use crate::error::Error;
use crate::error::Result;

pub(crate) use staging_core::is_hub;

/// What a Hub path opened to, for the load report's `hub`.
#[cfg(feature = "remote")]
pub(super) type HubFacts = backend_hub::HubFacts;

/// Without the `remote` feature no Hub path opens: no such facts exist.
#[cfg(not(feature = "remote"))]
#[derive(Debug, Clone)]
pub(super) enum HubFacts {}

#[cfg(not(feature = "remote"))]
impl HubFacts {
    pub(super) fn report(&self, _: u64) -> staging_core::HubReport {
        match *self {}
    }
}

/// Where a checkpoint's bytes come from.
pub(super) enum Source {
    /// The local file system.
    Local,
    /// An object store or HTTP server.
    #[cfg(feature = "remote")]
    Remote(backend_remote::Remote),
}

impl Source {
    /// Where `path` is read from, with a store opened for it when it is a URL.
    pub(super) fn of(
        path: &Path,
        #[cfg(feature = "remote")] open: impl FnOnce() -> Result<backend_remote::Remote>,
    ) -> Result<Self> {
        if !staging_core::is_url(path) {
            return Ok(Self::Local);
        }
        #[cfg(feature = "remote")]
        {
            Ok(Self::Remote(open()?))
        }
        #[cfg(not(feature = "remote"))]
        Err(Error::NotBuilt("remote"))
    }

    /// Where a Hub path (`hf://org/name[@revision][/path]`) is read from, and what to open
    /// there: the snapshot in the Hugging Face cache when it holds every file (a local
    /// load), else the Hub's store, which writes the cache as it reads (unless the options
    /// say not to). `None` when `path` is not a Hub path.
    pub(super) fn hub(
        path: &Path,
        #[cfg(feature = "remote")] options: &backend_remote::Options,
        #[cfg(feature = "remote")] hub: &backend_hub::HubOptions,
    ) -> Result<Option<(Self, Vec<PathBuf>, HubFacts)>> {
        if !is_hub(path) {
            return Ok(None);
        }
        #[cfg(feature = "remote")]
        {
            use backend_hub::Opened;
            Ok(Some(match backend_hub::open(path, options, hub)? {
                Opened::Cached { path, facts, .. } => (Self::Local, vec![path], facts),
                Opened::Streamed {
                    remote,
                    paths,
                    facts,
                    ..
                } => (Self::Remote(remote), paths, facts),
            }))
        }
        #[cfg(not(feature = "remote"))]
        Err(Error::NotBuilt("remote"))
    }

    /// The files are read through.
    fn store(&self) -> &dyn staging_core::Store {
        match self {
            Self::Local => &staging_core::LocalFiles,
            #[cfg(feature = "remote")]
            Self::Remote(remote) => remote,
        }
    }

    /// `path` as the checkpoint names it in reports and errors: a URL without the login it
    /// may carry (the store was opened with it), a local path as it is.
    fn public(&self, path: &Path) -> Result<PathBuf> {
        match self {
            Self::Local => Ok(path.to_path_buf()),
            #[cfg(feature = "remote")]
            Self::Remote(remote) => Ok(remote.public_path(path)?),
        }
    }

    /// The checkpoint at `path` (a directory, an index or one file), for the tensors `wanted`
    /// accepts (see [`Checkpoint::open_for_in`]).
    pub(super) fn open(&self, path: &Path, wanted: Option<Wanted<'_>>) -> Result<Checkpoint> {
        Ok(Checkpoint::open_for_in(
            self.store(),
            &self.public(path)?,
            wanted,
        )?)
    }

    /// These files as one checkpoint.
    pub(super) fn open_files<P: AsRef<Path>>(&self, files: &[P]) -> Result<Checkpoint> {
        let files = files
            .iter()
            .map(|f| self.public(f.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Checkpoint::from_files_in(self.store(), &files)?)
    }

    /// One path as [`open`](Self::open) takes it, several as files.
    pub(super) fn read_headers<P: AsRef<Path>>(
        &self,
        paths: &[P],
        wanted: Option<Wanted<'_>>,
    ) -> Result<Checkpoint> {
        match paths {
            [one] => self.open(one.as_ref(), wanted),
            many => self.open_files(many),
        }
    }
}
