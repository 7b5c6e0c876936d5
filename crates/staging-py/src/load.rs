//! `_stage(...)`: keyword options translated into a `Loader` (as `stage` translates its flags),
//! and `_Load`, the iterator of `(name, tensor)` with its report.
//!
//! The GIL is released while bytes move (`py.detach` around each `next`), and Python signals
//! are checked between tensors: a `KeyboardInterrupt` ends the load and frees what it held.
//!
//! The destination callback runs inside `next`, and may use its own load: the load is locked
//! only by `next` (for the whole step), and what the other methods read (`Info`) is never
//! locked across the callback. From the callback, `report()`, `backend`, `total_bytes` and
//! `held()` work (the report as of the last tensor handed out), `close()` stops the load before
//! the tensor being asked for is read, and `next()` raises `StagingError` at once.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::ThreadId;

use indicatif::{ProgressBar, ProgressStyle};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use safetensors_staging::{
    Error, HeldMemory, JsonReport, Load, LoadReport, RowRange, Selection, StagingPath, Tensor,
    TensorRecord,
};

use crate::destination::{GivenMap, PyDestination};
use crate::errors::{self, StagingError};
use crate::export::{Memory, Staged};
use crate::info::interrupted_or;
use crate::interrupt::Calls;
use crate::options::{Keywords, rows_spelling};

pub(crate) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps or the load half-updated in a way
    // that matters more than the panic itself, which PyO3 already turned into an exception.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error a load stopped by `close()` from its own destination callback ends with; the
/// iteration then ends quietly, as after any `close()`.
pub(crate) const CLOSED_IN_CALLBACK: &str = "the load was closed by its own destination callback";

/// The rows `(start, end)` a row spec means for a first dimension of `dim0` (as a load cuts
/// them), for code that narrows tensors itself.
#[pyfunction]
#[pyo3(name = "_resolve_rows")]
pub(crate) fn resolve_rows(spec: &Bound<'_, PyAny>, dim0: usize) -> PyResult<(usize, usize)> {
    let rows = row_range(spec)?;
    rows.resolve(dim0).map(|r| (r.start, r.end)).ok_or_else(|| {
        crate::errors::SelectionError::new_err(format!(
            "cannot read {rows}: they are not inside its {dim0} rows"
        ))
    })
}

/// A row range from Python: `(start, end)` or `"START:END"` / `"RANK/PARTS"`, spelled as the
/// `rows` option spells it and parsed by the library.
fn row_range(spec: &Bound<'_, PyAny>) -> PyResult<RowRange> {
    let text = rows_spelling(spec)?;
    text.parse::<RowRange>().map_err(|reason| {
        errors::to_py(Error::InvalidOption {
            key: "rows".into(),
            value: text.clone(),
            reason,
        })
    })
}

/// Opens a load. Every option is a keyword of `safetensors_staging.stage`, a key of the
/// library's options (see `options`); only `destination` and `progress` are this door's own.
#[pyfunction]
#[pyo3(name = "_stage", signature = (paths, *, destination=None, progress=false, **kwargs))]
pub(crate) fn stage(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    destination: Option<Py<PyAny>>,
    progress: bool,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyLoad> {
    let mut keywords = Keywords::parse(kwargs)?;
    let gpu = keywords.options.device.gpu_index().unwrap_or(0);
    let mut loader = keywords.options.loader().map_err(errors::to_py)?;
    let calls = Arc::new(Calls::default());
    if let Some(interrupt) = calls.interrupt_for(&paths) {
        loader = loader.interrupt(interrupt);
    }
    let call = calls.enter();
    let given = GivenMap::default();
    let stop = Arc::new(AtomicBool::new(false));
    if let Some(callback) = destination {
        loader = loader.raw_destination(PyDestination::new(
            callback,
            Arc::clone(&given),
            Arc::clone(&stop),
            gpu,
        ));
    }
    // The backend opened for the source, then the headers read through the store the load
    // reads from (one client, no second HEAD of any file), then the load.
    let first = paths.first().cloned().unwrap_or_default();
    let (mut prepared, checkpoint) = py
        .detach(move || -> Result<_, Error> {
            let mut prepared = loader.prepare_for(&first)?;
            let checkpoint = prepared.read_headers(&paths)?;
            Ok((prepared, checkpoint))
        })
        .map_err(|e| interrupted_or(py, e))?;
    if keywords.has_functions() {
        keywords.apply_functions(&checkpoint)?;
        prepared.select(keywords.options.selection().map_err(errors::to_py)?);
    }
    if keywords.select_none {
        prepared.select(Selection::names(Vec::<String>::new()));
    }
    let load = py
        .detach(move || prepared.open_checkpoint(checkpoint))
        .map_err(|e| interrupted_or(py, e))?;
    drop(call);
    let report = load.report();
    let total = load.checkpoint().total_bytes();
    let bar = if progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{wide_bar}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Some(bar)
    } else {
        None
    };
    Ok(PyLoad {
        held: load.held_memory(),
        device_index: i32::try_from(gpu).unwrap_or(i32::MAX),
        given,
        stop,
        calls,
        stepping: Mutex::new(None),
        info: Mutex::new(Info {
            records: Vec::new(),
            report,
            total_bytes: total,
            ended: false,
            progress: bar,
        }),
        load: Mutex::new(Some(load)),
    })
}

/// What the methods other than `next` read: updated after each step, never locked across the
/// destination callback.
struct Info {
    records: Vec<TensorRecord>,
    /// The report as of the last tensor (final once the load has ended).
    report: LoadReport,
    total_bytes: u64,
    ended: bool,
    progress: Option<ProgressBar>,
}

impl Info {
    /// Records the end of the load, with its final report.
    fn end(&mut self, load: Option<Load<'static>>) {
        if let Some(load) = load {
            self.report = load.report();
        }
        self.ended = true;
        if let Some(bar) = self.progress.take() {
            bar.finish();
        }
    }
}

/// A load in progress: iterate it for `(name, tensor)` in file order; `report()` at any time.
#[pyclass(module = "safetensors_staging._native", name = "_Load", frozen)]
pub(crate) struct PyLoad {
    /// `None` once the load has ended (done, failed, closed or interrupted): its buffers are
    /// freed. Locked by a step for its whole length.
    load: Mutex<Option<Load<'static>>>,
    /// The thread running a step, if any: the destination callback runs on it.
    stepping: Mutex<Option<ThreadId>>,
    /// Set by `close()` from inside the destination callback.
    stop: Arc<AtomicBool>,
    /// Its calls, for Ctrl-C: a SIGINT interrupts the step running when it arrives.
    calls: Arc<Calls>,
    info: Mutex<Info>,
    given: GivenMap,
    held: HeldMemory,
    device_index: i32,
}

enum Step {
    Tensor(Box<Tensor>),
    Done,
    Failed(Error),
}

/// Clears `stepping` when a step ends, also by a panic.
struct Stepping<'a>(&'a Mutex<Option<ThreadId>>);

impl Drop for Stepping<'_> {
    fn drop(&mut self) {
        *locked(self.0) = None;
    }
}

impl PyLoad {
    /// Whether the calling thread is inside a step of this load (in its destination callback).
    fn in_own_callback(&self) -> bool {
        *locked(&self.stepping) == Some(std::thread::current().id())
    }

    fn step(&self) -> Step {
        let mut load = locked(&self.load);
        *locked(&self.stepping) = Some(std::thread::current().id());
        let item = {
            let _stepping = Stepping(&self.stepping);
            load.as_mut().and_then(Iterator::next)
        };
        let mut info = locked(&self.info);
        match item {
            Some(Ok(tensor)) => {
                info.records
                    .push(TensorRecord::new(tensor.meta(), tensor.path()));
                if let Some(bar) = &info.progress {
                    bar.inc(tensor.len() as u64);
                }
                if let Some(load) = load.as_ref() {
                    info.report = load.report();
                }
                Step::Tensor(Box::new(tensor))
            }
            Some(Err(error)) => {
                info.end(load.take());
                if self.stop.load(Ordering::Acquire) {
                    Step::Done
                } else {
                    Step::Failed(error)
                }
            }
            None => {
                info.end(load.take());
                Step::Done
            }
        }
    }

    /// Ends the load now (waiting for a step another thread is running).
    fn end(&self) {
        let mut load = locked(&self.load);
        locked(&self.info).end(load.take());
    }

    /// The Python object for a loaded tensor: the caller's own object when it was read into
    /// the destination's memory, else a `_Staged` owning the memory.
    fn hand_out(&self, py: Python<'_>, tensor: Tensor) -> PyResult<Py<PyAny>> {
        if tensor.path() == StagingPath::Destination {
            let given = locked(&self.given).remove(tensor.name());
            return given.map(|g| g.object.clone_ref(py)).ok_or_else(|| {
                errors::to_py(Error::Load(staging_core::Error::Internal(format!(
                    "tensor {:?} was read into a destination that was not kept",
                    tensor.name()
                ))))
            });
        }
        staged(py, tensor, self.device_index)
    }
}

/// A tensor the library allocated, as a `_Staged` owning its memory (device or host).
pub(crate) fn staged(py: Python<'_>, tensor: Tensor, device_index: i32) -> PyResult<Py<PyAny>> {
    let fallback = tensor.fallback().map(|f| format!("{f:?}"));
    let (meta, path, memory) = match tensor.path() {
        StagingPath::Device => {
            let (meta, memory) = tensor.take_device().map_err(|t| unexpected(&t))?;
            (meta, "device", Memory::Device(memory))
        }
        StagingPath::Host => {
            let (meta, bytes) = tensor.into_host_bytes().map_err(|t| unexpected(&t))?;
            (meta, "host", Memory::Host(bytes))
        }
        StagingPath::Destination => return Err(unexpected(&tensor)),
    };
    let staged = Staged::new(&meta, path, fallback, memory, device_index);
    Ok(Py::new(py, staged)?.into_any())
}

fn unexpected(tensor: &Tensor) -> PyErr {
    errors::to_py(Error::Load(staging_core::Error::Internal(format!(
        "tensor {:?} on the {} path has no memory of that path",
        tensor.name(),
        tensor.path().as_str()
    ))))
}

#[pymethods]
impl PyLoad {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(String, Py<PyAny>)>> {
        if self.in_own_callback() {
            return Err(StagingError::new_err(
                "next() was called on a load from inside its own destination callback, which \
                 runs inside next(): return the destination (or None) instead; close() stops \
                 the load",
            ));
        }
        let _call = self.calls.enter();
        // The lock is taken with the GIL released: another thread iterating the same load
        // waits without holding the GIL this one needs for a destination callback.
        match py.detach(|| self.step()) {
            Step::Done => Ok(None),
            Step::Failed(error) => Err(interrupted_or(py, error)),
            Step::Tensor(tensor) => {
                if let Err(interrupted) = py.check_signals() {
                    drop(tensor);
                    self.close(py);
                    return Err(interrupted);
                }
                let name = tensor.name().to_owned();
                Ok(Some((name, self.hand_out(py, *tensor)?)))
            }
        }
    }

    /// Ends the load now, freeing its staging buffers; tensors already handed out stay. From
    /// inside the load's own destination callback: the load stops before the tensor being asked
    /// for is read, and the iteration ends.
    fn close(&self, py: Python<'_>) {
        if self.in_own_callback() {
            self.stop.store(true, Ordering::Release);
        } else {
            py.detach(|| self.end());
        }
        locked(&self.given).clear();
    }

    /// The report: the same keys as `stage --json` (paths, fallbacks, peaks, `bytes_read`,
    /// backend, mode, `passed_over`, `tensor_list`), as a JSON string. While a tensor is being
    /// loaded (from the destination callback, or another thread), the report as of the last
    /// tensor handed out.
    fn report_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| {
            let report = match self.load.try_lock() {
                Ok(load) => load.as_ref().map(Load::report),
                Err(TryLockError::Poisoned(load)) => load.into_inner().as_ref().map(Load::report),
                Err(TryLockError::WouldBlock) => None,
            };
            let info = locked(&self.info);
            serde_json::to_string(&JsonReport {
                report: report.unwrap_or_else(|| info.report.clone()),
                tensor_list: info.records.clone(),
            })
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The backend chosen.
    #[getter]
    fn backend(&self, py: Python<'_>) -> String {
        py.detach(|| locked(&self.info).report.backend.clone())
    }

    /// The bytes every tensor selected holds together (0 once the load has ended).
    #[getter]
    fn total_bytes(&self, py: Python<'_>) -> u64 {
        py.detach(|| {
            let info = locked(&self.info);
            if info.ended { 0 } else { info.total_bytes }
        })
    }

    /// What the load's buffers hold now, `{"device": .., "host": .., "caller": ..}` bytes:
    /// readable after the load ended; every count is 0 once its tensors are gone.
    fn held(&self) -> HashMap<&'static str, u64> {
        HashMap::from([
            ("device", self.held.device_bytes()),
            ("host", self.held.host_bytes()),
            ("caller", self.held.caller_bytes()),
        ])
    }
}
