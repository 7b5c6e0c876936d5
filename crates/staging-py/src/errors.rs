//! The exceptions: one base class, `StagingError`, and a subclass wherever a caller would branch,
//! chosen from the library's classification of the error (`Error::kind()`, the same C's statuses
//! come from). Where Python has a builtin for the failure, the class derives from it too:
//! `PathNotFoundError` is a `FileNotFoundError`, `PathPermissionError` a `PermissionError`,
//! `OutOfMemoryError` a `MemoryError`, `InvalidOptionError` a `ValueError`,
//! `UnsupportedDtypeError` a `TypeError` (as NumPy's "data type not understood"). Every exception
//! carries `kind`, the kind's name: each class has its own as a class attribute (so an exception
//! the Python layer raises, `raise SelectionError("...")`, carries it too), and one made from a
//! library error has the error's own (`OutOfMemoryError` is `device-allocation` or
//! `host-allocation`). The message is the one line `stage` prints after `stage: error: `;
//! `details` (a list of str) is the longer story behind it (`Error::details()`: each GPU backend
//! passed over and why), empty for most errors.
//!
//! Where the real `safetensors` package imports, `StagingError` also derives from
//! `safetensors.SafetensorError`, so that code which kept `from safetensors import
//! SafetensorError` (or catches it from a library built on `safetensors`) still catches every
//! error of this package. The classes are made when the module is imported (`register`), with
//! that base or without it; nothing else changes.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::PyErr;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyKeyboardInterrupt, PyMemoryError, PyOSError,
    PyPermissionError, PyRuntimeError, PySystemExit, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCFunction, PyDict, PyList, PyTuple, PyType};
use safetensors_staging::{Error, ErrorKind};
use staging_core::Error as CoreError;

/// The one-line message of an error, as `stage` prints it.
pub(crate) fn line(error: &dyn std::error::Error) -> String {
    error.to_string().replace('\n', " ")
}

/// The builtin exception a class derives from besides its parent in the package, so that
/// `except FileNotFoundError`, `except MemoryError` and `except ValueError` catch what a Python
/// user expects them to.
#[derive(Clone, Copy)]
enum Builtin {
    None,
    FileNotFound,
    Permission,
    Memory,
    Value,
    Type,
    Os,
}

impl Builtin {
    fn class(self, py: Python<'_>) -> Option<Bound<'_, PyType>> {
        Some(match self {
            Self::None => return None,
            Self::FileNotFound => py.get_type::<PyFileNotFoundError>(),
            Self::Permission => py.get_type::<PyPermissionError>(),
            Self::Memory => py.get_type::<PyMemoryError>(),
            Self::Value => py.get_type::<PyValueError>(),
            Self::Type => py.get_type::<PyTypeError>(),
            Self::Os => py.get_type::<PyOSError>(),
        })
    }
}

/// One exception class of the package.
struct Spec {
    /// The name the module exports it by (and the table of kinds spells).
    name: &'static str,
    /// Its parent in the package; `None` for `StagingError`, the root.
    parent: Option<&'static str>,
    builtin: Builtin,
    /// The kind it stands for (its `kind` class attribute): the first of its kinds, for a class
    /// of several; `None` for `UnsupportedDtypeError`, a framework's limit that no `ErrorKind`
    /// has.
    kind: Option<ErrorKind>,
    doc: &'static str,
}

/// Every exception class of the package, parents before their children, in the order the
/// module exports them: the one list the classes, their names and their kinds come from.
const SPECS: [Spec; 13] = [
    Spec {
        name: "StagingError",
        parent: None,
        builtin: Builtin::None,
        kind: Some(ErrorKind::Internal),
        doc: "Every error of safetensors_staging. The message is one line naming the file, and \
              the tensor and offset where there is one.",
    },
    Spec {
        name: "MalformedCheckpointError",
        parent: Some("StagingError"),
        builtin: Builtin::None,
        kind: Some(ErrorKind::InvalidCheckpoint),
        doc: "The checkpoint is not valid safetensors (header, index, offsets, a file shorter \
              than its header says, a directory with no checkpoint).",
    },
    Spec {
        name: "ReadError",
        parent: Some("StagingError"),
        builtin: Builtin::None,
        kind: Some(ErrorKind::Read),
        doc: "A file could not be opened or read, or changed during the load.",
    },
    Spec {
        name: "BackendUnavailableError",
        parent: Some("StagingError"),
        builtin: Builtin::None,
        kind: Some(ErrorKind::BackendUnavailable),
        doc: "The backend or device asked for cannot run here (no driver, no device, no \
              library).",
    },
    Spec {
        name: "DeviceError",
        parent: Some("StagingError"),
        builtin: Builtin::None,
        kind: Some(ErrorKind::Device),
        doc: "A device operation (a memory query, a copy) failed.",
    },
    Spec {
        name: "PathNotFoundError",
        parent: Some("ReadError"),
        builtin: Builtin::FileNotFound,
        kind: Some(ErrorKind::NotFound),
        doc: "A path (a file, a directory, an object) does not exist.",
    },
    Spec {
        name: "PathPermissionError",
        parent: Some("ReadError"),
        builtin: Builtin::Permission,
        kind: Some(ErrorKind::PermissionDenied),
        doc: "A path may not be opened by this process.",
    },
    Spec {
        name: "OutOfMemoryError",
        parent: Some("StagingError"),
        builtin: Builtin::Memory,
        kind: Some(ErrorKind::DeviceAllocation),
        doc: "An allocation failed where the policy had no fallback left (the host buffer, the \
              staging buffer).",
    },
    Spec {
        name: "InvalidOptionError",
        parent: Some("StagingError"),
        builtin: Builtin::Value,
        kind: Some(ErrorKind::InvalidOption),
        doc: "An option's value does not parse or does not go with the others (a size, a \
              device, a backend and a device that do not go together).",
    },
    Spec {
        name: "SelectionError",
        parent: Some("StagingError"),
        builtin: Builtin::None,
        kind: Some(ErrorKind::Selection),
        doc: "A selection names a tensor the checkpoint does not hold, or rows a tensor does \
              not have.",
    },
    Spec {
        name: "DestinationError",
        parent: Some("StagingError"),
        builtin: Builtin::None,
        kind: Some(ErrorKind::Destination),
        doc: "The destination callback failed, or gave memory of the wrong device, layout or \
              size.",
    },
    Spec {
        name: "UnsupportedDtypeError",
        parent: Some("StagingError"),
        builtin: Builtin::Type,
        kind: None,
        doc: "The framework asked for has no dtype for this tensor (NumPy has no bfloat16 or \
              float8).",
    },
    Spec {
        name: "ResourceError",
        parent: Some("StagingError"),
        builtin: Builtin::Os,
        kind: Some(ErrorKind::Resource),
        doc: "The system refused a resource the load needs to run: its threads (a limit on \
              processes or threads, memory for their stacks) or descriptors; `errno` is the \
              system's code.",
    },
];

/// The classes of [`SPECS`], made when the module is imported (`register`), in its order.
struct Classes(Vec<Py<PyType>>);

impl Classes {
    /// The class of this name, as the table of kinds spells it.
    fn named(&self, name: &str) -> Option<&Py<PyType>> {
        let at = SPECS.iter().position(|spec| spec.name == name)?;
        self.0.get(at)
    }

    fn named_or_bug(&self, name: &str) -> PyResult<&Py<PyType>> {
        self.named(name)
            .ok_or_else(|| PyRuntimeError::new_err(format!("no exception class {name}")))
    }
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// Set while `safetensors` is being imported for its `SafetensorError`: an import shim that maps
/// the name `safetensors` to this package would come back here, and must find no base rather
/// than import again (or initialize `CLASSES` from inside its own initialization).
static LOOKING_UP_UPSTREAM: AtomicBool = AtomicBool::new(false);

/// `safetensors.SafetensorError`, where the real `safetensors` package imports and has it:
/// an exception class that is not one of ours (a shim that maps `safetensors` to this package
/// gives ours, or a module still being imported without it). Any failure means none.
fn upstream_error(py: Python<'_>) -> Option<Bound<'_, PyType>> {
    if LOOKING_UP_UPSTREAM.swap(true, Ordering::SeqCst) {
        return None;
    }
    let found = || -> Option<Bound<'_, PyType>> {
        let class = py
            .import("safetensors")
            .ok()?
            .getattr("SafetensorError")
            .ok()?
            .cast_into::<PyType>()
            .ok()?;
        if !class.is_subclass_of::<PyException>().ok()? {
            return None;
        }
        let module: String = class.getattr("__module__").ok()?.extract().ok()?;
        let ours = module == "safetensors_staging" || module.starts_with("safetensors_staging.");
        (!ours).then_some(class)
    };
    let found = found();
    LOOKING_UP_UPSTREAM.store(false, Ordering::SeqCst);
    found
}

/// `class name(*bases)` with `doc`, in module `safetensors_staging`, and the other `namespace`
/// entries given.
fn class(
    py: Python<'_>,
    name: &str,
    bases: &[&Bound<'_, PyType>],
    doc: &str,
    namespace: Option<Bound<'_, PyDict>>,
) -> PyResult<Py<PyType>> {
    let namespace = namespace.unwrap_or_else(|| PyDict::new(py));
    namespace.set_item("__module__", "safetensors_staging")?;
    namespace.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, bases)?;
    let made = py
        .get_type::<PyType>()
        .call1((name, bases, namespace))?
        .cast_into::<PyType>()?;
    Ok(made.unbind())
}

/// `details` for an exception that was given none (one the Python layer raises): an empty
/// list, its own, made on first use (`functools.cached_property`: an instance's `details`, set
/// when it is made from a library error, comes first).
fn no_details(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let empty = PyCFunction::new_closure(
        py,
        Some(c"details"),
        Some(c"The longer story behind the message, one str a line; empty for most errors."),
        |args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>| -> Py<PyList> {
            PyList::empty(args.py()).unbind()
        },
    )?;
    py.import("functools")?
        .getattr("cached_property")?
        .call1((empty,))
}

fn make(py: Python<'_>, upstream: Option<&Bound<'_, PyType>>) -> PyResult<Classes> {
    let exception = py.get_type::<PyException>();
    let mut made = Classes(Vec::with_capacity(SPECS.len()));
    for spec in &SPECS {
        let mut bases: Vec<Bound<'_, PyType>> = Vec::with_capacity(2);
        let namespace = match spec.parent {
            // The root: `safetensors.SafetensorError` where it imports, and `details`.
            None => {
                bases.push(upstream.unwrap_or(&exception).clone());
                let namespace = PyDict::new(py);
                namespace.set_item("details", no_details(py)?)?;
                Some(namespace)
            }
            Some(parent) => {
                bases.push(made.named_or_bug(parent)?.bind(py).clone());
                None
            }
        };
        bases.extend(spec.builtin.class(py));
        let bases: Vec<&Bound<'_, PyType>> = bases.iter().collect();
        let class = class(py, spec.name, &bases, spec.doc, namespace)?;
        made.0.push(class);
    }
    Ok(made)
}

/// The classes, made on first use: `safetensors` is looked up before, not inside, the
/// initialization (which must not run twice at once).
fn classes(py: Python<'_>) -> PyResult<&Classes> {
    if let Some(made) = CLASSES.get(py) {
        return Ok(made);
    }
    let upstream = upstream_error(py);
    CLASSES.get_or_try_init(py, || make(py, upstream.as_ref()))
}

/// `StagingError` itself.
pub(crate) fn staging_class(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    Ok(classes(py)?.named_or_bug("StagingError")?.bind(py).clone())
}

/// The exception class of each kind of error, as the library's table of kinds names it
/// (`KINDS_IN_DOORS`, which C's statuses and the reference read too).
pub(crate) fn class_of(py: Python<'_>, kind: ErrorKind) -> PyResult<Bound<'_, PyType>> {
    let classes = classes(py)?;
    let name = kind.in_doors().python_class;
    let class = classes.named(name).ok_or_else(|| {
        // A row naming a class this module does not make: a bug (tests/doors/test_option_table.py
        // raises every kind's class through `_native._error_class`).
        PyRuntimeError::new_err(format!("error kind {kind}: no exception class {name}"))
    })?;
    Ok(class.bind(py).clone())
}

/// The class `class_of` gives a kind's name, for the tests: every row of the table names a class
/// this module makes.
#[pyfunction]
pub(crate) fn _error_class<'py>(py: Python<'py>, kind: &str) -> PyResult<Bound<'py, PyType>> {
    let kind = ErrorKind::ALL
        .into_iter()
        .find(|k| k.as_str() == kind)
        .ok_or_else(|| PyValueError::new_err(format!("no error kind {kind}")))?;
    class_of(py, kind)
}

/// The Python exception for a library error: its class from the error's kind, its message the
/// one line `stage` prints, `kind` set to the kind's name (`"not-found"`, ...) and `details` to
/// the error's details. What a destination callback raised comes back as it was (see
/// `from_callback`).
pub(crate) fn to_py(error: Error) -> PyErr {
    let message = line(&error);
    let kind = error.kind();
    let details = error.details().to_vec();
    if kind == ErrorKind::Resource {
        let code = match &error {
            Error::Load(
                CoreError::Resource { source, .. }
                | CoreError::Io { source, .. }
                | CoreError::Open {
                    source: staging_core::ReadError::Io(source),
                    ..
                },
            ) => source.raw_os_error(),
            _ => None,
        };
        let raised = with_details(kind, message, details);
        // The system's code, as an `OSError` carries it.
        if let Some(code) = code {
            Python::attach(|py| {
                let _ = raised.value(py).setattr("errno", code);
            });
        }
        return raised;
    }
    if let Error::Load(CoreError::Destination { source, .. }) = error {
        return match source.downcast::<PyErr>() {
            Ok(raised) => from_callback(*raised, message),
            Err(_) => with_details(kind, message, details),
        };
    }
    with_details(kind, message, details)
}

/// An exception of `kind`'s class with `message`, its `kind` attribute set (`details` empty).
pub(crate) fn of_kind(kind: ErrorKind, message: String) -> PyErr {
    with_details(kind, message, Vec::new())
}

/// A `StagingError` with `message` (kind `internal`): a misuse the library has no error for
/// (a handle used after it was closed).
pub(crate) fn staging(message: impl Into<String>) -> PyErr {
    of_kind(ErrorKind::Internal, message.into())
}

/// An exception of `kind`'s class with `message`, its `kind` and `details` attributes set.
fn with_details(kind: ErrorKind, message: String, details: Vec<String>) -> PyErr {
    Python::attach(|py| {
        let class = match class_of(py, kind) {
            Ok(class) => class,
            Err(error) => return error,
        };
        let error = PyErr::from_type(class, (message,));
        // Setting an attribute on a fresh exception of our own classes does not fail; if it
        // did, the exception would still be the right one.
        let value = error.value(py);
        let _ = value.setattr("kind", kind.as_str());
        let _ = value.setattr("details", details);
        error
    })
}

/// What the destination callback raised: re-raised as it was when it is ours or not an error
/// of the load (`KeyboardInterrupt`, `SystemExit`); otherwise a `DestinationError` naming the
/// tensor, caused by it.
fn from_callback(raised: PyErr, message: String) -> PyErr {
    Python::attach(|py| {
        let ours = staging_class(py).is_ok_and(|staging| raised.is_instance(py, &staging));
        if ours
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
fn set_class_kinds(py: Python<'_>, classes: &Classes) -> PyResult<()> {
    for (spec, class) in SPECS.iter().zip(&classes.0) {
        let class = class.bind(py);
        let Some(kind) = spec.kind else {
            class.setattr("kind", UNSUPPORTED_DTYPE)?;
            continue;
        };
        if !class_of(py, kind)?.is(class) {
            return Err(PyRuntimeError::new_err(format!(
                "internal error: {} is given kind {:?}, which is raised as another class",
                class.name()?,
                kind.as_str()
            )));
        }
        class.setattr("kind", kind.as_str())?;
    }
    Ok(())
}

/// Adds the exception classes to the module, each with its `kind`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let classes = classes(py)?;
    set_class_kinds(py, classes)?;
    module.add_function(wrap_pyfunction!(_error_class, module)?)?;
    for (spec, class) in SPECS.iter().zip(&classes.0) {
        module.add(spec.name, class.bind(py))?;
    }
    Ok(())
}
