//! `auto`, decided here and nowhere else: the host backend for device `cpu`; otherwise cuFile
//! when a CUDA driver and a device are there, else hipFile when a HIP runtime and a device are,
//! else the host backend (or, when a GPU was asked for, [`Error::NoGpu`]), each backend passed
//! over recorded with why.

use super::{AutoOptions, Chosen};
use crate::device::Device;
use crate::error::{Error, Result};

/// Opens what `auto` chooses for `device`; a host device holds at most `host_capacity` bytes.
// With no GPU backend built, `auto`'s two "not built" reasons are pushed one after the other.
#[allow(clippy::vec_init_then_push)]
pub(super) fn open(
    auto: &AutoOptions,
    device: Device,
    host_capacity: Option<u64>,
    remote: bool,
) -> Result<Chosen> {
    if device == Device::Cpu {
        return Ok(super::host::opened(auto.host, host_capacity));
    }
    let gpu = device.gpu_index();
    #[cfg(not(any(feature = "cufile", feature = "hipfile")))]
    let _ = (gpu, remote); // no GPU backend in this build
    let mut passed_over = Vec::new();
    // Why, in a few words, for the one-line error when a GPU was asked for: the vendor
    // the device names (ROCm only for hip:N, or where it was found but saw no GPU).
    let mut reasons: Vec<&'static str> = Vec::new();
    let hip_asked = matches!(device, Device::Hip(_));
    #[cfg(feature = "cufile")]
    if hip_asked {
        passed_over.push(format!("cufile: device {device} is a HIP device"));
    } else {
        match super::cufile::open_cufile(&auto.cufile, gpu, remote) {
            Ok(chosen) => return Ok(chosen),
            Err(e @ (backend_cufile::Error::NoCudaDriver | backend_cufile::Error::NoDevice)) => {
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
        match super::hipfile::open_hipfile(&auto.hipfile, gpu, remote) {
            Ok(mut chosen) => {
                chosen.passed_over = passed_over;
                return Ok(chosen);
            }
            Err(
                e
                @ (backend_hipfile::Error::NoHipRuntime { .. } | backend_hipfile::Error::NoDevice),
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
    let mut chosen = super::host::opened(auto.host, host_capacity);
    chosen.passed_over = passed_over;
    Ok(chosen)
}
