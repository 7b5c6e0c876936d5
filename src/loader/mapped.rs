//! Loads whose tensors are mappings of their files ([`MappedLoad`]): what a prepared loader
//! decided ([`MapDecision`]), the mappings a reader keeps ([`MapCache`]), and the load itself.
//! The mapping and why it is done are in `crate::mapping`. Two files beside this one build on
//! it: `copy.rs` (the copies of a load's tensors into a caller's destination) and `columns.rs`
//! (reads of some columns of a tensor).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
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
use staging_core::{HostBytes, HostMemory, HostTensor};

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
    pub(super) descriptors: Arc<Descriptors>,
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
    pub(super) destination: Boxed<'d, HostMemory>,
    /// The threads a copy into the destination is split across.
    pub(super) threads: IoThreads,
    /// Whether the destination's regions are disjoint and stay untouched across its calls
    /// (`RawDestination::regions_disjoint`): then tensors are copied into it in batches.
    pub(super) batches: bool,
    /// Whether no destination was given (every tensor is a mapping): then the tensors of a
    /// file are mapped in runs (`map_run`).
    declines_all: bool,
    /// Tensors of a batch done ahead of the caller, in order, then what ended the batch: handed
    /// out before the next tensor is asked of the destination.
    pub(super) ready: VecDeque<staging_core::Result<(TensorMeta, Data, StagingPath)>>,
    pub(super) checkpoint: Checkpoint,
    pub(super) next: usize,
    /// The file the load is in, by its position in the checkpoint, with its mapping (`None`:
    /// no memory for one, so its tensors are read instead). A load walks its files in order and
    /// holds one mapping at a time, whatever their number: tensors handed out keep their own.
    held: Option<(usize, Option<Arc<Mapping>>)>,
    /// The reader's mappings, when a reader keeps its files.
    cache: Option<MapCache>,
    /// Descriptors of the mapped files (the reader's, when a reader keeps its files).
    pub(super) descriptors: Arc<Descriptors>,
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
    pub(super) fn shard_of(&self, meta: &TensorMeta) -> staging_core::Result<&ShardFile> {
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
    pub(super) fn map_one(
        &mut self,
        meta: &TensorMeta,
    ) -> staging_core::Result<(Data, StagingPath)> {
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
pub(super) fn offset_in(meta: &TensorMeta, len: usize) -> staging_core::Result<usize> {
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
pub(super) fn populate_failed(
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

/// Reads all of `dst` from `file` at `at`, continuing after short reads. `Err((offset,
/// error))`: where the read failed, and why (`None`: the file ended there).
pub(super) fn read_fully(
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
pub(super) fn read_failed(
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
pub(super) fn mapped_report(checkpoint: &Checkpoint) -> LoadReport {
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
pub(super) const RUN_BY_RUN_GAP: usize = 128 * 1024;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code asserts by panicking

    use staging_core::Dtype;

    use crate::loader::test_support::meta;

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
}
