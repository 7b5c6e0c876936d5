//! The boundary with C: the panic guard every entry point runs inside, freeing boxed handles,
//! and reading and writing C strings (arguments, messages copied into the caller's buffer).

use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::status::stg_status;

/// Runs `body`, turning a panic into `STG_PANIC`.
pub(crate) fn guard(body: impl FnOnce() -> stg_status) -> stg_status {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(stg_status::STG_PANIC)
}

/// Frees a handle made by `Box::into_raw`; NULL does nothing; a panic in a destructor stops
/// here.
///
/// # Safety
/// `handle` must be NULL or a pointer from `Box::into_raw` not yet freed.
pub(crate) unsafe fn free_boxed<T>(handle: *mut T) {
    if handle.is_null() {
        return;
    }
    // SAFETY: the caller's contract: a live pointer from Box::into_raw, freed once, here.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(handle) })));
}

/// Reads a C string argument as UTF-8.
///
/// # Safety
/// `text` must be NULL or a NUL-terminated string.
pub(crate) unsafe fn utf8<'a>(text: *const c_char) -> Result<&'a str, stg_status> {
    if text.is_null() {
        return Err(stg_status::STG_NULL_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| stg_status::STG_INVALID_UTF8)
}

/// Copies `message` into `buf` (at most `len - 1` bytes, then NUL) and stores its full length in
/// `*written`.
///
/// # Safety
/// `buf` must be writable for `len` bytes (or NULL with `len` 0), `written` valid for a write.
pub(crate) unsafe fn copy_message(
    message: &str,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> stg_status {
    if written.is_null() || (buf.is_null() && len > 0) {
        return stg_status::STG_NULL_ARGUMENT;
    }
    if len > 0 {
        let n = message.len().min(len - 1);
        // SAFETY: the caller guarantees `buf` holds `len` bytes; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    // SAFETY: checked non-null above; the caller guarantees it is writable.
    unsafe { *written = message.len() };
    stg_status::STG_OK
}

pub(crate) fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', "\u{fffd}")).unwrap_or_default()
}
