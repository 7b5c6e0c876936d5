//! The C layouts cuFile and hipFile share (`hipfile.h` lays its types out as `cufile.h` does):
//! the file descriptor handed to `cuFileHandleRegister`/`hipFileHandleRegister`, and registering
//! an open file through either.

use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD` / `hipFileHandleTypeOpaqueFD`: a POSIX file descriptor.
pub const HANDLE_TYPE_OPAQUE_FD: u32 = 1;

/// The union inside `CUfileDescr_t` / `hipFileDescr_t`.
#[allow(missing_debug_implementations)] // a C union: which field is live depends on `kind`
#[repr(C)]
#[derive(Clone, Copy)]
pub union FileDescrHandle {
    /// A POSIX file descriptor (type 1).
    pub fd: c_int,
    /// Other handle kinds.
    pub handle: *mut c_void,
}

/// `CUfileDescr_t` / `hipFileDescr_t` (24 bytes on x86_64).
#[allow(missing_debug_implementations)] // holds the union above
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FileDescr {
    /// The handle kind: [`HANDLE_TYPE_OPAQUE_FD`] for file descriptors.
    pub kind: u32,
    /// The descriptor.
    pub handle: FileDescrHandle,
    /// Must be null for file descriptors.
    pub fs_ops: *const c_void,
}

impl FileDescr {
    /// The descriptor of the open file `fd`, with null `fs_ops`.
    pub fn opaque_fd(fd: RawFd) -> Self {
        Self {
            kind: HANDLE_TYPE_OPAQUE_FD,
            handle: FileDescrHandle { fd },
            fs_ops: std::ptr::null(),
        }
    }
}

/// A status returned by value whose first field is the operation code (`CUfileError_t`,
/// `hipFileError_t`).
pub trait OpStatus: Copy {
    /// The operation code: 0 on success, 5001 and up otherwise.
    fn op_code(&self) -> c_int;
}

/// `cuFileHandleRegister` / `hipFileHandleRegister`.
pub type HandleRegisterFn<S> = unsafe extern "C" fn(*mut *mut c_void, *mut FileDescr) -> S;

/// `cuFileHandleDeregister` / `hipFileHandleDeregister`.
pub type HandleDeregisterFn = unsafe extern "C" fn(*mut c_void);

/// `cuFileRead` / `hipFileRead`: `(handle, base, size, file_offset, buf_offset)`, the count read,
/// `-1` with `errno`, or `-code`.
pub type ReadFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;

/// The three calls a GDS-style reader makes on an open driver, all from one library.
#[derive(Debug, Clone, Copy)]
pub struct FileCalls<S> {
    /// `cuFileHandleRegister` / `hipFileHandleRegister`.
    pub register: HandleRegisterFn<S>,
    /// `cuFileHandleDeregister` / `hipFileHandleDeregister`.
    pub deregister: HandleDeregisterFn,
    /// `cuFileRead` / `hipFileRead`.
    pub read: ReadFn,
}

/// Registers the open file `fd` through `register`: the handle, or the operation code.
///
/// # Safety
/// `register` is the library's handle-register call with this C signature, its driver open.
pub unsafe fn register_fd<S: OpStatus>(
    register: HandleRegisterFn<S>,
    fd: RawFd,
) -> Result<*mut c_void, i64> {
    let mut descr = FileDescr::opaque_fd(fd);
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: `descr` is an OPAQUE_FD descriptor of an open file with null fs_ops, and `raw`
    // receives the handle; the caller vouches for `register`.
    let status = unsafe { register(&mut raw, &mut descr) };
    match status.op_code() {
        0 => Ok(raw),
        code => Err(i64::from(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cufile.h`'s `CUfileDescr_t` and `hipfile.h`'s `hipFileDescr_t` (the `hipfile` package's
    /// `_chipfile.pxd`): `{ type; union { int fd; void *handle; } handle; const ops *fs_ops; }`.
    #[test]
    fn the_descriptor_is_laid_out_as_cufile_h_and_hipfile_h() {
        assert_eq!(std::mem::size_of::<FileDescr>(), 24);
        assert_eq!(std::mem::offset_of!(FileDescr, handle), 8);
        assert_eq!(std::mem::offset_of!(FileDescr, fs_ops), 16);
        assert_eq!(std::mem::size_of::<FileDescrHandle>(), 8);
    }
}
