//! candle `VarBuilder` backends whose weights are read by `safetensors-staging`.
//!
//! candle's models take their weights from a [`VarBuilder`]; `from_mmaped_safetensors` maps the
//! files and copies each tensor out of the mapping when the model asks for it. Here:
//!
//! - [`StagedTensors`] loads a whole checkpoint (a file, a directory, an index, a hub-cache
//!   snapshot, a URL: whatever [`Loader::open`] takes) with the library's parallel reads, each
//!   tensor read straight into the `Vec` a candle CPU tensor then owns (no second copy), and is
//!   a [`SimpleBackend`]: `StagedTensors::load(path)?.var_builder(DType::F32, &Device::Cpu)`.
//! - [`ShardedStaged`] is candle's sharded [`Backend`] (hints: [`Shard`]), reading a tensor
//!   when the model asks for it and, for a shard of dimension 0, only the rows of that shard.
//!
//! Dtypes are converted as candle's own backend converts them (`to_dtype` of the file's
//! dtype); a tensor of a dtype candle lacks, a missing name or a wrong shape is a candle error
//! naming the tensor.
//!
//! ```no_run
//! use candle_core::{DType, Device};
//! let vb = staging_candle::StagedTensors::load("/models/all-MiniLM-L6-v2")?
//!     .var_builder(DType::F32, &Device::Cpu);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Feature-gated items are labelled with their feature on docs built with `--cfg docsrs` (CI).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::Init;
use candle_nn::var_builder::{Backend, Shard, SimpleBackend, VarBuilder, VarBuilderArgs};
use half::{bf16, f16};
use safetensors_staging::{
    Checkpoint, Destination, DestinationError, DeviceRegion, Dtype, HostMemory, LoadReport, Loader,
    Prepared, RowRange, Selection, TensorMeta,
};

/// candle's dtype for a safetensors dtype, if it has one.
pub fn candle_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F8_E4M3 => DType::F8E4M3,
        _ => return None,
    })
}

fn error(message: String) -> candle_core::Error {
    candle_core::Error::Msg(message)
}

fn staging_error(what: &str, e: safetensors_staging::Error) -> candle_core::Error {
    error(format!("{what}: {e}"))
}

/// A tensor's elements in the `Vec` type a candle CPU tensor owns.
enum Elements {
    U8(Vec<u8>),
    U32(Vec<u32>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// `len` zeroed elements (lazily, by the allocator), or None when the allocation fails.
fn zeroed<T: bytemuck::Zeroable>(len: usize) -> Option<Vec<T>> {
    bytemuck::allocation::try_zeroed_slice_box(len)
        .ok()
        .map(Vec::from)
}

impl Elements {
    /// Room for a tensor of `dtype` and `bytes` bytes, if candle keeps that dtype in a `Vec` of
    /// plain elements (all but F8E4M3) and the allocation succeeds.
    fn zeroed(dtype: Dtype, bytes: usize) -> Option<Self> {
        let n = |size: usize| bytes.is_multiple_of(size).then_some(bytes / size);
        Some(match dtype {
            Dtype::U8 => Self::U8(zeroed(bytes)?),
            Dtype::U32 => Self::U32(zeroed(n(4)?)?),
            Dtype::I16 => Self::I16(zeroed(n(2)?)?),
            Dtype::I32 => Self::I32(zeroed(n(4)?)?),
            Dtype::I64 => Self::I64(zeroed(n(8)?)?),
            Dtype::BF16 => Self::BF16(zeroed(n(2)?)?),
            Dtype::F16 => Self::F16(zeroed(n(2)?)?),
            Dtype::F32 => Self::F32(zeroed(n(4)?)?),
            Dtype::F64 => Self::F64(zeroed(n(8)?)?),
            _ => return None,
        })
    }

    /// The elements' bytes, to read the file's little-endian bytes into.
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Self::U8(v) => v,
            Self::U32(v) => bytemuck::cast_slice_mut(v),
            Self::I16(v) => bytemuck::cast_slice_mut(v),
            Self::I32(v) => bytemuck::cast_slice_mut(v),
            Self::I64(v) => bytemuck::cast_slice_mut(v),
            Self::BF16(v) => bytemuck::cast_slice_mut(v),
            Self::F16(v) => bytemuck::cast_slice_mut(v),
            Self::F32(v) => bytemuck::cast_slice_mut(v),
            Self::F64(v) => bytemuck::cast_slice_mut(v),
        }
    }

    /// The candle CPU tensor that owns these elements.
    fn into_tensor(self, shape: &[usize]) -> candle_core::Result<Tensor> {
        let cpu = &Device::Cpu;
        match self {
            Self::U8(v) => Tensor::from_vec(v, shape, cpu),
            Self::U32(v) => Tensor::from_vec(v, shape, cpu),
            Self::I16(v) => Tensor::from_vec(v, shape, cpu),
            Self::I32(v) => Tensor::from_vec(v, shape, cpu),
            Self::I64(v) => Tensor::from_vec(v, shape, cpu),
            Self::BF16(v) => Tensor::from_vec(v, shape, cpu),
            Self::F16(v) => Tensor::from_vec(v, shape, cpu),
            Self::F32(v) => Tensor::from_vec(v, shape, cpu),
            Self::F64(v) => Tensor::from_vec(v, shape, cpu),
        }
    }
}

/// The destination that reads each tensor into the `Vec` its candle tensor will own. A dtype
/// candle keeps otherwise (or none), or an allocation that fails, is declined: the library then
/// allocates (and falls back as it does) and the bytes are copied once into candle.
#[derive(Default)]
struct IntoVecs {
    vecs: HashMap<String, Elements>,
}

impl Destination<HostMemory> for IntoVecs {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, HostMemory>>, DestinationError> {
        if cfg!(target_endian = "big") {
            return Ok(None); // the file's bytes are little-endian: candle's conversion swaps them
        }
        let Some(elements) = Elements::zeroed(tensor.dtype, tensor.len) else {
            return Ok(None);
        };
        let slot = self.vecs.entry(tensor.name.clone()).insert_entry(elements);
        Ok(Some(DeviceRegion::from_slice(slot.into_mut().bytes_mut())))
    }
}

/// A candle CPU tensor of a loaded tensor's dtype and shape, its bytes copied once into candle's
/// memory (straight from the library's host memory; through a copy to the host otherwise).
fn from_loaded(tensor: &safetensors_staging::Tensor, what: &str) -> candle_core::Result<Tensor> {
    let meta = tensor.meta();
    let dtype = candle_dtype(meta.dtype).ok_or_else(|| {
        error(format!(
            "tensor {}: candle has no dtype for {:?}",
            meta.name, meta.dtype
        ))
    })?;
    match tensor.host_bytes() {
        Some(bytes) => Tensor::from_raw_buffer(bytes, dtype, &meta.shape, &Device::Cpu),
        None => {
            let bytes = tensor.to_vec().map_err(|e| staging_error(what, e))?;
            Tensor::from_raw_buffer(&bytes, dtype, &meta.shape, &Device::Cpu)
        }
    }
}

/// The tensor `name` as a model asks for it: on `device`, of `dtype` (converted as candle's
/// backend converts), of `shape` if one is expected.
fn deliver(
    tensor: &Tensor,
    name: &str,
    shape: Option<&Shape>,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Tensor> {
    if let Some(expected) = shape
        && tensor.shape() != expected
    {
        return Err(candle_core::Error::UnexpectedShape {
            msg: format!("shape mismatch for {name}"),
            expected: expected.clone(),
            got: tensor.shape().clone(),
        });
    }
    tensor.to_dtype(dtype)?.to_device(device)
}

/// A loader of the `host` backend with the library's default policy.
fn host_loader() -> Loader<'static> {
    Loader::new().backend(safetensors_staging::Backend::Host(Default::default()))
}

/// A whole checkpoint in candle CPU tensors, loaded at once by the library: a
/// [`SimpleBackend`] for [`VarBuilder::from_backend`].
pub struct StagedTensors {
    tensors: HashMap<String, Tensor>,
    /// A tensor of a dtype candle lacks: the error a model asking for it gets.
    unsupported: HashMap<String, Dtype>,
    report: LoadReport,
}

impl std::fmt::Debug for StagedTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedTensors")
            .field("tensors", &self.tensors.len())
            .field("unsupported", &self.unsupported)
            .finish_non_exhaustive()
    }
}

impl StagedTensors {
    /// Loads the checkpoint at `path` into host memory (the `host` backend, the library's
    /// default policy).
    pub fn load(path: impl AsRef<Path>) -> candle_core::Result<Self> {
        Self::load_with(host_loader(), path)
    }

    /// Loads the checkpoint at `path` with `loader`'s options (selection, policy, remote
    /// options). The loader's backend must load into host memory (`host`): candle's tensors
    /// are made there, and moved to the model's device when it asks for them.
    pub fn load_with(loader: Loader<'_>, path: impl AsRef<Path>) -> candle_core::Result<Self> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let mut into = IntoVecs::default();
        let mut tensors = HashMap::new();
        let mut unsupported = HashMap::new();
        let mut placed = Vec::new();
        let report = {
            let mut load = loader
                .destination::<HostMemory, _>(&mut into)
                .open(path)
                .map_err(|e| staging_error(&what, e))?;
            for tensor in load.by_ref() {
                let tensor = tensor.map_err(|e| staging_error(&what, e))?;
                let meta = tensor.meta().clone();
                if matches!(tensor.path(), safetensors_staging::StagingPath::Destination) {
                    placed.push(meta);
                } else if candle_dtype(meta.dtype).is_none() {
                    unsupported.insert(meta.name.clone(), meta.dtype);
                } else {
                    tensors.insert(meta.name.clone(), from_loaded(&tensor, &what)?);
                }
            }
            load.report()
        };
        for meta in placed {
            let elements = into
                .vecs
                .remove(&meta.name)
                .ok_or_else(|| error(format!("tensor {}: its memory is missing", meta.name)))?;
            tensors.insert(meta.name.clone(), elements.into_tensor(&meta.shape)?);
        }
        Ok(Self {
            tensors,
            unsupported,
            report,
        })
    }

    /// What the load read, and how (bytes, seconds, paths).
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// The tensors, by name, as the file has them.
    pub fn tensors(&self) -> &HashMap<String, Tensor> {
        &self.tensors
    }

    /// A `VarBuilder` over these tensors giving `dtype` on `device`.
    pub fn var_builder(self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self), dtype, device.clone())
    }

    fn find(&self, name: &str) -> candle_core::Result<&Tensor> {
        if let Some(dtype) = self.unsupported.get(name) {
            return Err(error(format!(
                "tensor {name}: candle has no dtype for {dtype:?}"
            )));
        }
        self.tensors
            .get(name)
            .ok_or_else(|| candle_core::Error::CannotFindTensor {
                path: name.to_owned(),
            })
    }
}

impl SimpleBackend for StagedTensors {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        deliver(self.find(name)?, name, Some(&s), dtype, dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        deliver(self.find(name)?, name, None, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.unsupported.contains_key(name)
    }
}

/// candle's sharded [`Backend`] over the library: each tensor read when the model asks for it;
/// a shard of dimension 0 reads only its rows; a shard of another dimension reads the tensor's
/// rows (each spans every column) and keeps its part. As candle's `ShardedSafeTensors`, a
/// dimension that does not split evenly is an error.
pub struct ShardedStaged {
    prepared: Mutex<Prepared<'static>>,
    checkpoint: Checkpoint,
    bytes_read: AtomicU64,
}

impl std::fmt::Debug for ShardedStaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedStaged")
            .field("tensors", &self.checkpoint.tensors().len())
            .finish_non_exhaustive()
    }
}

impl ShardedStaged {
    /// Reads the headers of the checkpoint at `path` (host backend); tensors are read later.
    pub fn open(path: impl AsRef<Path>) -> candle_core::Result<Self> {
        Self::open_with(host_loader(), path)
    }

    /// Reads the headers of the checkpoint at `path` with `loader`'s options (its backend must
    /// load into host memory); its files stay open (a few at a time) for the reads to come.
    pub fn open_with(loader: Loader<'static>, path: impl AsRef<Path>) -> candle_core::Result<Self> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let mut prepared = loader
            .prepare_for(path)
            .map_err(|e| staging_error(&what, e))?;
        let checkpoint = prepared
            .read_headers(&[path])
            .map_err(|e| staging_error(&what, e))?;
        // Bound to the files as read: a file renamed over one later is not read.
        prepared
            .keep_files_open_for(&checkpoint)
            .map_err(|e| staging_error(&what, e))?;
        Ok(Self {
            prepared: Mutex::new(prepared),
            checkpoint,
            bytes_read: AtomicU64::new(0),
        })
    }

    /// A sharded `VarBuilder` giving `dtype` on `device`.
    pub fn var_builder(self, dtype: DType, device: &Device) -> VarBuilderArgs<'static, Self> {
        VarBuilderArgs::new_with_args(self, dtype, device)
    }

    /// Bytes read from storage so far (headers aside).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// `name`'s metadata, or candle's error for a tensor the checkpoint lacks.
    fn meta(&self, name: &str) -> candle_core::Result<&TensorMeta> {
        self.checkpoint
            .tensor(name)
            .ok_or_else(|| candle_core::Error::CannotFindTensor {
                path: name.to_owned(),
            })
    }

    /// Reads `name`, only `rows` of dimension 0 when given: a candle CPU tensor.
    fn read(
        &self,
        name: &str,
        rows: Option<std::ops::Range<usize>>,
    ) -> candle_core::Result<Tensor> {
        self.meta(name)?;
        let mut selection = Selection::names([name]);
        if let Some(rows) = rows {
            selection = selection.rows(name, RowRange::Rows(rows));
        }
        let mut prepared = self
            .prepared
            .lock()
            .map_err(|_| error(format!("tensor {name}: an earlier read panicked")))?;
        prepared.select(selection);
        let mut load = prepared
            .open_checkpoint(self.checkpoint.clone())
            .map_err(|e| staging_error(name, e))?;
        let tensor = load
            .next()
            .ok_or_else(|| error(format!("tensor {name}: the load gave nothing")))?
            .map_err(|e| staging_error(name, e))?;
        let candle = from_loaded(&tensor, name)?;
        drop(tensor);
        self.bytes_read
            .fetch_add(load.report().bytes_read, Ordering::Relaxed);
        Ok(candle)
    }
}

impl Backend for ShardedStaged {
    type Hints = Shard;

    fn get(
        &self,
        target_shape: Shape,
        name: &str,
        h: Shard,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if h.world_size <= 1 {
            let tensor = self.read(name, None)?;
            return deliver(&tensor, name, Some(&target_shape), dtype, dev);
        }
        let meta = self.meta(name)?;
        let Shard {
            dim,
            rank,
            world_size,
        } = h;
        let size = *meta.shape.get(dim).ok_or_else(|| {
            error(format!(
                "tensor {name} of shape {:?} has no dimension {dim} to shard",
                meta.shape
            ))
        })?;
        if !size.is_multiple_of(world_size) || rank >= world_size {
            return Err(candle_core::Error::ShapeMismatchSplit {
                shape: meta.shape.clone().into(),
                dim,
                n_parts: world_size,
            });
        }
        let block = size / world_size;
        let (start, stop) = (rank * block, (rank + 1) * block);
        let tensor = if dim == 0 {
            self.read(name, Some(start..stop))?
        } else {
            self.read(name, None)?
                .narrow(dim, start, block)?
                .contiguous()?
        };
        tensor.to_dtype(dtype)?.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let tensor = self.read(name, None)?;
        deliver(&tensor, name, None, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.checkpoint.tensor(name).is_some()
    }
}

// The candle guide's Rust blocks run as this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guides/candle.md")]
pub struct CandlePageDoctests;
