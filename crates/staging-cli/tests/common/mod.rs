//! Running the `stage` binary (cargo builds it for these tests: `CARGO_BIN_EXE_stage`) and
//! checking what it printed.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

/// What a `stage` run printed and returned.
pub(crate) struct Output {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) elapsed: std::time::Duration,
}

/// Runs `stage` with `args` and extra environment variables, writing its output under
/// `scratch`; kills it and fails if it has not exited within 60 s.
pub(crate) fn run_stage(args: &[&str], env: &[(&str, &str)], scratch: &Path) -> Output {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let out_path = scratch.join("stdout.txt");
    let err_path = scratch.join("stderr.txt");
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stage"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            child.wait().ok();
            panic!("stage {args:?} hung for 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
        elapsed: start.elapsed(),
    }
}

/// Checks every `sha256` in a `stage --json --checksums` report against the bytes the
/// `safetensors` crate reads from the same files; returns how many tensors were checked.
pub(crate) fn assert_checksums(report: &serde_json::Value) -> usize {
    use sha2::{Digest, Sha256};
    let list = report["tensor_list"].as_array().unwrap();
    let mut files = std::collections::HashMap::new();
    for t in list {
        let file = t["file"].as_str().unwrap().to_owned();
        let bytes = files
            .entry(file.clone())
            .or_insert_with(|| std::fs::read(&file).unwrap());
        let reference = safetensors::SafeTensors::deserialize(bytes).unwrap();
        let name = t["name"].as_str().unwrap();
        let view = reference.tensor(name).unwrap();
        assert_eq!(
            t["dtype"].as_str(),
            Some(format!("{:?}", view.dtype()).as_str()),
            "{name}"
        );
        assert_eq!(t["shape"], serde_json::json!(view.shape()), "{name}");
        let expected: String = Sha256::digest(view.data())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(t["sha256"].as_str(), Some(expected.as_str()), "{name}");
    }
    list.len()
}

/// Runs `stage FILE --backend BACKEND ARGS...` with extra environment variables.
pub(crate) fn run_backend(
    file: &str,
    backend: &str,
    args: &[&str],
    env: &[(&str, &str)],
    scratch: &Path,
) -> Output {
    let mut all = vec![file, "--backend", backend];
    all.extend_from_slice(args);
    run_stage(&all, env, scratch)
}

/// Loads `file` with the GPU `backend` in its read mode `mode` (`--cufile-mode`,
/// `--hipfile-mode`) with `--json --checksums`: the report, checked to name `backend`, and how
/// many checksums matched.
pub(crate) fn load_in_mode(
    file: &str,
    backend: &str,
    mode: &str,
    env: &[(&str, &str)],
    scratch: &Path,
) -> (serde_json::Value, usize) {
    let flag = format!("--{backend}-mode");
    let args = [flag.as_str(), mode, "--json", "--checksums"];
    let report = report(&run_backend(file, backend, &args, env, scratch));
    assert_eq!(report["backend"], backend);
    let checked = assert_checksums(&report);
    (report, checked)
}

/// The JSON report of a `stage` run that must have succeeded.
pub(crate) fn report(out: &Output) -> serde_json::Value {
    assert_eq!(out.code, Some(0), "stage failed: {}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// Checks a `stage` run failed with exit 1 and one stderr line containing `text`, no panic.
pub(crate) fn fails_with(out: &Output, text: &str) {
    assert_eq!(
        out.code,
        Some(1),
        "expected failure, got {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(lines[0].contains(text), "{:?} lacks {text:?}", lines[0]);
    assert!(!out.stderr.contains("panicked"));
}
