//! The `stage` command with the hipFile backend against stub `libamdhip64` and `libhipfile`
//! compiled here, in child processes. Nothing here has run on AMD hardware.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use backend_hipfile::stubs::{Stubs, build};
use backend_mock::fixtures::{TensorSpec, write_file};
use common::{assert_checksums, fails_with, load_in_mode, report, run_backend, run_stage};
use staging_core::Dtype;

/// The stubs, compiled once per test process.
fn stubs() -> &'static Stubs {
    static STUBS: OnceLock<Stubs> = OnceLock::new();
    STUBS.get_or_init(|| {
        build(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hipfile-stubs")).unwrap()
    })
}

fn checkpoint(dir: &Path, name: &str) -> String {
    let specs = [
        TensorSpec::new("embed", Dtype::BF16, &[3000, 64]),
        TensorSpec::new("norm", Dtype::F32, &[64]),
        TensorSpec::bytes("empty", 0),
    ];
    let path = dir.join(name);
    write_file(&path, &specs, 5).unwrap();
    path.to_str().unwrap().to_owned()
}

fn with_hip<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("STAGING_HIP_LIB", stubs().hip.to_str().unwrap()),
        ("STAGING_HIPFILE_LIB", stubs().hipfile.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    env
}

#[test]
fn without_rocm_hipfile_fails_fast_and_auto_falls_back_to_host() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    // No HIP runtime anywhere; a hipFile stub that would spin in hipFileDriverOpen.
    let env = [
        ("STAGING_HIPFILE_LIB", stubs().hipfile.to_str().unwrap()),
        ("STUB_HIPFILE_SPIN_OPEN", "1"),
    ];
    let out = run_backend(&file, "hipfile", &[], &env, dir.path());
    fails_with(&out, "hipfile backend: no HIP runtime: libamdhip64.so: ");
    eprintln!("hipfile without ROCm exited in {:?}", out.elapsed);
    let out = run_stage(&[&file, "--json"], &env, dir.path());
    assert_eq!(report(&out)["backend"], "host");
}

#[rstest::rstest]
#[case::no_device(&[("STUB_HIP_DEVICES", "0")], &[], "no HIP device: the runtime reports 0 devices")]
#[case::device_out_of_range(&[], &["--device", "2"], "HIP device 2 does not exist: the runtime reports 1")]
#[case::init_fails(&[("STUB_HIP_INIT_ERROR", "999")], &[], "HIP hipInit failed: stub HIP error (999)")]
#[case::missing_library(&[("STAGING_HIPFILE_LIB", "/nonexistent/libhipfile.so.0")], &["--hipfile-mode", "hipfile"], "hipFile library not found: /nonexistent/libhipfile.so.0: ")]
#[case::driver_will_not_open(&[("STUB_HIPFILE_OPEN_ERROR", "5030")], &["--hipfile-mode", "hipfile"], "hipFileDriverOpen failed: hipFileInternalError (5030)")]
fn each_setup_failure_has_its_own_error(
    #[case] env: &[(&str, &str)],
    #[case] args: &[&str],
    #[case] text: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    // Later entries win: a case's library variable replaces the stub's.
    let out = run_backend(&file, "hipfile", args, &with_hip(env), dir.path());
    fails_with(&out, text);
}

#[test]
fn a_missing_hipfile_symbol_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    let env = with_hip(&[(
        "STAGING_HIPFILE_LIB",
        stubs().hipfile_missing_read.to_str().unwrap(),
    )]);
    let out = run_backend(
        &file,
        "hipfile",
        &["--hipfile-mode", "hipfile"],
        &env,
        dir.path(),
    );
    fails_with(&out, "missing symbol hipFileRead");
}

#[rstest::rstest]
#[case::auto(&[], "auto", "hipfile")]
#[case::forced(&[], "hipfile", "hipfile")]
#[case::posix(&[], "posix", "posix")]
#[case::auto_without_library(&[("STAGING_HIPFILE_LIB", "/nonexistent/libhipfile.so.0")], "auto", "posix")]
fn loads_byte_exact_in_every_mode(
    #[case] env: &[(&str, &str)],
    #[case] mode: &str,
    #[case] expected: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    let (report, checked) = load_in_mode(&file, "hipfile", mode, &with_hip(env), dir.path());
    assert_eq!(report["mode"], expected);
    assert_eq!(checked, 3);
}

#[test]
fn auto_tries_cufile_then_hipfile() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    // No CUDA driver here; the HIP stub is found: auto picks hipFile.
    let report = report(&run_stage(
        &[&file, "--json", "--checksums"],
        &with_hip(&[]),
        dir.path(),
    ));
    assert_eq!(report["backend"], "hipfile");
    assert_eq!(assert_checksums(&report), 3);
}

#[rstest::rstest]
#[case::errno("model-READ_ERRNO.safetensors", "input/output error")]
#[case::code(
    "model-READ_CODE.safetensors",
    "hipFileRead failed: hipFileHipDriverError (5011) (code 5011)"
)]
fn native_read_errors_name_tensor_file_and_offset(#[case] name: &str, #[case] text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), name);
    let out = run_backend(&file, "hipfile", &[], &with_hip(&[]), dir.path());
    fails_with(&out, text);
    assert!(
        out.stderr
            .contains("tensor \"embed\": read failed at offset "),
        "{}",
        out.stderr
    );
}
