//! The first step of a Hub load: its revision resolved to a commit, and the files at that
//! commit listed. Where the Hub cannot serve (no answer, down, rate-limiting), a snapshot in the
//! cache that holds the weights serves instead, as `huggingface_hub`'s own fallback does
//! (`HF_HUB_OFFLINE` asks for it first); else the Hub's answer is the error.

use std::io;
use std::sync::Arc;

use staging_core::Error;

use crate::api::{self, TreeFile};
use crate::facts::Opened;
use crate::load::Load;
use crate::local::cached_snapshot;

/// What a load's revision is.
pub(crate) enum Revision {
    /// The commit it names, and every file there.
    Listed { commit: String, tree: Vec<TreeFile> },
    /// The Hub could not be asked: the snapshot in the cache that serves.
    FromCache(Opened),
}

/// The commit `load`'s revision names and the files there (two requests).
pub(crate) fn resolve(load: &Load<'_>) -> Result<Revision, Error> {
    let (api, what, retry) = (&load.connection.api, &load.what, load.retry());
    let commit = match load.block_on(api.commit(what, retry)) {
        Ok(commit) => commit,
        Err(e) => return from_cache(load, None, e).map(Revision::FromCache),
    };
    match load.block_on(api.tree(what, &commit, retry)) {
        Ok(tree) => Ok(Revision::Listed { commit, tree }),
        Err(e) => from_cache(load, Some(&commit), e).map(Revision::FromCache),
    }
}

/// After the Hub failed with `e`: the snapshot of `commit` (else of the revision's ref) when
/// the Hub could not serve and the cache holds the weights, else `e`.
fn from_cache(load: &Load<'_>, commit: Option<&str>, e: io::Error) -> Result<Opened, Error> {
    if load.settings.cache
        && api::unavailable(&e)
        && let Some(opened) =
            cached_snapshot(&load.what, &load.dirs, commit, Arc::clone(&load.counters))
    {
        return Ok(opened.noted(format!(
            "the Hub could not be asked ({e}): loaded from the cache"
        )));
    }
    Err(load.error(e))
}
