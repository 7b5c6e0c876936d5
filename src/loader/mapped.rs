//! Loads whose tensors are mappings of their files ([`MappedLoad`]): what a prepared loader
//! decided ([`MapDecision`]), the mappings a reader keeps ([`MapCache`]), and the load itself.
//! The mapping and why it is done are in `crate::mapping`.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use staging_core::{
    Checkpoint, HeldMemory, IoMode, IoThreads, LoadReport, ReadError, Recent, ShardFile,
    StagingPath, TensorMeta,
};

use crate::mapping::{
    Descriptors, MappedBytes, Mapping, READ_AHEAD, no_longer_there, on_network_file_system,
    still_unchanged,
};
use crate::tensor::{Data, Tensor};
use staging_core::{HostBytes, HostMemory, HostTensor, MemorySpace};

use crate::space::Boxed;

/// What a prepared loader decided about mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapDecision {
    /// Never.
    No,
    /// Files on local file systems.
    LocalFileSystems,
    /// Every local file.
    Yes,
}

/// Files a reader keeps mapped ([`Prepared::keep_files_open`]), shared by its loads: a reader
/// asking for tensors one at a time maps each file once. At most [`MAPS_KEPT`] mappings, the
/// least recently used let go first (tensors handed out keep theirs), and at most
/// [`DESCRIPTORS_KEPT`] descriptors of them open, whatever the number of files.
///
/// [`Prepared::keep_files_open`]: crate::Prepared::keep_files_open
#[derive(Clone)]
pub(crate) struct MapCache {
    maps: Arc<Recent<Arc<Mapping>>>,
    descriptors: Arc<Descriptors>,
}

/// Mappings a reader keeps (a mapping costs no descriptor, one of the process's
/// `vm.max_map_count` mappings and its page tables).
pub(crate) const MAPS_KEPT: usize = 256;

/// Descriptors of mapped files a reader or a load keeps open: a load reads its files in order,
/// and a reader of a file renamed over since it opened it keeps reading that file while it
/// holds its mapping.
pub(crate) const DESCRIPTORS_KEPT: usize = 16;

impl Default for MapCache {
    fn default() -> Self {
        Self {
            maps: Arc::new(Recent::new(MAPS_KEPT)),
            descriptors: Arc::new(Descriptors::new(DESCRIPTORS_KEPT)),
        }
    }
}

impl MapCache {
    /// The mapping of `shard`'s file: the one kept, else made now (`None`: no memory for it).
    pub(crate) fn get_or_map(
        &self,
        shard: &ShardFile,
    ) -> staging_core::Result<Option<Arc<Mapping>>> {
        self.maps.get_or_keep(
            &shard.path,
            // One of another file its path named before (read under an older header): declined.
            |mapping| mapping.maps(shard).then(|| Arc::clone(mapping)),
            || {
                Ok(Mapping::open(shard, &self.descriptors)?
                    .map(|mapping| (Arc::clone(&mapping), mapping)))
            },
        )
    }

    /// Lets go of the mappings (tensors handed out keep theirs) and closes the descriptors.
    pub(crate) fn clear(&self) {
        self.maps.clear();
        self.descriptors.clear();
    }

    /// How many files are mapped.
    pub(crate) fn len(&self) -> usize {
        self.maps.len()
    }

    /// How many descriptors are open.
    pub(crate) fn descriptors_open(&self) -> usize {
        self.descriptors.len()
    }
}

/// Whether a load of `checkpoint` maps its files, as `decision` says: under
/// `LocalFileSystems`, when none of the files its tensors lie in is on a network or user-space
/// file system. Each file's answer (a `statfs`) is remembered in `known`, for the loads after
/// it (a reader's `get_tensor`s, each a load of one tensor).
pub(crate) fn maps(
    decision: MapDecision,
    checkpoint: &Checkpoint,
    known: &mut HashMap<Arc<Path>, bool>,
) -> bool {
    match decision {
        MapDecision::No => false,
        MapDecision::Yes => true,
        MapDecision::LocalFileSystems => !used_files(checkpoint).any(|shard| {
            *known
                .entry(Arc::clone(&shard.path))
                .or_insert_with(|| on_network_file_system(&shard.path))
        }),
    }
}

/// The files of `checkpoint` that hold at least one of its tensors (a narrowed checkpoint
/// keeps every file of the whole, for the tensors' file indices).
pub(super) fn used_files(checkpoint: &Checkpoint) -> impl Iterator<Item = &ShardFile> {
    let mut used = vec![false; checkpoint.files().len()];
    for tensor in checkpoint.tensors() {
        if let Some(slot) = used.get_mut(tensor.file_index) {
            *slot = true;
        }
    }
    checkpoint
        .files()
        .iter()
        .zip(used)
        .filter_map(|(shard, used)| used.then_some(shard))
}

/// A load whose tensors are mappings of their files (mapped one file at a time, as the load
/// reaches it; a file the system has no memory to map is read into memory of the load's own);
/// or, for those a caller's destination takes, read from their files (`pread`) into the
/// caller's host memory, which maps nothing.
pub(crate) struct MappedLoad<'d> {
    /// The caller's destination (one that declines every tensor when none was given).
    destination: Boxed<'d, HostMemory>,
    /// The threads a copy into the destination is split across.
    threads: IoThreads,
    /// Whether the destination's regions are disjoint and stay untouched across its calls
    /// (`RawDestination::regions_disjoint`): then tensors are copied into it in batches.
    batches: bool,
    /// Whether no destination was given (every tensor is a mapping): then the tensors of a
    /// file are mapped in runs (`map_run`).
    declines_all: bool,
    /// Tensors of a batch done ahead of the caller, in order, then what ended the batch: handed
    /// out before the next tensor is asked of the destination.
    ready: VecDeque<staging_core::Result<(TensorMeta, Data, StagingPath)>>,
    checkpoint: Checkpoint,
    next: usize,
    /// The file the load is in, by its position in the checkpoint, with its mapping (`None`:
    /// no memory for one, so its tensors are read instead). A load walks its files in order and
    /// holds one mapping at a time, whatever their number: tensors handed out keep their own.
    held: Option<(usize, Option<Arc<Mapping>>)>,
    /// The reader's mappings, when a reader keeps its files.
    cache: Option<MapCache>,
    /// Descriptors of the mapped files (the reader's, when a reader keeps its files).
    descriptors: Arc<Descriptors>,
    /// The file of the run mapped last (`map_run`), by its position, with a descriptor of it:
    /// each tensor of the run is checked against it as it is handed out.
    run_file: Option<(usize, Arc<File>)>,
    report: LoadReport,
    started: Option<Instant>,
    failed: bool,
}

impl<'d> MappedLoad<'d> {
    /// Maps the first file of `checkpoint` that holds one of its tensors (through `cache` when
    /// a reader keeps its files), checked against the identity its header was read with; the
    /// others are mapped as the load reaches them, one at a time. With no memory for the first
    /// mapping, `Ok(Err(destination))`: the destination given back, for the load that reads
    /// into memory of its own instead (as an allocation failure falls back); with none for a
    /// later file's, that file's tensors are read into memory of the load's own. With
    /// `batches`, the destination's regions are disjoint and stay untouched until each tensor
    /// is handed out (`RawDestination::regions_disjoint`).
    pub(crate) fn open(
        checkpoint: Checkpoint,
        cache: Option<&MapCache>,
        destination: Boxed<'d, HostMemory>,
        threads: IoThreads,
        batches: bool,
        declines_all: bool,
    ) -> staging_core::Result<Result<Self, Boxed<'d, HostMemory>>> {
        // A load walks its files in order: two descriptors serve it, whatever their number.
        let descriptors = cache.map_or_else(
            || Arc::new(Descriptors::new(2)),
            |cache| Arc::clone(&cache.descriptors),
        );
        let report = mapped_report(&checkpoint);
        let mut load = Self {
            destination,
            threads,
            batches,
            declines_all,
            ready: VecDeque::new(),
            held: None,
            cache: cache.cloned(),
            descriptors,
            run_file: None,
            checkpoint,
            next: 0,
            report,
            started: None,
            failed: false,
        };
        // Without a destination, every tensor is a mapping: with no memory to map the first
        // file, the load that reads serves better. A destination's tensors need no mapping.
        if declines_all
            && let Some(first) = load.checkpoint.tensors().first().cloned()
            && load.mapping(&first)?.is_none()
        {
            return Ok(Err(load.destination));
        }
        Ok(Ok(load))
    }

    /// The shard of `meta`'s file.
    fn shard_of(&self, meta: &TensorMeta) -> staging_core::Result<&ShardFile> {
        self.checkpoint.files().get(meta.file_index).ok_or_else(|| {
            staging_core::Error::Internal(format!(
                "tensor {:?} names file {} of {}",
                meta.name,
                meta.file_index,
                self.checkpoint.files().len()
            ))
        })
    }

    /// The mapping of `meta`'s file, made when the load reaches it (the previous file's let
    /// go first: tensors handed out keep theirs); `None` when there is no memory for it.
    fn mapping(&mut self, meta: &TensorMeta) -> staging_core::Result<Option<Arc<Mapping>>> {
        if let Some((index, mapped)) = &self.held
            && *index == meta.file_index
        {
            return Ok(mapped.clone());
        }
        self.held = None;
        let shard = self.shard_of(meta)?;
        let mapped = match &self.cache {
            Some(cache) => cache.get_or_map(shard)?,
            None => Mapping::open(shard, &self.descriptors)?,
        };
        self.held = Some((meta.file_index, mapped.clone()));
        Ok(mapped)
    }

    /// `meta`'s bytes, mapped (made resident first where the page cache does not hold them);
    /// read into memory of the load's own where there is no memory to map its file.
    fn map_one(&mut self, meta: &TensorMeta) -> staging_core::Result<(Data, StagingPath)> {
        let Some(mapping) = self.mapping(meta)? else {
            let bytes = self.read_one(meta)?;
            return Ok((Data::Host(HostTensor::uncounted(bytes)), StagingPath::Host));
        };
        let shard = self.shard_of(meta)?;
        let offset = offset_in(meta, mapping.len())?;
        // Part of a tensor (a slice's rows): the parts after it are asked for ahead.
        let ahead = if meta.row_range.is_some() {
            READ_AHEAD
        } else {
            0
        };
        populate_checked(shard, &self.descriptors, &mapping, meta, offset, ahead)?;
        Ok((
            Data::Mapped(MappedBytes::new(mapping, offset, meta.len)),
            StagingPath::Mapped,
        ))
    }

    /// `meta`'s bytes read from its file (`pread`) into memory of the load's own: for a file
    /// the system had no memory to map (an address-space limit, the map count), as an
    /// allocation failure falls back. The file is checked unchanged before and after.
    fn read_one(&self, meta: &TensorMeta) -> staging_core::Result<HostBytes> {
        let shard = self.shard_of(meta)?;
        let file = self
            .descriptors
            .get_or_open(shard)?
            .ok_or_else(|| no_longer_there(shard))?;
        still_unchanged(shard, &file)?;
        let size = usize::try_from(shard.size).unwrap_or(usize::MAX);
        let offset = offset_in(meta, size)?;
        // Zeroed as it is written, not populated first: the system had no memory to map.
        let mut bytes =
            HostBytes::zeroed(meta.len, 64).ok_or_else(|| staging_core::Error::HostAllocation {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: meta.offset,
                bytes: meta.len,
            })?;
        if meta.len > 0 {
            read_fully(&file, &mut bytes[..], meta.offset)
                .map_err(|(at, error)| read_failed(meta, offset, at, error))?;
        }
        still_unchanged(shard, &file)?;
        Ok(bytes)
    }

    /// The next tensors of one file, mapped, into `self.ready`: up to [`RUN_TENSORS`] of them
    /// or [`RUN_BYTES`] (at least one), made resident together (one `cachestat` and populate
    /// for them all; three syscalls a tensor otherwise: 60,000 tensors of 1 KiB took 3.3 us a
    /// tensor to hand out, 120,000 `statx`), each then checked unchanged as it is handed out.
    /// Where any of that fails, they are mapped one by one, so that the error is the first
    /// failing tensor's, after those before it.
    fn map_run(&mut self) {
        let tensors = self.checkpoint.tensors();
        let Some(file_index) = tensors.get(self.next).map(|t| t.file_index) else {
            return;
        };
        let mut end = self.next;
        let mut bytes = 0usize;
        while let Some(meta) = tensors.get(end) {
            let count = end - self.next;
            if meta.file_index != file_index
                || count >= RUN_TENSORS
                || (count > 0 && bytes >= RUN_BYTES)
            {
                break;
            }
            bytes = bytes.saturating_add(meta.len);
            end += 1;
        }
        let run = tensors[self.next..end].to_vec();
        self.next = end;
        // A file with no memory to map it has its tensors read one by one (`map_one`).
        let together = match run.first().map(|first| self.mapping(first)) {
            Some(Ok(Some(mapping))) if run.len() > 1 => self.map_together(&run, mapping).ok(),
            _ => None,
        };
        match together {
            Some(mapping) => {
                for meta in run {
                    // Inside the mapping: `map_together` checked every one.
                    let offset = meta.offset as usize;
                    let bytes = MappedBytes::new(Arc::clone(&mapping), offset, meta.len);
                    self.ready
                        .push_back(Ok((meta, Data::Mapped(bytes), StagingPath::Mapped)));
                }
            }
            None => {
                for meta in run {
                    let mapped = self.map_one(&meta);
                    let failed = mapped.is_err();
                    self.ready
                        .push_back(mapped.map(|(data, path)| (meta, data, path)));
                    if failed {
                        break; // the load fails at its first error
                    }
                }
            }
        }
    }

    /// The mapping of the file of `run` (tensors of one file, in file order), with every
    /// tensor's bytes inside it and resident: the whole span from the first to the last where
    /// the gaps between them are small, else tensor by tensor. The file is checked unchanged
    /// after, as each tensor is handed out (see `populate_checked`).
    fn map_together(
        &mut self,
        run: &[TensorMeta],
        mapping: Arc<Mapping>,
    ) -> staging_core::Result<Arc<Mapping>> {
        let Some(first) = run.first() else {
            return Err(staging_core::Error::Internal("an empty run".into()));
        };
        let shard = self.shard_of(first)?;
        let mut start = usize::MAX;
        let mut stop = 0usize;
        let mut bytes = 0usize;
        for meta in run {
            let offset = offset_in(meta, mapping.len())?;
            start = start.min(offset);
            stop = stop.max(offset + meta.len);
            bytes += meta.len;
        }
        let file = self.descriptors.get_or_open(shard)?;
        let populated = if stop - start <= bytes.saturating_add(RUN_BY_RUN_GAP) {
            mapping.populate(file.as_deref(), start, stop - start, 0)
        } else {
            run.iter().try_for_each(|meta| {
                mapping.populate(file.as_deref(), meta.offset as usize, meta.len, 0)
            })
        };
        if let Err(error) = populated {
            return Err(populate_failed(shard, first, file.as_deref(), error));
        }
        // Checked unchanged as each tensor is handed out (`next_tensor`), the first one too.
        self.run_file = file.map(|file| (first.file_index, file));
        Ok(mapping)
    }
}

/// The most tensors, and bytes, a load without a destination maps as one run.
const RUN_TENSORS: usize = 1024;
const RUN_BYTES: usize = 64 << 20;

/// Makes `meta`'s bytes (at `offset` of `mapping`, the mapping of `shard`) resident, checking
/// after that the file is unchanged where its path still names it (a file cut short since may
/// still have its lost pages counted as cached: `cachestat` did so on Linux 6.18, and touching
/// them would fault). Once after is enough: a file changed before the call is still changed
/// after it (its size or modification time differ), and one cut short before makes the populate
/// fail, which `populate_failed` says. Where its path names another file now (renamed over) or
/// none, the mapping serves the file it mapped, populated without asking the page cache.
fn populate_checked(
    shard: &ShardFile,
    descriptors: &Descriptors,
    mapping: &Mapping,
    meta: &TensorMeta,
    offset: usize,
    ahead: usize,
) -> staging_core::Result<()> {
    let file = descriptors.get_or_open(shard)?;
    if let Err(error) = mapping.populate(file.as_deref(), offset, meta.len, ahead) {
        return Err(populate_failed(shard, meta, file.as_deref(), error));
    }
    match &file {
        Some(file) => still_unchanged(shard, file),
        None => Ok(()),
    }
}

/// `meta` cut short by its file now ending at `size`, if it does end before `meta`'s end.
fn cut_short(meta: &TensorMeta, size: u64) -> Option<staging_core::Error> {
    let end = meta.offset + meta.len as u64;
    (size < end).then(|| staging_core::Error::Truncated {
        tensor: meta.name.clone(),
        file: meta.file.to_path_buf(),
        offset: size.max(meta.offset),
        missing: end - size.max(meta.offset),
    })
}

/// Where `meta`'s bytes start in a mapping (or a file) of `len` bytes, all of them inside it
/// (else the file is shorter than its header says).
fn offset_in(meta: &TensorMeta, len: usize) -> staging_core::Result<usize> {
    usize::try_from(meta.offset)
        .ok()
        .filter(|&o| o.checked_add(meta.len).is_some_and(|end| end <= len))
        .ok_or_else(|| staging_core::Error::Truncated {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: meta.offset,
            missing: (meta.offset + meta.len as u64).saturating_sub(len as u64),
        })
}

/// The error of a populate of `meta`'s bytes in `shard` that failed: the file cut short, or a
/// read error. `file` is a descriptor of the file mapped, where one is at hand.
fn populate_failed(
    shard: &ShardFile,
    meta: &TensorMeta,
    file: Option<&File>,
    error: std::io::Error,
) -> staging_core::Error {
    // The file changed since its header was read (cut short, most likely): that is the error.
    if let Some(Err(changed)) = file.map(|file| still_unchanged(shard, file)) {
        return changed;
    }
    // The file may have been cut short under the mapping: say so when it was.
    let now = file
        .and_then(|file| file.metadata().ok())
        .map_or(shard.size, |m| m.len());
    if let Some(cut) = cut_short(meta, now) {
        return cut;
    }
    let source = match error.raw_os_error() {
        Some(libc::EFAULT) => std::io::Error::other(
            "the mapped file could not be read there (an I/O error, or the file changed)",
        ),
        _ => error,
    };
    staging_core::Error::Read {
        tensor: meta.name.clone(),
        file: meta.file.to_path_buf(),
        offset: meta.offset,
        source: ReadError::Io(source),
    }
}

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
    fn fill_ready(&mut self, meta: TensorMeta) {
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
        // Each tensor's file and offset; a tensor past its file's end, or of a file no longer
        // the one its header was read from, stops the batch there.
        let mut sources = Vec::with_capacity(batch.len());
        let mut failure = None;
        let mut checked: Vec<usize> = Vec::new();
        for (meta, _) in &batch {
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

/// Reads all of `dst` from `file` at `at`, continuing after short reads. `Err((offset,
/// error))`: where the read failed, and why (`None`: the file ended there).
fn read_fully(
    file: &File,
    mut dst: &mut [u8],
    mut at: u64,
) -> Result<(), (u64, Option<std::io::Error>)> {
    use std::os::unix::fs::FileExt;
    while !dst.is_empty() {
        match file.read_at(dst, at) {
            Ok(0) => return Err((at, None)),
            Ok(n) => {
                let n = n.min(dst.len());
                dst = &mut std::mem::take(&mut dst)[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err((at, Some(e))),
        }
    }
    Ok(())
}

/// The error of a read of `meta`'s bytes (which start at `offset` in the file) that failed at
/// file offset `at`: the file ended there (`None`), or the read failed.
fn read_failed(
    meta: &TensorMeta,
    offset: usize,
    at: u64,
    error: Option<std::io::Error>,
) -> staging_core::Error {
    match error {
        None => staging_core::Error::Truncated {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: at,
            missing: (offset as u64 + meta.len as u64).saturating_sub(at),
        },
        Some(source) => staging_core::Error::Read {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: at,
            source: ReadError::Io(source),
        },
    }
}

/// The pieces a copy of `len` bytes is made in: at most `COPY_PIECE`, and small enough that
/// each of `threads` gets one when the copy is large; a small copy is one piece.
fn piece_size(len: usize, threads: &IoThreads) -> usize {
    if len < PARALLEL_COPY_FROM || threads.count() < 2 {
        return COPY_PIECE;
    }
    let page = crate::mapping::page_size();
    (len.div_ceil(threads.count()).div_ceil(page) * page).min(COPY_PIECE)
}

impl super::ErasedLoad for MappedLoad<'_> {
    fn next_tensor(&mut self) -> Option<staging_core::Result<Tensor>> {
        if self.failed {
            return None;
        }
        let started = *self.started.get_or_insert_with(Instant::now);
        if self.ready.is_empty() {
            if self.declines_all {
                self.map_run();
            } else {
                let meta = self.checkpoint.tensors().get(self.next)?.clone();
                self.next += 1;
                self.fill_ready(meta);
            }
        }
        let mut result = self.ready.pop_front()?;
        // A run's tensors were made resident together: each is checked again as it is handed
        // out (one `statx`), so that a file cut short since is an error, not a fault.
        if let (Ok((meta, Data::Mapped(_), _)), Some((index, file))) = (&result, &self.run_file)
            && meta.file_index == *index
            && let Some(shard) = self.checkpoint.files().get(*index)
            && let Err(changed) = still_unchanged(shard, file)
        {
            self.ready.clear();
            result = Err(changed);
        }
        match result {
            Ok((meta, data, path)) => {
                let len = meta.len as u64;
                self.report.tensors += 1;
                self.report.bytes += len;
                self.report.paths.add(path, len);
                // The bytes taken from the file, as a read served by the page cache counts them.
                if len > 0 {
                    self.report.read_requests += 1;
                    self.report.bytes_read += len;
                }
                self.report.seconds = started.elapsed().as_secs_f64();
                self.report.bytes_per_second = if self.report.seconds > 0.0 {
                    self.report.bytes as f64 / self.report.seconds
                } else {
                    0.0
                };
                Some(Ok(Tensor {
                    meta: Box::new(meta),
                    data,
                    fallback: None,
                }))
            }
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
        }
    }

    fn report(&self) -> LoadReport {
        self.report.clone()
    }

    fn held_memory(&self) -> HeldMemory {
        HeldMemory::none()
    }

    fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }
}

/// An empty report of a load that maps the files of `checkpoint`.
fn mapped_report(checkpoint: &Checkpoint) -> LoadReport {
    LoadReport {
        backend: "host".into(),
        mode: IoMode::Mapped,
        passed_over: Vec::new(),
        unchanged_by: "file-identity",
        redirects: Vec::new(),
        mode_reason: None,
        files: checkpoint.files().len(),
        headers_read: checkpoint.headers_read(),
        tensors: 0,
        bytes: 0,
        seconds: 0.0,
        bytes_per_second: 0.0,
        paths: Default::default(),
        fallbacks: Default::default(),
        peak_device_bytes: 0,
        taken_device_bytes: 0,
        peak_host_bytes: 0,
        read_requests: 0,
        bytes_read: 0,
        hub: None,
    }
}

/// Rows whose runs are at least this far apart are made resident run by run; closer runs are
/// made resident together with the gaps between them, as the kernel's read-ahead (128 KiB by
/// default) would read those gaps anyway.
pub(crate) const RUN_BY_RUN_GAP: usize = 128 * 1024;

/// Columns `columns` (a range of dimension 1) of every row of the one tensor of `checkpoint`,
/// copied out of the mapping of its file into host memory of their own: one run per row of
/// dimension 0, and only those runs read (made resident where the page cache does not hold
/// them). The report counts the bytes returned as the bytes read.
///
/// `Ok(None)` when the system has no memory for the mapping, or when the tensor's rows are not
/// runs of whole bytes (fewer than two dimensions, sub-byte elements): the caller reads whole
/// rows instead.
pub(crate) fn read_columns(
    checkpoint: &Checkpoint,
    cache: Option<&MapCache>,
    columns: std::ops::Range<usize>,
) -> staging_core::Result<Option<(Tensor, LoadReport)>> {
    let started = Instant::now();
    let [meta] = checkpoint.tensors() else {
        return Err(staging_core::Error::Internal(format!(
            "a read of columns is of one tensor, not {}",
            checkpoint.tensors().len()
        )));
    };
    let Some(geometry) = RunGeometry::of(meta, &columns)? else {
        return Ok(None);
    };
    let shard = checkpoint.files().get(meta.file_index).ok_or_else(|| {
        staging_core::Error::Internal(format!("tensor {:?} names no file", meta.name))
    })?;
    let own;
    let (mapped, descriptors) = match cache {
        Some(cache) => (cache.get_or_map(shard)?, &*cache.descriptors),
        None => {
            own = Descriptors::new(1);
            (Mapping::open(shard, &own)?, &own)
        }
    };
    let Some(mapping) = mapped else {
        return Ok(None);
    };
    let offset = offset_in(meta, mapping.len())?;
    // Checked before a page is touched, as `populate_checked` does; `None`: renamed over, the
    // mapping serves the file it mapped.
    let file = descriptors.get_or_open(shard)?;
    if let Some(file) = &file {
        still_unchanged(shard, file)?;
    }
    let file = file.as_deref();
    let RunGeometry {
        rows,
        row_bytes,
        skip,
        run,
    } = geometry;
    let populated = if rows == 0 || run == 0 {
        Ok(())
    } else if row_bytes - run >= RUN_BY_RUN_GAP {
        (0..rows).try_for_each(|r| mapping.populate(file, offset + r * row_bytes + skip, run, 0))
    } else {
        mapping.populate(
            file,
            offset + skip,
            (rows - 1) * row_bytes + run,
            READ_AHEAD,
        )
    };
    populated.map_err(|error| populate_failed(shard, meta, file, error))?;
    let len = rows * run;
    let mut bytes =
        HostBytes::zeroed_present(len, 64).ok_or_else(|| staging_core::Error::HostAllocation {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: meta.offset,
            bytes: len,
        })?;
    if len > 0 {
        let source = MappedBytes::new(mapping, offset, meta.len);
        for (r, out) in bytes[..].chunks_exact_mut(run).enumerate() {
            let from = r * row_bytes + skip;
            out.copy_from_slice(&source[from..from + run]);
        }
    }
    if let Some(file) = file {
        still_unchanged(shard, file)?;
    }
    let mut narrowed = meta.clone();
    narrowed.shape[1] = columns.len();
    narrowed.offset = meta.offset + skip as u64;
    narrowed.len = len;
    let mut report = mapped_report(checkpoint);
    report.tensors = 1;
    report.bytes = len as u64;
    report.paths.add(StagingPath::Host, len as u64);
    report.peak_host_bytes = len as u64;
    if len > 0 {
        report.read_requests = 1;
        report.bytes_read = len as u64;
    }
    report.seconds = started.elapsed().as_secs_f64();
    if report.seconds > 0.0 {
        report.bytes_per_second = report.bytes as f64 / report.seconds;
    }
    let tensor = Tensor {
        meta: Box::new(narrowed),
        data: Data::Host(HostTensor::uncounted(bytes)),
        fallback: None,
    };
    Ok(Some((tensor, report)))
}

/// The runs a read of columns takes, in bytes: one per row of dimension 0.
#[derive(Debug, PartialEq, Eq)]
struct RunGeometry {
    /// Rows of dimension 0.
    rows: usize,
    /// Bytes of one row.
    row_bytes: usize,
    /// Bytes of a row before its run.
    skip: usize,
    /// Bytes of a run.
    run: usize,
}

impl RunGeometry {
    /// The runs of columns `columns` of `meta`; `None` when its rows are not runs of whole
    /// bytes. An error when the columns are not within dimension 1.
    fn of(
        meta: &TensorMeta,
        columns: &std::ops::Range<usize>,
    ) -> staging_core::Result<Option<Self>> {
        let [rows, width, rest @ ..] = meta.shape.as_slice() else {
            return Ok(None);
        };
        if columns.start > columns.end || columns.end > *width {
            return Err(staging_core::Error::Internal(format!(
                "columns {}..{} of tensor {:?}, whose dimension 1 has {width}",
                columns.start, columns.end, meta.name
            )));
        }
        let bits = rest
            .iter()
            .try_fold(meta.dtype.bitsize(), |acc, &d| acc.checked_mul(d));
        let Some(column_bytes) = bits.filter(|b| b % 8 == 0).map(|b| b / 8) else {
            return Ok(None);
        };
        let (Some(row_bytes), Some(skip), Some(run)) = (
            width.checked_mul(column_bytes),
            columns.start.checked_mul(column_bytes),
            columns.len().checked_mul(column_bytes),
        ) else {
            return Ok(None);
        };
        if rows.checked_mul(row_bytes) != Some(meta.len) {
            return Err(staging_core::Error::Internal(format!(
                "tensor {:?} of shape {:?} has {} bytes",
                meta.name, meta.shape, meta.len
            )));
        }
        Ok(Some(Self {
            rows: *rows,
            row_bytes,
            skip,
            run,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code asserts by panicking

    use std::ops::Range;
    use std::path::Path;
    use std::sync::Arc;

    use staging_core::{Dtype, TensorMeta};

    use super::RunGeometry;

    fn meta(dtype: Dtype, shape: &[usize]) -> TensorMeta {
        TensorMeta {
            name: "w".into(),
            dtype,
            shape: shape.to_vec(),
            file: Arc::from(Path::new("f")),
            file_index: 0,
            offset: 8,
            len: shape.iter().product::<usize>() * dtype.bitsize() / 8,
            row_range: None,
        }
    }

    #[test]
    fn a_read_into_a_destination_past_the_end_of_its_file_is_truncated_naming_where() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, (0..100u8).collect::<Vec<_>>()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // Whole: the bytes.
        let mut dst = vec![0u8; 40];
        super::read_fully(&file, &mut dst, 50).unwrap();
        assert_eq!(dst, (50..90u8).collect::<Vec<_>>());
        // Past the end: where the file ended, and the bytes before it read.
        let mut dst = vec![0u8; 40];
        let (at, error) = super::read_fully(&file, &mut dst, 80).unwrap_err();
        assert_eq!(at, 100);
        assert!(error.is_none());
        assert_eq!(&dst[..20], &(80..100u8).collect::<Vec<_>>()[..]);
        // The tensor (bytes 72..112 of its file, as its header says) is named, with what is
        // missing of it.
        let mut tensor = meta(Dtype::U8, &[40]);
        tensor.offset = 72;
        let error = super::read_failed(&tensor, 72, at, error);
        let staging_core::Error::Truncated {
            tensor: name,
            offset,
            missing,
            ..
        } = &error
        else {
            panic!("{error}");
        };
        assert_eq!((name.as_str(), *offset, *missing), ("w", 100, 12));
        // A failed read names its offset and keeps the system's error.
        let error = super::read_failed(&tensor, 72, 80, Some(std::io::Error::other("EIO")));
        assert!(
            matches!(&error, staging_core::Error::Read { offset: 80, .. }),
            "{error}"
        );
    }

    #[test]
    fn runs_are_the_columns_of_each_row_in_bytes() {
        let g = RunGeometry::of(&meta(Dtype::F16, &[4, 8, 3]), &(2..5)).unwrap();
        assert_eq!(
            g,
            Some(RunGeometry {
                rows: 4,
                row_bytes: 48,
                skip: 12,
                run: 18
            })
        );
        // One dimension, or sub-byte columns: no runs (the caller reads rows).
        assert_eq!(
            RunGeometry::of(&meta(Dtype::F16, &[8]), &(0..1)).unwrap(),
            None
        );
        assert_eq!(
            RunGeometry::of(&meta(Dtype::F4, &[4, 3]), &(0..1)).unwrap(),
            None
        );
        // Columns past dimension 1 are refused, not read.
        assert!(RunGeometry::of(&meta(Dtype::F16, &[4, 8]), &(6..9)).is_err());
        assert!(RunGeometry::of(&meta(Dtype::F16, &[4, 8]), &Range { start: 5, end: 2 }).is_err());
    }
}
