//! `_Reader`: what `safe_open` stands on. The backend is opened once, the headers read once,
//! and each `read(name, rows)` is one small load of one tensor (or of the rows of dimension 0
//! that a slice needs) on that backend: its device, pinned buffers, I/O threads and open files
//! (kept open for the life of the handle) are shared by every read.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use safetensors_staging::{
    Checkpoint, Error, LoadReport, Prepared, RowRange, Selection, StagingPath, Tensor,
};

use crate::errors;
use crate::fast::Fast;
use crate::info::{PyCheckpoint, interrupted_or};
use crate::interrupt::Calls;
use crate::load::{PyLoad, absorb, converted, staged};
use crate::lock::locked;
use crate::options::Keywords;

/// A checkpoint opened for reading tensor by tensor.
#[pyclass(module = "safetensors_staging._native", name = "_Reader", frozen)]
pub(crate) struct PyReader {
    /// `None` once closed: the backend, its buffers and the files kept open are let go.
    prepared: Mutex<Option<Prepared<'static>>>,
    checkpoint: Checkpoint,
    /// Every read so far, as one report (`None` before the first); a stream's is added when
    /// it ends.
    report: Arc<Mutex<Option<LoadReport>>>,
    backend: &'static str,
    /// Whether its reads hand out mappings of the files (`Prepared::maps`).
    maps: bool,
    /// Whether mappings were asked for (`map=true`), not left to `auto`.
    map_asked: bool,
    /// Whether the last tensor `read` handed out was a mapping of its file (`maps`, until a
    /// mapping finds no memory and the tensor is read into memory of its own).
    last_mapped: AtomicBool,
    /// What a Hub path opened to (the report's `hub` before any read).
    hub: Option<staging_core::HubReport>,
    device_index: i32,
    /// Its reads, for Ctrl-C (a SIGINT interrupts the reads running when it arrives), and
    /// whether it was closed (which interrupts reads of URLs still waiting on the network).
    calls: Arc<Calls>,
}

/// Opens the backend for `paths` and reads their headers. The keywords are `stage`'s, less
/// what chooses tensors (`select`, `rows`): the caller asks for each tensor.
#[pyfunction]
#[pyo3(name = "_reader", signature = (paths, **kwargs))]
pub(crate) fn reader(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyReader> {
    let keywords = Keywords::parse(kwargs)?;
    if keywords.has_functions()
        || !keywords.options.select.is_empty()
        || !keywords.options.rows.is_empty()
        || keywords.select_none
    {
        return Err(errors::to_py(Error::InvalidOption {
            key: "select".into(),
            value: "(given)".into(),
            reason: "a handle reads the tensors asked of it: choose them with get_tensor and \
                     get_slice, not select or rows"
                .into(),
        }));
    }
    let gpu = keywords.options.device.gpu_index().unwrap_or(0);
    let map_asked = keywords.options.map == safetensors_staging::MapFiles::Always;
    let mut loader = keywords.options.loader().map_err(errors::to_py)?;
    let calls = Arc::new(Calls::default());
    if let Some(interrupt) = calls.interrupt_for(&paths) {
        loader = loader.interrupt(interrupt);
    }
    let first = paths.first().cloned().unwrap_or_default();
    let call = calls.enter();
    let (prepared, checkpoint, maps) = py
        .detach(move || -> Result<_, Error> {
            let mut prepared = loader.prepare_for(&first)?;
            let checkpoint = prepared.read_headers(&paths)?;
            // Bound to the files as their headers were read, as `safetensors` serves the file
            // it opened: a file renamed over one later is not read.
            prepared.keep_files_open_for(&checkpoint)?;
            let maps = prepared.maps(&checkpoint)?;
            Ok((prepared, checkpoint, maps))
        })
        .map_err(|e| interrupted_or(py, e))?;
    drop(call);
    Ok(PyReader {
        backend: prepared.backend_name(),
        hub: prepared.hub_report(),
        maps,
        map_asked,
        last_mapped: AtomicBool::new(maps),
        prepared: Mutex::new(Some(prepared)),
        checkpoint,
        report: Arc::new(Mutex::new(None)),
        device_index: i32::try_from(gpu).unwrap_or(i32::MAX),
        calls,
    })
}

impl PyReader {
    /// `f` on the handle's backend, locked for its length; `Failure::Closed` once closed.
    fn with_prepared<T>(
        &self,
        f: impl FnOnce(&mut Prepared<'static>) -> Result<T, Error>,
    ) -> Result<T, Failure> {
        let mut prepared = locked(&self.prepared);
        match prepared.as_mut().filter(|_| !self.calls.is_closed()) {
            Some(prepared) => Ok(f(prepared)?),
            None => Err(Failure::Closed),
        }
    }

    /// The Python error for a read that failed: "File is closed" for a handle closed before
    /// or during it (a read its close interrupted, too), else the library's error.
    fn to_py(&self, py: Python<'_>, failure: Failure) -> PyErr {
        match failure {
            Failure::Closed => errors::staging("File is closed"),
            Failure::Error(_) if self.calls.is_closed() => errors::staging("File is closed"),
            Failure::Error(e) => interrupted_or(py, e),
        }
    }

    /// One load of `name` (its rows `rows` when given), on the handle's backend. With
    /// `columns` (of dimension 1), the caller takes only those columns of what it reads: a
    /// tensor mapped from its file then counts only their bytes as read (the caller's view
    /// touches those alone; the page cache reads the pages that hold them).
    fn load_one(
        &self,
        name: &str,
        rows: Option<RowRange>,
        columns: Option<(usize, usize)>,
    ) -> Result<Tensor, Failure> {
        let narrowed = self
            .checkpoint
            .only(name, rows.as_ref())
            .map_err(Error::from)?;
        // The backend is locked only to open the load (a load owns what it reads with), so
        // reads of several threads, and a read ahead, move bytes at once.
        let mut load = self.with_prepared(|prepared| prepared.open_checkpoint(narrowed))?;
        let tensor = match load.next() {
            Some(tensor) => tensor?,
            None => {
                return Err(Failure::Error(Error::Load(staging_core::Error::Internal(
                    format!("a load of tensor {name:?} gave no tensor"),
                ))));
            }
        };
        // The load is over (one tensor): its report is final.
        drop(load.next());
        let mut report = load.report();
        if let Some((start, end)) = columns
            && tensor.path() == StagingPath::Mapped
            && let [_, width, ..] = tensor.meta().shape[..]
            && width > 0
            && start <= end
            && end <= width
        {
            let taken = (tensor.len() / width * (end - start)) as u64;
            report.bytes_read = report.bytes_read - tensor.len() as u64 + taken;
            if taken == 0 {
                report.read_requests = report.read_requests.saturating_sub(1);
            }
        }
        absorb(&self.report, &report);
        Ok(tensor)
    }
}

/// Why a read gave no tensor.
enum Failure {
    /// The handle was closed.
    Closed,
    /// The library's error.
    Error(Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self::Error(error)
    }
}

#[pymethods]
impl PyReader {
    /// The tensor `name` (rows `start..end` of dimension 0 when `rows` is given), as a
    /// `_Staged` owning its memory. The GIL is released while its bytes move.
    ///
    /// With `columns` (`(start, end)` of dimension 1), the caller takes only those columns:
    /// a tensor mapped from its file counts only their bytes as read.
    ///
    /// With `fast`, the tensor is that converter's (a framework's tensor) where it converts it.
    #[pyo3(signature = (name, rows=None, columns=None, fast=None))]
    fn read(
        &self,
        py: Python<'_>,
        name: &str,
        rows: Option<(usize, usize)>,
        columns: Option<(usize, usize)>,
        fast: Option<PyRef<'_, Fast>>,
    ) -> PyResult<Py<PyAny>> {
        let rows = rows.map(|(start, end)| RowRange::Rows(start..end));
        let _call = self.calls.enter();
        let tensor = py
            .detach(|| self.load_one(name, rows, columns))
            .map_err(|e| self.to_py(py, e))?;
        self.last_mapped
            .store(tensor.path() == StagingPath::Mapped, Ordering::Relaxed);
        converted(py, tensor, self.device_index, fast.as_deref())
    }

    /// The tensors `names` read in file order by one load on the handle's backend, as
    /// `stage` reads them (its I/O threads and read-ahead across tensors): a `_Load` to iterate
    /// for `(name, tensor)`. Its report is added to the handle's when it ends; closing the
    /// handle ends it, and closing it closes the handle.
    fn stream(&self, py: Python<'_>, names: Vec<String>) -> PyResult<PyLoad> {
        let narrowed = self
            .checkpoint
            .select(&Selection::names(names))
            .map_err(|e| errors::to_py(Error::from(e)))?;
        let _call = self.calls.enter();
        let load = py
            .detach(|| self.with_prepared(|prepared| prepared.open_checkpoint(narrowed)))
            .map_err(|e| self.to_py(py, e))?;
        Ok(PyLoad::on_handle(
            load,
            self.device_index,
            Arc::clone(&self.calls),
            Arc::clone(&self.report),
        ))
    }

    /// Columns `columns` (`(start, end)` of dimension 1) of the tensor `name` (of its rows
    /// `rows` when given), reading only those columns, as a `_Staged` owning its memory; `None`
    /// where the handle's reads cannot (see `Prepared::read_columns`): read the rows then.
    #[pyo3(signature = (name, rows, columns))]
    fn read_columns(
        &self,
        py: Python<'_>,
        name: &str,
        rows: Option<(usize, usize)>,
        columns: (usize, usize),
    ) -> PyResult<Option<Py<PyAny>>> {
        let rows = rows.map(|(start, end)| RowRange::Rows(start..end));
        let _call = self.calls.enter();
        let read = py.detach(|| -> Result<Option<Tensor>, Failure> {
            let narrowed = self
                .checkpoint
                .only(name, rows.as_ref())
                .map_err(Error::from)?;
            let read = self
                .with_prepared(|prepared| prepared.read_columns(&narrowed, columns.0..columns.1))?;
            let Some((tensor, report)) = read else {
                return Ok(None);
            };
            absorb(&self.report, &report);
            Ok(Some(tensor))
        });
        match read {
            Ok(Some(tensor)) => staged(py, tensor, self.device_index).map(Some),
            Ok(None) => Ok(None),
            Err(failure) => Err(self.to_py(py, failure)),
        }
    }

    /// The headers, as `open(path)` gives them.
    fn checkpoint(&self) -> PyCheckpoint {
        PyCheckpoint::new(self.checkpoint.clone())
    }

    /// Every read so far as one report, with the keys of `stage --json` (no `tensor_list`);
    /// before the first read, the counts (all 0) and the backend.
    fn report_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| match &*locked(&self.report) {
            Some(report) => serde_json::to_string(report),
            None => {
                let mut empty = serde_json::json!({
                    "backend": self.backend,
                    "tensors": 0,
                    "bytes": 0,
                    "read_requests": 0,
                    "bytes_read": 0,
                });
                if let Some(hub) = &self.hub {
                    empty["hub"] = serde_json::to_value(hub)?;
                }
                serde_json::to_string(&empty)
            }
        })
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    /// The backend: `host`, `cufile` or `hipfile`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// Whether its reads hand out tensors as mappings of their files (path `mapped`): host
    /// tensors from local files, where the handle maps.
    #[getter]
    fn maps(&self) -> bool {
        self.maps
    }

    /// Whether the last tensor `read` gave was a mapping of its file.
    #[getter]
    fn last_mapped(&self) -> bool {
        self.last_mapped.load(Ordering::Relaxed)
    }

    /// Whether mappings were asked for (`map=True`), rather than left to `auto`: NumPy's
    /// arrays are views of them then, copies otherwise.
    #[getter]
    fn map_asked(&self) -> bool {
        self.map_asked
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.calls.is_closed()
    }

    /// Lets go of the backend, its buffers and the files kept open; tensors already read stay
    /// valid. Reads of a URL still running on other threads (a server that stopped answering)
    /// end within about 50 ms with "File is closed"; a read of a local file under way finishes.
    fn close(&self, py: Python<'_>) {
        self.calls.close();
        let prepared = py.detach(|| locked(&self.prepared).take());
        py.detach(move || drop(prepared));
    }
}
