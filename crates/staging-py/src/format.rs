//! Saving and parsing in memory, through the Rust `safetensors` crate (the one Python
//! `safetensors` is built on, at the same version), so that a file saved here is byte for byte
//! what `safetensors` writes for the same tensors and metadata.
//!
//! - `_serialize(tensors, metadata, filename)`: `tensors` a list of `(name, dtype, shape,
//!   array)`, `array` the tensor's bytes as a contiguous host array exporting DLPack (a `uint8`
//!   view of a torch tensor or NumPy array: read in place, never copied); written atomically to `filename` (a temporary file in the same directory, renamed
//!   into place) or returned as `bytes`;
//! - `_parse(data)`: the validated header of a serialized buffer, `(data_start, tensors,
//!   metadata)`, each tensor `(name, dtype, shape, start, end)` relative to `data_start`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use dlpark::ffi::DLDeviceType;
use dlpark::python::consumer::{ImportRequest, ImportedDlpack};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use safetensors::tensor::{Dtype, SafeTensors, TensorView, View};

use safetensors_staging::ErrorKind;

use crate::errors::of_kind;

fn invalid(message: String) -> PyErr {
    of_kind(ErrorKind::InvalidOption, message)
}

fn malformed(error: &safetensors::SafeTensorError) -> PyErr {
    of_kind(
        ErrorKind::InvalidCheckpoint,
        format!("Error while deserializing header: {error}"),
    )
}

/// A host array's bytes, imported through DLPack (the import keeps them alive).
struct HostArray {
    _imported: ImportedDlpack,
    address: usize,
    len: usize,
}

impl HostArray {
    /// `array`'s bytes: it must be in host memory, C-contiguous and of whole bytes per element.
    fn import(name: &str, array: &Bound<'_, PyAny>) -> PyResult<Self> {
        let fail = |what: String| invalid(format!("tensor {name:?}: {what}"));
        // The protocol the producer speaks best (the versioned one carries the read-only flag,
        // so NumPy exports a read-only array; legacy producers are asked the old way).
        let imported = ImportRequest::new(array.as_borrowed())?.import(None, None)?;
        let (address, len) = {
            let view = imported
                .validate()
                .map_err(|e| fail(format!("its DLPack tensor is invalid: {e}")))?;
            if view.device().device_type != DLDeviceType::CPU {
                return Err(fail("its bytes are not in host memory".into()));
            }
            if !view.is_compact().unwrap_or(false) {
                return Err(fail("its bytes are not contiguous".into()));
            }
            let dtype = view.dtype();
            if dtype.lanes != 1 || dtype.bits % 8 != 0 {
                return Err(fail("its elements are not whole bytes".into()));
            }
            let offset = usize::try_from(view.byte_offset())
                .map_err(|_| fail("its byte offset is too large".into()))?;
            let address = (view.data_ptr() as usize)
                .checked_add(offset)
                .ok_or_else(|| fail("its address overflows".into()))?;
            if address == 0 && view.num_bytes() > 0 {
                return Err(fail("it has a null data pointer".into()));
            }
            (address, view.num_bytes())
        };
        Ok(Self {
            _imported: imported,
            address,
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `address..address + len` is the memory of the DLPack tensor imported above,
        // checked to be host memory, compact (C-contiguous, `num_bytes` long) and non-null; the
        // import (`_imported`) keeps the producer's memory alive as long as `self`, which the
        // returned slice borrows. The producer is not told to keep it unchanged: as with
        // `safetensors`' own `save_file`, a caller changing a tensor while it is saved gets
        // whatever bytes were there when they were written.
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) }
    }
}

/// One tensor to save: its bytes borrowed from a host array.
struct Saved<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl View for &Saved<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

pub(crate) fn dtype_of(name: &str) -> PyResult<Dtype> {
    serde_json::from_value(serde_json::Value::String(name.to_owned()))
        .map_err(|_| invalid(format!("{name:?} is not a safetensors dtype")))
}

/// The safetensors file of `tensors` and `metadata`: written to `filename` atomically (and
/// `None` returned), or returned as `bytes`.
#[pyfunction]
#[pyo3(name = "_serialize", signature = (tensors, metadata=None, filename=None))]
pub(crate) fn serialize(
    py: Python<'_>,
    tensors: Vec<(String, String, Vec<usize>, Bound<'_, PyAny>)>,
    metadata: Option<HashMap<String, String>>,
    filename: Option<PathBuf>,
) -> PyResult<Option<Py<PyBytes>>> {
    let arrays = tensors
        .iter()
        .map(|(name, _, _, array)| HostArray::import(name, array))
        .collect::<PyResult<Vec<_>>>()?;
    let mut saved = Vec::with_capacity(tensors.len());
    for ((name, dtype, shape, _), array) in tensors.iter().zip(&arrays) {
        let view = Saved {
            dtype: dtype_of(dtype)?,
            shape: shape.clone(),
            data: array.bytes(),
        };
        // The crate multiplies the dimensions unchecked: a shape whose element count overflows
        // is refused here first.
        let elements = view
            .shape
            .iter()
            .try_fold(1usize, |count, &dim| count.checked_mul(dim))
            .and_then(|count| count.checked_mul(view.dtype.bitsize()));
        if elements.is_none() {
            return Err(invalid(format!(
                "tensor {name:?} ({dtype}, shape {shape:?}) cannot be saved: its size overflows"
            )));
        }
        // What the crate checks too, said with the tensor's name.
        let want = TensorView::new(view.dtype, view.shape.clone(), view.data);
        if let Err(e) = want {
            return Err(invalid(format!(
                "tensor {name:?} ({dtype}, shape {shape:?}, {} bytes) cannot be saved: {e}",
                view.data.len()
            )));
        }
        saved.push((name.as_str(), view));
    }
    let views = saved.iter().map(|(name, view)| (*name, view));
    match filename {
        None => {
            let bytes = py
                .detach(|| safetensors::serialize(views, metadata))
                .map_err(|e| invalid(e.to_string()))?;
            Ok(Some(PyBytes::new(py, &bytes).unbind()))
        }
        Some(path) => {
            py.detach(|| write_atomically(&path, views, metadata))?;
            Ok(None)
        }
    }
}

/// Writes the file next to `path` under a temporary name and renames it into place: a reader of
/// the old file keeps reading it whole, and a failure leaves the old file as it was.
fn write_atomically<'a, I>(
    path: &std::path::Path,
    views: I,
    metadata: Option<HashMap<String, String>>,
) -> PyResult<()>
where
    I: IntoIterator<Item = (&'a str, &'a Saved<'a>)>,
{
    let bytes = safetensors::serialize(views, metadata).map_err(|e| invalid(e.to_string()))?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let failed = |error: std::io::Error| {
        // A `StagingError` (what `except SafetensorError` catches, as for safetensors), also a
        // `FileNotFoundError` or `PermissionError` where one applies.
        let kind = match error.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Io,
        };
        of_kind(
            kind,
            format!("Error while serializing: {}: {error}", path.display()),
        )
    };
    let mut file = tempfile::Builder::new()
        .prefix(".safetensors-staging-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(failed)?;
    file.write_all(&bytes).map_err(failed)?;
    file.as_file().sync_data().map_err(failed)?;
    file.persist(path).map_err(|e| failed(e.error))?;
    Ok(())
}

/// The validated header of a serialized buffer: `(data_start, [(name, dtype, shape, start,
/// end)], metadata)`, tensors in offset order, offsets relative to `data_start`.
#[pyfunction]
#[pyo3(name = "_parse")]
#[allow(clippy::type_complexity)]
pub(crate) fn parse(
    data: &Bound<'_, PyBytes>,
) -> PyResult<(
    usize,
    Vec<(String, String, Vec<usize>, usize, usize)>,
    Option<HashMap<String, String>>,
)> {
    let buffer = data.as_bytes();
    let (header_len, metadata) = SafeTensors::read_metadata(buffer).map_err(|e| malformed(&e))?;
    // The whole buffer checked (lengths against the data), as a load checks a file.
    SafeTensors::deserialize(buffer).map_err(|e| malformed(&e))?;
    let infos = metadata.tensors();
    let tensors = metadata
        .offset_keys()
        .into_iter()
        .filter_map(|name| {
            let info = infos.get(&name)?;
            Some((
                name.clone(),
                format!("{:?}", info.dtype),
                info.shape.clone(),
                info.data_offsets.0,
                info.data_offsets.1,
            ))
        })
        .collect();
    Ok((8 + header_len, tensors, metadata.metadata().clone()))
}
