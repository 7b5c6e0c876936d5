//! The device and the context the library works in: [`CudaDevice`] (the primary context
//! retained, or a caller's context or stream), [`BoundContext`], the guard that makes that
//! context current and takes it off again, and the [`ContextFaults`] the guards and buffers
//! record.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};
use staging_core::DeviceError;

use super::device_error;
use super::stack::take_off_stack;
use crate::errors::{Error, cuda_code};

/// One CUDA device with the context the library works in: its primary context, retained by
/// this handle, or a caller's `cudarc` context.
#[derive(Debug)]
pub struct CudaDevice {
    pub(super) ordinal: usize,
    device: sys::CUdevice,
    context: sys::CUcontext,
    /// Who keeps `context` alive.
    owner: Owner,
    /// The caller's stream that copies to the device are queued on, if one was given.
    stream: Option<Arc<CudaStream>>,
    /// What its guards and buffers found wrong.
    faults: Mutex<ContextFaults>,
}

/// What a device's context guards and buffers found wrong and did not undo blindly
/// ([`CudaDevice::faults`]). Each is a sign of code that left the thread's context stack out of
/// order between a bind and its guard's drop, or of a driver that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContextFaults {
    /// Guards that did not find their context on top of the stack when they dropped: taken from
    /// under the contexts pushed over it, or, not found, the stack left as it was.
    pub misplaced_contexts: u64,
    /// Device allocations left allocated because their context could not be made current (a
    /// free in another context would be wrong) or the free failed.
    pub leaked_buffers: u64,
    /// Their bytes.
    pub leaked_bytes: u64,
    /// The last fault, in words.
    pub last: Option<String>,
}

/// Who keeps a device's context alive.
#[derive(Debug)]
enum Owner {
    /// This handle retained the primary context and releases it when dropped.
    Retained,
    /// The caller's `cudarc` context, kept alive by its `Arc` for as long as this handle lives.
    Caller(#[allow(dead_code)] Arc<CudaContext>),
}

// SAFETY: a primary context may be made current on any thread; the handle is only passed to the
// driver, which synchronizes internally.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; `&CudaDevice` only allows binding the context and driver calls.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Confirms a CUDA driver and device `ordinal` exist, and retains its primary context.
    /// Never calls into `cudarc` before the driver library is known to load.
    pub fn open(ordinal: usize) -> Result<Arc<Self>, Error> {
        // SAFETY: this only tries to dlopen the driver library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoCudaDriver);
        }
        let cuda = |call| {
            move |e: DriverError| Error::Cuda {
                call,
                code: cuda_code(e),
            }
        };
        result::init().map_err(cuda("cuInit"))?;
        let count = result::device::get_count().map_err(cuda("cuDeviceGetCount"))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(Error::NoDevice);
        }
        if ordinal >= count {
            return Err(Error::DeviceOutOfRange {
                requested: ordinal,
                count,
            });
        }
        let index = i32::try_from(ordinal).map_err(|_| Error::DeviceOutOfRange {
            requested: ordinal,
            count,
        })?;
        let device = result::device::get(index).map_err(cuda("cuDeviceGet"))?;
        // SAFETY: `device` came from cuDeviceGet.
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(cuda("cuDevicePrimaryCtxRetain"))?;
        let this = Self {
            ordinal,
            device,
            context,
            owner: Owner::Retained,
            stream: None,
            faults: Mutex::default(),
        };
        // The context can be made current (and is not left so).
        drop(this.bind().map_err(cuda("cuCtxPushCurrent"))?);
        Ok(Arc::new(this))
    }

    /// The device of a caller's `cudarc` context, working in that context (primary or not):
    /// nothing is retained or released here, the `Arc` keeps it alive. Copies to the device run
    /// on streams the library creates in it (one per pinned buffer).
    pub fn from_context(context: &Arc<CudaContext>) -> Result<Arc<Self>, Error> {
        Self::caller(context, None)
    }

    /// The device of a caller's `cudarc` stream, working in the stream's context; every copy to
    /// the device is queued on `stream` (and waited for by events recorded on it), so the
    /// library creates no stream of its own.
    pub fn from_stream(stream: &Arc<CudaStream>) -> Result<Arc<Self>, Error> {
        Self::caller(stream.context(), Some(Arc::clone(stream)))
    }

    fn caller(
        context: &Arc<CudaContext>,
        stream: Option<Arc<CudaStream>>,
    ) -> Result<Arc<Self>, Error> {
        let this = Self {
            ordinal: context.ordinal(),
            device: context.cu_device(),
            context: context.cu_ctx(),
            owner: Owner::Caller(Arc::clone(context)),
            stream,
            faults: Mutex::default(),
        };
        // The context can be made current (and is not left so).
        drop(this.bind().map_err(|e| Error::Cuda {
            call: "cuCtxPushCurrent",
            code: cuda_code(e),
        })?);
        Ok(Arc::new(this))
    }

    /// Whether the context is a caller's (given to [`from_context`](Self::from_context) or
    /// [`from_stream`](Self::from_stream)) rather than the primary context retained here.
    pub fn is_callers(&self) -> bool {
        matches!(self.owner, Owner::Caller(_))
    }

    /// The caller's stream copies are queued on, if one was given.
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        self.stream.as_ref()
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The context the library works in: the primary context this handle retained, or the
    /// caller's.
    pub fn context(&self) -> sys::CUcontext {
        self.context
    }

    /// Makes the device's context current on this thread for as long as the guard lives:
    /// pushed when another context (or none) is current, and taken off the stack again when the
    /// guard drops, so the caller's context is current again. When it already is current,
    /// nothing is pushed.
    pub fn bind(&self) -> Result<BoundContext<'_>, DriverError> {
        let below = result::ctx::get_current()?;
        if below == Some(self.context) {
            return Ok(BoundContext {
                device: self,
                pushed: None,
                _thread: PhantomData,
            });
        }
        // SAFETY: the context was retained in `open` (or is the caller's, kept alive by its
        // `Arc`) and is released only when this device is dropped, which the guard's borrow
        // prevents while it is pushed.
        unsafe { sys::cuCtxPushCurrent_v2(self.context) }.result()?;
        Ok(BoundContext {
            device: self,
            pushed: Some(below),
            _thread: PhantomData,
        })
    }

    /// What this device's guards and buffers found wrong so far.
    pub fn faults(&self) -> ContextFaults {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records a fault: `count` says which counters it adds to.
    pub(super) fn record(&self, count: impl FnOnce(&mut ContextFaults), what: String) {
        let mut faults = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
        count(&mut faults);
        faults.last = Some(what);
    }
}

impl CudaDevice {
    /// Waits for the work queued on `stream` of this device's primary context (null: the legacy
    /// default stream, which a DLPack producer orders after its own current stream when asked
    /// for stream 1), with the context bound only for the call.
    ///
    /// # Safety
    /// `stream` is null or a live stream of this device's primary context.
    pub unsafe fn synchronize(&self, stream: sys::CUstream) -> Result<(), DeviceError> {
        let _bound = self
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        // SAFETY: forwarded caller contract; the stream's context is current.
        unsafe { result::stream::synchronize(stream) }
            .map_err(|e| device_error("cuStreamSynchronize", e))
    }
}

/// A device's context made current by [`CudaDevice::bind`]; dropping it takes that context off
/// the thread's stack again, so the context that was current before is current again. It stays
/// on the thread that made it (a context stack is per thread).
///
/// Guards drop in the reverse order of their making, as scopes do; when one does not (another
/// guard, or other code, pushed a context over its own and has not popped it yet), it takes its
/// own context from under the others, which stay as they were. It never pops a context it did
/// not push: when its own is not on the stack any more (popped, or replaced with
/// `cuCtxSetCurrent`, by other code), it leaves the stack as it finds it. Either is recorded in
/// the device's [`faults`](CudaDevice::faults).
#[derive(Debug)]
#[must_use = "the device's context is current only while the guard lives"]
pub struct BoundContext<'a> {
    /// The device (its context stays retained while the guard borrows it).
    device: &'a CudaDevice,
    /// When `bind` pushed the device's context: the context that was current beneath it.
    pushed: Option<Option<sys::CUcontext>>,
    /// Neither `Send` nor `Sync`: a context stack is per thread.
    _thread: PhantomData<*const ()>,
}

impl Drop for BoundContext<'_> {
    fn drop(&mut self) {
        let Some(below) = self.pushed else {
            return;
        };
        let own = self.device.context;
        match take_off_stack(own, below) {
            Ok(0) => {}
            Ok(over) => self.device.record(
                |f| f.misplaced_contexts += 1,
                format!(
                    "a context guard of CUDA device {} dropped under {over} context(s) pushed \
                     over its own: its own was taken from under them",
                    self.device.ordinal
                ),
            ),
            Err(why) => self.device.record(
                |f| f.misplaced_contexts += 1,
                format!(
                    "a context guard of CUDA device {}: {why}",
                    self.device.ordinal
                ),
            ),
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Owner::Retained = self.owner {
            // SAFETY: the device came from cuDeviceGet and its primary context was retained
            // once, in `open`.
            let _ = unsafe { result::primary_ctx::release(self.device) };
        }
    }
}
