//! `libhipfile` loaded at run time: the C types (laid out as cuFile's), one table of function
//! pointers, and the opened driver as a [`FileApi`].
//!
//! Search order: an explicit path (option, or `STAGING_HIPFILE_LIB`), then `libhipfile.so.0`,
//! then `libhipfile.so`. One `hipFileRead` moves at most [`MAX_READ`] bytes; the reader cuts its
//! requests there and the write loop continues.

use std::ffi::{c_int, c_uint};
use std::path::{Path, PathBuf};

use backend_gds::FileApi;
use backend_gds::codes::describe_hipfile_code;
use backend_gds::{abi, dl};
use libloading::Library;
use staging_core::IoMode;

use crate::errors::Error;

/// The most bytes one `hipFileRead` call moves.
pub const MAX_READ: usize = 0x7fff_f000;

/// `hipFileError_t`: an operation code and a HIP result, returned by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HipFileError {
    /// 0 on success, 5001 and up otherwise.
    pub err: c_int,
    /// The hipError_t when `err` is a HIP error.
    pub hip_drv_err: c_int,
}

/// `hipFileHandleTypeOpaqueFD`: 1, as `CU_FILE_HANDLE_TYPE_OPAQUE_FD` (the `.pxd` declares the
/// enumerators without values; `hipfile.h` numbers them as cuFile does).
pub use backend_gds::abi::HANDLE_TYPE_OPAQUE_FD;

/// `hipFileDescr_t`, laid out as `CUfileDescr_t` (type 1 = file descriptor): the one layout in
/// [`backend_gds::abi`].
pub type HipFileDescr = abi::FileDescr;

impl abi::OpStatus for HipFileError {
    fn op_code(&self) -> c_int {
        self.err
    }
}

type DriverOpenFn = unsafe extern "C" fn() -> HipFileError;
type HandleRegisterFn = abi::HandleRegisterFn<HipFileError>;
type HandleDeregisterFn = abi::HandleDeregisterFn;
type ReadFn = abi::ReadFn;
type GetVersionFn = unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint) -> HipFileError;

/// The names tried, in order, when no explicit path is given.
pub const DEFAULT_NAMES: [&str; 2] = ["libhipfile.so.0", "libhipfile.so"];
/// The environment variable naming an explicit library path.
pub const LIBRARY_ENV: &str = "STAGING_HIPFILE_LIB";

/// The hipFile functions this backend calls, loaded once.
pub struct HipFileApi {
    path: PathBuf,
    driver_open: DriverOpenFn,
    driver_close: DriverOpenFn,
    handle_register: HandleRegisterFn,
    handle_deregister: HandleDeregisterFn,
    read: ReadFn,
    get_version: Option<GetVersionFn>,
    _library: Library,
}

impl std::fmt::Debug for HipFileApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipFileApi")
            .field("path", &self.path)
            .finish()
    }
}

impl HipFileApi {
    /// Loads the library: `explicit`, else `$STAGING_HIPFILE_LIB`, else the default names.
    pub fn load(explicit: Option<&Path>) -> Result<Self, Error> {
        // SAFETY: the candidates are libhipfile (AMD's or a test stub), which this backend uses.
        let lib = unsafe { dl::load(explicit, LIBRARY_ENV, &DEFAULT_NAMES) }
            .map_err(|tried| Error::LibraryMissing { tried })?;
        // SAFETY: every type below is the C signature of its symbol in hipfile.h, and the
        // pointers live as long as `_library`, which the struct owns.
        unsafe {
            Ok(Self {
                driver_open: lib.required("hipFileDriverOpen")?,
                driver_close: lib.required("hipFileDriverClose")?,
                handle_register: lib.required("hipFileHandleRegister")?,
                handle_deregister: lib.required("hipFileHandleDeregister")?,
                read: lib.required("hipFileRead")?,
                get_version: lib.optional("hipFileGetVersion"),
                path: lib.path,
                _library: lib.library,
            })
        }
    }

    /// `hipFileGetVersion` as (major, minor, patch), when the library has it.
    pub fn version(&self) -> Option<(u32, u32, u32)> {
        let get = self.get_version?;
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: writes three unsigned ints.
        let status = unsafe { get(&mut a, &mut b, &mut c) };
        (status.err == 0).then_some((a, b, c))
    }
}

/// An open hipFile driver (`hipFileDriverOpen`); closed on drop.
#[derive(Debug)]
pub struct Driver {
    api: HipFileApi,
    max_read: usize,
}

impl Driver {
    /// Opens the driver. Call only after the HIP runtime and a device were confirmed.
    pub(crate) fn open(api: HipFileApi, max_read: usize) -> Result<Self, Error> {
        // SAFETY: HIP and a device were confirmed by the caller.
        let status = unsafe { (api.driver_open)() };
        if status.err != 0 {
            return Err(Error::HipFile {
                call: "hipFileDriverOpen",
                code: describe_hipfile_code(i64::from(status.err)),
            });
        }
        Ok(Self {
            api,
            max_read: max_read.clamp(1, MAX_READ),
        })
    }

    /// The library's path.
    pub fn library(&self) -> &Path {
        &self.api.path
    }

    /// The library's version.
    pub fn version(&self) -> Option<(u32, u32, u32)> {
        self.api.version()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: the matching close of the open in `Driver::open`.
        let _ = unsafe { (self.api.driver_close)() };
    }
}

// SAFETY: handles come from `hipFileHandleRegister` and may be used from several threads;
// `hipFileRead` writes at most `size` bytes at `base + buf_offset` and is synchronous;
// `max_read` is clamped to 1..=MAX_READ in `Driver::open`.
unsafe impl FileApi for Driver {
    const BACKEND: &'static str = "hipfile";
    // hipFile chooses between its fastpath and its own fallback inside; from here both are
    // "hipfile".
    const FAST_MODE: IoMode = IoMode::HipFile;
    const COMPAT_MODE: IoMode = IoMode::HipFile;
    const READ_CALL: &'static str = "hipFileRead";
    const REGISTER_CALL: &'static str = "hipFileHandleRegister";

    type Status = HipFileError;

    fn max_read(&self) -> usize {
        self.max_read
    }

    fn calls(&self) -> abi::FileCalls<HipFileError> {
        abi::FileCalls {
            register: self.api.handle_register,
            deregister: self.api.handle_deregister,
            read: self.api.read,
        }
    }

    fn describe(code: i64) -> String {
        describe_hipfile_code(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout as AMD's `hipfile.h` declares it (the `hipfile` package's `_chipfile.pxd`):
    /// `hipFileError_t { hipFileOpError_t err; hipError_t hip_drv_err; }` (two C enums).
    #[test]
    fn layouts_match_hipfile_h() {
        assert_eq!(std::mem::size_of::<HipFileError>(), 8);
        assert_eq!(std::mem::offset_of!(HipFileError, hip_drv_err), 4);
        // hipFileDescr_t is backend_gds::abi::FileDescr, whose layout test is there.
    }

    #[test]
    fn a_missing_library_names_what_was_tried() {
        let err = HipFileApi::load(Some(Path::new("/nonexistent/libhipfile.so.0"))).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/libhipfile.so.0: "),
            "{err}"
        );
    }
}
