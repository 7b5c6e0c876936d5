//! Metadata without loading: `open(path)` gives a `Checkpoint` of `TensorInfo`s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use safetensors_staging::{Checkpoint, Plan};

use crate::errors;
use crate::interrupt::Calls;
use crate::options::Keywords;
use crate::tensor_info::{FileName, TensorInfo};

/// A checkpoint's headers, read and checked, with nothing loaded: what `open(path)` returns.
/// Works as a context manager, like `safetensors.safe_open`.
#[pyclass(module = "safetensors_staging", name = "Checkpoint", frozen)]
pub(crate) struct PyCheckpoint {
    checkpoint: Checkpoint,
}

/// A pending `KeyboardInterrupt` (Ctrl-C stopped a remote read), else `error`.
pub(crate) fn interrupted_or(py: Python<'_>, error: safetensors_staging::Error) -> PyErr {
    match py.check_signals() {
        Err(interrupted) => interrupted,
        Ok(()) => errors::to_py(error),
    }
}

impl PyCheckpoint {
    pub(crate) fn new(checkpoint: Checkpoint) -> Self {
        Self { checkpoint }
    }
}

#[pymethods]
impl PyCheckpoint {
    /// The tensor names, in file order.
    fn keys(&self) -> Vec<String> {
        self.checkpoint
            .tensors()
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    /// Every tensor's metadata, in file order.
    fn tensors(&self) -> Vec<TensorInfo> {
        self.checkpoint
            .tensors()
            .iter()
            .map(TensorInfo::new)
            .collect()
    }

    /// The first file's `__metadata__` (like `safe_open(...).metadata()`), or `None`.
    fn metadata(&self) -> Option<BTreeMap<String, String>> {
        self.checkpoint.metadata().cloned()
    }

    /// The checkpoint's files, in load order.
    #[getter]
    fn files(&self) -> Vec<FileName> {
        self.checkpoint
            .files()
            .iter()
            .map(|f| FileName::of(&f.path))
            .collect()
    }

    /// Every file's `__metadata__`, by file.
    fn file_metadata(&self) -> Vec<(FileName, Option<BTreeMap<String, String>>)> {
        self.checkpoint
            .files()
            .iter()
            .map(|f| (FileName::of(&f.path), f.metadata.clone()))
            .collect()
    }

    /// The partition plan for a group of `ranks`: `(fingerprint, pieces)`, each piece
    /// `(name, offset, len, owner, rows)` in checkpoint order (`rows` `(start, end)` for a
    /// tensor split between ranks, else `None`). The same on every rank.
    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        ranks: usize,
    ) -> PyResult<(
        u64,
        Vec<(String, usize, usize, usize, Option<(usize, usize)>)>,
    )> {
        let plan = Plan::new(&self.checkpoint, ranks).map_err(|e| errors::to_py(e.into()))?;
        let pieces = plan
            .pieces()
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.offset,
                    p.len,
                    p.owner,
                    p.rows.as_ref().map(|r| (r.start, r.end)),
                )
            })
            .collect();
        Ok((plan.fingerprint(), pieces))
    }

    /// The bytes of every tensor together.
    #[getter]
    fn total_bytes(&self) -> u64 {
        self.checkpoint.total_bytes()
    }

    fn __len__(&self) -> usize {
        self.checkpoint.tensors().len()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.checkpoint.tensor(name).is_some()
    }

    fn __getitem__(&self, name: &str) -> PyResult<TensorInfo> {
        self.checkpoint
            .tensor(name)
            .map(TensorInfo::new)
            .ok_or_else(|| PyKeyError::new_err(name.to_owned()))
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let names = pyo3::types::PyList::new(py, self.keys())?;
        Ok(names.try_iter()?.into_any().unbind())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Checkpoint({} tensors, {} bytes, {} files)",
            self.checkpoint.tensors().len(),
            self.checkpoint.total_bytes(),
            self.checkpoint.files().len()
        )
    }
}

/// `open(path)`: the checkpoint's metadata, nothing loaded. The keywords are `stage`'s (those
/// for URLs matter here: `concurrency`, `range_size`, `retries`, `bandwidth`,
/// `store_options`).
#[pyfunction]
#[pyo3(name = "_open", signature = (paths, **kwargs))]
pub(crate) fn open(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyCheckpoint> {
    let keywords = Keywords::parse(kwargs)?;
    let checkpoint = read_headers(py, &keywords.options, paths)?;
    Ok(PyCheckpoint { checkpoint })
}

/// The headers of the checkpoint at `paths`, read with `options` (the remote ones for a URL)
/// as one call: the GIL released, a Ctrl-C during it ending its reads.
pub(crate) fn read_headers(
    py: Python<'_>,
    options: &safetensors_staging::LoadOptions,
    paths: Vec<PathBuf>,
) -> PyResult<Checkpoint> {
    let mut loader = options.loader().map_err(errors::to_py)?;
    let calls = Arc::new(Calls::default());
    if let Some(interrupt) = calls.interrupt_for(&paths) {
        loader = loader.interrupt(interrupt);
    }
    let _call = calls.enter();
    py.detach(move || loader.read_headers(&paths))
        .map_err(|e| interrupted_or(py, e))
}
