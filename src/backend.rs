//! Choosing and opening a backend, once, for every door (Rust, C, the `stage` command, the
//! benchmark). `auto` is decided here and nowhere else: cuFile when a CUDA driver and a device
//! are there, else hipFile when a HIP runtime and a device are, else the host backend; each
//! backend passed over is recorded with why.

use std::sync::Arc;

use staging_core::host::{DirectHostReader, HostAllocator};

use crate::device::Device;
use crate::error::{Error, Result};

/// Which backend loads the tensors.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// cuFile when a CUDA driver and a device are there, else hipFile when a HIP runtime and a
    /// device are, else the host backend, each with these options. The report's `passed_over`
    /// says why each was skipped.
    Auto(AutoOptions),
    /// System memory standing for the device (a real loader for CPU inference).
    Host(HostOptions),
    /// NVIDIA GPUs through cuFile (GDS or its compatibility mode) or a POSIX path.
    #[cfg(feature = "cufile")]
    Cufile(backend_cufile::Options),
    /// AMD GPUs through hipFile or a POSIX path (run against stub libraries only so far).
    #[cfg(feature = "hipfile")]
    Hipfile(backend_hipfile::Options),
    /// The host backend behind the mock's ledger, which records every buffer handed out and
    /// returned (for tests and leak checks).
    #[cfg(feature = "mock")]
    Mock,
}

impl Default for Backend {
    fn default() -> Self {
        Self::Auto(AutoOptions::default())
    }
}

/// The options each backend `auto` may choose runs with.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AutoOptions {
    /// For cuFile.
    #[cfg(feature = "cufile")]
    pub cufile: backend_cufile::Options,
    /// For hipFile.
    #[cfg(feature = "hipfile")]
    pub hipfile: backend_hipfile::Options,
    /// For the host backend.
    pub host: HostOptions,
}

/// Whether a load for host memory maps its local files ([`HostOptions::map`]): its tensors
/// are then private, copy-on-write mappings of the files (`StagingPath::Mapped`), the page cache
/// their memory, as `safetensors` hands out.
///
/// A mapped tensor's bytes are the file's: a file modified in place while its tensors live may
/// show through [`Tensor::host_bytes`](crate::Tensor::host_bytes), and one truncated under them
/// makes touching the lost pages a `SIGBUS`. Safe Rust cannot rule that out, so a [`Loader`]
/// maps only when asked ([`Never`](Self::Never) is the default of [`HostOptions`]); the
/// options every door spells ([`LoadOptions`](crate::LoadOptions): Python, C, `stage`) default
/// to [`Auto`](Self::Auto), as `safetensors`' users expect.
///
/// [`Loader`]: crate::Loader
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapFiles {
    /// Map when the device asked for is `cpu` (the tensors are meant to live in host memory,
    /// not stand for a device's), no memory cap is set, and each file is on a local file system
    /// (not NFS, SMB, Ceph, 9p, GPFS, BeeGFS, FUSE and the like, where reads of our own are the
    /// better path).
    Auto,
    /// Map whenever the host backend reads local files (also for device `auto` on a machine
    /// without a GPU, and on any file system).
    Always,
    /// Never map: read into memory of the library's own (the default of [`HostOptions`]).
    #[default]
    Never,
}

impl MapFiles {
    /// The name the options use: `auto`, `true`, `false`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Always => "true",
            Self::Never => "false",
        }
    }
}

/// Options of the host backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostOptions {
    /// Read with `O_DIRECT`, past the page cache (for a cold first load of a checkpoint larger
    /// than memory).
    pub direct_io: bool,
    /// Whether loads for host memory hand out mappings of their files (default
    /// [`MapFiles::Never`]; the doors' options default to [`MapFiles::Auto`]).
    pub map: MapFiles,
}

impl HostOptions {
    /// Whether loads for host memory map their files.
    pub fn map(mut self, map: MapFiles) -> Self {
        self.map = map;
        self
    }

    /// With `O_DIRECT` reads or without.
    pub fn direct_io(mut self, direct_io: bool) -> Self {
        self.direct_io = direct_io;
        self
    }
}

impl Backend {
    /// The backend's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Auto(_) => "auto",
            Self::Host(_) => "host",
            #[cfg(feature = "cufile")]
            Self::Cufile(_) => "cufile",
            #[cfg(feature = "hipfile")]
            Self::Hipfile(_) => "hipfile",
            #[cfg(feature = "mock")]
            Self::Mock => "mock",
        }
    }
}

/// A caller's own CUDA ([`Loader::cuda_context`](crate::Loader::cuda_context),
/// [`Loader::cuda_stream`](crate::Loader::cuda_stream)).
#[cfg(feature = "cufile")]
#[derive(Clone)]
pub(crate) enum CallerCuda {
    Context(Arc<backend_cufile::cudarc::driver::CudaContext>),
    Stream(Arc<backend_cufile::cudarc::driver::CudaStream>),
}

#[cfg(feature = "cufile")]
impl CallerCuda {
    /// The backend and device a load in this context is: cuFile on the context's GPU. `auto`
    /// becomes cuFile with `auto`'s cuFile options; a device on another GPU, or another backend,
    /// is [`Error::DeviceMismatch`].
    pub(crate) fn apply(&self, backend: &Backend, device: Device) -> Result<(Backend, Device)> {
        let context = match self {
            Self::Context(context) => context,
            Self::Stream(stream) => stream.context(),
        };
        let ordinal = context.ordinal();
        let mut options = match backend {
            Backend::Auto(auto) => auto.cufile.clone(),
            Backend::Cufile(options) => options.clone(),
            other => {
                return Err(Error::DeviceMismatch {
                    backend: other.name(),
                    device: format!("cuda:{ordinal} (the caller's CUDA context)"),
                    hint: "a CUDA context or stream was given: use backend cufile or auto",
                });
            }
        };
        match device {
            Device::Auto => {}
            Device::Gpu(n) if n == ordinal => {}
            other => {
                return Err(Error::DeviceMismatch {
                    backend: "cufile",
                    device: other.to_string(),
                    hint: "the CUDA context or stream given is on another device: ask for its device, or auto",
                });
            }
        }
        options.device = ordinal;
        match self {
            Self::Context(context) => options.context = Some(Arc::clone(context)),
            Self::Stream(stream) => options.stream = Some(Arc::clone(stream)),
        }
        Ok((Backend::Cufile(options), Device::Gpu(ordinal)))
    }
}

/// A backend, opened: what every load of it shares (the device, the driver, pooled buffers, the
/// allocator and its accounting); each load gets a reader of its own from it.
pub(crate) enum Opened {
    Host {
        options: HostOptions,
        allocator: HostAllocator,
        /// The `O_DIRECT` reader, with its pooled aligned buffers (unused without `direct_io`).
        direct: Arc<DirectHostReader>,
    },
    #[cfg(feature = "cufile")]
    Cufile(Box<backend_cufile::Backend>),
    #[cfg(feature = "hipfile")]
    Hipfile(Box<backend_hipfile::Backend>),
    #[cfg(feature = "mock")]
    Mock {
        reader: Arc<backend_mock::MockReader>,
        allocator: Arc<backend_mock::MockAllocator>,
    },
}

impl Opened {
    /// Whether the backend's device is system memory (a cap is then its capacity, not a budget).
    pub(crate) fn is_host(&self) -> bool {
        match self {
            Self::Host { .. } => true,
            #[cfg(feature = "mock")]
            Self::Mock { .. } => true,
            #[allow(unreachable_patterns)] // with no GPU backend built, there is nothing else
            _ => false,
        }
    }
}

/// What [`open`] chose, and why.
pub(crate) struct Chosen {
    pub(crate) opened: Opened,
    /// `"name: why"` for each backend `auto` passed over.
    pub(crate) passed_over: Vec<String>,
    /// Why the chosen backend runs its POSIX path, when `auto` mode made it do so.
    pub(crate) mode_reason: Option<String>,
}

impl Chosen {
    fn plain(opened: Opened) -> Self {
        Self {
            opened,
            passed_over: Vec::new(),
            mode_reason: None,
        }
    }
}

/// Opens `backend` for `device`; a host or mock device holds at most `host_capacity` bytes.
///
/// This is where `auto` and "a GPU was asked for" are decided, for every door:
/// - `auto` on device `auto`: cuFile, then hipFile (GPU 0, or the backend options' own device),
///   else the host backend, each GPU backend passed over recorded with why;
/// - `auto` on `cpu`: the host backend;
/// - `auto` on GPU `n` (`cuda:N`): cuFile, then hipFile; neither usable is [`Error::NoGpu`];
///   on `hip:N`: hipFile only, or [`Error::NoGpu`];
/// - a named backend: that one, on the GPU given (or its options' device for `auto`); a device
///   it cannot load onto is [`Error::DeviceMismatch`];
/// - `remote`: the checkpoint is at a URL, so no local file is read: a GPU backend opens only
///   what its POSIX path needs (the device, pinned bounce buffers), never its driver library
///   (libcufile, libhipfile), whatever mode was asked for.
// With no GPU backend built, `auto`'s two "not built" reasons are pushed one after the other.
#[allow(clippy::vec_init_then_push)]
pub(crate) fn open(
    backend: &Backend,
    device: Device,
    host_capacity: Option<u64>,
    remote: bool,
) -> Result<Chosen> {
    let host = |options| {
        Chosen::plain(Opened::Host {
            options,
            allocator: match host_capacity {
                Some(cap) => HostAllocator::with_capacity(cap),
                None => HostAllocator::new(),
            },
            direct: Arc::new(DirectHostReader::default()),
        })
    };
    let mismatch = |hint| Error::DeviceMismatch {
        backend: backend.name(),
        device: device.to_string(),
        hint,
    };
    let gpu = device.gpu_index();
    #[cfg(not(any(feature = "cufile", feature = "hipfile")))]
    let _ = (gpu, remote); // no GPU backend in this build
    match backend {
        Backend::Host(_) if gpu.is_some() => Err(mismatch(
            "it loads into host memory: use device cpu (or auto)",
        )),
        Backend::Host(options) => Ok(host(*options)),
        #[cfg(feature = "mock")]
        Backend::Mock if gpu.is_some() => Err(mismatch(
            "it loads into host memory: use device cpu (or auto)",
        )),
        #[cfg(feature = "mock")]
        Backend::Mock => {
            let (reader, allocator) = backend_mock::mock_backend();
            let allocator = match host_capacity {
                Some(cap) => allocator.with_capacity(cap),
                None => allocator,
            };
            Ok(Chosen::plain(Opened::Mock {
                reader: Arc::new(reader),
                allocator: Arc::new(allocator),
            }))
        }
        #[cfg(feature = "cufile")]
        Backend::Cufile(_) if matches!(device, Device::Cpu | Device::Hip(_)) => Err(mismatch(
            "it loads onto CUDA GPUs: use device cuda, cuda:N or N",
        )),
        #[cfg(feature = "cufile")]
        Backend::Cufile(options) => {
            open_cufile(options, gpu, remote).map_err(|e| Error::backend("cufile", e))
        }
        #[cfg(feature = "hipfile")]
        Backend::Hipfile(_) if device == Device::Cpu => Err(mismatch(
            "it loads onto HIP GPUs: use device hip:N, cuda:N or N",
        )),
        #[cfg(feature = "hipfile")]
        Backend::Hipfile(options) => {
            open_hipfile(options, gpu, remote).map_err(|e| Error::backend("hipfile", e))
        }
        Backend::Auto(auto) if device == Device::Cpu => Ok(host(auto.host)),
        Backend::Auto(auto) => {
            let mut passed_over = Vec::new();
            // Why, in a few words, for the one-line error when a GPU was asked for: the vendor
            // the device names (ROCm only for hip:N, or where it was found but saw no GPU).
            let mut reasons: Vec<&'static str> = Vec::new();
            let hip_asked = matches!(device, Device::Hip(_));
            #[cfg(feature = "cufile")]
            if hip_asked {
                passed_over.push(format!("cufile: device {device} is a HIP device"));
            } else {
                match open_cufile(&auto.cufile, gpu, remote) {
                    Ok(chosen) => return Ok(chosen),
                    Err(
                        e @ (backend_cufile::Error::NoCudaDriver | backend_cufile::Error::NoDevice),
                    ) => {
                        reasons.push(match e {
                            backend_cufile::Error::NoDevice => "the NVIDIA driver sees no GPU",
                            _ => "NVIDIA driver not found",
                        });
                        passed_over.push(format!("cufile: {e}"));
                    }
                    Err(e) => return Err(Error::backend("cufile", e)),
                }
            }
            #[cfg(not(feature = "cufile"))]
            {
                if !hip_asked {
                    reasons.push("built without the cufile backend");
                }
                passed_over.push(Error::NotBuilt("cufile").to_string());
            }
            #[cfg(feature = "hipfile")]
            {
                match open_hipfile(&auto.hipfile, gpu, remote) {
                    Ok(mut chosen) => {
                        chosen.passed_over = passed_over;
                        return Ok(chosen);
                    }
                    Err(
                        e @ (backend_hipfile::Error::NoHipRuntime { .. }
                        | backend_hipfile::Error::NoDevice),
                    ) => {
                        match e {
                            backend_hipfile::Error::NoDevice => reasons.push("ROCm sees no GPU"),
                            _ if hip_asked || reasons.is_empty() => reasons.push("ROCm not found"),
                            _ => {}
                        }
                        passed_over.push(format!("hipfile: {e}"));
                    }
                    Err(e) => return Err(Error::backend("hipfile", e)),
                }
            }
            #[cfg(not(feature = "hipfile"))]
            {
                if hip_asked || reasons.is_empty() {
                    reasons.push("built without the hipfile backend");
                }
                passed_over.push(Error::NotBuilt("hipfile").to_string());
            }
            if gpu.is_some() {
                return Err(Error::NoGpu {
                    device: device.to_string(),
                    reason: reasons.join("; "),
                    passed_over,
                });
            }
            let mut chosen = host(auto.host);
            chosen.passed_over = passed_over;
            Ok(chosen)
        }
    }
}

#[cfg(feature = "cufile")]
fn open_cufile(
    options: &backend_cufile::Options,
    device: Option<usize>,
    remote: bool,
) -> std::result::Result<Chosen, backend_cufile::Error> {
    let mut options = options.clone();
    let callers = options
        .stream
        .as_ref()
        .map(|s| s.context())
        .or(options.context.as_ref());
    match (device, callers) {
        (Some(device), _) => options.device = device,
        // The caller's context decides the device when none was asked for.
        (None, Some(context)) => options.device = context.ordinal(),
        (None, None) => {}
    }
    if remote {
        options.mode = backend_cufile::RequestedMode::Posix;
    }
    let mut backend = backend_cufile::open(&options)?;
    // For a URL the POSIX path is the only one there is, not a fallback with a reason.
    let mode_reason = backend.fallback_reason.take().filter(|_| !remote);
    Ok(Chosen {
        opened: Opened::Cufile(Box::new(backend)),
        passed_over: Vec::new(),
        mode_reason,
    })
}

#[cfg(feature = "hipfile")]
fn open_hipfile(
    options: &backend_hipfile::Options,
    device: Option<usize>,
    remote: bool,
) -> std::result::Result<Chosen, backend_hipfile::Error> {
    let mut options = options.clone();
    if let Some(device) = device {
        options.device = device;
    }
    if remote {
        options.mode = backend_hipfile::RequestedMode::Posix;
    }
    let mut backend = backend_hipfile::open(&options)?;
    // For a URL the POSIX path is the only one there is, not a fallback with a reason.
    let mode_reason = backend.fallback_reason.take().filter(|_| !remote);
    Ok(Chosen {
        opened: Opened::Hipfile(Box::new(backend)),
        passed_over: Vec::new(),
        mode_reason,
    })
}
