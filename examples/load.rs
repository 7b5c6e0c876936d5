//! Loads a checkpoint with the library's one entry point, on the host backend (no GPU needed),
//! and prints where each tensor went: `cargo run --example load -- /path/to/model_dir`.

use safetensors_staging::{Backend, HostOptions, Loader};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: load CHECKPOINT")?;
    let backend = Backend::Host(HostOptions::default());
    let mut load = Loader::new().backend(backend).open(path)?;
    for tensor in load.by_ref() {
        let tensor = tensor?; // an error names the file, the tensor and the offset
        let (meta, path) = (tensor.meta(), tensor.path());
        println!("{} {:?} {:?} {path:?}", meta.name, meta.dtype, meta.shape);
    }
    println!("{} bytes read", load.report().bytes_read);
    Ok(())
}
