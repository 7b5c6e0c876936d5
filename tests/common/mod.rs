//! Helpers shared by the library tests: opening paths as a loader would, and counting what the
//! stub native libraries did. The malformed cases live in `backend_mock::malformed`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use backend_mock::fixtures::{TensorSpec, write_file};

/// Opens paths the way the `stage` command does.
pub(crate) fn open(paths: &[PathBuf]) -> staging_core::Result<staging_core::Checkpoint> {
    match paths {
        [one] => staging_core::Checkpoint::open(one),
        many => staging_core::Checkpoint::from_files(many),
    }
}

/// Reads the `size_t (void)` counter `symbol` of the stub library at `library` (already loaded
/// by the test; opening it again returns the same instance).
pub(crate) fn stub_counter(library: &Path, symbol: &[u8]) -> usize {
    // SAFETY: the stub's initializers are trivial and `symbol` is a `size_t (void)` function.
    unsafe {
        let lib = libloading::Library::new(library).unwrap();
        let counter: libloading::Symbol<unsafe extern "C" fn() -> usize> = lib.get(symbol).unwrap();
        counter()
    }
}

/// Loads one 64 KiB tensor with `harness`'s backend on one thread, checks its bytes, and
/// returns by how much `counter` grew meanwhile (other tests may add to it, never take away).
pub(crate) fn counted_load<H: backend_mock::conformance::Harness>(
    harness: &H,
    counter: impl Fn() -> usize,
) -> usize {
    use staging_core::{
        Checkpoint, DeviceAllocator, DeviceBuffer, Stager, StagingPolicy, TensorData,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let contents = write_file(&path, &[TensorSpec::bytes("w", 64 << 10)], 21).unwrap();
    let (reader, allocator) = harness.backend();
    let policy = StagingPolicy::builder().io_threads(1).build().unwrap();
    let before = counter();
    let mut stager =
        Stager::new(Checkpoint::open(&path).unwrap(), reader, allocator, policy).unwrap();
    let tensor = stager.next().unwrap().unwrap();
    let grew = counter() - before;
    let TensorData::Device(d) = tensor.data() else {
        panic!("expected the device path, got {:?}", tensor.path());
    };
    let mut bytes = vec![0u8; d.buffer().len()];
    stager
        .allocator()
        .copy_to_host(d.buffer(), 0, &mut bytes)
        .unwrap();
    assert_eq!(bytes, contents["w"]);
    grew
}
