//! CUDA through `cudarc`'s driver API (loaded at run time): the device and its primary context,
//! device buffers, pinned host buffers, and the allocator.
//!
//! `cudarc` panics when `libcuda` is missing, so [`CudaDevice::open`] checks
//! `is_culib_present()` before its first call. Errors are formatted from the `CUresult` itself,
//! never through `cuGetErrorString`.
//!
//! The caller's current context stays the caller's: every call that needs the device's context
//! makes it current through [`CudaDevice::bind`], which pushes it only when another context (or
//! none) is current and takes it off again when its guard drops, on every path (errors, `Drop`
//! of buffers, whichever thread frees a tensor). A guard takes off only the context it pushed:
//! one that other code pushed over it stays (its own is taken from under it), and one whose
//! context is gone leaves the stack alone. Memory is freed only in its own context: a buffer
//! whose context cannot be made current is left allocated rather than freed in another. What
//! was found wrong is kept per device ([`CudaDevice::faults`]). Nothing here calls
//! `cuCtxSetCurrent`.
//!
//! A caller with CUDA of its own hands in its `cudarc` context ([`CudaDevice::from_context`]) or
//! stream ([`CudaDevice::from_stream`]): the device then uses that context (primary or not,
//! kept alive by the caller's `Arc`, never retained or released here), and with a stream the
//! POSIX path queues its copies on it, so the library creates no stream of its own.
//!
//! Length: every CUDA driver call of the backend is in this one file, so that its unsafe code
//! (and the contexts, streams and frees it must balance) can be read and audited in one place.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};
use staging_core::{
    AllocError, DeviceAllocator, DeviceBuffer, DeviceError, DeviceRegion, MemoryInfo, MemorySpace,
};

use crate::errors::{Error, cuda_code};

/// CUDA device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaMemory;

impl MemorySpace for CudaMemory {
    const NAME: &'static str = "cuda";
}

/// One CUDA device with the context the library works in: its primary context, retained by
/// this handle, or a caller's `cudarc` context.
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: usize,
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

/// How many contexts pushed over its own a guard looks under for its own before it leaves the
/// stack alone.
const MAX_CONTEXTS_OVER_A_GUARD: usize = 16;

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
    fn record(&self, count: impl FnOnce(&mut ContextFaults), what: String) {
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

/// Takes `own` (pushed by a guard over `below`, the context then current) off this thread's
/// context stack, leaving every other entry where it is: the contexts pushed over it since are
/// popped, `own` is popped, and they are pushed back in their order. Only `own` is searched
/// for, never below `below` (the stack beneath the guard is the caller's), nor under more than
/// [`MAX_CONTEXTS_OVER_A_GUARD`] contexts. `Ok` says how many contexts it was under; `Err`
/// says what went wrong and what the stack is left as.
///
/// A context on the stack does not say who pushed it: `own` pushed by other code over the
/// guard's own is taken for the guard's, which leaves the same stack.
fn take_off_stack(own: sys::CUcontext, below: Option<sys::CUcontext>) -> Result<usize, String> {
    let mut over = Vec::new();
    let left_alone = "the stack was left as it was";
    let found = loop {
        let current = match result::ctx::get_current() {
            Ok(current) => current,
            Err(e) => break Err(format!("cuCtxGetCurrent: {}; {left_alone}", cuda_code(e))),
        };
        if current == Some(own) {
            break match pop_current() {
                Ok(popped) if popped == own => Ok(over.len()),
                Ok(popped) => {
                    over.push(popped);
                    Err(format!(
                        "cuCtxPopCurrent returned another context than the current one; \
                         {left_alone}"
                    ))
                }
                Err(e) => Err(format!("cuCtxPopCurrent: {}; {left_alone}", cuda_code(e))),
            };
        }
        if current.is_none() || current == below {
            break Err(format!(
                "its context was not found on this thread's stack above the context current \
                 when it was bound (other code popped it, or replaced it with \
                 cuCtxSetCurrent); {left_alone}"
            ));
        }
        if over.len() == MAX_CONTEXTS_OVER_A_GUARD {
            break Err(format!(
                "its context was not found under {MAX_CONTEXTS_OVER_A_GUARD} contexts pushed \
                 over it; {left_alone}"
            ));
        }
        match pop_current() {
            Ok(popped) => over.push(popped),
            Err(e) => break Err(format!("cuCtxPopCurrent: {}; {left_alone}", cuda_code(e))),
        }
    };
    // The contexts pushed over `own` go back, the lowest first.
    for (pushed_back, &context) in over.iter().rev().enumerate() {
        // SAFETY: a context that was on this thread's stack a moment ago, so alive (its owner
        // keeps it alive while it is pushed).
        if let Err(e) = unsafe { sys::cuCtxPushCurrent_v2(context) }.result() {
            return Err(format!(
                "cuCtxPushCurrent of a context popped from over the guard's failed ({}): \
                 {} of the {} contexts pushed over it are lost from this thread's stack",
                cuda_code(e),
                over.len() - pushed_back,
                over.len()
            ));
        }
    }
    found
}

/// Pops this thread's current context; the context popped.
fn pop_current() -> Result<sys::CUcontext, DriverError> {
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops this thread's top context into a valid local; the callers pop only what they
    // push back, or the context their guard pushed.
    unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result()?;
    Ok(popped)
}

/// The context current on this thread when it was made, made current again when it drops if
/// something (code of `cudarc`'s, which binds its context with `cuCtxSetCurrent`) replaced it.
#[derive(Debug)]
pub(crate) struct CallerContext {
    saved: Option<sys::CUcontext>,
    _thread: PhantomData<*const ()>,
}

impl CallerContext {
    pub(crate) fn save() -> Self {
        Self {
            saved: result::ctx::get_current().ok().flatten(),
            _thread: PhantomData,
        }
    }
}

impl Drop for CallerContext {
    fn drop(&mut self) {
        let now = result::ctx::get_current().ok().flatten();
        if now != self.saved {
            // SAFETY: the saved context was current on this thread when this guard was made
            // (or none was: null unbinds), and the caller keeps it alive meanwhile.
            let _ = unsafe { result::ctx::set_current(self.saved.unwrap_or(std::ptr::null_mut())) };
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

/// A device allocation. Dropping it frees it.
#[derive(Debug)]
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    device: Arc<CudaDevice>,
}

// SAFETY: the buffer exclusively owns its device allocation; device pointers are plain numbers
// valid in the device's context on any thread.
unsafe impl Send for CudaBuffer {}

impl CudaBuffer {
    /// The device pointer.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device the allocation lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Gives up the allocation without freeing it: `(pointer, length)`, now the caller's to free.
    pub(crate) fn release(mut self) -> (sys::CUdeviceptr, usize) {
        let taken = (self.ptr, self.len);
        self.ptr = 0;
        taken
    }
}

// SAFETY: the buffer owns its `cuMemAlloc` allocation of `len` bytes exclusively until dropped;
// `ptr` and `len` never change; `region` covers exactly it.
unsafe impl DeviceBuffer for CudaBuffer {
    type Space = CudaMemory;

    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> usize {
        self.ptr as usize
    }

    fn region(&mut self) -> DeviceRegion<'_, CudaMemory> {
        // SAFETY: the allocation is `len` bytes of device memory owned by this buffer, and the
        // region borrows the buffer mutably.
        unsafe { DeviceRegion::from_raw_parts(self.ptr as usize, self.len) }
    }
}

impl Drop for CudaBuffer {
    /// Frees the allocation in its own context. When that cannot be made current the allocation
    /// is left allocated and recorded in the device's faults: freeing it in whatever context is
    /// current would be wrong.
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let leaked = |why: String| {
            self.device.record(
                |f| {
                    f.leaked_buffers += 1;
                    f.leaked_bytes += self.len as u64;
                },
                format!(
                    "a device allocation of {} bytes at {:#x} on CUDA device {} was left \
                     allocated: {why}",
                    self.len, self.ptr, self.device.ordinal
                ),
            );
        };
        let _bound = match self.device.bind() {
            Ok(bound) => bound,
            Err(e) => {
                return leaked(format!(
                    "its context could not be made current ({})",
                    cuda_code(e)
                ));
            }
        };
        // SAFETY: `ptr` came from cuMemAlloc in this device's context, which is current; it is
        // freed once, here; nothing borrows it now.
        if let Err(e) = unsafe { result::free_sync(self.ptr) } {
            leaked(format!("cuMemFree: {}", cuda_code(e)));
        }
    }
}

/// Device memory of one CUDA device.
#[derive(Debug, Clone)]
pub struct CudaAllocator {
    device: Arc<CudaDevice>,
}

impl CudaAllocator {
    /// An allocator on `device`.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self { device }
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

fn device_error(operation: &str, e: DriverError) -> DeviceError {
    DeviceError::new(operation, cuda_code(e))
}

impl DeviceAllocator for CudaAllocator {
    type Space = CudaMemory;
    type Buffer = CudaBuffer;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let _bound = self
            .device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        let (free, total) = result::mem_get_info().map_err(|e| device_error("cuMemGetInfo", e))?;
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn allocate(&self, len: usize) -> Result<CudaBuffer, AllocError> {
        let device = Arc::clone(&self.device);
        if len == 0 {
            return Ok(CudaBuffer {
                ptr: 0,
                len,
                device,
            });
        }
        let failed = |e: DriverError| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                AllocError::OutOfMemory {
                    requested: len,
                    detail: format!("cuMemAlloc: {}", cuda_code(e)),
                }
            } else {
                AllocError::Failed {
                    requested: len,
                    detail: format!("cuMemAlloc: {}", cuda_code(e)),
                }
            }
        };
        let _bound = self.device.bind().map_err(failed)?;
        // SAFETY: a plain allocation of `len` bytes in the bound context.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(failed)?;
        Ok(CudaBuffer { ptr, len, device })
    }

    fn copy_to_host(
        &self,
        src: &CudaBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        DeviceError::check_bounds("cuMemcpyDtoH", src.len, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _bound = self
            .device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        // SAFETY: the source range lies inside `src`'s allocation (checked above) and `dst` is a
        // valid host slice of the copied length; the copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(dst, src.ptr + offset as u64) }
            .map_err(|e| device_error("cuMemcpyDtoH", e))
    }
}

/// Page-locked host memory for bounce buffers (`cuMemHostAlloc`, portable, not write-combined,
/// since the CPU writes it with `pread` and the GPU reads it). Copies from it run on a stream of
/// its own (created at the first copy), or on the caller's stream when the device has one, so
/// they overlap the next `pread` into another buffer; an event recorded after each copy says when
/// it is done, so waiting for this buffer's copy never waits for anything queued after it.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: *mut c_void,
    len: usize,
    device: Arc<CudaDevice>,
    /// The stream this buffer created (null until its first copy, and always when the device has
    /// the caller's stream).
    own_stream: sys::CUstream,
    /// Recorded after each copy (null until the first).
    event: sys::CUevent,
    /// What says the copy started last has finished.
    pending: Pending,
}

/// What [`PinnedBuffer::wait`] waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// No copy is running.
    Nothing,
    /// The event recorded after the copy.
    Event,
    /// The stream the copy ran on (its event could not be recorded).
    Stream,
}

// SAFETY: the buffer exclusively owns its pinned allocation, its stream and its event; a stream
// may be used from any thread with its context current.
unsafe impl Send for PinnedBuffer {}

/// `CU_MEMHOSTALLOC_PORTABLE`.
const MEMHOSTALLOC_PORTABLE: u32 = 1;

impl PinnedBuffer {
    /// Allocates `len` pinned bytes.
    pub fn new(device: &Arc<CudaDevice>, len: usize) -> Result<Self, DeviceError> {
        let _bound = device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        // SAFETY: a plain pinned allocation; the memory is written before it is read.
        let ptr = unsafe { result::malloc_host(len.max(1), MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| device_error("cuMemHostAlloc", e))?;
        if ptr.is_null() {
            return Err(DeviceError::new(
                "cuMemHostAlloc",
                "returned a null pointer",
            ));
        }
        Ok(Self {
            ptr,
            len,
            device: Arc::clone(device),
            own_stream: std::ptr::null_mut(),
            event: std::ptr::null_mut(),
            pending: Pending::Nothing,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, for `pread` to fill, once any copy still reading them has finished (it waits
    /// for it: there is no safe mutable access while an asynchronous copy may be running).
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], DeviceError> {
        self.wait()?;
        // SAFETY: `ptr` is a live allocation of at least `len` bytes owned by `self`; pinned
        // memory from the driver is ordinary readable and writable host memory, and no copy
        // reads it any more (waited for above).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) })
    }

    /// The stream copies go on: the caller's, or this buffer's own (created the first time, with
    /// the device's context current).
    fn stream(&mut self) -> Result<sys::CUstream, DeviceError> {
        if let Some(callers) = self.device.stream() {
            return Ok(callers.cu_stream());
        }
        if self.own_stream.is_null() {
            self.own_stream = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(|e| device_error("cuStreamCreate", e))?;
        }
        Ok(self.own_stream)
    }

    /// Starts copying the first `dst.len()` bytes to `dst` on the buffer's stream
    /// (`cuMemcpyHtoDAsync`, then an event recorded after it); [`wait`](Self::wait) waits for it.
    ///
    /// # Safety
    /// Until `wait` has returned `Ok` (or the buffer is dropped, which waits), the caller does
    /// not write this buffer's bytes and keeps `dst`'s memory allocated and otherwise unused.
    pub unsafe fn copy_to_device_async(
        &mut self,
        dst: DeviceRegion<'_, CudaMemory>,
    ) -> Result<(), DeviceError> {
        let n = dst.len();
        if n > self.len {
            return Err(DeviceError::new(
                "cuMemcpyHtoDAsync",
                "copy larger than the bounce buffer",
            ));
        }
        let device = Arc::clone(&self.device);
        let _bound = device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        let stream = self.stream()?;
        if self.event.is_null() {
            self.event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| device_error("cuEventCreate", e))?;
        }
        // SAFETY: `ptr` holds at least `n` bytes (checked above) that the caller leaves alone
        // until `wait`; `dst` is `n` bytes of device memory the caller keeps allocated and
        // unused until then; the stream is this buffer's or the caller's (kept alive by the
        // device), in the bound context.
        unsafe {
            let src = std::slice::from_raw_parts(self.ptr.cast::<u8>(), n);
            result::memcpy_htod_async(dst.addr() as u64, src, stream)
        }
        .map_err(|e| device_error("cuMemcpyHtoDAsync", e))?;
        // From here a copy may be running: without its event, `wait` waits for the stream.
        self.pending = Pending::Stream;
        // SAFETY: the event was created by this buffer in the bound context, and the stream is
        // live.
        unsafe { result::event::record(self.event, stream) }
            .map_err(|e| device_error("cuEventRecord", e))?;
        self.pending = Pending::Event;
        Ok(())
    }

    /// Synchronizes the stream copies go on (when there is one).
    fn synchronize_stream(&self) -> Result<(), DeviceError> {
        let stream = match self.device.stream() {
            Some(callers) => callers.cu_stream(),
            None if self.own_stream.is_null() => return Ok(()),
            None => self.own_stream,
        };
        // SAFETY: the stream is this buffer's or the caller's (kept alive by the device), and
        // the caller of this method bound the device's context.
        unsafe { result::stream::synchronize(stream) }
            .map_err(|e| device_error("cuStreamSynchronize", e))
    }

    /// Waits for the copy started last (`cuEventSynchronize` on the event recorded after it);
    /// returns at once when none is running.
    pub fn wait(&mut self) -> Result<(), DeviceError> {
        if self.pending == Pending::Nothing {
            return Ok(());
        }
        let device = Arc::clone(&self.device);
        let _bound = device
            .bind()
            .map_err(|e| device_error("cuCtxPushCurrent", e))?;
        match self.pending {
            // SAFETY: the event was created by this buffer and is destroyed only on drop.
            Pending::Event => unsafe { result::event::synchronize(self.event) }
                .map_err(|e| device_error("cuEventSynchronize", e))?,
            _ => self.synchronize_stream()?,
        }
        self.pending = Pending::Nothing;
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let device = Arc::clone(&self.device);
        let _bound = device.bind();
        // A copy still reading the pinned memory finishes before the memory is freed.
        if self.wait().is_err() {
            let _ = self.synchronize_stream();
        }
        if !self.event.is_null() {
            // SAFETY: the event belongs to this buffer and is destroyed once, here.
            let _ = unsafe { result::event::destroy(self.event) };
        }
        if !self.own_stream.is_null() {
            // SAFETY: the stream belongs to this buffer (nothing is queued on it any more) and is
            // destroyed once, here.
            let _ = unsafe { result::stream::destroy(self.own_stream) };
        }
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here, after any copy from it.
        let _ = unsafe { result::free_host(self.ptr) };
    }
}

impl backend_gds::Pinned for PinnedBuffer {
    fn wait(&mut self) -> Result<(), DeviceError> {
        PinnedBuffer::wait(self)
    }

    fn bytes_mut(&mut self) -> Result<&mut [u8], DeviceError> {
        PinnedBuffer::bytes_mut(self)
    }
}

impl backend_gds::Gpu for CudaDevice {
    type Space = CudaMemory;
    type Pinned = PinnedBuffer;
    type Bound<'a> = BoundContext<'a>;

    fn bind(&self) -> Result<BoundContext<'_>, DeviceError> {
        CudaDevice::bind(self).map_err(|e| device_error("cuCtxPushCurrent", e))
    }

    fn pinned(gpu: &Arc<Self>, len: usize) -> Result<PinnedBuffer, DeviceError> {
        PinnedBuffer::new(gpu, len)
    }

    unsafe fn copy_to_device(
        &self,
        src: &mut PinnedBuffer,
        dst: DeviceRegion<'_, CudaMemory>,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded caller contract (the same as `copy_to_device_async`'s).
        unsafe { src.copy_to_device_async(dst) }
    }
}
