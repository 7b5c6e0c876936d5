//! The status every fallible call returns, its names for C (`stg_status_str`), and how the
//! library's errors map onto it; also `stg_version`, the other call that needs no handle.

use std::ffi::{CStr, c_char};

use safetensors_staging::{Error, ErrorKind};

/// The result of every fallible call. Numbers are stable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum stg_status {
    /// Success.
    STG_OK = 0,
    /// `stg_load_next`: there are no more tensors (the load ended, or failed earlier).
    STG_END = 1,
    /// A required pointer argument was NULL.
    STG_NULL_ARGUMENT = 100,
    /// A string argument is not valid UTF-8.
    STG_INVALID_UTF8 = 101,
    /// An argument or option is out of range, unknown or inconsistent (a backend name, a zero
    /// size, an unknown key of `stg_config_set`, a backend and device that do not go together),
    /// or a tensor cannot be used the way asked for.
    STG_INVALID_ARGUMENT = 102,
    /// The tensor's device buffer was already taken, or the tensor is not on the device path.
    STG_NOT_A_DEVICE_BUFFER = 103,
    /// `stg_tensor_copy_to_host`: the destination length differs from the tensor's.
    STG_LENGTH_MISMATCH = 104,
    /// The load is inside `stg_load_next` (a call from its own destination callback):
    /// `stg_load_next` there, or the `stg_load_next` whose callback called `stg_load_free`.
    STG_BUSY = 105,
    /// `stg_load_next`: `stg_load_free` was called on the load from another thread while this
    /// call ran. The call freed the load on its way out and wrote nothing: the handle is gone.
    STG_LOAD_FREED = 106,
    /// A file could not be opened or read while parsing the checkpoint.
    STG_IO = 200,
    /// A header or index is malformed or disagrees with the files, or a file is shorter than its
    /// header says.
    STG_INVALID_CHECKPOINT = 201,
    /// A path is not a regular file, or a directory holds no checkpoint.
    STG_NOT_A_CHECKPOINT = 202,
    /// A path does not exist.
    STG_NOT_FOUND = 203,
    /// A path may not be opened by this process.
    STG_PERMISSION_DENIED = 204,
    /// A read failed, or a file changed during the load.
    STG_READ = 300,
    /// A device allocation failed with something other than out-of-memory, or no staging
    /// buffer could be allocated.
    STG_ALLOCATION = 400,
    /// Host memory for a host-assembled tensor could not be allocated.
    STG_HOST_ALLOCATION = 401,
    /// A device operation (memory query, copy) failed.
    STG_DEVICE = 402,
    /// The destination callback returned an error.
    STG_DESTINATION = 500,
    /// The destination callback returned a region shorter than the tensor.
    STG_DESTINATION_TOO_SMALL = 501,
    /// The requested backend cannot run here (no CUDA driver, no device, no libcufile), or a
    /// GPU was asked for and none can be used.
    STG_BACKEND_UNAVAILABLE = 600,
    /// No longer returned: an option that does not parse or an inconsistent configuration is
    /// `STG_INVALID_ARGUMENT`. Kept so the number is not reused.
    STG_INVALID_CONFIG = 700,
    /// A selection names a tensor the checkpoint does not hold, or rows a tensor does not have.
    STG_SELECTION = 800,
    /// The system refused a resource the load needs to run: its threads (a limit on processes
    /// or threads, memory for their stacks) or descriptors. The message names which.
    STG_RESOURCE = 850,
    /// The library panicked; the handle that was in use should be freed.
    STG_PANIC = 900,
    /// An invariant of the library did not hold (a bug, reported instead of a panic).
    STG_INTERNAL = 901,
}

impl TryFrom<u32> for stg_status {
    type Error = u32;

    /// The status numbered `value`; an unknown number comes back as the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        use stg_status::*;
        Ok(match value {
            0 => STG_OK,
            1 => STG_END,
            100 => STG_NULL_ARGUMENT,
            101 => STG_INVALID_UTF8,
            102 => STG_INVALID_ARGUMENT,
            103 => STG_NOT_A_DEVICE_BUFFER,
            104 => STG_LENGTH_MISMATCH,
            105 => STG_BUSY,
            106 => STG_LOAD_FREED,
            200 => STG_IO,
            201 => STG_INVALID_CHECKPOINT,
            202 => STG_NOT_A_CHECKPOINT,
            203 => STG_NOT_FOUND,
            204 => STG_PERMISSION_DENIED,
            300 => STG_READ,
            400 => STG_ALLOCATION,
            401 => STG_HOST_ALLOCATION,
            402 => STG_DEVICE,
            500 => STG_DESTINATION,
            501 => STG_DESTINATION_TOO_SMALL,
            600 => STG_BACKEND_UNAVAILABLE,
            700 => STG_INVALID_CONFIG,
            800 => STG_SELECTION,
            850 => STG_RESOURCE,
            900 => STG_PANIC,
            901 => STG_INTERNAL,
            other => return Err(other),
        })
    }
}

/// A static, NUL-terminated description of `status`; a number that is no `stg_status` gets
/// "unknown status".
#[unsafe(no_mangle)]
pub extern "C" fn stg_status_str(status: u32) -> *const c_char {
    let Ok(status) = stg_status::try_from(status) else {
        return c"unknown status".as_ptr();
    };
    let text: &'static CStr = match status {
        stg_status::STG_OK => c"ok",
        stg_status::STG_END => c"no more tensors",
        stg_status::STG_NULL_ARGUMENT => c"a required pointer argument was NULL",
        stg_status::STG_INVALID_UTF8 => c"a string argument is not valid UTF-8",
        stg_status::STG_INVALID_ARGUMENT => c"an argument is out of range or unknown",
        stg_status::STG_NOT_A_DEVICE_BUFFER => {
            c"the tensor has no device buffer to take (host or destination path, or already taken)"
        }
        stg_status::STG_LENGTH_MISMATCH => c"the length differs from the tensor's",
        stg_status::STG_BUSY => {
            c"the load is busy: called from inside its own stg_load_next (the destination callback)"
        }
        stg_status::STG_LOAD_FREED => {
            c"the load was freed by stg_load_free on another thread during this call"
        }
        stg_status::STG_IO => c"a checkpoint file could not be opened or read",
        stg_status::STG_INVALID_CHECKPOINT => {
            c"a header or index is malformed or disagrees with the files"
        }
        stg_status::STG_NOT_A_CHECKPOINT => {
            c"not a regular file, or a directory without a checkpoint"
        }
        stg_status::STG_NOT_FOUND => c"a path does not exist",
        stg_status::STG_PERMISSION_DENIED => c"a path may not be opened",
        stg_status::STG_READ => c"a read failed or a file changed during the load",
        stg_status::STG_ALLOCATION => c"a device allocation failed",
        stg_status::STG_HOST_ALLOCATION => c"a host allocation failed",
        stg_status::STG_DEVICE => c"a device operation failed",
        stg_status::STG_DESTINATION => c"the destination callback failed",
        stg_status::STG_DESTINATION_TOO_SMALL => {
            c"the destination region is shorter than the tensor"
        }
        stg_status::STG_BACKEND_UNAVAILABLE => c"the backend cannot run here",
        stg_status::STG_INVALID_CONFIG => c"the configuration is inconsistent (no longer returned)",
        stg_status::STG_SELECTION => {
            c"a selection names a tensor or rows the checkpoint does not have"
        }
        stg_status::STG_RESOURCE => {
            c"the system refused a resource the load needs (threads, descriptors)"
        }
        stg_status::STG_PANIC => c"the library panicked",
        stg_status::STG_INTERNAL => c"an invariant of the library did not hold (a bug)",
    };
    text.as_ptr()
}

/// The library's version, static and NUL-terminated.
#[unsafe(no_mangle)]
pub extern "C" fn stg_version() -> *const c_char {
    c"0.1.0".as_ptr()
}

/// The status of a library error: derived from its kind, as Python's exception classes are.
pub(crate) fn status_of(error: &Error) -> stg_status {
    status_of_kind(error.kind())
}

/// The status of each kind of error, as the library's table of kinds names it
/// (`KINDS_IN_DOORS`, which Python and the reference read too). Every kind but `Internal` has a
/// status of its own kind; `tests::every_kind_has_a_status` checks none falls through.
fn status_of_kind(kind: ErrorKind) -> stg_status {
    stg_status::named(kind.in_doors().c_status).unwrap_or(stg_status::STG_INTERNAL)
}

impl stg_status {
    /// Every status, in the order of their numbers.
    const ALL: [stg_status; 26] = {
        use stg_status::*;
        [
            STG_OK,
            STG_END,
            STG_NULL_ARGUMENT,
            STG_INVALID_UTF8,
            STG_INVALID_ARGUMENT,
            STG_NOT_A_DEVICE_BUFFER,
            STG_LENGTH_MISMATCH,
            STG_BUSY,
            STG_LOAD_FREED,
            STG_IO,
            STG_INVALID_CHECKPOINT,
            STG_NOT_A_CHECKPOINT,
            STG_NOT_FOUND,
            STG_PERMISSION_DENIED,
            STG_READ,
            STG_ALLOCATION,
            STG_HOST_ALLOCATION,
            STG_DEVICE,
            STG_DESTINATION,
            STG_DESTINATION_TOO_SMALL,
            STG_BACKEND_UNAVAILABLE,
            STG_INVALID_CONFIG,
            STG_SELECTION,
            STG_RESOURCE,
            STG_PANIC,
            STG_INTERNAL,
        ]
    };

    /// The status whose C name is `name` (`"STG_NOT_FOUND"`): the name `Debug` gives, which is
    /// the enum's in `staging_ffi.h` (cbindgen writes the variants as they are).
    fn named(name: &str) -> Option<stg_status> {
        Self::ALL
            .into_iter()
            .find(|status| format!("{status:?}") == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_in_the_list_and_every_number_in_the_enum() {
        for status in stg_status::ALL {
            assert_eq!(stg_status::try_from(status as u32), Ok(status));
            assert_eq!(stg_status::named(&format!("{status:?}")), Some(status));
        }
        let numbered = (0..1000)
            .filter(|n| stg_status::try_from(*n).is_ok())
            .count();
        assert_eq!(numbered, stg_status::ALL.len());
        assert_eq!(stg_status::named("STG_NO_SUCH_STATUS"), None);
    }

    #[test]
    fn every_kind_has_a_status_and_only_internal_errors_are_internal() {
        let mut seen = std::collections::HashSet::new();
        for kind in ErrorKind::ALL {
            // The table's name is a status of the enum (not the fallback below).
            assert!(
                stg_status::named(kind.in_doors().c_status).is_some(),
                "{kind}"
            );
            let status = status_of_kind(kind);
            assert_eq!(
                status == stg_status::STG_INTERNAL,
                kind == ErrorKind::Internal,
                "{kind}: {status:?}"
            );
            seen.insert(status as u32);
        }
        // Kinds share a status only where C has always had one (bad options and bad uses are
        // both STG_INVALID_ARGUMENT).
        assert_eq!(seen.len(), ErrorKind::ALL.len() - 1);
    }
}
