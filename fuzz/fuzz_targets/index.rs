//! Fuzzes opening a checkpoint directory: the input is its `model.safetensors.index.json`, next
//! to one valid shard and a subdirectory, so shard names, paths and the weight map are explored.
#![no_main]

use libfuzzer_sys::fuzz_target;

const SHARD_HEADER: &[u8] = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}"#;

fuzz_target!(|data: &[u8]| {
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let dir = std::path::Path::new(base).join(format!("staging-fuzz-index-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::create_dir_all(dir.join("sub")).is_err() {
        return;
    }
    let mut shard = (SHARD_HEADER.len() as u64).to_le_bytes().to_vec();
    shard.extend_from_slice(SHARD_HEADER);
    shard.extend_from_slice(&[0; 11]);
    let ok = std::fs::write(dir.join("model-00001-of-00001.safetensors"), &shard).is_ok()
        && std::fs::write(dir.join("model.safetensors.index.json"), data).is_ok();
    if ok {
        if let Ok(checkpoint) = staging_core::Checkpoint::open(&dir) {
            for f in checkpoint.files() {
                assert!(f.path.starts_with(&dir), "a shard outside the directory: {}", f.path.display());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
});
