//! Test support: compiles the stub `libamdhip64` and `libhipfile` in `stubs/` with the system C
//! compiler. Enabled by the `test-stubs` feature; nothing in the library uses it.

use backend_gds::stubs::compile_shared_library as compile;
use std::path::{Path, PathBuf};

/// Paths of the compiled stubs.
#[derive(Debug, Clone)]
pub struct Stubs {
    /// The stub HIP runtime.
    pub hip: PathBuf,
    /// The stub hipFile library (per-call limit 0x7ffff000, as hipFile).
    pub hipfile: PathBuf,
    /// A hipFile stub whose per-call limit is 5000 bytes, to exercise request cutting.
    pub hipfile_small_reads: PathBuf,
    /// A hipFile stub without `hipFileRead`.
    pub hipfile_missing_read: PathBuf,
}

/// The per-call limit of [`Stubs::hipfile_small_reads`].
pub const SMALL_MAX_READ: usize = 5000;

/// Compiles the stubs into `out` with `cc`.
pub fn build(out: &Path) -> Result<Stubs, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("stubs");
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let stubs = Stubs {
        hip: out.join("libamdhip64.so"),
        hipfile: out.join("libhipfile.so.0"),
        hipfile_small_reads: out.join("libhipfile-small-reads.so"),
        hipfile_missing_read: out.join("libhipfile-missing-read.so"),
    };
    compile(
        &source.join("hip_stub.c"),
        &stubs.hip,
        &["-lpthread".to_owned()],
    )?;
    compile::<&str>(&source.join("hipfile_stub.c"), &stubs.hipfile, &[])?;
    compile(
        &source.join("hipfile_stub.c"),
        &stubs.hipfile_small_reads,
        &[format!("-DMAX_READ={SMALL_MAX_READ}")],
    )?;
    compile(
        &source.join("hipfile_stub.c"),
        &stubs.hipfile_missing_read,
        &["-DOMIT_READ".to_owned()],
    )?;
    Ok(stubs)
}
