//! The HIP runtime, declared here and loaded at run time from `libamdhip64`: the dozen calls the
//! backend makes, one table loaded once. hipError_t 0 is success, 2 out-of-memory, 100 no device.
//!
//! The caller's current device stays the caller's: every call that needs the device makes it
//! current through [`HipDevice::bind`], which sets it only when another device is current and
//! sets the caller's back when its guard drops, on every path (errors, `Drop` of buffers,
//! whichever thread frees a tensor).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend_gds::dl;
use libloading::Library;
use staging_core::{
    AllocError, DeviceAllocator, DeviceBuffer, DeviceError, DeviceRegion, MemoryInfo, MemorySpace,
};

use crate::errors::Error;

/// HIP device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipMemory;

impl MemorySpace for HipMemory {
    const NAME: &'static str = "hip";
}

type HipError = c_int;
const HIP_SUCCESS: HipError = 0;
const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
const HIP_ERROR_NO_DEVICE: HipError = 100;
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;

/// The names tried, in order, when no explicit path is given.
pub(crate) const DEFAULT_NAMES: [&str; 3] =
    ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"];
/// The environment variable naming an explicit runtime path.
pub(crate) const LIBRARY_ENV: &str = "STAGING_HIP_LIB";

/// The HIP runtime calls this backend makes.
pub struct HipRuntime {
    path: PathBuf,
    init: unsafe extern "C" fn(c_uint) -> HipError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    get_device: unsafe extern "C" fn(*mut c_int) -> HipError,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError,
    memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> HipError,
    stream_create: unsafe extern "C" fn(*mut *mut c_void) -> HipError,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> HipError,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> HipError,
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    host_free: unsafe extern "C" fn(*mut c_void) -> HipError,
    get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    _library: Library,
}

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipRuntime")
            .field("path", &self.path)
            .finish()
    }
}

impl HipRuntime {
    /// Loads the runtime: `explicit`, else `$STAGING_HIP_LIB`, else the default names. Loading
    /// runs no HIP function.
    pub fn load(explicit: Option<&Path>) -> Result<Self, Error> {
        // SAFETY: the candidates are the HIP runtime (AMD's or a test stub), which this backend uses.
        let lib = unsafe { dl::load(explicit, LIBRARY_ENV, &DEFAULT_NAMES) }
            .map_err(|tried| Error::NoHipRuntime { tried })?;
        // SAFETY: every type below is the C signature of its symbol in hip_runtime_api.h, and the
        // pointers live as long as `_library`, which the struct owns.
        unsafe {
            Ok(Self {
                init: lib.required("hipInit")?,
                get_device_count: lib.required("hipGetDeviceCount")?,
                set_device: lib.required("hipSetDevice")?,
                get_device: lib.required("hipGetDevice")?,
                mem_get_info: lib.required("hipMemGetInfo")?,
                malloc: lib.required("hipMalloc")?,
                free: lib.required("hipFree")?,
                memcpy: lib.required("hipMemcpy")?,
                memcpy_async: lib.required("hipMemcpyAsync")?,
                stream_create: lib.required("hipStreamCreate")?,
                stream_synchronize: lib.required("hipStreamSynchronize")?,
                stream_destroy: lib.required("hipStreamDestroy")?,
                host_malloc: lib.required("hipHostMalloc")?,
                host_free: lib.required("hipHostFree")?,
                get_error_string: lib.required("hipGetErrorString")?,
                path: lib.path,
                _library: lib.library,
            })
        }
    }

    fn message(&self, code: HipError) -> String {
        // SAFETY: hipGetErrorString returns a static NUL-terminated string (or NULL).
        let text = unsafe { (self.get_error_string)(code) };
        if text.is_null() {
            return format!("hipError {code}");
        }
        // SAFETY: non-null, static, NUL-terminated per the HIP API.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, call: &'static str, code: HipError) -> Result<(), Error> {
        if code == HIP_SUCCESS {
            Ok(())
        } else {
            Err(Error::Hip {
                call,
                code,
                message: self.message(code),
            })
        }
    }

    fn device_error(&self, call: &str, code: HipError) -> DeviceError {
        DeviceError::new(call, format!("{} ({code})", self.message(code)))
    }
}

/// One HIP device of a loaded runtime.
#[derive(Debug)]
pub struct HipDevice {
    runtime: Arc<HipRuntime>,
    ordinal: c_int,
}

impl HipDevice {
    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        usize::try_from(self.ordinal).unwrap_or_default()
    }

    /// Initializes HIP and confirms device `ordinal` exists.
    pub fn open(runtime: Arc<HipRuntime>, ordinal: usize) -> Result<Arc<Self>, Error> {
        // SAFETY: hipInit takes flags 0.
        runtime.check("hipInit", unsafe { (runtime.init)(0) })?;
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        let status = unsafe { (runtime.get_device_count)(&mut count) };
        if status == HIP_ERROR_NO_DEVICE || (status == HIP_SUCCESS && count <= 0) {
            return Err(Error::NoDevice);
        }
        runtime.check("hipGetDeviceCount", status)?;
        let count = usize::try_from(count).unwrap_or(0);
        let index = c_int::try_from(ordinal)
            .ok()
            .filter(|_| ordinal < count)
            .ok_or(Error::DeviceOutOfRange {
                requested: ordinal,
                count,
            })?;
        let device = Self {
            runtime,
            ordinal: index,
        };
        // The device can be made current (and is not left so).
        drop(device.bind()?);
        Ok(Arc::new(device))
    }

    /// Makes this device current on this thread for as long as the guard lives: set only when
    /// another device is current, and that one set back when the guard drops.
    pub fn bind(&self) -> Result<BoundDevice<'_>, Error> {
        let rt = &self.runtime;
        let mut current: c_int = 0;
        // SAFETY: writes one int.
        rt.check("hipGetDevice", unsafe { (rt.get_device)(&mut current) })?;
        if current == self.ordinal {
            return Ok(BoundDevice {
                restore: None,
                device: self,
                _thread: PhantomData,
            });
        }
        // SAFETY: the ordinal was checked against the device count.
        rt.check("hipSetDevice", unsafe { (rt.set_device)(self.ordinal) })?;
        Ok(BoundDevice {
            restore: Some(current),
            device: self,
            _thread: PhantomData,
        })
    }

    /// Waits for the work queued on `stream` of this device (null: its default stream, which a
    /// DLPack producer orders after its own current stream when asked for stream 0), with the
    /// device current only for the call.
    ///
    /// # Safety
    /// `stream` is null or a live stream of this device.
    pub unsafe fn synchronize(&self, stream: *mut c_void) -> Result<(), DeviceError> {
        let _bound = self.bound()?;
        let rt = &self.runtime;
        // SAFETY: forwarded caller contract; the device is current.
        match unsafe { (rt.stream_synchronize)(stream) } {
            HIP_SUCCESS => Ok(()),
            code => Err(rt.device_error("hipStreamSynchronize", code)),
        }
    }

    fn bound(&self) -> Result<BoundDevice<'_>, DeviceError> {
        self.bind().map_err(|e| match e {
            Error::Hip {
                call,
                code,
                message,
            } => DeviceError::new(call, format!("{message} ({code})")),
            other => DeviceError::new("hipSetDevice", other.to_string()),
        })
    }
}

/// A device made current by [`HipDevice::bind`]; dropping it makes the device that was current
/// before current again. It stays on the thread that made it (the current device is per thread).
#[derive(Debug)]
#[must_use = "the device is current only while the guard lives"]
pub struct BoundDevice<'a> {
    restore: Option<c_int>,
    device: &'a HipDevice,
    _thread: PhantomData<*const ()>,
}

impl Drop for BoundDevice<'_> {
    fn drop(&mut self) {
        if let Some(previous) = self.restore {
            // SAFETY: `previous` was the current device of this thread when the guard was made,
            // so it is a valid ordinal of this runtime.
            let _ = unsafe { (self.device.runtime.set_device)(previous) };
        }
    }
}

/// A device allocation (`hipMalloc`); freed on drop.
#[derive(Debug)]
pub struct HipBuffer {
    ptr: *mut c_void,
    len: usize,
    device: Arc<HipDevice>,
}

// SAFETY: the buffer exclusively owns its allocation; device pointers are valid on any thread.
unsafe impl Send for HipBuffer {}
// SAFETY: shared access only reads the pointer value.
unsafe impl Sync for HipBuffer {}

// SAFETY: the buffer owns its `hipMalloc` allocation of `len` bytes exclusively until dropped;
// `ptr` and `len` never change; `region` covers exactly it.
unsafe impl DeviceBuffer for HipBuffer {
    type Space = HipMemory;
    fn len(&self) -> usize {
        self.len
    }
    fn addr(&self) -> usize {
        self.ptr as usize
    }
    fn region(&mut self) -> DeviceRegion<'_, HipMemory> {
        // SAFETY: `len` bytes of device memory owned by this buffer, borrowed mutably.
        unsafe { DeviceRegion::from_raw_parts(self.ptr as usize, self.len) }
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        let _bound = self.device.bind();
        // SAFETY: `ptr` came from hipMalloc and is freed once, here.
        let _ = unsafe { (self.device.runtime.free)(self.ptr) };
    }
}

/// Device memory of one HIP device.
#[derive(Debug, Clone)]
pub struct HipAllocator {
    device: Arc<HipDevice>,
}

impl HipAllocator {
    /// An allocator on `device`.
    pub fn new(device: Arc<HipDevice>) -> Self {
        Self { device }
    }

    /// The device.
    pub fn device(&self) -> &Arc<HipDevice> {
        &self.device
    }
}

impl DeviceAllocator for HipAllocator {
    type Space = HipMemory;
    type Buffer = HipBuffer;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let rt = &self.device.runtime;
        let _bound = self.device.bound()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t values.
        let status = unsafe { (rt.mem_get_info)(&mut free, &mut total) };
        if status != HIP_SUCCESS {
            return Err(rt.device_error("hipMemGetInfo", status));
        }
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn allocate(&self, len: usize) -> Result<HipBuffer, AllocError> {
        let device = Arc::clone(&self.device);
        if len == 0 {
            return Ok(HipBuffer {
                ptr: std::ptr::null_mut(),
                len,
                device,
            });
        }
        let rt = &self.device.runtime;
        let failed = |code: HipError| {
            let detail = format!("hipMalloc: {} ({code})", rt.message(code));
            if code == HIP_ERROR_OUT_OF_MEMORY {
                AllocError::OutOfMemory {
                    requested: len,
                    detail,
                }
            } else {
                AllocError::Failed {
                    requested: len,
                    detail,
                }
            }
        };
        let _bound = self.device.bind().map_err(|e| AllocError::Failed {
            requested: len,
            detail: e.to_string(),
        })?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a plain allocation of `len` bytes on the current device.
        let status = unsafe { (rt.malloc)(&mut ptr, len) };
        if status != HIP_SUCCESS || ptr.is_null() {
            return Err(failed(if status == HIP_SUCCESS {
                HIP_ERROR_OUT_OF_MEMORY
            } else {
                status
            }));
        }
        Ok(HipBuffer { ptr, len, device })
    }

    fn copy_to_host(
        &self,
        src: &HipBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        DeviceError::check_bounds("hipMemcpy", src.len, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let rt = &self.device.runtime;
        let _bound = self.device.bound()?;
        // SAFETY: the source range lies inside `src` (checked above), `dst` is valid for its
        // length, and hipMemcpy is synchronous.
        let status = unsafe {
            (rt.memcpy)(
                dst.as_mut_ptr().cast(),
                src.ptr.cast::<u8>().add(offset).cast(),
                dst.len(),
                MEMCPY_DEVICE_TO_HOST,
            )
        };
        if status != HIP_SUCCESS {
            return Err(rt.device_error("hipMemcpy", status));
        }
        Ok(())
    }
}

/// Page-locked host memory for bounce buffers (`hipHostMalloc`). Copies from it run on a stream
/// of its own (created at the first copy), so they overlap the next `pread` into another buffer.
#[derive(Debug)]
pub struct HipPinned {
    ptr: *mut c_void,
    len: usize,
    device: Arc<HipDevice>,
    stream: *mut c_void,
    pending: bool,
}

// SAFETY: the buffer exclusively owns its pinned allocation and its stream; a stream may be used
// from any thread with its device current.
unsafe impl Send for HipPinned {}

impl backend_gds::Pinned for HipPinned {
    /// Waits for any copy still reading the bytes, then hands them out.
    fn bytes_mut(&mut self) -> Result<&mut [u8], DeviceError> {
        self.wait()?;
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by `self`, and no copy reads it
        // any more (waited for above).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) })
    }

    /// `hipStreamSynchronize` on the buffer's stream, when a copy was started.
    fn wait(&mut self) -> Result<(), DeviceError> {
        if !self.pending {
            return Ok(());
        }
        let device = Arc::clone(&self.device);
        let _bound = device.bound()?;
        let rt = &self.device.runtime;
        // SAFETY: the stream was created by this buffer and is destroyed only on drop.
        match unsafe { (rt.stream_synchronize)(self.stream) } {
            HIP_SUCCESS => {
                self.pending = false;
                Ok(())
            }
            code => Err(rt.device_error("hipStreamSynchronize", code)),
        }
    }
}

impl Drop for HipPinned {
    fn drop(&mut self) {
        let rt = &self.device.runtime;
        if !self.stream.is_null() {
            let _bound = self.device.bind();
            // SAFETY: the stream belongs to this buffer; a copy still running is waited for
            // before the pinned memory it reads is freed, and the stream is destroyed once.
            unsafe {
                let _ = (rt.stream_synchronize)(self.stream);
                let _ = (rt.stream_destroy)(self.stream);
            }
        }
        // SAFETY: `ptr` came from hipHostMalloc and is freed once, here, after any copy from it.
        let _ = unsafe { (rt.host_free)(self.ptr) };
    }
}

impl backend_gds::Gpu for HipDevice {
    type Space = HipMemory;
    type Pinned = HipPinned;
    type Bound<'a> = BoundDevice<'a>;

    fn bind(&self) -> Result<BoundDevice<'_>, DeviceError> {
        self.bound()
    }

    fn pinned(gpu: &Arc<Self>, len: usize) -> Result<HipPinned, DeviceError> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a plain pinned allocation (flags 0: hipHostMallocDefault).
        let status = unsafe { (gpu.runtime.host_malloc)(&mut ptr, len.max(1), 0) };
        if status != HIP_SUCCESS || ptr.is_null() {
            return Err(gpu.runtime.device_error("hipHostMalloc", status));
        }
        Ok(HipPinned {
            ptr,
            len,
            device: Arc::clone(gpu),
            stream: std::ptr::null_mut(),
            pending: false,
        })
    }

    /// `hipMemcpyAsync` on `src`'s stream; `src.wait()` waits for it.
    unsafe fn copy_to_device(
        &self,
        src: &mut HipPinned,
        dst: DeviceRegion<'_, HipMemory>,
    ) -> Result<(), DeviceError> {
        if dst.len() > src.len {
            return Err(DeviceError::new(
                "hipMemcpyAsync",
                "copy larger than the bounce buffer",
            ));
        }
        let _bound = self.bound()?;
        if src.stream.is_null() {
            let mut stream = std::ptr::null_mut();
            // SAFETY: writes one stream handle, owned by `src` from here on.
            match unsafe { (self.runtime.stream_create)(&mut stream) } {
                HIP_SUCCESS if !stream.is_null() => src.stream = stream,
                code => return Err(self.runtime.device_error("hipStreamCreate", code)),
            }
        }
        // SAFETY: `src` holds at least `dst.len()` bytes (checked above) that the caller leaves
        // alone until `src.wait()`; `dst` is device memory the caller keeps allocated and unused
        // until then (this function's contract); the stream belongs to `src`.
        let status = unsafe {
            (self.runtime.memcpy_async)(
                dst.addr() as *mut c_void,
                src.ptr,
                dst.len(),
                MEMCPY_HOST_TO_DEVICE,
                src.stream,
            )
        };
        match status {
            HIP_SUCCESS => {
                src.pending = true;
                Ok(())
            }
            code => Err(self.runtime.device_error("hipMemcpyAsync", code)),
        }
    }
}
