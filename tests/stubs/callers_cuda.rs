//! A caller's own CUDA (issue 20, item 6) and one prepared cuFile backend serving several loads,
//! against the stub libcuda and libcufile (system memory standing for device memory; the stub
//! defers every asynchronous copy until its stream or an event recorded after it is waited for,
//! so a copy not waited for shows as wrong bytes).
//!
//! - a caller's `cudarc` stream: every copy to the device is queued on it, the library creates
//!   no stream, never retains or releases a primary context, and the tensors hand over to
//!   `cudarc` on that stream;
//! - a caller's context on GPU 1: the load goes there with no device asked for; asking for
//!   another device, or another backend, is refused;
//! - a prepared backend: two loads, one after the other and at once, draw on the same pinned
//!   buffers (no new pinned allocation for the second) and get the same bytes.
//!
//! The stub's counters are per process, so the tests of this module run one at a time, and
//! never beside another module's (their turns: `tests/stubs/main.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use crate::common;
use crate::fixtures::{MIB, cuda_counter, policy, three_tensors};

use std::sync::{Arc, Mutex, MutexGuard};

use backend_cufile::RequestedMode;
use backend_cufile::cudarc::driver::{CudaContext, sys};
use backend_mock::fixtures::Contents;
use safetensors_staging::{Backend, Error, HostOptions, Loader, StagingPath};

/// This module's turn at the stub (see `tests/stubs/main.rs`): its tests run beside each other,
/// never beside another module's.
const TURN: &str = "callers_cuda";

fn turn() -> crate::Turn {
    crate::turn(TURN)
}

fn stubs() -> &'static backend_cufile::stubs::Stubs {
    common::cuda_stubs()
}

/// Copies ever queued on `stream` (stub).
fn copies_on(stream: sys::CUstream) -> usize {
    // SAFETY: `size_t stub_cuda_stream_copies(CUstream)` of the stub, loaded by `stubs()`.
    unsafe {
        let lib = libloading::Library::new(&stubs().cuda).unwrap();
        let copies: libloading::Symbol<unsafe extern "C" fn(sys::CUstream) -> usize> =
            lib.get(b"stub_cuda_stream_copies").unwrap();
        copies(stream)
    }
}

/// One test at a time: the stub's counters are the process's.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn options(mode: RequestedMode) -> backend_cufile::Options {
    backend_cufile::Options {
        mode,
        library: Some(stubs().cufile.clone()),
        bounce_size: 64 << 10,
        ..backend_cufile::Options::default()
    }
}

#[test]
fn a_callers_stream_carries_every_copy_and_the_library_makes_no_stream_of_its_own() {
    let _turn = turn();
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model-5.safetensors", 5);
    stubs();
    let context = CudaContext::new(0).unwrap();
    let stream = context.new_stream().unwrap();
    let creates = cuda_counter(b"stub_cuda_stream_creates");
    let retains = cuda_counter(b"stub_cuda_primary_retains");
    let releases = cuda_counter(b"stub_cuda_primary_releases");
    let on_stream = copies_on(stream.cu_stream());

    // The POSIX path (pinned halves, asynchronous copies) on three I/O threads, and `auto`
    // (cuFileRead) on one; a 4 MiB budget sends `b` through the staging buffer.
    for (mode, threads) in [(RequestedMode::Posix, 3), (RequestedMode::Auto, 1)] {
        let mut load = Loader::new()
            .backend(Backend::Cufile(options(mode)))
            .cuda_stream(Arc::clone(&stream))
            .policy(policy(threads))
            .memory_cap(Some(4 * MIB as u64))
            .open(&path)
            .unwrap();
        let mut paths = Vec::new();
        let mut kept = Vec::new();
        for tensor in load.by_ref() {
            let tensor = tensor.unwrap();
            assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
            paths.push(tensor.path());
            kept.push(tensor);
        }
        assert!(paths.contains(&StagingPath::Device), "{paths:?}");
        assert!(paths.contains(&StagingPath::Host), "{paths:?}");
        // `a` (device path) hands over to cudarc on the caller's stream.
        let a = kept.remove(0);
        assert_eq!(a.name(), "a");
        let (_, memory) = a.into_cuda().unwrap();
        assert_eq!(memory.device_ordinal(), 0);
        let slice = memory.into_cuda_slice(&stream).unwrap();
        // (cudarc queues a copy to a `Vec` and leaves the waiting to the caller.)
        let back = stream.clone_dtoh(&slice).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(back, contents["a"]);
        drop((kept, load, slice));
    }
    assert!(
        copies_on(stream.cu_stream()) > on_stream,
        "no copy was queued on the caller's stream"
    );
    assert_eq!(
        cuda_counter(b"stub_cuda_stream_creates"),
        creates,
        "the library created a stream of its own"
    );
    assert_eq!(cuda_counter(b"stub_cuda_primary_retains"), retains);
    assert_eq!(
        cuda_counter(b"stub_cuda_primary_releases"),
        releases,
        "the library released a context it never retained"
    );
    // The caller's context and stream still work.
    let there = stream.clone_htod(&[1u8, 2, 3]).unwrap();
    let back = stream.clone_dtoh(&there).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(back, [1, 2, 3]);
}

#[test]
fn a_callers_context_decides_the_device_and_a_different_one_is_refused() {
    let _turn = turn();
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model-6.safetensors", 6);
    stubs();
    let context = CudaContext::new(1).unwrap();
    let wrong = cuda_counter(b"stub_cuda_wrong_context");

    // No device asked for: the context's, GPU 1; `auto` becomes cuFile.
    let mut mode = Backend::default();
    if let Backend::Auto(auto) = &mut mode {
        auto.cufile = options(RequestedMode::Posix);
    }
    for (backend, device) in [
        (mode, None),
        (Backend::Cufile(options(RequestedMode::Auto)), Some(1)),
    ] {
        let mut loader = Loader::new()
            .backend(backend)
            .cuda_context(Arc::clone(&context))
            .policy(policy(2));
        if let Some(device) = device {
            loader = loader.device(device);
        }
        let mut load = loader.open(&path).unwrap();
        assert_eq!(load.report().backend, "cufile");
        let a = load.next().unwrap().unwrap();
        assert_eq!(a.to_vec().unwrap(), contents["a"]);
        let (_, memory) = a.into_cuda().unwrap();
        assert_eq!(memory.device_ordinal(), 1);
        for tensor in load {
            let tensor = tensor.unwrap();
            assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
        }
        drop(memory);
    }
    assert_eq!(
        cuda_counter(b"stub_cuda_wrong_context") - wrong,
        0,
        "memory used or freed outside the caller's context"
    );

    // GPU 0 asked for, with a context of GPU 1; the host backend with a CUDA context.
    let error = Loader::new()
        .cuda_context(Arc::clone(&context))
        .device(0)
        .prepare()
        .unwrap_err();
    assert!(
        matches!(error, Error::DeviceMismatch { backend: "cufile", ref device, .. } if device == "cuda:0"),
        "{error}"
    );
    assert_eq!(error.kind(), safetensors_staging::ErrorKind::InvalidOption);
    let error = Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .cuda_context(Arc::clone(&context))
        .prepare()
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::DeviceMismatch {
                backend: "host",
                ..
            }
        ),
        "{error}"
    );
    // The backend's own options: a stream of another context than the one given, and a device
    // that is not the context's.
    let other = CudaContext::new(0).unwrap().new_stream().unwrap();
    let mut mixed = options(RequestedMode::Posix);
    mixed.context = Some(Arc::clone(&context));
    mixed.stream = Some(other);
    let error = backend_cufile::open(&mixed).unwrap_err();
    assert!(
        matches!(error, backend_cufile::Error::CallerCuda(_)),
        "{error}"
    );
    let mut elsewhere = options(RequestedMode::Posix);
    elsewhere.context = Some(Arc::clone(&context));
    elsewhere.device = 0;
    let error = backend_cufile::open(&elsewhere).unwrap_err();
    assert!(
        error.to_string().contains("device 0 was asked for"),
        "{error}"
    );
}

#[test]
fn one_prepared_backend_serves_loads_one_after_another_and_at_once_on_the_same_pinned_buffers() {
    let _turn = turn();
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (first, first_contents) = three_tensors(dir.path(), "model-7.safetensors", 7);
    let (second, second_contents) = three_tensors(dir.path(), "model-8.safetensors", 8);
    stubs();
    let mut prepared = Loader::new()
        .backend(Backend::Cufile(options(RequestedMode::Posix)))
        .device(0)
        .policy(policy(1))
        .prepare()
        .unwrap();
    let pinned = cuda_counter(b"stub_cuda_host_allocs");
    let check = |load: safetensors_staging::Load<'_>, contents: &Contents| {
        let mut n = 0;
        for tensor in load {
            let tensor = tensor.unwrap();
            assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
            n += 1;
        }
        assert_eq!(n, 3);
    };
    check(prepared.open(&first).unwrap(), &first_contents);
    let after_first = cuda_counter(b"stub_cuda_host_allocs") - pinned;
    assert!(after_first > 0, "the POSIX path allocated no pinned buffer");
    check(prepared.open(&second).unwrap(), &second_contents);
    check(prepared.open(&first).unwrap(), &first_contents);
    assert_eq!(
        cuda_counter(b"stub_cuda_host_allocs") - pinned,
        after_first,
        "a later load of the same backend allocated pinned buffers again"
    );
    // Two loads at once, interleaved tensor by tensor, each with its own report.
    let mut one = prepared.open(&first).unwrap();
    let mut two = prepared.open(&second).unwrap();
    for _ in 0..3 {
        let x = one.next().unwrap().unwrap();
        let y = two.next().unwrap().unwrap();
        assert_eq!(x.to_vec().unwrap(), first_contents[x.name()]);
        assert_eq!(y.to_vec().unwrap(), second_contents[y.name()]);
    }
    assert!(one.next().is_none() && two.next().is_none());
    for load in [&one, &two] {
        let report = load.report();
        assert_eq!((report.tensors, report.mode.as_str()), (3, "posix"));
        assert_eq!(report.bytes_read, (5 * MIB + 4096) as u64);
    }
}
