//! The stager: walks a checkpoint's tensors in file order and stages each one by the policy.
//!
//! It yields `Result<StagedTensor>`; after the first error it yields nothing more, and it frees
//! its staging buffer and closes its file as soon as the load ends (last tensor, error, or drop).
//! A tensor is only ever handed out whole: a failed read drops the partly filled buffer.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::{Checkpoint, TensorMeta};
use crate::error::{Error, Result};
use crate::memory::{DeviceRegion, HostBytes, MemorySpace};
use crate::policy::{COALESCE_ALIGN, FallbackCause, StagingPath, StagingPolicy};
use crate::report::{Accounting, Fallbacks, LoadReport, MemoryKind, PathTotals};
use crate::traits::{
    AllocError, Destination, DeviceAllocator, DeviceBuffer, NoDestination, ReadError, Reader,
};
use crate::write_loop::{error_offset, fill_region, fill_regions, plan_chunks, read_exact};

/// The smallest staging buffer tried when memory is short: one 4 KiB page.
pub const MIN_STAGING_SIZE: usize = 4096;

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
            pool: $stager.pool.as_ref(),
            reader: counted!($stager),
            file: $stager.open.as_ref().map(|(_, f)| f),
            chunk_size: $stager.policy.chunk_size,
            allocator: &$stager.allocator,
        }
    };
}

/// Alignment of host-assembled tensors.
const HOST_ALIGN: usize = 16;

/// Bytes counted against the load's accounting until dropped.
struct Held {
    accounting: Arc<Accounting>,
    kind: MemoryKind,
    bytes: u64,
}

impl Held {
    fn new(accounting: &Arc<Accounting>, kind: MemoryKind, bytes: u64) -> Self {
        accounting.acquire(kind, bytes);
        Self {
            accounting: Arc::clone(accounting),
            kind,
            bytes,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.accounting.release(self.kind, self.bytes);
    }
}

/// A tensor in a device buffer of its own. Dropping it frees the buffer.
pub struct DeviceTensor<B> {
    buffer: B,
    _held: Held,
}

impl<B: DeviceBuffer> DeviceTensor<B> {
    /// The device buffer.
    pub fn buffer(&self) -> &B {
        &self.buffer
    }

    /// Takes the buffer; the load's accounting stops counting it.
    pub fn into_buffer(self) -> B {
        self.buffer
    }
}

impl<B: fmt::Debug> fmt::Debug for DeviceTensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DeviceTensor").field(&self.buffer).finish()
    }
}

/// A tensor assembled in host memory.
pub struct HostTensor {
    bytes: HostBytes,
    _held: Held,
}

impl HostTensor {
    /// Takes the bytes; the load's accounting stops counting them.
    pub fn into_bytes(self) -> HostBytes {
        self.bytes
    }
}

impl Deref for HostTensor {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostTensor")
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// Where a staged tensor's bytes are.
#[derive(Debug)]
pub enum TensorData<B> {
    /// In the caller's destination region.
    Destination {
        /// The region's address in the device's memory space.
        addr: usize,
        /// The region's length (at least the tensor's).
        capacity: usize,
    },
    /// In a device buffer owned by the tensor.
    Device(DeviceTensor<B>),
    /// In host memory owned by the tensor.
    Host(HostTensor),
}

/// One tensor, whole, with where it landed.
#[derive(Debug)]
pub struct StagedTensor<B> {
    meta: TensorMeta,
    data: TensorData<B>,
    fallback: Option<FallbackCause>,
}

impl<B> StagedTensor<B> {
    /// The tensor's metadata.
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// The path it took.
    pub fn path(&self) -> StagingPath {
        match self.data {
            TensorData::Destination { .. } => StagingPath::Destination,
            TensorData::Device(_) => StagingPath::Device,
            TensorData::Host(_) => StagingPath::Host,
        }
    }

    /// Why it took the host path, when it did.
    pub fn fallback(&self) -> Option<FallbackCause> {
        self.fallback
    }

    /// Where its bytes are.
    pub fn data(&self) -> &TensorData<B> {
        &self.data
    }

    /// Splits it into metadata and bytes.
    pub fn into_parts(self) -> (TensorMeta, TensorData<B>) {
        (self.meta, self.data)
    }
}

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
    pool: Option<rayon::ThreadPool>,
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
        policy.validate()?;
        let pool = if policy.io_threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(policy.io_threads)
                .thread_name(|i| format!("staging-io-{i}"))
                .build()
                .map_err(|e| {
                    Error::Policy(format!(
                        "cannot start {} I/O threads: {e}",
                        policy.io_threads
                    ))
                })?;
            Some(pool)
        } else {
            None
        };
        Ok(Self {
            checkpoint,
            reader,
            allocator,
            destination: NoDestination,
            policy,
            next: 0,
            open: None,
            staging: Vec::new(),
            pool,
            ready: VecDeque::new(),
            accounting: Arc::default(),
            paths: PathTotals::default(),
            fallbacks: Fallbacks::default(),
            started: None,
            elapsed: None,
            finished: false,
        })
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
            pool: self.pool,
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
            mode: self.reader.mode().to_owned(),
            files: self.checkpoint.files().len(),
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
            peak_host_bytes,
            read_requests: self.accounting.read_requests(),
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
            let file = self.reader.open(&meta.file).map_err(|source| Error::Open {
                file: meta.file.to_path_buf(),
                source,
            })?;
            self.open = Some((meta.file_index, file));
        }
        self.verify_unchanged(meta)
    }

    /// Checks that the tensor's file is still the one whose header was read: called when the
    /// file is opened and again after each tensor (or batch) is read, before it is handed out.
    fn verify_unchanged(&self, meta: &TensorMeta) -> Result<()> {
        let Some(shard) = self.checkpoint.files().get(meta.file_index) else {
            return Err(Error::Policy("internal: tensor of an unknown file".into()));
        };
        shard
            .identity
            .check(&meta.file)
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

    /// The longest run of coalesced tensors, in bytes.
    fn coalesce_limit(&self) -> usize {
        self.policy.coalesce_bytes.min(self.policy.chunk_size)
    }

    /// Whether `meta` may be read as part of a run of neighbours.
    fn coalesces(&self, meta: &TensorMeta) -> bool {
        meta.len > 0
            && meta.len < self.policy.coalesce_below
            && meta.len <= self.coalesce_limit()
            && self.allocator.splits()
    }

    /// Whether `meta` extends `run`: a coalescing candidate of the same file that starts where
    /// the run ends, at an aligned distance from its start, within the length limit.
    fn joins_run(&self, run: &[TensorMeta], meta: &TensorMeta) -> bool {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return false;
        };
        self.coalesces(meta)
            && meta.file_index == first.file_index
            && meta.offset == last.offset + last.len as u64
            && (meta.offset - first.offset).is_multiple_of(COALESCE_ALIGN)
            && meta.offset + meta.len as u64 - first.offset <= self.coalesce_limit() as u64
    }

    /// One tensor, start to end, on the calling thread.
    fn stage(&mut self, meta: TensorMeta) -> Result<StagedTensor<A::Buffer>> {
        self.ensure_open(&meta)?;
        let Some((_, file)) = self.open.as_ref() else {
            return Err(Error::Policy("internal: no open file".into()));
        };
        let chunk = self.policy.chunk_size;

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
                    return Err(Error::Policy("internal: no open file".into()));
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

    /// Several tensors of one file at once on the I/O pool, queued in order on `self.ready`.
    ///
    /// Destinations are asked one tensor at a time, in file order, exactly as
    /// [`stage`](Self::stage) does, and a tensor's memory is allocated only after its
    /// destination declined it; only the reads run together. Declined small neighbours are
    /// gathered into a run, allocated as one buffer and read with one request (see
    /// [`StagingPolicy::coalesce_below`]). A batch ends at a file boundary, after
    /// `batch_bytes`, after a destination tensor, at a host-path tensor (assembled after the
    /// batch's reads), or at an error, which is queued after the tensors before it.
    fn stage_batch(&mut self) {
        let tensors_len = self.checkpoint.tensors().len();
        let mut planned: Vec<Planned<A::Buffer>> = Vec::new();
        let mut run: Vec<TensorMeta> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut error: Option<Error> = None;
        let mut file_index = None;
        while self.next < tensors_len {
            let Some(meta) = self.checkpoint.tensors().get(self.next).cloned() else {
                break;
            };
            let crosses_file = file_index.is_some_and(|f| f != meta.file_index);
            if (!planned.is_empty() || !run.is_empty())
                && (crosses_file || batch_bytes + meta.len > self.policy.batch_bytes)
            {
                break;
            }
            if !run.is_empty() && !self.joins_run(&run, &meta) {
                let (items, failed) = self.devices().plan_run(std::mem::take(&mut run));
                let host = items.iter().any(|p| matches!(p, Planned::Host(..)));
                planned.extend(items);
                if failed.is_some() || host {
                    error = failed;
                    break;
                }
            }
            self.next += 1;
            file_index = Some(meta.file_index);
            if let Err(e) = self.ensure_open(&meta) {
                error = Some(e);
                break;
            }
            match ask_destination(&mut self.destination, &meta) {
                Err(e) => {
                    error = Some(e);
                    break;
                }
                Ok(Some((region, capacity))) => {
                    // Read the batch (and the run before this tensor) with this destination,
                    // then end the batch.
                    let addr = region.addr();
                    let devices = Devices {
                        allocator: &self.allocator,
                        policy: &self.policy,
                        accounting: &self.accounting,
                    };
                    let (items, failed) = devices.plan_run(std::mem::take(&mut run));
                    planned.extend(items);
                    let destination = failed.is_none().then_some((&meta, region));
                    let mut slots = batch_read!(self).run(planned, destination);
                    slots.extend(failed.map(|e| Slot::Ready(Err(e))));
                    if self.finish_batch(slots) {
                        let checked = self.verify_unchanged(&meta).map(|()| StagedTensor {
                            meta,
                            data: TensorData::Destination { addr, capacity },
                            fallback: None,
                        });
                        self.ready.push_back(checked);
                    }
                    return;
                }
                Ok(None) => {}
            }
            if self.coalesces(&meta) {
                batch_bytes += meta.len;
                run.push(meta);
                continue;
            }
            match self.try_device(&meta) {
                Ok(DevicePlan::Allocated(tensor)) => {
                    batch_bytes += meta.len;
                    planned.push(Planned::One(meta, tensor));
                }
                Ok(DevicePlan::Fallback(cause)) => {
                    planned.push(Planned::Host(meta, cause));
                    break;
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if !run.is_empty() {
            // The run comes before any error met after it, and replaces it if it fails itself.
            let (items, failed) = self.devices().plan_run(std::mem::take(&mut run));
            planned.extend(items);
            if failed.is_some() {
                error = failed;
            }
        }
        let mut slots = batch_read!(self).run(planned, None);
        slots.extend(error.map(|e| Slot::Ready(Err(e))));
        self.finish_batch(slots);
    }

    /// Queues a batch's tensors in order, assembling its host-path tensors on the way; stops at
    /// the first error. When the file changed while the batch was read, only that error is
    /// queued: the bytes read can no longer be trusted. Returns whether everything succeeded.
    fn finish_batch(&mut self, slots: Vec<Slot<A::Buffer>>) -> bool {
        let first_read = slots.iter().find_map(|slot| match slot {
            Slot::Ready(Ok(tensor)) => Some(tensor.meta.clone()),
            _ => None,
        });
        if let Some(Err(e)) = first_read.map(|meta| self.verify_unchanged(&meta)) {
            self.ready.push_back(Err(e));
            return false;
        }
        for slot in slots {
            let staged = match slot {
                Slot::Ready(staged) => staged,
                Slot::Host(meta, cause) => self.stage_host(meta, cause),
            };
            let ok = staged.is_ok();
            self.ready.push_back(staged);
            if !ok {
                return false;
            }
        }
        true
    }

    /// Allocates the staging slots once per load: the first (halved on out-of-memory, see
    /// [`allocate_staging`]), then up to `staging_slots - 1` more of the same size while memory
    /// allows (only with an I/O pool; more slots let reads overlap device-to-host copies).
    fn allocate_staging_slots(&mut self, meta: &TensorMeta) -> Result<()> {
        let staging_error = |bytes, source| Error::StagingBuffer {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: meta.offset,
            bytes,
            source,
        };
        let (buffer, size) = allocate_staging(&self.allocator, self.policy.staging_size)
            .map_err(|(bytes, source)| staging_error(bytes, source))?;
        let held = Held::new(&self.accounting, MemoryKind::Device, size as u64);
        self.staging.push(DeviceTensor {
            buffer,
            _held: held,
        });
        let slots = if self.pool.is_some() {
            self.policy.staging_slots
        } else {
            1
        };
        while self.staging.len() < slots {
            match self.allocator.allocate(size) {
                Ok(buffer) => {
                    let held = Held::new(&self.accounting, MemoryKind::Device, size as u64);
                    self.staging.push(DeviceTensor {
                        buffer,
                        _held: held,
                    });
                }
                Err(AllocError::OutOfMemory { .. }) => break,
                Err(source) => return Err(staging_error(size, source)),
            }
        }
        Ok(())
    }

    /// Step 3 of the policy: host assembly through the bounded staging buffer(s).
    fn stage_host(
        &mut self,
        meta: TensorMeta,
        cause: FallbackCause,
    ) -> Result<StagedTensor<A::Buffer>> {
        self.ensure_open(&meta)?;
        let bytes =
            HostBytes::zeroed(meta.len, HOST_ALIGN).ok_or_else(|| Error::HostAllocation {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: meta.offset,
                bytes: meta.len,
            })?;
        let mut host = HostTensor {
            _held: Held::new(&self.accounting, MemoryKind::Host, meta.len as u64),
            bytes,
        };
        if meta.len > 0 {
            if self.staging.is_empty() {
                self.allocate_staging_slots(&meta)?;
            }
            let Some((_, file)) = self.open.as_ref() else {
                return Err(Error::Policy("internal: no open file".into()));
            };
            let assembly = HostAssembly {
                reader: counted!(self),
                allocator: &self.allocator,
                file,
                meta: &meta,
                chunk_size: self.policy.chunk_size,
            };
            match self.pool.as_ref().filter(|_| self.staging.len() > 1) {
                Some(pool) => assembly.run_overlapped(pool, &mut self.staging, &mut host.bytes)?,
                None => {
                    let Some(slot) = self.staging.first_mut() else {
                        return Err(Error::Policy("internal: no staging buffer".into()));
                    };
                    assembly.run(slot, &mut host.bytes)?;
                }
            }
        }
        self.verify_unchanged(&meta)?;
        Ok(StagedTensor {
            meta,
            data: TensorData::Host(host),
            fallback: Some(cause),
        })
    }
}

/// The stager's reader, counting its read calls into the load's report.
struct Counted<'a, R> {
    inner: &'a R,
    accounting: &'a Accounting,
}

impl<R: Reader> Reader for Counted<'_, R> {
    type Space = R::Space;
    type File = R::File;

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn mode(&self) -> &str {
        self.inner.mode()
    }

    fn open(&self, path: &std::path::Path) -> std::result::Result<R::File, ReadError> {
        self.inner.open(path)
    }

    fn read_at(
        &self,
        file: &R::File,
        offset: u64,
        dst: DeviceRegion<'_, R::Space>,
    ) -> std::result::Result<usize, ReadError> {
        self.accounting.count_request();
        self.inner.read_at(file, offset, dst)
    }
}

/// A batch read: what [`Stager::stage_batch`] hands to the pool.
struct BatchRead<'a, R: Reader, A> {
    pool: Option<&'a rayon::ThreadPool>,
    reader: Counted<'a, R>,
    file: Option<&'a R::File>,
    chunk_size: usize,
    allocator: &'a A,
}

impl<R: Reader, A: DeviceAllocator<Space = R::Space>> BatchRead<'_, R, A> {
    /// Reads the planned device tensors and runs (and an optional destination region, last in
    /// order) on the pool; returns the planned items in order, runs cut into their tensors by
    /// `split`, up to and including the first failure.
    fn run(
        &self,
        planned: Vec<Planned<A::Buffer>>,
        destination: Option<(&TensorMeta, DeviceRegion<'_, R::Space>)>,
    ) -> Vec<Slot<A::Buffer>> {
        let mut planned = planned;
        let failure = {
            let mut items: Vec<(&[TensorMeta], DeviceRegion<'_, R::Space>)> = Vec::new();
            for item in planned.iter_mut() {
                match item {
                    Planned::One(meta, tensor) => {
                        items.push((std::slice::from_ref(meta), tensor.buffer.region()));
                    }
                    Planned::Run {
                        tensors, buffer, ..
                    } => items.push((tensors.as_slice(), buffer.region())),
                    Planned::Host(..) => {}
                }
            }
            if let Some((meta, region)) = destination {
                items.push((std::slice::from_ref(meta), region));
            }
            if items.is_empty() {
                None
            } else {
                let (Some(pool), Some(file)) = (self.pool, self.file) else {
                    return vec![Slot::Ready(Err(Error::Policy(
                        "internal: no pool or open file".into(),
                    )))];
                };
                fill_regions(pool, &self.reader, file, items, self.chunk_size)
            }
        };
        let failed_item = failure.as_ref().map(|(index, _)| *index);
        let mut out = Vec::with_capacity(planned.len() + 1);
        let mut item = 0usize;
        for planned in planned {
            match planned {
                Planned::Host(meta, cause) => out.push(Slot::Host(meta, cause)),
                Planned::One(meta, tensor) => {
                    if failed_item == Some(item) {
                        break;
                    }
                    out.push(Slot::Ready(Ok(StagedTensor {
                        meta,
                        data: TensorData::Device(tensor),
                        fallback: None,
                    })));
                    item += 1;
                }
                Planned::Run {
                    tensors,
                    buffer,
                    held,
                } => {
                    let failed = failed_item == Some(item);
                    let complete = match &failure {
                        Some((_, error)) if failed => self.complete_before(&tensors, error),
                        _ => tensors.len(),
                    };
                    let Some(first) = tensors.first() else {
                        break;
                    };
                    let pieces: Vec<(usize, usize)> = tensors
                        .iter()
                        .map(|t| ((t.offset - first.offset) as usize, t.len))
                        .collect();
                    match self.allocator.split(buffer, &pieces) {
                        Ok(buffers) => {
                            let parts = tensors.into_iter().zip(buffers).zip(held);
                            for ((meta, buffer), held) in parts.take(complete) {
                                out.push(Slot::Ready(Ok(StagedTensor {
                                    meta,
                                    data: TensorData::Device(DeviceTensor {
                                        buffer,
                                        _held: held,
                                    }),
                                    fallback: None,
                                })));
                            }
                        }
                        Err(_) => {
                            out.push(Slot::Ready(Err(Error::Policy(
                                "internal: the allocator would not split a run it allocated".into(),
                            ))));
                            return out;
                        }
                    }
                    if failed {
                        break;
                    }
                    item += 1;
                }
            }
        }
        if let Some((_, error)) = failure {
            out.push(Slot::Ready(Err(error)));
        }
        out
    }

    /// How many of a failed run's tensors were read whole before `error`: those ending at or
    /// before its offset, when the run was read as one request (otherwise none can be trusted,
    /// since later chunks may have been read and earlier ones skipped).
    fn complete_before(&self, tensors: &[TensorMeta], error: &Error) -> usize {
        let (Some(first), Some(last)) = (tensors.first(), tensors.last()) else {
            return 0;
        };
        let span = (last.offset - first.offset) as usize + last.len;
        if plan_chunks(first.offset, span, self.chunk_size).count() != 1 {
            return 0;
        }
        let failed_at = match error {
            Error::Read { offset, .. } | Error::Truncated { offset, .. } => *offset,
            _ => return 0,
        };
        tensors
            .iter()
            .take_while(|t| t.offset + t.len as u64 <= failed_at)
            .count()
    }
}

/// Host assembly of one tensor through staging slots.
struct HostAssembly<'a, R: Reader, A: DeviceAllocator<Space = R::Space>> {
    reader: Counted<'a, R>,
    allocator: &'a A,
    file: &'a R::File,
    meta: &'a TensorMeta,
    chunk_size: usize,
}

impl<R: Reader, A: DeviceAllocator<Space = R::Space>> HostAssembly<'_, R, A> {
    /// Reads every chunk of the tensor through `slot` into `host` (the whole tensor's bytes), in
    /// order, stopping at the first failure.
    fn run(&self, slot: &mut DeviceTensor<A::Buffer>, host: &mut [u8]) -> Result<()> {
        let meta = self.meta;
        let chunk = self.chunk_size.min(slot.buffer.len());
        for (rel, n) in plan_chunks(meta.offset, meta.len, chunk) {
            let Some(dst) = host.get_mut(rel..rel + n) else {
                return Err(Error::Policy("internal: chunk outside tensor".into()));
            };
            self.chunk_into(slot, rel, n, dst)?;
        }
        Ok(())
    }

    /// Every slot works on its share of the chunks at once, so one slot's read overlaps
    /// another's device-to-host copy. Returns the failure at the lowest offset.
    fn run_overlapped(
        &self,
        pool: &rayon::ThreadPool,
        slots: &mut [DeviceTensor<A::Buffer>],
        host: &mut [u8],
    ) -> Result<()> {
        let chunk = slots
            .iter()
            .map(|s| s.buffer.len())
            .min()
            .unwrap_or(0)
            .min(self.chunk_size);
        // Cut the host bytes into the chunks' slices, dealt to the slots in turn.
        let mut shares: Vec<Vec<(usize, &mut [u8])>> =
            (0..slots.len()).map(|_| Vec::new()).collect();
        let mut rest = host;
        for (i, (rel, n)) in plan_chunks(self.meta.offset, self.meta.len, chunk).enumerate() {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            if let Some(share) = shares.get_mut(i % slots.len()) {
                share.push((rel, piece));
            }
        }
        let failed = std::sync::atomic::AtomicBool::new(false);
        let errors = std::sync::Mutex::new(Vec::new());
        pool.scope(|scope| {
            for (slot, share) in slots.iter_mut().zip(shares) {
                let (failed, errors) = (&failed, &errors);
                scope.spawn(move |_| {
                    for (rel, piece) in share {
                        if failed.load(std::sync::atomic::Ordering::Acquire) {
                            return;
                        }
                        let n = piece.len();
                        if let Err(e) = self.chunk_into(slot, rel, n, piece) {
                            failed.store(true, std::sync::atomic::Ordering::Release);
                            errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                            return;
                        }
                    }
                });
            }
        });
        let errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
        match errors.into_iter().min_by_key(error_offset) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads the chunk at `rel` (of `n` bytes) through `slot` and copies it to `dst`, the
    /// chunk's host slice.
    fn chunk_into(
        &self,
        slot: &mut DeviceTensor<A::Buffer>,
        rel: usize,
        n: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let meta = self.meta;
        let at = meta.offset + rel as u64;
        let mut whole = slot.buffer.region();
        let Some(region) = whole.slice(0, n) else {
            return Err(Error::Policy(
                "internal: chunk larger than staging buffer".into(),
            ));
        };
        read_exact(
            &self.reader,
            self.file,
            std::slice::from_ref(meta),
            at,
            region,
        )?;
        self.allocator
            .copy_to_host(&slot.buffer, 0, dst)
            .map_err(|source| Error::Device {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: at,
                source,
            })
    }
}

/// What step 2 of the policy needs, borrowed apart from the destination (so a run can be
/// allocated while a destination region is held).
struct Devices<'a, A: DeviceAllocator> {
    allocator: &'a A,
    policy: &'a StagingPolicy,
    accounting: &'a Arc<Accounting>,
}

impl<A: DeviceAllocator> Devices<'_, A> {
    /// Free device memory by the policy: the caller's budget less what the load holds, or the
    /// device's own figure.
    fn free_memory(&self, meta: &TensorMeta) -> Result<u64> {
        match self.policy.memory_budget {
            Some(budget) => Ok(budget.saturating_sub(self.accounting.device_now())),
            None => Ok(self
                .allocator
                .memory_info()
                .map_err(|source| Error::Device {
                    tensor: meta.name.clone(),
                    file: meta.file.to_path_buf(),
                    offset: meta.offset,
                    source,
                })?
                .free),
        }
    }

    /// Step 2 of the policy: a device buffer of its own when free memory leaves the headroom.
    fn try_device(&self, meta: &TensorMeta) -> Result<DevicePlan<A::Buffer>> {
        if !self
            .policy
            .fits_on_device(meta.len as u64, self.free_memory(meta)?)
        {
            return Ok(DevicePlan::Fallback(FallbackCause::InsufficientMemory));
        }
        match self.allocator.allocate(meta.len) {
            Ok(buffer) => {
                let held = Held::new(self.accounting, MemoryKind::Device, meta.len as u64);
                Ok(DevicePlan::Allocated(DeviceTensor {
                    buffer,
                    _held: held,
                }))
            }
            Err(AllocError::OutOfMemory { .. }) => {
                Ok(DevicePlan::Fallback(FallbackCause::AllocationRace))
            }
            Err(source) => Err(Error::Allocation {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: meta.offset,
                source,
            }),
        }
    }

    /// Plans a run of back-to-back tensors (destinations declined): one allocation for all of
    /// them when free memory leaves the headroom for the whole run, else (or when that
    /// allocation is out of memory) each tensor by step 2 on its own, exactly as without
    /// coalescing. Returns what was planned before any error.
    fn plan_run(&self, run: Vec<TensorMeta>) -> (Vec<Planned<A::Buffer>>, Option<Error>) {
        if let (true, Some(first), Some(last)) = (run.len() > 1, run.first(), run.last()) {
            let span = (last.offset - first.offset) as usize + last.len;
            let free = match self.free_memory(first) {
                Ok(free) => free,
                Err(e) => return (Vec::new(), Some(e)),
            };
            if self.policy.fits_on_device(span as u64, free) {
                match self.allocator.allocate(span) {
                    Ok(buffer) => {
                        let held = run
                            .iter()
                            .map(|t| Held::new(self.accounting, MemoryKind::Device, t.len as u64))
                            .collect();
                        return (
                            vec![Planned::Run {
                                tensors: run,
                                buffer,
                                held,
                            }],
                            None,
                        );
                    }
                    Err(AllocError::OutOfMemory { .. }) => {}
                    Err(source) => {
                        let error = Error::Allocation {
                            tensor: first.name.clone(),
                            file: first.file.to_path_buf(),
                            offset: first.offset,
                            source,
                        };
                        return (Vec::new(), Some(error));
                    }
                }
            }
        }
        let mut items = Vec::with_capacity(run.len());
        for meta in run {
            match self.try_device(&meta) {
                Ok(DevicePlan::Allocated(tensor)) => items.push(Planned::One(meta, tensor)),
                Ok(DevicePlan::Fallback(cause)) => items.push(Planned::Host(meta, cause)),
                Err(e) => return (items, Some(e)),
            }
        }
        (items, None)
    }
}

/// A batch item, planned in file order before the batch's reads.
enum Planned<B> {
    /// A tensor in a device buffer of its own.
    One(TensorMeta, DeviceTensor<B>),
    /// Back-to-back tensors in one buffer, read with one request and split afterwards.
    Run {
        tensors: Vec<TensorMeta>,
        buffer: B,
        held: Vec<Held>,
    },
    /// A tensor for host assembly, after the batch's reads.
    Host(TensorMeta, FallbackCause),
}

/// A batch item after the batch's reads.
enum Slot<B> {
    /// Staged, or the failure that ends the load.
    Ready(Result<StagedTensor<B>>),
    /// Still to be assembled on the host.
    Host(TensorMeta, FallbackCause),
}

/// What step 2 of the policy decided.
enum DevicePlan<B> {
    /// A device buffer, allocated and not yet read.
    Allocated(DeviceTensor<B>),
    /// The host path, and why.
    Fallback(FallbackCause),
}

/// Step 1 of the policy: asks the destination, and checks the region is long enough. Returns
/// the region cut to the tensor's length (its address and full capacity are those of the
/// region the destination gave).
fn ask_destination<'d, S: MemorySpace, D: Destination<S>>(
    destination: &'d mut D,
    meta: &TensorMeta,
) -> Result<Option<(DeviceRegion<'d, S>, usize)>> {
    let offered = destination
        .region(meta)
        .map_err(|source| Error::Destination {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            source,
        })?;
    let Some(region) = offered else {
        return Ok(None);
    };
    let capacity = region.len();
    match region.split_at(meta.len) {
        Some((target, _)) => Ok(Some((target, capacity))),
        None => Err(Error::DestinationTooSmall {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            needed: meta.len,
            capacity,
        }),
    }
}

/// Allocates the staging buffer: `size` bytes, or on out-of-memory half as much, down to
/// [`MIN_STAGING_SIZE`]. Any other failure, or out-of-memory at the minimum, is returned with the
/// size last tried.
fn allocate_staging<A: DeviceAllocator>(
    allocator: &A,
    size: usize,
) -> std::result::Result<(A::Buffer, usize), (usize, AllocError)> {
    let mut size = size;
    loop {
        match allocator.allocate(size) {
            Ok(buffer) => return Ok((buffer, size)),
            Err(AllocError::OutOfMemory { .. }) if size / 2 >= MIN_STAGING_SIZE => size /= 2,
            Err(e) => return Err((size, e)),
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
                if self.pool.is_some() {
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
