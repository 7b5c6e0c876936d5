//! The hipFile backend's real code (hipFile and HIP runtime tables, HIP allocator, the shared
//! reader) against stub `libamdhip64` and `libhipfile` compiled here, with system memory
//! standing for device memory. Nothing here has run on AMD hardware.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use backend_hipfile::stubs::{SMALL_MAX_READ, Stubs, build};
use backend_hipfile::{HipAllocator, HipFileReader, Options, RequestedMode};
use backend_mock::conformance::Harness;
use backend_mock::fixtures::{TensorSpec, write_file};

fn stubs() -> &'static Stubs {
    static STUBS: OnceLock<Stubs> = OnceLock::new();
    STUBS.get_or_init(|| {
        build(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hipfile-stubs")).unwrap()
    })
}

fn open(mode: RequestedMode, library: &Path, max_read: usize) -> backend_hipfile::Backend {
    open_options(Options {
        mode,
        library: Some(library.to_path_buf()),
        max_read,
        ..Options::default()
    })
}

/// Opens the backend with `options` and the stub HIP runtime.
fn open_options(options: Options) -> backend_hipfile::Backend {
    let options = Options {
        hip_library: Some(stubs().hip.clone()),
        ..options
    };
    backend_hipfile::open(&options).unwrap()
}

/// hipFile through the stub (which enforces hipFile's 0x7ffff000-byte per-call limit).
struct HipFile;

impl Harness for HipFile {
    type Reader = HipFileReader;
    type Allocator = HipAllocator;
    fn backend(&self) -> (HipFileReader, HipAllocator) {
        let backend = open(
            RequestedMode::Auto,
            &stubs().hipfile,
            backend_hipfile::MAX_READ,
        );
        assert_eq!(
            staging_core::Reader::mode(&backend.reader).as_str(),
            "hipfile"
        );
        (backend.reader, backend.allocator)
    }
}

/// The POSIX path with 8 KiB bounce buffers: many overlapped `pread`s per tensor, against a
/// stub runtime that performs asynchronous copies only when their stream is synchronized.
struct HipPosixSmallBounce;

impl Harness for HipPosixSmallBounce {
    type Reader = HipFileReader;
    type Allocator = HipAllocator;
    fn backend(&self) -> (HipFileReader, HipAllocator) {
        let backend = open_options(Options {
            mode: RequestedMode::Posix,
            library: Some(stubs().hipfile.clone()),
            bounce_size: 8192,
            ..Options::default()
        });
        assert_eq!(
            staging_core::Reader::mode(&backend.reader).as_str(),
            "posix"
        );
        (backend.reader, backend.allocator)
    }
}

struct HipPosix;

impl Harness for HipPosix {
    type Reader = HipFileReader;
    type Allocator = HipAllocator;
    fn backend(&self) -> (HipFileReader, HipAllocator) {
        let backend = open(
            RequestedMode::Posix,
            &stubs().hipfile,
            backend_hipfile::MAX_READ,
        );
        assert_eq!(
            staging_core::Reader::mode(&backend.reader).as_str(),
            "posix"
        );
        (backend.reader, backend.allocator)
    }
}

// Named as it was when this file was a binary of its own (its tests: `hipfile::hipfile::*`).
#[allow(clippy::module_inception)]
mod hipfile {
    backend_mock::conformance_suite!(super::HipFile);
}

mod posix {
    backend_mock::conformance_suite!(super::HipPosix);
}

mod posix_small_bounce {
    backend_mock::conformance_suite!(super::HipPosixSmallBounce);
}

#[test]
fn pinned_bytes_are_handed_out_only_after_their_copy_finished() {
    let backend = open(
        RequestedMode::Posix,
        &stubs().hipfile,
        backend_hipfile::MAX_READ,
    );
    common::pinned_bytes_wait_for_their_copy(backend.allocator.device(), &backend.allocator);
}

#[test]
fn the_posix_path_copies_with_hipmemcpyasync() {
    let counter = || common::stub_counter(&stubs().hip, b"stub_hip_async_copies");
    // 64 KiB through 4 KiB pinned halves: at least 16 asynchronous copies.
    assert!(common::counted_load(&HipPosixSmallBounce, counter) >= 16);
}

/// Reads over the per-call limit: with the limit cut to 5000 bytes (the stub refuses anything
/// larger with EINVAL), 16 KiB chunks must be cut into several calls; on the device path and the
/// host path, with one and three I/O threads, every byte is right.
#[rstest::rstest]
fn reads_are_cut_to_the_per_call_limit(
    #[values(1, 3)] threads: usize,
    #[values(0, u64::MAX / 2)] free: u64,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs = [
        TensorSpec::bytes("w", 40_000),
        TensorSpec::bytes("v", 4999),
        TensorSpec::bytes("u", 5001),
    ];
    let contents = write_file(&path, &specs, 3).unwrap();
    let backend = open(
        RequestedMode::Fast,
        &stubs().hipfile_small_reads,
        SMALL_MAX_READ,
    );
    let checkpoint = staging_core::Checkpoint::open(&path).unwrap();
    let policy = staging_core::StagingPolicy::builder()
        .chunk_size(16 * 1024)
        .staging_size(16 * 1024)
        .io_threads(threads)
        .memory_budget(Some(free))
        .build()
        .unwrap();
    let allocator = backend.allocator.clone();
    let stager =
        staging_core::Stager::new(checkpoint, backend.reader, backend.allocator, policy).unwrap();
    for tensor in stager {
        let tensor = tensor.unwrap();
        let bytes = match tensor.data() {
            staging_core::TensorData::Device(d) => {
                let mut out = vec![0u8; tensor.meta().len];
                staging_core::DeviceAllocator::copy_to_host(&allocator, d.buffer(), 0, &mut out)
                    .unwrap();
                out
            }
            staging_core::TensorData::Host(h) => h.to_vec(),
            staging_core::TensorData::Destination { .. } => unreachable!(),
        };
        assert!(bytes == contents[tensor.name()], "{} wrong", tensor.name());
    }
}
