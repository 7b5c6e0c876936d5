//! Test support: compiles the stub `libcuda` and `libcufile` in `stubs/` with the system C
//! compiler. Enabled by the `test-stubs` feature; nothing in the library uses it.

use backend_gds::stubs::compile_shared_library as compile;
use std::path::{Path, PathBuf};

/// Paths of the compiled stubs.
#[derive(Debug, Clone)]
pub struct Stubs {
    /// A directory holding `libcuda.so` (soname `libcuda.so`), for `LD_LIBRARY_PATH`.
    pub cuda_dir: PathBuf,
    /// The stub `libcuda.so`.
    pub cuda: PathBuf,
    /// The stub cuFile library, named `libcufile.so.0`, in its own directory.
    pub cufile: PathBuf,
    /// A cuFile stub without `cuFileRead`.
    pub cufile_missing_read: PathBuf,
}

/// Compiles the stubs into `out` (created if needed) with `cc`.
pub fn build(out: &Path) -> Result<Stubs, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("stubs");
    let cuda_dir = out.join("cuda");
    let cufile_dir = out.join("cufile");
    let broken_dir = out.join("cufile-missing-read");
    for dir in [&cuda_dir, &cufile_dir, &broken_dir] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let stubs = Stubs {
        cuda: cuda_dir.join("libcuda.so"),
        cuda_dir,
        cufile: cufile_dir.join("libcufile.so.0"),
        cufile_missing_read: broken_dir.join("libcufile.so.0"),
    };
    compile(
        &source.join("cuda_stub.c"),
        &stubs.cuda,
        &["-Wl,-soname,libcuda.so", "-lpthread"],
    )?;
    compile(
        &source.join("cufile_stub.c"),
        &stubs.cufile,
        &["-Wl,-soname,libcufile.so.0"],
    )?;
    compile(
        &source.join("cufile_stub.c"),
        &stubs.cufile_missing_read,
        &["-DOMIT_READ"],
    )?;
    Ok(stubs)
}
