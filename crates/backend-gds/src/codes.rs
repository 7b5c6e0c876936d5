//! Operation-code names. `cufileop_status_error()` is `static inline` in `cufile.h`, not
//! exported, so the names live here. hipFile's codes 5001-5038 mean the same operations under
//! hipFile's own names (`hipFileOpError_t` in AMD's `hipfile.h`, as the `hipfile` Python
//! package's `_chipfile.pxd` declares it: the same order, 5021 and 5032 unused, 5039 its end
//! marker `hipFileIOMaxError`). Unknown codes stay numbers; 5039 changed meaning between cuFile
//! 1.14 and 1.20.

/// The name of a cuFile operation code (`CUfileOpError`), if known. hipFile's codes 5001-5038
/// are the same operations (with a `hipFile` prefix).
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

/// The name of a hipFile operation code (`hipFileOpError_t`), if known: hipFile's own
/// enumerators, in `hipfile.h`'s order from `hipFileSuccess` (0) and 5001.
pub fn hipfile_code_name(code: i64) -> Option<&'static str> {
    Some(match code {
        0 => "hipFileSuccess",
        5001 => "hipFileDriverNotInitialized",
        5002 => "hipFileDriverInvalidProps",
        5003 => "hipFileDriverUnsupportedLimit",
        5004 => "hipFileDriverVersionMismatch",
        5005 => "hipFileDriverVersionReadError",
        5006 => "hipFileDriverClosing",
        5007 => "hipFilePlatformNotSupported",
        5008 => "hipFileIONotSupported",
        5009 => "hipFileDeviceNotSupported",
        5010 => "hipFileDriverError",
        5011 => "hipFileHipDriverError",
        5012 => "hipFileHipPointerInvalid",
        5013 => "hipFileHipMemoryTypeInvalid",
        5014 => "hipFileHipPointerRangeError",
        5015 => "hipFileHipContextMismatch",
        5016 => "hipFileInvalidMappingSize",
        5017 => "hipFileInvalidMappingRange",
        5018 => "hipFileInvalidFileType",
        5019 => "hipFileInvalidFileOpenFlag",
        5020 => "hipFileDIONotSet",
        5022 => "hipFileInvalidValue",
        5023 => "hipFileMemoryAlreadyRegistered",
        5024 => "hipFileMemoryNotRegistered",
        5025 => "hipFilePermissionDenied",
        5026 => "hipFileDriverAlreadyOpen",
        5027 => "hipFileHandleNotRegistered",
        5028 => "hipFileHandleAlreadyRegistered",
        5029 => "hipFileDeviceNotFound",
        5030 => "hipFileInternalError",
        5031 => "hipFileGetNewFDFailed",
        5033 => "hipFileDriverSetupError",
        5034 => "hipFileIODisabled",
        5035 => "hipFileBatchSubmitFailed",
        5036 => "hipFileGPUMemoryPinningFailed",
        5037 => "hipFileBatchFull",
        5038 => "hipFileAsyncNotSupported",
        5039 => "hipFileIOMaxError",
        _ => return None,
    })
}

/// `"hipFileName (code)"`, or `"unknown hipFile error (code)"`.
pub fn describe_hipfile_code(code: i64) -> String {
    match hipfile_code_name(code) {
        Some(name) => format!("{name} ({code})"),
        None => format!("unknown hipFile error ({code})"),
    }
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
        assert_eq!(describe_hipfile_code(5011), "hipFileHipDriverError (5011)");
        assert_eq!(describe_hipfile_code(5039), "hipFileIOMaxError (5039)");
        assert_eq!(describe_hipfile_code(5021), "unknown hipFile error (5021)");
        assert_eq!(describe_hipfile_code(5040), "unknown hipFile error (5040)");
        // Every cuFile code up to 5038 has a hipFile name and the other way round: the two
        // enums run in step.
        for code in (5001..=5038).chain([0]) {
            assert_eq!(
                cufile_code_name(code).is_some(),
                hipfile_code_name(code).is_some(),
                "{code}"
            );
        }
    }
}
