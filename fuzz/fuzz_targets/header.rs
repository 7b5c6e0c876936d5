//! Fuzzes safetensors header parsing: the input is a whole `model.safetensors` file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempdir_in_shm() else { return };
    let path = dir.join("model.safetensors");
    if std::fs::write(&path, data).is_ok() {
        if let Ok(checkpoint) = staging_core::Checkpoint::open(&path) {
            for t in checkpoint.tensors() {
                assert!(t.offset + t.len as u64 <= checkpoint.files()[t.file_index].size);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
});

fn tempdir_in_shm() -> std::io::Result<std::path::PathBuf> {
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let dir = std::path::Path::new(base).join(format!("staging-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
