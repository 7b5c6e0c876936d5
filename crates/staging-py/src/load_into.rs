//! `_load_into(...)`: a checkpoint read into memory the caller already holds (a model's
//! weights, in place), in one call over [`Loader::load_files_into_raw`]: no Python between
//! two tensors. The Python layer (`_load_into.py`) checks the targets against the headers
//! first (names, shapes, dtypes, tied weights, overlaps) and passes each target's address and
//! length; the library checks the lengths again, and each tensor again as the load reaches it.
//!
//! The GIL is released for the whole load; a Ctrl-C stops it before the next target, and the
//! pending `KeyboardInterrupt` is what is raised. A failure after writing began raises the
//! cause with three more attributes, `written`, `partly_written` and `unchanged` (the names
//! in each state), which the Python layer turns into its `PartialLoadError`.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use safetensors_staging::{Dtype, Error, JsonReport, RawTarget};

use crate::errors;
use crate::info::interrupted_or;
use crate::interrupt::Calls;
use crate::lock::locked;
use crate::options::Keywords;

/// Reads the checkpoint at `paths` into `targets` (`(name, address, bytes, dtype, shape)`:
/// memory of the space the load's device is, and the dtype (as the checkpoint spells it) and
/// shape the checkpoint's tensor was checked to have, checked again as the load reaches it),
/// every other keyword an option of the library. Returns the names written, in order, and the
/// load's report as JSON.
///
/// The caller keeps every target's memory alive, writable and untouched by anything else until
/// this returns (the Python layer holds the tensors); targets must not overlap.
///
/// `_between`, for the tests: called (with the GIL) before each target is written; a true
/// result stops the load there as a Ctrl-C does, and an exception stops it and is what is
/// raised (with the three attributes once writing began).
#[pyfunction]
#[pyo3(name = "_load_into", signature = (paths, targets, *, _between=None, **kwargs))]
pub(crate) fn load_into(
    py: Python<'_>,
    mut paths: Vec<PathBuf>,
    targets: Vec<(String, usize, usize, String, Vec<usize>)>,
    _between: Option<Py<PyAny>>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Vec<String>, String)> {
    let mut keywords = Keywords::parse(kwargs)?;
    let mut loader = keywords.options.loader().map_err(errors::to_py)?;
    let calls = Arc::new(Calls::default());
    if let Some(interrupt) = calls.interrupt_for(&paths) {
        loader = loader.interrupt(interrupt);
    }
    let call = calls.enter();
    if keywords.has_functions() {
        // `rows` as a function of each tensor: the headers first, for it to see them.
        let (read, headers) = py.detach(move || {
            let headers = loader.read_headers(&paths);
            ((loader, paths), headers)
        });
        let checkpoint = headers.map_err(|e| interrupted_or(py, e))?;
        keywords.apply_functions(&checkpoint, &HashMap::new())?;
        let selection = keywords.options.selection().map_err(errors::to_py)?;
        (loader, paths) = (read.0.select(selection), read.1);
    }
    let mut raw = BTreeMap::new();
    for (name, addr, len, dtype, shape) in targets {
        // The safetensors crate's own spelling of its dtypes (`"BF16"`).
        let dtype = serde_json::from_value::<Dtype>(serde_json::Value::String(dtype.clone()))
            .map_err(|_| PyValueError::new_err(format!("target {name:?}: no dtype {dtype:?}")))?;
        let target = RawTarget {
            addr,
            len,
            dtype: Some(dtype),
            shape: Some(shape),
        };
        if raw.insert(name.clone(), target).is_some() {
            return Err(PyValueError::new_err(format!(
                "target {name:?} given twice"
            )));
        }
    }
    let ctrl_c = calls.ctrl_c();
    // What `_between` raised: it stopped the load, and is what is raised.
    let raised: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let raised_in_stop = Arc::clone(&raised);
    let stop = move || {
        ctrl_c()
            || _between.as_ref().is_some_and(|between| {
                Python::attach(|py| match between.call0(py) {
                    Ok(stop) => stop.is_truthy(py).unwrap_or(true),
                    Err(error) => {
                        *locked(&raised_in_stop) = Some(error);
                        true
                    }
                })
            })
    };
    let outcome = py.detach(move || {
        // SAFETY: the targets are the caller's memory, alive, writable and untouched until
        // this returns, and not overlapping (this function's contract, kept by the Python
        // layer, which checked the overlaps and holds the tensors).
        unsafe { loader.load_files_into_raw(&paths, raw, false, &stop) }
    });
    drop(call);
    match outcome {
        Ok(done) => {
            let report = serde_json::to_string(&JsonReport {
                report: done.report,
                tensor_list: Vec::new(),
            })
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
            Ok((done.written, report))
        }
        Err(Error::PartialLoad {
            source,
            written,
            partly_written,
            unchanged,
        }) => {
            let error = locked(&raised)
                .take()
                .unwrap_or_else(|| interrupted_or(py, *source));
            let value = error.value(py);
            value.setattr("written", written)?;
            value.setattr("partly_written", partly_written)?;
            value.setattr("unchanged", unchanged)?;
            Err(error)
        }
        Err(error) => Err(locked(&raised)
            .take()
            .unwrap_or_else(|| interrupted_or(py, error))),
    }
}
