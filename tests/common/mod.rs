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

/// A pinned buffer hands out its bytes only once the asynchronous copy reading them has
/// finished: it is filled with 1s and copied to the device, then (at once) refilled with 2s.
/// The stub runtimes perform an asynchronous copy only when its stream is synchronized, so a
/// `bytes_mut` that did not wait would let the 2s, or nothing, land; the device must hold 1s.
pub(crate) fn pinned_bytes_wait_for_their_copy<G, A>(gpu: &std::sync::Arc<G>, allocator: &A)
where
    G: backend_gds::Gpu,
    A: staging_core::DeviceAllocator<Space = G::Space>,
{
    use backend_gds::Pinned;
    use staging_core::DeviceBuffer;
    let mut pinned = G::pinned(gpu, 4096).unwrap();
    pinned.bytes_mut().unwrap().fill(1);
    let mut target = allocator.allocate(4096).unwrap();
    // SAFETY: `target` stays allocated and unused until the copy is waited for below, and the
    // pinned bytes are only rewritten through `bytes_mut`, which waits first: what is tested.
    unsafe { gpu.copy_to_device(&mut pinned, target.region()) }.unwrap();
    pinned.bytes_mut().unwrap().fill(2);
    let mut back = vec![0u8; 4096];
    allocator.copy_to_host(&target, 0, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 1),
        "the device holds {:?}",
        &back[..4]
    );
}

/// A destination that reads tensor `b` into a slice the caller allocated with `cudarc`.
pub(crate) struct IntoSlice<'a> {
    pub(crate) slice: &'a mut backend_cufile::cudarc::driver::CudaSlice<u8>,
    pub(crate) stream: std::sync::Arc<backend_cufile::cudarc::driver::CudaStream>,
}

impl staging_core::Destination<backend_cufile::CudaMemory> for IntoSlice<'_> {
    fn region(
        &mut self,
        tensor: &staging_core::TensorMeta,
    ) -> Result<
        Option<staging_core::DeviceRegion<'_, backend_cufile::CudaMemory>>,
        staging_core::DestinationError,
    > {
        if tensor.name != "b" {
            return Ok(None);
        }
        Ok(Some(backend_cufile::cuda_region(self.slice, &self.stream)?))
    }
}

/// The stub libcuda and libcufile, built once per test binary (under the test's temporary
/// directory); the stub libcuda loaded into this process (so `cudarc` finds it by its soname)
/// with two devices. One copy per process: `cudarc` binds to the first `libcuda.so` loaded.
pub(crate) fn cuda_stubs() -> &'static backend_cufile::stubs::Stubs {
    static STUBS: std::sync::OnceLock<backend_cufile::stubs::Stubs> = std::sync::OnceLock::new();
    STUBS.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-stubs");
        let stubs = backend_cufile::stubs::build(&out).unwrap();
        // SAFETY: the stub's initializers are trivial; RTLD_GLOBAL makes its soname visible.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&stubs.cuda),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        }
        .unwrap();
        // SAFETY: `void stub_cuda_set_devices(long)`.
        unsafe {
            let set: libloading::os::unix::Symbol<unsafe extern "C" fn(i64)> =
                lib.get(b"stub_cuda_set_devices").unwrap();
            set(2);
        }
        std::mem::forget(lib);
        stubs
    })
}
