//! No secret through the C door: a login in an `http://` URL is sent to its host (as Basic
//! authentication) and shown nowhere C can read (`stg_tensor_info.file`, the load's and the
//! configuration's error text), and secret store options print as `<redacted>` in
//! `stg_config_describe`. Against the loopback range server, which logs every request.

#![cfg(feature = "remote")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::ffi::{CStr, CString, c_char};
use std::ptr::null_mut;

use backend_mock::fixtures::{TensorSpec, write_file};
use backend_mock::http::RangeServer;
use staging_ffi::*;
use stg_status::*;

/// The text a `(handle, buf, len, written)` call copies out.
fn text(copy: impl FnOnce(*mut c_char, usize, *mut usize) -> stg_status) -> String {
    let mut buf = vec![0 as c_char; 8192];
    let mut written = 0;
    assert_eq!(copy(buf.as_mut_ptr(), buf.len(), &mut written), STG_OK);
    assert!(written < buf.len());
    // SAFETY: the call NUL-terminated the buffer.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn no_login_or_secret_option_reaches_c() {
    let scratch = tempfile::tempdir().unwrap();
    let server = RangeServer::start().unwrap();
    let file = scratch.path().join("model.safetensors");
    write_file(&file, &[TensorSpec::bytes("w", 5000)], 3).unwrap();
    server.put("/private/model.safetensors", std::fs::read(&file).unwrap());
    let url = server
        .url("/private/model.safetensors")
        .replace("http://", "http://alice:SECRET-PW@");
    let mut shown = Vec::new();

    let mut config = null_mut();
    // SAFETY: valid out-pointer, then a live handle and NUL-terminated strings.
    unsafe {
        assert_eq!(stg_config_new(&mut config), STG_OK);
        assert_eq!(
            stg_config_set(config, c"backend".as_ptr(), c"host".as_ptr()),
            STG_OK
        );
    }
    let c_url = CString::new(url.clone()).unwrap();
    let mut load = null_mut();
    // SAFETY: live handle, NUL-terminated path, valid out-pointer.
    let status = unsafe { stg_load_new(config, c_url.as_ptr(), &mut load) };
    assert_eq!(status, STG_OK);
    let mut tensor = null_mut();
    // SAFETY: live load, valid out-pointer.
    assert_eq!(unsafe { stg_load_next(load, &mut tensor) }, STG_OK);
    let mut info = std::mem::MaybeUninit::<stg_tensor_info>::uninit();
    // SAFETY: live tensor, valid out-pointer; on STG_OK `info` is written.
    let info = unsafe {
        assert_eq!(stg_tensor_describe(tensor, info.as_mut_ptr()), STG_OK);
        info.assume_init()
    };
    // SAFETY: the string lives as long as the tensor.
    let file = unsafe { CStr::from_ptr(info.file) }
        .to_string_lossy()
        .into_owned();
    assert_eq!(file, server.url("/private/model.safetensors"));
    shown.push(file);
    // SAFETY: each handle is live and freed once.
    unsafe {
        stg_tensor_free(tensor);
        stg_load_free(load);
    }

    // A load that fails: its error text names the URL without the login.
    let missing = CString::new(url.replace("model.safetensors", "missing.safetensors")).unwrap();
    let mut load = null_mut();
    // SAFETY: as above.
    let status = unsafe { stg_load_new(config, missing.as_ptr(), &mut load) };
    assert_ne!(status, STG_OK);
    // SAFETY: live handle and a buffer of the given length.
    let error = text(|b, l, w| unsafe { stg_config_last_error(config, b, l, w) });
    assert!(error.contains("missing.safetensors"), "{error}");
    shown.push(error);

    // Secret store options in the option dump.
    for option in [
        c"aws_secret_access_key=SECRET-KEY",
        c"azure_storage_sas_key=SECRET-SAS",
        c"aws_region=eu-west-1",
    ] {
        // SAFETY: live handle and NUL-terminated strings.
        let status = unsafe { stg_config_set(config, c"store_option".as_ptr(), option.as_ptr()) };
        assert_eq!(status, STG_OK);
    }
    // SAFETY: live handle and a buffer of the given length.
    let dump = text(|b, l, w| unsafe { stg_config_describe(config, b, l, w) });
    assert!(
        dump.contains("eu-west-1") && dump.contains("<redacted>"),
        "{dump}"
    );
    shown.push(dump);
    // SAFETY: live handle, freed once.
    unsafe { stg_config_free(config) };

    for text in &shown {
        assert!(
            !text.contains("SECRET") && !text.contains("alice"),
            "{text}"
        );
    }
    let log = server.log();
    assert!(
        log.iter()
            .all(|l| l.authorization.as_deref() == Some("Basic YWxpY2U6U0VDUkVULVBX")),
        "{log:#?}"
    );
}
