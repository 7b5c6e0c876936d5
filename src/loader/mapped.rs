//! Loads whose tensors are mappings of their files ([`MappedLoad`]): what a prepared loader
//! decided ([`MapDecision`]), the mappings a reader keeps ([`MapCache`]), and the load itself.
//! The mapping and why it is done are in `crate::mapping`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use staging_core::{
    Checkpoint, HeldMemory, IoMode, IoThreads, LoadReport, ReadError, ShardFile, StagingPath,
    TensorMeta,
};

use crate::mapping::{Mapped, MappedBytes, Mapping, READ_AHEAD, on_network_file_system};
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

/// The mappings of the files a reader keeps open ([`Prepared::keep_files_open`]), shared by its
/// loads: a reader asking for tensors one at a time maps each file once.
///
/// [`Prepared::keep_files_open`]: crate::Prepared::keep_files_open
#[derive(Default, Clone)]
pub(crate) struct MapCache(Arc<Mutex<HashMap<Arc<Path>, Mapped>>>);

impl MapCache {
    fn get_or_map(&self, shard: &ShardFile) -> staging_core::Result<Option<Mapped>> {
        let mut maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mapped) = maps.get(&shard.path) {
            // Kept, but still the file its header was read from (as kept files are checked).
            shard.identity.check(&shard.path).map_err(|detail| {
                staging_core::Error::FileChanged {
                    file: shard.path.to_path_buf(),
                    detail,
                }
            })?;
            return Ok(Some(mapped.clone()));
        }
        let Some(mapped) = Mapping::open(shard)? else {
            return Ok(None);
        };
        maps.insert(Arc::clone(&shard.path), mapped.clone());
        Ok(Some(mapped))
    }

    /// Lets go of the mappings (tensors handed out keep theirs).
    pub(crate) fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// How many files are mapped.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Whether a load of `checkpoint` maps its files, as `decision` says.
pub(crate) fn maps(decision: MapDecision, checkpoint: &Checkpoint) -> bool {
    match decision {
        MapDecision::No => false,
        MapDecision::Yes => true,
        MapDecision::LocalFileSystems => !checkpoint
            .files()
            .iter()
            .any(|f| on_network_file_system(&f.path)),
    }
}

/// A load whose tensors are mappings of their files; or, for those a caller's destination
/// takes, copies out of the mappings into the caller's host memory.
pub(crate) struct MappedLoad<'d> {
    /// The caller's destination (one that declines every tensor when none was given).
    destination: Boxed<'d, HostMemory>,
    /// Whether the mappings are this load's alone (not a reader's, kept across its loads):
    /// then a tensor copied into the destination is unmapped after the copy.
    own_maps: bool,
    /// The threads a copy into the destination is split across.
    threads: IoThreads,
    checkpoint: Checkpoint,
    next: usize,
    /// Each file's mapping, by its position in the checkpoint.
    maps: Vec<Mapped>,
    report: LoadReport,
    started: Option<Instant>,
    failed: bool,
}

impl<'d> MappedLoad<'d> {
    /// Maps every file of `checkpoint` (through `cache` when a reader keeps its files), each
    /// checked against the identity its header was read with. `Ok(None)` when the system has no
    /// memory for a mapping: the load then reads into memory of its own, as an allocation
    /// failure falls back.
    /// With no memory for a mapping, `Ok(Err(destination))`: the destination given back, for
    /// the load that reads instead.
    pub(crate) fn open(
        checkpoint: Checkpoint,
        cache: Option<&MapCache>,
        destination: Boxed<'d, HostMemory>,
        threads: IoThreads,
    ) -> staging_core::Result<Result<Self, Boxed<'d, HostMemory>>> {
        let mut maps = Vec::with_capacity(checkpoint.files().len());
        for shard in checkpoint.files() {
            let mapped = match cache {
                Some(cache) => cache.get_or_map(shard)?,
                None => Mapping::open(shard)?,
            };
            match mapped {
                Some(mapped) => maps.push(mapped),
                None => return Ok(Err(destination)),
            }
        }
        let report = mapped_report(&checkpoint);
        Ok(Ok(Self {
            destination,
            own_maps: cache.is_none(),
            threads,
            maps,
            checkpoint,
            next: 0,
            report,
            started: None,
            failed: false,
        }))
    }

    /// The mapping of `meta`'s file.
    fn mapping(&self, meta: &TensorMeta) -> staging_core::Result<Mapped> {
        self.maps.get(meta.file_index).cloned().ok_or_else(|| {
            staging_core::Error::Internal(format!(
                "tensor {:?} names file {} of {}",
                meta.name,
                meta.file_index,
                self.checkpoint.files().len()
            ))
        })
    }

    /// `meta`'s bytes, mapped (made resident first where the page cache does not hold them).
    fn map_one(&mut self, meta: &TensorMeta) -> staging_core::Result<MappedBytes> {
        let Mapped {
            mapping,
            file: open,
        } = self.mapping(meta)?;
        let file = &self.checkpoint.files()[meta.file_index];
        let offset = offset_in(meta, &mapping)?;
        // Part of a tensor (a slice's rows): the parts after it are asked for ahead.
        let ahead = if meta.row_range.is_some() {
            READ_AHEAD
        } else {
            0
        };
        if let Err(error) = mapping.populate(&open, offset, meta.len, ahead) {
            return Err(populate_failed(file, meta, error));
        }
        still_the_file(file)?;
        Ok(MappedBytes::new(mapping, offset, meta.len))
    }
}

/// Where `meta`'s bytes start in `mapping`, all of them inside it (else the file is shorter
/// than its header says).
fn offset_in(meta: &TensorMeta, mapping: &Mapping) -> staging_core::Result<usize> {
    usize::try_from(meta.offset)
        .ok()
        .filter(|&o| {
            o.checked_add(meta.len)
                .is_some_and(|end| end <= mapping.len())
        })
        .ok_or_else(|| staging_core::Error::Truncated {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: meta.offset,
            missing: (meta.offset + meta.len as u64).saturating_sub(mapping.len() as u64),
        })
}

/// Still the file its header was read from, as every read tensor is checked.
fn still_the_file(file: &ShardFile) -> staging_core::Result<()> {
    file.identity
        .check(&file.path)
        .map_err(|detail| staging_core::Error::FileChanged {
            file: file.path.to_path_buf(),
            detail,
        })
}

/// The error of a populate of `meta`'s bytes in `file` that failed: the file cut short, or a
/// read error.
fn populate_failed(
    file: &ShardFile,
    meta: &TensorMeta,
    error: std::io::Error,
) -> staging_core::Error {
    // The file may have been cut short under the mapping: say so when it was.
    let now = std::fs::metadata(&meta.file)
        .map(|m| m.len())
        .unwrap_or(file.size);
    let end = meta.offset + meta.len as u64;
    if now < end {
        return staging_core::Error::Truncated {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: now.max(meta.offset),
            missing: end - now.max(meta.offset),
        };
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
    /// `meta`'s tensor: copied into the caller's destination when it takes it, else its bytes
    /// in the mapping.
    fn one(&mut self, meta: &TensorMeta) -> staging_core::Result<(Data, StagingPath)> {
        let Mapped { mapping, file } = self.mapping(meta)?;
        let shard = self.checkpoint.files()[meta.file_index].clone();
        let own_maps = self.own_maps;
        let region =
            self.destination
                .region(meta)
                .map_err(|source| staging_core::Error::Destination {
                    tensor: meta.name.clone(),
                    file: meta.file.to_path_buf(),
                    source,
                })?;
        let Some(region) = region else {
            return Ok((Data::Mapped(self.map_one(meta)?), StagingPath::Mapped));
        };
        let capacity = region.len();
        let Some((mut region, _)) = region.split_at(meta.len) else {
            return Err(staging_core::Error::DestinationTooSmall {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                needed: meta.len,
                capacity,
            });
        };
        let offset = offset_in(meta, &mapping)?;
        let bytes = MappedBytes::new(Arc::clone(&mapping), offset, meta.len);
        // Piece by piece: made resident where the page cache does not hold it, copied, and
        // (this load's own mapping) unmapped again, so the process holds no more of the file
        // than the pieces being copied.
        let populate = |at: usize, len: usize| mapping.populate(&file, offset + at, len, 0);
        copy_in_parallel(
            region.as_mut_slice(),
            &bytes,
            &populate,
            own_maps,
            &self.threads,
        )
        .map_err(|error| populate_failed(&shard, meta, error))?;
        still_the_file(&shard)?;
        let data = Data::Destination {
            addr: region.addr(),
            space: HostMemory::NAME,
        };
        Ok((data, StagingPath::Destination))
    }
}

/// Copies of at least this many bytes are split across the load's threads: one thread copies
/// from the page cache at about half of what two do on the 2-core VM.
const PARALLEL_COPY_FROM: usize = 1 << 20;

/// Each `memcpy` copies at most this many bytes. Larger copies make glibc switch to
/// non-temporal stores, which on the VM copied 0.4 GB from the page cache in 0.086 s against
/// 0.042 s in pieces of 1-16 MiB (2026-12-03); a weight reloaded into a model is about to be
/// read, so keeping it in cache costs nothing.
const COPY_PIECE: usize = 4 << 20;

/// `dst.copy_from_slice(src)`, in pieces of at most `COPY_PIECE`, each first made resident with
/// `populate(at, len)`; on `threads` when it is large (pieces small enough that every thread
/// gets one), else on the calling thread. With `release`, each piece of `src` is unmapped once
/// copied (`MappedBytes::release`). The first populate that fails ends it with that error
/// (`dst` is then partly written).
fn copy_in_parallel(
    dst: &mut [u8],
    src: &MappedBytes,
    populate: &(dyn Fn(usize, usize) -> std::io::Result<()> + Sync),
    release: bool,
    threads: &IoThreads,
) -> std::io::Result<()> {
    let copy = |(at, d): (usize, &mut [u8])| -> std::io::Result<()> {
        populate(at, d.len())?;
        d.copy_from_slice(&src[at..at + d.len()]);
        if release {
            // SAFETY: `src` is a tensor's bytes in a mapping of the load's own, copied and
            // never handed out nor written: nothing else covers its range.
            unsafe { src.release(at, d.len()) };
        }
        Ok(())
    };
    let page = crate::mapping::page_size();
    let piece = if dst.len() < PARALLEL_COPY_FROM || threads.count() < 2 {
        COPY_PIECE
    } else {
        (dst.len().div_ceil(threads.count()).div_ceil(page) * page).min(COPY_PIECE)
    };
    let pieces: Vec<_> = dst
        .chunks_mut(piece)
        .enumerate()
        .map(|(i, d)| (i * piece, d))
        .collect();
    threads.try_each(pieces, copy)
}

impl super::ErasedLoad for MappedLoad<'_> {
    fn next_tensor(&mut self) -> Option<staging_core::Result<Tensor>> {
        if self.failed {
            return None;
        }
        let meta = self.checkpoint.tensors().get(self.next)?.clone();
        self.next += 1;
        let started = *self.started.get_or_insert_with(Instant::now);
        let result = self.one(&meta);
        match result {
            Ok((data, path)) => {
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
    let mapped = match cache {
        Some(cache) => cache.get_or_map(shard)?,
        None => Mapping::open(shard)?,
    };
    let Some(Mapped { mapping, file }) = mapped else {
        return Ok(None);
    };
    let offset = offset_in(meta, &mapping)?;
    let RunGeometry {
        rows,
        row_bytes,
        skip,
        run,
    } = geometry;
    let populated = if rows == 0 || run == 0 {
        Ok(())
    } else if row_bytes - run >= RUN_BY_RUN_GAP {
        (0..rows).try_for_each(|r| mapping.populate(&file, offset + r * row_bytes + skip, run, 0))
    } else {
        mapping.populate(
            &file,
            offset + skip,
            (rows - 1) * row_bytes + run,
            READ_AHEAD,
        )
    };
    populated.map_err(|error| populate_failed(shard, meta, error))?;
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
    still_the_file(shard)?;
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
