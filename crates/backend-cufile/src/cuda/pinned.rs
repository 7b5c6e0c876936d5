//! Pinned host memory: [`PinnedBuffer`], a bounce buffer of the POSIX path whose copies to the
//! device run asynchronously on a stream, with an event to wait for each.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use staging_core::{DeviceError, DeviceRegion};

use super::device::CudaDevice;
use super::{CudaMemory, device_error};

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
