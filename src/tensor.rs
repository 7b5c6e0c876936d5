//! [`Tensor`]: one loaded tensor, whatever backend loaded it, with its bytes where the policy put
//! them; and [`DeviceMemory`], device memory a caller took from a load.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use staging_core::{
    DeviceAllocator, DeviceBuffer, DeviceError, DeviceTensor, FallbackCause, HostBytes, HostTensor,
    StagedTensor, StagingPath, SubAllocator, SubBuffer, TakenBuffer, TensorData, TensorMeta,
};

use crate::error::{Error, Result};
use crate::mapping::MappedBytes;
use crate::space::KnownSpace;
use crate::space::sealed::Sealed;

/// A device buffer of some backend, with the allocator that copies it back.
pub(crate) struct Held<A: DeviceAllocator> {
    pub(crate) tensor: DeviceTensor<A::Buffer>,
    pub(crate) allocator: Arc<A>,
}

/// A device buffer a caller took, with the allocator that copies it back.
pub(crate) struct Taken<A: DeviceAllocator> {
    pub(crate) buffer: TakenBuffer<A::Buffer>,
    pub(crate) allocator: Arc<A>,
}

/// Device memory of any backend: what [`Tensor`] and [`DeviceMemory`] need of it.
pub(crate) trait ErasedDevice: Send {
    fn addr(&self) -> usize;
    fn len(&self) -> usize;
    fn space(&self) -> &'static str;
    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> std::result::Result<(), DeviceError>;
    fn host_bytes(&self) -> Option<&[u8]>;
    /// Moves the bytes to the caller's account ([`DeviceTensor::take`]); memory already taken
    /// stays as it is.
    fn take(self: Box<Self>) -> Box<dyn ErasedDevice>;
    /// The concrete value, for a typed hand-over ([`Tensor::take_backend`]).
    fn as_any(&self) -> &dyn Any;
    /// The concrete value, boxed, for a typed hand-over.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

macro_rules! erased_device {
    ($ty:ident, $buffer:ident, $take:expr) => {
        impl<A> ErasedDevice for $ty<A>
        where
            A: DeviceAllocator + 'static,
            A::Space: KnownSpace,
            A::Buffer: 'static,
        {
            fn addr(&self) -> usize {
                staging_core::DeviceBuffer::addr(self.$buffer.buffer())
            }
            fn len(&self) -> usize {
                staging_core::DeviceBuffer::len(self.$buffer.buffer())
            }
            fn space(&self) -> &'static str {
                <A::Space as staging_core::MemorySpace>::NAME
            }
            fn copy_to_host(
                &self,
                offset: usize,
                dst: &mut [u8],
            ) -> std::result::Result<(), DeviceError> {
                self.allocator
                    .copy_to_host(self.$buffer.buffer(), offset, dst)
            }
            fn host_bytes(&self) -> Option<&[u8]> {
                <A::Space as Sealed>::host_view(self.$buffer.buffer())
            }
            fn take(self: Box<Self>) -> Box<dyn ErasedDevice> {
                #[allow(clippy::redundant_closure_call)]
                ($take)(self)
            }
            fn as_any(&self) -> &dyn Any {
                self
            }
            fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
                self
            }
        }
    };
}

erased_device!(
    Held,
    tensor,
    |held: Box<Held<A>>| -> Box<dyn ErasedDevice> {
        let Held { tensor, allocator } = *held;
        Box::new(Taken {
            buffer: tensor.take(),
            allocator,
        })
    }
);
erased_device!(
    Taken,
    buffer,
    |taken: Box<Taken<A>>| -> Box<dyn ErasedDevice> { taken }
);

/// Where a [`Tensor`]'s bytes are.
pub(crate) enum Data {
    /// In the caller's destination.
    Destination { addr: usize, space: &'static str },
    /// In a device buffer of its own, of whichever backend (typed again by
    /// [`Tensor::take_backend`]).
    Device(Box<dyn ErasedDevice>),
    /// In host memory.
    Host(HostTensor),
    /// In a private mapping of its file.
    Mapped(MappedBytes),
}

/// One loaded tensor, whole (or the rows of it that were asked for), with where it landed.
///
/// Its bytes are counted as the load's (`peak_device_bytes`, `peak_host_bytes`) until it is
/// dropped, or until the caller takes its device memory ([`take_device`](Self::take_device), or
/// `into_cuda` for cuFile loads), from which point they are the caller's.
pub struct Tensor {
    pub(crate) meta: Box<TensorMeta>,
    pub(crate) data: Data,
    pub(crate) fallback: Option<FallbackCause>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.meta.name)
            .field("dtype", &self.meta.dtype)
            .field("shape", &self.meta.shape)
            .field("path", &self.path())
            .field("space", &self.space())
            .finish()
    }
}

impl Tensor {
    /// A staged tensor of a load whose allocator is `allocator`.
    pub(crate) fn new<A>(staged: StagedTensor<A::Buffer>, allocator: &Arc<A>) -> Self
    where
        A: DeviceAllocator + 'static,
        A::Space: KnownSpace,
        A::Buffer: 'static,
    {
        let fallback = staged.fallback();
        let (meta, data) = staged.into_parts();
        let meta = Box::new(meta);
        let data = match data {
            TensorData::Destination { addr, .. } => Data::Destination {
                addr,
                space: <A::Space as staging_core::MemorySpace>::NAME,
            },
            TensorData::Device(tensor) => Data::Device(Box::new(Held {
                tensor,
                allocator: Arc::clone(allocator),
            })),
            TensorData::Host(host) => Data::Host(host),
        };
        Self {
            meta,
            data,
            fallback,
        }
    }

    /// The device buffer, whichever way it is kept.
    fn device(&self) -> Option<&dyn ErasedDevice> {
        match &self.data {
            Data::Device(device) => Some(device.as_ref()),
            Data::Destination { .. } | Data::Host(_) | Data::Mapped(_) => None,
        }
    }

    /// Its metadata: name, dtype, shape (narrowed for a row range), file, offset and length.
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.meta.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.meta.len == 0
    }

    /// The path it took.
    pub fn path(&self) -> StagingPath {
        match (&self.data, self.device()) {
            (Data::Destination { .. }, _) => StagingPath::Destination,
            (Data::Host(_), _) => StagingPath::Host,
            (Data::Mapped(_), _) => StagingPath::Mapped,
            (_, _) => StagingPath::Device,
        }
    }

    /// Why it took the host path, when it did.
    pub fn fallback(&self) -> Option<FallbackCause> {
        self.fallback
    }

    /// The memory space its bytes are in: `"host"` (host path, or the host backend's device),
    /// `"cuda"`, `"hip"`.
    pub fn space(&self) -> &'static str {
        match (&self.data, self.device()) {
            (Data::Destination { space, .. }, _) => space,
            (_, Some(device)) => device.space(),
            (_, None) => <staging_core::HostMemory as staging_core::MemorySpace>::NAME,
        }
    }

    /// The address of its first byte in its memory space (a device pointer on a GPU), on the
    /// device and destination paths; `None` on the host path (see [`host_bytes`](Self::host_bytes)).
    pub fn device_ptr(&self) -> Option<usize> {
        match (&self.data, self.device()) {
            (Data::Destination { addr, .. }, _) => Some(*addr),
            (_, device) => device.map(|d| d.addr()),
        }
    }

    /// Its bytes, when the CPU can address them where they are: the host path, or the device
    /// path of the host backend. `None` on a GPU, and for a caller's destination (whose bytes
    /// are the caller's).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match (&self.data, self.device()) {
            (Data::Host(host), _) => Some(host),
            (Data::Mapped(mapped), _) => Some(mapped),
            (_, device) => device.and_then(|d| d.host_bytes()),
        }
    }

    /// Copies its bytes into `dst` (exactly its length), from the device when they are there.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.meta.len {
            return Err(Error::about_tensor(
                &self.meta.name,
                format!(
                    "{} bytes asked for, the tensor has {}",
                    dst.len(),
                    self.meta.len
                ),
            ));
        }
        self.copy_to_host_at(0, dst)
    }

    /// Copies `dst.len()` of its bytes, from `offset`, into `dst` (for reading a large device
    /// tensor back in pieces).
    pub fn copy_to_host_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let range = offset
            .checked_add(dst.len())
            .filter(|&end| end <= self.meta.len)
            .map(|end| offset..end)
            .ok_or_else(|| {
                Error::about_tensor(
                    &self.meta.name,
                    format!(
                        "{} bytes at {offset} are outside its {} bytes",
                        dst.len(),
                        self.meta.len
                    ),
                )
            })?;
        match (&self.data, self.device()) {
            (Data::Host(host), _) => {
                dst.copy_from_slice(&host[range]);
                Ok(())
            }
            (Data::Mapped(mapped), _) => {
                dst.copy_from_slice(&mapped[range]);
                Ok(())
            }
            (_, Some(device)) => device
                .copy_to_host(offset, dst)
                .map_err(|e| Error::DeviceCopy {
                    tensor: self.meta.name.clone(),
                    reason: e.to_string(),
                }),
            (_, None) => Err(Error::about_tensor(
                &self.meta.name,
                "its bytes are in the caller's destination",
            )),
        }
    }

    /// Its bytes in a new vector (copied from the device when they are there).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        if let Some(bytes) = self.host_bytes() {
            return Ok(bytes.to_vec());
        }
        let mut out = vec![0u8; self.meta.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Takes its device memory (device path): the caller's from now on, counted against the
    /// load's memory budget until the [`DeviceMemory`] is dropped. Any other tensor comes back.
    pub fn take_device(self) -> std::result::Result<(TensorMeta, DeviceMemory), Self> {
        let device: Box<dyn ErasedDevice> = match self.data {
            Data::Device(device) => device,
            data => return Err(Self { data, ..self }),
        };
        Ok((
            *self.meta,
            DeviceMemory {
                inner: device.take(),
            },
        ))
    }

    /// Takes its device memory (device path) typed as backend `X`'s ([`BackendMemory`]), the
    /// one hand-over every backend shares: `into_cuda` and `into_hip` are this for cuFile and
    /// hipFile. A tensor of another backend, or not on the device path, comes back.
    pub fn take_backend<X>(self) -> std::result::Result<(TensorMeta, BackendMemory<X>), Self>
    where
        X: DeviceAllocator + 'static,
        X::Space: KnownSpace,
        X::Buffer: Sync + 'static,
    {
        let is_x = |device: &dyn ErasedDevice| device.as_any().is::<Held<SubAllocator<X>>>();
        let device = match self.data {
            Data::Device(device) if is_x(device.as_ref()) => device,
            data => return Err(Self { data, ..self }),
        };
        match device.into_any().downcast::<Held<SubAllocator<X>>>() {
            Ok(held) => {
                let Held { tensor, allocator } = *held;
                Ok((
                    *self.meta,
                    BackendMemory {
                        buffer: tensor.take(),
                        allocator,
                    },
                ))
            }
            // `is_x` checked the type just above.
            Err(_) => unreachable!("a device buffer changed type"),
        }
    }

    /// Takes its host bytes (host path); any other tensor comes back.
    pub fn into_host_bytes(self) -> std::result::Result<(TensorMeta, HostBytes), Self> {
        match self.data {
            Data::Host(host) => Ok((*self.meta, host.into_bytes())),
            data => Err(Self { data, ..self }),
        }
    }

    /// Takes its mapping (mapped path: a private, copy-on-write mapping of its file, kept
    /// alive by the [`MappedBytes`]); any other tensor comes back.
    pub fn into_mapped(self) -> std::result::Result<(TensorMeta, MappedBytes), Self> {
        match self.data {
            Data::Mapped(mapped) => Ok((*self.meta, mapped)),
            data => Err(Self { data, ..self }),
        }
    }

    /// A host pointer with write permission, for callers outside Rust (host and mapped paths;
    /// writes to a mapped tensor stay in this process: the mapping is copy-on-write).
    pub fn host_mut_ptr(&self) -> Option<*mut u8> {
        match &self.data {
            Data::Host(host) => Some(host.as_mut_ptr()),
            Data::Mapped(mapped) => Some(mapped.as_mut_ptr()),
            _ => None,
        }
    }
}

/// Device memory a caller took from a load ([`Tensor::take_device`]). Dropping it frees it; until
/// then the load's memory budget counts it as used.
pub struct DeviceMemory {
    inner: Box<dyn ErasedDevice>,
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("space", &self.inner.space())
            .field("addr", &format_args!("{:#x}", self.inner.addr()))
            .field("len", &self.inner.len())
            .finish()
    }
}

impl DeviceMemory {
    /// The address of the first byte in its memory space (a device pointer on a GPU).
    pub fn addr(&self) -> usize {
        self.inner.addr()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// Its memory space (`"host"`, `"cuda"`, `"hip"`).
    pub fn space(&self) -> &'static str {
        self.inner.space()
    }

    /// Its bytes, when they are host memory.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        self.inner.host_bytes()
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    pub fn copy_to_host(
        &self,
        offset: usize,
        dst: &mut [u8],
    ) -> std::result::Result<(), DeviceError> {
        self.inner.copy_to_host(offset, dst)
    }
}

/// Device memory of backend `X` a caller took from a load ([`Tensor::take_backend`]; for cuFile
/// `CudaTensorMemory`, for hipFile `HipTensorMemory`): the device pointer, and ownership that
/// frees through the backend when dropped (its own allocation, or its piece of a block shared
/// with other small tensors). Counted as used against the load's memory budget until then.
pub struct BackendMemory<X: DeviceAllocator>
where
    X::Buffer: Sync,
{
    pub(crate) buffer: TakenBuffer<SubBuffer<X::Buffer>>,
    pub(crate) allocator: Arc<SubAllocator<X>>,
}

impl<X: DeviceAllocator> fmt::Debug for BackendMemory<X>
where
    X::Buffer: Sync,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendMemory")
            .field("space", &<X::Space as staging_core::MemorySpace>::NAME)
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("len", &self.len())
            .field("shared", &self.is_shared())
            .finish()
    }
}

impl<X: DeviceAllocator> BackendMemory<X>
where
    X::Buffer: Sync,
{
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
    /// part, the allocation going with the last piece).
    pub fn is_shared(&self) -> bool {
        self.buffer.buffer().is_carved()
    }

    /// Copies `dst.len()` bytes from `offset` to host memory.
    pub fn copy_to_host(
        &self,
        offset: usize,
        dst: &mut [u8],
    ) -> std::result::Result<(), DeviceError> {
        self.allocator
            .copy_to_host(self.buffer.buffer(), offset, dst)
    }
}
