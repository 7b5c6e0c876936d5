//! CUDA through `cudarc`'s driver API (loaded at run time): the device and its primary context,
//! device buffers, pinned host buffers, and the allocator.
//!
//! `cudarc` panics when `libcuda` is missing, so [`CudaDevice::open`] checks
//! `is_culib_present()` before its first call. Errors are formatted from the `CUresult` itself,
//! never through `cuGetErrorString`.
//!
//! The caller's current context stays the caller's: every call that needs the device's context
//! makes it current through [`CudaDevice::bind`], which pushes it only when another context (or
//! none) is current and takes it off again when its guard drops, on every path (errors, `Drop`
//! of buffers, whichever thread frees a tensor). A guard takes off only the context it pushed:
//! one that other code pushed over it stays (its own is taken from under it), and one whose
//! context is gone leaves the stack alone. Memory is freed only in its own context: a buffer
//! whose context cannot be made current is left allocated rather than freed in another. What
//! was found wrong is kept per device ([`CudaDevice::faults`]). The guards never call
//! `cuCtxSetCurrent`; only the hand-over's `CallerContext` does, to put back a caller's context
//! that code of `cudarc`'s replaced with it.
//!
//! A caller with CUDA of its own hands in its `cudarc` context ([`CudaDevice::from_context`]) or
//! stream ([`CudaDevice::from_stream`]): the device then uses that context (primary or not,
//! kept alive by the caller's `Arc`, never retained or released here), and with a stream the
//! POSIX path queues its copies on it, so the library creates no stream of its own.
//!
//! Every CUDA driver call of the backend is in this one module, so that its unsafe code (and the
//! contexts, streams and frees it must balance) can be read and audited in one place. Its files,
//! from the bottom up: `stack` (this thread's context stack), `device` (the device, its context
//! guard and faults), `memory` (device allocations and the allocator), `pinned` (pinned bounce
//! buffers and their asynchronous copies), `gds` (the traits `backend-gds` asks of a GPU); this
//! file holds the memory space and the one mapping of a driver error to a device error.

mod device;
mod gds;
mod memory;
mod pinned;
mod stack;

use cudarc::driver::DriverError;
use staging_core::{DeviceError, MemorySpace};

pub use device::{BoundContext, ContextFaults, CudaDevice};
pub use memory::{CudaAllocator, CudaBuffer};
pub use pinned::PinnedBuffer;
pub(crate) use stack::CallerContext;

use crate::errors::cuda_code;

/// CUDA device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaMemory;

impl MemorySpace for CudaMemory {
    const NAME: &'static str = "cuda";
}

fn device_error(operation: &str, e: DriverError) -> DeviceError {
    DeviceError::new(operation, cuda_code(e))
}
