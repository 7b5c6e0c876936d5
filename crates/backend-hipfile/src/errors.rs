//! The backend's errors. hipFile's operation codes share cuFile's names (`backend_gds::codes`).

use std::path::PathBuf;

/// Why the hipFile backend could not start, or a HIP or hipFile call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No HIP runtime library could be loaded.
    #[error("no HIP runtime: {tried} (is ROCm installed?)")]
    NoHipRuntime {
        /// Each name tried with its loader error.
        tried: String,
    },
    /// A HIP runtime call failed.
    #[error("HIP {call} failed: {message} ({code})")]
    Hip {
        /// The call.
        call: &'static str,
        /// The hipError_t.
        code: i32,
        /// `hipGetErrorString`.
        message: String,
    },
    /// The runtime reports no HIP device.
    #[error("no HIP device: the runtime reports 0 devices")]
    NoDevice,
    /// The device ordinal does not exist.
    #[error("HIP device {requested} does not exist: the runtime reports {count}")]
    DeviceOutOfRange {
        /// The device asked for.
        requested: usize,
        /// How many there are.
        count: usize,
    },
    /// No hipFile library could be loaded.
    #[error("hipFile library not found: {tried}")]
    LibraryMissing {
        /// Each name tried with its loader error.
        tried: String,
    },
    /// A library lacks a required symbol.
    #[error("{library}: missing symbol {symbol}: {detail}")]
    MissingSymbol {
        /// The library.
        library: PathBuf,
        /// The symbol.
        symbol: &'static str,
        /// The loader's message.
        detail: String,
    },
    /// A hipFile call failed.
    #[error("{call} failed: {code}")]
    HipFile {
        /// The call.
        call: &'static str,
        /// The code, by name and number.
        code: String,
    },
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
