//! The destination callback: its C type (`stg_destination_fn`) and its adapter to the
//! library's `RawDestination`, which also stops a load that is being freed.

use std::ffi::c_void;
use std::sync::Arc;

use safetensors_staging::{DestinationError, RawDestination, TensorMeta};

use crate::boundary::c_string;
use crate::status::stg_status;
use crate::steps::Steps;
use crate::tensor::{stg_path, stg_tensor_info};

/// The destination callback: asked once per tensor, in file order, before anything is
/// allocated for it. To take the tensor, set `*region` to memory of the load's device (host
/// memory for the `host` backend, CUDA device memory for `cufile`, HIP for `hipfile`) of
/// `*capacity` bytes and return `STG_OK` (0); the memory must stay valid and untouched by the
/// caller until `stg_load_next` returns that tensor (or fails). On a GPU the library writes the
/// region from outside any stream: it must be memory of the load's GPU usable in its primary
/// context, no work of the caller's may still use it when the callback returns it, and its
/// bytes are complete when `stg_load_next` returns the tensor ("Device memory" at the top of
/// this header). Leave `*region` NULL to decline.
/// Any other value, a `stg_status` or not, aborts the load with `STG_DESTINATION`.
///
/// What the callback may do with the load whose `stg_load_next` called it:
/// - `stg_load_report`, `stg_load_backend`, `stg_load_last_error`: allowed; the report is the
///   one as of the last tensor `stg_load_next` returned.
/// - `stg_load_next`: returns `STG_BUSY` at once and writes nothing.
/// - `stg_load_free`: does not free. The load stops before the tensor being asked for is read,
///   the `stg_load_next` in progress returns `STG_BUSY` (its message says why), and the handle
///   stays valid: free it after `stg_load_next` returns. To stop a load from the callback,
///   returning a non-zero value is the plain way. (From another thread, `stg_load_free` does
///   free: see there.)
pub type stg_destination_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        tensor: *const stg_tensor_info,
        region: *mut *mut c_void,
        capacity: *mut usize,
    ) -> u32,
>;

/// The C destination callback as a [`RawDestination`].
pub(crate) struct CallbackDestination {
    pub(crate) callback: unsafe extern "C" fn(
        *mut c_void,
        *const stg_tensor_info,
        *mut *mut c_void,
        *mut usize,
    ) -> u32,
    pub(crate) user_data: *mut c_void,
    /// The load's steps: whether the load is being freed (from the callback itself, or from
    /// another thread), which stops it.
    pub(crate) steps: Arc<Steps>,
}

// SAFETY: the header's thread-safety notes: a load may move between threads, and the callback
// is called on whichever thread calls `stg_load_next`, one at a time; the pointers are only
// passed back to the callback, never dereferenced here.
unsafe impl Send for CallbackDestination {}

// SAFETY: the header's contract for the callback: a region it gives is `capacity` bytes of the
// load's device memory (the space the backend loads into, which is the `space` asked for),
// valid and untouched by the caller until this tensor is returned or the load fails.
unsafe impl RawDestination for CallbackDestination {
    fn region(
        &mut self,
        tensor: &TensorMeta,
        _space: &'static str,
    ) -> Result<Option<(usize, usize)>, DestinationError> {
        // A load being freed calls its callback no more: the caller may free `user_data` once
        // `stg_load_free` returns (a call already in progress then is the one exception).
        if let Some(reason) = self.steps.stop_reason() {
            return Err(reason.into());
        }
        let (name, dtype, file) = (
            c_string(&tensor.name),
            c_string(&tensor.dtype_name()),
            c_string(&tensor.file.display().to_string()),
        );
        let shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
        let (dtype_id, dtype_bits) = stg_tensor_info::dtype_fields(tensor.dtype);
        let info = stg_tensor_info {
            name: name.as_ptr(),
            dtype: dtype.as_ptr(),
            shape: shape.as_ptr(),
            ndim: shape.len(),
            bytes: tensor.len,
            file: file.as_ptr(),
            file_offset: tensor.offset,
            path: stg_path::STG_PATH_DESTINATION,
            data: std::ptr::null_mut(),
            dtype_id,
            dtype_bits,
        };
        let mut region: *mut c_void = std::ptr::null_mut();
        let mut capacity = 0usize;
        // SAFETY: the callback was registered by the caller with this signature; `info` and the
        // strings it points to live for the call; the out-pointers are valid locals.
        let returned =
            unsafe { (self.callback)(self.user_data, &info, &mut region, &mut capacity) };
        if let Some(reason) = self.steps.stop_reason() {
            return Err(reason.into());
        }
        match stg_status::try_from(returned) {
            Ok(stg_status::STG_OK) => {}
            Ok(status) => {
                return Err(format!("the destination callback returned {status:?}").into());
            }
            Err(unknown) => {
                return Err(format!(
                    "the destination callback returned {unknown}, which is not a stg_status"
                )
                .into());
            }
        }
        if region.is_null() {
            return Ok(None);
        }
        Ok(Some((region as usize, capacity)))
    }
}
