//! The cuFile backend's real code (symbol table, CUDA allocator through cudarc, cuFile reader in
//! compatibility and POSIX modes) against stub `libcuda` and `libcufile` libraries compiled here,
//! with system memory standing for device memory. No GPU is involved: this shows the backend's
//! logic, not NVIDIA's libraries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use crate::common;

use std::path::PathBuf;

use backend_cufile::stubs::Stubs;
use backend_cufile::{CuFileReader, CudaAllocator, Options, RequestedMode};
use backend_mock::conformance::Harness;

/// The stub libraries, built once for the binary, with the stub `libcuda.so` loaded into this
/// process so that `cudarc`'s own `dlopen("libcuda.so")` finds it by its soname.
fn stubs() -> &'static Stubs {
    common::cuda_stubs()
}

/// This module's turn at the stub (see `tests/stubs/main.rs`): its tests run beside each other,
/// never beside another module's.
const TURN: &str = "cufile";

fn turn() -> crate::Turn {
    crate::turn(TURN)
}

fn open(mode: RequestedMode) -> backend_cufile::Backend {
    open_with_bounce(mode, Options::default().bounce_size)
}

fn open_with_bounce(mode: RequestedMode, bounce_size: usize) -> backend_cufile::Backend {
    let options = Options {
        mode,
        library: Some(stubs().cufile.clone()),
        bounce_size,
        ..Options::default()
    };
    backend_cufile::open(&options).unwrap()
}

struct CuFileCompat;

impl Harness for CuFileCompat {
    type Reader = CuFileReader;
    type Allocator = CudaAllocator;
    fn backend(&self) -> (CuFileReader, CudaAllocator) {
        let backend = open(RequestedMode::Auto);
        assert_eq!(
            staging_core::Reader::mode(&backend.reader).as_str(),
            "compat"
        );
        (backend.reader, backend.allocator)
    }
}

struct CuFilePosix;

impl Harness for CuFilePosix {
    type Reader = CuFileReader;
    type Allocator = CudaAllocator;
    fn backend(&self) -> (CuFileReader, CudaAllocator) {
        let backend = open(RequestedMode::Posix);
        assert_eq!(
            staging_core::Reader::mode(&backend.reader).as_str(),
            "posix"
        );
        (backend.reader, backend.allocator)
    }
}

/// The POSIX path with 8 KiB bounce buffers (two 4 KiB halves), so a tensor takes many
/// `pread`s whose asynchronous copies overlap; the stub libcuda defers every asynchronous copy
/// to the stream's synchronization, so a missing wait shows as wrong bytes.
struct CuFilePosixSmallBounce;

impl Harness for CuFilePosixSmallBounce {
    type Reader = CuFileReader;
    type Allocator = CudaAllocator;
    fn backend(&self) -> (CuFileReader, CudaAllocator) {
        let backend = open_with_bounce(RequestedMode::Posix, 8192);
        assert_eq!(
            staging_core::Reader::mode(&backend.reader).as_str(),
            "posix"
        );
        (backend.reader, backend.allocator)
    }
}

/// Compat mode with small tensors carved from shared device blocks, as `stage` runs it.
struct CuFileSuballocated;

impl Harness for CuFileSuballocated {
    type Reader = CuFileReader;
    type Allocator = staging_core::SubAllocator<CudaAllocator>;
    fn backend(&self) -> (CuFileReader, Self::Allocator) {
        let backend = open(RequestedMode::Auto);
        let allocator = staging_core::SubAllocator::new(backend.allocator, 64 * 1024, 20 * 1024);
        (backend.reader, allocator)
    }
}

mod compat {
    backend_mock::conformance_suite!(crate::taking(super::TURN, super::CuFileCompat));
}

mod compat_suballocated {
    backend_mock::conformance_suite!(crate::taking(super::TURN, super::CuFileSuballocated));
}

mod posix {
    backend_mock::conformance_suite!(crate::taking(super::TURN, super::CuFilePosix));
}

mod posix_small_bounce {
    backend_mock::conformance_suite!(crate::taking(super::TURN, super::CuFilePosixSmallBounce));
}

#[test]
fn pinned_bytes_are_handed_out_only_after_their_copy_finished() {
    let _turn = turn();
    let backend = open(RequestedMode::Posix);
    common::pinned_bytes_wait_for_their_copy(backend.allocator.device(), &backend.allocator);
}

#[test]
fn the_posix_path_copies_with_cumemcpyhtodasync() {
    let _turn = turn();
    let counter = || common::stub_counter(&stubs().cuda, b"stub_cuda_async_copies");
    // 64 KiB through 4 KiB pinned halves: at least 16 asynchronous copies.
    assert!(common::counted_load(&CuFilePosixSmallBounce, counter) >= 16);
}

// ---- Hand-over: a loaded tensor becomes memory the caller owns, a caller's `cudarc` slice a
// ---- destination; the budget keeps counting what the caller took.

use crate::fixtures::{MIB, policy, three_tensors};
use backend_cufile::HandoverError;
use backend_cufile::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use safetensors_staging::{Backend, Loader, StagingPath, StagingPolicy};
use std::sync::Arc;

/// The default stream of the stub device's primary context, through `cudarc` (the stub libcuda
/// loaded first, so that `cudarc` finds it).
fn cuda_stream() -> Arc<CudaStream> {
    stubs();
    CudaContext::new(0).unwrap().default_stream()
}

/// The size of the stub device's live allocation at `ptr`, or 0 when it was freed.
fn live_allocation(ptr: u64) -> usize {
    stubs();
    // SAFETY: the stub is loaded (above) and this is its `size_t (CUdeviceptr)` function.
    unsafe {
        let lib = libloading::Library::new(&stubs().cuda).unwrap();
        let live: libloading::Symbol<unsafe extern "C" fn(u64) -> usize> =
            lib.get(b"stub_cuda_live_allocation").unwrap();
        live(ptr)
    }
}

/// A cuFile loader on the stubs with a 4 MiB budget and no headroom: a tensor goes to the
/// device when the budget less what the load (and its caller) holds covers it.
fn budget_loader() -> Loader<'static> {
    let options = Options {
        library: Some(stubs().cufile.clone()),
        ..Options::default()
    };
    Loader::new()
        .backend(Backend::Cufile(options))
        .policy(policy(1))
        .memory_cap(Some(4 * MIB as u64))
}

#[test]
fn a_taken_tensor_becomes_a_cudarc_slice_and_stays_counted_against_the_budget() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 9);
    let stream = cuda_stream();

    // Dropped by the caller: `a`'s 3 MiB are free again, and `b` fits the budget.
    let mut load = budget_loader().open(&path).unwrap();
    drop(load.next().unwrap().unwrap());
    assert_eq!(load.next().unwrap().unwrap().path(), StagingPath::Device);

    // Kept by the library: `b` does not fit beside `a`.
    let mut load = budget_loader().open(&path).unwrap();
    let kept = load.next().unwrap().unwrap();
    assert_eq!(load.next().unwrap().unwrap().path(), StagingPath::Host);
    drop(kept);

    // Taken by the caller as a `CudaSlice`: the library no longer holds it, but its 3 MiB are
    // still in use, so `b` still does not fit; the report says who holds what.
    let mut load = budget_loader().open(&path).unwrap();
    let a = load.next().unwrap().unwrap();
    assert_eq!(a.path(), StagingPath::Device);
    let (meta, memory) = a.into_cuda().unwrap();
    assert_eq!((meta.name.as_str(), memory.len()), ("a", 3 * MIB));
    assert!(
        !memory.is_shared(),
        "a 3 MiB tensor has an allocation of its own"
    );
    let ptr = memory.device_ptr();
    let slice: CudaSlice<u8> = memory.into_cuda_slice(&stream).unwrap();
    assert_eq!(stream.clone_dtoh(&slice).unwrap(), contents["a"]);
    let b = load.next().unwrap().unwrap();
    assert_eq!(b.path(), StagingPath::Host, "the taken 3 MiB still count");
    assert_eq!(b.to_vec().unwrap(), contents["b"]);
    let rest: Vec<_> = load.by_ref().map(Result::unwrap).collect();
    let report = load.report();
    assert_eq!(report.taken_device_bytes, 3 * MIB as u64);
    assert!(
        report.peak_device_bytes < 3 * MIB as u64 + MIB as u64,
        "after the hand-over the library held at most the staging buffer and `c`: {}",
        report.peak_device_bytes
    );
    drop((b, rest, load));
    // The slice is the caller's: it holds its device memory until `cudarc` frees it.
    assert_eq!(
        live_allocation(ptr),
        3 * MIB,
        "the load is gone, the slice holds it"
    );
    drop(slice);
    assert_eq!(live_allocation(ptr), 0, "cudarc freed the allocation");
}

#[test]
fn a_carved_tensor_is_an_owned_handle_not_a_slice() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 9);
    let stream = cuda_stream();
    let load = budget_loader().memory_cap(None).open(&path).unwrap();
    let mut tensors = load.into_iter().map(|tensor| tensor.unwrap());
    let c = tensors.find(|tensor| tensor.name() == "c").unwrap();
    let (_, memory) = c.into_cuda().unwrap();
    assert!(memory.is_shared(), "4 KiB is carved from a shared block");
    let (memory, error) = memory.into_cuda_slice(&stream).unwrap_err();
    assert!(matches!(error, HandoverError::Shared), "{error}");
    // Still the caller's, and still readable.
    let mut back = vec![0u8; memory.len()];
    memory.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, contents["c"]);
}

#[test]
fn a_load_of_one_tensor_carves_nothing() {
    let _turn = turn();
    // A reader asking for tensors one at a time (Python's `safe_open`) would otherwise hold a
    // block for each small tensor it hands out.
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 9);
    let stream = cuda_stream();
    let load = budget_loader()
        .memory_cap(None)
        .select(safetensors_staging::Selection::names(["c"]))
        .open(&path)
        .unwrap();
    let c = load.into_iter().next().unwrap().unwrap();
    let (_, memory) = c.into_cuda().unwrap();
    assert!(
        !memory.is_shared(),
        "the one tensor has a buffer of its own"
    );
    let slice = memory.into_cuda_slice(&stream).unwrap();
    assert_eq!(stream.clone_dtoh(&slice).unwrap(), contents["c"]);
}

#[test]
fn a_cudarc_slice_is_a_destination_without_unsafe() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 9);
    let stream = cuda_stream();
    let mut mine = stream.clone_htod(&vec![0u8; 2 * MIB]).unwrap();
    {
        let destination = common::IntoSlice {
            slice: &mut mine,
            stream: Arc::clone(&stream),
        };
        let load = budget_loader()
            .memory_cap(None)
            .destination(destination)
            .open(&path)
            .unwrap();
        let paths: Vec<_> = load.map(|t| t.unwrap().path()).collect();
        assert_eq!(
            paths,
            [
                StagingPath::Device,
                StagingPath::Destination,
                StagingPath::Device
            ]
        );
    }
    assert_eq!(stream.clone_dtoh(&mine).unwrap(), contents["b"]);
}

/// A checkpoint on an HTTP server goes to the device through the cuFile backend's pinned bounce
/// buffers: the remote reader fills a pinned half, `cuMemcpyHtoDAsync` copies it while the next
/// half is fetched. (Stubs: "device" memory is system memory; no GPU runs this.)
#[test]
#[cfg(feature = "remote")]
fn a_remote_checkpoint_reaches_the_device_through_pinned_bounce_buffers() {
    let _turn = turn();
    use backend_mock::http::RangeServer;
    use safetensors_staging::RemoteOptions;

    let server = RangeServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 9);
    server.put("/m/model.safetensors", std::fs::read(&path).unwrap());
    for threads in [1, 3] {
        let options = Options {
            library: Some(stubs().cufile.clone()),
            bounce_size: MIB, // two 512 KiB halves: every tensor but `c` spans several
            ..Options::default()
        };
        let mut remote = RemoteOptions::default();
        remote.range_size = 256 << 10;
        let policy = StagingPolicy::builder()
            .io_threads(threads)
            .build()
            .unwrap();
        let mut load = Loader::new()
            .backend(Backend::Cufile(options))
            .policy(policy)
            .remote(remote)
            .open(server.url("/m"))
            .unwrap();
        let mut seen = 0;
        for tensor in load.by_ref() {
            let tensor = tensor.unwrap();
            assert_eq!(tensor.path(), StagingPath::Device, "{}", tensor.name());
            assert_eq!(tensor.space(), "cuda");
            assert!(
                tensor.to_vec().unwrap() == contents[tensor.name()],
                "{}",
                tensor.name()
            );
            seen += 1;
        }
        assert_eq!(seen, 3);
        let report = load.report();
        assert_eq!(
            (report.backend.as_str(), report.mode.as_str()),
            ("cufile", "remote")
        );
        assert_eq!(report.bytes_read, (5 * MIB + 4096) as u64);
    }
    assert!(
        server
            .log()
            .iter()
            .all(|l| l.method == "HEAD" || l.range.is_some()),
        "ranged GETs only"
    );
}

/// A checkpoint at a URL reads no local file, so the cuFile backend opens no libcufile for it:
/// a library that cannot be loaded, asked for in GDS-only mode, fails a local load but not a
/// load of the same bytes over HTTP, whose report gives no POSIX-path reason.
#[test]
#[cfg(feature = "remote")]
fn a_url_load_opens_no_cufile_driver() {
    let _turn = turn();
    use backend_mock::http::RangeServer;

    let server = RangeServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 9);
    server.put("/m/model.safetensors", std::fs::read(&path).unwrap());
    let options = Options {
        library: Some(PathBuf::from("/nonexistent/libcufile.so.0")),
        mode: RequestedMode::Fast,
        ..Options::default()
    };
    stubs();
    let local = Loader::new()
        .backend(Backend::Cufile(options.clone()))
        .open(&path);
    let error = local.map(|_| ()).unwrap_err().to_string();
    assert!(error.contains("libcufile"), "{error}");
    let mut load = Loader::new()
        .backend(Backend::Cufile(options))
        .open(server.url("/m"))
        .unwrap();
    for tensor in load.by_ref() {
        let tensor = tensor.unwrap();
        assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
    }
    let report = load.report();
    assert_eq!(
        (report.backend.as_str(), report.mode.as_str()),
        ("cufile", "remote")
    );
    assert_eq!(report.mode_reason, None);
    assert_eq!(report.tensors, 3);
}
