//! `stg_load`: a load in progress, its report and last error, and the state machine by which
//! `stg_load_free` and a running `stg_load_next` (on another thread, or from the load's own
//! destination callback) agree on who frees the load.

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use safetensors_staging::{Error, Load, LoadReport, Loader};

use crate::boundary::{c_string, copy_message, free_boxed, guard};
use crate::config::{construct, stg_config};
use crate::destination::CallbackDestination;
use crate::status::{status_of, stg_status};
use crate::steps::{
    FREED_IN_CALLBACK, STEP_FREE_PENDING, STEP_FREEING, STEP_IDLE, STEP_RUNNING, STEPPING_HERE,
    Steps, stepping_here,
};
use crate::tensor::{stg_tensor, wrap_tensor};

/// A load in progress: yields tensors in file order.
///
/// Every entry point takes it by shared reference, so that a destination callback running
/// inside `stg_load_next` may call the others on it: the load itself is locked only by
/// `stg_load_next` (for the whole call), and what the other calls read (`shared`) is never
/// locked across the callback.
pub struct stg_load {
    load: Mutex<Load<'static>>,
    /// What `stg_load_next` and `stg_load_free` tell each other (and the destination callback).
    steps: Arc<Steps>,
    shared: Mutex<LoadShared>,
}

/// What a load's other calls read, also from inside its destination callback.
struct LoadShared {
    /// The report as of the last `stg_load_next` (or the last report read outside one).
    report: LoadReport,
    last_error: String,
    backend: CString,
    mode: CString,
}

impl stg_load {
    fn new(load: Load<'static>, steps: Arc<Steps>) -> Self {
        let report = load.report();
        Self {
            load: Mutex::new(load),
            steps,
            shared: Mutex::new(LoadShared {
                report,
                last_error: String::new(),
                backend: CString::default(),
                mode: CString::default(),
            }),
        }
    }

    fn shared(&self) -> MutexGuard<'_, LoadShared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The report now: the load's own when no `stg_load_next` is running, else the one as of
    /// the last tensor (the load is locked by the call whose callback is asking).
    fn report(&self) -> LoadReport {
        match self.load.try_lock() {
            Ok(load) => {
                let report = load.report();
                self.shared().report.clone_from(&report);
                report
            }
            Err(TryLockError::Poisoned(load)) => load.into_inner().report(),
            Err(TryLockError::WouldBlock) => self.shared().report.clone(),
        }
    }
}

/// How a `stg_load_next` step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepEnd {
    /// The load is the caller's again.
    Idle,
    /// The load was freed: another thread's `stg_load_free` asked for it during the step.
    Freed,
}

/// Starts a `stg_load_next` step on `load`: false when one is already running (a call from
/// its own destination callback) or the load is being freed.
///
/// # Safety
/// `load` is a live load.
unsafe fn start_step(load: *mut stg_load) -> bool {
    // SAFETY: live by the caller's contract.
    let state = &unsafe { &*load }.steps.state;
    if state
        .compare_exchange(STEP_IDLE, STEP_RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    let _ = STEPPING_HERE.try_with(|loads| loads.borrow_mut().push(load as usize));
    true
}

/// Ends the step `start_step` started on `load`, and frees the load if another thread's
/// `stg_load_free` asked for that meanwhile. Afterwards the load must not be touched: it is
/// the caller's again (`Idle`; another thread may free it from then on), or it is gone.
///
/// # Safety
/// `load` has a step running, started on this thread by `start_step`, ending here, once; no
/// reference to the load is used after this call.
unsafe fn end_step(load: *mut stg_load) -> StepEnd {
    let _ = STEPPING_HERE.try_with(|loads| {
        let mut loads = loads.borrow_mut();
        if let Some(at) = loads.iter().rposition(|&l| l == load as usize) {
            loads.remove(at);
        }
    });
    // SAFETY: a running step keeps the load alive (only it frees a load freed meanwhile, below)
    // until this exchange, the step's last use of it unless it frees it.
    let state = &unsafe { &*load }.steps.state;
    match state.compare_exchange(STEP_RUNNING, STEP_IDLE, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => StepEnd::Idle,
        Err(_) => {
            // STEP_FREE_PENDING: the freeing thread gave the load up to this step, and no
            // reference to it is used any more.
            // SAFETY: a pointer from `Box::into_raw` in `stg_load_new`, freed once, here.
            unsafe { free_boxed(load) };
            StepEnd::Freed
        }
    }
}

/// The loader the configuration's options give, with the plan rank's selection if one is set.
pub(crate) fn loader_of(config: &stg_config) -> Result<Loader<'static>, Error> {
    let loader = config.options.loader()?;
    match &config.plan_selection {
        None => Ok(loader),
        Some(_) if !config.options.select.is_empty() || !config.options.rows.is_empty() => {
            Err(Error::InvalidOption {
                key: "select".into(),
                value: config.options.select.join(" "),
                reason: "a plan rank (stg_config_set_plan_rank) already says what this load reads"
                    .into(),
            })
        }
        Some(selection) => Ok(loader.select(selection.clone())),
    }
}

/// Opens a load through the library's one entry point with the configuration's settings.
fn open_load(config: &stg_config, path: &str, steps: &Arc<Steps>) -> Result<Load<'static>, Error> {
    let loader = loader_of(config)?;
    match config.destination {
        Some(callback) => loader
            .raw_destination(CallbackDestination {
                callback,
                user_data: config.user_data,
                steps: Arc::clone(steps),
            })
            .open(path),
        None => loader.open(path),
    }
}

/// Opens the checkpoint at `path` (a directory, an index file, or a .safetensors file) with
/// `config`'s backend and settings. On failure `*out` is untouched and the message is available
/// from `stg_config_last_error`.
///
/// # Safety
/// `config` NULL or live; `path` NULL or NUL-terminated; `out` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_new(
    config: *const stg_config,
    path: *const c_char,
    out: *mut *mut stg_load,
) -> stg_status {
    // SAFETY: forwarded caller contract.
    unsafe {
        construct(config, path, out, status_of, |config, path| {
            let steps = Arc::new(Steps::new());
            Ok(stg_load::new(open_load(config, path, &steps)?, steps))
        })
    }
}

/// Frees a load and everything it still holds (tensors already returned stay valid). NULL does
/// nothing. It never blocks and never fails, so a destructor may call it.
///
/// While a `stg_load_next` on the load is running:
/// - called from that call's own destination callback, it does not free: the load stops and
///   the `stg_load_next` returns `STG_BUSY`; the handle stays valid, to be freed after it
///   returns (see `stg_destination_fn`);
/// - called from another thread, it frees all the same, when that call ends: the handle is
///   given up at once (this thread must not use it again); the load stops as soon as its
///   destination callback, if it has one, returns (before that tensor is read); and the running
///   `stg_load_next` frees it as it returns, with `STG_LOAD_FREED` and nothing written (a tensor
///   it had staged is freed with the load). The thread that called `stg_load_next` must not use
///   the handle after that status. Nothing leaks, whichever of the two calls finishes first; a
///   free that comes after `stg_load_next` returned is an ordinary free, of which that thread
///   must learn by the caller's own means. The destination callback is not called again once
///   `stg_load_free` has begun, but one call already in progress on the other thread may still
///   be running when it returns: keep the callback's `user_data` valid until that thread's
///   `stg_load_next` has returned.
///
/// # Safety
/// `load` must be NULL or a pointer from `stg_load_new` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_free(load: *mut stg_load) {
    // SAFETY: non-null pointers are live loads by the caller's contract.
    let Some(live) = (unsafe { load.as_ref() }) else {
        return;
    };
    if stepping_here(load as usize) {
        // Inside its own stg_load_next: freeing now would pull the load from under that call.
        live.steps.freed_in_callback.store(true, Ordering::Release);
        return;
    }
    let state = &live.steps.state;
    loop {
        match state.compare_exchange(STEP_IDLE, STEP_FREEING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            // Freed already (a second free): nothing of it is this call's.
            Err(STEP_FREE_PENDING | STEP_FREEING) => return,
            Err(_) => {}
        }
        // A step is running on another thread: it frees the load if told so before it ends (and
        // its callback stops the load). Once told, the load may be gone at any moment.
        match state.compare_exchange(
            STEP_RUNNING,
            STEP_FREE_PENDING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // The step frees it; this call touches nothing of it any more.
            Ok(_) | Err(STEP_FREE_PENDING | STEP_FREEING) => return,
            // The step ended meanwhile: free it here after all.
            Err(_) => {}
        }
    }
    // SAFETY: forwarded caller contract: a pointer from stg_load_new freed once, here; no step
    // is running and none can start (STEP_FREEING).
    unsafe { free_boxed(load) };
}

/// Stages the next tensor in file order. `STG_OK` writes `*out` (free it with
/// `stg_tensor_free`); `STG_END` means the load is over; any other status is the load's error
/// (its message from `stg_load_last_error`), after which the load only returns `STG_END`.
///
/// Called from the load's own destination callback it returns `STG_BUSY` and writes nothing.
/// When another thread called `stg_load_free` on the load meanwhile, it frees the load as it
/// returns: `STG_LOAD_FREED`, nothing written, and the handle is gone (see `stg_load_free`).
///
/// # Safety
/// `load` NULL or live and not used by another thread meanwhile (but for `stg_load_free`, as
/// documented there); `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_next(
    load: *mut stg_load,
    out: *mut *mut stg_tensor,
) -> stg_status {
    guard(|| {
        if load.is_null() || out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        // SAFETY: a non-null pointer is a live load by the caller's contract.
        if !unsafe { start_step(load) } {
            return stg_status::STG_BUSY;
        }
        // A panic is caught here, inside the step, so that the step always ends below.
        let stepped = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the running step keeps the load alive until `end_step`; only shared
            // references are made, since the destination callback may use the load meanwhile.
            step_once(unsafe { &*load })
        }));
        // SAFETY: the step started above ends here, once; nothing of the load is used after.
        match (unsafe { end_step(load) }, stepped) {
            (StepEnd::Freed, _) => stg_status::STG_LOAD_FREED,
            (StepEnd::Idle, Err(_)) => stg_status::STG_PANIC,
            (StepEnd::Idle, Ok((tensor, status))) => {
                if let Some(tensor) = tensor {
                    // SAFETY: `out` is non-null and writable by the caller's contract.
                    unsafe { *out = Box::into_raw(Box::new(tensor)) };
                }
                status
            }
        }
    })
}

/// The work of one `stg_load_next`: the next tensor (with `STG_OK`) or the status that ends
/// the load, with the report and message kept for the load's other calls.
fn step_once(load: &stg_load) -> (Option<stg_tensor>, stg_status) {
    let mut inner = load.load.lock().unwrap_or_else(PoisonError::into_inner);
    let item = inner.next();
    let report = inner.report();
    drop(inner);
    let mut shared = load.shared();
    shared.report = report;
    match item {
        None => (None, stg_status::STG_END),
        Some(Ok(tensor)) => (Some(wrap_tensor(tensor)), stg_status::STG_OK),
        Some(Err(_)) if load.steps.freed_in_callback.load(Ordering::Acquire) => {
            FREED_IN_CALLBACK.clone_into(&mut shared.last_error);
            (None, stg_status::STG_BUSY)
        }
        Some(Err(error)) => {
            shared.last_error = error.to_string();
            (None, status_of(&error))
        }
    }
}

/// Totals of a load, as `stg_load_report` gives them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stg_report {
    /// Files in the checkpoint.
    pub files: usize,
    /// Tensors staged so far.
    pub tensors: usize,
    /// Bytes staged so far.
    pub bytes: u64,
    /// Seconds from the first tensor asked for to the last one staged.
    pub seconds: f64,
    /// `bytes / seconds`.
    pub bytes_per_second: f64,
    /// Tensors and bytes per path.
    pub destination_tensors: usize,
    /// Bytes read into destinations.
    pub destination_bytes: u64,
    /// Tensors on the device path.
    pub device_tensors: usize,
    /// Bytes on the device path.
    pub device_bytes: u64,
    /// Tensors on the host path.
    pub host_tensors: usize,
    /// Bytes on the host path.
    pub host_bytes: u64,
    /// Host-path tensors because free memory was short.
    pub fallbacks_insufficient_memory: usize,
    /// Host-path tensors because the allocation failed after the check passed.
    pub fallbacks_allocation_race: usize,
    /// The most device bytes the library held at once.
    pub peak_device_bytes: u64,
    /// The most host bytes the library held at once.
    pub peak_host_bytes: u64,
    /// Read calls made to the backend (one per chunk or per run of coalesced small tensors,
    /// plus one per short read continued).
    pub read_requests: u64,
    /// Bytes the backend read from storage (for a full load, equal to `bytes`).
    pub bytes_read: u64,
    /// Device bytes the caller took with `stg_tensor_take_device_buffer` (the caller's from
    /// then on, counted against a device-memory cap until freed).
    pub taken_device_bytes: u64,
}

/// Writes the load's report so far into `*out`.
///
/// # Safety
/// `load` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_report(load: *mut stg_load, out: *mut stg_report) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live loads by the caller's contract.
        let Some(load) = (unsafe { load.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        let report = report_of(&load.report());
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { *out = report };
        stg_status::STG_OK
    })
}

/// The backend's name ("host", "cufile", "hipfile") and mode ("posix", "compat", ...), NUL-terminated,
/// valid until the next call with this load or its free; NULL for a NULL load.
///
/// # Safety
/// `load` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_backend(
    load: *mut stg_load,
    mode: *mut *const c_char,
) -> *const c_char {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: non-null pointers are live loads by the caller's contract.
        let Some(load) = (unsafe { load.as_ref() }) else {
            return std::ptr::null();
        };
        let r = load.report();
        let mut shared = load.shared();
        // Replaced only when they change, so that earlier pointers mostly stay valid.
        if shared.backend.as_bytes() != r.backend.as_bytes() {
            shared.backend = c_string(&r.backend);
        }
        if shared.mode.as_bytes() != r.mode.as_str().as_bytes() {
            shared.mode = c_string(r.mode.as_str());
        }
        if !mode.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { *mode = shared.mode.as_ptr() };
        }
        // The heap buffer of the CString outlives the lock: it is replaced only by a later
        // call with this load, as the header says.
        shared.backend.as_ptr()
    }));
    result.unwrap_or(std::ptr::null())
}

/// Copies the message of the load's last failure (file, tensor, offset) into `buf`; see
/// `stg_config_last_error` for the buffer rules.
///
/// # Safety
/// `load` NULL or live; `buf` writable for `len` bytes; `written` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_load_last_error(
    load: *const stg_load,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live loads by the caller's contract.
        let Some(load) = (unsafe { load.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        // SAFETY: forwarded caller contract.
        unsafe { copy_message(&load.shared().last_error, buf, len, written) }
    })
}

/// A load's report as C reads it.
pub(crate) fn report_of(r: &LoadReport) -> stg_report {
    stg_report {
        files: r.files,
        tensors: r.tensors,
        bytes: r.bytes,
        seconds: r.seconds,
        bytes_per_second: r.bytes_per_second,
        destination_tensors: r.paths.destination.tensors,
        destination_bytes: r.paths.destination.bytes,
        device_tensors: r.paths.device.tensors,
        device_bytes: r.paths.device.bytes,
        host_tensors: r.paths.host.tensors,
        host_bytes: r.paths.host.bytes,
        fallbacks_insufficient_memory: r.fallbacks.insufficient_memory,
        fallbacks_allocation_race: r.fallbacks.allocation_race,
        peak_device_bytes: r.peak_device_bytes,
        peak_host_bytes: r.peak_host_bytes,
        read_requests: r.read_requests,
        bytes_read: r.bytes_read,
        taken_device_bytes: r.taken_device_bytes,
    }
}
