//! The C ABI's paths take a model on the Hugging Face Hub (`hf://org/name`), configured as
//! `huggingface_hub` is (`HF_ENDPOINT`, `HF_HUB_CACHE`) and by `stg_config_set`'s `cache` and
//! `cache_dir`: a fake Hub on loopback (`backend_mock::hub`) serves one model. One test in its
//! own binary: it sets the process's environment, which nothing else here reads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::ffi::{CStr, CString};
use std::ptr::null_mut;

use backend_mock::fixtures::{TensorSpec, write_file};
use backend_mock::hub::FakeHub;
use staging_ffi::*;
use stg_status::*;

/// Every tensor of a load: name and bytes, until `STG_END`.
///
/// # Safety
/// `load` is a live load.
unsafe fn drain(load: *mut stg_load) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut tensor = null_mut();
        // SAFETY: the caller's live load; valid out-pointers.
        unsafe {
            match stg_load_next(load, &mut tensor) {
                STG_END => return out,
                STG_OK => {}
                other => panic!("stg_load_next: {other:?}"),
            }
            let mut info = std::mem::zeroed::<stg_tensor_info>();
            assert_eq!(stg_tensor_describe(tensor, &mut info), STG_OK);
            let mut bytes = vec![0u8; info.bytes];
            assert_eq!(
                stg_tensor_copy_to_host(tensor, bytes.as_mut_ptr().cast(), bytes.len()),
                STG_OK
            );
            out.push((
                CStr::from_ptr(info.name).to_str().unwrap().to_owned(),
                bytes,
            ));
            stg_tensor_free(tensor);
        }
    }
}

#[test]
fn a_hub_model_loads_through_the_c_abi_with_and_without_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let contents = write_file(
        &file,
        &[TensorSpec::bytes("a", 1000), TensorSpec::bytes("b", 3000)],
        5,
    )
    .unwrap();
    let hub = FakeHub::start().unwrap();
    let commit = hub.add_repo(
        "org/tiny",
        &[("model.safetensors", std::fs::read(&file).unwrap())],
    );
    let cache = dir.path().join("hf-cache");
    // SAFETY: this binary's one test sets them before any load runs; no other thread reads the
    // environment meanwhile.
    unsafe {
        std::env::set_var("HF_ENDPOINT", hub.endpoint());
        std::env::set_var("HF_HUB_CACHE", &cache);
        std::env::set_var("HF_HUB_OFFLINE", "0");
    }
    let path = c"hf://org/tiny";
    // SAFETY: valid handles and out-pointers throughout.
    unsafe {
        let mut config = null_mut();
        assert_eq!(stg_config_new(&mut config), STG_OK);
        assert_eq!(stg_config_set_backend(config, c"host".as_ptr()), STG_OK);
        let mut load = null_mut();
        assert_eq!(stg_load_new(config, path.as_ptr(), &mut load), STG_OK);
        let loaded = drain(load);
        stg_load_free(load);
        assert_eq!(loaded.len(), 2);
        for (name, bytes) in &loaded {
            assert!(bytes == &contents[name], "{name}: bytes differ");
        }
        let snapshot = cache.join("models--org--tiny/snapshots").join(&commit);
        assert!(snapshot.join("model.safetensors").is_file());

        // cache = false, cache_dir elsewhere: streamed, nothing written there.
        let elsewhere = dir.path().join("elsewhere");
        let elsewhere_c = CString::new(elsewhere.to_str().unwrap()).unwrap();
        assert_eq!(
            stg_config_set(config, c"cache_dir".as_ptr(), elsewhere_c.as_ptr()),
            STG_OK
        );
        assert_eq!(
            stg_config_set(config, c"cache".as_ptr(), c"false".as_ptr()),
            STG_OK
        );
        hub.clear_log();
        let mut load = null_mut();
        assert_eq!(stg_load_new(config, path.as_ptr(), &mut load), STG_OK);
        assert_eq!(drain(load).len(), 2);
        stg_load_free(load);
        assert!(!elsewhere.exists());
        assert!(
            hub.log()
                .iter()
                .any(|l| l.server == backend_mock::hub::Server::Cdn),
            "streamed again"
        );

        // A model that is not there: the library's words.
        let mut load = null_mut();
        assert_eq!(
            stg_load_new(config, c"hf://org/absent".as_ptr(), &mut load),
            STG_NOT_FOUND
        );
        let mut text = [0 as std::ffi::c_char; 1024];
        let mut written = 0;
        assert_eq!(
            stg_config_last_error(config, text.as_mut_ptr(), text.len(), &mut written),
            STG_OK
        );
        let message = CStr::from_ptr(text.as_ptr()).to_str().unwrap();
        assert!(
            message.contains("no model org/absent on the Hub"),
            "{message}"
        );
        stg_config_free(config);
    }
}
