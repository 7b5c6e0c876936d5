//! Several tensors of one file read at once on the I/O pool.
//!
//! Decisions stay in file order, one tensor at a time (destination asked, then memory
//! allocated), exactly as on the caller's thread; only the reads run together. Back-to-back small
//! tensors are gathered into a run, allocated as one buffer, read with one request and split into
//! tensors afterwards. The stager's reader is wrapped in [`Counted`], so the report knows how
//! many read calls and bytes a load made.

use crate::checkpoint::TensorMeta;
use crate::error::{Error, ReadError};
use crate::memory::DeviceRegion;
use crate::policy::COALESCE_ALIGN;
use crate::report::Accounting;
use crate::traits::{Destination, DeviceAllocator, DeviceBuffer, IoMode, Reader};
use crate::write_loop::{fill_regions, plan_chunks};

use super::Stager;
use super::plan::{DevicePlan, Devices, Planned, Slot, ask_destination};
use super::tensor::{DeviceTensor, StagedTensor, TensorData};

impl<R, A, D> Stager<R, A, D>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    D: Destination<R::Space>,
{
    /// Whether `meta` may be read as part of a run of neighbours.
    fn coalesces(&self, meta: &TensorMeta) -> bool {
        meta.len > 0
            && meta.len < self.policy.coalesce_below()
            && meta.len <= self.policy.coalesce_bytes()
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
            && meta.offset + meta.len as u64 - first.offset <= self.policy.coalesce_bytes() as u64
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
    pub(super) fn stage_batch(&mut self) {
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
                && (crosses_file || batch_bytes + meta.len > self.policy.batch_bytes())
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
}

/// The stager's reader, counting its read calls and the bytes they return into the load's
/// report.
pub(super) struct Counted<'a, R> {
    pub(super) inner: &'a R,
    pub(super) accounting: &'a Accounting,
}

impl<R: Reader> Reader for Counted<'_, R> {
    type Space = R::Space;
    type File = R::File;

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn mode(&self) -> IoMode {
        self.inner.mode()
    }

    fn unchanged_by(&self) -> &'static str {
        self.inner.unchanged_by()
    }

    fn redirects(&self) -> Vec<String> {
        self.inner.redirects()
    }

    fn open(&self, path: &std::path::Path) -> std::result::Result<R::File, ReadError> {
        self.inner.open(path)
    }

    fn reopen(&self, path: &std::path::Path) -> std::result::Result<R::File, ReadError> {
        self.inner.reopen(path)
    }

    fn read_at(
        &self,
        file: &R::File,
        offset: u64,
        dst: DeviceRegion<'_, R::Space>,
    ) -> std::result::Result<usize, ReadError> {
        self.accounting.count_request();
        let read = self.inner.read_at(file, offset, dst);
        if let Ok(n) = read {
            self.accounting.count_bytes_read(n);
        }
        read
    }

    fn verify_unchanged(
        &self,
        path: &std::path::Path,
        identity: &crate::checkpoint::FileIdentity,
    ) -> std::result::Result<(), String> {
        self.inner.verify_unchanged(path, identity)
    }

    fn identity_of(&self, file: &R::File) -> Option<crate::checkpoint::FileIdentity> {
        self.inner.identity_of(file)
    }
}

/// A batch read: what [`Stager::stage_batch`] hands to the pool.
pub(super) struct BatchRead<'a, R: Reader, A> {
    pub(super) pool: Option<&'a rayon::ThreadPool>,
    pub(super) reader: Counted<'a, R>,
    pub(super) file: Option<&'a R::File>,
    pub(super) chunk_size: usize,
    pub(super) allocator: &'a A,
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
                    return vec![Slot::Ready(Err(Error::Internal(
                        "a batch read without a pool or an open file".into(),
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
                                    data: TensorData::Device(DeviceTensor { buffer, held }),
                                    fallback: None,
                                })));
                            }
                        }
                        Err(_) => {
                            out.push(Slot::Ready(Err(Error::Internal(
                                "the allocator would not split a run it allocated".into(),
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
