//! The stager: walks a checkpoint's tensors in file order and stages each one by the policy.
//!
//! It yields `Result<StagedTensor>`; after the first error it yields nothing more, and it frees
//! its staging buffer and closes its file as soon as the load ends (last tensor, error, or drop).
//! A tensor is only ever handed out whole: a failed read drops the partly filled buffer.
//!
//! The work is split by responsibility:
//! - this module: the iterator, one tensor at a time on the caller's thread (`io_threads = 1`),
//!   the report, and the file checks;
//! - [`plan`]: the policy's decisions (destination, device buffer with headroom, fallback) and
//!   the allocations they lead to;
//! - [`batch`]: several tensors of a file read at once on the I/O pool, neighbours coalesced;
//! - [`assembly`]: the host path, through the bounded staging buffers;
//! - [`tensor`]: what is handed out, and the accounting of who holds which bytes.

/// The stager's reader, counting into its report, borrowing only the fields it needs (a
/// destination's region may still borrow `destination`, so a method borrowing the whole stager
/// would not do).
macro_rules! counted {
    ($stager:expr) => {
        Counted {
            inner: &$stager.reader,
            accounting: &$stager.accounting,
        }
    };
}

/// A [`BatchRead`] over the stager's fields, each borrowed on its own (see [`counted!`]).
macro_rules! batch_read {
    ($stager:expr) => {
        BatchRead {
            pool: $stager.threads.pool(),
            reader: counted!($stager),
            file: $stager.open.as_ref().map(|(_, f)| f),
            chunk_size: $stager.policy.chunk_size(),
            allocator: &$stager.allocator,
        }
    };
}

mod assembly;
mod batch;
mod plan;
mod tensor;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::{Checkpoint, TensorMeta};
use crate::error::{Error, Result};
use crate::kept::IoThreads;
use crate::policy::StagingPolicy;
use crate::report::{Accounting, Fallbacks, HeldMemory, LoadReport, PathTotals};
use crate::traits::{Destination, DeviceAllocator, DeviceBuffer, NoDestination, Reader};
use crate::write_loop::fill_region;

use batch::Counted;
pub use plan::MIN_STAGING_SIZE;
use plan::{DevicePlan, Devices, ask_destination};
pub use tensor::{DeviceTensor, HostTensor, StagedTensor, TakenBuffer, TensorData};

/// Walks a checkpoint and stages each tensor by the policy. An iterator of
/// `Result<StagedTensor>` in load order.
pub struct Stager<R, A, D = NoDestination>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    D: Destination<R::Space>,
{
    checkpoint: Checkpoint,
    reader: R,
    allocator: A,
    destination: D,
    policy: StagingPolicy,
    next: usize,
    open: Option<(usize, R::File)>,
    staging: Vec<DeviceTensor<A::Buffer>>,
    threads: IoThreads,
    ready: VecDeque<Result<StagedTensor<A::Buffer>>>,
    accounting: Arc<Accounting>,
    paths: PathTotals,
    fallbacks: Fallbacks,
    started: Option<Instant>,
    elapsed: Option<Duration>,
    finished: bool,
}

impl<R, A> Stager<R, A, NoDestination>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
{
    /// A stager over `checkpoint` with a backend's reader and allocator.
    pub fn new(
        checkpoint: Checkpoint,
        reader: R,
        allocator: A,
        policy: StagingPolicy,
    ) -> Result<Self> {
        let threads = IoThreads::new(policy.io_threads())?;
        Ok(Self::on_threads(
            checkpoint, reader, allocator, policy, threads,
        ))
    }

    /// A stager as [`new`](Self::new) makes, reading on `threads` (shared with other loads)
    /// instead of threads of its own.
    pub fn on_threads(
        checkpoint: Checkpoint,
        reader: R,
        allocator: A,
        policy: StagingPolicy,
        threads: IoThreads,
    ) -> Self {
        Self {
            checkpoint,
            reader,
            allocator,
            destination: NoDestination,
            policy,
            next: 0,
            open: None,
            staging: Vec::new(),
            threads,
            ready: VecDeque::new(),
            accounting: Arc::default(),
            paths: PathTotals::default(),
            fallbacks: Fallbacks::default(),
            started: None,
            elapsed: None,
            finished: false,
        }
    }
}

impl<R, A, D> Stager<R, A, D>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    D: Destination<R::Space>,
{
    /// Uses `destination` for every tensor it accepts. Call before iterating.
    pub fn with_destination<D2: Destination<R::Space>>(self, destination: D2) -> Stager<R, A, D2> {
        Stager {
            checkpoint: self.checkpoint,
            reader: self.reader,
            allocator: self.allocator,
            destination,
            policy: self.policy,
            next: self.next,
            open: self.open,
            staging: self.staging,
            threads: self.threads,
            ready: self.ready,
            accounting: self.accounting,
            paths: self.paths,
            fallbacks: self.fallbacks,
            started: self.started,
            elapsed: self.elapsed,
            finished: self.finished,
        }
    }

    /// The checkpoint being loaded.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// The allocator (for copying device tensors back, for example).
    pub fn allocator(&self) -> &A {
        &self.allocator
    }

    /// The policy in force.
    pub fn policy(&self) -> &StagingPolicy {
        &self.policy
    }

    /// What this load's buffers hold now; the handle outlives the stager.
    pub fn held_memory(&self) -> HeldMemory {
        HeldMemory(Arc::clone(&self.accounting))
    }

    /// The report so far; final once the iterator has returned `None` or an error.
    pub fn report(&self) -> LoadReport {
        let seconds = match (self.elapsed, self.started) {
            (Some(done), _) => done.as_secs_f64(),
            (None, Some(start)) => start.elapsed().as_secs_f64(),
            (None, None) => 0.0,
        };
        let p = &self.paths;
        let tensors = p.destination.tensors + p.device.tensors + p.host.tensors;
        let bytes = p.destination.bytes + p.device.bytes + p.host.bytes;
        let (peak_device_bytes, peak_host_bytes) = self.accounting.peaks();
        LoadReport {
            backend: self.reader.name().to_owned(),
            mode: self.reader.mode(),
            unchanged_by: self.reader.unchanged_by(),
            redirects: self.reader.redirects(),
            passed_over: Vec::new(),
            mode_reason: None,
            files: self.checkpoint.files().len(),
            headers_read: self.checkpoint.headers_read(),
            tensors,
            bytes,
            seconds,
            bytes_per_second: if seconds > 0.0 {
                bytes as f64 / seconds
            } else {
                0.0
            },
            paths: *p,
            fallbacks: self.fallbacks,
            peak_device_bytes,
            taken_device_bytes: self.accounting.taken_total(),
            peak_host_bytes,
            read_requests: self.accounting.read_requests(),
            bytes_read: self.accounting.bytes_read(),
            hub: None,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        self.staging.clear();
        self.open = None;
        if self.elapsed.is_none() {
            self.elapsed = Some(self.started.map_or(Duration::ZERO, |s| s.elapsed()));
        }
    }

    fn ensure_open(&mut self, meta: &TensorMeta) -> Result<()> {
        if self.open.as_ref().map(|(index, _)| *index) != Some(meta.file_index) {
            self.open = None;
            let opened = |file| Error::Open {
                file: meta.file.to_path_buf(),
                source: file,
            };
            let file = self.reader.open(&meta.file).map_err(opened)?;
            self.open = Some((meta.file_index, file));
            if self.verify_unchanged(meta).is_err() {
                // A reader that keeps its files may have kept this path's from an older header
                // (the path read again since, naming another file now): opened anew once.
                self.open = None;
                let file = self.reader.reopen(&meta.file).map_err(opened)?;
                self.open = Some((meta.file_index, file));
            }
        }
        self.verify_unchanged(meta)
    }

    /// Checks that the tensor's file is still the one whose header was read: called when the
    /// file is opened and again after each tensor (or batch) is read, before it is handed out.
    /// The file open is checked where the reader can tell its identity (a file renamed over it
    /// since is still the file read, whole; one changed in place is refused), else its path.
    fn verify_unchanged(&self, meta: &TensorMeta) -> Result<()> {
        let Some(shard) = self.checkpoint.files().get(meta.file_index) else {
            return Err(Error::Internal("tensor of an unknown file".into()));
        };
        let open = self
            .open
            .as_ref()
            .filter(|(index, _)| *index == meta.file_index)
            .and_then(|(_, file)| self.reader.identity_of(file));
        match open {
            Some(now) => shard.identity.compare(&now),
            None => self.reader.verify_unchanged(&meta.file, &shard.identity),
        }
        .map_err(|detail| Error::FileChanged {
            file: meta.file.to_path_buf(),
            detail,
        })
    }

    /// Step 2 of the policy: a device buffer of its own when free memory leaves the headroom.
    fn try_device(&self, meta: &TensorMeta) -> Result<DevicePlan<A::Buffer>> {
        self.devices().try_device(meta)
    }

    fn devices(&self) -> Devices<'_, A> {
        Devices {
            allocator: &self.allocator,
            policy: &self.policy,
            accounting: &self.accounting,
        }
    }

    /// One tensor, start to end, on the calling thread.
    fn stage(&mut self, meta: TensorMeta) -> Result<StagedTensor<A::Buffer>> {
        self.ensure_open(&meta)?;
        let Some((_, file)) = self.open.as_ref() else {
            return Err(Error::Internal("no open file".into()));
        };
        let chunk = self.policy.chunk_size();

        // 1. The caller's destination, asked before anything is allocated.
        if let Some((region, capacity)) = ask_destination(&mut self.destination, &meta)? {
            let addr = region.addr();
            let reader = counted!(self);
            fill_region(&reader, file, &meta, region, chunk)?;
            self.verify_unchanged(&meta)?;
            return Ok(StagedTensor {
                meta,
                data: TensorData::Destination { addr, capacity },
                fallback: None,
            });
        }
        // 2. A device buffer of its own when free memory leaves the headroom.
        match self.try_device(&meta)? {
            DevicePlan::Allocated(mut tensor) => {
                let Some((_, file)) = self.open.as_ref() else {
                    return Err(Error::Internal("no open file".into()));
                };
                let reader = counted!(self);
                fill_region(&reader, file, &meta, tensor.buffer.region(), chunk)?;
                self.verify_unchanged(&meta)?;
                Ok(StagedTensor {
                    meta,
                    data: TensorData::Device(tensor),
                    fallback: None,
                })
            }
            // 3. Host assembly through the one bounded staging buffer.
            DevicePlan::Fallback(cause) => self.stage_host(meta, cause),
        }
    }
}

impl<R, A, D> Iterator for Stager<R, A, D>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    D: Destination<R::Space>,
{
    type Item = Result<StagedTensor<A::Buffer>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ready.is_empty() && !self.finished {
            self.started.get_or_insert_with(Instant::now);
            if self.next < self.checkpoint.tensors().len() {
                if self.threads.pool().is_some() {
                    self.stage_batch();
                } else if let Some(meta) = self.checkpoint.tensors().get(self.next).cloned() {
                    self.next += 1;
                    let staged = self.stage(meta);
                    self.ready.push_back(staged);
                }
            }
        }
        let Some(item) = self.ready.pop_front() else {
            self.finish();
            return None;
        };
        match &item {
            Ok(tensor) => {
                self.paths.add(tensor.path(), tensor.meta.len as u64);
                if let Some(cause) = tensor.fallback {
                    self.fallbacks.add(cause);
                }
                if self.ready.is_empty() && self.next == self.checkpoint.tensors().len() {
                    self.finish();
                }
            }
            Err(_) => {
                self.ready.clear();
                self.finish();
            }
        }
        Some(item)
    }
}

impl<R, A, D> fmt::Debug for Stager<R, A, D>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    D: Destination<R::Space>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stager")
            .field("backend", &self.reader.name())
            .field("tensors", &self.checkpoint.tensors().len())
            .field("next", &self.next)
            .field("policy", &self.policy)
            .field("finished", &self.finished)
            .finish()
    }
}
