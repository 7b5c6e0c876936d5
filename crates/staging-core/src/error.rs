//! The crate's errors. [`Error`] is what a load or a checkpoint returns; every variant carries
//! what a person needs to act on it: the file, the tensor, the offset, the call. The backend
//! errors ([`ReadError`], [`AllocError`], [`DeviceError`]) are what the backend traits return,
//! and what [`Error`] wraps with the tensor and file.
//!
//! This module depends on no other module of the crate.

use std::error::Error as StdError;
use std::io;
use std::path::PathBuf;

/// Why a device allocation failed. Only [`AllocError::OutOfMemory`] lets the stager fall back to
/// host assembly; any other failure aborts the load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The device has not enough free memory for this allocation (CUDA error 2, HIP error 2, a
    /// capped host device that is full). Free memory may have changed since it was queried.
    #[error("out of device memory allocating {requested} bytes: {detail}")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// What the backend said.
        detail: String,
    },
    /// Any other failure: a lost device, an invalid context, a driver error.
    #[error("device allocation of {requested} bytes failed: {detail}")]
    Failed {
        /// Bytes asked for.
        requested: usize,
        /// What the backend said, with its call and code.
        detail: String,
    },
}

/// A device operation other than allocation failed (a memory query, a copy).
#[derive(Debug, thiserror::Error)]
#[error("{operation} failed: {detail}")]
pub struct DeviceError {
    /// The operation, for example `cuMemcpyDtoH` or `copy_to_host`.
    pub operation: String,
    /// What the backend said, with its code where there is one.
    pub detail: String,
}

impl DeviceError {
    /// Checks that `len` bytes at `offset` lie inside a buffer of `buffer_len` bytes, the
    /// bounds check every [`DeviceAllocator::copy_to_host`](crate::DeviceAllocator::copy_to_host) makes first.
    pub fn check_bounds(
        operation: &str,
        buffer_len: usize,
        offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        if offset.checked_add(len).is_some_and(|end| end <= buffer_len) {
            Ok(())
        } else {
            Err(DeviceError::new(
                operation,
                format!("{len} bytes at offset {offset} are outside a {buffer_len}-byte buffer"),
            ))
        }
    }

    /// A device error for `operation` with `detail`.
    pub fn new(operation: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            operation: operation.into(),
            detail: detail.into(),
        }
    }
}

/// An operating-system error in words: `no such file or directory`, not `No such file or
/// directory (os error 2)` (the number says nothing to a person; the kind says it to a program).
pub fn io_words(error: &io::Error) -> String {
    let text = error.to_string();
    let text = match (error.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(at)) => &text[..at],
        _ => return text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Which limit an operating-system error starting a thread (or opening a file) points at, in
/// words a person can act on.
fn resource_hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        // What `pthread_create` says for both: a thread over the limit, or no stack for it.
        Some(libc_codes::EAGAIN) | Some(libc_codes::ENOMEM) => {
            "the system refused another thread: the limit on processes and threads was reached \
             (ulimit -u, RLIMIT_NPROC; kernel.threads-max; a container's pids limit), or there \
             is no memory for its stack (the address space, ulimit -v; the count of memory \
             mappings, vm.max_map_count)"
        }
        Some(libc_codes::EMFILE) | Some(libc_codes::ENFILE) => {
            "the limit on open files was reached (ulimit -n, RLIMIT_NOFILE)"
        }
        _ => "a system limit",
    }
}

/// Whether `error` says the process (`EMFILE`) or the system (`ENFILE`) has no descriptor left
/// to open a file with: a resource the load needs, not the file's fault.
fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc_codes::EMFILE) | Some(libc_codes::ENFILE)
    )
}

/// The `errno` values `resource_hint` names (Linux's, on every architecture it runs on).
mod libc_codes {
    pub(super) const EAGAIN: i32 = 11;
    pub(super) const ENOMEM: i32 = 12;
    pub(super) const ENFILE: i32 = 23;
    pub(super) const EMFILE: i32 = 24;
}

/// Why a read (or opening a file for reading) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// An operating-system error (`errno`).
    #[error("{}", io_words(.0))]
    Io(#[from] io::Error),
    /// A native library call failed with its own code.
    #[error("{call} failed: {message} (code {code})")]
    Native {
        /// The library call, for example `cuFileRead`.
        call: &'static str,
        /// The library's code.
        code: i64,
        /// The code's name or description.
        message: String,
    },
    /// The reader reported more bytes than it was asked for: a broken backend.
    #[error("reader returned {returned} bytes for a request of {requested}")]
    Overrun {
        /// Bytes asked for.
        requested: usize,
        /// Bytes the reader claimed.
        returned: usize,
    },
}

/// What a [`Destination`](crate::Destination) may fail with: the caller's own error.
pub type DestinationError = Box<dyn StdError + Send + Sync>;

/// A result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong opening or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be opened, inspected or read while parsing.
    #[error("{}: {}", path.display(), io_words(source))]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// A safetensors header is malformed or disagrees with its file.
    #[error("{}: invalid safetensors header: {reason}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An index file is malformed, names a path outside the checkpoint, or disagrees with the
    /// shards.
    #[error("{}: invalid index: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A path is not a regular file (a directory, a fifo, a device) where a file is needed.
    #[error("{}: not a regular file", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// A directory holds no safetensors file.
    #[error("{}: no model.safetensors.index.json, model.safetensors or *.safetensors file", path.display())]
    NoCheckpoint {
        /// The directory.
        path: PathBuf,
    },
    /// The same file was given twice.
    #[error("{}: listed more than once", path.display())]
    DuplicateFile {
        /// The file.
        path: PathBuf,
    },
    /// Two files hold a tensor of the same name.
    #[error("tensor {name:?} is in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        /// The tensor.
        name: String,
        /// The file that holds it first.
        first: PathBuf,
        /// The other file.
        second: PathBuf,
    },
    /// A file could not be opened by the backend's reader.
    #[error("{}: cannot open for reading: {source}", file.display())]
    Open {
        /// The file.
        file: PathBuf,
        /// The reader's error.
        #[source]
        source: ReadError,
    },
    /// A read failed.
    #[error("{}: tensor {tensor:?}: read failed at offset {offset}: {source}", file.display())]
    Read {
        /// The tensor being read.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The file offset the failed read started at.
        offset: u64,
        /// The reader's error.
        #[source]
        source: ReadError,
    },
    /// The file ended before the tensor did (it was truncated after its header was checked).
    #[error("{}: tensor {tensor:?}: file ended at offset {offset}, {missing} bytes short", file.display())]
    Truncated {
        /// The tensor being read.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// Where the file ended.
        offset: u64,
        /// Bytes of the tensor not read.
        missing: u64,
    },
    /// A file changed after its header was read (replaced, resized or written), so its bytes can
    /// no longer be trusted to match the header.
    #[error("{}: changed during the load: it {detail}", file.display())]
    FileChanged {
        /// The file.
        file: PathBuf,
        /// What changed.
        detail: String,
    },
    /// A device allocation failed with something other than out-of-memory.
    #[error("{}: tensor {tensor:?} at offset {offset}: {source}", file.display())]
    Allocation {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// Its offset.
        offset: u64,
        /// The allocator's error.
        #[source]
        source: AllocError,
    },
    /// The bounded staging buffer could not be allocated, so the host path cannot run.
    #[error("{}: tensor {tensor:?} at offset {offset}: cannot allocate the {bytes}-byte staging buffer: {source}", file.display())]
    StagingBuffer {
        /// The tensor that needed it.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// Its offset.
        offset: u64,
        /// The staging buffer's size.
        bytes: usize,
        /// The allocator's error.
        #[source]
        source: AllocError,
    },
    /// Host memory for a host-assembled tensor could not be allocated.
    #[error("{}: tensor {tensor:?} at offset {offset}: cannot allocate {bytes} bytes of host memory", file.display())]
    HostAllocation {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// Its offset.
        offset: u64,
        /// Bytes asked for.
        bytes: usize,
    },
    /// A device operation (memory query, device-to-host copy) failed.
    #[error("{}: tensor {tensor:?} at offset {offset}: {source}", file.display())]
    Device {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The file offset of the chunk involved.
        offset: u64,
        /// The device error.
        #[source]
        source: DeviceError,
    },
    /// The caller's destination is shorter than the tensor.
    #[error("{}: tensor {tensor:?} needs {needed} bytes but its destination holds {capacity}", file.display())]
    DestinationTooSmall {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The tensor's length.
        needed: usize,
        /// The destination's length.
        capacity: usize,
    },
    /// The caller's destination returned an error.
    #[error("{}: tensor {tensor:?}: destination failed: {source}", file.display())]
    Destination {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The caller's error.
        #[source]
        source: DestinationError,
    },
    /// A selection names a tensor the checkpoint does not hold.
    #[error("tensor {name:?} is not in the checkpoint")]
    UnknownTensor {
        /// The name asked for.
        name: String,
    },
    /// A selection of names and globs, as a caller wrote it, keeps no tensor of the checkpoint:
    /// the rule every door shares (an empty load is never what a typed pattern meant).
    #[error("the selection {selection} matches no tensor of the checkpoint")]
    NothingSelected {
        /// The selection, as the caller wrote it.
        selection: String,
    },
    /// A row range cannot be cut from a tensor (out of range, a scalar, rows that are not whole
    /// bytes).
    #[error("{}: tensor {tensor:?}: cannot read {rows}: {reason}", file.display())]
    Rows {
        /// The tensor.
        tensor: String,
        /// Its file.
        file: PathBuf,
        /// The rows asked for, as words (`rows 2..5`, `part 1 of 4`).
        rows: String,
        /// Why not.
        reason: String,
    },
    /// The staging policy is inconsistent.
    #[error("invalid staging policy: {0}")]
    Policy(String),
    /// The system refused what the load needs to run: its threads (a limit on processes or
    /// threads, or no memory for their stacks), or a descriptor. Not the checkpoint's fault nor
    /// the options': the same load runs once the resource is there.
    #[error("cannot start {what}: {}; {}", io_words(source), resource_hint(source))]
    Resource {
        /// What could not be started, in words (`4 I/O threads`).
        what: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// An invariant of this library did not hold: a bug, reported instead of a panic. Please
    /// report it with the message.
    #[error("internal error (a bug in safetensors-staging, please report it): {0}")]
    Internal(String),
}

/// Writes, from the one list of error kinds below, the [`ErrorKind`] enum (each kind's meaning
/// its doc), [`ErrorKind::ALL`], [`ErrorKind::as_str`] and [`KINDS_IN_DOORS`], so that a new kind
/// is one row: `Kind = "name", "PythonClass", "STG_STATUS": "Its meaning.";`.
macro_rules! error_kinds {
    ($($kind:ident = $name:literal, $python_class:literal, $c_status:literal: $meaning:literal;)*) => {
        /// What kind of failure an [`Error`] is: the one classification every door derives its own
        /// from (Python's exception classes, C's status codes, the `stage` command's message). Small
        /// and stable: a new error variant gets one of these, not a new kind, unless a caller would
        /// branch on it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorKind {
            $(
                #[doc = $meaning]
                $kind,
            )*
        }

        /// How many kinds there are.
        const KINDS: usize = [$(ErrorKind::$kind),*].len();

        impl ErrorKind {
            /// Every kind, for tables and tests.
            pub const ALL: [ErrorKind; KINDS] = [$(Self::$kind),*];

            /// The kind's name, as Python's `StagingError.kind` and the documentation spell it
            /// (`"not-found"`, `"invalid-checkpoint"`, ...).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$kind => $name,)*
                }
            }
        }

        /// The table, one row per kind, in the order of [`ErrorKind::ALL`].
        pub const KINDS_IN_DOORS: [KindInDoors; KINDS] = [
            $(KindInDoors {
                kind: ErrorKind::$kind,
                meaning: $meaning,
                python_class: $python_class,
                c_status: $c_status,
            },)*
        ];
    };
}

error_kinds! {
    NotFound = "not-found", "PathNotFoundError", "STG_NOT_FOUND":
        "A path (a file, a directory, an object) does not exist.";
    PermissionDenied = "permission-denied", "PathPermissionError", "STG_PERMISSION_DENIED":
        "A path the process may not open.";
    Io = "io", "ReadError", "STG_IO":
        "Any other failure to open, inspect or read a file while reading the headers.";
    InvalidCheckpoint = "invalid-checkpoint", "MalformedCheckpointError", "STG_INVALID_CHECKPOINT":
        "A header or index is malformed, disagrees with the files, or a file is shorter than its header says.";
    NotACheckpoint = "not-a-checkpoint", "MalformedCheckpointError", "STG_NOT_A_CHECKPOINT":
        "A path is not a regular file, or a directory holds no checkpoint.";
    Read = "read", "ReadError", "STG_READ":
        "A read failed during the load, or a file changed under it.";
    DeviceAllocation = "device-allocation", "OutOfMemoryError", "STG_ALLOCATION":
        "A device allocation failed where the policy had no fallback left (the staging buffer), or failed with something other than out-of-memory.";
    HostAllocation = "host-allocation", "OutOfMemoryError", "STG_HOST_ALLOCATION":
        "Host memory for a host-assembled tensor could not be allocated.";
    Device = "device", "DeviceError", "STG_DEVICE":
        "A device operation (memory query, copy) failed.";
    Destination = "destination", "DestinationError", "STG_DESTINATION":
        "The caller's destination failed, or gave memory of the wrong kind.";
    DestinationTooSmall = "destination-too-small", "DestinationError", "STG_DESTINATION_TOO_SMALL":
        "The caller's destination is shorter than the tensor.";
    Selection = "selection", "SelectionError", "STG_SELECTION":
        "A selection names a tensor the checkpoint does not hold, or rows a tensor does not have.";
    InvalidOption = "invalid-option", "InvalidOptionError", "STG_INVALID_ARGUMENT":
        "An option's value is malformed, out of range, or inconsistent with the others; an unknown key; a backend and a device that do not go together.";
    BackendUnavailable = "backend-unavailable", "BackendUnavailableError", "STG_BACKEND_UNAVAILABLE":
        "The backend or device asked for cannot run here (no driver, no device, no library, not built in), or a GPU was asked for and none can be used.";
    Usage = "usage", "StagingError", "STG_INVALID_ARGUMENT":
        "A tensor's bytes cannot be had the way asked for (already taken, another path).";
    Resource = "resource", "ResourceError", "STG_RESOURCE":
        "The system refused a resource the load needs to run: its threads (a limit on processes or threads, memory for their stacks) or descriptors. The message names the limit.";
    Internal = "internal", "StagingError", "STG_INTERNAL":
        "An invariant of the library did not hold: a bug.";
}

impl ErrorKind {
    /// The kind of an operating-system error met while opening `path`-like things: not found
    /// and permission denied are their own kinds, anything else is `otherwise`.
    pub fn of_io(error: &std::io::Error, otherwise: ErrorKind) -> ErrorKind {
        match error.kind() {
            std::io::ErrorKind::NotFound => Self::NotFound,
            std::io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            _ => otherwise,
        }
    }
}

/// What each door makes of an error kind: the one table that the Python package (the exception
/// class it raises), the C library (the status it returns) and the generated reference
/// (`docs/reference/errors.md`) all read, so that no door keeps a mapping of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInDoors {
    /// The kind.
    pub kind: ErrorKind,
    /// What it means, one or two sentences for the reference.
    pub meaning: &'static str,
    /// The name of the exception class Python raises (every one derives from `StagingError`).
    pub python_class: &'static str,
    /// The name of the `stg_status` C returns.
    pub c_status: &'static str,
}

impl ErrorKind {
    /// The kind's row of [`KINDS_IN_DOORS`]: its Python class and C status.
    pub fn in_doors(self) -> &'static KindInDoors {
        // Every kind has its row at its place in `ALL` (the tests below); were one missing, the
        // kind would be shown as an internal error rather than panic.
        const INTERNAL: usize = ErrorKind::Internal as usize;
        KINDS_IN_DOORS
            .get(self as usize)
            .filter(|row| row.kind == self)
            .unwrap_or(&KINDS_IN_DOORS[INTERNAL])
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Io { source, .. } if out_of_descriptors(source) => ErrorKind::Resource,
            Self::Io { source, .. } => ErrorKind::of_io(source, ErrorKind::Io),
            Self::Open { source, .. } => match source {
                ReadError::Io(e) if out_of_descriptors(e) => ErrorKind::Resource,
                ReadError::Io(e) => ErrorKind::of_io(e, ErrorKind::Read),
                _ => ErrorKind::Read,
            },
            Self::Header { .. }
            | Self::Index { .. }
            | Self::DuplicateFile { .. }
            | Self::DuplicateTensor { .. }
            | Self::Truncated { .. } => ErrorKind::InvalidCheckpoint,
            Self::NotAFile { .. } | Self::NoCheckpoint { .. } => ErrorKind::NotACheckpoint,
            Self::Read { .. } | Self::FileChanged { .. } => ErrorKind::Read,
            Self::Allocation { .. } | Self::StagingBuffer { .. } => ErrorKind::DeviceAllocation,
            Self::HostAllocation { .. } => ErrorKind::HostAllocation,
            Self::Device { .. } => ErrorKind::Device,
            Self::Destination { .. } => ErrorKind::Destination,
            Self::DestinationTooSmall { .. } => ErrorKind::DestinationTooSmall,
            Self::UnknownTensor { .. } | Self::NothingSelected { .. } | Self::Rows { .. } => {
                ErrorKind::Selection
            }
            Self::Policy(_) => ErrorKind::InvalidOption,
            Self::Resource { .. } => ErrorKind::Resource,
            Self::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The file the error is about, where there is one.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            Self::Io { path, .. }
            | Self::Header { path, .. }
            | Self::Index { path, .. }
            | Self::NotAFile { path }
            | Self::NoCheckpoint { path }
            | Self::DuplicateFile { path } => Some(path),
            Self::DuplicateTensor { first, .. } => Some(first),
            Self::Open { file, .. }
            | Self::Read { file, .. }
            | Self::Truncated { file, .. }
            | Self::FileChanged { file, .. }
            | Self::Allocation { file, .. }
            | Self::StagingBuffer { file, .. }
            | Self::HostAllocation { file, .. }
            | Self::Device { file, .. }
            | Self::DestinationTooSmall { file, .. }
            | Self::Destination { file, .. }
            | Self::Rows { file, .. } => Some(file),
            Self::UnknownTensor { .. }
            | Self::NothingSelected { .. }
            | Self::Policy(_)
            | Self::Resource { .. }
            | Self::Internal(_) => None,
        }
    }

    /// The tensor the error is about, where there is one.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            Self::Read { tensor, .. }
            | Self::Truncated { tensor, .. }
            | Self::Allocation { tensor, .. }
            | Self::StagingBuffer { tensor, .. }
            | Self::HostAllocation { tensor, .. }
            | Self::Device { tensor, .. }
            | Self::DestinationTooSmall { tensor, .. }
            | Self::Destination { tensor, .. }
            | Self::Rows { tensor, .. } => Some(tensor),
            Self::DuplicateTensor { name, .. } | Self::UnknownTensor { name } => Some(name),
            _ => None,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn header(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Header {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn index(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Index {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_row_in_the_doors_table_at_its_place() {
        for (place, kind) in ErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, place, "{kind}");
            assert_eq!(KINDS_IN_DOORS[place].kind, kind);
            assert_eq!(kind.in_doors().kind, kind);
            let row = kind.in_doors();
            assert!(
                row.python_class.ends_with("Error"),
                "{kind}: {}",
                row.python_class
            );
            assert!(row.c_status.starts_with("STG_"), "{kind}: {}", row.c_status);
            assert!(row.meaning.ends_with('.'), "{kind}: {}", row.meaning);
        }
        // `in_doors` falls back on the last row, `Internal`'s.
        assert_eq!(ErrorKind::Internal as usize, ErrorKind::ALL.len() - 1);
    }

    #[test]
    fn no_thread_or_no_descriptor_is_a_resource_naming_the_limit() {
        let threads = Error::Resource {
            what: "4 I/O threads".into(),
            source: io::Error::from_raw_os_error(libc_codes::EAGAIN),
        };
        assert_eq!(threads.kind(), ErrorKind::Resource);
        let text = threads.to_string();
        assert!(text.starts_with("cannot start 4 I/O threads: resource temporarily unavailable"));
        assert!(
            text.contains("RLIMIT_NPROC") && text.contains("vm.max_map_count"),
            "{text}"
        );
        // No descriptor left, opening a file to read its header or its tensors.
        let emfile = || io::Error::from_raw_os_error(libc_codes::EMFILE);
        let header = Error::io("m.safetensors", emfile());
        let open = Error::Open {
            file: "m.safetensors".into(),
            source: ReadError::Io(emfile()),
        };
        assert_eq!(header.kind(), ErrorKind::Resource);
        assert_eq!(open.kind(), ErrorKind::Resource);
        // Other failures keep their kinds.
        let missing = Error::io("m", io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(missing.kind(), ErrorKind::NotFound);
    }
}
