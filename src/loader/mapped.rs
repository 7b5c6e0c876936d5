//! Loads whose tensors are mappings of their files ([`MappedLoad`]): what a prepared loader
//! decided ([`MapDecision`]), the mappings a reader keeps ([`MapCache`]), and the load itself.
//! The mapping and why it is done are in `crate::mapping`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use staging_core::{
    Checkpoint, HeldMemory, IoMode, LoadReport, ReadError, ShardFile, StagingPath, TensorMeta,
};

use crate::mapping::{Mapped, MappedBytes, Mapping, on_network_file_system};
use crate::tensor::{Data, Tensor};

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

/// A load whose tensors are mappings of their files.
pub(crate) struct MappedLoad {
    checkpoint: Checkpoint,
    next: usize,
    /// Each file's mapping, by its position in the checkpoint.
    maps: Vec<Mapped>,
    report: LoadReport,
    started: Option<Instant>,
    failed: bool,
}

impl MappedLoad {
    /// Maps every file of `checkpoint` (through `cache` when a reader keeps its files), each
    /// checked against the identity its header was read with. `Ok(None)` when the system has no
    /// memory for a mapping: the load then reads into memory of its own, as an allocation
    /// failure falls back.
    pub(crate) fn open(
        checkpoint: Checkpoint,
        cache: Option<&MapCache>,
    ) -> staging_core::Result<Option<Self>> {
        let mut maps = Vec::with_capacity(checkpoint.files().len());
        for shard in checkpoint.files() {
            let mapped = match cache {
                Some(cache) => cache.get_or_map(shard)?,
                None => Mapping::open(shard)?,
            };
            match mapped {
                Some(mapped) => maps.push(mapped),
                None => return Ok(None),
            }
        }
        let report = LoadReport {
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
        };
        Ok(Some(Self {
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
        let offset = usize::try_from(meta.offset)
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
            })?;
        if let Err(error) = mapping.populate(&open, offset, meta.len) {
            return Err(self.populate_failed(meta, error));
        }
        // Still the file its header was read from, as every read tensor is checked.
        file.identity
            .check(&file.path)
            .map_err(|detail| staging_core::Error::FileChanged {
                file: file.path.to_path_buf(),
                detail,
            })?;
        Ok(MappedBytes::new(mapping, offset, meta.len))
    }

    /// The error of a populate that failed: the file cut short, or a read error.
    fn populate_failed(&self, meta: &TensorMeta, error: std::io::Error) -> staging_core::Error {
        let file = &self.checkpoint.files()[meta.file_index];
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
}

impl super::ErasedLoad for MappedLoad {
    fn next_tensor(&mut self) -> Option<staging_core::Result<Tensor>> {
        if self.failed {
            return None;
        }
        let meta = self.checkpoint.tensors().get(self.next)?.clone();
        self.next += 1;
        let started = *self.started.get_or_insert_with(Instant::now);
        let result = self.map_one(&meta);
        match result {
            Ok(bytes) => {
                let len = meta.len as u64;
                self.report.tensors += 1;
                self.report.bytes += len;
                self.report.paths.add(StagingPath::Mapped, len);
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
                    data: Data::Mapped(bytes),
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
