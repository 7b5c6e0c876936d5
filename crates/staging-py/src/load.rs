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

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::ThreadId;

use indicatif::{ProgressBar, ProgressStyle};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use safetensors_staging::cufile::RequestedMode;
use safetensors_staging::mock::Ledger;
use safetensors_staging::{
    AutoOptions, Backend, Checkpoint, Error, HeldMemory, HostOptions, JsonReport, Load, LoadReport,
    Loader, RowRange, Selection, StagingPath, StagingPolicy, Tensor, TensorMeta, TensorRecord,
};

use crate::destination::{GivenMap, PyDestination};
use crate::errors::{self, BackendUnavailableError, StagingError};
use crate::export::{Memory, Staged};
use crate::info::{TensorInfo, interrupted_or, open_checkpoint, remote_options};

pub(crate) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps or the load half-updated in a way
    // that matters more than the panic itself, which PyO3 already turned into an exception.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error a load stopped by `close()` from its own destination callback ends with; the
/// iteration then ends quietly, as after any `close()`.
pub(crate) const CLOSED_IN_CALLBACK: &str = "the load was closed by its own destination callback";

/// Where a load runs: `"cpu"` (host memory) or a GPU (`"cuda"`, with its index).
fn backend(
    name: &str,
    gpu: Option<usize>,
    direct_io: bool,
    cufile_mode: &str,
    cufile_lib: Option<PathBuf>,
) -> PyResult<Backend> {
    let mode = match cufile_mode {
        "auto" => RequestedMode::Auto,
        "gds" => RequestedMode::Fast,
        "compat" => RequestedMode::Compat,
        "posix" => RequestedMode::Posix,
        other => {
            return Err(PyValueError::new_err(format!(
                "cufile_mode={other:?}: expected auto, gds, compat or posix"
            )));
        }
    };
    let device = gpu.unwrap_or(0);
    let cufile = safetensors_staging::cufile::Options {
        device,
        mode,
        library: cufile_lib,
        ..Default::default()
    };
    let hipfile = safetensors_staging::hipfile::Options {
        device,
        ..Default::default()
    };
    let host = HostOptions::default().direct_io(direct_io);
    let backend = match (name, gpu) {
        ("auto", None) | ("host", None) => Backend::Host(host),
        ("mock", None) => Backend::Mock,
        ("auto", Some(_)) => {
            let mut auto = AutoOptions::default();
            auto.cufile = cufile;
            auto.hipfile = hipfile;
            auto.host = host;
            Backend::Auto(auto)
        }
        ("cufile", Some(_)) => Backend::Cufile(cufile),
        ("hipfile", Some(_)) => Backend::Hipfile(hipfile),
        ("host" | "mock", Some(index)) => {
            return Err(PyValueError::new_err(format!(
                "backend={name:?} loads into host memory: use device=\"cpu\", not a GPU \
                 (cuda:{index})"
            )));
        }
        ("cufile" | "hipfile", None) => {
            return Err(PyValueError::new_err(format!(
                "backend={name:?} loads onto a GPU: use device=\"cuda\" or \"cuda:N\""
            )));
        }
        (other, _) => {
            return Err(PyValueError::new_err(format!(
                "backend={other:?}: expected auto, host, mock, cufile or hipfile"
            )));
        }
    };
    Ok(backend)
}

/// The policy from the keyword options, as `stage` builds it from its flags.
fn policy(
    chunk_size: Option<usize>,
    threads: Option<usize>,
    staging_slots: Option<usize>,
    coalesce_below: Option<usize>,
) -> PyResult<StagingPolicy> {
    let mut policy = StagingPolicy::builder();
    if let Some(chunk) = chunk_size {
        policy = policy.chunk_size(chunk).staging_size(chunk);
    }
    if let Some(threads) = threads {
        policy = policy.io_threads(threads);
    }
    if let Some(slots) = staging_slots {
        policy = policy.staging_slots(slots);
    }
    if let Some(below) = coalesce_below {
        policy = policy.coalesce_below(below);
    }
    policy.build().map_err(|e| errors::to_py(e.into()))
}

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

/// A row range from Python: `(start, end)` or `"START:END"` / `"RANK/PARTS"`.
fn row_range(spec: &Bound<'_, PyAny>) -> PyResult<RowRange> {
    if let Ok(text) = spec.cast::<PyString>() {
        return text
            .to_cow()?
            .parse::<RowRange>()
            .map_err(PyValueError::new_err);
    }
    let (start, end): (usize, usize) = spec.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "rows: {spec} is not (start, end), \"START:END\" or \"RANK/PARTS\""
        ))
    })?;
    Ok(RowRange::Rows(start..end))
}

/// The selection from `select` (names, or a predicate on names) and `rows` (a mapping of name
/// to range, or a function of `(name, TensorInfo)` giving a range or `None`). Functions are
/// called here, once per tensor of the checkpoint, before anything is read.
fn selection(
    checkpoint: &Checkpoint,
    select: Option<&Bound<'_, PyAny>>,
    rows: Option<&Bound<'_, PyAny>>,
) -> PyResult<Selection> {
    let mut selection = match select {
        None => Selection::all(),
        Some(select) if select.is_callable() => {
            let mut names = Vec::new();
            for tensor in checkpoint.tensors() {
                if select.call1((tensor.name.as_str(),))?.is_truthy()? {
                    names.push(tensor.name.clone());
                }
            }
            Selection::names(names)
        }
        Some(select) => {
            let names: Vec<String> = select
                .try_iter()?
                .map(|name| name.and_then(|n| n.extract::<String>()))
                .collect::<PyResult<_>>()
                .map_err(|_| {
                    PyValueError::new_err(
                        "select: expected an iterable of tensor names or a function of a name",
                    )
                })?;
            Selection::names(names)
        }
    };
    match rows {
        None => {}
        Some(rows) if rows.is_callable() => {
            for tensor in checkpoint.tensors() {
                let spec = rows.call1((tensor.name.as_str(), TensorInfo::new(tensor)))?;
                if !spec.is_none() {
                    selection = selection.rows(tensor.name.clone(), row_range(&spec)?);
                }
            }
        }
        Some(rows) => {
            let rows = rows.cast::<PyDict>().map_err(|_| {
                PyValueError::new_err("rows: expected a dict of name to range, or a function")
            })?;
            for (name, spec) in rows.iter() {
                selection = selection.rows(name.extract::<String>()?, row_range(&spec)?);
            }
        }
    }
    Ok(selection)
}

/// Opens a load. Every option is a keyword of `safetensors_staging.stage`; the Python side
/// turns `device` into `gpu` (`None` for `"cpu"`, else the index).
#[pyfunction]
#[pyo3(name = "_stage", signature = (
    paths, *, gpu=None, backend_name="auto", select=None, rows=None, destination=None,
    memory_cap=None, chunk_size=None, threads=None, staging_slots=None, coalesce_below=None,
    direct_io=false, suballocate=true, cufile_mode="auto", cufile_lib=None, progress=false,
    concurrency=None, range_size=None, retries=None, bandwidth=None, store_options=None
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    gpu: Option<usize>,
    backend_name: &str,
    select: Option<&Bound<'_, PyAny>>,
    rows: Option<&Bound<'_, PyAny>>,
    destination: Option<Py<PyAny>>,
    memory_cap: Option<u64>,
    chunk_size: Option<usize>,
    threads: Option<usize>,
    staging_slots: Option<usize>,
    coalesce_below: Option<usize>,
    direct_io: bool,
    suballocate: bool,
    cufile_mode: &str,
    cufile_lib: Option<PathBuf>,
    progress: bool,
    concurrency: Option<usize>,
    range_size: Option<usize>,
    retries: Option<usize>,
    bandwidth: Option<u64>,
    store_options: Option<BTreeMap<String, String>>,
) -> PyResult<PyLoad> {
    let backend = backend(backend_name, gpu, direct_io, cufile_mode, cufile_lib)?;
    let policy = policy(chunk_size, threads, staging_slots, coalesce_below)?;
    let remote = remote_options(
        &paths,
        concurrency,
        range_size,
        retries,
        bandwidth,
        store_options,
    );
    let checkpoint = open_checkpoint(py, paths, remote.clone())?;
    let selection = selection(&checkpoint, select, rows)?;
    let given = GivenMap::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut loader = Loader::new()
        .backend(backend)
        .device(gpu.unwrap_or(0))
        .policy(policy)
        .memory_cap(memory_cap)
        .suballocate(suballocate)
        .select(selection)
        .remote(remote);
    if let Some(callback) = destination {
        loader = loader.raw_destination(PyDestination::new(
            callback,
            Arc::clone(&given),
            Arc::clone(&stop),
            gpu.unwrap_or(0),
        ));
    }
    let load = py
        .detach(move || -> Result<Load<'static>, Error> {
            let prepared = loader.prepare()?;
            prepared.open_checkpoint(checkpoint)
        })
        .map_err(|e| interrupted_or(py, e))?;
    let report = load.report();
    if let Some(index) = gpu
        && report.backend == "host"
    {
        return Err(BackendUnavailableError::new_err(format!(
            "device cuda:{index} was asked for, but no GPU backend can run here: {}",
            if report.passed_over.is_empty() {
                "none was tried".to_owned()
            } else {
                report.passed_over.join("; ")
            }
        )));
    }
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
        ledger: load.ledger().cloned(),
        held: load.held_memory(),
        device_index: i32::try_from(gpu.unwrap_or(0)).unwrap_or(i32::MAX),
        given,
        stop,
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
    info: Mutex<Info>,
    given: GivenMap,
    ledger: Option<Ledger>,
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
        let fallback = tensor.fallback().map(|f| format!("{f:?}"));
        match tensor.path() {
            StagingPath::Destination => {
                let given = locked(&self.given).remove(tensor.name());
                given.map(|g| g.object.clone_ref(py)).ok_or_else(|| {
                    errors::to_py(Error::Load(staging_core::Error::Internal(format!(
                        "tensor {:?} was read into a destination that was not kept",
                        tensor.name()
                    ))))
                })
            }
            StagingPath::Device => {
                let (meta, memory) = tensor.take_device().map_err(|t| unexpected(&t))?;
                self.staged(py, &meta, "device", fallback, Memory::Device(memory))
            }
            StagingPath::Host => {
                let (meta, bytes) = tensor.into_host_bytes().map_err(|t| unexpected(&t))?;
                self.staged(py, &meta, "host", fallback, Memory::Host(bytes))
            }
        }
    }

    fn staged(
        &self,
        py: Python<'_>,
        meta: &TensorMeta,
        path: &'static str,
        fallback: Option<String>,
        memory: Memory,
    ) -> PyResult<Py<PyAny>> {
        let staged = Staged::new(meta, path, fallback, memory, self.device_index);
        Ok(Py::new(py, staged)?.into_any())
    }
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

    /// The mock backend's ledger: `(buffers never returned, their bytes)`; `None` for other
    /// backends.
    fn ledger_outstanding(&self) -> Option<(usize, u64)> {
        self.ledger
            .as_ref()
            .map(|l| (l.outstanding().len(), l.outstanding_bytes()))
    }
}
