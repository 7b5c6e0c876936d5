//! `stg_tensor`: one staged tensor (its description, its bytes), and `stg_device_buffer`, a
//! device buffer the caller took from one.

use std::ffi::{CString, c_char, c_void};

use safetensors_staging::{DeviceMemory, StagingPath, Tensor, TensorMeta};

use crate::boundary::{c_string, free_boxed, guard};
use crate::status::stg_status;

/// The path a tensor took.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum stg_path {
    /// Read straight into the caller's destination region.
    STG_PATH_DESTINATION = 0,
    /// Read straight into a device buffer of its own.
    STG_PATH_DEVICE = 1,
    /// Assembled in host memory.
    STG_PATH_HOST = 2,
}

/// A tensor as the library describes it. Strings and the shape stay valid while the tensor (or,
/// inside a destination callback, the call) lives.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stg_tensor_info {
    /// The tensor's name, NUL-terminated.
    pub name: *const c_char,
    /// The dtype as safetensors writes it ("BF16"), NUL-terminated.
    pub dtype: *const c_char,
    /// `ndim` dimensions.
    pub shape: *const u64,
    /// Number of dimensions.
    pub ndim: usize,
    /// Length in bytes.
    pub bytes: usize,
    /// The file that holds it, NUL-terminated.
    pub file: *const c_char,
    /// Its byte offset in the file.
    pub file_offset: u64,
    /// The path it took (unset, 0, inside a destination callback).
    pub path: stg_path,
    /// Where its bytes are: a device pointer (device path), a host pointer (host path, which
    /// the caller may write: it is the tensor's own memory), or the destination region's start.
    /// NULL inside a destination callback, and for an empty tensor on the host path.
    pub data: *mut c_void,
}

/// One staged tensor, owning its bytes (or naming the destination it filled).
pub struct stg_tensor {
    name: CString,
    dtype: CString,
    file: CString,
    shape: Vec<u64>,
    meta: TensorMeta,
    path: stg_path,
    /// `None` once its device buffer was taken.
    tensor: Option<Tensor>,
}

/// A device buffer the caller took from a tensor; free with `stg_device_buffer_free`.
pub struct stg_device_buffer {
    memory: DeviceMemory,
}

/// A staged tensor as C sees it, with the C strings and shape its description points to.
pub(crate) fn wrap_tensor(tensor: Tensor) -> stg_tensor {
    let path = match tensor.path() {
        StagingPath::Destination => stg_path::STG_PATH_DESTINATION,
        StagingPath::Device => stg_path::STG_PATH_DEVICE,
        StagingPath::Host => stg_path::STG_PATH_HOST,
    };
    let meta = tensor.meta().clone();
    stg_tensor {
        name: c_string(&meta.name),
        dtype: c_string(&meta.dtype_name()),
        file: c_string(&meta.file.display().to_string()),
        shape: meta.shape.iter().map(|&d| d as u64).collect(),
        meta,
        path,
        tensor: Some(tensor),
    }
}

/// Describes the tensor; the strings and shape stay valid until the tensor is freed.
///
/// # Safety
/// `tensor` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_tensor_describe(
    tensor: *const stg_tensor,
    out: *mut stg_tensor_info,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live tensors by the caller's contract.
        let Some(t) = (unsafe { tensor.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        // The host path's pointer comes from the allocation itself (write permission
        // included), not from a shared slice: C may write the tensor's own bytes.
        let data = match &t.tensor {
            Some(tensor) if tensor.path() == StagingPath::Host => match tensor.host_mut_ptr() {
                Some(ptr) if !tensor.is_empty() => ptr.cast::<c_void>(),
                _ => std::ptr::null_mut(),
            },
            Some(tensor) => tensor
                .device_ptr()
                .map_or(std::ptr::null_mut(), |addr| addr as *mut c_void),
            None => std::ptr::null_mut(),
        };
        let info = stg_tensor_info {
            name: t.name.as_ptr(),
            dtype: t.dtype.as_ptr(),
            shape: t.shape.as_ptr(),
            ndim: t.shape.len(),
            bytes: t.meta.len,
            file: t.file.as_ptr(),
            file_offset: t.meta.offset,
            path: t.path,
            data,
        };
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { *out = info };
        stg_status::STG_OK
    })
}

/// Copies the tensor's bytes into `dst` (`len` must equal its length), from the device for
/// device-path tensors. A destination-path tensor's bytes are the caller's: `STG_INVALID_ARGUMENT`.
///
/// # Safety
/// `tensor` NULL or live; `dst` writable for `len` bytes (or NULL when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_tensor_copy_to_host(
    tensor: *const stg_tensor,
    dst: *mut c_void,
    len: usize,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live tensors by the caller's contract.
        let Some(t) = (unsafe { tensor.as_ref() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if dst.is_null() && len > 0 {
            return stg_status::STG_NULL_ARGUMENT;
        }
        if len != t.meta.len {
            return stg_status::STG_LENGTH_MISMATCH;
        }
        if len == 0 {
            return stg_status::STG_OK;
        }
        let Some(tensor) = t
            .tensor
            .as_ref()
            .filter(|t| t.path() != StagingPath::Destination)
        else {
            return stg_status::STG_INVALID_ARGUMENT;
        };
        // SAFETY: the caller guarantees `dst` is writable for `len` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        match tensor.copy_to_host(out) {
            Ok(()) => stg_status::STG_OK,
            Err(_) => stg_status::STG_DEVICE,
        }
    })
}

/// Takes ownership of a device-path tensor's buffer: `*out` must later be freed with
/// `stg_device_buffer_free` (freeing the tensor no longer frees it). From then on the bytes are
/// the caller's: the load's report counts them in `taken_device_bytes`, not in the library's
/// peak, and a device-memory cap keeps counting them as used until the buffer is freed. A second
/// take, or a tensor on another path, is `STG_NOT_A_DEVICE_BUFFER`.
///
/// # Safety
/// `tensor` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_tensor_take_device_buffer(
    tensor: *mut stg_tensor,
    out: *mut *mut stg_device_buffer,
) -> stg_status {
    guard(|| {
        // SAFETY: non-null pointers are live tensors by the caller's contract.
        let Some(t) = (unsafe { tensor.as_mut() }) else {
            return stg_status::STG_NULL_ARGUMENT;
        };
        if out.is_null() {
            return stg_status::STG_NULL_ARGUMENT;
        }
        let Some(tensor) = t.tensor.take() else {
            return stg_status::STG_NOT_A_DEVICE_BUFFER;
        };
        match tensor.take_device() {
            Ok((_, memory)) => {
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { *out = Box::into_raw(Box::new(stg_device_buffer { memory })) };
                stg_status::STG_OK
            }
            Err(tensor) => {
                t.tensor = Some(tensor);
                stg_status::STG_NOT_A_DEVICE_BUFFER
            }
        }
    })
}

/// Frees a tensor and the bytes it owns (not a buffer taken from it, not a destination). NULL
/// does nothing.
///
/// # Safety
/// `tensor` must be NULL or a pointer from `stg_load_next` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_tensor_free(tensor: *mut stg_tensor) {
    // SAFETY: forwarded caller contract: NULL, or a pointer from stg_load_next freed once.
    unsafe { free_boxed(tensor) };
}

/// The device pointer of a taken buffer (NULL for NULL or an empty buffer).
///
/// # Safety
/// `buffer` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_device_buffer_ptr(buffer: *const stg_device_buffer) -> *mut c_void {
    // SAFETY: non-null pointers are live buffers by the caller's contract.
    match unsafe { buffer.as_ref() } {
        Some(b) => b.memory.addr() as *mut c_void,
        None => std::ptr::null_mut(),
    }
}

/// The length in bytes of a taken buffer (0 for NULL).
///
/// # Safety
/// `buffer` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_device_buffer_len(buffer: *const stg_device_buffer) -> usize {
    // SAFETY: non-null pointers are live buffers by the caller's contract.
    unsafe { buffer.as_ref() }.map_or(0, |b| b.memory.len())
}

/// Frees a taken device buffer. NULL does nothing.
///
/// # Safety
/// `buffer` must be NULL or a pointer from `stg_tensor_take_device_buffer` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_device_buffer_free(buffer: *mut stg_device_buffer) {
    // SAFETY: forwarded caller contract: NULL, or a pointer from stg_tensor_take_device_buffer
    // freed once.
    unsafe { free_boxed(buffer) };
}
