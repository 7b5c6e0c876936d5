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
//! `Stager`, host backend) and, behind features, [`cufile`], [`hipfile`] and [`mock`]
//! (fault-injecting doubles, fixtures, the conformance suite; not a default feature).

mod backend;
mod error;
mod loader;
mod options;
mod space;
mod tensor;

/// CUDA tensors handed to code built on `cudarc`.
#[cfg(feature = "cufile")]
pub mod cuda;

pub use backend::{AutoOptions, Backend, HostOptions};
pub use error::{Error, Result};
pub use loader::{Load, Loader, Prepared};
pub use options::{
    BackendKind, CufileMode, Device, HipfileMode, LoadOptions, ValueKind, escape_name, parse_rows,
    parse_size,
};
pub use space::KnownSpace;
pub use tensor::{DeviceMemory, Tensor};

pub use staging_core::{
    Checkpoint, Destination, DestinationError, DeviceRegion, Dtype, ErrorKind, FallbackCause,
    Fallbacks, HeldMemory, HostBytes, HostMemory, IoMode, JsonReport, LoadReport, MemorySpace,
    PathCount, PathTotals, Piece, Plan, PolicyBuilder, RawDestination, RowRange, Selection,
    ShardFile, StagingPath, StagingPolicy, TensorMeta, TensorRecord, is_url,
};

/// NVIDIA cuFile (GDS, compatibility mode) and POSIX backends for CUDA devices, and `cudarc`.
#[cfg(feature = "cufile")]
pub use backend_cufile as cufile;

/// AMD hipFile backend for HIP devices (run against stubs only so far).
#[cfg(feature = "hipfile")]
pub use backend_hipfile as hipfile;

/// Object storage and HTTP(S): `s3://`, `gs://`, `az://`, `http(s)://` checkpoints.
#[cfg(feature = "remote")]
pub use backend_remote as remote;
#[cfg(feature = "remote")]
pub use backend_remote::Options as RemoteOptions;

/// Fault-injecting doubles, fixture writers and the backend conformance suite.
#[cfg(feature = "mock")]
pub use backend_mock as mock;
