//! The `destination=` callback of the Python door: what the caller's function returns is taken
//! through DLPack and checked here, where the `unsafe impl RawDestination` rests on it. Python
//! hands over objects, never addresses.
//!
//! For each tensor the caller's function is called with `(name, TensorInfo)`; `None` declines.
//! Anything else must export DLPack (`torch.Tensor`, `numpy.ndarray`, CuPy, JAX, ...) and be:
//! on the load's memory (host memory for a CPU load; CUDA or ROCm device N for a load on
//! device N), C-contiguous, writable, of a byte-sized dtype that holds the tensor's bytes as they
//! are, and at least the tensor's bytes long. The imported DLPack tensor (whose deleter keeps
//! the producer's memory alive) and the object are kept until the tensor is handed out.
//!
//! Dtypes: the bytes are copied as they are, never converted, so any dtype whose every byte
//! pattern is a value will do (`uint8` for the raw bytes, the tensor's own dtype, or another of
//! the caller's choosing). Bool is the one that is not: only 0 and 1 are bools (torch and NumPy
//! assume so), so a bool destination takes a `BOOL` tensor only. A `BOOL` tensor's bytes, 0 or
//! 1, are values of every dtype, so it may go into any destination.
//!
//! Synchronization: the library writes a device destination from outside any stream, so the
//! producer's queued work on that memory must be done first. The DLPack import asks for the
//! device's legacy default stream (CUDA stream 1, ROCm stream 0), which the producer (torch, in
//! `__dlpack__(stream=...)`) orders after its current stream; that stream is then synchronized
//! before anything is written. Through the DLPack C exchange API the producer's own stream is
//! synchronized instead.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use dlpark::DlpackFlags;
use dlpark::ffi::{DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::python::consumer::stream::{self, DlpackStream, StreamArg};
use dlpark::python::consumer::{ImportRequest, ImportedDlpack};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use safetensors_staging::{DestinationError, Dtype, ErrorKind, RawDestination, TensorMeta};
use staging_core::DeviceError;

use crate::errors;
use crate::interrupt::Calls;
use crate::lock::locked;
use crate::tensor_info::TensorInfo;

/// The error a load closed during a step ends with (the destination is not asked for, or its
/// answer not taken); the iteration then ends quietly, as after any `close()`.
const CLOSED_DURING_STEP: &str = "the load was closed while it was loading a tensor";

/// A destination the callback gave: its Python object (handed out as the tensor) and the DLPack
/// import that keeps its memory alive until then.
pub(crate) struct Given {
    pub(crate) object: Py<PyAny>,
    memory: Option<ImportedDlpack>,
}

// SAFETY: the imported tensor is only released (its producer's deleter called) in `Drop`, with
// the GIL held, on whichever thread drops it; DLPack producers accept that (the consumer owns the
// managed tensor until it calls the deleter). `object` is a `Py`, which is `Send`.
unsafe impl Send for Given {}

impl Drop for Given {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            Python::attach(|_| drop(memory));
        }
    }
}

/// Destinations given and not yet handed out, by tensor name.
pub(crate) type GivenMap = Arc<std::sync::Mutex<std::collections::HashMap<String, Given>>>;

/// The device a load writes destinations on, opened when first needed to synchronize.
enum Device {
    Cuda(Arc<safetensors_staging::cufile::CudaDevice>),
    Hip(Arc<safetensors_staging::hipfile::HipDevice>),
}

impl Device {
    fn open(space: &str, ordinal: usize) -> Result<Self, String> {
        match space {
            "cuda" => safetensors_staging::cufile::CudaDevice::open(ordinal)
                .map(Device::Cuda)
                .map_err(|e| e.to_string()),
            "hip" => {
                let runtime = safetensors_staging::hipfile::HipRuntime::load(None)
                    .map_err(|e| e.to_string())?;
                safetensors_staging::hipfile::HipDevice::open(Arc::new(runtime), ordinal)
                    .map(Device::Hip)
                    .map_err(|e| e.to_string())
            }
            other => Err(format!("no device to synchronize for {other} memory")),
        }
    }

    /// Waits for `stream` (null: the default stream).
    ///
    /// # Safety
    /// `stream` is null or a live stream of this device.
    unsafe fn synchronize(&self, stream: *mut c_void) -> Result<(), DeviceError> {
        match self {
            // SAFETY: forwarded caller contract.
            Device::Cuda(device) => unsafe { device.synchronize(stream.cast()) },
            // SAFETY: forwarded caller contract.
            Device::Hip(device) => unsafe { device.synchronize(stream) },
        }
    }
}

/// The consumer side of the DLPack stream negotiation for one import.
struct Consumer<'a> {
    device: Option<&'a Device>,
    /// Set when the producer's own stream was synchronized (DLPack C exchange API).
    waited: Cell<bool>,
}

// SAFETY: the stream asked for is the device type's default-stream sentinel (CUDA 1, ROCm 0),
// valid for any device of that type; a CPU producer gets none.
unsafe impl DlpackStream for Consumer<'_> {
    fn as_python_arg(&self, _py: Python<'_>, device: DLDevice) -> PyResult<StreamArg> {
        match device.device_type {
            DLDeviceType::CUDA => Ok(stream::cuda(std::ptr::null_mut())),
            DLDeviceType::ROCM => stream::rocm(std::ptr::null_mut()),
            _ => Ok(stream::none()),
        }
    }

    unsafe fn wait_for_producer(&self, _device: DLDevice, producer: *mut c_void) -> PyResult<bool> {
        let Some(device) = self.device else {
            return Ok(false);
        };
        // SAFETY: the caller's contract: `producer` is the live stream the producer's exchange
        // API gave for this device.
        unsafe { device.synchronize(producer) }.map_err(|e| destination_error(e.to_string()))?;
        self.waited.set(true);
        Ok(true)
    }
}

/// A `DestinationError` with `message`, its `kind` set as every error of the package has it.
fn destination_error(message: String) -> PyErr {
    errors::of_kind(ErrorKind::Destination, message)
}

/// The destination callback of a Python load.
pub(crate) struct PyDestination {
    pub(crate) callback: Py<PyAny>,
    pub(crate) given: GivenMap,
    /// The load's calls: whether it was closed (from the callback, or another thread).
    pub(crate) calls: Arc<Calls>,
    /// The GPU ordinal of the load (device destinations must be on it).
    pub(crate) ordinal: usize,
    device: OnceLock<Result<Device, String>>,
}

impl PyDestination {
    pub(crate) fn new(
        callback: Py<PyAny>,
        given: GivenMap,
        calls: Arc<Calls>,
        ordinal: usize,
    ) -> Self {
        Self {
            callback,
            given,
            calls,
            ordinal,
            device: OnceLock::new(),
        }
    }

    /// The device to synchronize for `space`, opened once.
    fn device(&self, space: &'static str) -> PyResult<Option<&Device>> {
        if space == "host" {
            return Ok(None);
        }
        match self
            .device
            .get_or_init(|| Device::open(space, self.ordinal))
        {
            Ok(device) => Ok(Some(device)),
            Err(e) => Err(destination_error(format!(
                "cannot synchronize {space}:{} before writing a destination: {e}",
                self.ordinal
            ))),
        }
    }
}

/// The DLPack device types a destination may be on for a load into `space`.
fn accepts(space: &str, device: DLDevice, ordinal: usize) -> bool {
    let on_ordinal = usize::try_from(device.device_id) == Ok(ordinal);
    match space {
        "host" => matches!(
            device.device_type,
            DLDeviceType::CPU | DLDeviceType::CUDAHOST | DLDeviceType::ROCMHOST
        ),
        "cuda" => device.device_type == DLDeviceType::CUDA && on_ordinal,
        "hip" => device.device_type == DLDeviceType::ROCM && on_ordinal,
        _ => false,
    }
}

fn describe(device: DLDevice) -> String {
    let kind = match device.device_type {
        DLDeviceType::CPU => "cpu",
        DLDeviceType::CUDA => "cuda",
        DLDeviceType::CUDAHOST => "cuda pinned host memory",
        DLDeviceType::ROCM => "rocm",
        DLDeviceType::ROCMHOST => "rocm pinned host memory",
        DLDeviceType(other) => return format!("DLPack device type {other}:{}", device.device_id),
    };
    format!("{kind}:{}", device.device_id)
}

/// Imports `object` through DLPack, asking for `consumer`'s stream; a producer too old for the
/// versioned protocol (`max_version`) is asked again with the legacy one.
fn import(object: &Bound<'_, PyAny>, consumer: &Consumer<'_>) -> PyResult<ImportedDlpack> {
    let first = ImportRequest::new(object.as_borrowed())?.import(Some(consumer), None);
    match first {
        Err(e) if e.is_instance_of::<PyTypeError>(object.py()) => {
            let device = dlpark::python::consumer::dlpack_device(object.as_borrowed())?;
            // The same default-stream sentinels as `Consumer::as_python_arg`.
            let stream = match device.device_type {
                DLDeviceType::CUDA => Some(1),
                DLDeviceType::ROCM => Some(0),
                _ => None,
            };
            let capsule = match stream {
                Some(stream) => {
                    let kwargs = pyo3::types::PyDict::new(object.py());
                    kwargs.set_item("stream", stream)?;
                    object.call_method("__dlpack__", (), Some(&kwargs))?
                }
                None => object.call_method0("__dlpack__")?,
            };
            ImportRequest::new(capsule.as_borrowed())?.import(None, None)
        }
        other => other,
    }
}

impl PyDestination {
    /// The checked region of the object the callback returned for `tensor`, kept alive in
    /// `given` until the tensor is handed out.
    fn take(
        &self,
        tensor: &TensorMeta,
        space: &'static str,
        object: Bound<'_, PyAny>,
    ) -> PyResult<(usize, usize)> {
        let name = &tensor.name;
        let fail = |what: String| destination_error(format!("tensor {name:?}: {what}"));
        let type_name = object
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        if object.getattr("__dlpack__").is_err() {
            return Err(fail(format!(
                "the destination returned {type_name}, which does not export DLPack; expected \
                 a torch.Tensor, a numpy.ndarray (or another DLPack array) or None"
            )));
        }
        let device = self.device(space)?;
        let consumer = Consumer {
            device,
            waited: Cell::new(false),
        };
        let imported = import(&object, &consumer).map_err(|e| {
            fail(format!(
                "the destination ({type_name}) could not be taken through DLPack: {e}"
            ))
        })?;
        let (address, nbytes) = {
            let view = imported
                .validate()
                .map_err(|e| fail(format!("the destination's DLPack tensor is invalid: {e}")))?;
            if !accepts(space, view.device(), self.ordinal) {
                let load = if space == "host" {
                    "in host memory".to_owned()
                } else {
                    format!("on {space}:{}", self.ordinal)
                };
                return Err(fail(format!(
                    "the load is {load} but the destination is on {}",
                    describe(view.device())
                )));
            }
            if imported.flags().contains(DlpackFlags::READ_ONLY) {
                return Err(fail("the destination is read-only".to_owned()));
            }
            if !view.is_compact().unwrap_or(false) {
                return Err(fail("the destination tensor is not contiguous".to_owned()));
            }
            let dtype = view.dtype();
            if dtype.lanes != 1 || dtype.bits == 0 || dtype.bits % 8 != 0 {
                return Err(fail(format!(
                    "the destination's dtype ({} bits, {} lanes) is not a whole number of bytes \
                     per element",
                    dtype.bits, dtype.lanes
                )));
            }
            if dtype.code == DLDataTypeCode::BOOL && tensor.dtype != Dtype::BOOL {
                let theirs = tensor.dtype_name();
                return Err(fail(format!(
                    "the destination's dtype is bool but the tensor is {theirs}: a bool holds only \
                     0 or 1, and {theirs} bytes copied into it would not be bools; give a \
                     destination of the tensor's own dtype, or uint8 for its raw bytes"
                )));
            }
            let base = view.data_ptr() as usize;
            let offset = usize::try_from(view.byte_offset())
                .map_err(|_| fail("the destination's byte offset is too large".to_owned()))?;
            let address = base
                .checked_add(offset)
                .ok_or_else(|| fail("the destination's address overflows".to_owned()))?;
            if address == 0 && view.num_bytes() > 0 {
                return Err(fail("the destination has a null data pointer".to_owned()));
            }
            (address, view.num_bytes())
        };
        // The producer's queued work on this memory is done before the library writes it.
        if let Some(device) = device
            && !consumer.waited.get()
        {
            // SAFETY: null is the default stream, which the producer ordered after its own
            // current stream when it exported for the default stream.
            unsafe { device.synchronize(std::ptr::null_mut()) }
                .map_err(|e| fail(format!("synchronizing before the write failed: {e}")))?;
        }
        let given = Given {
            object: object.unbind(),
            memory: Some(imported),
        };
        locked(&self.given).insert(name.clone(), given);
        Ok((address, nbytes))
    }
}

// SAFETY: the region is the memory of a DLPack tensor imported from the object the callback
// returned, checked above to be on the memory space the load writes (`space`, and the load's
// device ordinal), C-contiguous, writable (not flagged read-only), of whole bytes per element,
// of a dtype every byte written into it is a value of (bool only for a BOOL tensor), and
// `nbytes` long (the stager refuses a region shorter than the tensor). The imported tensor
// keeps the producer's memory alive until the tensor is handed out (`given`), and the producer's
// queued work on it was waited for. The caller of `stage(destination=...)` promises, as
// documented there, not to touch that memory until then.
unsafe impl RawDestination for PyDestination {
    fn region(
        &mut self,
        tensor: &TensorMeta,
        space: &'static str,
    ) -> Result<Option<(usize, usize)>, DestinationError> {
        Python::attach(|py| -> PyResult<Option<(usize, usize)>> {
            let closed = || errors::staging(CLOSED_DURING_STEP);
            if self.calls.is_closed() {
                return Err(closed());
            }
            let info = TensorInfo::new(tensor);
            let out = self.callback.call1(py, (tensor.name.as_str(), info))?;
            // Closed by the callback, or by another thread meanwhile: the tensor is not read.
            if self.calls.is_closed() {
                return Err(closed());
            }
            if out.is_none(py) {
                return Ok(None);
            }
            self.take(tensor, space, out.into_bound(py)).map(Some)
        })
        .map_err(|e| Box::new(e) as DestinationError)
    }
}
