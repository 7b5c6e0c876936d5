//! The exceptions: one base class, `StagingError`, and a subclass wherever a caller would branch.
//! The message is the one line `stage` prints after `stage: error: `.

use pyo3::exceptions::{PyException, PyKeyboardInterrupt, PySystemExit};
use pyo3::prelude::*;
use pyo3::{PyErr, create_exception};
use safetensors_staging::Error;
use staging_core::Error as CoreError;

create_exception!(
    safetensors_staging,
    StagingError,
    PyException,
    "Every error of safetensors_staging. The message is one line naming the file, and the \
     tensor and offset where there is one."
);
create_exception!(
    safetensors_staging,
    MalformedCheckpointError,
    StagingError,
    "The checkpoint is not valid safetensors (header, index, offsets, a file shorter than its \
     header says, a directory with no checkpoint)."
);
create_exception!(
    safetensors_staging,
    ReadError,
    StagingError,
    "A file could not be opened or read, or changed during the load."
);
create_exception!(
    safetensors_staging,
    BackendUnavailableError,
    StagingError,
    "The backend or device asked for cannot run here (no driver, no device, no library)."
);
create_exception!(
    safetensors_staging,
    OutOfMemoryError,
    StagingError,
    "An allocation failed where the policy had no fallback left (the host buffer, the staging \
     buffer)."
);
create_exception!(
    safetensors_staging,
    SelectionError,
    StagingError,
    "A selection names a tensor the checkpoint does not hold, or rows a tensor does not have."
);
create_exception!(
    safetensors_staging,
    DestinationError,
    StagingError,
    "The destination callback failed, or gave memory of the wrong device, layout or size."
);
create_exception!(
    safetensors_staging,
    UnsupportedDtypeError,
    StagingError,
    "The framework asked for has no dtype for this tensor (NumPy has no bfloat16 or float8)."
);

/// The one-line message of an error, as `stage` prints it.
pub(crate) fn line(error: &dyn std::error::Error) -> String {
    error.to_string().replace('\n', " ")
}

/// The Python exception for a library error.
pub(crate) fn to_py(error: Error) -> PyErr {
    let message = line(&error);
    match error {
        Error::Load(core) => core_to_py(core, message),
        Error::Backend { .. } | Error::NotBuilt(_) => BackendUnavailableError::new_err(message),
        Error::DestinationSpace { .. } => DestinationError::new_err(message),
        _ => StagingError::new_err(message),
    }
}

fn core_to_py(error: CoreError, message: String) -> PyErr {
    match error {
        CoreError::Header { .. }
        | CoreError::Index { .. }
        | CoreError::NotAFile { .. }
        | CoreError::NoCheckpoint { .. }
        | CoreError::DuplicateFile { .. }
        | CoreError::DuplicateTensor { .. }
        | CoreError::Truncated { .. } => MalformedCheckpointError::new_err(message),
        CoreError::Io { .. }
        | CoreError::Open { .. }
        | CoreError::Read { .. }
        | CoreError::FileChanged { .. }
        | CoreError::Device { .. } => ReadError::new_err(message),
        CoreError::Allocation { .. }
        | CoreError::StagingBuffer { .. }
        | CoreError::HostAllocation { .. } => OutOfMemoryError::new_err(message),
        CoreError::UnknownTensor { .. } | CoreError::Rows { .. } => {
            SelectionError::new_err(message)
        }
        CoreError::DestinationTooSmall { .. } => DestinationError::new_err(message),
        CoreError::Destination { source, .. } => match source.downcast::<PyErr>() {
            Ok(raised) => from_callback(*raised, message),
            Err(_) => DestinationError::new_err(message),
        },
        _ => StagingError::new_err(message),
    }
}

/// What the destination callback raised: re-raised as it was when it is ours or not an error
/// of the load (`KeyboardInterrupt`, `SystemExit`); otherwise a `DestinationError` naming the
/// tensor, caused by it.
fn from_callback(raised: PyErr, message: String) -> PyErr {
    Python::attach(|py| {
        if raised.is_instance_of::<StagingError>(py)
            || raised.is_instance_of::<PyKeyboardInterrupt>(py)
            || raised.is_instance_of::<PySystemExit>(py)
        {
            return raised;
        }
        let wrapped = DestinationError::new_err(message);
        wrapped.set_cause(py, Some(raised));
        wrapped
    })
}

/// Adds the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("StagingError", py.get_type::<StagingError>())?;
    module.add(
        "MalformedCheckpointError",
        py.get_type::<MalformedCheckpointError>(),
    )?;
    module.add("ReadError", py.get_type::<ReadError>())?;
    module.add(
        "BackendUnavailableError",
        py.get_type::<BackendUnavailableError>(),
    )?;
    module.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    module.add("SelectionError", py.get_type::<SelectionError>())?;
    module.add("DestinationError", py.get_type::<DestinationError>())?;
    module.add(
        "UnsupportedDtypeError",
        py.get_type::<UnsupportedDtypeError>(),
    )?;
    Ok(())
}
