//! The cuFile reader: `cuFileRead` straight into device memory (GDS or cuFile's compatibility
//! mode), or, without a usable `libcufile`, `pread` into pinned bounce buffers followed by a
//! host-to-device copy (the POSIX path, as KvikIO does).
//!
//! The mode is decided per process and per file like KvikIO's `AUTO`: a file that cannot be
//! opened `O_DIRECT` or registered falls back to the POSIX path in `auto`, and is an error when a
//! mode was forced.

use std::ffi::c_void;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use staging_core::host::open_regular_file;
use staging_core::{DeviceRegion, ReadError, Reader};

use crate::cuda::{CudaDevice, CudaMemory, PinnedBuffer};
use crate::errors::{Error, cuda_code, describe_cufile_code};
use crate::sys::{
    CUfileDescr, CUfileDescrHandle, CuFileApi, DriverProps, HANDLE_TYPE_OPAQUE_FD,
    PARAM_ALLOW_COMPAT_MODE, PARAM_FORCE_COMPAT_MODE,
};

/// The mode asked for (`--cufile-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestedMode {
    /// GDS when nvidia-fs is loaded, else cuFile's compatibility mode, else POSIX; per file,
    /// POSIX when `O_DIRECT` or registration fails.
    #[default]
    Auto,
    /// GDS only: nvidia-fs must be loaded and every file registered `O_DIRECT`.
    Gds,
    /// cuFile's compatibility mode, forced.
    Compat,
    /// No `libcufile`: `pread` into pinned buffers, then host-to-device copies.
    Posix,
}

impl RequestedMode {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Gds => "gds",
            Self::Compat => "compat",
            Self::Posix => "posix",
        }
    }
}

/// The mode a process (or a file) runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveMode {
    /// GPUDirect Storage through nvidia-fs.
    Gds,
    /// cuFile's own compatibility mode (POSIX I/O inside cuFile).
    Compat,
    /// This crate's POSIX path.
    Posix,
}

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
                let _ = set(PARAM_ALLOW_COMPAT_MODE, requested != RequestedMode::Gds);
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

/// A registered cuFile handle; deregistered on drop.
#[derive(Debug)]
struct Handle {
    raw: *mut c_void,
    driver: Arc<Driver>,
}

// SAFETY: cuFile handles may be used for reads from several threads at once (KvikIO does so
// from its thread pool); deregistration happens once, on drop.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `raw` was returned by cuFileHandleRegister and is deregistered once.
        unsafe { (self.driver.api.handle_deregister)(self.raw) }
    }
}

/// A file opened by [`CuFileReader`]. The handle is dropped before the descriptors it uses.
#[derive(Debug)]
pub struct CuFile {
    handle: Option<Handle>,
    _direct: Option<File>,
    buffered: File,
}

impl CuFile {
    /// The mode this file is read in.
    pub fn mode(&self, process: ActiveMode) -> ActiveMode {
        if self.handle.is_some() {
            process
        } else {
            ActiveMode::Posix
        }
    }
}

/// Reads checkpoint files into CUDA device memory.
#[derive(Debug)]
pub struct CuFileReader {
    device: Arc<CudaDevice>,
    driver: Option<Arc<Driver>>,
    requested: RequestedMode,
    mode: ActiveMode,
    bounce_size: usize,
    bounce_pool: Mutex<Vec<PinnedBuffer>>,
    file_fell_back: AtomicBool,
}

impl CuFileReader {
    pub(crate) fn new(
        device: Arc<CudaDevice>,
        driver: Option<Arc<Driver>>,
        requested: RequestedMode,
        mode: ActiveMode,
        bounce_size: usize,
    ) -> Self {
        Self {
            device,
            driver,
            requested,
            mode,
            bounce_size: bounce_size.max(4096),
            bounce_pool: Mutex::new(Vec::new()),
            file_fell_back: AtomicBool::new(false),
        }
    }

    /// The process-wide mode.
    pub fn active_mode(&self) -> ActiveMode {
        self.mode
    }

    /// The open cuFile driver, when one is in use.
    pub fn driver(&self) -> Option<&Arc<Driver>> {
        self.driver.as_ref()
    }

    fn fall_back_or(&self, call: &'static str, error: ReadError) -> Result<(), ReadError> {
        if self.requested == RequestedMode::Auto {
            self.file_fell_back.store(true, Ordering::Release);
            Ok(())
        } else {
            Err(match error {
                ReadError::Io(e) => ReadError::Io(io::Error::new(e.kind(), format!("{call}: {e}"))),
                other => other,
            })
        }
    }

    fn register(&self, driver: &Arc<Driver>, direct: &File) -> Result<Handle, ReadError> {
        let mut descr = CUfileDescr {
            kind: HANDLE_TYPE_OPAQUE_FD,
            handle: CUfileDescrHandle {
                fd: direct.as_raw_fd(),
            },
            fs_ops: std::ptr::null(),
        };
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `descr` is a zero-initialized OPAQUE_FD descriptor of an open file with null
        // fs_ops, and `raw` receives the handle.
        let status = unsafe { (driver.api.handle_register)(&mut raw, &mut descr) };
        if status.err != 0 || raw.is_null() {
            return Err(ReadError::Native {
                call: "cuFileHandleRegister",
                code: i64::from(status.err),
                message: describe_cufile_code(i64::from(status.err)),
            });
        }
        Ok(Handle {
            raw,
            driver: Arc::clone(driver),
        })
    }

    fn take_bounce(&self) -> Result<PinnedBuffer, ReadError> {
        let pooled = self
            .bounce_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        match pooled {
            Some(buffer) => Ok(buffer),
            None => PinnedBuffer::new(&self.device, self.bounce_size).map_err(device_read_error),
        }
    }

    fn posix_read(
        &self,
        file: &CuFile,
        offset: u64,
        mut dst: DeviceRegion<'_, CudaMemory>,
    ) -> Result<usize, ReadError> {
        let mut bounce = self.take_bounce()?;
        let n = dst.len().min(bounce.len());
        let got = file
            .buffered
            .read_at(&mut bounce.as_mut_slice()[..n], offset)?;
        if got > 0 {
            let Some(target) = dst.slice(0, got) else {
                return Err(ReadError::Overrun {
                    requested: n,
                    returned: got,
                });
            };
            bounce.copy_to_device(target).map_err(device_read_error)?;
        }
        self.bounce_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(bounce);
        Ok(got)
    }
}

fn device_read_error(e: staging_core::DeviceError) -> ReadError {
    ReadError::Native {
        call: "cuda",
        code: -1,
        message: e.to_string(),
    }
}

impl Reader for CuFileReader {
    type Space = CudaMemory;
    type File = CuFile;

    fn name(&self) -> &str {
        "cufile"
    }

    fn mode(&self) -> &str {
        let fell_back = self.file_fell_back.load(Ordering::Acquire);
        match (self.mode, fell_back) {
            (ActiveMode::Gds, false) => "gds",
            (ActiveMode::Gds, true) => "gds+posix",
            (ActiveMode::Compat, false) => "compat",
            (ActiveMode::Compat, true) => "compat+posix",
            (ActiveMode::Posix, _) => "posix",
        }
    }

    fn open(&self, path: &Path) -> Result<CuFile, ReadError> {
        let buffered = open_regular_file(path)?;
        let posix = CuFile {
            handle: None,
            _direct: None,
            buffered,
        };
        let Some(driver) = &self.driver else {
            return Ok(posix);
        };
        let direct = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(direct) => direct,
            Err(e) => {
                self.fall_back_or("open with O_DIRECT", ReadError::Io(e))?;
                return Ok(posix);
            }
        };
        match self.register(driver, &direct) {
            Ok(handle) => Ok(CuFile {
                handle: Some(handle),
                _direct: Some(direct),
                buffered: posix.buffered,
            }),
            Err(e) => {
                self.fall_back_or("cuFileHandleRegister", e)?;
                Ok(posix)
            }
        }
    }

    fn read_at(
        &self,
        file: &CuFile,
        offset: u64,
        dst: DeviceRegion<'_, CudaMemory>,
    ) -> Result<usize, ReadError> {
        let Some(handle) = &file.handle else {
            return self.posix_read(file, offset, dst);
        };
        let file_offset = i64::try_from(offset).map_err(|_| {
            ReadError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "offset too large",
            ))
        })?;
        self.device.bind().map_err(|e| ReadError::Native {
            call: "cuCtxSetCurrent",
            code: e.0 as i64,
            message: cuda_code(e),
        })?;
        let buf_offset = i64::try_from(dst.offset_in_base()).map_err(|_| {
            ReadError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer offset too large",
            ))
        })?;
        // SAFETY: `dst` is a live, exclusively borrowed device region of `dst.len()` bytes in the
        // bound context, `buf_offset` bytes from its allocation's base; cuFileRead writes at most
        // that many bytes at `base + buf_offset`.
        let ret = unsafe {
            (handle.driver.api.read)(
                handle.raw,
                dst.base() as *mut c_void,
                dst.len(),
                file_offset,
                buf_offset,
            )
        };
        match ret {
            n if n >= 0 => Ok(n as usize),
            -1 => Err(ReadError::Io(io::Error::last_os_error())),
            negative => {
                let code = -(negative as i64);
                Err(ReadError::Native {
                    call: "cuFileRead",
                    code,
                    message: describe_cufile_code(code),
                })
            }
        }
    }
}
