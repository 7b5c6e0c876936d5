//! `_Fast`: loaded tensors made into a framework's tensors from Rust, with no Python between
//! two of them. Each tensor is exported with its own dtype and shape (a DLPack header holding
//! its memory, as `__dlpack__` gives) and handed to the framework's importer: the DLPack C
//! exchange API where the framework has one (torch 2.10 and later: a C call, no capsule), else
//! its capsule importer (`torch._C._from_dlpack`).
//!
//! Only the dtypes the Python side checked are converted here (`dtypes`): for each, the tensor
//! imported is the one the Python conversion (`_convert.to_torch`: bytes viewed as torch's
//! dtype, reshaped) gives, same dtype and shape. Others are left to Python.
//!
//! Why: 60,000 tensors of 1 KiB, mapped, one process (this 2-core VM, 2026-12-06): the bytes'
//! import, `view` and `reshape` from Python took 4.9 us a tensor; `torch._C._from_dlpack` of a
//! capsule with the dtype and shape 0.54 us.

use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use dlpark::python::consumer::exchange::ExchangeApi;
use pyo3::prelude::*;
use safetensors_staging::Dtype;

use crate::export::Staged;
use crate::format::dtype_of;

/// The framework's exchange table.
struct Exchange(ExchangeApi);

// SAFETY: the table is the framework's, alive for the whole process (the DLPack spec requires
// it of a producer), and its functions are only called with the GIL held (`Python<'_>`), as
// the spec asks of them.
unsafe impl Send for Exchange {}
// SAFETY: as for `Send`: shared use only reads the table's function pointers, under the GIL.
unsafe impl Sync for Exchange {}

/// Tensors of a framework made from loaded tensors, for the dtypes given.
#[pyclass(module = "safetensors_staging._native", name = "_Fast", frozen)]
pub(crate) struct Fast {
    exchange: Option<Exchange>,
    from_capsule: Py<PyAny>,
    dtypes: Vec<Dtype>,
}

#[pymethods]
impl Fast {
    /// `example`: a tensor of the framework (its type's `__dlpack_c_exchange_api__` is used
    /// where it has one); `from_capsule`: the framework's importer of a DLPack capsule
    /// (`torch._C._from_dlpack`); `dtypes`: the dtypes to convert (format names).
    #[new]
    fn new(
        example: &Bound<'_, PyAny>,
        from_capsule: Py<PyAny>,
        dtypes: Vec<String>,
    ) -> PyResult<Self> {
        let exchange = ExchangeApi::from_object(example.as_borrowed())?.map(Exchange);
        let dtypes = dtypes
            .iter()
            .map(|name| dtype_of(name))
            .collect::<PyResult<_>>()?;
        Ok(Self {
            exchange,
            from_capsule,
            dtypes,
        })
    }

    /// `staged` as the framework's tensor, or `None` when its dtype is not one of `dtypes`.
    fn convert(&self, py: Python<'_>, staged: &Staged) -> PyResult<Option<Py<PyAny>>> {
        Ok(self.tensor(py, staged)?.map(Bound::unbind))
    }

    /// Whether the framework's C exchange API is used (else its capsule importer).
    #[getter]
    fn exchange(&self) -> bool {
        self.exchange.is_some()
    }

    /// The dtypes converted.
    #[getter]
    fn dtypes(&self) -> Vec<String> {
        self.dtypes.iter().map(|d| format!("{d:?}")).collect()
    }
}

impl Fast {
    /// `staged` as the framework's tensor, or `None` when it is not for this converter.
    pub(crate) fn tensor<'py>(
        &self,
        py: Python<'py>,
        staged: &Staged,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let (dtype, as_bytes) = staged.kind();
        if as_bytes || !self.dtypes.contains(&dtype) {
            return Ok(None);
        }
        let tensor = match &self.exchange {
            Some(Exchange(api)) => api.managed_tensor_to_py_object_no_sync(
                staged.export::<DLManagedTensorVersioned>()?,
                py,
            )?,
            None => {
                let capsule = staged.export::<DLManagedTensor>()?.into_pyobject(py)?;
                self.from_capsule.bind(py).call1((capsule,))?
            }
        };
        Ok(Some(tensor))
    }
}

/// A `_Staged` of eight zero elements of `dtype` (shape `[8]`), to check a converter against.
#[pyfunction]
#[pyo3(name = "_probe_staged")]
pub(crate) fn probe_staged(dtype: &str) -> PyResult<Staged> {
    Staged::zeros(dtype_of(dtype)?, 8)
}
