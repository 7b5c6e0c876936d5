//! The Python module `safetensors_staging._native`: PyO3 bindings over the library's one entry
//! point, [`safetensors_staging::Loader`]. The public Python API (`load_file`, `stage`, `open`,
//! `numpy.load_file`) is in `python/safetensors_staging/`, which turns what this module hands
//! out into `torch` tensors and NumPy arrays through DLPack.
//!
//! - `load`: keyword options into a `Loader`; the `_Load` iterator (GIL released while bytes
//!   move, signals checked between tensors) and its report;
//! - `export`: `_Staged`, one tensor owning its memory, exported zero-copy through DLPack with
//!   the `dlpark` crate;
//! - `fast`: `_Fast`, loaded tensors made into torch's from Rust (its DLPack importer);
//! - `info`: `open(path)`, metadata without loading; `tensor_info`: `TensorInfo`, one tensor's;
//! - `format`: saving (and parsing bytes) through the `safetensors` crate;
//! - `load_into`: `_load_into`, a checkpoint read in place into memory the caller holds;
//! - `reader`: `_Reader`, a checkpoint read tensor by tensor (what `safe_open` stands on);
//! - `errors`: the `StagingError` hierarchy;
//! - `options`: the keywords as the library's `LoadOptions`, through its one parser;
//! - `facts`: the library's answers the Python layer asks for instead of deciding again (the
//!   tensors and rows a selection keeps, URLs, devices, the dtype table);
//! - `interrupt`: Ctrl-C during a load; `lock`: how the mutexes are taken.

mod destination;
mod errors;
mod export;
mod facts;
mod fast;
mod format;
mod info;
mod interrupt;
mod load;
mod load_into;
mod lock;
mod options;
mod reader;
mod tensor_info;

use pyo3::prelude::*;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(module)?;
    module.add_class::<export::Staged>()?;
    module.add_class::<fast::Fast>()?;
    module.add_class::<tensor_info::TensorInfo>()?;
    module.add_class::<info::PyCheckpoint>()?;
    module.add_class::<load::PyLoad>()?;
    module.add_class::<reader::PyReader>()?;
    module.add_function(wrap_pyfunction!(format::serialize, module)?)?;
    module.add_function(wrap_pyfunction!(format::parse, module)?)?;
    module.add_function(wrap_pyfunction!(reader::reader, module)?)?;
    module.add_function(wrap_pyfunction!(load::stage, module)?)?;
    module.add_function(wrap_pyfunction!(load_into::load_into, module)?)?;
    module.add_function(wrap_pyfunction!(info::open, module)?)?;
    module.add_function(wrap_pyfunction!(load::resolve_rows, module)?)?;
    module.add_function(wrap_pyfunction!(fast::probe_staged, module)?)?;
    module.add_function(wrap_pyfunction!(options::options, module)?)?;
    module.add_function(wrap_pyfunction!(options::option_table, module)?)?;
    facts::register(module)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
