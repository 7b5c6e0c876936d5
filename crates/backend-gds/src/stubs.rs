//! Test support: building a stub native library from C with the system compiler. Enabled by the
//! `test-stubs` feature, which the backends' own `test-stubs` features turn on.

use std::path::Path;
use std::process::Command;

/// Compiles `source` into the shared library `output` with `$CC` (default `cc`) and `extra`
/// arguments. The shared stub headers in this crate's `stubs/` (`deferred_stream.h`) are on the
/// include path.
pub fn compile_shared_library<S: AsRef<std::ffi::OsStr>>(
    source: &Path,
    output: &Path,
    extra: &[S],
) -> Result<(), String> {
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(output)
        .arg(source)
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("stubs"))
        .args(extra)
        .status()
        .map_err(|e| format!("running cc: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cc failed on {}", source.display()))
    }
}
