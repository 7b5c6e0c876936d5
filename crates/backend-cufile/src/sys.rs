//! `libcufile` loaded at run time: the C types, and one table of function pointers loaded once.
//!
//! Search order: an explicit path (option, or the `STAGING_CUFILE_LIB` environment variable),
//! then `libcufile.so.0` (the soname the wheels and KvikIO use), then `libcufile.so`. Required
//! symbols missing is an error; optional ones (properties, version, parameter API) may be absent.

use std::ffi::c_int;
use std::path::{Path, PathBuf};

use backend_gds::{abi, dl};
use libloading::Library;

use crate::errors::Error;

/// `CUfileError_t`: an operation code and a CUDA result, returned by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUfileError {
    /// `CUfileOpError`: 0 on success, 5001 and up otherwise.
    pub err: c_int,
    /// The `CUresult` when `err` is a CUDA driver error.
    pub cu_err: c_int,
}

impl abi::OpStatus for CUfileError {
    fn op_code(&self) -> c_int {
        self.err
    }
}

/// The union inside `CUfileDescr_t` (shared with hipFile: [`backend_gds::abi`]).
pub type CUfileDescrHandle = abi::FileDescrHandle;

/// `CUfileDescr_t` (24 bytes on x86_64; shared with hipFile: [`backend_gds::abi`]).
pub type CUfileDescr = abi::FileDescr;

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
pub use backend_gds::abi::HANDLE_TYPE_OPAQUE_FD;
/// `CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE` for `cuFileSetParameterBool`.
pub const PARAM_ALLOW_COMPAT_MODE: c_int = 1;
/// `CUFILE_PARAM_FORCE_COMPAT_MODE` for `cuFileSetParameterBool`.
pub const PARAM_FORCE_COMPAT_MODE: c_int = 2;

/// `CUfileDrvProps_t` is 56 bytes in cuFile 1.14 and 1.20 (older headers are shorter); this
/// buffer is larger and zeroed, and only the nvidia-fs version at its start is read.
#[allow(missing_debug_implementations)] // raw bytes, read by offset
#[repr(C, align(8))]
pub struct DriverProps {
    /// Raw bytes.
    pub bytes: [u8; 256],
}

type DriverOpenFn = unsafe extern "C" fn() -> CUfileError;
type DriverCloseFn = unsafe extern "C" fn() -> CUfileError;
type HandleRegisterFn = abi::HandleRegisterFn<CUfileError>;
type HandleDeregisterFn = abi::HandleDeregisterFn;
type ReadFn = abi::ReadFn;
type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> CUfileError;
type GetPropertiesFn = unsafe extern "C" fn(*mut DriverProps) -> CUfileError;
type SetParameterBoolFn = unsafe extern "C" fn(c_int, bool) -> CUfileError;

/// The cuFile functions this backend calls, loaded once from one library.
pub struct CuFileApi {
    path: PathBuf,
    pub(crate) driver_open: DriverOpenFn,
    pub(crate) driver_close: DriverCloseFn,
    pub(crate) handle_register: HandleRegisterFn,
    pub(crate) handle_deregister: HandleDeregisterFn,
    pub(crate) read: ReadFn,
    pub(crate) get_version: Option<GetVersionFn>,
    pub(crate) get_properties: Option<GetPropertiesFn>,
    pub(crate) set_parameter_bool: Option<SetParameterBoolFn>,
    // Keeps the function pointers above valid; dropped last.
    _library: Library,
}

impl std::fmt::Debug for CuFileApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuFileApi")
            .field("path", &self.path)
            .finish()
    }
}

/// The names tried, in order, when no explicit path is given.
pub const DEFAULT_NAMES: [&str; 2] = ["libcufile.so.0", "libcufile.so"];
/// The environment variable naming an explicit library path.
pub const LIBRARY_ENV: &str = "STAGING_CUFILE_LIB";

impl CuFileApi {
    /// Loads the library: `explicit`, else `$STAGING_CUFILE_LIB`, else the default names.
    /// Loading runs no cuFile function.
    pub fn load(explicit: Option<&Path>) -> Result<Self, Error> {
        // SAFETY: the candidates are libcufile (NVIDIA's or a test stub), which this backend uses.
        let lib = unsafe { dl::load(explicit, LIBRARY_ENV, &DEFAULT_NAMES) }
            .map_err(|tried| Error::LibraryMissing { tried })?;
        // SAFETY: every type below is the C signature of its symbol in cufile.h, and the
        // pointers live as long as `_library`, which the struct owns.
        unsafe {
            Ok(Self {
                driver_open: lib.required("cuFileDriverOpen")?,
                driver_close: dl::symbol(&lib.library, "cuFileDriverClose_v2")
                    .or_else(|_| dl::symbol(&lib.library, "cuFileDriverClose"))
                    .map_err(|detail| lib.missing("cuFileDriverClose_v2", detail))?,
                handle_register: lib.required("cuFileHandleRegister")?,
                handle_deregister: lib.required("cuFileHandleDeregister")?,
                read: lib.required("cuFileRead")?,
                get_version: lib.optional("cuFileGetVersion"),
                get_properties: lib.optional("cuFileDriverGetProperties"),
                set_parameter_bool: lib.optional("cuFileSetParameterBool"),
                path: lib.path,
                _library: lib.library,
            })
        }
    }

    /// The library's path as loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cuFileGetVersion`: `1000 * major + 10 * minor` (1200 = 1.20), or `None` when the
    /// library lacks the call (KvikIO then assumes 1.7). Safe to call before the driver opens.
    pub fn version(&self) -> Option<i32> {
        let get = self.get_version?;
        let mut version: c_int = 0;
        // SAFETY: `get` is cuFileGetVersion, writing one int to a valid pointer.
        let status = unsafe { get(&mut version) };
        (status.err == 0).then_some(version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_cufile_h() {
        assert_eq!(std::mem::size_of::<CUfileError>(), 8);
        // CUfileDescr_t is backend_gds::abi::FileDescr, whose layout test is there.
    }

    #[test]
    fn a_missing_library_names_what_was_tried() {
        let err = CuFileApi::load(Some(Path::new("/nonexistent/libcufile.so.0"))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/libcufile.so.0"), "{text}");
        assert!(text.contains("No such file"), "{text}");
    }
}
