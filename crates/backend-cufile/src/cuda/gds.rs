//! What `backend-gds`'s POSIX path asks of a GPU ([`backend_gds::Gpu`], [`backend_gds::Pinned`]),
//! answered by the device, its guard and its pinned buffers.

use std::sync::Arc;

use staging_core::{DeviceError, DeviceRegion};

use super::device::{BoundContext, CudaDevice};
use super::pinned::PinnedBuffer;
use super::{CudaMemory, device_error};

impl backend_gds::Pinned for PinnedBuffer {
    fn wait(&mut self) -> Result<(), DeviceError> {
        PinnedBuffer::wait(self)
    }

    fn bytes_mut(&mut self) -> Result<&mut [u8], DeviceError> {
        PinnedBuffer::bytes_mut(self)
    }
}

impl backend_gds::Gpu for CudaDevice {
    type Space = CudaMemory;
    type Pinned = PinnedBuffer;
    type Bound<'a> = BoundContext<'a>;

    fn bind(&self) -> Result<BoundContext<'_>, DeviceError> {
        CudaDevice::bind(self).map_err(|e| device_error("cuCtxPushCurrent", e))
    }

    fn pinned(gpu: &Arc<Self>, len: usize) -> Result<PinnedBuffer, DeviceError> {
        PinnedBuffer::new(gpu, len)
    }

    unsafe fn copy_to_device(
        &self,
        src: &mut PinnedBuffer,
        dst: DeviceRegion<'_, CudaMemory>,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded caller contract (the same as `copy_to_device_async`'s).
        unsafe { src.copy_to_device_async(dst) }
    }
}
