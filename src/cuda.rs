//! CUDA tensors handed to code built on `cudarc` (candle, mistral.rs, a hand-written engine).
//!
//! - [`Tensor::into_cuda`] takes a tensor loaded by the cuFile backend as a
//!   [`CudaTensorMemory`]: owned by the caller, freed when dropped (its own allocation, or its
//!   piece of a block shared with other small tensors), and counted as used against the load's
//!   memory budget until then.
//! - [`CudaTensorMemory::into_cuda_slice`] turns a tensor with an allocation of its own into a
//!   `cudarc` `CudaSlice<u8>`.
//! - [`cufile::cuda_region`](crate::cufile::cuda_region) makes a destination region from a
//!   caller's `CudaSlice<u8>` or `CudaViewMut<u8>`, so a `Destination<CudaMemory>` needs no
//!   `unsafe`.
//!
//! `cudarc` itself is [`cufile::cudarc`](crate::cufile::cudarc).

use std::fmt;
use std::sync::Arc;

use backend_cufile::cudarc::driver::{CudaSlice, CudaStream};
use backend_cufile::{CudaAllocator, CudaBuffer};
use staging_core::{
    DeviceAllocator, DeviceBuffer, DeviceError, SubAllocator, SubBuffer, TakenBuffer, TensorMeta,
};

use backend_cufile::HandoverError;

use crate::tensor::{Data, Tensor};

/// The allocator of cuFile loads: CUDA memory, small tensors carved from shared blocks.
pub(crate) type CudaAlloc = SubAllocator<CudaAllocator>;

/// A CUDA tensor a caller took from a load ([`Tensor::into_cuda`]).
pub struct CudaTensorMemory {
    buffer: TakenBuffer<SubBuffer<CudaBuffer>>,
    allocator: Arc<CudaAlloc>,
}

impl fmt::Debug for CudaTensorMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaTensorMemory")
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("len", &self.len())
            .field("shared", &self.is_shared())
            .finish()
    }
}

impl CudaTensorMemory {
    /// The device pointer of its first byte.
    pub fn device_ptr(&self) -> u64 {
        self.buffer.buffer().addr() as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.buffer.buffer().len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it is a piece of an allocation shared with other tensors (it then frees only its
    /// part, the allocation going with the last piece, and cannot become a `CudaSlice`).
    pub fn is_shared(&self) -> bool {
        self.buffer.buffer().is_carved()
    }

    /// Copies `dst.len()` bytes from `offset` to host memory.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.allocator
            .copy_to_host(self.buffer.buffer(), offset, dst)
    }

    /// The memory as a `cudarc` `CudaSlice<u8>` on `stream`, which frees it when dropped. Only
    /// a tensor with an allocation of its own can be one (`HandoverError::Shared` otherwise),
    /// and `stream` must belong to the device's primary context (`CudaContext::new(ordinal)`).
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
    /// caller owns; any other tensor (host path, a destination, another backend) comes back.
    /// From now on its bytes are the caller's: the report counts them in `taken_device_bytes`,
    /// and the load's memory budget counts them as used until the memory is dropped.
    pub fn into_cuda(self) -> Result<(TensorMeta, CudaTensorMemory), Tensor> {
        match self.data {
            Data::Cuda(held) => {
                let held = *held;
                Ok((
                    *self.meta,
                    CudaTensorMemory {
                        buffer: held.tensor.take(),
                        allocator: held.allocator,
                    },
                ))
            }
            data => Err(Tensor { data, ..self }),
        }
    }
}
