//! AMD GPUs through hipFile or a POSIX path (run against stub libraries only so far): opened on
//! the GPU asked for. Its reader, for local files and URLs alike, is `mod.rs`'s
//! `with_gds_reader`.

use super::{Chosen, Opened, mismatch};
use crate::device::Device;
use crate::error::{Error, Result};

/// Opens hipFile for `device` (the CPU is [`Error::DeviceMismatch`]).
pub(super) fn open(
    options: &backend_hipfile::Options,
    device: Device,
    remote: bool,
) -> Result<Chosen> {
    if device == Device::Cpu {
        return Err(mismatch(
            "hipfile",
            device,
            "it loads onto HIP GPUs: use device hip:N, cuda:N or N",
        ));
    }
    open_hipfile(options, device.gpu_index(), remote).map_err(|e| Error::backend("hipfile", e))
}

/// Opens hipFile on `device` (else the options' own); for a URL its POSIX path only.
pub(super) fn open_hipfile(
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
