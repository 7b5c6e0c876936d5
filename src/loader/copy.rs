//! A mapped load's tensors copied into a caller's destination ([`MappedLoad::fill_ready`]):
//! read from their files with `pread` into the destination's memory, in batches of one file
//! across the load's threads, each file checked unchanged before and after. Nothing is mapped.

use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use staging_core::{HostMemory, IoThreads, MemorySpace, StagingPath, TensorMeta};

use super::mapped::{MappedLoad, offset_in, read_failed, read_fully};
use crate::mapping::{no_longer_there, still_unchanged};
use crate::tensor::Data;

impl MappedLoad<'_> {
    /// The address where the destination wants `meta`'s bytes (a region of at least its
    /// length), or `None` when it declines the tensor.
    fn region_of(&mut self, meta: &TensorMeta) -> staging_core::Result<Option<usize>> {
        let region =
            self.destination
                .region(meta)
                .map_err(|source| staging_core::Error::Destination {
                    tensor: meta.name.clone(),
                    file: meta.file.to_path_buf(),
                    source,
                })?;
        let Some(region) = region else {
            return Ok(None);
        };
        if region.len() < meta.len {
            let capacity = region.len();
            // Nothing of it is written: its memory holds what it held.
            self.destination.unwritten(meta);
            return Err(staging_core::Error::DestinationTooSmall {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                needed: meta.len,
                capacity,
            });
        }
        Ok(Some(region.addr()))
    }

    /// The next tensor, `meta`, and (into a destination whose regions are disjoint) the
    /// tensors after it up to `BATCH_BYTES`, into `self.ready`: copied into the destination
    /// where it takes them, else their bytes in the mapping. A batch ends at the first tensor
    /// the destination declines or refuses, which follows the batch's tensors in `ready`.
    pub(super) fn fill_ready(&mut self, meta: TensorMeta) {
        let mut batch = Vec::new();
        let mut bytes = 0;
        let mut after = None;
        let mut next = Some(meta);
        while let Some(meta) = next.take() {
            match self.region_of(&meta) {
                Err(error) => after = Some(Err(error)),
                Ok(None) => after = Some(Ok(meta)),
                Ok(Some(addr)) => {
                    bytes += meta.len;
                    batch.push((meta, addr));
                    // A batch is of one file (its checks are that file's).
                    let file = batch
                        .last()
                        .map(|(meta, _): &(TensorMeta, _)| meta.file_index);
                    if self.batches && bytes < BATCH_BYTES {
                        next = self
                            .checkpoint
                            .tensors()
                            .get(self.next)
                            .filter(|meta| Some(meta.file_index) == file)
                            .cloned();
                        self.next += usize::from(next.is_some());
                    }
                }
            }
        }
        let (done, failure, unwritten) = self.copy_into(batch);
        for meta in &unwritten {
            self.destination.unwritten(meta);
        }
        self.ready.extend(done.into_iter().map(|(meta, addr)| {
            let data = Data::Destination {
                addr,
                space: HostMemory::NAME,
            };
            Ok((meta, data, StagingPath::Destination))
        }));
        match (failure, after) {
            // The load fails at its first error: what would follow it is not reached.
            (Some(error), _) | (None, Some(Err(error))) => self.ready.push_back(Err(error)),
            (None, Some(Ok(declined))) => {
                let mapped = self.map_one(&declined);
                self.ready
                    .push_back(mapped.map(|(data, path)| (declined, data, path)));
            }
            (None, None) => {}
        }
    }

    /// Reads each tensor of `batch` from its file (the mapped file's descriptor, `pread`) into
    /// the destination's memory at its address, every piece (at most `COPY_PIECE`) on the
    /// load's threads at once. The page cache's pages go straight into the destination: none
    /// is mapped into the process, and a file cut short is a short read, not a fault. Returns
    /// the tensors read whole and found still their file's (a prefix of `batch`), the error
    /// that ended the reads before the rest, if any, and those of the rest not a byte of which
    /// was written.
    #[allow(clippy::type_complexity)]
    fn copy_into(
        &self,
        batch: Vec<(TensorMeta, usize)>,
    ) -> (
        Vec<(TensorMeta, usize)>,
        Option<staging_core::Error>,
        Vec<TensorMeta>,
    ) {
        let mut checked: Vec<usize> = Vec::new();
        let (sources, mut failure) = self.sources_of(&batch, &mut checked);
        let mut pieces = Vec::new();
        let mut counts = Vec::with_capacity(sources.len());
        for (index, ((meta, addr), _)) in batch.iter().zip(&sources).enumerate() {
            let dst: &mut [u8] = if meta.len == 0 {
                &mut []
            } else {
                // SAFETY: `addr` is the destination's region of at least `meta.len` bytes of
                // host memory for this tensor (`region_of`), writable and untouched by anything
                // else until the load hands the tensor out or fails. Regions of a batch of
                // several tensors are disjoint (`batches`: the destination's
                // `regions_disjoint` promise), so each slice is the only one over its bytes.
                unsafe { std::slice::from_raw_parts_mut(*addr as *mut u8, meta.len) }
            };
            let piece = piece_size(meta.len, &self.threads);
            let before = pieces.len();
            pieces.extend(
                dst.chunks_mut(piece)
                    .enumerate()
                    .map(|(i, d)| (index, i * piece, d)),
            );
            counts.push(pieces.len() - before);
        }
        // Per tensor: pieces read whole, and pieces whose read began (a failed read may have
        // written part of its piece).
        let copied: Vec<AtomicUsize> = counts.iter().map(|_| AtomicUsize::new(0)).collect();
        let begun: Vec<AtomicUsize> = counts.iter().map(|_| AtomicUsize::new(0)).collect();
        let errors = Mutex::new(Vec::new());
        let copy = |(index, at, dst): (usize, usize, &mut [u8])| -> Result<(), ()> {
            let (file, offset) = &sources[index];
            begun[index].fetch_add(1, Ordering::Release);
            let start = (offset + at) as u64;
            if let Err(failed) = read_fully(file, dst, start) {
                errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((index, failed));
                return Err(());
            }
            copied[index].fetch_add(1, Ordering::Release);
            Ok(())
        };
        // The first failing read stops the pieces not started; its error is found below.
        let _ = self.threads.try_each(pieces, copy);
        let mut errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
        // The first tensor's first failure: where its file ended, or its read failed.
        errors.sort_by_key(|(index, (at, _))| (*index, *at));
        let whole = copied
            .iter()
            .zip(&counts)
            .take_while(|&(copied, &count)| copied.load(Ordering::Acquire) == count)
            .count();
        if let Some((index, (at, error))) = errors.into_iter().next() {
            let meta = &batch[index].0;
            failure = Some(read_failed(meta, sources[index].1, at, error));
        }
        // Still the files the headers were read from, each file once: a tensor of a file
        // that changed is not handed out, nor any after it.
        checked.clear();
        let mut done = Vec::with_capacity(whole);
        let mut unwritten = Vec::new();
        let mut changed = false;
        for (index, (meta, addr)) in batch.into_iter().enumerate() {
            if !changed && index < whole {
                if !checked.contains(&meta.file_index) {
                    let shard = &self.checkpoint.files()[meta.file_index];
                    if let Err(error) = still_unchanged(shard, &sources[index].0) {
                        // The first tensor not handed out: its error is the load's.
                        failure = Some(error);
                        changed = true;
                        continue; // copied, but not handed out: it may hold some bytes
                    }
                    checked.push(meta.file_index);
                }
                done.push((meta, addr));
            } else if begun
                .get(index)
                .is_none_or(|c| c.load(Ordering::Acquire) == 0)
            {
                // No read of it began: it holds what it held.
                unwritten.push(meta);
            }
        }
        (done, failure, unwritten)
    }

    /// Each tensor's file (a descriptor of it) and offset in it, for the tensors of `batch` up
    /// to the first past its file's end or of a file no longer the one its header was read
    /// from, whose error stops the batch there. `checked` gets each file checked unchanged.
    fn sources_of(
        &self,
        batch: &[(TensorMeta, usize)],
        checked: &mut Vec<usize>,
    ) -> (Vec<(Arc<File>, usize)>, Option<staging_core::Error>) {
        let mut sources = Vec::with_capacity(batch.len());
        let mut failure = None;
        for (meta, _) in batch {
            let source = self.shard_of(meta).and_then(|shard| {
                // Read with `pread` from a descriptor of the file: its path must still name the
                // file its header was read from (one renamed over since is refused here).
                let file = self
                    .descriptors
                    .get_or_open(shard)?
                    .ok_or_else(|| no_longer_there(shard))?;
                if !checked.contains(&meta.file_index) {
                    still_unchanged(shard, &file)?;
                    checked.push(meta.file_index);
                }
                // Its size is the one its header was checked against: `still_unchanged` says so.
                let size = usize::try_from(shard.size).unwrap_or(usize::MAX);
                Ok((file, offset_in(meta, size)?))
            });
            match source {
                Ok(source) => sources.push(source),
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        (sources, failure)
    }
}

/// Tensors copied into a destination whose regions are disjoint are copied in batches of about
/// this many bytes, every piece of a batch on the load's threads at once. One tensor at a time
/// (the threads waited for after each), a reload of a 0.4 GB model, 147 tensors, many under
/// 1 MiB, kept 1.3 of the VM's 2 cores busy (2026-12-04). The crate's unit tests use 1 MiB,
/// to cross batches with small tensors.
const BATCH_BYTES: usize = if cfg!(test) { 1 << 20 } else { 64 << 20 };

/// Copies of at least this many bytes are split across the load's threads: one thread copies
/// from the page cache at about half of what two do on the 2-core VM.
const PARALLEL_COPY_FROM: usize = 1 << 20;

/// Each read into a destination is of at most this many bytes: pieces enough for every thread,
/// and small enough to stay in the CPU's caches (a single `memcpy` of a whole tensor made glibc
/// switch to non-temporal stores, 2x slower on the VM: 0.4 GB in 0.086 s against 0.042 s in
/// pieces of 1-16 MiB, 2026-12-03). Reading the pieces with `pread` rather than copying them
/// out of the mapping took 0.062 s against 0.064 s for the 0.4 GB model and 0.195 s against
/// 0.214 s for the 1.5 GB one, holding 2 MiB of RSS above the model against 14
/// (`benches/bench_reload.py`, 7 rounds, 2026-12-04).
const COPY_PIECE: usize = 4 << 20;

/// The pieces a copy of `len` bytes is made in: at most `COPY_PIECE`, and small enough that
/// each of `threads` gets one when the copy is large; a small copy is one piece.
fn piece_size(len: usize, threads: &IoThreads) -> usize {
    if len < PARALLEL_COPY_FROM || threads.count() < 2 {
        return COPY_PIECE;
    }
    let page = crate::mapping::page_size();
    (len.div_ceil(threads.count()).div_ceil(page) * page).min(COPY_PIECE)
}
