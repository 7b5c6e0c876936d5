//! A context guard takes off the thread's context stack only the context it pushed, and a device
//! buffer is freed in its own context or not at all (issue 33, item 10), against the stub
//! libcuda, which keeps a context stack per thread and remembers each allocation's context.
//!
//! Three stub devices, so that the caller's current context (device 2's) differs from both
//! devices the library binds. Each test runs on a thread of its own, so its stack starts empty
//! and no other test touches it; each opens its own devices, so the faults they record are its
//! own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use backend_cufile::cudarc::driver::{result, sys};
use backend_cufile::{CudaAllocator, CudaDevice};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW, Symbol};
use staging_core::DeviceAllocator;

/// The stub libcuda, built once and loaded into this process (so that `cudarc` finds it by its
/// soname) with three devices.
fn stub() -> &'static Library {
    static STUB: OnceLock<Library> = OnceLock::new();
    STUB.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("context-stack-stubs");
        let stubs = backend_cufile::stubs::build(&out).unwrap();
        // SAFETY: the stub's initializers are trivial; RTLD_GLOBAL makes its soname visible.
        let lib = unsafe { Library::open(Some(&stubs.cuda), RTLD_NOW | RTLD_GLOBAL) }.unwrap();
        // SAFETY: `void stub_cuda_set_devices(long)`.
        unsafe {
            let set: Symbol<unsafe extern "C" fn(i64)> = lib.get(b"stub_cuda_set_devices").unwrap();
            set(3);
        }
        lib
    })
}

fn device(ordinal: usize) -> Arc<CudaDevice> {
    stub();
    CudaDevice::open(ordinal).unwrap()
}

fn current() -> Option<sys::CUcontext> {
    result::ctx::get_current().unwrap()
}

/// This thread's context stack depth (stub).
fn depth() -> usize {
    // SAFETY: `size_t stub_cuda_ctx_depth(void)`.
    unsafe {
        let depth: Symbol<unsafe extern "C" fn() -> usize> =
            stub().get(b"stub_cuda_ctx_depth").unwrap();
        depth()
    }
}

/// Frees (stub) or copies (stub) made while a context other than the memory's own was current.
fn wrong_context() -> usize {
    // SAFETY: `size_t stub_cuda_wrong_context(void)`.
    unsafe {
        let wrong: Symbol<unsafe extern "C" fn() -> usize> =
            stub().get(b"stub_cuda_wrong_context").unwrap();
        wrong()
    }
}

/// The size of the live allocation at `ptr` (stub), 0 once freed.
fn live_allocation(ptr: u64) -> usize {
    // SAFETY: `size_t stub_cuda_live_allocation(CUdeviceptr)`.
    unsafe {
        let live: Symbol<unsafe extern "C" fn(u64) -> usize> =
            stub().get(b"stub_cuda_live_allocation").unwrap();
        live(ptr)
    }
}

/// Makes this thread's next `n` `cuCtxPushCurrent` calls fail (stub).
fn fail_pushes(n: i32) {
    // SAFETY: `void stub_cuda_fail_pushes(int)`.
    unsafe {
        let fail: Symbol<unsafe extern "C" fn(i32)> = stub().get(b"stub_cuda_fail_pushes").unwrap();
        fail(n);
    }
}

/// What other code on the thread (a caller's library, say) does with the stack.
fn push(context: sys::CUcontext) {
    // SAFETY: a stub primary context, retained by a device the test holds.
    unsafe { sys::cuCtxPushCurrent_v2(context) }
        .result()
        .unwrap();
}

fn pop() -> sys::CUcontext {
    let mut popped = std::ptr::null_mut();
    // SAFETY: pops this thread's top context into a valid local.
    unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }
        .result()
        .unwrap();
    popped
}

fn make_current(context: sys::CUcontext) {
    // SAFETY: a stub primary context, retained by a device the test holds.
    unsafe { result::ctx::set_current(context) }.unwrap();
}

#[test]
fn guards_dropped_out_of_order_each_take_off_only_their_own_context() {
    let (gpu0, gpu1) = (device(0), device(1));
    assert_eq!((current(), depth()), (None, 0));
    let outer = gpu0.bind().unwrap();
    let inner = gpu1.bind().unwrap();
    assert_eq!((current(), depth()), (Some(gpu1.context()), 2));
    drop(outer);
    assert_eq!(
        current(),
        Some(gpu1.context()),
        "dropping the outer guard first took the inner guard's context off the stack"
    );
    assert_eq!(depth(), 1);
    drop(inner);
    assert_eq!((current(), depth()), (None, 0), "a context was left behind");
    assert_eq!(
        gpu0.faults().misplaced_contexts,
        1,
        "the out-of-order drop is recorded: {:?}",
        gpu0.faults()
    );
    assert_eq!(gpu1.faults().misplaced_contexts, 0);
}

#[test]
fn a_context_pushed_over_a_guards_stays_current_and_the_callers_comes_back_after_it() {
    let (gpu0, gpu1, callers) = (device(0), device(1), device(2));
    make_current(callers.context());
    let bound = gpu0.bind().unwrap();
    // Other code pushes device 1's context and has not popped it when the guard drops.
    push(gpu1.context());
    drop(bound);
    assert_eq!(
        current(),
        Some(gpu1.context()),
        "the guard popped a context it did not push"
    );
    assert_eq!(
        pop(),
        gpu1.context(),
        "the other code's pop did not get its own context back"
    );
    assert_eq!(
        (current(), depth()),
        (Some(callers.context()), 1),
        "the caller's context is not current again"
    );
    let faults = gpu0.faults();
    assert_eq!(faults.misplaced_contexts, 1, "{faults:?}");
    assert!(
        faults
            .last
            .as_deref()
            .is_some_and(|l| l.contains("under 1")),
        "{faults:?}"
    );
}

#[test]
fn a_guard_whose_context_was_replaced_leaves_the_stack_alone_and_says_so() {
    let (gpu0, gpu1, callers) = (device(0), device(1), device(2));
    make_current(callers.context());
    let bound = gpu0.bind().unwrap();
    // Other code replaces the guard's context with cuCtxSetCurrent: its entry is gone.
    make_current(gpu1.context());
    drop(bound);
    assert_eq!(
        (current(), depth()),
        (Some(gpu1.context()), 2),
        "the guard popped a context it did not push"
    );
    let faults = gpu0.faults();
    assert_eq!(faults.misplaced_contexts, 1, "{faults:?}");
    assert!(
        faults
            .last
            .as_deref()
            .is_some_and(|l| l.contains("not found")),
        "{faults:?}"
    );
    assert_eq!(pop(), gpu1.context());
    assert_eq!((current(), depth()), (Some(callers.context()), 1));
}

#[test]
fn a_buffer_whose_context_cannot_be_made_current_is_kept_not_freed_in_another() {
    let (gpu0, callers) = (device(0), device(2));
    make_current(callers.context());
    let buffer = CudaAllocator::new(Arc::clone(&gpu0))
        .allocate(4096)
        .unwrap();
    let ptr = buffer.device_ptr();
    assert_eq!(live_allocation(ptr), 4096);
    let wrong = wrong_context();
    fail_pushes(1);
    drop(buffer);
    fail_pushes(0);
    assert_eq!(
        live_allocation(ptr),
        4096,
        "freed although its context could not be made current (in the caller's context)"
    );
    assert_eq!(
        wrong_context(),
        wrong,
        "memory was freed in the wrong context"
    );
    assert_eq!(current(), Some(callers.context()));
    let faults = gpu0.faults();
    assert_eq!((faults.leaked_buffers, faults.leaked_bytes), (1, 4096));
    assert!(
        faults
            .last
            .as_deref()
            .is_some_and(|l| l.contains("could not be made current")),
        "{faults:?}"
    );
    // The test frees it in its own context.
    push(gpu0.context());
    // SAFETY: the stub allocation at `ptr`, not freed above, freed once, in its own context.
    unsafe { result::free_sync(ptr) }.unwrap();
    assert_eq!(pop(), gpu0.context());
    assert_eq!(live_allocation(ptr), 0);
}

#[test]
fn a_buffer_is_freed_in_its_own_context_while_another_is_current() {
    let (gpu0, callers) = (device(0), device(2));
    make_current(callers.context());
    let buffer = CudaAllocator::new(Arc::clone(&gpu0))
        .allocate(4096)
        .unwrap();
    let ptr = buffer.device_ptr();
    let wrong = wrong_context();
    drop(buffer);
    assert_eq!(live_allocation(ptr), 0, "not freed");
    assert_eq!(wrong_context(), wrong, "freed in the wrong context");
    assert_eq!((current(), depth()), (Some(callers.context()), 1));
    assert_eq!(gpu0.faults().leaked_buffers, 0);
}
