//! A destination callback that calls back into its own load, from C (`tests/reentrant.c`):
//! never a deadlock or a use-after-free. Each run has a timeout, so a regression fails instead
//! of hanging, and the calls that could free or alias the load also run under valgrind.
//!
//! What the header promises, per call made from inside the load's own callback:
//! `stg_load_report`, `stg_load_backend` and `stg_load_last_error` work (the report as of the
//! last tensor returned); `stg_load_next` returns `STG_BUSY` and writes nothing;
//! `stg_load_free` does not free: the load stops before the tensor being asked for is read, the
//! `stg_load_next` in progress returns `STG_BUSY`, and the handle stays the caller's to free.
//! And one call that is not the callback's own: `stg_load_free` from a second thread while the
//! step runs frees the load when that `stg_load_next` returns `STG_LOAD_FREED`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use backend_mock::fixtures::{TensorSpec, write_file};

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        common::compile(
            &common::workspace().join("crates/staging-ffi/tests/reentrant.c"),
            "reentrant",
            &cc,
            &["-std=c11"],
        )
    })
}

/// Runs `command` to its end or kills it after 60 s (a deadlock fails the test, never hangs
/// it); its stdout.
fn run_with_timeout(mut command: Command, what: &str) -> String {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let output = child.wait_with_output().unwrap();
            let stdout = String::from_utf8(output.stdout).unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            assert!(status.success(), "{what}: {status:?}\n{stdout}\n{stderr}");
            return stdout;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after 60 s: the re-entrant call deadlocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(mode: &str, under_valgrind: bool) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs = [
        TensorSpec::bytes("a", 1000),
        TensorSpec::bytes("b", 3000),
        TensorSpec::bytes("c", 500),
    ];
    write_file(&path, &specs, 11).unwrap();
    let mut command = if under_valgrind {
        common::require_valgrind();
        common::valgrind(program())
    } else {
        Command::new(program())
    };
    command.arg(&path).arg(mode);
    let what = format!(
        "reentrant {mode}{}",
        if under_valgrind { " (valgrind)" } else { "" }
    );
    run_with_timeout(command, &what)
        .lines()
        .map(str::to_owned)
        .collect()
}

const STG_OK: &str = "0";
const STG_END: &str = "1";
const STG_BUSY: &str = "105";
const STG_LOAD_FREED: &str = "106";

#[test]
fn report_from_the_callback_is_the_report_as_of_the_last_tensor() {
    for valgrind in [false, true] {
        let lines = run("report", valgrind);
        assert_eq!(
            lines,
            [
                format!("cb a {STG_OK} 0"),
                "tensor a".into(),
                format!("cb b {STG_OK} 1"),
                "tensor b".into(),
                format!("cb c {STG_OK} 2"),
                "tensor c".into(),
                format!("next {STG_END} -"),
                "report 3".into(),
            ]
        );
    }
}

#[test]
fn backend_and_last_error_from_the_callback_work() {
    let lines = run("backend", false);
    assert_eq!(lines[0], "cb a 0 host/posix");
    assert_eq!(lines.last().unwrap(), "report 3");
    let lines = run("last_error", false);
    assert_eq!(lines[0], format!("cb a {STG_OK} 0"), "no error yet: empty");
    assert_eq!(lines.last().unwrap(), "report 3");
}

#[test]
fn next_from_the_callback_is_busy_and_writes_nothing() {
    for valgrind in [false, true] {
        let lines = run("next", valgrind);
        assert_eq!(
            lines,
            [
                format!("cb a {STG_BUSY} untouched"),
                "tensor a".into(),
                format!("cb b {STG_BUSY} untouched"),
                "tensor b".into(),
                format!("cb c {STG_BUSY} untouched"),
                "tensor c".into(),
                format!("next {STG_END} -"),
                "report 3".into(),
            ]
        );
    }
}

#[test]
fn free_from_the_callback_stops_the_load_and_leaves_the_handle_to_its_caller() {
    for valgrind in [false, true] {
        let lines = run("free", valgrind);
        assert_eq!(lines[..2], ["tensor a", "cb b 0 freed"]);
        let next = &lines[2];
        assert!(next.starts_with(&format!("next {STG_BUSY} ")), "{lines:?}");
        assert!(
            next.contains("stg_load_free") && next.contains("destination callback"),
            "{next}"
        );
        // Only "a" came out; "b" was never read and "c" never asked for. The handle was
        // still valid for the report and the caller's own stg_load_free (valgrind: no
        // use-after-free, nothing leaked).
        assert_eq!(lines[3], "report 1");
        assert_eq!(lines.len(), 4, "{lines:?}");
    }
}

#[test]
fn free_from_another_thread_during_the_step_is_done_by_the_step() {
    for valgrind in [false, true] {
        let lines = run("free_from_thread", valgrind);
        // The other thread's free returned at once; the step stopped before "b" was read and
        // freed the load as it returned (valgrind: nothing leaked, nothing used after).
        assert_eq!(
            lines,
            [
                "tensor a".to_owned(),
                "cb b 0 freed elsewhere".into(),
                format!("next {STG_LOAD_FREED} -"),
            ]
        );
    }
}
