//! The exceptions: one base class, `StagingError`, and a subclass wherever a caller would branch,
//! chosen from the library's classification of the error (`Error::kind()`, the same C's statuses
//! come from). Where Python has a builtin for the failure, the class derives from it too:
//! `PathNotFoundError` is a `FileNotFoundError`, `PathPermissionError` a `PermissionError`,
//! `OutOfMemoryError` a `MemoryError`, `InvalidOptionError` a `ValueError`,
//! `UnsupportedDtypeError` a `TypeError` (as NumPy's "data type not understood"). Every exception
//! carries `kind`, the kind's name: each class has its own as a class attribute (so an exception
//! the Python layer raises, `raise SelectionError("...")`, carries it too), and one made from a
//! library error has the error's own (`OutOfMemoryError` is `device-allocation` or
//! `host-allocation`). The message is the one line `stage` prints after `stage: error: `.

use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyKeyboardInterrupt, PyMemoryError, PyPermissionError,
    PyRuntimeError, PySystemExit, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::{PyErr, create_exception};
use safetensors_staging::{Error, ErrorKind};
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
    DeviceError,
    StagingError,
    "A device operation (a memory query, a copy) failed."
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

/// The one-line message of an error, as `stage` prints it.
pub(crate) fn line(error: &dyn std::error::Error) -> String {
    error.to_string().replace('\n', " ")
}

/// The classes that also derive from a builtin exception, so that `except FileNotFoundError`,
/// `except MemoryError` and `except ValueError` catch what a Python user expects them to. Made
/// when the module is imported (`register`).
struct WithBuiltins {
    not_found: Py<PyType>,
    permission: Py<PyType>,
    out_of_memory: Py<PyType>,
    invalid_option: Py<PyType>,
    unsupported_dtype: Py<PyType>,
}

static WITH_BUILTINS: PyOnceLock<WithBuiltins> = PyOnceLock::new();

/// `class name(*bases)` with `doc`, in module `safetensors_staging`.
fn class(
    py: Python<'_>,
    name: &str,
    bases: &[Bound<'_, PyType>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", "safetensors_staging")?;
    namespace.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, bases)?;
    let made = py
        .get_type::<PyType>()
        .call1((name, bases, namespace))?
        .cast_into::<PyType>()?;
    Ok(made.unbind())
}

fn with_builtins(py: Python<'_>) -> PyResult<&WithBuiltins> {
    WITH_BUILTINS.get_or_try_init(py, || {
        Ok(WithBuiltins {
            not_found: class(
                py,
                "PathNotFoundError",
                &[
                    py.get_type::<ReadError>(),
                    py.get_type::<PyFileNotFoundError>(),
                ],
                "A path (a file, a directory, an object) does not exist.",
            )?,
            permission: class(
                py,
                "PathPermissionError",
                &[
                    py.get_type::<ReadError>(),
                    py.get_type::<PyPermissionError>(),
                ],
                "A path may not be opened by this process.",
            )?,
            out_of_memory: class(
                py,
                "OutOfMemoryError",
                &[
                    py.get_type::<StagingError>(),
                    py.get_type::<PyMemoryError>(),
                ],
                "An allocation failed where the policy had no fallback left (the host buffer, \
                 the staging buffer).",
            )?,
            invalid_option: class(
                py,
                "InvalidOptionError",
                &[py.get_type::<StagingError>(), py.get_type::<PyValueError>()],
                "An option's value does not parse or does not go with the others (a size, a \
                 device, a backend and a device that do not go together).",
            )?,
            unsupported_dtype: class(
                py,
                "UnsupportedDtypeError",
                &[py.get_type::<StagingError>(), py.get_type::<PyTypeError>()],
                "The framework asked for has no dtype for this tensor (NumPy has no bfloat16 or \
                 float8).",
            )?,
        })
    })
}

/// The exception class of each kind of error (C's statuses are derived from the same kinds).
pub(crate) fn class_of(py: Python<'_>, kind: ErrorKind) -> Bound<'_, PyType> {
    let special = with_builtins(py).ok().and_then(|classes| match kind {
        ErrorKind::NotFound => Some(&classes.not_found),
        ErrorKind::PermissionDenied => Some(&classes.permission),
        ErrorKind::DeviceAllocation | ErrorKind::HostAllocation => Some(&classes.out_of_memory),
        ErrorKind::InvalidOption => Some(&classes.invalid_option),
        _ => None,
    });
    if let Some(class) = special {
        return class.bind(py).clone();
    }
    match kind {
        ErrorKind::Io | ErrorKind::Read => py.get_type::<ReadError>(),
        ErrorKind::InvalidCheckpoint | ErrorKind::NotACheckpoint => {
            py.get_type::<MalformedCheckpointError>()
        }
        ErrorKind::Device => py.get_type::<DeviceError>(),
        ErrorKind::Destination | ErrorKind::DestinationTooSmall => {
            py.get_type::<DestinationError>()
        }
        ErrorKind::Selection => py.get_type::<SelectionError>(),
        ErrorKind::BackendUnavailable => py.get_type::<BackendUnavailableError>(),
        _ => py.get_type::<StagingError>(),
    }
}

/// The Python exception for a library error: its class from the error's kind, its message the
/// one line `stage` prints, and `kind` set to the kind's name (`"not-found"`, ...). What a
/// destination callback raised comes back as it was (see `from_callback`).
pub(crate) fn to_py(error: Error) -> PyErr {
    let message = line(&error);
    let kind = error.kind();
    if let Error::Load(CoreError::Destination { source, .. }) = error {
        return match source.downcast::<PyErr>() {
            Ok(raised) => from_callback(*raised, message),
            Err(_) => of_kind(kind, message),
        };
    }
    of_kind(kind, message)
}

/// An exception of `kind`'s class with `message`, its `kind` attribute set.
pub(crate) fn of_kind(kind: ErrorKind, message: String) -> PyErr {
    Python::attach(|py| {
        let error = PyErr::from_type(class_of(py, kind), (message,));
        // Setting an attribute on a fresh exception of our own classes does not fail; if it
        // did, the exception would still be the right one.
        let _ = error.value(py).setattr("kind", kind.as_str());
        error
    })
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
        let wrapped = of_kind(ErrorKind::Destination, message);
        wrapped.set_cause(py, Some(raised));
        wrapped
    })
}

/// The kind of `UnsupportedDtypeError`: a framework's limit, not a library error, so no
/// `ErrorKind` has it.
const UNSUPPORTED_DTYPE: &str = "unsupported-dtype";

/// Gives each class its `kind` as a class attribute: the kind it stands for (the first of its
/// kinds, for a class of several), which must be one of those `class_of` raises it for.
fn set_class_kinds(py: Python<'_>) -> PyResult<()> {
    let classes = with_builtins(py)?;
    let of_library = [
        (py.get_type::<StagingError>(), ErrorKind::Internal),
        (
            py.get_type::<MalformedCheckpointError>(),
            ErrorKind::InvalidCheckpoint,
        ),
        (py.get_type::<ReadError>(), ErrorKind::Read),
        (classes.not_found.bind(py).clone(), ErrorKind::NotFound),
        (
            classes.permission.bind(py).clone(),
            ErrorKind::PermissionDenied,
        ),
        (
            py.get_type::<BackendUnavailableError>(),
            ErrorKind::BackendUnavailable,
        ),
        (py.get_type::<DeviceError>(), ErrorKind::Device),
        (
            classes.invalid_option.bind(py).clone(),
            ErrorKind::InvalidOption,
        ),
        (
            classes.out_of_memory.bind(py).clone(),
            ErrorKind::DeviceAllocation,
        ),
        (py.get_type::<SelectionError>(), ErrorKind::Selection),
        (py.get_type::<DestinationError>(), ErrorKind::Destination),
    ];
    for (class, kind) in of_library {
        if !class_of(py, kind).is(&class) {
            return Err(PyRuntimeError::new_err(format!(
                "internal error: {} is given kind {:?}, which is raised as another class",
                class.name()?,
                kind.as_str()
            )));
        }
        class.setattr("kind", kind.as_str())?;
    }
    classes
        .unsupported_dtype
        .bind(py)
        .setattr("kind", UNSUPPORTED_DTYPE)
}

/// Adds the exception classes to the module, each with its `kind`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    set_class_kinds(py)?;
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
    module.add("DeviceError", py.get_type::<DeviceError>())?;
    let classes = with_builtins(py)?;
    module.add("PathNotFoundError", classes.not_found.bind(py))?;
    module.add("PathPermissionError", classes.permission.bind(py))?;
    module.add("OutOfMemoryError", classes.out_of_memory.bind(py))?;
    module.add("InvalidOptionError", classes.invalid_option.bind(py))?;
    module.add("SelectionError", py.get_type::<SelectionError>())?;
    module.add("DestinationError", py.get_type::<DestinationError>())?;
    module.add("UnsupportedDtypeError", classes.unsupported_dtype.bind(py))?;
    Ok(())
}
