//! Test support: building a stub native library from C with the system compiler. Enabled by the
//! `test-stubs` feature, which the backends' own `test-stubs` features turn on.

use std::path::Path;
use std::process::Command;

/// Compiles `source` into the shared library `output` with `$CC` (default `cc`) and `extra`
/// arguments.
pub fn compile_shared_library<S: AsRef<std::ffi::OsStr>>(
    source: &Path,
    output: &Path,
    extra: &[S],
) -> Result<(), String> {
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(output)
        .arg(source)
        .args(extra)
        .status()
        .map_err(|e| format!("running cc: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cc failed on {}", source.display()))
    }
}
