//! Loads a checkpoint with the library's one entry point and prints where each tensor went:
//! `cargo run --example load -- /path/to/model_dir` (the host backend: runs without a GPU).

use safetensors_staging::{Backend, HostOptions, Loader};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: load <checkpoint dir, index or file>")?;
    let mut load = Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .open(path)?;
    for tensor in load.by_ref() {
        let tensor = tensor?; // an error names the file, the tensor and the offset
        println!(
            "{} {:?} {:?} {} bytes {:?}",
            tensor.name(),
            tensor.meta().dtype,
            tensor.meta().shape,
            tensor.len(),
            tensor.path()
        );
    }
    let report = load.report();
    println!(
        "{} tensors, {} bytes read in {:.3} s",
        report.tensors, report.bytes_read, report.seconds
    );
    Ok(())
}
