//! The cuFile driver (`cuFileDriverOpen` ... `cuFileDriverClose`) as a [`FileApi`], so the shared
//! [`GdsReader`] reads through it: `cuFileRead` straight into device memory (GDS or cuFile's
//! compatibility mode), or the POSIX path when `libcufile` is not usable.

use std::path::Path;

use backend_gds::{FileApi, GdsReader, RequestedMode, abi};
use staging_core::IoMode;

use crate::cuda::CudaDevice;
use crate::errors::{Error, describe_cufile_code};
use crate::sys::{CuFileApi, DriverProps, PARAM_ALLOW_COMPAT_MODE, PARAM_FORCE_COMPAT_MODE};

/// The cuFile reader: the shared GDS-style reader over the cuFile driver and a CUDA device.
pub type CuFileReader = GdsReader<Driver, CudaDevice>;

/// A file opened by [`CuFileReader`].
pub type CuFile = backend_gds::GdsFile<Driver>;

/// An open cuFile driver (`cuFileDriverOpen`); closed on drop.
#[derive(Debug)]
pub struct Driver {
    api: CuFileApi,
    nvfs: Option<(u32, u32)>,
}

impl Driver {
    /// Opens the driver. Call only after [`CudaDevice::open`] succeeded: without a CUDA driver
    /// `cuFileDriverOpen` has been seen to spin forever.
    pub(crate) fn open(
        api: CuFileApi,
        requested: RequestedMode,
        _device: &CudaDevice,
    ) -> Result<Self, Error> {
        if let Some(set) = api.set_parameter_bool {
            // SAFETY: cuFileSetParameterBool takes plain values; before DriverOpen it only
            // records settings. Failures leave cuFile's defaults, which are fine.
            unsafe {
                let _ = set(PARAM_ALLOW_COMPAT_MODE, requested != RequestedMode::Fast);
                let _ = set(PARAM_FORCE_COMPAT_MODE, requested == RequestedMode::Compat);
            }
        }
        // SAFETY: a CUDA driver and device were confirmed by the caller's `CudaDevice`.
        let status = unsafe { (api.driver_open)() };
        if status.err != 0 {
            return Err(Error::CuFile {
                call: "cuFileDriverOpen",
                code: describe_cufile_code(i64::from(status.err)),
            });
        }
        let nvfs = api.get_properties.and_then(|get| {
            let mut props = DriverProps { bytes: [0; 256] };
            // SAFETY: the buffer is larger than any CUfileDrvProps_t and zeroed.
            let status = unsafe { get(&mut props) };
            let word = |i: usize| {
                let mut w = [0u8; 4];
                w.copy_from_slice(&props.bytes[i..i + 4]);
                u32::from_ne_bytes(w)
            };
            (status.err == 0).then(|| (word(0), word(4)))
        });
        Ok(Self { api, nvfs })
    }

    /// The nvidia-fs version the driver reports; `(0, 0)` or `None` means it is not loaded.
    pub fn nvfs_version(&self) -> Option<(u32, u32)> {
        self.nvfs
    }

    /// Whether nvidia-fs (and so true GDS) is available.
    pub fn has_nvfs(&self) -> bool {
        self.nvfs
            .is_some_and(|(major, minor)| major != 0 || minor != 0)
    }

    /// The library's version (`1000 * major + 10 * minor`), when it reports one.
    pub fn version(&self) -> Option<i32> {
        self.api.version()
    }

    /// The library's path.
    pub fn library(&self) -> &Path {
        self.api.path()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: the driver was opened once by `open`; this is the matching close.
        let _ = unsafe { (self.api.driver_close)() };
    }
}

// SAFETY: handles come from `cuFileHandleRegister` and may be used from several threads;
// `cuFileRead` writes at most `size` bytes at `base + buf_offset` and is synchronous; `max_read`
// is `usize::MAX`.
unsafe impl FileApi for Driver {
    const BACKEND: &'static str = "cufile";
    const FAST_MODE: IoMode = IoMode::Gds;
    const COMPAT_MODE: IoMode = IoMode::Compat;
    const READ_CALL: &'static str = "cuFileRead";
    const REGISTER_CALL: &'static str = "cuFileHandleRegister";

    type Status = crate::sys::CUfileError;

    fn max_read(&self) -> usize {
        usize::MAX
    }

    fn calls(&self) -> abi::FileCalls<crate::sys::CUfileError> {
        abi::FileCalls {
            register: self.api.handle_register,
            deregister: self.api.handle_deregister,
            read: self.api.read,
        }
    }

    fn describe(code: i64) -> String {
        describe_cufile_code(code)
    }
}
