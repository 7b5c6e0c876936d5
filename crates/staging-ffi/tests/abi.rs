//! The C ABI called wrongly on purpose, and rightly from several threads: every misuse is a
//! status, never a crash; out-parameters stay untouched on failure; messages name what failed.
//!
//! Length: one test per misuse of the C ABI, sharing the helpers that build configs and
//! checkpoints; split by handle it would repeat them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use backend_mock::fixtures::{TensorSpec, write_file};
use staging_ffi::*;
use stg_status::*;

/// A pointer value no call may write: it must still be there after a failing call.
fn sentinel<T>() -> *mut T {
    std::ptr::dangling_mut::<T>()
}

fn config() -> *mut stg_config {
    let mut out = null_mut();
    // SAFETY: `out` is a valid local.
    assert_eq!(unsafe { stg_config_new(&mut out) }, STG_OK);
    out
}

fn checkpoint(dir: &std::path::Path) -> CString {
    let path = dir.join("model.safetensors");
    write_file(
        &path,
        &[TensorSpec::bytes("a", 1000), TensorSpec::bytes("b", 3000)],
        5,
    )
    .unwrap();
    CString::new(path.to_str().unwrap()).unwrap()
}

/// The text one of the configuration's copying calls gives, whole (checked not truncated).
fn config_text(
    config: *const stg_config,
    copy: unsafe extern "C" fn(*const stg_config, *mut c_char, usize, *mut usize) -> stg_status,
) -> String {
    let mut buf = vec![0 as c_char; 2048];
    let mut written = 0;
    // SAFETY: valid buffer and out-pointer.
    let status = unsafe { copy(config, buf.as_mut_ptr(), buf.len(), &mut written) };
    assert_eq!(status, STG_OK);
    assert!(written < buf.len(), "{written} bytes");
    // SAFETY: the call NUL-terminated the buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn config_error(config: *const stg_config) -> String {
    config_text(config, stg_config_last_error)
}

fn config_details(config: *const stg_config) -> String {
    config_text(config, stg_config_last_error_details)
}

fn load_error(load: *const stg_load) -> String {
    let mut buf = vec![0 as c_char; 512];
    let mut written = 0;
    // SAFETY: valid buffer and out-pointer.
    let status = unsafe { stg_load_last_error(load, buf.as_mut_ptr(), buf.len(), &mut written) };
    assert_eq!(status, STG_OK);
    // SAFETY: the call NUL-terminated the buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_handles_and_out_parameters_are_statuses() {
    // SAFETY: every call below is made with NULL or valid pointers, which is the point.
    unsafe {
        assert_eq!(stg_config_new(null_mut()), STG_NULL_ARGUMENT);
        assert_eq!(
            stg_config_set_backend(null_mut(), c"host".as_ptr()),
            STG_NULL_ARGUMENT
        );
        assert_eq!(stg_config_set_threads(null_mut(), 2), STG_NULL_ARGUMENT);
        let c = config();
        assert_eq!(stg_config_set_backend(c, null()), STG_NULL_ARGUMENT);
        let mut out = sentinel::<stg_load>();
        assert_eq!(
            stg_load_new(null(), c"x".as_ptr(), &mut out),
            STG_NULL_ARGUMENT
        );
        assert_eq!(stg_load_new(c, null(), &mut out), STG_NULL_ARGUMENT);
        assert_eq!(
            stg_load_new(c, c"x".as_ptr(), null_mut()),
            STG_NULL_ARGUMENT
        );
        assert_eq!(out, sentinel(), "out written on failure");
        let mut tensor = sentinel::<stg_tensor>();
        assert_eq!(stg_load_next(null_mut(), &mut tensor), STG_NULL_ARGUMENT);
        let mut report = std::mem::zeroed::<stg_report>();
        assert_eq!(stg_load_report(null_mut(), &mut report), STG_NULL_ARGUMENT);
        let mut info = std::mem::zeroed::<stg_tensor_info>();
        assert_eq!(stg_tensor_describe(null(), &mut info), STG_NULL_ARGUMENT);
        assert_eq!(
            stg_tensor_copy_to_host(null(), null_mut(), 0),
            STG_NULL_ARGUMENT
        );
        let mut buffer = sentinel::<stg_device_buffer>();
        assert_eq!(
            stg_tensor_take_device_buffer(null_mut(), &mut buffer),
            STG_NULL_ARGUMENT
        );
        assert_eq!(buffer, sentinel());
        assert!(stg_device_buffer_ptr(null()).is_null());
        assert_eq!(stg_device_buffer_len(null()), 0);
        assert!(stg_load_backend(null_mut(), null_mut()).is_null());
        let mut written = 7usize;
        assert_eq!(
            stg_config_last_error(null(), null_mut(), 0, &mut written),
            STG_NULL_ARGUMENT
        );
        assert_eq!(
            stg_config_last_error(c, null_mut(), 0, null_mut()),
            STG_NULL_ARGUMENT
        );
        assert_eq!(
            stg_config_last_error(c, null_mut(), 10, &mut written),
            STG_NULL_ARGUMENT
        );
        // _free(NULL) is harmless.
        stg_config_free(null_mut());
        stg_load_free(null_mut());
        stg_tensor_free(null_mut());
        stg_device_buffer_free(null_mut());
        stg_config_free(c);
    }
}

#[test]
fn bad_arguments_are_statuses() {
    let c = config();
    let bad_utf8 = [0xffu8 as c_char, 0xfe_u8 as c_char, 0];
    // SAFETY: valid handles and NUL-terminated strings.
    unsafe {
        assert_eq!(
            stg_config_set_backend(c, c"warp-drive".as_ptr()),
            STG_INVALID_ARGUMENT
        );
        assert_eq!(
            stg_config_set_backend(c, bad_utf8.as_ptr()),
            STG_INVALID_UTF8
        );
        assert_eq!(stg_config_set_chunk_size(c, 0), STG_INVALID_ARGUMENT);
        assert_eq!(stg_config_set_staging_size(c, 0), STG_INVALID_ARGUMENT);
        assert_eq!(stg_config_set_threads(c, 0), STG_INVALID_ARGUMENT);
        assert_eq!(stg_config_set_headroom(c, 1, 0), STG_INVALID_ARGUMENT);
        let mut out = sentinel::<stg_load>();
        assert_eq!(
            stg_load_new(c, bad_utf8.as_ptr(), &mut out),
            STG_INVALID_UTF8
        );
        assert_eq!(
            stg_load_new(c, c"/nonexistent/model.safetensors".as_ptr(), &mut out),
            STG_NOT_FOUND
        );
        assert_eq!(out, sentinel(), "out written on failure");
        assert!(
            config_error(c).contains("/nonexistent/model.safetensors"),
            "{}",
            config_error(c)
        );
        // Every status has a description.
        for status in [
            STG_OK,
            STG_END,
            STG_NULL_ARGUMENT,
            STG_INVALID_UTF8,
            STG_READ,
            STG_PANIC,
            STG_DESTINATION_TOO_SMALL,
        ] {
            assert!(
                !CStr::from_ptr(stg_status_str(status as u32))
                    .to_bytes()
                    .is_empty()
            );
        }
        // A C caller may pass any integer where the header names the enum: a defined answer.
        for unknown in [2, 99, 0xdead, u32::MAX] {
            assert_eq!(
                CStr::from_ptr(stg_status_str(unknown)).to_str().unwrap(),
                "unknown status"
            );
        }
        stg_config_free(c);
    }
}

#[test]
fn messages_truncate_safely_and_report_their_full_length() {
    let c = config();
    // SAFETY: valid handles, buffers and out-pointers.
    unsafe {
        let mut out = null_mut();
        assert_eq!(
            stg_load_new(c, c"/nonexistent/dir".as_ptr(), &mut out),
            STG_NOT_FOUND
        );
        let full = config_error(c);
        let mut small = [0x55 as c_char; 8];
        let mut written = 0;
        assert_eq!(
            stg_config_last_error(c, small.as_mut_ptr(), small.len(), &mut written),
            STG_OK
        );
        assert_eq!(written, full.len());
        assert_eq!(
            CStr::from_ptr(small.as_ptr()).to_bytes(),
            &full.as_bytes()[..7]
        );
        stg_config_free(c);
    }
}

#[test]
fn a_device_buffer_is_taken_once_and_freed_by_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let c = config();
    // SAFETY: valid handles and out-pointers throughout.
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        let mut load = null_mut();
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
        let mut tensor = null_mut();
        assert_eq!(stg_load_next(load, &mut tensor), STG_OK);
        let mut info = std::mem::zeroed::<stg_tensor_info>();
        assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
        assert_eq!(info.path, stg_path::STG_PATH_DEVICE);
        assert_eq!(CStr::from_ptr(info.name).to_str(), Ok("a"));
        let mut wrong = vec![0u8; 999];
        assert_eq!(
            stg_tensor_copy_to_host(tensor, wrong.as_mut_ptr().cast(), wrong.len()),
            STG_LENGTH_MISMATCH
        );
        let mut buffer = null_mut();
        assert_eq!(stg_tensor_take_device_buffer(tensor, &mut buffer), STG_OK);
        assert_eq!(stg_device_buffer_len(buffer), 1000);
        assert_eq!(stg_device_buffer_ptr(buffer), info.data);
        let mut again = sentinel::<stg_device_buffer>();
        assert_eq!(
            stg_tensor_take_device_buffer(tensor, &mut again),
            STG_NOT_A_DEVICE_BUFFER
        );
        assert_eq!(again, sentinel());
        let mut after = std::mem::zeroed::<stg_tensor_info>();
        assert_eq!(stg_tensor_describe(tensor, &mut after), STG_OK);
        assert!(
            after.data.is_null(),
            "a taken tensor no longer points at the buffer"
        );
        stg_tensor_free(tensor); // does not free the taken buffer
        let taken = std::slice::from_raw_parts(stg_device_buffer_ptr(buffer).cast::<u8>(), 1000);
        assert_eq!(taken.len(), 1000, "still readable after the tensor is gone");
        stg_device_buffer_free(buffer);
        // The rest of the load, then END, END.
        let mut second = null_mut();
        assert_eq!(stg_load_next(load, &mut second), STG_OK);
        stg_tensor_free(second);
        let mut none = sentinel::<stg_tensor>();
        assert_eq!(stg_load_next(load, &mut none), STG_END);
        assert_eq!(stg_load_next(load, &mut none), STG_END);
        assert_eq!(none, sentinel());
        let mut report = std::mem::zeroed::<stg_report>();
        assert_eq!(stg_load_report(load, &mut report), STG_OK);
        assert_eq!(
            (report.tensors, report.bytes, report.device_tensors),
            (2, 4000, 2)
        );
        assert_eq!(report.bytes_read, 4000);
        assert_eq!(
            report.taken_device_bytes, 1000,
            "the taken buffer is counted as the caller's"
        );
        stg_load_free(load);
        stg_config_free(c);
    }
}

#[test]
fn the_host_data_pointer_may_be_written_by_c() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let c = config();
    // SAFETY: valid handles and out-pointers throughout; `info.data` points at the tensor's
    // own 1000 host bytes, which the header says C may write.
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        // An 8 KiB device leaves no headroom (the host path) but holds a 4 KiB staging buffer.
        assert_eq!(stg_config_set_device_memory_cap(c, 8192), STG_OK);
        let mut load = null_mut();
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
        let mut tensor = null_mut();
        assert_eq!(stg_load_next(load, &mut tensor), STG_OK);
        let mut info = std::mem::zeroed::<stg_tensor_info>();
        assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
        assert_eq!(info.path, stg_path::STG_PATH_HOST);
        assert!(!info.data.is_null());
        std::ptr::write_bytes(info.data.cast::<u8>(), 0xab, info.bytes);
        let mut back = vec![0u8; info.bytes];
        assert_eq!(
            stg_tensor_copy_to_host(tensor, back.as_mut_ptr().cast(), back.len()),
            STG_OK
        );
        assert!(
            back.iter().all(|&b| b == 0xab),
            "C's writes are the tensor's bytes"
        );
        stg_tensor_free(tensor);
        stg_load_free(load);
        stg_config_free(c);
    }
}

unsafe extern "C" fn too_small(
    _: *mut c_void,
    info: *const stg_tensor_info,
    region: *mut *mut c_void,
    capacity: *mut usize,
) -> u32 {
    static mut ARENA: [u8; 64] = [0; 64];
    // SAFETY: the library passes valid pointers; the arena is static and only this test uses it.
    unsafe {
        if CStr::from_ptr((*info).name).to_bytes() == b"b" {
            *region = std::ptr::addr_of_mut!(ARENA).cast();
            *capacity = 64;
        }
    }
    stg_status::STG_OK as u32
}

unsafe extern "C" fn failing(
    _: *mut c_void,
    _: *const stg_tensor_info,
    _: *mut *mut c_void,
    _: *mut usize,
) -> u32 {
    stg_status::STG_INVALID_ARGUMENT as u32
}

/// Returns a number that is no `stg_status` (C may return anything from a `uint32_t` function).
unsafe extern "C" fn not_a_status(
    _: *mut c_void,
    _: *const stg_tensor_info,
    _: *mut *mut c_void,
    _: *mut usize,
) -> u32 {
    7777
}

#[test]
fn a_too_small_or_failing_destination_ends_the_load_with_a_status() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    for (callback, expected, text) in [
        (
            too_small as unsafe extern "C" fn(_, _, _, _) -> _,
            STG_DESTINATION_TOO_SMALL,
            "tensor \"b\" needs 3000 bytes but its destination holds 64",
        ),
        (
            failing,
            STG_DESTINATION,
            "the destination callback returned STG_INVALID_ARGUMENT",
        ),
        (
            not_a_status,
            STG_DESTINATION,
            "the destination callback returned 7777, which is not a stg_status",
        ),
    ] {
        let c = config();
        // SAFETY: valid handles and out-pointers; the callbacks follow the contract.
        unsafe {
            assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
            assert_eq!(stg_config_set_threads(c, 1), STG_OK);
            assert_eq!(
                stg_config_set_destination(c, Some(callback), null_mut()),
                STG_OK
            );
            let mut load = null_mut();
            assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
            let mut tensor = sentinel::<stg_tensor>();
            if expected == STG_DESTINATION_TOO_SMALL {
                assert_eq!(
                    stg_load_next(load, &mut tensor),
                    STG_OK,
                    "tensor a is declined and loads"
                );
                stg_tensor_free(tensor);
                tensor = sentinel();
            }
            assert_eq!(stg_load_next(load, &mut tensor), expected);
            assert_eq!(tensor, sentinel(), "out written on failure");
            let message = load_error(load);
            assert!(message.contains(text), "{message}");
            let mut none = null_mut();
            assert_eq!(
                stg_load_next(load, &mut none),
                STG_END,
                "nothing after the error"
            );
            stg_load_free(load);
            stg_config_free(c);
        }
    }
}

#[test]
fn gpu_backends_without_their_runtime_are_unavailable_and_auto_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let c = config();
    // SAFETY: valid handles and out-pointers.
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"cufile".as_ptr()), STG_OK);
        let mut load = sentinel::<stg_load>();
        assert_eq!(
            stg_load_new(c, path.as_ptr(), &mut load),
            STG_BACKEND_UNAVAILABLE
        );
        assert!(
            config_error(c).contains("no CUDA driver"),
            "{}",
            config_error(c)
        );
        assert_eq!(stg_config_set_backend(c, c"hipfile".as_ptr()), STG_OK);
        assert_eq!(
            stg_load_new(c, path.as_ptr(), &mut load),
            STG_BACKEND_UNAVAILABLE
        );
        assert!(
            config_error(c).contains("hipfile backend: no HIP runtime"),
            "{}",
            config_error(c)
        );
        assert_eq!(load, sentinel(), "out written on failure");
        assert_eq!(stg_config_set_backend(c, c"auto".as_ptr()), STG_OK);
        let mut load = null_mut();
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
        let mut mode = null();
        let backend = stg_load_backend(load, &mut mode);
        assert_eq!(CStr::from_ptr(backend).to_str(), Ok("host"));
        assert_eq!(CStr::from_ptr(mode).to_str(), Ok("posix"));
        stg_load_free(load);
        stg_config_free(c);
    }
}

/// A raw pointer that may cross threads, as the header allows for a configuration shared
/// read-only.
#[derive(Clone, Copy)]
struct Shared(*const stg_config);
// SAFETY: the configuration is only read by the threads below, as the header documents.
unsafe impl Send for Shared {}

#[test]
fn one_configuration_feeds_loads_on_several_threads() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let c = config();
    // SAFETY: valid handle.
    unsafe { assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK) };
    let shared = Shared(c);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let config = shared;
                let mut total = 0usize;
                // SAFETY: each thread owns its load and tensors; the configuration is only read.
                unsafe {
                    let mut load = null_mut();
                    assert_eq!(stg_load_new(config.0, path.as_ptr(), &mut load), STG_OK);
                    let mut tensor = null_mut();
                    while stg_load_next(load, &mut tensor) == STG_OK {
                        let mut info = std::mem::zeroed::<stg_tensor_info>();
                        assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
                        total += info.bytes;
                        stg_tensor_free(tensor);
                    }
                    stg_load_free(load);
                }
                total
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap(), 4000);
    }
    // SAFETY: no thread uses it any more.
    unsafe { stg_config_free(c) };
}

#[test]
fn coalescing_on_and_off_load_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs: Vec<TensorSpec> = (0..20)
        .map(|i| TensorSpec::bytes(format!("t{i:02}"), 256 * (i % 3 + 1)))
        .collect();
    let contents = write_file(&path, &specs, 9).unwrap();
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a null configuration is refused with a status.
    unsafe {
        assert_eq!(
            stg_config_set_coalesce_below(null_mut(), 0),
            STG_NULL_ARGUMENT
        );
    }
    for below in [0usize, 1 << 20] {
        let c = config();
        let mut seen = 0;
        // SAFETY: valid handles, out-pointers and buffers of the lengths passed.
        unsafe {
            assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
            assert_eq!(stg_config_set_threads(c, 2), STG_OK);
            assert_eq!(stg_config_set_coalesce_below(c, below), STG_OK);
            let mut load = null_mut();
            assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
            let mut tensor = null_mut();
            while stg_load_next(load, &mut tensor) == STG_OK {
                let mut info = std::mem::zeroed::<stg_tensor_info>();
                assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
                let name = std::ffi::CStr::from_ptr(info.name)
                    .to_str()
                    .unwrap()
                    .to_owned();
                let mut bytes = vec![0u8; info.bytes];
                assert_eq!(
                    stg_tensor_copy_to_host(tensor, bytes.as_mut_ptr().cast(), bytes.len()),
                    STG_OK
                );
                assert_eq!(bytes, contents[&name], "{name}, coalesce below {below}");
                seen += 1;
                stg_tensor_free(tensor);
            }
            stg_load_free(load);
            stg_config_free(c);
        }
        assert_eq!(seen, 20);
    }
}

#[test]
fn a_partition_plan_is_the_same_for_every_rank_and_each_rank_reads_only_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    // "big" is over half the bytes: split by rows between ranks.
    let contents = write_file(
        &path,
        &[
            TensorSpec::new("small", safetensors_staging::Dtype::F32, &[10]),
            TensorSpec::new("big", safetensors_staging::Dtype::BF16, &[600, 64]),
            TensorSpec::new("tail", safetensors_staging::Dtype::F32, &[100, 16]),
        ],
        9,
    )
    .unwrap();
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let total: usize = contents.values().map(Vec::len).sum();
    let ranks = 3;
    // SAFETY: valid handles and out-pointers throughout.
    unsafe {
        let c = config();
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        // Two "ranks" plan independently: the same pieces, the same fingerprint.
        let (mut plan, mut again) = (null_mut(), null_mut());
        assert_eq!(stg_plan_new(c, path.as_ptr(), ranks, &mut plan), STG_OK);
        assert_eq!(stg_plan_new(c, path.as_ptr(), ranks, &mut again), STG_OK);
        assert_eq!(stg_plan_fingerprint(plan), stg_plan_fingerprint(again));
        assert_eq!(stg_plan_len(plan), stg_plan_len(again));
        let mut pieces = Vec::new();
        for i in 0..stg_plan_len(plan) {
            let (mut a, mut b) = (std::mem::zeroed(), std::mem::zeroed::<stg_plan_piece>());
            assert_eq!(stg_plan_get_piece(plan, i, &mut a), STG_OK);
            assert_eq!(stg_plan_get_piece(again, i, &mut b), STG_OK);
            let name = CStr::from_ptr(a.name).to_str().unwrap().to_owned();
            assert_eq!(name, CStr::from_ptr(b.name).to_str().unwrap());
            assert_eq!(
                (a.owner, a.offset, a.len, a.whole),
                (b.owner, b.offset, b.len, b.whole)
            );
            pieces.push((name, a));
        }
        stg_plan_free(again);
        assert!(
            pieces.iter().filter(|(n, _)| n == "big").count() > 1,
            "the large tensor is split"
        );
        let mut out_of_range = std::mem::zeroed::<stg_plan_piece>();
        assert_eq!(
            stg_plan_get_piece(plan, pieces.len(), &mut out_of_range),
            STG_INVALID_ARGUMENT
        );
        // Each rank loads only its pieces; together they are the checkpoint, byte for byte.
        let mut assembled: std::collections::BTreeMap<String, Vec<u8>> = contents
            .iter()
            .map(|(k, v)| (k.clone(), vec![0u8; v.len()]))
            .collect();
        let mut read = 0;
        for rank in 0..ranks {
            assert_eq!(stg_config_set_plan_rank(c, plan, rank), STG_OK);
            let mut load = null_mut();
            assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
            loop {
                let mut tensor = null_mut();
                match stg_load_next(load, &mut tensor) {
                    STG_END => break,
                    status => assert_eq!(status, STG_OK),
                }
                let mut info = std::mem::zeroed::<stg_tensor_info>();
                assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
                let name = CStr::from_ptr(info.name).to_str().unwrap().to_owned();
                let (_, piece) = pieces
                    .iter()
                    .find(|(n, p)| *n == name && p.owner == rank)
                    .unwrap();
                assert_eq!(info.bytes as u64, piece.len);
                let at = piece.offset as usize;
                let dst = &mut assembled.get_mut(&name).unwrap()[at..at + info.bytes];
                assert_eq!(
                    stg_tensor_copy_to_host(tensor, dst.as_mut_ptr().cast(), dst.len()),
                    STG_OK
                );
                stg_tensor_free(tensor);
            }
            let mut report = std::mem::zeroed::<stg_report>();
            assert_eq!(stg_load_report(load, &mut report), STG_OK);
            assert_eq!(report.bytes_read, stg_plan_rank_bytes(plan, rank));
            assert!(report.bytes_read as usize <= total / ranks + contents["big"].len() / 600 * 2);
            read += report.bytes_read;
            stg_load_free(load);
        }
        assert_eq!(read as usize, total, "every byte read once");
        assert_eq!(assembled, contents);
        assert_eq!(
            stg_config_set_plan_rank(c, plan, ranks),
            STG_INVALID_ARGUMENT
        );
        assert_eq!(stg_config_set_plan_rank(c, null(), 0), STG_NULL_ARGUMENT);
        assert_eq!(stg_plan_len(null()), 0);
        let mut never = sentinel::<stg_plan>();
        let missing = c"/nonexistent/model.safetensors";
        assert_ne!(stg_plan_new(c, missing.as_ptr(), 2, &mut never), STG_OK);
        assert_eq!(never, sentinel());
        assert!(config_error(c).contains("/nonexistent/model.safetensors"));
        stg_plan_free(plan);
        stg_config_free(c);
    }
}

#[test]
#[cfg(feature = "remote")]
fn a_url_loads_through_the_same_call_and_a_missing_one_names_itself() {
    use backend_mock::http::RangeServer;

    let server = RangeServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local = checkpoint(dir.path());
    let bytes = std::fs::read(local.to_str().unwrap()).unwrap();
    server.put("/m/model.safetensors", bytes);
    let expected = write_file(
        &dir.path().join("again.safetensors"),
        &[TensorSpec::bytes("a", 1000), TensorSpec::bytes("b", 3000)],
        5,
    )
    .unwrap();
    let url = CString::new(server.url("/m")).unwrap();
    let c = config();
    // SAFETY: valid handles, buffers and out-pointers throughout.
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        let mut load = null_mut();
        assert_eq!(stg_load_new(c, url.as_ptr(), &mut load), STG_OK);
        for name in ["a", "b"] {
            let mut tensor = null_mut();
            assert_eq!(stg_load_next(load, &mut tensor), STG_OK);
            let mut info = std::mem::zeroed::<stg_tensor_info>();
            assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
            assert_eq!(CStr::from_ptr(info.name).to_str(), Ok(name));
            let mut got = vec![0u8; expected[name].len()];
            assert_eq!(
                stg_tensor_copy_to_host(tensor, got.as_mut_ptr().cast(), got.len()),
                STG_OK
            );
            assert_eq!(got, expected[name]);
            stg_tensor_free(tensor);
        }
        stg_load_free(load);

        // A plan takes the URL stg_load_new takes, and the remote options through stg_config_set.
        assert_eq!(
            stg_config_set(c, c"concurrency".as_ptr(), c"2".as_ptr()),
            STG_OK
        );
        assert_eq!(
            stg_config_set(c, c"store_option".as_ptr(), c"allow_http=true".as_ptr()),
            STG_OK
        );
        let mut plan = null_mut();
        assert_eq!(stg_plan_new(c, url.as_ptr(), 2, &mut plan), STG_OK);
        assert_eq!(
            stg_plan_rank_bytes(plan, 0) + stg_plan_rank_bytes(plan, 1),
            4000
        );
        let mut piece = std::mem::zeroed::<stg_plan_piece>();
        assert_eq!(stg_plan_get_piece(plan, 0, &mut piece), STG_OK);
        assert_eq!(CStr::from_ptr(piece.name).to_str(), Ok("a"));
        stg_plan_free(plan);

        let missing = CString::new(server.url("/absent/model.safetensors")).unwrap();
        let mut out = sentinel::<stg_load>();
        assert_ne!(stg_load_new(c, missing.as_ptr(), &mut out), STG_OK);
        assert_eq!(out, sentinel());
        let message = config_error(c);
        assert!(message.contains(missing.to_str().unwrap()), "{message}");
        stg_config_free(c);
    }
}

#[test]
fn every_option_is_a_key_of_stg_config_set_through_the_library_s_parser() {
    let c = config();
    let describe = |c: *const stg_config| {
        let mut buf = vec![0 as c_char; 4096];
        let mut written = 0;
        // SAFETY: valid handle, buffer and out-pointer.
        let status = unsafe { stg_config_describe(c, buf.as_mut_ptr(), buf.len(), &mut written) };
        assert_eq!(status, STG_OK);
        assert!(written < buf.len());
        // SAFETY: the call NUL-terminated the buffer.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(
        describe(c),
        safetensors_staging::LoadOptions::new().describe()
    );
    assert!(describe(c).contains("chunk_size = 16MiB  # default\n"));
    // SAFETY: valid handles and NUL-terminated strings.
    unsafe {
        assert_eq!(
            stg_config_set(c, c"chunk_size".as_ptr(), c"4MiB".as_ptr()),
            STG_OK
        );
        assert_eq!(
            stg_config_set(c, c"rows".as_ptr(), c"*.weight=1/2".as_ptr()),
            STG_OK
        );
        let mut expected = safetensors_staging::LoadOptions::new();
        expected.set("chunk_size", "4MiB").unwrap();
        expected.set("rows", "*.weight=1/2").unwrap();
        assert_eq!(describe(c), expected.describe());
        assert!(
            describe(c).contains("\nchunk_size = 4MiB\n"),
            "{}",
            describe(c)
        );
        // A bad key or value: a status, a message naming both, nothing changed.
        assert_eq!(
            stg_config_set(c, c"chunk".as_ptr(), c"1".as_ptr()),
            STG_INVALID_ARGUMENT
        );
        assert!(
            config_error(c).contains("unknown key"),
            "{}",
            config_error(c)
        );
        assert_eq!(
            stg_config_set(c, c"device".as_ptr(), c"gpu7".as_ptr()),
            STG_INVALID_ARGUMENT
        );
        assert!(
            config_error(c).contains("device=\"gpu7\""),
            "{}",
            config_error(c)
        );
        assert_eq!(describe(c), expected.describe());
        assert_eq!(stg_config_set(c, null(), c"1".as_ptr()), STG_NULL_ARGUMENT);
        assert_eq!(
            stg_config_set(null_mut(), c"threads".as_ptr(), c"1".as_ptr()),
            STG_NULL_ARGUMENT
        );
        stg_config_free(c);
    }
}

#[test]
fn a_gpu_asked_for_is_a_gpu_or_an_error_naming_what_was_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let c = config();
    // SAFETY: valid handles and out-pointers.
    unsafe {
        // No CUDA driver or HIP runtime on this machine (the stubs are not on the search path).
        assert_eq!(stg_config_set_device(c, 0), STG_OK);
        let mut load = sentinel::<stg_load>();
        assert_eq!(
            stg_load_new(c, path.as_ptr(), &mut load),
            STG_BACKEND_UNAVAILABLE
        );
        assert_eq!(load, sentinel());
        let message = config_error(c);
        assert_eq!(
            message,
            "device cuda:0: no usable GPU: NVIDIA driver not found"
        );
        let details = config_details(c);
        let lines: Vec<&str> = details.lines().collect();
        assert_eq!(lines.len(), 2, "{details}");
        assert_eq!(
            lines[0],
            "cufile: no CUDA driver: libcuda.so could not be loaded (is the NVIDIA driver installed?)"
        );
        assert!(
            lines[1].starts_with("hipfile: no HIP runtime: "),
            "{details}"
        );
        // The host backend and a GPU do not go together.
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        assert_eq!(
            stg_load_new(c, path.as_ptr(), &mut load),
            STG_INVALID_ARGUMENT
        );
        assert!(
            config_error(c).contains("loads into host memory"),
            "{}",
            config_error(c)
        );
        // A failure with nothing more to tell leaves no details of an earlier one.
        assert_eq!(config_details(c), "");
        stg_config_free(c);
    }
}

/// The test binary's allocator: the system's, noting when one watched allocation (a handle's
/// own box) is returned. This is how a test tells a freed handle from a leaked one, exactly and
/// whatever the other tests allocate meanwhile: the address cannot be reused before it is freed.
struct Watching;

static WATCHED: AtomicUsize = AtomicUsize::new(0);
static WATCHED_FREED: AtomicBool = AtomicBool::new(false);

#[global_allocator]
static ALLOCATOR: Watching = Watching;

impl Watching {
    fn note(ptr: *mut u8) {
        if ptr as usize == WATCHED.load(Ordering::Acquire) {
            WATCHED_FREED.store(true, Ordering::Release);
        }
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; only addresses are read.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded caller contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded caller contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::note(ptr);
        // SAFETY: forwarded caller contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(ptr);
        // SAFETY: forwarded caller contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// One handle's allocation watched; one test at a time watches (the others wait).
struct Watch(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Watch {
    fn new() -> Self {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        Self(ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Watches `handle`'s allocation from now on.
    fn handle<T>(&self, handle: *mut T) {
        WATCHED_FREED.store(false, Ordering::Release);
        WATCHED.store(handle as usize, Ordering::Release);
    }

    /// Whether the watched handle's allocation was returned.
    fn freed(&self) -> bool {
        WATCHED_FREED.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        WATCHED.store(0, Ordering::Release);
    }
}

/// What a destination callback that holds a step open shares with its test: it says when it has
/// been asked for tensor `b`, then waits to be let go (declining `b`).
struct StepGate {
    asked_for_b: std::sync::mpsc::SyncSender<()>,
    let_go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

/// Holds the `stg_load_next` that asks for `b` open until the test lets it go (at most 60 s,
/// so that a regression fails instead of hanging). Never panics: it is called from C's side.
unsafe extern "C" fn hold_step_at_b(
    user_data: *mut c_void,
    info: *const stg_tensor_info,
    _: *mut *mut c_void,
    _: *mut usize,
) -> u32 {
    // SAFETY: `user_data` is the test's `StepGate`, which outlives the load; `info` is valid for
    // the call.
    let (gate, name) = unsafe { (&*user_data.cast::<StepGate>(), CStr::from_ptr((*info).name)) };
    if name.to_bytes() == b"b" {
        let _ = gate.asked_for_b.send(());
        if let Ok(let_go) = gate.let_go.lock() {
            let _ = let_go.recv_timeout(std::time::Duration::from_secs(60));
        }
    }
    STG_OK as u32
}

/// A load pointer handed to the thread that steps it.
struct Stepped(*mut stg_load);
// SAFETY: the load may move between threads (the header); the test frees it from the other
// thread only while this one is inside `stg_load_next`, which is the case under test.
unsafe impl Send for Stepped {}

#[test]
fn a_load_freed_from_another_thread_during_its_step_is_freed_when_the_step_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let (asked_for_b, asked) = std::sync::mpsc::sync_channel(1);
    let (let_go, held) = std::sync::mpsc::sync_channel(1);
    let gate = StepGate {
        asked_for_b,
        let_go: std::sync::Mutex::new(held),
    };
    let c = config();
    let mut load = null_mut();
    // SAFETY: valid handles and out-pointers; the gate outlives the load (joined below).
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        assert_eq!(stg_config_set_threads(c, 1), STG_OK);
        assert_eq!(stg_config_set_coalesce_below(c, 0), STG_OK);
        let user_data = std::ptr::from_ref(&gate).cast_mut().cast::<c_void>();
        assert_eq!(
            stg_config_set_destination(c, Some(hold_step_at_b), user_data),
            STG_OK
        );
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
    }
    let watch = Watch::new();
    watch.handle(load);
    let stepped = Stepped(load);
    let stepping = std::thread::spawn(move || {
        let load = stepped;
        // SAFETY: the load is live until the step below ends (the other thread only frees it
        // while that step runs); out-pointers are valid locals.
        unsafe {
            let mut a = null_mut();
            assert_eq!(stg_load_next(load.0, &mut a), STG_OK, "tensor a");
            stg_tensor_free(a);
            let mut b = sentinel::<stg_tensor>();
            let status = stg_load_next(load.0, &mut b);
            (status, b == sentinel())
        }
    });
    asked
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the step never asked for b");
    // SAFETY: the load is live (its step is held open at `b`); this is the free from another
    // thread that the header allows while a step runs.
    unsafe { stg_load_free(load) };
    let_go.send(()).unwrap();
    let (status, untouched) = stepping.join().unwrap();
    assert!(
        watch.freed(),
        "the load was never freed: it leaked (stg_load_next returned {status:?})"
    );
    assert_eq!(
        status, STG_LOAD_FREED,
        "the step says the load it ran is gone"
    );
    assert!(untouched, "out written although the load was freed");
    // SAFETY: no load uses the configuration any more.
    unsafe { stg_config_free(c) };
}

/// Says each time it is asked for a tensor, and declines it at once.
unsafe extern "C" fn say_asked(
    user_data: *mut c_void,
    _: *const stg_tensor_info,
    _: *mut *mut c_void,
    _: *mut usize,
) -> u32 {
    // SAFETY: `user_data` is the test's sender, which outlives the load.
    let asked = unsafe { &*user_data.cast::<std::sync::mpsc::SyncSender<()>>() };
    let _ = asked.try_send(());
    STG_OK as u32
}

#[test]
fn a_free_racing_the_end_of_a_step_frees_the_load_once_whichever_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let (asked, in_step) = std::sync::mpsc::sync_channel::<()>(1);
    let c = config();
    // SAFETY: valid handles; the sender outlives every load below.
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        assert_eq!(stg_config_set_threads(c, 1), STG_OK);
        let user_data = std::ptr::from_ref(&asked).cast_mut().cast::<c_void>();
        assert_eq!(
            stg_config_set_destination(c, Some(say_asked), user_data),
            STG_OK
        );
    }
    let watch = Watch::new();
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let mut load = null_mut();
        // SAFETY: valid handles and out-pointer.
        unsafe { assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK) };
        watch.handle(load);
        let stepped = Stepped(load);
        // One stg_load_next only: once the free may have come, the handle is not used again.
        let stepping = std::thread::spawn(move || {
            let load = stepped;
            let mut a = sentinel::<stg_tensor>();
            // SAFETY: the load is live when the step starts (the free waits for the callback);
            // `a` is a valid local.
            let status = unsafe { stg_load_next(load.0, &mut a) };
            if status == STG_OK {
                // SAFETY: a tensor outlives its load; freed once. (A zeroed info is plain data.)
                unsafe {
                    let mut info = std::mem::zeroed::<stg_tensor_info>();
                    assert_eq!(stg_tensor_describe(a, &mut info), STG_OK);
                    assert_eq!(info.bytes, 1000);
                    stg_tensor_free(a);
                }
            } else {
                assert_eq!(a, sentinel(), "out written with {status:?}");
            }
            status
        });
        in_step
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the step never asked for a");
        // SAFETY: the step started; from here the free races the step's end, which is the point.
        unsafe { stg_load_free(load) };
        let status = stepping.join().unwrap();
        assert!(
            watch.freed(),
            "the load leaked (stg_load_next returned {status:?})"
        );
        assert!(
            matches!(status, STG_OK | STG_LOAD_FREED),
            "{status:?}: the free came before the step ended (STG_LOAD_FREED) or after (a tensor)"
        );
        *outcomes.entry(format!("{status:?}")).or_insert(0) += 1;
    }
    eprintln!("outcomes of 200 races: {outcomes:?}");
    // SAFETY: no load uses the configuration any more.
    unsafe { stg_config_free(c) };
}

/// Records what the destination callback was told of each tensor's dtype, and declines.
unsafe extern "C" fn note_dtype(
    user: *mut c_void,
    info: *const stg_tensor_info,
    _: *mut *mut c_void,
    _: *mut usize,
) -> u32 {
    // SAFETY: `user` is the test's Vec, alive for the load; the library passes a valid `info`.
    unsafe {
        let seen = &mut *user.cast::<Vec<(String, stg_dtype, u32)>>();
        let info = &*info;
        let name = CStr::from_ptr(info.name).to_string_lossy().into_owned();
        seen.push((name, info.dtype_id, info.dtype_bits));
    }
    stg_status::STG_OK as u32
}

#[test]
fn every_dtype_has_a_stable_number_and_its_bits_beside_its_name() {
    // The numbers are the header's, once and for all.
    for (i, dtype) in stg_dtype::ALL.iter().enumerate() {
        assert_eq!(*dtype as u32, i as u32, "{dtype:?}");
    }
    assert_eq!(stg_dtype::STG_DTYPE_BF16 as u32, 11);
    assert_eq!(stg_dtype::STG_DTYPE_F4 as u32, 20);
    assert_eq!(stg_dtype_bits(stg_dtype::STG_DTYPE_UNKNOWN as u32), 0);
    assert_eq!(stg_dtype_bits(23), 0, "a number that is no stg_dtype");
    assert_eq!(stg_dtype_bits(u32::MAX), 0);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs = backend_mock::fixtures::every_dtype();
    assert_eq!(
        specs.len(),
        stg_dtype::ALL.len() - 1,
        "every dtype safetensors knows has a number"
    );
    write_file(&path, &specs, 3).unwrap();
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let mut seen: Vec<(String, stg_dtype, u32)> = Vec::new();
    let mut described = Vec::new();
    let c = config();
    // SAFETY: valid handles and out-pointers; `seen` outlives the load and the callback only
    // pushes onto it.
    unsafe {
        assert_eq!(stg_config_set_backend(c, c"host".as_ptr()), STG_OK);
        assert_eq!(
            stg_config_set_destination(c, Some(note_dtype), (&raw mut seen).cast()),
            STG_OK
        );
        let mut load = null_mut();
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
        let mut tensor = null_mut();
        while stg_load_next(load, &mut tensor) == STG_OK {
            let mut info = std::mem::zeroed::<stg_tensor_info>();
            assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
            let name = CStr::from_ptr(info.name).to_string_lossy().into_owned();
            let dtype = CStr::from_ptr(info.dtype).to_string_lossy().into_owned();
            let shape = std::slice::from_raw_parts(info.shape, info.ndim);
            let elements: u64 = shape.iter().product();
            described.push((name, dtype, info.dtype_id, info.dtype_bits));
            assert_eq!(
                elements * u64::from(info.dtype_bits),
                info.bytes as u64 * 8,
                "bytes = elements * bits / 8"
            );
            assert_eq!(stg_dtype_bits(info.dtype_id as u32), info.dtype_bits);
            stg_tensor_free(tensor);
        }
        stg_load_free(load);
        stg_config_free(c);
    }
    assert_eq!(described.len(), specs.len());
    for ((name, dtype, id, bits), spec) in described.iter().zip(&specs) {
        assert_eq!(name, &spec.name);
        assert_eq!(dtype, &spec.dtype.to_string());
        assert_eq!(format!("{id:?}"), format!("STG_DTYPE_{dtype}"), "{name}");
        assert_eq!(*bits as usize, spec.dtype.bitsize(), "{name}");
    }
    // The callback, asked before anything is read, is told the same.
    let told: Vec<_> = described
        .iter()
        .map(|(name, _, id, bits)| (name.clone(), *id, *bits))
        .collect();
    assert_eq!(seen, told);
}

fn target(name: &CStr, data: &mut [u8]) -> stg_target {
    stg_target {
        name: name.as_ptr(),
        data: data.as_mut_ptr().cast(),
        len: data.len(),
        dtype: 0,
        shape: null(),
        ndim: 0,
        state: 99,
    }
}

/// `stg_load_into(config, path, targets, strict)` with no out-pointers.
///
/// # Safety
///
/// As `stg_load_into`'s: `config` live, each target's memory live and writable.
unsafe fn load_into_strict(
    config: *const stg_config,
    path: &CStr,
    targets: &mut [stg_target],
) -> stg_status {
    // SAFETY: the caller's contract; `path` is NUL-terminated, `targets` `len` entries.
    unsafe {
        stg_load_into(
            config,
            path.as_ptr(),
            targets.as_mut_ptr(),
            targets.len(),
            true,
            null_mut(),
            null_mut(),
        )
    }
}

#[test]
fn load_into_writes_each_target_in_place_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let want_a = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let config = config();
    let (a, b, z) = (c"a", c"b", c"z");
    let mut mem_a = vec![0u8; 1000];
    let mut mem_b = vec![0u8; 3000];
    let mut mem_z = vec![0u8; 4];
    // A mismatch (b's length) writes nothing; every problem is in the message.
    let mut short_b = vec![0u8; 2999];
    let mut targets = [target(a, &mut mem_a), target(b, &mut short_b)];
    let mut unexpected = 77;
    // SAFETY: live config, path and targets.
    let status = unsafe {
        stg_load_into(
            config,
            path.as_ptr(),
            targets.as_mut_ptr(),
            2,
            true,
            &mut unexpected,
            null_mut(),
        )
    };
    assert_eq!(status, STG_SELECTION);
    assert!(config_error(config).contains("b: 3000 bytes in the checkpoint, 2999 in the target"));
    assert!(
        targets
            .iter()
            .all(|t| t.state == stg_target_state::STG_TARGET_UNCHANGED as u32)
    );
    assert!(mem_a.iter().all(|&x| x == 0) && short_b.iter().all(|&x| x == 0));
    assert_eq!(unexpected, 77, "untouched on failure");
    // Not strict, with a target the checkpoint lacks: a and b written, z missing.
    let mut targets = [
        target(a, &mut mem_a),
        target(b, &mut mem_b),
        target(z, &mut mem_z),
    ];
    targets[0].dtype = stg_dtype::STG_DTYPE_U8 as u32;
    let shape = [1000u64];
    targets[0].shape = shape.as_ptr();
    targets[0].ndim = 1;
    let mut report = std::mem::MaybeUninit::<stg_report>::zeroed();
    // SAFETY: live config, path, targets and out-pointers.
    let status = unsafe {
        stg_load_into(
            config,
            path.as_ptr(),
            targets.as_mut_ptr(),
            3,
            false,
            &mut unexpected,
            report.as_mut_ptr(),
        )
    };
    assert_eq!(status, STG_OK, "{}", config_error(config));
    let states: Vec<u32> = targets.iter().map(|t| t.state).collect();
    assert_eq!(
        states,
        [
            stg_target_state::STG_TARGET_WRITTEN as u32,
            stg_target_state::STG_TARGET_WRITTEN as u32,
            stg_target_state::STG_TARGET_MISSING as u32
        ]
    );
    assert_eq!(unexpected, 0);
    // SAFETY: written by the call that returned STG_OK.
    let report = unsafe { report.assume_init() };
    assert_eq!((report.destination_tensors, report.bytes_read), (2, 4000));
    // The file's data section is a's 1000 bytes then b's 3000.
    let data = &want_a[want_a.len() - 4000..];
    assert_eq!(&mem_a[..], &data[..1000]);
    assert_eq!(&mem_b[..], &data[1000..]);
    assert_eq!(mem_z, [0; 4]);
    // A dtype number that is no dtype is refused before anything else.
    let mut targets = [target(a, &mut mem_a)];
    targets[0].dtype = 999;
    // SAFETY: live config, path and targets.
    let status = unsafe { load_into_strict(config, &path, &mut targets) };
    assert_eq!(status, STG_INVALID_ARGUMENT);
    // Targets whose memory overlaps (b's starts inside a's) are refused; nothing is written.
    let mut both = vec![0u8; 3500];
    let mut targets = [target(a, &mut both), target(b, &mut both[500..])];
    targets[0].len = 1000;
    // SAFETY: live config, path and targets (both in `both`).
    let status = unsafe { load_into_strict(config, &path, &mut targets) };
    assert_eq!(status, STG_SELECTION);
    assert!(
        config_error(config).contains("b: its memory overlaps a's"),
        "{}",
        config_error(config)
    );
    assert!(both.iter().all(|&x| x == 0));
    // SAFETY: a NULL configuration is a status; nothing else is read.
    let status = unsafe {
        stg_load_into(
            null(),
            path.as_ptr(),
            null_mut(),
            0,
            true,
            null_mut(),
            null_mut(),
        )
    };
    assert_eq!(status, STG_NULL_ARGUMENT);
    // SAFETY: `config` is live and freed once.
    unsafe { stg_config_free(config) };
}

/// A `select` that keeps no tensor is the library's selection error in C too (issue 58: C loaded
/// nothing where `stage` refused): `stg_load_new` fails with `STG_SELECTION`, writes no load,
/// and the message names the patterns; one that matches loads.
#[test]
fn a_select_that_matches_nothing_is_a_selection_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path());
    let c = config();
    // SAFETY: a live config, NUL-terminated strings, a valid out-pointer.
    unsafe {
        assert_eq!(
            stg_config_set(c, c"select".as_ptr(), c"gamma*".as_ptr()),
            STG_OK
        );
        let mut out = sentinel::<stg_load>();
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut out), STG_SELECTION);
        assert_eq!(out, sentinel(), "out written on failure");
        assert_eq!(
            config_error(c),
            "the selection gamma* matches no tensor of the checkpoint"
        );
        assert_eq!(
            stg_config_set(c, c"select".as_ptr(), c"b*".as_ptr()),
            STG_OK
        );
        let mut load = null_mut();
        assert_eq!(stg_load_new(c, path.as_ptr(), &mut load), STG_OK);
        stg_load_free(load);
        stg_config_free(c);
    }
}
