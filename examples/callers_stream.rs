//! Loads a checkpoint onto a CUDA GPU through a `cudarc` stream of the caller's own, twice
//! through one prepared backend, and prints one JSON line: each load's report (backend, mode,
//! bytes, seconds) and every tensor's SHA-256 as read back from the device, plus how the two
//! loads' hashes compare. `scripts/gpu_check.py` runs it on a GPU and compares the hashes with
//! those of the files as Python `safetensors` reads them.
//!
//! `cargo run --release --example callers_stream -- CHECKPOINT [auto|compat|gds|posix] [GPU]`

use std::collections::BTreeMap;
use std::sync::Arc;

use safetensors_staging::cufile::{Options, RequestedMode, cudarc::driver::CudaContext};
use safetensors_staging::{Backend, Loader};
use sha2::{Digest, Sha256};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: callers_stream CHECKPOINT [auto|compat|gds|posix] [GPU]")?;
    let mode = match args.next().as_deref().unwrap_or("auto") {
        "auto" => RequestedMode::Auto,
        "compat" => RequestedMode::Compat,
        "gds" => RequestedMode::Fast,
        "posix" => RequestedMode::Posix,
        other => return Err(format!("unknown mode {other:?}").into()),
    };
    let gpu: usize = args.next().as_deref().unwrap_or("0").parse()?;
    // The caller's own CUDA: a context and a stream of its own, made before the library is.
    let context = CudaContext::new(gpu)?;
    let stream = context.new_stream()?;
    let options = Options {
        mode,
        ..Options::default()
    };
    let mut prepared = Loader::new()
        .backend(Backend::Cufile(options))
        .cuda_stream(Arc::clone(&stream))
        .prepare()?;
    let mut loads = Vec::new();
    for _ in 0..2 {
        let mut load = prepared.open(&path)?;
        let mut hashes = BTreeMap::new();
        let mut kept = Vec::new();
        for tensor in load.by_ref() {
            let tensor = tensor?;
            kept.push(tensor);
        }
        let report = load.report();
        for tensor in &kept {
            let bytes = tensor.to_vec()?;
            hashes.insert(
                tensor.name().to_owned(),
                format!("{:x}", Sha256::digest(&bytes)),
            );
        }
        loads.push(serde_json::json!({
            "backend": report.backend,
            "mode": report.mode.as_str(),
            "tensors": report.tensors,
            "bytes": report.bytes,
            "seconds": report.seconds,
            "sha256": hashes,
        }));
    }
    let same = loads.first().map(|l| &l["sha256"]) == loads.get(1).map(|l| &l["sha256"]);
    println!(
        "{}",
        serde_json::json!({ "loads": loads, "same_bytes_both_loads": same })
    );
    Ok(())
}
