//! For the Python tests: the malformed checkpoints of the Rust suite (`backend_mock::malformed`),
//! built on disk by name, so both suites try the same ones.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use safetensors_staging::mock::malformed;

/// The names of every malformed case.
pub(crate) fn cases() -> Vec<&'static str> {
    malformed::MALFORMED.to_vec()
}

/// Builds the malformed case `case` in the empty directory `dir`; returns the paths to load.
#[pyfunction]
#[pyo3(name = "_write_malformed")]
pub(crate) fn write_malformed(py: Python<'_>, case: &str, dir: PathBuf) -> PyResult<Vec<PathBuf>> {
    if !malformed::MALFORMED.contains(&case) {
        return Err(PyValueError::new_err(format!("no malformed case {case:?}")));
    }
    Ok(py.detach(|| malformed::build(case, &dir)))
}
