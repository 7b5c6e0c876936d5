//! What the tests that compile C and C++ programs against the cdylib share: building the
//! cdylib once per test binary, and compiling a program against it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The directory of `libstaging_ffi.so`, built once (the test binaries' own profile and
/// target directory).
fn cdylib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let target_dir = exe.ancestors().nth(3).unwrap().to_path_buf();
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "staging-ffi", "--manifest-path"])
            .arg(workspace().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .status()
            .unwrap();
        assert!(status.success(), "building staging-ffi failed");
        let lib_dir = target_dir.join("debug");
        assert!(
            lib_dir.join("libstaging_ffi.so").exists(),
            "no libstaging_ffi.so in {}",
            lib_dir.display()
        );
        lib_dir
    })
}

/// Compiles `source` (C or C++, by `compiler` and `flags`) against the cdylib into
/// `CARGO_TARGET_TMPDIR/name`.
pub(crate) fn compile(source: &Path, name: &str, compiler: &str, flags: &[&str]) -> PathBuf {
    let lib_dir = cdylib_dir();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let compiled = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .arg("-I")
        .arg(workspace().join("crates/staging-ffi/include"))
        .arg(source)
        .arg("-L")
        .arg(lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lstaging_ffi", "-o"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(compiled.success(), "compiling {} failed", source.display());
    out
}

/// Whether valgrind runs here; the tests that use it fail without it rather than skip.
pub(crate) fn require_valgrind() {
    assert!(
        Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "valgrind is required for this test (apt-get install valgrind)"
    );
}

/// `program args...` under valgrind's memcheck: any error or definite leak fails it.
pub(crate) fn valgrind(program: &Path) -> Command {
    let mut c = Command::new("valgrind");
    c.args([
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,indirect",
        "-q",
    ])
    .arg(program);
    c
}
