//! # backend-gds
//!
//! What the cuFile and hipFile backends share, written once. Their C APIs mirror each other
//! (`cuFileRead`/`hipFileRead`, the same descriptor layout, the same operation codes up to 5038),
//! so the reader is generic over:
//!
//! - [`FileApi`]: an opened driver's handle registration and read call, and its names;
//!   [`abi`] holds the descriptor layout both libraries take and the one `register_fd`;
//! - [`Gpu`]: binding the device to the calling thread, pinned host buffers, host-to-device
//!   copies.
//!
//! [`GdsReader`] decides the mode per process and per file like KvikIO's `AUTO`: a file that
//! cannot be opened `O_DIRECT` or registered falls back to the POSIX path (`pread` into pooled
//! pinned buffers, each copied to the device while the next `pread` runs) in `auto`, and is an error when a mode was
//! forced. Reads are cut to the API's per-call maximum; the write loop continues after them.

// Feature-gated items are labelled with their feature on docs built with `--cfg docsrs` (CI).
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::ffi::c_void;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use staging_core::host::open_regular_file;
use staging_core::{
    DeviceError, DeviceRegion, FileIdentity, HostMemory, IoMode, MemorySpace, ReadError, Reader,
};

pub use modes::{CufileMode, HipfileMode};

pub mod abi;
pub mod codes;
pub mod dl;
pub mod modes;

mod bounce;
use bounce::BouncePool;
pub use bounce::Bounced;

/// The default size of each pinned bounce buffer on the POSIX path (16 MiB), for both
/// backends' `Options`.
pub const DEFAULT_BOUNCE_SIZE: usize = 16 << 20;

#[cfg(feature = "test-stubs")]
pub mod stubs;

/// The mode asked for, whichever library reads: what [`CufileMode`] and [`HipfileMode`] (the
/// names callers spell) turn into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestedMode {
    /// The library's fast path when available, else its own fallback, else POSIX; per file,
    /// POSIX when `O_DIRECT` or registration fails.
    #[default]
    Auto,
    /// The fast path only (GDS for cuFile).
    Fast,
    /// The library's own compatibility/fallback mode, forced.
    Compat,
    /// No library: `pread` into pinned buffers, then host-to-device copies.
    Posix,
}

/// The mode a process runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveMode {
    /// The library's fast path (GDS, hipFile's fastpath).
    Fast,
    /// The library's own compatibility/fallback I/O.
    Compat,
    /// This crate's POSIX path.
    Posix,
}

/// An opened GDS-style driver: handle registration and reads.
///
/// # Safety
///
/// [`GdsReader`] hands the values below to the driver and trusts them, so an implementation must
/// guarantee:
///
/// - `register` returns, on success, a handle the driver accepts for `read` and `deregister`
///   until it is deregistered, and it may be used from several threads at once;
/// - `read` writes at most `size` bytes, all of them inside `[base + buf_offset, + size)`, and
///   returns the count written (or `-1`/`-code`); it writes nothing once it has returned;
/// - `max_read` is at least 1;
/// - [`calls`](Self::calls) returns the library's own handle-register, deregister and read
///   calls, of a driver that stays open while `self` lives (the provided `register`,
///   `deregister` and `read` call them; an implementation that overrides one keeps the
///   guarantees above).
///
/// ```compile_fail,E0200
/// // Implementing it without `unsafe` does not compile.
/// # use std::ffi::c_void;
/// # use std::os::fd::RawFd;
/// # use staging_core::IoMode;
/// # use backend_gds::abi::{FileCalls, OpStatus};
/// #[derive(Clone, Copy)]
/// struct Status;
/// impl OpStatus for Status {
///     fn op_code(&self) -> std::ffi::c_int { 0 }
/// }
/// struct Api;
/// impl backend_gds::FileApi for Api {
///     const BACKEND: &'static str = "x";
///     const FAST_MODE: IoMode = IoMode::Gds;
///     const COMPAT_MODE: IoMode = IoMode::Compat;
///     const READ_CALL: &'static str = "read";
///     const REGISTER_CALL: &'static str = "register";
///     type Status = Status;
///     fn max_read(&self) -> usize { 1 }
///     fn calls(&self) -> FileCalls<Status> { unimplemented!() }
///     fn describe(_: i64) -> String { String::new() }
/// }
/// ```
pub unsafe trait FileApi: Send + Sync + 'static {
    /// The backend's name in reports ("cufile", "hipfile").
    const BACKEND: &'static str;
    /// The report's mode when the library's fast path runs.
    const FAST_MODE: IoMode;
    /// The report's mode when the library's own compatibility path runs.
    const COMPAT_MODE: IoMode;
    /// The read call's name, for errors.
    const READ_CALL: &'static str;
    /// The registration call's name, for errors.
    const REGISTER_CALL: &'static str;

    /// The most bytes one read call may move.
    fn max_read(&self) -> usize;

    /// The by-value status the library's calls return.
    type Status: abi::OpStatus;

    /// The library's handle-register, deregister and read calls.
    fn calls(&self) -> abi::FileCalls<Self::Status>;

    /// Registers an open descriptor; `Err` carries the library's operation code.
    fn register(&self, fd: RawFd) -> Result<*mut c_void, i64> {
        // SAFETY: `calls` are the library's own, its driver open while `self` lives (the
        // trait's contract).
        unsafe { abi::register_fd(self.calls().register, fd) }
    }

    /// Deregisters a handle from [`register`](Self::register).
    ///
    /// # Safety
    /// `handle` came from `register` and is deregistered once.
    unsafe fn deregister(&self, handle: *mut c_void) {
        // SAFETY: forwarded caller contract: `handle` came from this library's register, once.
        unsafe { (self.calls().deregister)(handle) }
    }

    /// Reads `size` bytes at `file_offset` into device memory at `base + buf_offset`:
    /// `>= 0` bytes, `-1` with `errno`, or `-code`.
    ///
    /// # Safety
    /// `handle` is registered; `[base + buf_offset, + size)` is device memory the caller may write.
    unsafe fn read(
        &self,
        handle: *mut c_void,
        base: *mut c_void,
        size: usize,
        file_offset: i64,
        buf_offset: i64,
    ) -> isize {
        // SAFETY: forwarded caller contract; the reader cut `size` to `max_read`.
        unsafe { (self.calls().read)(handle, base, size, file_offset, buf_offset) }
    }

    /// `"NAME (code)"` for an operation code.
    fn describe(code: i64) -> String;
}

/// Opens a backend's driver by the requested mode: `Posix` skips it; otherwise `open` loads the
/// library and opens the driver, and in `Auto` a failure becomes the POSIX path with its reason
/// (`Err(reason)` in the result) while a forced mode returns the error.
pub fn driver_or_posix<D, E: std::fmt::Display>(
    requested: RequestedMode,
    open: impl FnOnce() -> Result<D, E>,
) -> Result<Result<D, String>, E> {
    match requested {
        RequestedMode::Posix => Ok(Err("posix mode was asked for".to_owned())),
        RequestedMode::Auto => Ok(open().map_err(|e| e.to_string())),
        RequestedMode::Fast | RequestedMode::Compat => open().map(Ok),
    }
}

/// A pinned host buffer of a [`Gpu`].
///
/// There is no safe mutable access to the bytes while an asynchronous copy from them may still
/// be running: [`bytes_mut`](Self::bytes_mut) waits for it first.
pub trait Pinned: Send {
    /// Returns once the copy last started from this buffer by [`Gpu::copy_to_device`] has
    /// finished.
    fn wait(&mut self) -> Result<(), DeviceError>;

    /// Its bytes, for `pread` to fill, after waiting for any copy still reading them.
    fn bytes_mut(&mut self) -> Result<&mut [u8], DeviceError>;
}

/// A GPU as the reader needs it.
pub trait Gpu: Send + Sync + 'static {
    /// Its memory space.
    type Space: MemorySpace;
    /// Its pinned host buffers.
    type Pinned: Pinned;

    /// What [`bind`](Self::bind) returns: while it lives the device is current on this
    /// thread; dropping it makes current again what was current before.
    type Bound<'a>
    where
        Self: 'a;

    /// Makes the device current on this thread until the guard drops, which restores the
    /// caller's current context or device.
    fn bind(&self) -> Result<Self::Bound<'_>, DeviceError>;

    /// Allocates a pinned host buffer of `len` bytes on `gpu` (which the buffer may keep).
    fn pinned(gpu: &Arc<Self>, len: usize) -> Result<Self::Pinned, DeviceError>
    where
        Self: Sized;

    /// Starts copying the first `dst.len()` bytes of `src` to `dst`. The copy may still be
    /// running when this returns; `src.wait()` waits for it.
    ///
    /// # Safety
    /// Until `src.wait()` has returned `Ok` (or `src` is dropped, which waits), the caller does
    /// not write `src`'s bytes and keeps `dst`'s memory allocated and unused by anything else.
    unsafe fn copy_to_device(
        &self,
        src: &mut Self::Pinned,
        dst: DeviceRegion<'_, Self::Space>,
    ) -> Result<(), DeviceError>;
}

/// A registered handle; deregistered on drop, before the descriptors it uses are closed.
struct Handle<F: FileApi> {
    raw: *mut c_void,
    api: Arc<F>,
}

// SAFETY: the `FileApi` contract: a registered handle may be used for reads from several threads
// at once (KvikIO does so from its thread pool); deregistration happens once, on drop.
unsafe impl<F: FileApi> Send for Handle<F> {}
// SAFETY: as above.
unsafe impl<F: FileApi> Sync for Handle<F> {}

impl<F: FileApi> Drop for Handle<F> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `register` and is deregistered once, here.
        unsafe { self.api.deregister(self.raw) }
    }
}

/// A file opened by [`GdsReader`].
pub struct GdsFile<F: FileApi> {
    handle: Option<Handle<F>>,
    direct: Option<File>,
    buffered: File,
}

impl<F: FileApi> std::fmt::Debug for GdsFile<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsFile")
            .field("registered", &self.handle.is_some())
            .finish()
    }
}

/// Reads checkpoint files into a GPU's memory through a GDS-style API or the POSIX path.
pub struct GdsReader<F: FileApi, G: Gpu> {
    gpu: Arc<G>,
    api: Option<Arc<F>>,
    requested: RequestedMode,
    mode: ActiveMode,
    bounce: Arc<BouncePool<G>>,
    file_fell_back: AtomicBool,
}

impl<F: FileApi, G: Gpu> std::fmt::Debug for GdsReader<F, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsReader")
            .field("backend", &F::BACKEND)
            .field("requested", &self.requested)
            .field("mode", &self.mode)
            .finish()
    }
}

impl<F: FileApi, G: Gpu> GdsReader<F, G> {
    /// A reader on `gpu`, reading through `api` (None: the POSIX path), in `mode`.
    pub fn new(
        gpu: Arc<G>,
        api: Option<Arc<F>>,
        requested: RequestedMode,
        mode: ActiveMode,
        bounce_size: usize,
    ) -> Self {
        let gpu_for_pool = Arc::clone(&gpu);
        Self {
            gpu,
            api,
            requested,
            mode,
            bounce: Arc::new(BouncePool::new(gpu_for_pool, bounce_size)),
            file_fell_back: AtomicBool::new(false),
        }
    }

    /// Another reader on the same device and driver, drawing on the same pinned bounce buffers,
    /// whose report of files that fell back to the POSIX path is its own: one per load, so a
    /// backend opened once serves several loads (one after another, or at once).
    pub fn another(&self) -> Self {
        Self {
            gpu: Arc::clone(&self.gpu),
            api: self.api.clone(),
            requested: self.requested,
            mode: self.mode,
            bounce: Arc::clone(&self.bounce),
            file_fell_back: AtomicBool::new(false),
        }
    }

    /// The process-wide mode.
    pub fn active_mode(&self) -> ActiveMode {
        self.mode
    }

    /// The driver in use, if any.
    pub fn api(&self) -> Option<&Arc<F>> {
        self.api.as_ref()
    }

    /// A reader of this GPU that takes its bytes from `source`, a reader of host memory (an
    /// object store, say), through this reader's pinned bounce buffers; its reports carry this
    /// backend's name and `source`'s mode.
    pub fn bounced<R: Reader<Space = HostMemory>>(&self, source: R) -> Bounced<R, G> {
        Bounced {
            source,
            bounce: Arc::clone(&self.bounce),
            name: F::BACKEND,
        }
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
}

fn device_read_error(e: DeviceError) -> ReadError {
    ReadError::Native {
        call: "device",
        code: -1,
        message: e.to_string(),
    }
}

fn invalid(message: &str) -> ReadError {
    ReadError::Io(io::Error::new(
        io::ErrorKind::InvalidInput,
        message.to_owned(),
    ))
}

impl<F: FileApi, G: Gpu> Reader for GdsReader<F, G> {
    type Space = G::Space;
    type File = GdsFile<F>;

    fn name(&self) -> &str {
        F::BACKEND
    }

    fn mode(&self) -> IoMode {
        let mode = match self.mode {
            ActiveMode::Fast => F::FAST_MODE,
            ActiveMode::Compat => F::COMPAT_MODE,
            ActiveMode::Posix => return IoMode::Posix,
        };
        if self.file_fell_back.load(Ordering::Acquire) {
            mode.with_posix_files()
        } else {
            mode
        }
    }

    fn open(&self, path: &Path) -> Result<GdsFile<F>, ReadError> {
        let buffered = open_regular_file(path)?;
        let posix = GdsFile {
            handle: None,
            direct: None,
            buffered,
        };
        let Some(api) = &self.api else {
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
        match api.register(direct.as_raw_fd()) {
            Ok(raw) if !raw.is_null() => Ok(GdsFile {
                handle: Some(Handle {
                    raw,
                    api: Arc::clone(api),
                }),
                direct: Some(direct),
                buffered: posix.buffered,
            }),
            result => {
                let code = result.err().unwrap_or(0);
                self.fall_back_or(
                    F::REGISTER_CALL,
                    ReadError::Native {
                        call: F::REGISTER_CALL,
                        code,
                        message: F::describe(code),
                    },
                )?;
                Ok(posix)
            }
        }
    }

    fn read_at(
        &self,
        file: &GdsFile<F>,
        offset: u64,
        dst: DeviceRegion<'_, G::Space>,
    ) -> Result<usize, ReadError> {
        let Some(handle) = &file.handle else {
            // The POSIX path: `pread` into pinned memory, then a copy to the device.
            return self.bounce.read(offset, dst, |buf, at| {
                file.buffered.read_at(buf, at).map_err(ReadError::from)
            });
        };
        let file_offset = i64::try_from(offset).map_err(|_| invalid("offset too large"))?;
        let buf_offset =
            i64::try_from(dst.offset_in_base()).map_err(|_| invalid("buffer offset too large"))?;
        let _bound = self.gpu.bind().map_err(device_read_error)?;
        let size = dst.len().min(handle.api.max_read());
        // SAFETY: `dst` is a live, exclusively borrowed device region of at least `size` bytes in
        // the bound context, `buf_offset` bytes from its allocation's base; by the `FileApi`
        // contract the call writes at most `size` bytes at `base + buf_offset`, and `handle` is
        // registered until the file is dropped.
        let ret = unsafe {
            handle.api.read(
                handle.raw,
                dst.base() as *mut c_void,
                size,
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
                    call: F::READ_CALL,
                    code,
                    message: F::describe(code),
                })
            }
        }
    }

    fn identity_of(&self, file: &GdsFile<F>) -> Option<staging_core::FileIdentity> {
        // The descriptor reads go through: the registered `O_DIRECT` one, else the buffered one.
        let reads = file.direct.as_ref().unwrap_or(&file.buffered);
        reads
            .metadata()
            .ok()
            .map(|metadata| staging_core::FileIdentity::of(&metadata))
    }
}
