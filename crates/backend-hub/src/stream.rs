//! The last step of a Hub load that is not read from the cache alone: the cache made ready
//! (the ref, the small files, the links of weights already there), then the weights read
//! through a [`Remote`] whose store is the Hub at the commit, each byte teed into the cache.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend_remote::Remote;
use staging_core::Error;

use crate::cache::HubCache;
use crate::counters::Counters;
use crate::facts::{HubFacts, Opened};
use crate::layout::is_weight;
use crate::load::Load;
use crate::plan::Plan;
use crate::store::{HubStore, Local};

/// Small files (configs, tokenizer) asked for at once, at most.
const SMALL_FILES_AT_ONCE: usize = 8;

/// The cache made ready for `load` to stream `plan`'s weights into it: the revision's ref
/// written, the small files it lacks fetched and written, weights already there (read at
/// another commit, or by an earlier load that stopped) linked, to be read from the cache.
pub(crate) fn prepare_cache(load: &Load<'_>, plan: &Plan) -> Result<(), Error> {
    let (what, commit, dirs) = (&load.what, &plan.commit, &load.dirs);
    dirs.prepare().map_err(|e| load.error(e))?;
    dirs.write_ref(what.revision_or_main(), commit)
        .map_err(|e| load.error(e))?;
    // The small files the cache lacks are asked for at once (a dozen requests of a few kB
    // each: their round trips, not their bytes, are what they cost), then written.
    let mut fetch = Vec::new();
    for file in plan.small() {
        if load.linked(commit, file) {
            continue;
        }
        let fetched = if load.blob_cached(file) {
            dirs.link(commit, file).map(|()| 0)
        } else {
            match plan.index_bytes_of(file) {
                Some(bytes) => dirs.put_whole(commit, file, bytes),
                None => {
                    fetch.push(file);
                    Ok(0)
                }
            }
        };
        Counters::add(&load.counters.written, fetched.map_err(|e| load.error(e))?);
    }
    let fetched = load
        .block_on(async {
            use futures::{StreamExt, TryStreamExt};
            futures::stream::iter(fetch.iter().map(|file| async {
                let bytes = load.fetch_whole(commit, file).await?;
                Ok::<_, io::Error>((*file, bytes))
            }))
            .buffer_unordered(SMALL_FILES_AT_ONCE)
            .try_collect::<Vec<_>>()
            .await
        })
        .map_err(|e| load.error(e))?;
    for (file, bytes) in fetched {
        let written = dirs
            .put_whole(commit, file, &bytes)
            .map_err(|e| load.error(e))?;
        Counters::add(&load.counters.written, written);
    }
    for file in plan.weight_files() {
        if load.blob_cached(file) && !load.linked(commit, file) {
            dirs.link(commit, file).map_err(|e| load.error(e))?;
        }
    }
    Ok(())
}

/// `plan`'s files read through a [`Remote`] whose store is the Hub at the commit; teed into the
/// cache unless it is off or `read_only` (why it could not be updated: the report's note).
pub(crate) fn stream(
    load: Load<'_>,
    plan: Plan,
    read_only: Option<String>,
) -> Result<Opened, Error> {
    let writes = load.settings.cache && read_only.is_none();
    let Plan { commit, .. } = &plan;
    let api = &load.connection.api;
    let (files, local) = store_files(&load, &plan)?;
    let store = HubStore::new(
        api.clone(),
        load.what.clone(),
        commit.clone(),
        files.clone(),
        local,
        load.retry(),
        Arc::clone(&load.counters),
    );
    let url_of = |name: &str| {
        PathBuf::from(
            api.url(&[&load.what.repo, "resolve", commit, name])
                .as_str(),
        )
    };
    let paths = match &plan.index {
        Some(index) => vec![url_of(index)],
        None => plan.weights.iter().map(|w| url_of(w)).collect(),
    };
    let facts = HubFacts {
        // Not this commit's snapshot where the cache could not be updated: it was not made.
        snapshot: writes.then(|| load.dirs.snapshot(commit)),
        files: plan.files(),
        note: read_only,
        ..HubFacts::of(&load.what, commit, Arc::clone(&load.counters))
    };
    let Load {
        options,
        dirs,
        counters,
        connection,
        ..
    } = load;
    let remote = Remote::with_store(
        Path::new(&connection.root),
        Arc::new(store),
        options,
        connection.runtime,
        connection.redirects,
    )?;
    if writes {
        // Weights already in the cache (from an earlier, partial load) are linked, not read
        // again into it.
        let cache_files = files
            .into_iter()
            .filter(|(_, f)| !is_weight(&f.path) || f.path.ends_with(".safetensors"))
            .collect();
        remote.set_tee(Box::new(HubCache::new(
            dirs,
            commit.clone(),
            cache_files,
            counters,
        )));
    }
    Ok(Opened::Streamed {
        remote,
        paths,
        commit: plan.commit,
        facts,
    })
}

/// The store's files by key (each file's `resolve` path under the endpoint, decoded), and
/// those at hand, which are not asked of the Hub again: the index read, a blob in the cache.
type StoreFiles = (
    HashMap<String, crate::api::TreeFile>,
    HashMap<String, Local>,
);

fn store_files(load: &Load<'_>, plan: &Plan) -> Result<StoreFiles, Error> {
    let (what, commit) = (&load.what, &plan.commit);
    let mut files = HashMap::new();
    let mut local = HashMap::new();
    for name in plan.weight_names.iter().chain(plan.index.iter()) {
        let file = plan.file(name).ok_or_else(|| {
            load.fail(
                io::ErrorKind::NotFound,
                format!(
                    "{} at {commit} has no file {name} (its index names it)",
                    what.repo
                ),
            )
        })?;
        let url = load
            .connection
            .api
            .url(&[&what.repo, "resolve", commit, name]);
        let key = url.path().trim_start_matches('/');
        let decoded = percent_encoding::percent_decode_str(key)
            .decode_utf8_lossy()
            .into_owned();
        if let Some(bytes) = plan.index_bytes_of(file) {
            local.insert(decoded.clone(), Local::Bytes(bytes.clone().into()));
        } else if load.settings.cache && load.blob_cached(file) {
            local.insert(decoded.clone(), Local::Blob(load.blob(file)));
        }
        files.insert(decoded, file.clone());
    }
    Ok((files, local))
}
