//! [`open`]: a Hub path opened, in three steps: its revision resolved and its files listed
//! (`resolve`), what the load reads decided (`plan`), then read from the cache (`cached`) or
//! streamed from the Hub while the cache is written (`stream`). Offline, the cache alone
//! (`local`).

use std::path::Path;
use std::sync::Arc;

use backend_remote::Options;
use staging_core::Error;

use crate::cache::RepoCache;
use crate::cached::{FromCache, from_cache};
use crate::config::{HubOptions, Settings};
use crate::connect::connect;
use crate::counters::Counters;
use crate::facts::Opened;
use crate::load::Load;
use crate::local::open_offline;
use crate::path::parse;
use crate::plan::plan;
use crate::resolve::{Revision, resolve};
use crate::stream::{prepare_cache, stream};

/// Opens `path` (`hf://...`): resolves its revision, and either finds every file in the cache
/// or prepares the load that streams them (writing the cache as they arrive, unless
/// [`HubOptions::cache`] is off). Errors name the repository, revision or file, in the Hub's
/// own terms (a gated model needs a token with access; no such model, revision or file).
///
/// The environment (`HF_*`) is read here, once, for what `hub` leaves unsaid.
pub fn open(path: &Path, options: &Options, hub: &HubOptions) -> Result<Opened, Error> {
    let what = parse(path)?;
    let settings = Settings::from_env(hub);
    let dirs = RepoCache::new(&settings.cache_dir, &what.cache_folder());
    let counters = Arc::new(Counters::default());
    if settings.offline {
        return open_offline(&what, &dirs, counters);
    }
    let connection = connect(&what, options, &settings)?;
    let load = Load {
        what,
        settings,
        options,
        dirs,
        counters,
        connection,
    };
    let (commit, tree) = match resolve(&load)? {
        Revision::Listed { commit, tree } => (commit, tree),
        Revision::FromCache(opened) => return Ok(opened),
    };
    let plan = plan(&load, commit, tree)?;
    let read_only = match from_cache(&load, &plan) {
        FromCache::Opened(opened) => return Ok(*opened),
        FromCache::ReadOnly(why) => Some(why),
        FromCache::Lacking => None,
    };
    if load.settings.cache && read_only.is_none() {
        prepare_cache(&load, &plan)?;
    }
    stream(load, plan, read_only)
}
