//! CUDA tensors handed to code built on `cudarc` (candle, mistral.rs, a hand-written engine).
//!
//! - [`Tensor::into_cuda`] takes a tensor loaded by the cuFile backend as a
//!   [`CudaTensorMemory`](crate::cuda::CudaTensorMemory): owned by the caller, freed when dropped (its own allocation, or its
//!   piece of a block shared with other small tensors), and counted as used against the load's
//!   memory budget until then.
//! - [`CudaTensorMemory::into_cuda_slice`](crate::tensor::BackendMemory::into_cuda_slice) turns a tensor with an allocation of its own into a
//!   `cudarc` `CudaSlice<u8>`.
//! - [`cufile::cuda_region`](crate::cufile::cuda_region) makes a destination region from a
//!   caller's `CudaSlice<u8>` or `CudaViewMut<u8>`, so a `Destination<CudaMemory>` needs no
//!   `unsafe`.
//!
//! `cudarc` itself is [`cufile::cudarc`](crate::cufile::cudarc).

use std::sync::Arc;

use backend_cufile::CudaAllocator;
use backend_cufile::HandoverError;
use backend_cufile::cudarc::driver::{CudaSlice, CudaStream};
use staging_core::{SubBuffer, TensorMeta};

use crate::tensor::{BackendMemory, Tensor};

/// A CUDA tensor a caller took from a load ([`Tensor::into_cuda`]).
pub type CudaTensorMemory = BackendMemory<CudaAllocator>;

impl BackendMemory<CudaAllocator> {
    /// The CUDA device's ordinal.
    pub fn device_ordinal(&self) -> usize {
        self.allocator.inner().device().ordinal()
    }

    /// The memory as a `cudarc` `CudaSlice<u8>` on `stream`, which frees it when dropped. Only
    /// a tensor with an allocation of its own can be one (`HandoverError::Shared` otherwise),
    /// and `stream` must belong to the context the load allocated in: the device's primary context
    /// (`CudaContext::new(ordinal)`), or the caller's own given to the loader.
    /// Since `cudarc` frees it unseen, the load's memory budget counts its bytes as used for
    /// the rest of the load. On failure the memory comes back untouched.
    pub fn into_cuda_slice(
        self,
        stream: &Arc<CudaStream>,
    ) -> Result<CudaSlice<u8>, (Self, HandoverError)> {
        let Self { buffer, allocator } = self;
        buffer
            .try_into_inner(|sub| match sub.into_whole() {
                Ok(cuda) => cuda
                    .into_cuda_slice(stream)
                    .map_err(|(cuda, e)| (SubBuffer::from_whole(cuda), e)),
                Err(sub) => Err((sub, HandoverError::Shared)),
            })
            .map_err(|(buffer, e)| (Self { buffer, allocator }, e))
    }
}

impl Tensor {
    /// Takes a tensor the cuFile backend loaded onto the device (device path) as CUDA memory the
    /// caller owns ([`Tensor::take_backend`] for cuFile); any other tensor (host path, a
    /// destination, another backend) comes back. From now on its bytes are the caller's: the
    /// report counts them in `taken_device_bytes`, and the load's memory budget counts them as
    /// used until the memory is dropped.
    pub fn into_cuda(self) -> Result<(TensorMeta, CudaTensorMemory), Tensor> {
        self.take_backend::<CudaAllocator>()
    }
}
