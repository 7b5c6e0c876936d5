//! The `stage` command with the cuFile backend against stub `libcuda` and `libcufile` libraries
//! compiled here, in child processes (so each run chooses whether a libcuda exists at all). No
//! GPU is involved.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use backend_cufile::stubs::{Stubs, build};
use backend_mock::fixtures::{TensorSpec, write_file};
use common::{assert_checksums, fails_with, load_in_mode, report, run_backend, run_stage};
use staging_core::Dtype;

/// The stubs, compiled once per test process.
fn stubs() -> &'static Stubs {
    static STUBS: OnceLock<Stubs> = OnceLock::new();
    STUBS.get_or_init(|| {
        build(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cufile-stubs")).unwrap()
    })
}

/// A small checkpoint file named `name` (fault markers in the name steer the cuFile stub).
fn checkpoint(dir: &Path, name: &str) -> String {
    let specs = [
        TensorSpec::new("embed", Dtype::BF16, &[3000, 64]),
        TensorSpec::new("norm", Dtype::F32, &[64]),
        TensorSpec::new("proj", Dtype::F16, &[257, 31]),
        TensorSpec::bytes("empty", 0),
    ];
    let path = dir.join(name);
    write_file(&path, &specs, 77).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The stub libcuda visible to a child, plus extra variables.
fn with_cuda<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let cuda_dir = stubs().cuda_dir.to_str().unwrap();
    let mut env = vec![
        ("LD_LIBRARY_PATH", cuda_dir),
        ("STAGING_CUFILE_LIB", cufile_lib()),
    ];
    env.extend_from_slice(extra);
    env
}

fn cufile_lib() -> &'static str {
    stubs().cufile.to_str().unwrap()
}

#[test]
fn without_a_cuda_driver_it_fails_fast_even_when_cufile_would_spin() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    // No libcuda on the library path; the cuFile stub would spin forever in cuFileDriverOpen.
    let env = [
        ("STAGING_CUFILE_LIB", cufile_lib()),
        ("STUB_CUFILE_SPIN_OPEN", "1"),
    ];
    let out = run_backend(&file, "cufile", &[], &env, dir.path());
    fails_with(&out, "no CUDA driver: libcuda.so could not be loaded");
    eprintln!("cufile without libcuda exited in {:?}", out.elapsed);
    // `auto` falls back to the host backend on such a machine.
    let out = run_stage(&[&file, "--json"], &env, dir.path());
    assert_eq!(report(&out)["backend"], "host");
}

#[rstest::rstest]
#[case::no_device(&[("STUB_CUDA_DEVICES", "0")], &[], "no CUDA device: the driver reports 0 devices")]
#[case::device_out_of_range(&[], &["--device", "3"], "CUDA device 3 does not exist: the driver reports 1")]
#[case::init_fails(&[("STUB_CUDA_INIT_ERROR", "999")], &[], "CUDA cuInit failed")]
#[case::missing_library(&[("STAGING_CUFILE_LIB", "/nonexistent/libcufile.so.0")], &["--cufile-mode", "compat"], "cuFile library not found: /nonexistent/libcufile.so.0: ")]
#[case::driver_will_not_open(&[("STUB_CUFILE_OPEN_ERROR", "5030")], &["--cufile-mode", "compat"], "cuFileDriverOpen failed: CU_FILE_INTERNAL_ERROR (5030)")]
#[case::gds_without_nvidia_fs(&[], &["--cufile-mode", "gds"], "cuFile mode gds is not available: nvidia-fs is not loaded")]
fn each_setup_failure_has_its_own_error(
    #[case] env: &[(&str, &str)],
    #[case] args: &[&str],
    #[case] text: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    // Later entries win: a case's library variable replaces the stub's.
    let out = run_backend(&file, "cufile", args, &with_cuda(env), dir.path());
    fails_with(&out, text);
}

#[test]
fn a_missing_symbol_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    let lib = stubs().cufile_missing_read.to_str().unwrap();
    let env = with_cuda(&[("STAGING_CUFILE_LIB", lib)]);
    let out = run_backend(
        &file,
        "cufile",
        &["--cufile-mode", "compat"],
        &env,
        dir.path(),
    );
    fails_with(&out, "missing symbol cuFileRead");
}

#[rstest::rstest]
#[case::auto_is_compat(&[], "auto", "compat")]
#[case::compat(&[], "compat", "compat")]
#[case::gds_with_nvidia_fs(&[("STUB_CUFILE_NVFS", "1")], "gds", "gds")]
#[case::auto_with_nvidia_fs(&[("STUB_CUFILE_NVFS", "1")], "auto", "gds")]
#[case::posix(&[], "posix", "posix")]
#[case::auto_without_library(&[("STAGING_CUFILE_LIB", "/nonexistent/libcufile.so.0")], "auto", "posix")]
#[case::auto_when_driver_will_not_open(&[("STUB_CUFILE_OPEN_ERROR", "5030")], "auto", "posix")]
fn loads_byte_exact_in_every_mode(
    #[case] env: &[(&str, &str)],
    #[case] mode: &str,
    #[case] expected: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    let (report, checked) = load_in_mode(&file, "cufile", mode, &with_cuda(env), dir.path());
    assert_eq!(report["mode"], expected);
    assert_eq!(report["paths"]["device"]["tensors"], 4);
    assert_eq!(checked, 4);
}

#[test]
fn a_file_that_will_not_register_falls_back_alone_in_auto_and_fails_when_forced() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model-REFUSE_REGISTER.safetensors");
    let out = run_backend(
        &file,
        "cufile",
        &["--json", "--checksums"],
        &with_cuda(&[]),
        dir.path(),
    );
    let report = report(&out);
    assert_eq!(report["mode"], "compat+posix");
    assert_eq!(assert_checksums(&report), 4);
    let out = run_backend(
        &file,
        "cufile",
        &["--cufile-mode", "compat"],
        &with_cuda(&[]),
        dir.path(),
    );
    fails_with(
        &out,
        "cuFileHandleRegister failed: CU_FILE_INVALID_FILE_OPEN_FLAG (5019)",
    );
    assert!(out.stderr.contains("REFUSE_REGISTER"), "{}", out.stderr);
}

#[rstest::rstest]
#[case::errno("model-READ_ERRNO.safetensors", "input/output error")]
#[case::cufile_code(
    "model-READ_CODE.safetensors",
    "cuFileRead failed: CU_FILE_CUDA_DRIVER_ERROR (5011) (code 5011)"
)]
fn native_read_errors_name_tensor_file_and_offset(#[case] name: &str, #[case] text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), name);
    let out = run_backend(&file, "cufile", &[], &with_cuda(&[]), dir.path());
    fails_with(&out, text);
    let line = out.stderr.trim();
    assert!(line.contains(&file), "{line}");
    assert!(
        line.contains("tensor \"embed\": read failed at offset "),
        "{line}"
    );
}

#[test]
fn short_reads_from_cufile_are_continued() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model-SHORT_READ.safetensors");
    let out = run_backend(
        &file,
        "cufile",
        &["--json", "--checksums"],
        &with_cuda(&[]),
        dir.path(),
    );
    assert_eq!(assert_checksums(&report(&out)), 4);
}

#[test]
fn a_budget_or_a_small_device_takes_the_host_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs = [
        TensorSpec::new("big", Dtype::BF16, &[25 << 10, 1024]), // 50 MiB
        TensorSpec::new("a", Dtype::F32, &[1024, 256]),
        TensorSpec::new("b", Dtype::F32, &[1024, 256]),
    ];
    write_file(&path, &specs, 3).unwrap();
    let file = path.to_str().unwrap();
    // A 300 MiB budget: 50 MiB + 256 MiB headroom does not fit, 1 MiB + 256 MiB does.
    let args = [
        file,
        "--backend",
        "cufile",
        "--device-memory",
        "300MiB",
        "--json",
        "--checksums",
    ];
    let budget = report(&run_stage(&args, &with_cuda(&[]), dir.path()));
    let paths: Vec<&str> = budget["tensor_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["host", "device", "device"]);
    assert_eq!(budget["fallbacks"]["insufficient_memory"], 1);
    assert!(budget["peak_device_bytes"].as_u64().unwrap() <= 300 << 20);
    assert_eq!(assert_checksums(&budget), 3);
    // A 64 MiB device: nothing leaves 256 MiB of headroom; everything is assembled on the host,
    // through one 16 MiB staging buffer with one I/O thread, or two (overlapped) with two.
    for (threads, staging) in [("1", 16u64 << 20), ("2", 32 << 20)] {
        let args = [
            file,
            "--backend",
            "cufile",
            "--json",
            "--checksums",
            "--threads",
            threads,
        ];
        let small = report(&run_stage(
            &args,
            &with_cuda(&[("STUB_CUDA_TOTAL_MIB", "64")]),
            dir.path(),
        ));
        assert_eq!(small["paths"]["host"]["tensors"], 3);
        assert_eq!(
            small["peak_device_bytes"], staging,
            "only the staging buffers"
        );
        assert_eq!(assert_checksums(&small), 3);
    }
}

/// NVIDIA's real `libcufile.so.0` (from the `nvidia-cufile` wheel, which `.ci/run` downloads):
/// the symbol table loads it and reads its version without a GPU, and `stage --backend cufile`
/// still exits at once on a machine without a CUDA driver instead of entering
/// `cuFileDriverOpen`, which spins forever there.
#[test]
#[ignore = "needs REAL_LIBCUFILE=<path to libcufile.so.0>; .ci/run sets it from the nvidia-cufile wheel"]
fn real_libcufile_loads_and_the_never_hang_guard_holds() {
    let path = std::env::var("REAL_LIBCUFILE").expect("REAL_LIBCUFILE is not set");
    let api = backend_cufile::sys::CuFileApi::load(Some(Path::new(&path))).unwrap();
    let version = api.version().expect("cuFileGetVersion");
    eprintln!("{path}: cuFile version {version}");
    assert!(version >= 1000, "version {version}");
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    for mode in ["auto", "compat", "gds"] {
        let args = [
            file.as_str(),
            "--backend",
            "cufile",
            "--cufile-mode",
            mode,
            "--cufile-lib",
            path.as_str(),
        ];
        let out = run_stage(&args, &[], dir.path());
        fails_with(&out, "no CUDA driver");
        eprintln!("real libcufile, mode {mode}: exited in {:?}", out.elapsed);
    }
}

/// A GPU asked for and none usable: one short line naming the vendor the device asks for, the
/// details behind `-v`, and `--json`'s error object with both.
#[test]
fn no_usable_gpu_is_one_short_line_with_details_behind_verbose() {
    let dir = tempfile::tempdir().unwrap();
    let file = checkpoint(dir.path(), "model.safetensors");
    // No libcuda on the library path (nor, on this machine, ROCm).
    let no_driver: [(&str, &str); 0] = [];
    let out = run_stage(&[&file, "--device", "cuda:0"], &no_driver, dir.path());
    assert_eq!(out.code, Some(1));
    assert_eq!(
        out.stderr,
        "stage: error: device cuda:0: no usable GPU: NVIDIA driver not found (-v for details)\n"
    );
    // A driver that sees no GPU.
    let out = run_stage(
        &[&file, "--device", "cuda"],
        &with_cuda(&[("STUB_CUDA_DEVICES", "0")]),
        dir.path(),
    );
    fails_with(
        &out,
        "device cuda:0: no usable GPU: the NVIDIA driver sees no GPU",
    );

    let out = run_stage(&[&file, "--device", "cuda:0", "-v"], &no_driver, dir.path());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "stage: error: device cuda:0: no usable GPU: NVIDIA driver not found",
            "  kind: backend-unavailable",
            "  cufile: no CUDA driver: libcuda.so could not be loaded (is the NVIDIA driver installed?)",
        ],
        "{}",
        out.stderr
    );
    assert!(
        lines[3].starts_with("  hipfile: no HIP runtime: "),
        "{}",
        out.stderr
    );

    let out = run_stage(
        &[&file, "--device", "cuda:0", "--json"],
        &no_driver,
        dir.path(),
    );
    assert_eq!(out.code, Some(1));
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let error = &json["error"];
    assert_eq!(error["kind"], "backend-unavailable");
    assert_eq!(
        error["message"],
        "device cuda:0: no usable GPU: NVIDIA driver not found"
    );
    assert_eq!(error["file"], serde_json::Value::Null);
    assert!(
        error["details"][0]
            .as_str()
            .unwrap()
            .starts_with("cufile: no CUDA driver"),
        "{json}"
    );
}
