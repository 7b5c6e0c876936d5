//! The memory spaces a load can put tensors in, and a destination of whichever space the
//! caller's memory is, checked against the backend once it is chosen.

use staging_core::{
    Destination, DeviceBuffer, HostMemory, MemorySpace, NoDestination, RawDestination, RawRegions,
};

use crate::error::{Error, Result};

/// A destination of space `S`, boxed.
// `pub` (in a private module) because the sealed trait's signatures name it.
#[allow(unreachable_pub)]
pub type Boxed<'d, S> = Box<dyn Destination<S> + Send + 'd>;

/// A caller's destination, of the space its memory is in (or raw, for callers outside Rust).
// `pub` (in a private module) because the sealed trait's signatures name it.
#[allow(unreachable_pub, missing_debug_implementations)]
pub enum AnyDestination<'d> {
    None,
    Host(Boxed<'d, HostMemory>),
    #[cfg(feature = "cufile")]
    Cuda(Boxed<'d, backend_cufile::CudaMemory>),
    #[cfg(feature = "hipfile")]
    Hip(Boxed<'d, backend_hipfile::HipMemory>),
    Raw(Box<dyn RawDestination + Send + 'd>),
}

impl AnyDestination<'_> {
    /// The space of the memory the destination gives, for errors.
    fn space(&self) -> &'static str {
        match self {
            Self::None | Self::Raw(_) => "any",
            Self::Host(_) => HostMemory::NAME,
            #[cfg(feature = "cufile")]
            Self::Cuda(_) => backend_cufile::CudaMemory::NAME,
            #[cfg(feature = "hipfile")]
            Self::Hip(_) => backend_hipfile::HipMemory::NAME,
        }
    }
}

/// A memory space a load can put tensors in: host memory, CUDA or HIP device memory. Sealed:
/// the spaces are the backends'.
pub trait KnownSpace: MemorySpace + sealed::Sealed {}

impl<S: MemorySpace + sealed::Sealed> KnownSpace for S {}

pub(crate) mod sealed {
    use super::{AnyDestination, Boxed, DeviceBuffer, Result};

    /// What the loader needs of a space, kept out of the public interface.
    pub trait Sealed: Sized {
        /// Wraps a destination of this space.
        fn wrap<'d>(destination: Boxed<'d, Self>) -> AnyDestination<'d>;

        /// Takes a destination of this space back out (a raw one is adapted, none declines
        /// every tensor); a destination of another space is an error naming both.
        fn unwrap<'d>(destination: AnyDestination<'d>, backend: &str) -> Result<Boxed<'d, Self>>;

        /// A buffer's bytes as a slice, when the space is host memory.
        fn host_view<B: DeviceBuffer<Space = Self>>(buffer: &B) -> Option<&[u8]>;
    }
}

/// The shared half of `unwrap`: none and raw fit every space.
fn common<'d, S: MemorySpace>(
    destination: AnyDestination<'d>,
    backend: &str,
) -> Result<Boxed<'d, S>> {
    match destination {
        AnyDestination::None => Ok(Box::new(NoDestination)),
        AnyDestination::Raw(raw) => Ok(Box::new(RawRegions(raw))),
        other => Err(Error::DestinationSpace {
            backend: backend.to_owned(),
            expected: S::NAME,
            given: other.space(),
        }),
    }
}

impl sealed::Sealed for HostMemory {
    fn wrap<'d>(destination: Boxed<'d, Self>) -> AnyDestination<'d> {
        AnyDestination::Host(destination)
    }

    fn unwrap<'d>(destination: AnyDestination<'d>, backend: &str) -> Result<Boxed<'d, Self>> {
        match destination {
            AnyDestination::Host(d) => Ok(d),
            other => common(other, backend),
        }
    }

    fn host_view<B: DeviceBuffer<Space = Self>>(buffer: &B) -> Option<&[u8]> {
        Some(staging_core::host_bytes(buffer))
    }
}

/// A GPU's device memory: its destinations are its own variant, and the CPU cannot read it.
macro_rules! gpu_space {
    ($feature:literal, $space:ty, $variant:ident) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $space {
            fn wrap<'d>(destination: Boxed<'d, Self>) -> AnyDestination<'d> {
                AnyDestination::$variant(destination)
            }

            fn unwrap<'d>(
                destination: AnyDestination<'d>,
                backend: &str,
            ) -> Result<Boxed<'d, Self>> {
                match destination {
                    AnyDestination::$variant(d) => Ok(d),
                    other => common(other, backend),
                }
            }

            fn host_view<B: DeviceBuffer<Space = Self>>(_: &B) -> Option<&[u8]> {
                None
            }
        }
    };
}

gpu_space!("cufile", backend_cufile::CudaMemory, Cuda);
gpu_space!("hipfile", backend_hipfile::HipMemory, Hip);
