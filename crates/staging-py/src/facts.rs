//! What the Python layer asks the library instead of deciding again: which tensors and rows a
//! load with given keywords keeps (`_select`), whether a path is a URL and which store reads it
//! (`_is_url`, `_url_store`), what a device spelling means (`_device`), and every dtype of the
//! format with its bits and its names in torch, NumPy and `ml_dtypes` (`_DTYPES`).

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use safetensors_staging::remote::{Scheme, hub, redacted_text};
use safetensors_staging::{Dtype, LoadOptions, Selection};

use crate::errors;
use crate::info::{PyCheckpoint, read_headers};
use crate::options::{Keywords, spelling};
use crate::tensor_info::TensorInfo;

/// `_select(paths, **keywords)`: the checkpoint's headers (every tensor, whole) and the tensors a
/// load with these keywords keeps, in file order, each narrowed as the load narrows it (shape,
/// bytes, offset and `rows` of the rows kept). `select` and `rows` mean what they mean to
/// `stage` (globs, names that must exist, functions); the remote keywords apply to a URL.
#[pyfunction]
#[pyo3(name = "_select", signature = (paths, **kwargs))]
pub(crate) fn select(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<(PyCheckpoint, Vec<TensorInfo>)> {
    let mut keywords = Keywords::parse(kwargs)?;
    let checkpoint = read_headers(py, &keywords.options, paths)?;
    // As `_stage` chooses: functions applied to these headers, nothing chosen loading nothing.
    keywords.apply_functions(&checkpoint, &HashMap::new())?;
    let selection = if keywords.select_none {
        Selection::names(Vec::<String>::new())
    } else {
        keywords.options.selection().map_err(errors::to_py)?
    };
    let kept = checkpoint
        .select(&selection)
        .map_err(|e| errors::to_py(e.into()))?;
    let infos = kept.tensors().iter().map(TensorInfo::new).collect();
    Ok((PyCheckpoint::new(checkpoint), infos))
}

/// `_is_url(path)`: whether the library takes `path` for a URL (`scheme://...`) rather than a
/// local path, whatever the scheme.
#[pyfunction]
#[pyo3(name = "_is_url")]
pub(crate) fn is_url(path: PathBuf) -> bool {
    safetensors_staging::is_url(&path)
}

/// `_is_repo_id(name)`: whether `name` is a Hugging Face Hub repository id (`org/name` or
/// `name`) by the library's rules, which are `huggingface_hub`'s.
#[pyfunction]
#[pyo3(name = "_is_repo_id")]
pub(crate) fn is_repo_id(name: &str) -> bool {
    hub::is_repo_id(name)
}

/// `_hub_changes(path, since, **remote)`: which files of the Hub model at `path`
/// (`hf://org/name@new`) differ from those at the revision `since` of the same repository,
/// as `{"path": <path at the commit it names>, "commit", "since_path", "since": <its commit>,
/// "changed": [files], "compared": "hub" | "cache", "note": <why the cache> | None}`
/// (`safetensors_staging::remote::hub::changes`).
#[pyfunction]
#[pyo3(name = "_hub_changes", signature = (path, since, **kwargs))]
pub(crate) fn hub_changes(
    py: Python<'_>,
    path: PathBuf,
    since: &str,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyDict>> {
    let keywords = Keywords::parse(kwargs)?;
    let (options, hub_options) = (
        keywords.options.remote_options(),
        keywords.options.hub_options(),
    );
    let changes = py
        .detach(|| hub::changes(&path, since, &options, &hub_options))
        .map_err(|e| errors::to_py(e.into()))?;
    let out = PyDict::new(py);
    out.set_item("path", changes.path)?;
    out.set_item("commit", changes.commit)?;
    out.set_item("since_path", changes.since_path)?;
    out.set_item("since", changes.since)?;
    out.set_item("changed", changes.changed)?;
    out.set_item("compared", changes.compared)?;
    out.set_item("note", changes.note)?;
    Ok(out.unbind())
}

/// `_hub_repository_path(file, commit)`: the path in the repository of a file a load of a
/// Hub model at `commit` reads (its `resolve` URL, or its path in the cache's snapshot), or
/// `None` for another file (`safetensors_staging::remote::hub::repository_path`).
#[pyfunction]
#[pyo3(name = "_hub_repository_path")]
pub(crate) fn hub_repository_path(file: PathBuf, commit: &str) -> Option<String> {
    hub::repository_path(&file, commit)
}

/// `_url_store(path)`: the kind of store the remote backend reads the URL `path` from (`"s3"`,
/// `"gcs"`, `"azure"`, `"http"`), or `None` when `path` is not a URL or is one of a scheme it
/// does not read.
#[pyfunction]
#[pyo3(name = "_url_store")]
pub(crate) fn url_store(path: PathBuf) -> Option<&'static str> {
    if !safetensors_staging::is_url(&path) {
        return None;
    }
    let (scheme, _) = path.to_str()?.split_once("://")?;
    if safetensors_staging::is_hub(&path) {
        return Some("hub");
    }
    Some(match Scheme::of(scheme)? {
        Scheme::S3 => "s3",
        Scheme::Gcs => "gcs",
        Scheme::Azure => "azure",
        Scheme::Http => "http",
    })
}

/// `_redacted(text)`: `text` with every URL in it shown as the library shows one, without a
/// login or a query (for a message Python writes itself).
#[pyfunction]
#[pyo3(name = "_redacted")]
pub(crate) fn redacted(text: &str) -> String {
    redacted_text(text)
}

/// `_device(device)`: the device the library reads from a spelling (`"cuda:1"`, `1`, a
/// `torch.device`, ...), as `(canonical spelling, GPU ordinal or None)`: `("cuda:1", 1)`,
/// `("hip:0", 0)`, `("cpu", None)`, `("auto", None)`. A spelling it does not take is the
/// `InvalidOptionError` a load would raise.
#[pyfunction]
#[pyo3(name = "_device")]
pub(crate) fn device(value: &Bound<'_, PyAny>) -> PyResult<(String, Option<usize>)> {
    let mut options = LoadOptions::new();
    options
        .set("device", &spelling(value)?)
        .map_err(errors::to_py)?;
    Ok((options.device.to_string(), options.device.gpu_index()))
}

/// One dtype of the format: its name, its bits per element (the `safetensors` crate's), and its
/// name in each framework that has it.
#[pyclass(module = "safetensors_staging._native", name = "_Dtype", frozen)]
pub(crate) struct DtypeFacts {
    /// The name the format writes (`"BF16"`).
    #[pyo3(get)]
    name: String,
    /// Bits per element (4 for `F4`, 6 for the `F6` dtypes).
    #[pyo3(get)]
    bits: usize,
    /// The `torch` dtype holding its values (`F4`: `float4_e2m1fn_x2`, two values per
    /// element), or `None`.
    #[pyo3(get)]
    torch: Option<&'static str>,
    /// NumPy's own dtype for it, or `None`.
    #[pyo3(get)]
    numpy: Option<&'static str>,
    /// The `ml_dtypes` dtype (NumPy's extension, which JAX uses) for one NumPy lacks, or `None`.
    #[pyo3(get)]
    ml_dtypes: Option<&'static str>,
}

#[pymethods]
impl DtypeFacts {
    fn __repr__(&self) -> String {
        format!(
            "_Dtype(name={:?}, bits={}, torch={:?}, numpy={:?}, ml_dtypes={:?})",
            self.name, self.bits, self.torch, self.numpy, self.ml_dtypes
        )
    }
}

/// Every dtype of the format with its names as `(torch, NumPy, ml_dtypes)`. `ml_dtypes` has
/// 4- and 6-bit dtypes too, but one value per byte, not the format's packed bits: `None`.
const FRAMEWORK_NAMES: &[(Dtype, [Option<&str>; 3])] = &[
    (Dtype::BOOL, [Some("bool"), Some("bool"), None]),
    (Dtype::U8, [Some("uint8"), Some("uint8"), None]),
    (Dtype::I8, [Some("int8"), Some("int8"), None]),
    (Dtype::I16, [Some("int16"), Some("int16"), None]),
    (Dtype::U16, [Some("uint16"), Some("uint16"), None]),
    (Dtype::F16, [Some("float16"), Some("float16"), None]),
    (Dtype::BF16, [Some("bfloat16"), None, Some("bfloat16")]),
    (Dtype::I32, [Some("int32"), Some("int32"), None]),
    (Dtype::U32, [Some("uint32"), Some("uint32"), None]),
    (Dtype::F32, [Some("float32"), Some("float32"), None]),
    (Dtype::C64, [Some("complex64"), Some("complex64"), None]),
    (Dtype::F64, [Some("float64"), Some("float64"), None]),
    (Dtype::I64, [Some("int64"), Some("int64"), None]),
    (Dtype::U64, [Some("uint64"), Some("uint64"), None]),
    (
        Dtype::F8_E5M2,
        [Some("float8_e5m2"), None, Some("float8_e5m2")],
    ),
    (
        Dtype::F8_E4M3,
        [Some("float8_e4m3fn"), None, Some("float8_e4m3fn")],
    ),
    (
        Dtype::F8_E8M0,
        [Some("float8_e8m0fnu"), None, Some("float8_e8m0fnu")],
    ),
    (
        Dtype::F8_E4M3FNUZ,
        [Some("float8_e4m3fnuz"), None, Some("float8_e4m3fnuz")],
    ),
    (
        Dtype::F8_E5M2FNUZ,
        [Some("float8_e5m2fnuz"), None, Some("float8_e5m2fnuz")],
    ),
    (Dtype::F4, [Some("float4_e2m1fn_x2"), None, None]),
    (Dtype::F6_E2M3, [None, None, None]),
    (Dtype::F6_E3M2, [None, None, None]),
];

/// `_DTYPES`: name -> `_Dtype`, for every dtype of the format.
fn dtypes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let table = PyDict::new(py);
    for &(dtype, [torch, numpy, ml_dtypes]) in FRAMEWORK_NAMES {
        let facts = DtypeFacts {
            name: dtype.to_string(),
            bits: dtype.bitsize(),
            torch,
            numpy,
            ml_dtypes,
        };
        table.set_item(dtype.to_string(), Py::new(py, facts)?)?;
    }
    Ok(table)
}

/// Adds the functions and the dtype table to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<DtypeFacts>()?;
    module.add_function(wrap_pyfunction!(select, module)?)?;
    module.add_function(wrap_pyfunction!(is_url, module)?)?;
    module.add_function(wrap_pyfunction!(is_repo_id, module)?)?;
    module.add_function(wrap_pyfunction!(hub_changes, module)?)?;
    module.add_function(wrap_pyfunction!(hub_repository_path, module)?)?;
    module.add_function(wrap_pyfunction!(url_store, module)?)?;
    module.add_function(wrap_pyfunction!(redacted, module)?)?;
    module.add_function(wrap_pyfunction!(device, module)?)?;
    module.add("_DTYPES", dtypes(module.py())?)
}
