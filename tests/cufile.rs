//! The cuFile backend's real code (symbol table, CUDA allocator through cudarc, cuFile reader in
//! compatibility and POSIX modes) against stub `libcuda` and `libcufile` libraries compiled here,
//! with system memory standing for device memory. No GPU is involved: this shows the backend's
//! logic, not NVIDIA's libraries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use backend_cufile::stubs::{Stubs, build};
use backend_cufile::{CuFileReader, CudaAllocator, Options, RequestedMode};
use backend_mock::conformance::Harness;

/// Builds the stubs once and loads the stub `libcuda.so` into this process, so that `cudarc`'s
/// own `dlopen("libcuda.so")` finds it by its soname.
fn stubs() -> &'static Stubs {
    static STUBS: OnceLock<Stubs> = OnceLock::new();
    STUBS.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cufile-stubs");
        let stubs = build(&out).unwrap();
        // SAFETY: the stub's initializers are trivial; RTLD_GLOBAL makes its soname visible.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&stubs.cuda),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        }
        .unwrap();
        std::mem::forget(lib);
        stubs
    })
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
    backend_mock::conformance_suite!(super::CuFileCompat);
}

mod compat_suballocated {
    backend_mock::conformance_suite!(super::CuFileSuballocated);
}

mod posix {
    backend_mock::conformance_suite!(super::CuFilePosix);
}

mod posix_small_bounce {
    backend_mock::conformance_suite!(super::CuFilePosixSmallBounce);
}

#[test]
fn the_posix_path_copies_with_cumemcpyhtodasync() {
    let counter = || common::stub_counter(&stubs().cuda, b"stub_cuda_async_copies");
    // 64 KiB through 4 KiB pinned halves: at least 16 asynchronous copies.
    assert!(common::counted_load(&CuFilePosixSmallBounce, counter) >= 16);
}
