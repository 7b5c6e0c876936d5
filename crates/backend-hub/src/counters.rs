//! The bytes a Hub load counts as it opens and reads a model (the report's `bytes_downloaded`,
//! `bytes_from_cache`, `bytes_written`), shared by the store, the cache and the facts.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes counted as a Hub model is opened and read.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Received from the Hub and its storage.
    pub(crate) downloaded: AtomicU64,
    /// Read from blobs already in the cache (by the store; a snapshot read alone counts its
    /// load's bytes instead).
    pub(crate) from_cache: AtomicU64,
    /// Written into the cache's blobs.
    pub(crate) written: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, bytes: u64) {
        counter.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What `counter` holds now.
    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
