//! What a Hub path opened to ([`Opened`]), and what the load's report says of it
//! ([`HubFacts`]).

use std::path::PathBuf;
use std::sync::Arc;

use backend_remote::Remote;

use crate::counters::Counters;
use crate::path::HubPath;

/// A Hub path opened (by `open`).
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

/// What a Hub path opened to: the repository, the revision and the commit it named, the path
/// inside, the snapshot in the cache, the files read, and the bytes counted since ([`report`]:
/// the load report's `hub`).
///
/// [`report`]: HubFacts::report
#[derive(Debug, Clone)]
pub struct HubFacts {
    pub(crate) repo: String,
    pub(crate) revision: String,
    pub(crate) commit: String,
    pub(crate) path: String,
    pub(crate) snapshot: Option<PathBuf>,
    pub(crate) cached: bool,
    pub(crate) files: Vec<String>,
    pub(crate) counters: Arc<Counters>,
    /// What did not go as asked (the report's `note`).
    pub(crate) note: Option<String>,
}

impl HubFacts {
    /// The report's `hub` for a load that has read `bytes_read` bytes so far.
    pub fn report(&self, bytes_read: u64) -> staging_core::HubReport {
        let from_cache = if self.cached {
            bytes_read
        } else {
            Counters::get(&self.counters.from_cache)
        };
        staging_core::HubReport {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            commit: self.commit.clone(),
            path: self.path.clone(),
            snapshot: self.snapshot.clone(),
            cached: self.cached,
            files: self.files.clone(),
            bytes_downloaded: Counters::get(&self.counters.downloaded),
            bytes_from_cache: from_cache,
            bytes_written: Counters::get(&self.counters.written),
            note: self.note.clone(),
        }
    }
}

impl Opened {
    /// This, its report saying `note`.
    pub(crate) fn noted(mut self, note: String) -> Self {
        match &mut self {
            Self::Cached { facts, .. } | Self::Streamed { facts, .. } => facts.note = Some(note),
        }
        self
    }
}

impl HubFacts {
    /// The facts of a load of `what` at `commit`, counting into `counters`: streamed, with no
    /// snapshot, no file and no note yet.
    pub(crate) fn of(what: &HubPath, commit: &str, counters: Arc<Counters>) -> Self {
        Self {
            repo: what.repo.clone(),
            revision: what.revision_or_main().to_owned(),
            commit: commit.to_owned(),
            path: what.path.clone().unwrap_or_default(),
            snapshot: None,
            cached: false,
            files: Vec::new(),
            counters,
            note: None,
        }
    }
}
