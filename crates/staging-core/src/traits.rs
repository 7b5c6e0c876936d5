//! The three backend traits: [`Reader`], [`DeviceAllocator`] (with its [`DeviceBuffer`]) and
//! [`Destination`], and the errors they return.
//!
//! Backends implement `Reader` and `DeviceAllocator` for one [`MemorySpace`]; callers implement
//! `Destination` to receive tensors in memory they own. The contracts written on each method are
//! what the stager relies on; the conformance suite in `backend-mock` checks them.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::path::Path;

use crate::checkpoint::TensorMeta;
use crate::memory::{DeviceRegion, MemorySpace};

/// Free and total device memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes the device could allocate now.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// Why a device allocation failed. Only [`AllocError::OutOfMemory`] lets the stager fall back to
/// host assembly; any other failure aborts the load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The device has not enough free memory for this allocation (CUDA error 2, HIP error 2, a
    /// capped host device that is full). Free memory may have changed since it was queried.
    #[error("out of device memory allocating {requested} bytes: {detail}")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// What the backend said.
        detail: String,
    },
    /// Any other failure: a lost device, an invalid context, a driver error.
    #[error("device allocation of {requested} bytes failed: {detail}")]
    Failed {
        /// Bytes asked for.
        requested: usize,
        /// What the backend said, with its call and code.
        detail: String,
    },
}

/// A device operation other than allocation failed (a memory query, a copy).
#[derive(Debug, thiserror::Error)]
#[error("{operation} failed: {detail}")]
pub struct DeviceError {
    /// The operation, for example `cuMemcpyDtoH` or `copy_to_host`.
    pub operation: String,
    /// What the backend said, with its code where there is one.
    pub detail: String,
}

impl DeviceError {
    /// Checks that `len` bytes at `offset` lie inside a buffer of `buffer_len` bytes, the
    /// bounds check every [`DeviceAllocator::copy_to_host`] makes first.
    pub fn check_bounds(
        operation: &str,
        buffer_len: usize,
        offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        if offset.checked_add(len).is_some_and(|end| end <= buffer_len) {
            Ok(())
        } else {
            Err(DeviceError::new(
                operation,
                format!("{len} bytes at offset {offset} are outside a {buffer_len}-byte buffer"),
            ))
        }
    }

    /// A device error for `operation` with `detail`.
    pub fn new(operation: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            operation: operation.into(),
            detail: detail.into(),
        }
    }
}

/// Why a read (or opening a file for reading) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// An operating-system error (`errno`).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A native library call failed with its own code.
    #[error("{call} failed: {message} (code {code})")]
    Native {
        /// The library call, for example `cuFileRead`.
        call: &'static str,
        /// The library's code.
        code: i64,
        /// The code's name or description.
        message: String,
    },
    /// The reader reported more bytes than it was asked for: a broken backend.
    #[error("reader returned {returned} bytes for a request of {requested}")]
    Overrun {
        /// Bytes asked for.
        requested: usize,
        /// Bytes the reader claimed.
        returned: usize,
    },
}

/// What a [`Destination`] may fail with: the caller's own error.
pub type DestinationError = Box<dyn StdError + Send + Sync>;

/// Reads file bytes into memory of one space.
///
/// # Contract
///
/// - `read_at` is positional: it never moves a shared file cursor, and calls on the same file
///   from several threads at once are allowed.
/// - `read_at` returns how many bytes it wrote to the start of `dst`, between 1 and `dst.len()`
///   when `dst` is not empty. It may return fewer than asked (a short read); the caller continues
///   from there. `Ok(0)` means the file ended.
/// - On `Err` the contents of `dst` are unspecified; the caller discards them.
/// - A reader only ever writes inside `dst`.
pub trait Reader: Send + Sync {
    /// The memory space this reader writes into.
    type Space: MemorySpace;
    /// An open file, shareable between threads.
    type File: Send + Sync;

    /// The backend's name for reports ("host", "cufile").
    fn name(&self) -> &str;

    /// How this reader moves bytes ("posix", "gds", "compat"), for reports.
    fn mode(&self) -> &str;

    /// Opens a file for reading.
    fn open(&self, path: &Path) -> Result<Self::File, ReadError>;

    /// Reads up to `dst.len()` bytes at `offset` of `file` into `dst`.
    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        dst: DeviceRegion<'_, Self::Space>,
    ) -> Result<usize, ReadError>;
}

/// An owned allocation of device memory. Dropping it frees it.
pub trait DeviceBuffer: Send + fmt::Debug {
    /// The memory space the buffer lives in.
    type Space: MemorySpace;

    /// Length in bytes, exactly what was asked of [`DeviceAllocator::allocate`].
    fn len(&self) -> usize;

    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of the first byte in the buffer's memory space.
    fn addr(&self) -> usize;

    /// The whole buffer as a writable region.
    fn region(&mut self) -> DeviceRegion<'_, Self::Space>;
}

/// Allocates device memory and copies it back to the host.
///
/// # Contract
///
/// - `memory_info` reports what the device could allocate now; it is advice, and an allocation
///   after a positive answer may still fail with out-of-memory (another process, a race).
/// - `allocate(len)` returns a buffer of exactly `len` bytes (zero is allowed), or
///   [`AllocError::OutOfMemory`] when memory is short, or [`AllocError::Failed`] for anything
///   else. It never panics on exhaustion.
/// - `copy_to_host(src, offset, dst)` copies `dst.len()` bytes starting at `offset` in `src` and
///   returns only when the bytes are in `dst`. An out-of-bounds request is an error.
pub trait DeviceAllocator: Send + Sync {
    /// The memory space buffers live in.
    type Space: MemorySpace;
    /// The owned allocation type.
    type Buffer: DeviceBuffer<Space = Self::Space>;

    /// Free and total memory of the device.
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError>;

    /// Allocates `len` bytes of device memory.
    fn allocate(&self, len: usize) -> Result<Self::Buffer, AllocError>;

    /// Copies `dst.len()` bytes from `src` at `offset` to host memory.
    fn copy_to_host(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError>;

    /// Whether [`split`](Self::split) can cut buffers. When it can, the stager reads runs of
    /// neighbouring small tensors into one buffer with one request and hands each tensor out as
    /// a piece of it. The default is `false`.
    fn splits(&self) -> bool {
        false
    }

    /// Cuts `buffer` into buffers of its own, one per `(offset, len)` piece (in increasing
    /// offset order, not overlapping, inside the buffer). Each piece frees independently; the
    /// memory is returned when the last piece is dropped. Bytes outside every piece are
    /// unreachable afterwards. An allocator that cannot split, or pieces that break these rules,
    /// give the buffer back unchanged (the default always does).
    fn split(
        &self,
        buffer: Self::Buffer,
        pieces: &[(usize, usize)],
    ) -> Result<Vec<Self::Buffer>, Self::Buffer> {
        let _ = pieces;
        Err(buffer)
    }
}

/// A shared allocator allocates like the allocator it shares (so a caller can keep a handle for
/// copying tensors back while a stager owns another).
impl<A: DeviceAllocator + ?Sized> DeviceAllocator for std::sync::Arc<A> {
    type Space = A::Space;
    type Buffer = A::Buffer;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        (**self).memory_info()
    }

    fn allocate(&self, len: usize) -> Result<Self::Buffer, AllocError> {
        (**self).allocate(len)
    }

    fn copy_to_host(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        (**self).copy_to_host(src, offset, dst)
    }

    fn splits(&self) -> bool {
        (**self).splits()
    }

    fn split(
        &self,
        buffer: Self::Buffer,
        pieces: &[(usize, usize)],
    ) -> Result<Vec<Self::Buffer>, Self::Buffer> {
        (**self).split(buffer, pieces)
    }
}

/// Caller-owned memory that tensors are read into, preferred over any allocation.
///
/// # Contract
///
/// - `region` is asked once per tensor, in file order, before the stager allocates anything for
///   that tensor.
/// - `Ok(Some(region))` takes the tensor: its bytes are written to the start of `region`. A
///   region shorter than the tensor is an error (never a truncation); a longer one is allowed.
/// - `Ok(None)` declines: the tensor takes the library's own paths.
/// - `Err` aborts the load with the error, naming the tensor.
pub trait Destination<S: MemorySpace> {
    /// Where `tensor`'s bytes should go, if the caller wants them.
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError>;
}

/// The destination that declines every tensor.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDestination;

impl<S: MemorySpace> Destination<S> for NoDestination {
    fn region(
        &mut self,
        _tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        Ok(None)
    }
}

impl<S: MemorySpace, D: Destination<S> + ?Sized> Destination<S> for &mut D {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        (**self).region(tensor)
    }
}
