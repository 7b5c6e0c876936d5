//! The caller's current GPU stays the caller's (issue 19, item 3): against stub drivers that keep
//! a context stack per thread (CUDA) and a current device per thread (HIP), record every push,
//! pop and set, and count each free or copy made while another context or device is current.
//!
//! The caller here is a thread whose current context is device 1's (as torch's is after
//! `torch.cuda.set_device(1)`), loading onto device 0: after opening, loading (device path,
//! host path through the staging buffer, POSIX path through pinned buffers, cuFile's path),
//! handing over to `cudarc`, a `cudarc` destination, and dropping tensors on other threads,
//! every thread's current context is what it was, and nothing was freed in the wrong context.
//! No GPU is involved.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use crate::common;
use crate::fixtures::{MIB, cuda_counter, policy, three_tensors};

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use backend_cufile::RequestedMode;
use backend_cufile::cudarc::driver::{CudaContext, result, sys};
use safetensors_staging::{Backend, Loader, StagingPath, Tensor};

/// This module's turn at the stub (see `tests/stubs/main.rs`): its tests run beside each other,
/// never beside another module's.
const TURN: &str = "context";

fn turn() -> crate::Turn {
    crate::turn(TURN)
}

fn cuda_stubs() -> &'static backend_cufile::stubs::Stubs {
    common::cuda_stubs()
}

/// The primary context of stub device `ordinal`.
fn primary_context(ordinal: i32) -> sys::CUcontext {
    cuda_stubs();
    result::init().unwrap();
    let device = result::device::get(ordinal).unwrap();
    // SAFETY: `device` came from cuDeviceGet; the stub's primary contexts live for the process.
    unsafe { result::primary_ctx::retain(device) }.unwrap()
}

fn current() -> Option<sys::CUcontext> {
    result::ctx::get_current().unwrap()
}

fn make_current(context: Option<sys::CUcontext>) {
    // SAFETY: a stub primary context, or null to unbind.
    unsafe { result::ctx::set_current(context.unwrap_or(std::ptr::null_mut())) }.unwrap();
}

fn cufile_loader(mode: RequestedMode, threads: usize, cap: Option<u64>) -> Loader<'static> {
    let options = backend_cufile::Options {
        device: 0,
        mode,
        library: Some(cuda_stubs().cufile.clone()),
        bounce_size: 64 << 10,
        ..backend_cufile::Options::default()
    };
    Loader::new()
        .backend(Backend::Cufile(options))
        .policy(policy(threads))
        .memory_cap(cap)
}

/// Drops `tensors` on a new thread whose current context is `context` (or none), and checks it
/// is still that one after.
fn drop_on_another_thread(tensors: Vec<Tensor>, context: Option<sys::CUcontext>) {
    let context = context.map(|c| c as usize);
    std::thread::spawn(move || {
        let context = context.map(|c| c as sys::CUcontext);
        if context.is_some() {
            make_current(context);
        }
        assert_eq!(current(), context);
        drop(tensors);
        assert_eq!(
            current(),
            context,
            "a tensor dropped here moved this thread's context"
        );
    })
    .join()
    .unwrap();
}

#[test]
fn cuda_the_callers_current_context_is_the_same_before_and_after_everything() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 3);
    let caller = primary_context(1);
    let device0 = primary_context(0);
    assert_ne!(caller, device0);
    make_current(Some(caller));
    let pushes = cuda_counter(b"stub_cuda_ctx_pushes");
    let pops = cuda_counter(b"stub_cuda_ctx_pops");
    let wrong = cuda_counter(b"stub_cuda_wrong_context");

    // Loads: compat (cuFileRead), POSIX (pinned halves, asynchronous copies), one and three I/O
    // threads; with a 4 MiB budget `b` takes the host path through the staging buffer.
    for mode in [RequestedMode::Auto, RequestedMode::Posix] {
        for threads in [1, 3] {
            let load = cufile_loader(mode, threads, Some(4 * MIB as u64))
                .open(&path)
                .unwrap();
            assert_eq!(current(), Some(caller), "opening moved the context");
            let mut kept = Vec::new();
            let mut paths = Vec::new();
            for tensor in load {
                let tensor = tensor.unwrap();
                assert_eq!(current(), Some(caller), "loading moved the context");
                assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
                assert_eq!(current(), Some(caller), "reading back moved the context");
                paths.push(tensor.path());
                kept.push(tensor);
            }
            assert!(paths.contains(&StagingPath::Host), "{paths:?}");
            assert!(paths.contains(&StagingPath::Device), "{paths:?}");
            // Freed on threads with device 1's context current, and with none.
            let last = kept.split_off(1);
            drop_on_another_thread(kept, Some(caller));
            drop_on_another_thread(last, None);
            assert_eq!(current(), Some(caller));
        }
    }

    // Hand-over to cudarc, and a cudarc slice as a destination. (cudarc itself binds its
    // context with cuCtxSetCurrent when the caller uses its objects; that is cudarc's way, so
    // the caller's context is set again after each direct use of cudarc below.)
    let stream = CudaContext::new(0).unwrap().default_stream();
    let mut mine = stream.clone_htod(&vec![0u8; 2 * MIB]).unwrap();
    make_current(Some(caller));
    let mut load = cufile_loader(RequestedMode::Auto, 1, None)
        .open(&path)
        .unwrap();
    let a = load.next().unwrap().unwrap();
    let (_, memory) = a.into_cuda().unwrap();
    let slice = memory.into_cuda_slice(&stream).unwrap();
    assert_eq!(current(), Some(caller), "the hand-over moved the context");
    drop(load);
    {
        let destination = common::IntoSlice {
            slice: &mut mine,
            stream: Arc::clone(&stream),
        };
        let load = cufile_loader(RequestedMode::Auto, 1, None)
            .destination(destination)
            .open(&path)
            .unwrap();
        let paths: Vec<_> = load.map(|t| t.unwrap().path()).collect();
        assert_eq!(paths[1], StagingPath::Destination);
    }
    assert_eq!(
        current(),
        Some(caller),
        "a cudarc destination moved the context"
    );
    assert_eq!(stream.clone_dtoh(&slice).unwrap(), contents["a"]);
    assert_eq!(stream.clone_dtoh(&mine).unwrap(), contents["b"]);
    drop((slice, mine));
    make_current(Some(caller));

    // Every push was popped, some were needed (device 1's context was current), and nothing
    // was freed or copied while another context was current. (The other tests of this module
    // do not use the CUDA stub, and other modules' tests wait for their turn.)
    let pushed = cuda_counter(b"stub_cuda_ctx_pushes") - pushes;
    let popped = cuda_counter(b"stub_cuda_ctx_pops") - pops;
    assert!(pushed > 0, "the library never pushed its context");
    assert_eq!(pushed, popped, "pushes and pops do not pair");
    assert_eq!(cuda_counter(b"stub_cuda_wrong_context") - wrong, 0);
    make_current(None);
}

// ---- HIP ---------------------------------------------------------------------------------

fn hip_stubs() -> &'static backend_hipfile::stubs::Stubs {
    static STUBS: OnceLock<backend_hipfile::stubs::Stubs> = OnceLock::new();
    STUBS.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("context-hip-stubs");
        let stubs = backend_hipfile::stubs::build(&out).unwrap();
        // SAFETY: `void stub_hip_set_devices(long)` of the stub, opened by path (the backend
        // opens the same instance).
        unsafe {
            let lib = libloading::Library::new(&stubs.hip).unwrap();
            let set: libloading::Symbol<unsafe extern "C" fn(i64)> =
                lib.get(b"stub_hip_set_devices").unwrap();
            set(2);
            std::mem::forget(lib);
        }
        stubs
    })
}

/// This thread's current device in the stub runtime, and a way to set it.
fn hip_device(set: Option<i32>) -> i32 {
    // SAFETY: `hipSetDevice(int)` and `hipGetDevice(int*)` of the stub runtime.
    unsafe {
        let lib = libloading::Library::new(&hip_stubs().hip).unwrap();
        if let Some(device) = set {
            let set_device: libloading::Symbol<unsafe extern "C" fn(i32) -> i32> =
                lib.get(b"hipSetDevice").unwrap();
            assert_eq!(set_device(device), 0);
        }
        let get_device: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
            lib.get(b"hipGetDevice").unwrap();
        let mut device = -1;
        assert_eq!(get_device(&mut device), 0);
        device
    }
}

#[test]
fn hip_the_callers_current_device_is_the_same_before_and_after_everything() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 3);
    hip_stubs();
    assert_eq!(hip_device(Some(1)), 1);
    let wrong = common::stub_counter(&hip_stubs().hip, b"stub_hip_wrong_device");
    let sets = common::stub_counter(&hip_stubs().hip, b"stub_hip_sets");
    for mode in [RequestedMode::Auto, RequestedMode::Posix] {
        for threads in [1, 3] {
            let options = backend_hipfile::Options {
                device: 0,
                mode,
                library: Some(hip_stubs().hipfile.clone()),
                hip_library: Some(hip_stubs().hip.clone()),
                bounce_size: 64 << 10,
                ..backend_hipfile::Options::default()
            };
            let load = Loader::new()
                .backend(Backend::Hipfile(options))
                .policy(policy(threads))
                .memory_cap(Some(4 * MIB as u64))
                .open(&path)
                .unwrap();
            assert_eq!(hip_device(None), 1, "opening moved the device");
            let mut kept = Vec::new();
            for tensor in load {
                let tensor = tensor.unwrap();
                assert_eq!(hip_device(None), 1, "loading moved the device");
                assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
                kept.push(tensor);
            }
            assert_eq!(hip_device(None), 1);
            // Dropped on a thread whose current device is 1: still 1 after.
            std::thread::spawn(move || {
                assert_eq!(hip_device(Some(1)), 1);
                drop(kept);
                assert_eq!(
                    hip_device(None),
                    1,
                    "a tensor dropped here moved the device"
                );
            })
            .join()
            .unwrap();
        }
    }
    assert!(
        common::stub_counter(&hip_stubs().hip, b"stub_hip_sets") - sets > 0,
        "device 0 was never made current"
    );
    assert_eq!(
        common::stub_counter(&hip_stubs().hip, b"stub_hip_wrong_device") - wrong,
        0,
        "memory freed or copied while another device was current"
    );
}

/// HIP gets the hand-over CUDA has (`Tensor::take_backend`): the device pointer, the device,
/// and ownership that frees through the backend; a tensor of one backend does not pass for the
/// other's.
#[test]
fn hip_a_taken_tensor_is_the_callers_and_frees_through_the_backend() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = three_tensors(dir.path(), "model.safetensors", 3);
    hip_stubs();
    let options = backend_hipfile::Options {
        device: 0,
        mode: RequestedMode::Posix,
        hip_library: Some(hip_stubs().hip.clone()),
        ..backend_hipfile::Options::default()
    };
    let mut load = Loader::new()
        .backend(Backend::Hipfile(options))
        .policy(policy(1))
        .open(&path)
        .unwrap();
    let held = load.held_memory();
    let a = load.next().unwrap().unwrap();
    assert_eq!(a.path(), StagingPath::Device);
    assert_eq!(a.space(), "hip");
    let a = a.into_cuda().expect_err("a HIP tensor is no CUDA memory");
    let (meta, memory) = a.into_hip().unwrap();
    assert_eq!((meta.name.as_str(), memory.len()), ("a", 3 * MIB));
    assert_eq!(memory.device_ordinal(), 0);
    assert!(!memory.is_shared(), "3 MiB has an allocation of its own");
    assert_ne!(memory.device_ptr(), 0);
    let mut back = vec![0u8; memory.len()];
    memory.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, contents["a"]);
    let rest: Vec<_> = load.by_ref().map(Result::unwrap).collect();
    assert_eq!(load.report().taken_device_bytes, 3 * MIB as u64);
    drop((rest, load));
    assert_eq!(held.device_bytes(), 0, "the library holds nothing of it");
    let live = |ptr: u64| {
        // SAFETY: the stub HIP runtime's `size_t (void *)` function.
        unsafe {
            let lib = libloading::Library::new(&hip_stubs().hip).unwrap();
            let live: libloading::Symbol<unsafe extern "C" fn(u64) -> usize> =
                lib.get(b"stub_hip_live_allocation").unwrap();
            live(ptr)
        }
    };
    let ptr = memory.device_ptr();
    assert_eq!(live(ptr), 3 * MIB, "the load is gone, the caller holds it");
    drop(memory);
    assert_eq!(live(ptr), 0, "dropping it freed it through the backend");
}
