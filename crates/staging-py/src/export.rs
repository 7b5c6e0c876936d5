//! `_Staged`: one loaded tensor, owning its memory, exported through DLPack (`__dlpack__`,
//! `__dlpack_device__`) with the `dlpark` crate's structs, capsules and request parsing.
//!
//! Each export is a fresh DLPack header holding an `Arc` of the memory's owner; the consumer's
//! deleter (or the capsule's destructor, when nobody consumed it) drops that `Arc`, and the last
//! one returns the memory to the library. Nothing is copied.

use std::sync::{Arc, Mutex};

use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::metadata::Dynamic;
use dlpark::python::{DlpackExporter, ExportRequest, export_dlpack};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use safetensors_staging::{DeviceMemory, Dtype, HostBytes, MappedBytes, TensorMeta};

/// The memory a tensor's bytes are in; dropping it gives the memory back.
pub(crate) enum Memory {
    /// A device buffer (or, for the host backend, host memory standing for the device).
    Device(DeviceMemory),
    /// Host memory the tensor was assembled in.
    Host(HostBytes),
    /// A private (copy-on-write) mapping of the tensor's file, kept mapped while any export
    /// of it lives.
    Mapped(MappedBytes),
}

/// Owns the memory for as long as any export of it lives. The lock is never taken: it only
/// makes the owner `Sync`, which sharing it between exports needs.
pub(crate) struct Owner {
    _memory: Mutex<Memory>,
}

/// The DLPack type of a safetensors dtype, when DLPack has one (every dtype of the format
/// today; the format may add more).
pub(crate) fn dlpack_dtype(dtype: Dtype) -> Option<DLDataType> {
    use Dtype::*;
    let (code, bits) = match dtype {
        BOOL => (DLDataTypeCode::BOOL, 8),
        U8 => (DLDataTypeCode::UINT, 8),
        I8 => (DLDataTypeCode::INT, 8),
        F8_E5M2 => (DLDataTypeCode::FLOAT8_E5M2, 8),
        F8_E4M3 => (DLDataTypeCode::FLOAT8_E4M3FN, 8),
        F8_E8M0 => (DLDataTypeCode::FLOAT8_E8M0FNU, 8),
        F8_E4M3FNUZ => (DLDataTypeCode::FLOAT8_E4M3FNUZ, 8),
        F8_E5M2FNUZ => (DLDataTypeCode::FLOAT8_E5M2FNUZ, 8),
        I16 => (DLDataTypeCode::INT, 16),
        U16 => (DLDataTypeCode::UINT, 16),
        F16 => (DLDataTypeCode::FLOAT, 16),
        BF16 => (DLDataTypeCode::BFLOAT, 16),
        I32 => (DLDataTypeCode::INT, 32),
        U32 => (DLDataTypeCode::UINT, 32),
        F32 => (DLDataTypeCode::FLOAT, 32),
        C64 => (DLDataTypeCode::COMPLEX, 64),
        F64 => (DLDataTypeCode::FLOAT, 64),
        I64 => (DLDataTypeCode::INT, 64),
        U64 => (DLDataTypeCode::UINT, 64),
        F4 => (DLDataTypeCode::FLOAT4_E2M1FN, 4),
        F6_E2M3 => (DLDataTypeCode::FLOAT6_E2M3FN, 6),
        F6_E3M2 => (DLDataTypeCode::FLOAT6_E3M2FN, 6),
        _ => return None,
    };
    Some(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// The shape of a tensor's bytes seen as `uint8`: the last dimension widened to its bytes
/// (`[3, 4]` of BF16 is `[3, 8]`), so a framework's `.view(dtype)` gives the values back; a
/// scalar is `[bytes]`; a sub-byte tensor whose last dimension is not whole bytes is flat.
pub(crate) fn byte_shape(shape: &[usize], bits: usize, len: usize) -> Vec<usize> {
    let last_bits = shape
        .split_last()
        .and_then(|(&last, rest)| Some((last.checked_mul(bits)?, rest)));
    match last_bits {
        Some((last_bits, rest)) if last_bits.is_multiple_of(8) => {
            let mut out = rest.to_vec();
            out.push(last_bits / 8);
            out
        }
        _ => vec![len],
    }
}

/// Row-major strides as torch gives a contiguous tensor (and `safetensors` its tensors): each
/// dimension's stride is the product of the later dimensions, a dimension of 0 counted as 1.
/// For a tensor with elements these are the compact strides; an empty one (`[2, 0, 2]`) gets
/// `[2, 2, 1]` where compact strides would be `[0, 2, 1]`.
pub(crate) fn row_major_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![0_i64; shape.len()];
    let mut stride = 1_i64;
    for (axis, &dimension) in shape.iter().enumerate().rev() {
        strides[axis] = stride;
        let dimension = i64::try_from(dimension.max(1)).unwrap_or(i64::MAX);
        stride = stride.saturating_mul(dimension);
    }
    strides
}

/// One loaded tensor, as handed to Python: its metadata, where it landed, and its memory.
#[pyclass(module = "safetensors_staging._native", name = "_Staged", frozen)]
pub(crate) struct Staged {
    /// The tensor's name.
    #[pyo3(get)]
    name: String,
    /// Its dtype as the format writes it (`"BF16"`).
    #[pyo3(get)]
    dtype: String,
    /// Its shape (narrowed for a row range).
    #[pyo3(get)]
    shape: Vec<usize>,
    /// Its length in bytes.
    #[pyo3(get)]
    nbytes: usize,
    /// The path it took: `"device"`, `"host"` or `"mapped"`.
    #[pyo3(get)]
    path: &'static str,
    /// Why it took the host path, when it did.
    #[pyo3(get)]
    fallback: Option<String>,
    /// The memory it is in: `"host"`, `"cuda"` or `"hip"`.
    #[pyo3(get)]
    space: &'static str,
    address: usize,
    device: DLDevice,
    element: Option<DLDataType>,
    /// Its dtype, for the conversions that choose by it (`Fast`).
    kind: Dtype,
    bits: usize,
    owner: Arc<Owner>,
    /// Exported as `uint8` of its bytes rather than its own dtype.
    as_bytes: bool,
}

impl Staged {
    pub(crate) fn new(
        meta: &TensorMeta,
        path: &'static str,
        fallback: Option<String>,
        memory: Memory,
        device_index: i32,
    ) -> Self {
        let (space, address) = match &memory {
            Memory::Device(device) => (device.space(), device.addr()),
            Memory::Host(host) => ("host", host.as_ptr() as usize),
            Memory::Mapped(mapped) => ("host", mapped.as_ptr() as usize),
        };
        let device_type = match space {
            "cuda" => DLDeviceType::CUDA,
            "hip" => DLDeviceType::ROCM,
            _ => DLDeviceType::CPU,
        };
        let device = DLDevice {
            device_type,
            device_id: if device_type == DLDeviceType::CPU {
                0
            } else {
                device_index
            },
        };
        Self {
            name: meta.name.clone(),
            dtype: meta.dtype_name(),
            shape: meta.shape.clone(),
            nbytes: meta.len,
            path,
            fallback,
            space,
            address,
            device,
            element: dlpack_dtype(meta.dtype),
            kind: meta.dtype,
            bits: meta.dtype.bitsize(),
            owner: Arc::new(Owner {
                _memory: Mutex::new(memory),
            }),
            as_bytes: false,
        }
    }

    /// `count` zero elements of `dtype` (shape `[count]`) in host memory of their own.
    pub(crate) fn zeros(dtype: Dtype, count: usize) -> PyResult<Self> {
        let len = (count * dtype.bitsize()).div_ceil(8);
        let bytes = HostBytes::zeroed(len, 64)
            .ok_or_else(|| pyo3::exceptions::PyMemoryError::new_err("no memory for a probe"))?;
        let meta = TensorMeta {
            name: "probe".into(),
            dtype,
            shape: vec![count],
            file: std::sync::Arc::from(std::path::Path::new("")),
            file_index: 0,
            offset: 0,
            len,
            row_range: None,
        };
        Ok(Self::new(&meta, "host", None, Memory::Host(bytes), 0))
    }

    /// Its dtype, and whether it is exported as bytes rather than as that dtype.
    pub(crate) fn kind(&self) -> (Dtype, bool) {
        (self.kind, self.as_bytes)
    }

    /// A fresh DLPack header for `M`, holding one more reference to the memory.
    pub(crate) fn export<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let (shape, dtype) = if self.as_bytes {
            (
                byte_shape(&self.shape, self.bits, self.nbytes),
                DLDataType {
                    code: DLDataTypeCode::UINT,
                    bits: 8,
                    lanes: 1,
                },
            )
        } else {
            let dtype = self.element.ok_or_else(|| {
                PyBufferError::new_err(format!(
                    "tensor {:?}: DLPack has no type for dtype {}; export its bytes instead",
                    self.name, self.dtype
                ))
            })?;
            (self.shape.clone(), dtype)
        };
        // The byte view keeps compact strides: a framework's `.view(dtype)` of an empty byte
        // view needs strides divisible by the element size, and 0 is (the conversion gives the
        // typed tensor torch's strides).
        let owner = Arc::clone(&self.owner);
        let initialized = if self.as_bytes {
            Dynamic::compact(shape).initialize_as::<M>(owner)
        } else {
            let strides = row_major_strides(&shape);
            Dynamic::new(shape, strides).initialize_as::<M>(owner)
        };
        let mut initialized = initialized
            .map_err(|e| PyBufferError::new_err(format!("tensor {:?}: {e}", self.name)))?;
        initialized
            .set_data(self.address as *mut std::ffi::c_void)
            .set_device(self.device)
            .set_dtype(dtype);
        // SAFETY: the header's data pointer is the first byte of the memory `owner` keeps alive
        // (the header holds an `Arc` of it until its deleter runs), `nbytes` long, which is
        // exactly what the shape and dtype describe (the format checked `shape * bits / 8 ==
        // nbytes`; the byte view has `nbytes` elements of one byte); the strides are row-major
        // (`row_major_strides`, or `Dynamic::compact`'s for the byte view: the same wherever
        // an element exists); no flags are set, and the memory is writable and this tensor's
        // alone (a mapped tensor's is a private, copy-on-write mapping: a
        // write changes this process's copy of its own bytes only).
        Ok(unsafe { initialized.finish() })
    }
}

impl DlpackExporter for Staged {
    fn device(&self) -> DLDevice {
        self.device
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        // The bytes were complete and synchronized before the tensor was handed out: there is
        // no pending work on any stream for the consumer to wait for.
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

#[pymethods]
impl Staged {
    /// A DLPack capsule of the tensor (the array API's `__dlpack__`): zero-copy, owning.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream, max_version, dl_device, copy)?;
        export_dlpack(self, py, request)
    }

    /// `(device type, device id)` as DLPack numbers them (1: CPU, 2: CUDA, 10: ROCm).
    fn __dlpack_device__(&self) -> (u32, i32) {
        (self.device.device_type.0, self.device.device_id)
    }

    /// The same memory, exported as `uint8` of its bytes (last dimension widened to bytes),
    /// for frameworks without this dtype.
    fn as_bytes(&self) -> Self {
        Self {
            name: self.name.clone(),
            dtype: self.dtype.clone(),
            shape: self.shape.clone(),
            fallback: self.fallback.clone(),
            owner: Arc::clone(&self.owner),
            as_bytes: true,
            ..*self
        }
    }

    /// The shape of [`as_bytes`](Self::as_bytes)' export.
    #[getter]
    fn byte_shape(&self) -> Vec<usize> {
        byte_shape(&self.shape, self.bits, self.nbytes)
    }

    /// The DLPack `(code, bits, lanes)` of its dtype, or `None`.
    #[getter]
    fn dlpack_dtype(&self) -> Option<(u8, u8, u16)> {
        self.element.map(|d| (d.code.0, d.bits, d.lanes))
    }

    fn __repr__(&self) -> String {
        format!(
            "_Staged(name={:?}, dtype={}, shape={:?}, path={}, space={})",
            self.name, self.dtype, self.shape, self.path, self.space
        )
    }
}
