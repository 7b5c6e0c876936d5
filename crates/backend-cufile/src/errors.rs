//! The backend's errors, and cuFile's operation codes with their names.
//!
//! `cufileop_status_error()` is `static inline` in `cufile.h`, not exported, so the names live
//! here. Unknown codes stay numbers; 5039 changed meaning between cuFile 1.14 and 1.20.

use std::path::PathBuf;

/// The name of a cuFile operation code (`CUfileOpError`), if known.
pub fn cufile_code_name(code: i64) -> Option<&'static str> {
    Some(match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        5035 => "CU_FILE_BATCH_SUBMIT_FAILED",
        5036 => "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        5037 => "CU_FILE_BATCH_FULL",
        5038 => "CU_FILE_ASYNC_NOT_SUPPORTED",
        5039 => "CU_FILE_IO_MAX_ERROR (1.14) or CU_FILE_INTERNAL_BATCH_SETUP_ERROR (1.20)",
        5043 => "CU_FILE_NOMEM",
        5044 => "CU_FILE_IO_ERROR",
        5049 => "CU_FILE_BATCH_NOCOMPAT",
        5050 => "CU_FILE_IO_MAX_ERROR",
        _ => return None,
    })
}

/// `"NAME (code)"`, or `"unknown cuFile error (code)"`.
pub fn describe_cufile_code(code: i64) -> String {
    match cufile_code_name(code) {
        Some(name) => format!("{name} ({code})"),
        None => format!("unknown cuFile error ({code})"),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_codes() {
        assert_eq!(
            describe_cufile_code(5011),
            "CU_FILE_CUDA_DRIVER_ERROR (5011)"
        );
        assert_eq!(describe_cufile_code(5021), "unknown cuFile error (5021)");
        assert_eq!(describe_cufile_code(9999), "unknown cuFile error (9999)");
        assert!(describe_cufile_code(5039).contains("1.20"));
    }
}
