//! The backend's errors. cuFile's operation-code names live in `backend_gds::codes`, shared with
//! hipFile.

use std::path::PathBuf;

pub use backend_gds::codes::{cufile_code_name, describe_cufile_code};

/// Why the cuFile backend could not start, or a cuFile call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No CUDA driver library (`libcuda.so`) could be loaded.
    #[error("no CUDA driver: libcuda.so could not be loaded (is the NVIDIA driver installed?)")]
    NoCudaDriver,
    /// A CUDA driver call failed.
    #[error("CUDA {call} failed: {code}")]
    Cuda {
        /// The driver call.
        call: &'static str,
        /// The CUresult, by name and number.
        code: String,
    },
    /// The driver reports no CUDA device.
    #[error("no CUDA device: the driver reports 0 devices")]
    NoDevice,
    /// `--device N` names a device that does not exist.
    #[error("CUDA device {requested} does not exist: the driver reports {count}")]
    DeviceOutOfRange {
        /// The device asked for.
        requested: usize,
        /// How many there are.
        count: usize,
    },
    /// No cuFile library could be loaded.
    #[error("cuFile library not found: {tried}")]
    LibraryMissing {
        /// Each name tried with its loader error.
        tried: String,
    },
    /// The cuFile library lacks a required symbol.
    #[error("{library}: missing symbol {symbol}: {detail}")]
    MissingSymbol {
        /// The library.
        library: PathBuf,
        /// The symbol.
        symbol: &'static str,
        /// The loader's message.
        detail: String,
    },
    /// A cuFile call failed.
    #[error("{call} failed: {code}")]
    CuFile {
        /// The cuFile call.
        call: &'static str,
        /// The code, by name and number.
        code: String,
    },
    /// The caller's context and stream ([`Options`](crate::Options)) do not go together.
    #[error("the caller's CUDA context and stream: {0}")]
    CallerCuda(String),
    /// The requested mode cannot run here.
    #[error("cuFile mode {mode} is not available: {why}")]
    ModeUnavailable {
        /// The mode asked for.
        mode: &'static str,
        /// Why not.
        why: String,
    },
}

/// Formats a CUresult by name and number without calling back into the driver.
pub(crate) fn cuda_code(e: cudarc::driver::DriverError) -> String {
    format!("{:?} ({})", e.0, e.0 as i32)
}

impl From<backend_gds::dl::MissingSymbol> for Error {
    fn from(e: backend_gds::dl::MissingSymbol) -> Self {
        Error::MissingSymbol {
            library: e.library,
            symbol: e.symbol,
            detail: e.detail,
        }
    }
}
