//! Device memory: [`CudaBuffer`], one allocation freed in its own context when dropped, and
//! [`CudaAllocator`], the staging allocator over a device.

use std::sync::Arc;

use cudarc::driver::{DriverError, result, sys};
use staging_core::{
    AllocError, DeviceAllocator, DeviceBuffer, DeviceError, DeviceRegion, MemoryInfo,
};

use super::device::CudaDevice;
use super::{CudaMemory, device_error};
use crate::errors::cuda_code;

/// A device allocation. Dropping it frees it.
#[derive(Debug)]
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    device: Arc<CudaDevice>,
}

// SAFETY: the buffer exclusively owns its device allocation; device pointers are plain numbers
// valid in the device's context on any thread.
unsafe impl Send for CudaBuffer {}

impl CudaBuffer {
    /// The device pointer.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device the allocation lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Gives up the allocation without freeing it: `(pointer, length)`, now the caller's to free.
    pub(crate) fn release(mut self) -> (sys::CUdeviceptr, usize) {
        let taken = (self.ptr, self.len);
        self.ptr = 0;
        taken
    }
}

// SAFETY: the buffer owns its `cuMemAlloc` allocation of `len` bytes exclusively until dropped;
// `ptr` and `len` never change; `region` covers exactly it.
unsafe impl DeviceBuffer for CudaBuffer {
    type Space = CudaMemory;

    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> usize {
        self.ptr as usize
    }

    fn region(&mut self) -> DeviceRegion<'_, CudaMemory> {
        // SAFETY: the allocation is `len` bytes of device memory owned by this buffer, and the
        // region borrows the buffer mutably.
        unsafe { DeviceRegion::from_raw_parts(self.ptr as usize, self.len) }
    }
}

impl Drop for CudaBuffer {
    /// Frees the allocation in its own context. When that cannot be made current the allocation
    /// is left allocated and recorded in the device's faults: freeing it in whatever context is
    /// current would be wrong.
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let leaked = |why: String| {
            self.device.record(
                |f| {
                    f.leaked_buffers += 1;
                    f.leaked_bytes += self.len as u64;
                },
                format!(
                    "a device allocation of {} bytes at {:#x} on CUDA device {} was left \
                     allocated: {why}",
                    self.len, self.ptr, self.device.ordinal
                ),
            );
        };
        let _bound = match self.device.bind() {
            Ok(bound) => bound,
            Err(e) => {
                return leaked(format!(
                    "its context could not be made current ({})",
                    cuda_code(e)
                ));
            }
        };
        // SAFETY: `ptr` came from cuMemAlloc in this device's context, which is current; it is
        // freed once, here; nothing borrows it now.
        if let Err(e) = unsafe { result::free_sync(self.ptr) } {
            leaked(format!("cuMemFree: {}", cuda_code(e)));
        }
    }
}

/// Device memory of one CUDA device.
#[derive(Debug, Clone)]
pub struct CudaAllocator {
    device: Arc<CudaDevice>,
}

impl CudaAllocator {
    /// An allocator on `device`.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self { device }
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

impl DeviceAllocator for CudaAllocator {
    type Space = CudaMemory;
    type Buffer = CudaBuffer;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let _bound = self
            .device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        let (free, total) = result::mem_get_info().map_err(|e| device_error("cuMemGetInfo", e))?;
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn allocate(&self, len: usize) -> Result<CudaBuffer, AllocError> {
        let device = Arc::clone(&self.device);
        if len == 0 {
            return Ok(CudaBuffer {
                ptr: 0,
                len,
                device,
            });
        }
        let failed = |e: DriverError| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                AllocError::OutOfMemory {
                    requested: len,
                    detail: format!("cuMemAlloc: {}", cuda_code(e)),
                }
            } else {
                AllocError::Failed {
                    requested: len,
                    detail: format!("cuMemAlloc: {}", cuda_code(e)),
                }
            }
        };
        let _bound = self.device.bind().map_err(failed)?;
        // SAFETY: a plain allocation of `len` bytes in the bound context.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(failed)?;
        Ok(CudaBuffer { ptr, len, device })
    }

    fn copy_to_host(
        &self,
        src: &CudaBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        DeviceError::check_bounds("cuMemcpyDtoH", src.len, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _bound = self
            .device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        // SAFETY: the source range lies inside `src`'s allocation (checked above) and `dst` is a
        // valid host slice of the copied length; the copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(dst, src.ptr + offset as u64) }
            .map_err(|e| device_error("cuMemcpyDtoH", e))
    }
}
