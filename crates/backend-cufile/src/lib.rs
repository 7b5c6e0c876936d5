//! # backend-cufile
//!
//! NVIDIA GPUs through cuFile: GPUDirect Storage, cuFile's compatibility mode (the common case on
//! cloud machines), and a POSIX path when `libcufile` is absent. `libcufile` is loaded at run
//! time with `libloading`; CUDA comes through `cudarc`'s driver API, also loaded at run time, so
//! this crate builds and its tests run on machines without CUDA.
//!
//! [`open`] is the one entry point. Its order is the never-hang guard: a CUDA driver library and
//! a device are confirmed before `libcufile` is touched, because `cuFileDriverOpen()` without a
//! CUDA driver has been seen to spin at 100% CPU for over ten minutes.
//!
//! What has run where: this crate's code runs in CI against stub `libcuda` and `libcufile`
//! libraries compiled by the tests (system memory standing for device memory). It has not yet run
//! on NVIDIA hardware.

// Feature-gated items are labelled with their feature on docs built with `--cfg docsrs` (CI).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod cuda;
pub mod errors;
mod handover;
mod reader;
#[cfg(feature = "test-stubs")]
pub mod stubs;
pub mod sys;

use std::path::PathBuf;
use std::sync::Arc;

pub use backend_gds::{ActiveMode, RequestedMode};
pub use cuda::{
    BoundContext, ContextFaults, CudaAllocator, CudaBuffer, CudaDevice, CudaMemory, PinnedBuffer,
};
pub use errors::Error;
pub use handover::{HandoverError, cuda_region};

/// The `cudarc` this backend is built on, for the types of the hand-over (`CudaSlice`,
/// `CudaStream`, `CudaContext`).
pub use cudarc;
pub use reader::{CuFile, CuFileReader, Driver};
use sys::CuFileApi;

/// How to open the backend.
#[derive(Debug, Clone)]
pub struct Options {
    /// The CUDA device ordinal.
    pub device: usize,
    /// The mode asked for.
    pub mode: RequestedMode,
    /// An explicit `libcufile` path; else `$STAGING_CUFILE_LIB`, `libcufile.so.0`, `libcufile.so`.
    pub library: Option<PathBuf>,
    /// Size of each pinned bounce buffer on the POSIX path (default 16 MiB).
    pub bounce_size: usize,
    /// The caller's own `cudarc` context to work in, instead of the device's primary context
    /// retained by the library; `device` must be its ordinal.
    pub context: Option<Arc<cudarc::driver::CudaContext>>,
    /// The caller's own `cudarc` stream: its context is worked in (as with `context`, which it
    /// must then be if both are given) and the POSIX path queues its copies to the device on
    /// it, so the library creates no stream.
    pub stream: Option<Arc<cudarc::driver::CudaStream>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            device: 0,
            mode: RequestedMode::Auto,
            library: None,
            bounce_size: backend_gds::DEFAULT_BOUNCE_SIZE,
            context: None,
            stream: None,
        }
    }
}

/// An opened backend: a reader and an allocator on one device, and why the mode is what it is.
#[derive(Debug)]
pub struct Backend {
    /// Reads files into device memory.
    pub reader: CuFileReader,
    /// Allocates device memory.
    pub allocator: CudaAllocator,
    /// Why `auto` chose the POSIX path, when it did.
    pub fallback_reason: Option<String>,
}

/// Opens the backend on `options.device`.
///
/// Order: confirm the CUDA driver and the device (fails fast with [`Error::NoCudaDriver`],
/// [`Error::NoDevice`], ...), or take the caller's context or stream; unless `posix` was asked
/// for, load `libcufile` and open its driver; in `auto`, a missing library or a driver that will
/// not open means the POSIX path.
pub fn open(options: &Options) -> Result<Backend, Error> {
    let device = match (&options.stream, &options.context) {
        (Some(stream), Some(context)) if !Arc::ptr_eq(stream.context(), context) => {
            return Err(Error::CallerCuda(
                "the stream given belongs to another context than the context given".into(),
            ));
        }
        (Some(stream), _) => CudaDevice::from_stream(stream)?,
        (None, Some(context)) => CudaDevice::from_context(context)?,
        (None, None) => CudaDevice::open(options.device)?,
    };
    if device.ordinal() != options.device {
        return Err(Error::CallerCuda(format!(
            "device {} was asked for, but the context given is device {}'s",
            options.device,
            device.ordinal()
        )));
    }
    let allocator = CudaAllocator::new(Arc::clone(&device));
    let driver = backend_gds::driver_or_posix(options.mode, || {
        Driver::open(
            CuFileApi::load(options.library.as_deref())?,
            options.mode,
            &device,
        )
    })?;
    let (driver, mode, fallback_reason) = match driver {
        Err(reason) => (None, ActiveMode::Posix, Some(reason)),
        Ok(driver) => {
            let mode = match options.mode {
                RequestedMode::Fast if !driver.has_nvfs() => {
                    return Err(Error::ModeUnavailable {
                        mode: "gds",
                        why: "nvidia-fs is not loaded (cuFileDriverGetProperties reports version 0.0); the compatibility mode can run without it".into(),
                    });
                }
                RequestedMode::Compat => ActiveMode::Compat,
                _ if driver.has_nvfs() => ActiveMode::Fast,
                _ => ActiveMode::Compat,
            };
            (Some(Arc::new(driver)), mode, None)
        }
    };
    let reader = CuFileReader::new(device, driver, options.mode, mode, options.bounce_size);
    // The reader and the allocator share the device and its retained context.
    Ok(Backend {
        reader,
        allocator,
        fallback_reason,
    })
}
