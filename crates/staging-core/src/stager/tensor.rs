//! What a load hands out: [`StagedTensor`]s, whose bytes are in a device buffer of their own
//! ([`DeviceTensor`]), in host memory ([`HostTensor`]) or in the caller's destination, each
//! counted against the load's accounting while the library owns it.
//!
//! A caller who takes a device buffer ([`DeviceTensor::take`]) owns it from then on: the load's
//! report stops counting it as the library's, and a memory budget keeps counting it as used
//! until the caller drops it.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::checkpoint::TensorMeta;
use crate::memory::HostBytes;
use crate::policy::{FallbackCause, StagingPath};
use crate::report::{Accounting, MemoryKind};
use crate::traits::DeviceBuffer;

/// Bytes counted against the load's accounting until dropped.
pub(super) struct Held {
    accounting: Arc<Accounting>,
    kind: MemoryKind,
    bytes: u64,
}

impl Held {
    pub(super) fn new(accounting: &Arc<Accounting>, kind: MemoryKind, bytes: u64) -> Self {
        accounting.acquire(kind, bytes);
        Self {
            accounting: Arc::clone(accounting),
            kind,
            bytes,
        }
    }

    /// The same bytes, now counted as `kind`.
    fn move_to(mut self, kind: MemoryKind) -> Self {
        let moved = Self::new(&self.accounting, kind, self.bytes);
        self.accounting.release(self.kind, self.bytes);
        self.bytes = 0;
        moved
    }

    /// Stops tracking the bytes without releasing them: they stay counted for the rest of the
    /// load (for memory the library can no longer see freed).
    fn keep_counted(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.accounting.release(self.kind, self.bytes);
    }
}

/// A tensor in a device buffer of its own. Dropping it frees the buffer.
pub struct DeviceTensor<B> {
    pub(super) buffer: B,
    pub(super) held: Held,
}

impl<B: DeviceBuffer> DeviceTensor<B> {
    /// The device buffer.
    pub fn buffer(&self) -> &B {
        &self.buffer
    }

    /// Takes ownership of the buffer. From now on its bytes are the caller's: the report's
    /// `peak_device_bytes` no longer counts them, `taken_device_bytes` does, and a memory budget
    /// counts them as used until the returned handle is dropped.
    pub fn take(self) -> TakenBuffer<B> {
        TakenBuffer {
            buffer: self.buffer,
            held: self.held.move_to(MemoryKind::Caller),
        }
    }

    /// The buffer itself, taken as with [`take`](Self::take); since the library cannot see when
    /// the caller frees it, a memory budget counts its bytes as used for the rest of the load.
    pub fn into_buffer(self) -> B {
        self.take().into_inner()
    }
}

impl<B: fmt::Debug> fmt::Debug for DeviceTensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DeviceTensor").field(&self.buffer).finish()
    }
}

/// A device buffer a caller took from a load ([`DeviceTensor::take`]). Its bytes count as the
/// caller's against the load's memory budget until it is dropped.
pub struct TakenBuffer<B> {
    buffer: B,
    held: Held,
}

impl<B: DeviceBuffer> TakenBuffer<B> {
    /// The device buffer.
    pub fn buffer(&self) -> &B {
        &self.buffer
    }

    /// The buffer itself; its bytes stay counted against the load's budget for the rest of the
    /// load, since the library cannot see when the caller frees it.
    pub fn into_inner(self) -> B {
        self.held.keep_counted();
        self.buffer
    }

    /// Turns the buffer into something else the caller owns (a `cudarc` slice, say), counted as
    /// [`into_inner`](Self::into_inner) is; when `convert` gives the buffer back with an error,
    /// so does this, with the accounting as it was.
    pub fn try_into_inner<T, E>(
        self,
        convert: impl FnOnce(B) -> Result<T, (B, E)>,
    ) -> Result<T, (Self, E)> {
        let Self { buffer, held } = self;
        match convert(buffer) {
            Ok(converted) => {
                held.keep_counted();
                Ok(converted)
            }
            Err((buffer, error)) => Err((Self { buffer, held }, error)),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for TakenBuffer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TakenBuffer").field(&self.buffer).finish()
    }
}

/// A tensor assembled in host memory.
pub struct HostTensor {
    pub(super) bytes: HostBytes,
    pub(super) held: Held,
}

impl HostTensor {
    /// Host bytes no load counts: a tensor assembled outside a stager (columns copied out of a
    /// mapping of their file), owned by whoever holds it.
    pub fn uncounted(bytes: HostBytes) -> Self {
        let held = Held::new(&Arc::new(Accounting::default()), MemoryKind::Host, 0);
        Self { bytes, held }
    }

    /// Takes the bytes; the load's accounting stops counting them (host memory is not under the
    /// device budget).
    pub fn into_bytes(self) -> HostBytes {
        drop(self.held);
        self.bytes
    }

    /// A pointer to the first byte that may be written through (it carries the allocation's
    /// write permission), for callers outside Rust; dangling when the tensor is empty. Writing
    /// through it while a reference to the bytes (from `Deref`) is alive is undefined behaviour.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
}

impl Deref for HostTensor {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostTensor")
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// Where a staged tensor's bytes are.
#[derive(Debug)]
pub enum TensorData<B> {
    /// In the caller's destination region.
    Destination {
        /// The region's address in the device's memory space.
        addr: usize,
        /// The region's length (at least the tensor's).
        capacity: usize,
    },
    /// In a device buffer owned by the tensor.
    Device(DeviceTensor<B>),
    /// In host memory owned by the tensor.
    Host(HostTensor),
}

/// One tensor, whole, with where it landed.
#[derive(Debug)]
pub struct StagedTensor<B> {
    pub(super) meta: TensorMeta,
    pub(super) data: TensorData<B>,
    pub(super) fallback: Option<FallbackCause>,
}

impl<B> StagedTensor<B> {
    /// The tensor's metadata (for a row range, the narrowed shape and bytes).
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// The path it took.
    pub fn path(&self) -> StagingPath {
        match self.data {
            TensorData::Destination { .. } => StagingPath::Destination,
            TensorData::Device(_) => StagingPath::Device,
            TensorData::Host(_) => StagingPath::Host,
        }
    }

    /// Why it took the host path, when it did.
    pub fn fallback(&self) -> Option<FallbackCause> {
        self.fallback
    }

    /// Where its bytes are.
    pub fn data(&self) -> &TensorData<B> {
        &self.data
    }

    /// Splits it into metadata and bytes.
    pub fn into_parts(self) -> (TensorMeta, TensorData<B>) {
        (self.meta, self.data)
    }
}
