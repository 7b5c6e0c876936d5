//! # backend-hipfile
//!
//! AMD GPUs through hipFile (`libhipfile.so.0`), whose C API mirrors cuFile's, with the HIP
//! runtime (`libamdhip64`) declared here and loaded at run time: `hip-runtime-sys` cannot build
//! without ROCm, so nothing here needs ROCm to build. The reader is the shared
//! [`backend_gds::GdsReader`]; this crate supplies the hipFile driver and the HIP device.
//!
//! [`open`] confirms the HIP runtime and a device before `libhipfile` is touched (the same
//! never-hang order as the cuFile backend).
//!
//! What has run where: against stub `libamdhip64` and `libhipfile` libraries compiled by the
//! tests (system memory standing for device memory). It has **not** run on AMD hardware.

// Feature-gated items are labelled with their feature on docs built with `--cfg docsrs` (CI).
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod errors;
mod hip;
#[cfg(feature = "test-stubs")]
pub mod stubs;
pub mod sys;

use std::path::PathBuf;
use std::sync::Arc;

pub use backend_gds::{ActiveMode, RequestedMode};
pub use errors::Error;
pub use hip::{BoundDevice, HipAllocator, HipBuffer, HipDevice, HipMemory, HipPinned, HipRuntime};
pub use sys::{Driver, HipFileApi, MAX_READ};

/// The hipFile reader: the shared GDS-style reader over the hipFile driver and a HIP device.
pub type HipFileReader = backend_gds::GdsReader<Driver, HipDevice>;

/// How to open the backend.
#[derive(Debug, Clone)]
pub struct Options {
    /// The HIP device ordinal.
    pub device: usize,
    /// `Auto` (hipFile, per file POSIX when a file cannot be registered), `Fast` or `Compat`
    /// (hipFile only: hipFile itself chooses its fastpath or its fallback), or `Posix`.
    pub mode: RequestedMode,
    /// An explicit `libhipfile` path; else `$STAGING_HIPFILE_LIB`, `libhipfile.so.0`, `libhipfile.so`.
    pub library: Option<PathBuf>,
    /// An explicit HIP runtime path; else `$STAGING_HIP_LIB`, `libamdhip64.so`, `.so.7`, `.so.6`.
    pub hip_library: Option<PathBuf>,
    /// Size of each pinned bounce buffer on the POSIX path (default 16 MiB).
    pub bounce_size: usize,
    /// The most bytes one `hipFileRead` may move (default and maximum [`MAX_READ`]).
    pub max_read: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            device: 0,
            mode: RequestedMode::Auto,
            library: None,
            hip_library: None,
            bounce_size: backend_gds::DEFAULT_BOUNCE_SIZE,
            max_read: MAX_READ,
        }
    }
}

/// An opened backend.
#[derive(Debug)]
pub struct Backend {
    /// Reads files into device memory.
    pub reader: HipFileReader,
    /// Allocates device memory.
    pub allocator: HipAllocator,
    /// Why `auto` chose the POSIX path, when it did.
    pub fallback_reason: Option<String>,
}

/// Opens the backend: the HIP runtime and device first, then (unless `posix`) `libhipfile` and
/// its driver; in `auto`, a missing library or a driver that will not open means the POSIX path.
pub fn open(options: &Options) -> Result<Backend, Error> {
    let runtime = Arc::new(HipRuntime::load(options.hip_library.as_deref())?);
    let device = HipDevice::open(runtime, options.device)?;
    let allocator = HipAllocator::new(Arc::clone(&device));
    let driver = backend_gds::driver_or_posix(options.mode, || {
        Driver::open(
            HipFileApi::load(options.library.as_deref())?,
            options.max_read,
        )
    })?;
    let (driver, mode, fallback_reason) = match driver {
        Err(reason) => (None, ActiveMode::Posix, Some(reason)),
        Ok(driver) => (Some(Arc::new(driver)), ActiveMode::Fast, None),
    };
    let reader = HipFileReader::new(device, driver, options.mode, mode, options.bounce_size);
    Ok(Backend {
        reader,
        allocator,
        fallback_reason,
    })
}
