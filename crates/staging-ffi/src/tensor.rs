//! `stg_tensor`: one staged tensor (its description, its bytes), and `stg_device_buffer`, a
//! device buffer the caller took from one.

use std::ffi::{CString, c_char, c_void};

use safetensors_staging::{DeviceMemory, Dtype, StagingPath, Tensor, TensorMeta};

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
    /// A private (copy-on-write) mapping of its file in host memory (`map`; device `cpu`):
    /// `data` is valid until the tensor is freed, and writes to it stay in this process.
    STG_PATH_MAPPED = 3,
}

/// A tensor's element type, as safetensors names them (`STG_DTYPE_BF16` is "BF16"). Numbers
/// are stable. A dtype the library reads but this header has no number for is
/// `STG_DTYPE_UNKNOWN`; its name is still in `stg_tensor_info.dtype` and its size in
/// `stg_tensor_info.dtype_bits`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum stg_dtype {
    /// A dtype without a number in this header (see `dtype` and `dtype_bits`).
    STG_DTYPE_UNKNOWN = 0,
    /// Boolean, one byte per element.
    STG_DTYPE_BOOL = 1,
    /// Unsigned 8-bit integer.
    STG_DTYPE_U8 = 2,
    /// Signed 8-bit integer.
    STG_DTYPE_I8 = 3,
    /// Unsigned 16-bit integer.
    STG_DTYPE_U16 = 4,
    /// Signed 16-bit integer.
    STG_DTYPE_I16 = 5,
    /// Unsigned 32-bit integer.
    STG_DTYPE_U32 = 6,
    /// Signed 32-bit integer.
    STG_DTYPE_I32 = 7,
    /// Unsigned 64-bit integer.
    STG_DTYPE_U64 = 8,
    /// Signed 64-bit integer.
    STG_DTYPE_I64 = 9,
    /// IEEE half precision.
    STG_DTYPE_F16 = 10,
    /// bfloat16.
    STG_DTYPE_BF16 = 11,
    /// IEEE single precision.
    STG_DTYPE_F32 = 12,
    /// IEEE double precision.
    STG_DTYPE_F64 = 13,
    /// Complex of two 32-bit floats (64 bits).
    STG_DTYPE_C64 = 14,
    /// FP8 E4M3.
    STG_DTYPE_F8_E4M3 = 15,
    /// FP8 E5M2.
    STG_DTYPE_F8_E5M2 = 16,
    /// FP8 E8M0 (microscaling scale).
    STG_DTYPE_F8_E8M0 = 17,
    /// FP8 E4M3, FNUZ variant.
    STG_DTYPE_F8_E4M3FNUZ = 18,
    /// FP8 E5M2, FNUZ variant.
    STG_DTYPE_F8_E5M2FNUZ = 19,
    /// MXFP4 (4 bits: two elements per byte).
    STG_DTYPE_F4 = 20,
    /// MXFP6 E2M3 (6 bits: four elements per three bytes).
    STG_DTYPE_F6_E2M3 = 21,
    /// MXFP6 E3M2 (6 bits: four elements per three bytes).
    STG_DTYPE_F6_E3M2 = 22,
}

impl stg_dtype {
    /// Every dtype with a number, in number order.
    pub const ALL: [stg_dtype; 23] = {
        use stg_dtype::*;
        [
            STG_DTYPE_UNKNOWN,
            STG_DTYPE_BOOL,
            STG_DTYPE_U8,
            STG_DTYPE_I8,
            STG_DTYPE_U16,
            STG_DTYPE_I16,
            STG_DTYPE_U32,
            STG_DTYPE_I32,
            STG_DTYPE_U64,
            STG_DTYPE_I64,
            STG_DTYPE_F16,
            STG_DTYPE_BF16,
            STG_DTYPE_F32,
            STG_DTYPE_F64,
            STG_DTYPE_C64,
            STG_DTYPE_F8_E4M3,
            STG_DTYPE_F8_E5M2,
            STG_DTYPE_F8_E8M0,
            STG_DTYPE_F8_E4M3FNUZ,
            STG_DTYPE_F8_E5M2FNUZ,
            STG_DTYPE_F4,
            STG_DTYPE_F6_E2M3,
            STG_DTYPE_F6_E3M2,
        ]
    };

    /// The number of a safetensors dtype (`STG_DTYPE_UNKNOWN` for one added to safetensors
    /// after this header).
    pub(crate) fn of(dtype: Dtype) -> Self {
        use stg_dtype::*;
        match dtype {
            Dtype::BOOL => STG_DTYPE_BOOL,
            Dtype::U8 => STG_DTYPE_U8,
            Dtype::I8 => STG_DTYPE_I8,
            Dtype::U16 => STG_DTYPE_U16,
            Dtype::I16 => STG_DTYPE_I16,
            Dtype::U32 => STG_DTYPE_U32,
            Dtype::I32 => STG_DTYPE_I32,
            Dtype::U64 => STG_DTYPE_U64,
            Dtype::I64 => STG_DTYPE_I64,
            Dtype::F16 => STG_DTYPE_F16,
            Dtype::BF16 => STG_DTYPE_BF16,
            Dtype::F32 => STG_DTYPE_F32,
            Dtype::F64 => STG_DTYPE_F64,
            Dtype::C64 => STG_DTYPE_C64,
            Dtype::F8_E4M3 => STG_DTYPE_F8_E4M3,
            Dtype::F8_E5M2 => STG_DTYPE_F8_E5M2,
            Dtype::F8_E8M0 => STG_DTYPE_F8_E8M0,
            Dtype::F8_E4M3FNUZ => STG_DTYPE_F8_E4M3FNUZ,
            Dtype::F8_E5M2FNUZ => STG_DTYPE_F8_E5M2FNUZ,
            Dtype::F4 => STG_DTYPE_F4,
            Dtype::F6_E2M3 => STG_DTYPE_F6_E2M3,
            Dtype::F6_E3M2 => STG_DTYPE_F6_E3M2,
            _ => STG_DTYPE_UNKNOWN,
        }
    }

    /// Bits per element (0 for `STG_DTYPE_UNKNOWN`).
    pub fn bits(self) -> u32 {
        use stg_dtype::*;
        match self {
            STG_DTYPE_UNKNOWN => 0,
            STG_DTYPE_F4 => 4,
            STG_DTYPE_F6_E2M3 | STG_DTYPE_F6_E3M2 => 6,
            STG_DTYPE_BOOL | STG_DTYPE_U8 | STG_DTYPE_I8 => 8,
            STG_DTYPE_F8_E4M3
            | STG_DTYPE_F8_E5M2
            | STG_DTYPE_F8_E8M0
            | STG_DTYPE_F8_E4M3FNUZ
            | STG_DTYPE_F8_E5M2FNUZ => 8,
            STG_DTYPE_U16 | STG_DTYPE_I16 | STG_DTYPE_F16 | STG_DTYPE_BF16 => 16,
            STG_DTYPE_U32 | STG_DTYPE_I32 | STG_DTYPE_F32 => 32,
            STG_DTYPE_U64 | STG_DTYPE_I64 | STG_DTYPE_F64 | STG_DTYPE_C64 => 64,
        }
    }
}

impl TryFrom<u32> for stg_dtype {
    type Error = u32;

    /// The dtype numbered `value`; an unknown number comes back as the error.
    fn try_from(value: u32) -> Result<Self, u32> {
        usize::try_from(value)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .ok_or(value)
    }
}

/// Bits per element of `dtype` (4 for `STG_DTYPE_F4`, 16 for `STG_DTYPE_BF16`); 0 for
/// `STG_DTYPE_UNKNOWN` and for a number that is no `stg_dtype`. A tensor of `n` elements is
/// `n * bits / 8` bytes (safetensors stores sub-byte dtypes packed, with no padding).
#[unsafe(no_mangle)]
pub extern "C" fn stg_dtype_bits(dtype: u32) -> u32 {
    stg_dtype::try_from(dtype).map_or(0, stg_dtype::bits)
}

/// A tensor as the library describes it. Strings and the shape stay valid while the tensor (or,
/// inside a destination callback, the call) lives.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stg_tensor_info {
    /// The tensor's name, NUL-terminated.
    pub name: *const c_char,
    /// The dtype as safetensors writes it ("BF16"), NUL-terminated; its number is `dtype_id`.
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
    /// A device pointer is on the load's GPU, in its primary context, its bytes complete when
    /// `stg_load_next` returned the tensor; a small one may be carved from a shared block: see
    /// "Device memory" at the top of this header.
    pub data: *mut c_void,
    /// The dtype's number (`STG_DTYPE_UNKNOWN` for one this header does not number).
    pub dtype_id: stg_dtype,
    /// Bits per element, for every dtype the library reads (numbered or not): 4 for F4, 6 for
    /// the F6 types, 16 for BF16. `bytes` is `elements * dtype_bits / 8`.
    pub dtype_bits: u32,
}

impl stg_tensor_info {
    /// The dtype fields of a tensor's description.
    pub(crate) fn dtype_fields(dtype: Dtype) -> (stg_dtype, u32) {
        let bits = u32::try_from(dtype.bitsize()).unwrap_or(0);
        (stg_dtype::of(dtype), bits)
    }
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
        StagingPath::Mapped => stg_path::STG_PATH_MAPPED,
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
            Some(tensor) if matches!(tensor.path(), StagingPath::Host | StagingPath::Mapped) => {
                match tensor.host_mut_ptr() {
                    Some(ptr) if !tensor.is_empty() => ptr.cast::<c_void>(),
                    _ => std::ptr::null_mut(),
                }
            }
            Some(tensor) => tensor
                .device_ptr()
                .map_or(std::ptr::null_mut(), |addr| addr as *mut c_void),
            None => std::ptr::null_mut(),
        };
        let (dtype_id, dtype_bits) = stg_tensor_info::dtype_fields(t.meta.dtype);
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
            dtype_id,
            dtype_bits,
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
/// The buffer is the same memory as the tensor's `data` (on the load's GPU, in its primary
/// context, its bytes complete): taking moves no byte. A tensor carved from a shared block
/// stays carved: its buffer keeps the block allocated until it is freed, and its pointer is not
/// the start of an allocation ("Device memory" at the top of this header).
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

/// The device pointer of a taken buffer (NULL for NULL or an empty buffer): GPU memory of the
/// load's device, valid in its primary context, until `stg_device_buffer_free`.
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

/// Frees a taken device buffer (its own allocation, or its piece of a shared block, which is
/// freed with its last piece). Not stream ordered: the caller's work reading the memory must
/// have finished. NULL does nothing.
///
/// # Safety
/// `buffer` must be NULL or a pointer from `stg_tensor_take_device_buffer` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stg_device_buffer_free(buffer: *mut stg_device_buffer) {
    // SAFETY: forwarded caller contract: NULL, or a pointer from stg_tensor_take_device_buffer
    // freed once.
    unsafe { free_boxed(buffer) };
}
