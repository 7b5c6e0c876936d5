//! What the modules of this binary load and count, written once: the three-tensor checkpoint,
//! the staging policy with 1 MiB chunks, and the stub libcuda's counters.

use std::path::{Path, PathBuf};

use backend_mock::fixtures::{Contents, TensorSpec, write_file};
use safetensors_staging::StagingPolicy;

use crate::common;

pub(crate) const MIB: usize = 1 << 20;

/// `a` (3 MiB), `b` (2 MiB) and `c` (4 KiB), back to back, in `dir/name`, with contents from
/// `seed`.
pub(crate) fn three_tensors(dir: &Path, name: &str, seed: u64) -> (PathBuf, Contents) {
    let path = dir.join(name);
    let specs = [
        TensorSpec::bytes("a", 3 * MIB),
        TensorSpec::bytes("b", 2 * MIB),
        TensorSpec::bytes("c", 4096),
    ];
    let contents = write_file(&path, &specs, seed).unwrap();
    (path, contents)
}

/// No headroom, 1 MiB chunks and staging, `threads` I/O threads.
pub(crate) fn policy(threads: usize) -> StagingPolicy {
    StagingPolicy::builder()
        .headroom(0, u64::MAX)
        .chunk_size(MIB)
        .staging_size(MIB)
        .io_threads(threads)
        .build()
        .unwrap()
}

/// The stub libcuda's counter `symbol` (a `size_t (void)` function), for this whole process.
pub(crate) fn cuda_counter(symbol: &[u8]) -> usize {
    common::stub_counter(&common::cuda_stubs().cuda, symbol)
}
