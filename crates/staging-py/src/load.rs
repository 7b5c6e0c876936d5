//! `_stage(...)`: keyword options translated into a `Loader` (as `stage` translates its flags),
//! and `_Load`, the iterator of `(name, tensor)` with its report.
//!
//! The GIL is released while bytes move (`py.detach` around each `next`), and Python signals
//! are checked between tensors: a `KeyboardInterrupt` ends the load and frees what it held.
//!
//! The destination callback runs inside `next`, and may use its own load, on its own thread or
//! by handing the call to another thread and waiting for it (an executor, an event loop, a GUI
//! thread): nothing waits for a running step. The load is locked only by `next` (for the whole
//! step), and what the other methods read (`Info`) is never locked across the callback. From
//! the callback, or from any thread while a step runs, `report()`, `backend`, `total_bytes` and
//! `held()` work (the report as of the last tensor handed out); `close()` returns at once and
//! the step ends the load as soon as it can, before the next tensor is read (before the one
//! the callback was asked for), freeing what it holds; and `next()` raises `StagingError` at
//! once.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use indicatif::{ProgressBar, ProgressStyle};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use safetensors_staging::{
    Error, HeldMemory, JsonReport, Load, LoadReport, RowRange, Selection, StagingPath, Tensor,
    TensorRecord,
};

use crate::destination::{GivenMap, PyDestination};
use crate::errors;
use crate::export::{Memory, Staged};
use crate::fast::Fast;
use crate::info::interrupted_or;
use crate::interrupt::Calls;
use crate::lock::locked;
use crate::options::{Keywords, rows_spelling};

/// What `next()` raises while a step of the same load runs.
const NEXT_DURING_STEP: &str = "next() was called on a load while it is loading a tensor (from \
    inside its own destination callback, which runs inside next(), or on another thread): a load \
    hands out one tensor at a time; return the destination (or None) from the callback instead; \
    close() stops the load";

/// The rows `(start, end)` a row spec means for a first dimension of `dim0` (as a load cuts
/// them), for code that narrows tensors itself.
#[pyfunction]
#[pyo3(name = "_resolve_rows")]
pub(crate) fn resolve_rows(spec: &Bound<'_, PyAny>, dim0: usize) -> PyResult<(usize, usize)> {
    let rows = row_range(spec)?;
    rows.resolve(dim0).map(|r| (r.start, r.end)).ok_or_else(|| {
        crate::errors::of_kind(
            safetensors_staging::ErrorKind::Selection,
            format!("cannot read {rows}: they are not inside its {dim0} rows"),
        )
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
    if let Some(callback) = destination {
        loader = loader.raw_destination(PyDestination::new(
            callback,
            Arc::clone(&given),
            Arc::clone(&calls),
            gpu,
        ));
    }
    // The backend opened for the source, then the headers read through the store the load
    // reads from (one client, no second HEAD of any file), then the load. A `select` function
    // is asked of each name an index lists first: only the shards holding what it chooses
    // are read.
    let first = paths.first().cloned().unwrap_or_default();
    let asker = keywords.select_function().map(Asker::new);
    let read = py.detach(|| -> Result<_, Error> {
        let mut prepared = loader.prepare_for(&first)?;
        let checkpoint = match &asker {
            Some(asker) => prepared.read_headers_for(&paths, &|name| asker.wants(name))?,
            None => prepared.read_headers(&paths)?,
        };
        Ok((prepared, checkpoint))
    });
    let asked = match asker {
        Some(asker) => asker.answers()?,
        None => HashMap::new(),
    };
    let (mut prepared, checkpoint) = read.map_err(|e| interrupted_or(py, e))?;
    if keywords.has_functions() {
        keywords.apply_functions(&checkpoint, &asked)?;
        prepared.select(keywords.options.selection().map_err(errors::to_py)?);
    }
    if keywords.select_none {
        prepared.select(Selection::names(Vec::<String>::new()));
    }
    let load = py
        .detach(move || prepared.open_checkpoint(checkpoint))
        .map_err(|e| interrupted_or(py, e))?;
    drop(call);
    let total = load.checkpoint().total_bytes();
    let bar = if progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(Load::PROGRESS_TEMPLATE) {
            bar.set_style(style.progress_chars(Load::PROGRESS_CHARS));
        }
        Some(bar)
    } else {
        None
    };
    Ok(PyLoad::new(
        load,
        i32::try_from(gpu).unwrap_or(i32::MAX),
        given,
        calls,
        bar,
        None,
    ))
}

/// A `select` function asked of names from a thread without the GIL (reading an index's
/// headers), each answer kept; the first error it raised is kept, and the names after it are
/// not chosen.
struct Asker {
    select: Py<PyAny>,
    answers: Mutex<HashMap<String, bool>>,
    failed: Mutex<Option<PyErr>>,
}

impl Asker {
    fn new(select: Py<PyAny>) -> Self {
        Self {
            select,
            answers: Mutex::new(HashMap::new()),
            failed: Mutex::new(None),
        }
    }

    /// Whether the function chooses `name` (attaching to Python to ask it).
    fn wants(&self, name: &str) -> bool {
        if locked(&self.failed).is_some() {
            return false;
        }
        let answer = Python::attach(|py| {
            self.select
                .bind(py)
                .call1((name,))
                .and_then(|chosen| chosen.is_truthy())
        });
        match answer {
            Ok(chosen) => {
                locked(&self.answers).insert(name.to_owned(), chosen);
                chosen
            }
            Err(error) => {
                locked(&self.failed).get_or_insert(error);
                false
            }
        }
    }

    /// The answers given, or the error the function raised.
    fn answers(self) -> PyResult<HashMap<String, bool>> {
        let failed = self.failed.into_inner().unwrap_or_else(|p| p.into_inner());
        match failed {
            Some(error) => Err(error),
            None => Ok(self.answers.into_inner().unwrap_or_else(|p| p.into_inner())),
        }
    }
}

impl PyLoad {
    /// A load opened on a handle's backend (`_Reader.stream`): its calls are the handle's (a
    /// close of either ends both), and its final report is added to the handle's
    /// (`into`) when it ends.
    pub(crate) fn on_handle(
        load: Load<'static>,
        device_index: i32,
        calls: Arc<Calls>,
        into: Arc<Mutex<Option<LoadReport>>>,
    ) -> Self {
        Self::new(
            load,
            device_index,
            GivenMap::default(),
            calls,
            None,
            Some(into),
        )
    }

    fn new(
        load: Load<'static>,
        device_index: i32,
        given: GivenMap,
        calls: Arc<Calls>,
        progress: Option<ProgressBar>,
        into: Option<Arc<Mutex<Option<LoadReport>>>>,
    ) -> Self {
        PyLoad {
            held: load.held_memory(),
            device_index,
            given,
            calls,
            stepping: AtomicBool::new(false),
            info: Mutex::new(Info {
                records: Vec::new(),
                report: load.report(),
                total_bytes: load.checkpoint().total_bytes(),
                ended: false,
                progress,
                into,
            }),
            load: Mutex::new(Some(load)),
            failed: Mutex::new(None),
        }
    }
}

impl Drop for PyLoad {
    /// A load dropped before it ended (a stream left part-way: its iterator let go of) ends
    /// here, so that its reads still reach the handle's report (`Info::into`).
    fn drop(&mut self) {
        let load = self
            .load
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let info = self.info.get_mut().unwrap_or_else(|p| p.into_inner());
        if !info.ended {
            info.end(load);
        }
    }
}

/// Adds `report` to the running report `into` (its first, when empty).
pub(crate) fn absorb(into: &Mutex<Option<LoadReport>>, report: &LoadReport) {
    match &mut *locked(into) {
        Some(total) => total.absorb(report),
        empty @ None => *empty = Some(report.clone()),
    }
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
    /// A handle's report, which this load's final report is added to when it ends.
    into: Option<Arc<Mutex<Option<LoadReport>>>>,
}

impl Info {
    /// Records the end of the load, with its final report.
    fn end(&mut self, load: Option<Load<'static>>) {
        if let Some(load) = load {
            self.report = load.report();
            if let Some(into) = self.into.take() {
                absorb(&into, &self.report);
            }
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
    /// freed. Locked by a step for its whole length, otherwise only briefly.
    load: Mutex<Option<Load<'static>>>,
    /// Set while `next` runs, on whichever thread: a step is running, which `close()` leaves
    /// to end the load and a second `next()` may not wait for.
    stepping: AtomicBool,
    /// Its calls, for Ctrl-C (a SIGINT interrupts the step running when it arrives), and
    /// whether it was closed (which the destination and the step read, and which interrupts a
    /// read of a URL waiting on the network).
    calls: Arc<Calls>,
    info: Mutex<Info>,
    given: GivenMap,
    held: HeldMemory,
    device_index: i32,
    /// The error that ended the load after tensors `take` handed out: raised by the next call.
    failed: Mutex<Option<PyErr>>,
}

/// What `next` hands out: `(name, tensor)`, or `None` once the load has ended.
type Handed = Option<(String, Py<PyAny>)>;

/// What `take` hands out: `[(name, tensor)]`.
type Taken = Vec<(String, Py<PyAny>)>;

/// How steps ended the load.
enum End {
    Done,
    Failed(Error),
    /// Closed (by `close()`, from the callback or another thread): the caller ends it.
    Closed,
}

/// A step marked as running (`stepping`) until dropped, also by a panic.
struct Stepping<'a>(&'a AtomicBool);

impl<'a> Stepping<'a> {
    /// Marks a step as running; `None` when one already is.
    fn begin(stepping: &'a AtomicBool) -> Option<Self> {
        // SeqCst, with `close()`'s: either `close()` sees this step running, or this step sees
        // the load closed.
        (!stepping.swap(true, Ordering::SeqCst)).then_some(Self(stepping))
    }
}

impl Drop for Stepping<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl PyLoad {
    /// Up to `most` tensors from the load (at least one unless it ends), and no more once they
    /// hold `bytes` together; with how the load ended, if it did (with `stepping` marked by
    /// the caller). Closed during the steps, nothing read is handed out.
    fn step(&self, most: usize, bytes: usize) -> (Vec<Tensor>, Option<End>) {
        let mut load = locked(&self.load);
        let mut tensors: Vec<Tensor> = Vec::new();
        let mut taken = 0usize;
        let mut end = None;
        while tensors.len() < most.max(1) && (tensors.is_empty() || taken < bytes) {
            if self.calls.is_closed() {
                return (Vec::new(), Some(End::Closed));
            }
            let item = load.as_mut().and_then(Iterator::next);
            if self.calls.is_closed() {
                // Closed during the step: what it read is not handed out, and the load ends
                // (the caller ends it, once the step is over).
                return (Vec::new(), Some(End::Closed));
            }
            match item {
                Some(Ok(tensor)) => {
                    taken = taken.saturating_add(tensor.len());
                    tensors.push(tensor);
                }
                Some(Err(error)) => {
                    end = Some(End::Failed(error));
                    break;
                }
                None => {
                    end = Some(End::Done);
                    break;
                }
            }
        }
        let mut info = locked(&self.info);
        for tensor in &tensors {
            info.records
                .push(TensorRecord::new(tensor.meta(), tensor.path()));
            if let Some(bar) = &info.progress {
                bar.inc(tensor.len() as u64);
            }
        }
        match end {
            None => {
                if let Some(load) = load.as_ref() {
                    info.report = load.report();
                }
            }
            Some(_) => info.end(load.take()),
        }
        (tensors, end)
    }

    /// Ends the load now, freeing its buffers, and lets go of the destinations not handed out.
    /// Not while a step runs: the load is locked for the whole step.
    fn end(&self, py: Python<'_>) {
        py.detach(|| {
            let mut load = locked(&self.load);
            locked(&self.info).end(load.take());
        });
        // Taken out of the map first: dropping them may run Python code (their producers'
        // deleters), which must not find the map locked.
        let given = std::mem::take(&mut *locked(&self.given));
        drop(given);
    }

    /// The steps of `next` and `take`: up to `most` tensors (see `step`), each handed out
    /// (through `convert`), and whether the load has ended (done, failed,
    /// closed or interrupted). An error after some tensors is kept for the next call
    /// (`failed`), and those tensors handed out.
    fn next_tensors(
        &self,
        py: Python<'_>,
        most: usize,
        bytes: usize,
        convert: Convert<'_>,
    ) -> (PyResult<Taken>, bool) {
        if let Some(error) = locked(&self.failed).take() {
            return (Err(error), true);
        }
        let _call = self.calls.enter();
        let (tensors, end) = py.detach(|| self.step(most, bytes));
        if !tensors.is_empty()
            && let Err(interrupted) = py.check_signals()
        {
            drop(tensors);
            self.close(py);
            return (Err(interrupted), true);
        }
        let mut out = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let name = tensor.name().to_owned();
            match self.hand_out(py, tensor, convert) {
                Ok(object) => out.push((name, object)),
                // The load ends with the error: what it still holds is freed.
                Err(error) => return (Err(error), true),
            }
        }
        match end {
            None => (Ok(out), false),
            Some(End::Done | End::Closed) => (Ok(out), true),
            Some(End::Failed(error)) => {
                let error = interrupted_or(py, error);
                if out.is_empty() {
                    return (Err(error), true);
                }
                *locked(&self.failed) = Some(error);
                (Ok(out), true)
            }
        }
    }

    /// The Python object for a loaded tensor: the caller's own object when it was read into
    /// the destination's memory, else a `_Staged` owning the memory.
    fn hand_out(
        &self,
        py: Python<'_>,
        tensor: Tensor,
        convert: Convert<'_>,
    ) -> PyResult<Py<PyAny>> {
        if tensor.path() == StagingPath::Destination {
            let given = locked(&self.given).remove(tensor.name());
            return given.map(|g| g.object.clone_ref(py)).ok_or_else(|| {
                errors::to_py(Error::Load(staging_core::Error::Internal(format!(
                    "tensor {:?} was read into a destination that was not kept",
                    tensor.name()
                ))))
            });
        }
        let handed = converted(py, tensor, self.device_index, convert.fast)?;
        match convert.other {
            Some(other) if handed.bind(py).is_instance_of::<Staged>() => {
                other.call1((handed,)).map(Bound::unbind)
            }
            _ => Ok(handed),
        }
    }
}

/// A tensor the library allocated, as `fast`'s tensor where it converts it, else a `_Staged`.
pub(crate) fn converted(
    py: Python<'_>,
    tensor: Tensor,
    device_index: i32,
    fast: Option<&Fast>,
) -> PyResult<Py<PyAny>> {
    let staged = staged_value(tensor, device_index)?;
    if let Some(fast) = fast
        && let Some(converted) = fast.tensor(py, &staged)?
    {
        return Ok(converted.unbind());
    }
    Ok(Py::new(py, staged)?.into_any())
}

/// How `take` hands tensors out: through `fast` where it converts them, else through `other`
/// (a Python function of a `_Staged`), else as `_Staged`.
#[derive(Clone, Copy, Default)]
struct Convert<'a> {
    fast: Option<&'a Fast>,
    other: Option<&'a Bound<'a, PyAny>>,
}

/// A tensor the library allocated, as a `_Staged` owning its memory (device or host).
pub(crate) fn staged(py: Python<'_>, tensor: Tensor, device_index: i32) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, staged_value(tensor, device_index)?)?.into_any())
}

/// A tensor the library allocated, owning its memory (device or host), as `_Staged` holds it.
pub(crate) fn staged_value(tensor: Tensor, device_index: i32) -> PyResult<Staged> {
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
        StagingPath::Mapped => {
            let (meta, bytes) = tensor.into_mapped().map_err(|t| unexpected(&t))?;
            (meta, "mapped", Memory::Mapped(bytes))
        }
        StagingPath::Destination => return Err(unexpected(&tensor)),
    };
    Ok(Staged::new(&meta, path, fallback, memory, device_index))
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

    fn __next__(&self, py: Python<'_>) -> PyResult<Handed> {
        // A second step would wait for this one, which may be waiting for it (a destination
        // callback that handed `next()` to another thread): refused at once instead.
        let Some(stepping) = Stepping::begin(&self.stepping) else {
            return Err(errors::staging(NEXT_DURING_STEP));
        };
        let (next, ended) = self.next_tensors(py, 1, 0, Convert::default());
        drop(stepping);
        // A `close()` during the step (from the callback or another thread) left the end to it.
        if ended || self.calls.is_closed() {
            self.end(py);
        }
        next.map(|tensors| tensors.into_iter().next())
    }

    /// Up to `most` tensors as `[(name, tensor)]`, fewer once they hold `bytes` together (at
    /// least one unless the load has ended; `[]` once it has): each through `fast` where it
    /// converts it, else through `convert` (a function of the `_Staged`) when given, else as
    /// `next()` gives it (a tensor read into a destination is the destination's object). A
    /// conversion that raises ends the load. Several tensors are read before the first is
    /// handed out, so not with a destination whose regions are reused (each is asked for
    /// before the tensors before it are handed out). An error after some tensors is raised by
    /// the next call.
    #[pyo3(signature = (most, bytes, fast=None, convert=None))]
    fn take(
        &self,
        py: Python<'_>,
        most: usize,
        bytes: usize,
        fast: Option<PyRef<'_, Fast>>,
        convert: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Taken> {
        let Some(stepping) = Stepping::begin(&self.stepping) else {
            return Err(errors::staging(NEXT_DURING_STEP));
        };
        let convert = Convert {
            fast: fast.as_deref(),
            other: convert.as_ref(),
        };
        let (next, ended) = self.next_tensors(py, most, bytes, convert);
        drop(stepping);
        if ended || self.calls.is_closed() {
            self.end(py);
        }
        next
    }

    /// Ends the load now, freeing its staging buffers; tensors already handed out stay. Never
    /// waits for a step: while one runs (called from its destination callback, or from another
    /// thread), the step ends the load as soon as it can, before the next tensor is read (the
    /// one the callback is being asked for is not read), and the iteration ends.
    fn close(&self, py: Python<'_>) {
        // SeqCst, with `Stepping::begin`'s: either this sees the step running, or the step sees
        // the load closed.
        self.calls.close();
        if !self.stepping.load(Ordering::SeqCst) {
            self.end(py);
        }
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
