//! # staging-core
//!
//! Moves the tensors of a safetensors checkpoint into device memory, tensor by tensor, with
//! bounded memory and exact bytes.
//!
//! - [`Checkpoint`] opens a checkpoint (a directory, an index, or files), reads each header alone
//!   and validates it with the `safetensors` crate, then against the file's size;
//!   [`Checkpoint::select`] narrows it to the tensors (and rows) a caller wants.
//! - Backends implement [`Reader`] (file bytes into a memory space) and [`DeviceAllocator`]
//!   (device buffers, free memory, device-to-host copies). Callers may implement
//!   [`Destination`] to receive tensors in memory they own.
//! - [`Stager`] walks the tensors in file order and applies the [`StagingPolicy`]: destination
//!   first; else a device buffer when free memory leaves `max(256 MiB, len / 4)` of headroom;
//!   else (or on out-of-memory) host assembly through one bounded staging buffer. Only
//!   allocation failures fall back; a read failure ends the load with an error naming the tensor,
//!   file and offset, and nothing half-read is handed out.
//! - [`host`] is a backend over system memory, so all of this runs without a GPU.
//!
//! Most callers want the facade crate's `Loader`, which picks the backend and wires these
//! together; this crate is what backends and the facade are built on.
//!
//! Unsafe code lives in [`DeviceRegion::from_raw_parts`] (a region is only as good as its
//! creator's promise), the [`DeviceBuffer`] and [`RawDestination`] traits (whose contracts the
//! sub-allocator and the readers rely on), host memory ([`HostBytes`]) and the sub-allocator's
//! carving.
//!
//! ```
//! use staging_core::{Checkpoint, Stager, StagingPath, StagingPolicy};
//! use staging_core::host::{HostAllocator, HostReader};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.safetensors");
//! # let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! # let mut file = (header.len() as u64).to_le_bytes().to_vec();
//! # file.extend_from_slice(header);
//! # file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
//! # std::fs::write(&path, file)?;
//! let checkpoint = Checkpoint::open(dir.path())?;
//! let stager = Stager::new(checkpoint, HostReader, HostAllocator::new(), StagingPolicy::default())?;
//! for tensor in stager {
//!     let tensor = tensor?;
//!     assert_eq!(tensor.path(), StagingPath::Device);
//!     println!("{} {:?} {:?}", tensor.name(), tensor.meta().shape, tensor.path());
//! }
//! # Ok(())
//! # }
//! ```

mod checkpoint;
mod error;
pub mod host;
mod kept;
mod memory;
mod policy;
mod report;
mod stager;
mod suballoc;
mod traits;
pub mod write;
mod write_loop;

pub use checkpoint::{
    Checkpoint, Dtype, EntryKind, FileIdentity, INDEX_FILE_NAME, Layout, LocalFiles,
    MAX_HEADER_SIZE, MAX_INDEX_SIZE, Piece, Plan, RowRange, SINGLE_FILE_NAME, Selection, ShardFile,
    Store, StoreFile, TensorMeta, Wanted, checked_components, checkpoint_files,
    checkpoint_files_with, index_shard_names, is_hub, is_url, natural_cmp,
};
pub use error::{
    AllocError, DestinationError, DeviceError, Error, ErrorKind, KINDS_IN_DOORS, KindInDoors,
    ReadError, Result, io_words,
};
pub use kept::{IoThreads, KeepOpen, OpenFiles, Recent};
pub use memory::{DeviceRegion, HostBytes, HostMemory, MemorySpace, host_bytes};
pub use policy::{
    COALESCE_ALIGN, FallbackCause, MIB, PolicyBuilder, StagingPath, StagingPolicy,
    default_io_threads,
};
pub use report::{
    Fallbacks, HeldMemory, HubReport, JsonReport, LoadReport, PathCount, PathTotals, TensorRecord,
};
pub use stager::{
    DeviceTensor, HostTensor, MIN_STAGING_SIZE, StagedTensor, Stager, TakenBuffer, TensorData,
};
pub use suballoc::{SUB_ALIGN, SubAllocator, SubBuffer};
pub use traits::{
    Destination, DeviceAllocator, DeviceBuffer, IoMode, MemoryInfo, NoDestination, RawDestination,
    RawRegions, Reader,
};
pub use write_loop::{ChunkPlan, FILE_ALIGNMENT, plan_chunks};
