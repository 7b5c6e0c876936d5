//! The cuFile backend's real code (symbol table, CUDA allocator through cudarc, cuFile reader in
//! compatibility and POSIX modes) against stub `libcuda` and `libcufile` libraries compiled here,
//! with system memory standing for device memory. No GPU is involved: this shows the backend's
//! logic, not NVIDIA's libraries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

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
    let options = Options {
        mode,
        library: Some(stubs().cufile.clone()),
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
        assert_eq!(staging_core::Reader::mode(&backend.reader), "compat");
        (backend.reader, backend.allocator)
    }
}

struct CuFilePosix;

impl Harness for CuFilePosix {
    type Reader = CuFileReader;
    type Allocator = CudaAllocator;
    fn backend(&self) -> (CuFileReader, CudaAllocator) {
        let backend = open(RequestedMode::Posix);
        assert_eq!(staging_core::Reader::mode(&backend.reader), "posix");
        (backend.reader, backend.allocator)
    }
}

mod compat {
    backend_mock::conformance_suite!(super::CuFileCompat);
}

mod posix {
    backend_mock::conformance_suite!(super::CuFilePosix);
}
