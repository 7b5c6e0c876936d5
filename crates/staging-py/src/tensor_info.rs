//! `TensorInfo`: one tensor's metadata as Python sees it (what `open(path)`, a `rows` function
//! and a destination callback are given), and a checkpoint file's name for Python.

use std::path::PathBuf;

use pyo3::prelude::*;
use safetensors_staging::TensorMeta;

/// A checkpoint file's name for Python: a `pathlib.Path`, or a `str` for a URL (a `Path` would
/// fold its `//`).
#[derive(Clone, IntoPyObject)]
pub(crate) enum FileName {
    /// A local file.
    Local(PathBuf),
    /// An object's URL.
    Url(String),
}

impl FileName {
    pub(crate) fn of(path: &std::path::Path) -> Self {
        match path.to_str() {
            Some(url) if safetensors_staging::is_url(path) => Self::Url(url.to_owned()),
            _ => Self::Local(path.to_path_buf()),
        }
    }
}

impl std::fmt::Display for FileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(path) => write!(f, "{}", path.display()),
            Self::Url(url) => f.write_str(url),
        }
    }
}

/// One tensor's metadata: name, dtype, shape, bytes, file and offset (and the rows, when a row
/// range narrowed it).
#[pyclass(module = "safetensors_staging", name = "TensorInfo", frozen)]
#[derive(Clone)]
pub(crate) struct TensorInfo {
    /// The tensor's name.
    #[pyo3(get)]
    name: String,
    /// Its dtype as the format writes it (`"BF16"`).
    #[pyo3(get)]
    dtype: String,
    /// Its shape.
    #[pyo3(get)]
    shape: Vec<usize>,
    /// Its length in bytes.
    #[pyo3(get)]
    nbytes: usize,
    /// The file that holds it (a `pathlib.Path`, or a `str` for a URL).
    #[pyo3(get)]
    file: FileName,
    /// The absolute offset of its first byte in the file.
    #[pyo3(get)]
    offset: u64,
    /// The rows of dimension 0 it covers, when only a range of them is loaded.
    #[pyo3(get)]
    rows: Option<(usize, usize)>,
}

impl TensorInfo {
    pub(crate) fn new(meta: &TensorMeta) -> Self {
        Self {
            name: meta.name.clone(),
            dtype: meta.dtype_name(),
            shape: meta.shape.clone(),
            nbytes: meta.len,
            file: FileName::of(&meta.file),
            offset: meta.offset,
            rows: meta.row_range.as_ref().map(|r| (r.start, r.end)),
        }
    }
}

#[pymethods]
impl TensorInfo {
    fn __repr__(&self) -> String {
        format!(
            "TensorInfo(name={:?}, dtype={}, shape={:?}, nbytes={}, file={:?}, offset={}{})",
            self.name,
            self.dtype,
            self.shape,
            self.nbytes,
            self.file.to_string(),
            self.offset,
            self.rows
                .map(|(a, b)| format!(", rows=({a}, {b})"))
                .unwrap_or_default()
        )
    }
}
