//! Handing device memory between this backend and code built on `cudarc`: a loaded tensor's
//! allocation becomes a `CudaSlice<u8>` the caller owns, and a caller's `CudaSlice<u8>` or
//! `CudaViewMut<u8>` becomes a destination region, both without `unsafe` in the caller.
//!
//! What is checked: the caller's stream belongs to the same (primary) context as the
//! allocation, so the slice is freed in the context it was allocated in; a region is only made
//! after the caller's stream has finished all work queued on it, since the backend writes the
//! memory from outside any stream.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use staging_core::{DeviceBuffer, DeviceError, DeviceRegion};

use crate::cuda::{CallerContext, CudaBuffer, CudaMemory};
use crate::errors::cuda_code;

/// Why a buffer could not become a `CudaSlice`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoverError {
    /// The stream belongs to another context than the one the buffer was allocated in.
    #[error(
        "the stream belongs to another CUDA context than the buffer (allocated in a context of device {buffer_device})"
    )]
    OtherContext {
        /// The buffer's device ordinal.
        buffer_device: usize,
    },
    /// An empty buffer has no allocation to hand over.
    #[error("an empty buffer has no allocation to hand over")]
    Empty,
    /// The buffer is a piece of an allocation shared with other tensors (small tensors are
    /// carved from shared blocks, and neighbours read together), which `cudarc` cannot own.
    #[error(
        "the tensor is a piece of an allocation shared with other tensors; keep the owned handle, or load without sub-allocation and coalescing"
    )]
    Shared,
    /// A CUDA call needed for the hand-over failed.
    #[error("{call} failed: {code}")]
    Cuda {
        /// The call.
        call: &'static str,
        /// The CUresult, by name and number.
        code: String,
    },
}

impl CudaBuffer {
    /// The allocation as a `CudaSlice<u8>` on `stream`, owned by the caller from now on (freed by
    /// `cudarc` when dropped, stream-ordered on `stream`). The stream must belong to the
    /// context the buffer was allocated in (the device's primary context, which
    /// `CudaContext::new(ordinal)` gives, or the caller's own the backend was opened with). On failure the
    /// buffer comes back untouched.
    pub fn into_cuda_slice(
        self,
        stream: &Arc<CudaStream>,
    ) -> Result<CudaSlice<u8>, (Self, HandoverError)> {
        let _caller = CallerContext::save();
        if let Err(e) = self.check_handover(stream) {
            return Err((self, e));
        }
        let (ptr, len) = self.release();
        // SAFETY: `ptr` is a live `cuMemAlloc` allocation of `len` bytes in `stream`'s context
        // (checked above), released by this buffer so that only the slice frees it; every read
        // into it finished before the tensor was handed out (reads are synchronous, and the
        // POSIX path's copies are waited for).
        Ok(unsafe { stream.upgrade_device_ptr::<u8>(ptr, len) })
    }
}

impl CudaBuffer {
    /// Whether [`into_cuda_slice`](Self::into_cuda_slice) would succeed on `stream`: a
    /// non-empty buffer, a stream of the same context, and (with `cudarc`'s event tracking on)
    /// events that can be created.
    pub fn check_handover(&self, stream: &Arc<CudaStream>) -> Result<(), HandoverError> {
        if self.len() == 0 {
            return Err(HandoverError::Empty);
        }
        let context = stream.context();
        if context.cu_ctx() != self.device().context() {
            return Err(HandoverError::OtherContext {
                buffer_device: self.device().ordinal(),
            });
        }
        if context.is_event_tracking() {
            // cudarc binds its context with cuCtxSetCurrent; the caller's comes back after.
            let _caller = CallerContext::save();
            // `upgrade_device_ptr` creates two events and panics if it cannot; make sure it can,
            // so that a failure is an error here rather than a panic there.
            for _ in 0..2 {
                context.new_event(None).map_err(|e| HandoverError::Cuda {
                    call: "cuEventCreate",
                    code: cuda_code(e),
                })?;
            }
        }
        Ok(())
    }
}

/// A destination region over a caller's device memory (`CudaSlice<u8>` or `CudaViewMut<u8>`),
/// borrowed mutably for as long as the region lives. Waits for the work queued on `stream` to
/// finish first, since the backend writes the memory from outside any stream.
pub fn cuda_region<'a, M>(
    memory: &'a mut M,
    stream: &CudaStream,
) -> Result<DeviceRegion<'a, CudaMemory>, DeviceError>
where
    M: DevicePtrMut<u8>,
{
    // cudarc binds the stream's context with cuCtxSetCurrent; the caller's comes back after.
    let _caller = CallerContext::save();
    let len = memory.len();
    let ptr = {
        // The guard records a write on `stream` when dropped; the synchronize below then covers
        // everything queued on it, including what the caller's other streams made it wait for.
        let (ptr, _record) = memory.device_ptr_mut(stream);
        ptr
    };
    stream
        .synchronize()
        .map_err(|e| DeviceError::new("cuStreamSynchronize", cuda_code(e)))?;
    if len == 0 {
        return Ok(DeviceRegion::empty());
    }
    // SAFETY: `[ptr, ptr + len)` is the device memory of `memory`, a live allocation of `len`
    // bytes; it is borrowed mutably for `'a`, so nothing else can use it through `cudarc` while
    // the region exists, and no work queued before is still running (synchronized above).
    Ok(unsafe { DeviceRegion::from_raw_parts(ptr as usize, len) })
}
