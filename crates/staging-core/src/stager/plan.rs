//! The policy's decisions for one tensor, or one run of neighbours, and the allocations they
//! lead to: the caller's destination first; else a device buffer of its own when free memory
//! leaves the headroom; else the host path, and why.

use std::sync::Arc;

use crate::checkpoint::TensorMeta;
use crate::error::{AllocError, Error, Result};
use crate::memory::{DeviceRegion, MemorySpace};
use crate::policy::{FallbackCause, StagingPolicy};
use crate::report::{Accounting, MemoryKind};
use crate::traits::{Destination, DeviceAllocator, DeviceBuffer};

use super::tensor::{DeviceTensor, Held, StagedTensor};

/// The smallest staging buffer tried when memory is short: one 4 KiB page.
pub const MIN_STAGING_SIZE: usize = 4096;

/// What step 2 of the policy needs, borrowed apart from the destination (so a run can be
/// allocated while a destination region is held).
pub(super) struct Devices<'a, A: DeviceAllocator> {
    pub(super) allocator: &'a A,
    pub(super) policy: &'a StagingPolicy,
    pub(super) accounting: &'a Arc<Accounting>,
}

impl<A: DeviceAllocator> Devices<'_, A> {
    /// Free device memory by the policy: the caller's budget less what the load holds, or the
    /// device's own figure.
    fn free_memory(&self, meta: &TensorMeta) -> Result<u64> {
        match self.policy.memory_budget() {
            Some(budget) => Ok(budget.saturating_sub(self.accounting.device_in_use())),
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
    /// Without host assembly, the headroom is not asked for: the allocation is tried, and out
    /// of memory is the error; a caller's budget (`memory_cap`) still bounds the load, the
    /// tensor itself, without headroom, having to fit what is left of it.
    pub(super) fn try_device(&self, meta: &TensorMeta) -> Result<DevicePlan<A::Buffer>> {
        let host_assembly = self.policy.host_assembly();
        if host_assembly
            && !self
                .policy
                .fits_on_device(meta.len as u64, self.free_memory(meta)?)
        {
            return Ok(DevicePlan::Fallback(FallbackCause::InsufficientMemory));
        }
        if !host_assembly && let Some(budget) = self.policy.memory_budget() {
            let left = self.free_memory(meta)?; // the budget less what the load holds
            if meta.len as u64 > left {
                return Err(Error::Allocation {
                    tensor: meta.name.clone(),
                    file: meta.file.to_path_buf(),
                    offset: meta.offset,
                    source: AllocError::OutOfMemory {
                        requested: meta.len,
                        detail: format!(
                            "{left} bytes left of the load's budget (memory_cap) of {budget}, and \
                             host assembly is off"
                        ),
                    },
                });
            }
        }
        match self.allocator.allocate(meta.len) {
            Ok(buffer) if buffer.len() != meta.len => Err(Error::Allocation {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: meta.offset,
                source: AllocError::Failed {
                    requested: meta.len,
                    detail: format!("the allocator returned {} bytes", buffer.len()),
                },
            }),
            Ok(buffer) => {
                let held = Held::new(self.accounting, MemoryKind::Device, meta.len as u64);
                Ok(DevicePlan::Allocated(DeviceTensor { buffer, held }))
            }
            Err(AllocError::OutOfMemory { .. }) if host_assembly => {
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
    pub(super) fn plan_run(
        &self,
        run: Vec<TensorMeta>,
    ) -> (Vec<Planned<A::Buffer>>, Option<Error>) {
        if let (true, Some(first), Some(last)) = (run.len() > 1, run.first(), run.last()) {
            let span = (last.offset - first.offset) as usize + last.len;
            let free = match self.free_memory(first) {
                Ok(free) => free,
                Err(e) => return (Vec::new(), Some(e)),
            };
            if self.policy.fits_on_device(span as u64, free) {
                match self.allocator.allocate(span) {
                    Ok(buffer) if buffer.len() == span => {
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
                    Ok(short) => {
                        let error = Error::Allocation {
                            tensor: first.name.clone(),
                            file: first.file.to_path_buf(),
                            offset: first.offset,
                            source: AllocError::Failed {
                                requested: span,
                                detail: format!("the allocator returned {} bytes", short.len()),
                            },
                        };
                        return (Vec::new(), Some(error));
                    }
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
pub(super) enum Planned<B> {
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
pub(super) enum Slot<B> {
    /// Staged, or the failure that ends the load.
    Ready(Result<StagedTensor<B>>),
    /// Still to be assembled on the host.
    Host(TensorMeta, FallbackCause),
}

/// What step 2 of the policy decided.
pub(super) enum DevicePlan<B> {
    /// A device buffer, allocated and not yet read.
    Allocated(DeviceTensor<B>),
    /// The host path, and why.
    Fallback(FallbackCause),
}

/// Step 1 of the policy: asks the destination, and checks the region is long enough. Returns
/// the region cut to the tensor's length (its address and full capacity are those of the
/// region the destination gave).
pub(super) fn ask_destination<'d, S: MemorySpace, D: Destination<S>>(
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
pub(super) fn allocate_staging<A: DeviceAllocator>(
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
