//! # safetensors-staging
//!
//! Loads Hugging Face safetensors checkpoints onto a device, tensor by tensor, with bounded
//! memory and exact bytes, and reports where every tensor went: NVIDIA GPUs through cuFile
//! ([`cufile`]), AMD GPUs through hipFile ([`hipfile`]), object storage and HTTP ([`remote`]),
//! and host memory standing in for the device anywhere else.
//!
//! [`Loader`] is the one entry point: it picks the backend (`auto`: cuFile, then hipFile, then
//! the host), applies the [staging policy](StagingPolicy), selection and destination, and
//! opens a checkpoint (a file, a directory, an index, a hub-cache snapshot, a URL) into a
//! [`Load`], an iterator of [`Tensor`]s in file order with its [`LoadReport`]. The `stage`
//! command, the Python package, the C ABI and the candle backends all go through it, and all
//! spell the same [`LoadOptions`] and classify failures by the same [`ErrorKind`].
//!
//! ```
//! use safetensors_staging::{Backend, HostOptions, Loader, RowRange, Selection};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.safetensors");
//! # let embed: Vec<u8> = (0..1000 * 64 * 2).map(|i| i as u8).collect();
//! # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![1000, 64], &embed)?;
//! # safetensors::serialize_to_file([("embed", view)], None, &path)?;
//! // `path`: a checkpoint with a BF16 tensor `embed` of 1000 x 64.
//! let mut load = Loader::new()
//!     .backend(Backend::Host(HostOptions::default())) // or Backend::default(): auto
//!     .select(Selection::all().rows("embed", RowRange::Part { rank: 1, parts: 4 }))
//!     .open(&path)?;
//! for tensor in load.by_ref() {
//!     let tensor = tensor?; // an error names the file, the tensor and the offset
//!     println!("{} {:?} {:?}", tensor.name(), tensor.meta().shape, tensor.path());
//!     assert_eq!(tensor.host_bytes(), Some(&embed[250 * 128..500 * 128]));
//! }
//! let report = load.report();
//! assert_eq!(report.bytes_read, report.bytes); // only the rows asked for were read
//! # Ok(())
//! # }
//! ```
//!
//! The guides, the options table, the errors and what was measured are on the documentation
//! site built from `docs/` (`mkdocs build --strict`; start at `docs/index.md`, or
//! `docs/getting-started/rust.md` for this crate). The other doors: the `stage` command
//! (`crates/staging-cli`), the Python package `safetensors_staging` (`crates/staging-py`), the
//! C ABI (`crates/staging-ffi`, header `crates/staging-ffi/include/staging_ffi.h`) and candle
//! (`crates/staging-candle`).
//!
//! The crates underneath, for backends and lower-level use: `staging-core` (traits, policy,
//! `Stager`, host backend) and, behind features, [`cufile`], [`hipfile`], [`remote`] and `mock`
//! (fault-injecting doubles, fixtures, the conformance suite; not a default feature).

/// The README's Rust blocks, run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust blocks of the documentation site's Rust page, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/getting-started/rust.md")]
pub struct RustPageDoctests;

mod backend;
mod device;
mod error;
mod load_into;
mod loader;
mod mapping;
mod options;
mod space;
mod tensor;

/// CUDA tensors handed to code built on `cudarc`.
#[cfg(feature = "cufile")]
pub mod cuda;
/// HIP tensors handed to the caller.
#[cfg(feature = "hipfile")]
pub mod hip;

pub use backend::{AutoOptions, Backend, HostOptions, MapFiles};
pub use device::Device;
pub use error::{Error, Result};
pub use load_into::{LoadedInto, RawTarget, Target};
pub use loader::{Load, Loader, Prepared};
pub use mapping::MappedBytes;
pub use options::{
    BackendKind, CufileMode, HipfileMode, LoadOptions, OptionSpec, ValueKind, escape_name,
    parse_rows, parse_size,
};
pub use space::KnownSpace;
pub use tensor::{BackendMemory, DeviceMemory, Tensor};

pub use staging_core::{
    Checkpoint, Destination, DestinationError, DeviceRegion, Dtype, ErrorKind, FallbackCause,
    Fallbacks, HeldMemory, HostBytes, HostMemory, IoMode, JsonReport, KINDS_IN_DOORS, KindInDoors,
    LoadReport, MemorySpace, PathCount, PathTotals, Piece, Plan, PolicyBuilder, RawDestination,
    RowRange, Selection, ShardFile, StagingPath, StagingPolicy, TensorMeta, TensorRecord, is_hub,
    is_url,
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
/// reader's options and the interrupt a caller may give it; and the Hugging Face Hub's
/// (`hf://`) facts a caller may ask for before a load (`hub::changes` between two revisions).
#[cfg(feature = "remote")]
pub mod remote {
    pub use backend_remote::{
        Interrupt, ObjectStore, Options, Remote, Scheme, Stats, redacted_text,
    };

    /// The Hugging Face Hub (`hf://`): how it is read, what changed between two revisions of a
    /// model, and a file's path in its repository.
    pub mod hub {
        pub use backend_hub::{Changes, HubOptions, changes, is_repo_id, repository_path};
    }
}
#[cfg(feature = "remote")]
pub use backend_hub::HubOptions;
#[cfg(feature = "remote")]
pub use backend_remote::Options as RemoteOptions;

/// Fault-injecting doubles, fixture writers and the backend conformance suite (the `mock`
/// feature, for tests and benchmarks; no release artefact has it).
#[cfg(feature = "mock")]
pub use backend_mock as mock;
