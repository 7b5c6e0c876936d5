#![doc = include_str!("../README.md")]
//! # safetensors-staging
//!
//! Loads Hugging Face safetensors checkpoints onto a device with bounded memory and exact bytes.
//! [`Loader`] is the one entry point: it picks the backend (`auto`: cuFile, then hipFile, then
//! the host), applies the policy, selection and destination, and opens paths into a [`Load`],
//! an iterator of [`Tensor`]s with its [`LoadReport`]. The `stage` command, the C ABI and the
//! benchmark all go through it.
//!
//! The crates underneath, for backends and lower-level use: `staging-core` (traits, policy,
//! `Stager`, host backend) and, behind features, [`cufile`], [`hipfile`] and `mock`
//! (fault-injecting doubles, fixtures, the conformance suite; not a default feature).

mod backend;
mod device;
mod error;
mod loader;
mod options;
mod space;
mod tensor;

/// CUDA tensors handed to code built on `cudarc`.
#[cfg(feature = "cufile")]
pub mod cuda;
/// HIP tensors handed to the caller.
#[cfg(feature = "hipfile")]
pub mod hip;

pub use backend::{AutoOptions, Backend, HostOptions};
pub use device::Device;
pub use error::{Error, Result};
pub use loader::{Load, Loader, Prepared};
pub use options::{
    BackendKind, CufileMode, HipfileMode, LoadOptions, OptionSpec, ValueKind, escape_name,
    parse_rows, parse_size,
};
pub use space::KnownSpace;
pub use tensor::{BackendMemory, DeviceMemory, Tensor};

pub use staging_core::{
    Checkpoint, Destination, DestinationError, DeviceRegion, Dtype, ErrorKind, FallbackCause,
    Fallbacks, HeldMemory, HostBytes, HostMemory, IoMode, JsonReport, LoadReport, MemorySpace,
    PathCount, PathTotals, Piece, Plan, PolicyBuilder, RawDestination, RowRange, Selection,
    ShardFile, StagingPath, StagingPolicy, TensorMeta, TensorRecord, is_url,
};

/// NVIDIA GPUs: the cuFile backend's options, its memory space and device, the hand-over of a
/// caller's `cudarc` memory as a destination, and the `cudarc` this library is built against.
/// (The backend's readers, allocator and raw bindings stay in the `backend-cufile` crate.)
#[cfg(feature = "cufile")]
pub mod cufile {
    pub use backend_cufile::{
        ActiveMode, CudaDevice, CudaMemory, Error, HandoverError, Options, RequestedMode,
        cuda_region, cudarc,
    };
}

/// AMD GPUs: the hipFile backend's options, its memory space, device and runtime (run against
/// stubs only so far).
#[cfg(feature = "hipfile")]
pub mod hipfile {
    pub use backend_hipfile::{
        ActiveMode, Error, HipDevice, HipMemory, HipRuntime, Options, RequestedMode,
    };
}

/// Object storage and HTTP(S): `s3://`, `gs://`, `az://`, `http(s)://` checkpoints: the remote
/// reader's options and the interrupt a caller may give it.
#[cfg(feature = "remote")]
pub mod remote {
    pub use backend_remote::{Interrupt, ObjectStore, Options, Remote, Stats};
}
#[cfg(feature = "remote")]
pub use backend_remote::Options as RemoteOptions;

/// Fault-injecting doubles, fixture writers and the backend conformance suite (the `mock`
/// feature, for tests and benchmarks; no release artefact has it).
#[cfg(feature = "mock")]
pub use backend_mock as mock;
