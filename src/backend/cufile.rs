//! NVIDIA GPUs through cuFile (GDS or its compatibility mode) or a POSIX path: opened on the
//! GPU asked for (or the caller's CUDA context's), and a caller's own CUDA ([`CallerCuda`]). Its
//! reader, for local files and URLs alike, is `mod.rs`'s `with_gds_reader`.

use std::sync::Arc;

use super::{Backend, Chosen, Opened, mismatch};
use crate::device::Device;
use crate::error::{Error, Result};

/// A caller's own CUDA ([`Loader::cuda_context`](crate::Loader::cuda_context),
/// [`Loader::cuda_stream`](crate::Loader::cuda_stream)).
#[derive(Clone)]
pub(crate) enum CallerCuda {
    Context(Arc<backend_cufile::cudarc::driver::CudaContext>),
    Stream(Arc<backend_cufile::cudarc::driver::CudaStream>),
}

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

/// Opens cuFile for `device` (a CPU or HIP device is [`Error::DeviceMismatch`]).
pub(super) fn open(
    options: &backend_cufile::Options,
    device: Device,
    remote: bool,
) -> Result<Chosen> {
    if matches!(device, Device::Cpu | Device::Hip(_)) {
        return Err(mismatch(
            "cufile",
            device,
            "it loads onto CUDA GPUs: use device cuda, cuda:N or N",
        ));
    }
    open_cufile(options, device.gpu_index(), remote).map_err(|e| Error::backend("cufile", e))
}

/// Opens cuFile on `device` (else the options' own, or the caller's context's); for a URL its
/// POSIX path only.
pub(super) fn open_cufile(
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
