//! HIP tensors handed to the caller: [`Tensor::into_hip`] takes a tensor the hipFile backend
//! loaded onto the device as a [`HipTensorMemory`](crate::hip::HipTensorMemory) (the device pointer, the device, and
//! ownership that frees through the backend), the same hand-over cuFile's
//! [`Tensor::into_cuda`](crate::Tensor) gives.

use backend_hipfile::HipAllocator;
use staging_core::TensorMeta;

use crate::tensor::{BackendMemory, Tensor};

/// A HIP tensor a caller took from a load ([`Tensor::into_hip`]).
pub type HipTensorMemory = BackendMemory<HipAllocator>;

impl BackendMemory<HipAllocator> {
    /// The HIP device's ordinal.
    pub fn device_ordinal(&self) -> usize {
        self.allocator.inner().device().ordinal()
    }
}

impl Tensor {
    /// Takes a tensor the hipFile backend loaded onto the device (device path) as HIP memory
    /// the caller owns ([`Tensor::take_backend`] for hipFile); any other tensor comes back.
    /// From now on its bytes are the caller's: the report counts them in
    /// `taken_device_bytes`, and the load's memory budget counts them as used until the memory
    /// is dropped.
    pub fn into_hip(self) -> Result<(TensorMeta, HipTensorMemory), Tensor> {
        self.take_backend::<HipAllocator>()
    }
}
