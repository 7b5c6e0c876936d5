//! Writers of safetensors files and sharded checkpoints with chosen dtypes and shapes and random
//! contents, written the way the format specifies (header padded with spaces to 8 bytes, tensors
//! packed in order), streaming: the `stage` command's synthetic checkpoint, and the fixtures of
//! benchmarks and tests (also raw writers for malformed files). Nothing here reads or loads.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::Dtype;
use crate::INDEX_FILE_NAME;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

/// A tensor to write: name, dtype, shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A tensor spec.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// A `U8` tensor of exactly `len` bytes.
    pub fn bytes(name: impl Into<String>, len: usize) -> Self {
        Self::new(name, Dtype::U8, &[len])
    }

    /// Its length in bytes (`elements * bits / 8`; sub-byte dtypes need an even split).
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Every dtype the `safetensors` crate knows, with a shape valid for it.
pub fn every_dtype() -> Vec<TensorSpec> {
    use Dtype::*;
    [
        BOOL,
        F4,
        F6_E2M3,
        F6_E3M2,
        U8,
        I8,
        F8_E5M2,
        F8_E4M3,
        F8_E8M0,
        F8_E4M3FNUZ,
        F8_E5M2FNUZ,
        I16,
        U16,
        F16,
        BF16,
        I32,
        U32,
        F32,
        C64,
        F64,
        I64,
        U64,
    ]
    .into_iter()
    .map(|dtype| TensorSpec::new(format!("t.{dtype:?}"), dtype, &[3, 8, 5]))
    .collect()
}

/// The contents written: tensor name to bytes.
pub type Contents = BTreeMap<String, Vec<u8>>;

/// Builds the JSON header for `specs` packed in order, padded with spaces to a multiple of 8.
pub fn header_for(specs: &[TensorSpec]) -> io::Result<Vec<u8>> {
    let mut map = serde_json::Map::new();
    let mut offset = 0usize;
    for spec in specs {
        let end = offset + spec.byte_len();
        map.insert(
            spec.name.clone(),
            serde_json::json!({
                "dtype": serde_json::to_value(spec.dtype)?,
                "shape": spec.shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&serde_json::Value::Object(map))?;
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    Ok(header)
}

/// Writes a safetensors file whose data for each tensor comes from `fill`, a chunk at a time, so
/// files larger than memory can be written.
pub fn write_streaming(
    path: &Path,
    specs: &[TensorSpec],
    mut fill: impl FnMut(&TensorSpec, &mut [u8]),
) -> io::Result<()> {
    let header = header_for(specs)?;
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&header)?;
    let mut chunk = vec![0u8; 4 << 20];
    for spec in specs {
        let mut left = spec.byte_len();
        while left > 0 {
            let n = left.min(chunk.len());
            fill(spec, &mut chunk[..n]);
            out.write_all(&chunk[..n])?;
            left -= n;
        }
    }
    out.flush()
}

/// Writes one safetensors file of random contents (seeded) and returns what it holds.
pub fn write_file(path: &Path, specs: &[TensorSpec], seed: u64) -> io::Result<Contents> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut contents: Contents = BTreeMap::new();
    write_streaming(path, specs, |spec, buf| {
        rng.fill_bytes(buf);
        contents
            .entry(spec.name.clone())
            .or_default()
            .extend_from_slice(buf);
    })?;
    for spec in specs {
        contents.entry(spec.name.clone()).or_default();
    }
    Ok(contents)
}

/// A sharded checkpoint written by [`write_sharded`].
#[derive(Debug, Clone)]
pub struct ShardedFixture {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The shards, in order.
    pub files: Vec<PathBuf>,
    /// The index file.
    pub index: PathBuf,
    /// Every tensor's bytes.
    pub contents: Contents,
}

/// The Hugging Face shard name `model-0000i-of-0000n.safetensors`.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// Writes `shards` as `model-0000i-of-0000n.safetensors` files in `dir` with an index.
pub fn write_sharded(
    dir: &Path,
    shards: &[Vec<TensorSpec>],
    seed: u64,
) -> io::Result<ShardedFixture> {
    let mut files = Vec::new();
    let mut contents = Contents::new();
    let mut weight_map = BTreeMap::new();
    for (i, specs) in shards.iter().enumerate() {
        let name = shard_name(i, shards.len());
        let path = dir.join(&name);
        contents.extend(write_file(&path, specs, seed.wrapping_add(i as u64))?);
        for spec in specs {
            weight_map.insert(spec.name.clone(), name.clone());
        }
        files.push(path);
    }
    let total: usize = shards.iter().flatten().map(TensorSpec::byte_len).sum();
    let index = dir.join(INDEX_FILE_NAME);
    write_index(&index, &weight_map, total as u64)?;
    Ok(ShardedFixture {
        dir: dir.to_path_buf(),
        files,
        index,
        contents,
    })
}

/// Writes a sharded checkpoint (with its index) in the Hugging Face hub cache's layout under
/// `hub` (the cache's `hub` directory), as `huggingface_hub` leaves it:
/// `models--{org}--{name}/blobs/<hash>` holds each file's bytes, `snapshots/<revision>/<file>`
/// is a relative symlink `../../blobs/<hash>` to it (the index too), and `refs/main` names the
/// revision. The fixture's `dir` is the snapshot directory, its `files` and `index` the
/// symlinks there.
pub fn write_hub_cache(
    hub: &Path,
    repo: &str,
    revision: &str,
    shards: &[Vec<TensorSpec>],
    seed: u64,
) -> io::Result<ShardedFixture> {
    let model = hub.join(format!("models--{}", repo.replace('/', "--")));
    let (blobs, snapshot) = (model.join("blobs"), model.join("snapshots").join(revision));
    std::fs::create_dir_all(&blobs)?;
    std::fs::create_dir_all(&snapshot)?;
    std::fs::create_dir_all(model.join("refs"))?;
    std::fs::write(model.join("refs").join("main"), revision)?;
    // Written in place first, then each file moved into `blobs/` under a name from its bytes
    // and linked back.
    let written = write_sharded(&snapshot, shards, seed)?;
    for file in written.files.iter().chain([&written.index]) {
        let bytes = std::fs::read(file)?;
        let blob = blobs.join(content_name(&bytes));
        std::fs::rename(file, &blob)?;
        let name = file
            .file_name()
            .ok_or_else(|| io::Error::other("a fixture file without a name"))?;
        std::os::unix::fs::symlink(Path::new("../../blobs").join(content_name(&bytes)), file)?;
        debug_assert!(snapshot.join(name).exists());
    }
    Ok(written)
}

/// A 64-hex-digit name derived from `bytes` (the cache names blobs by their hash).
fn content_name(bytes: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    (0..4u64)
        .map(|salt| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (salt, bytes).hash(&mut h);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// Writes an index file mapping tensor names to shard names.
pub fn write_index(
    path: &Path,
    weight_map: &BTreeMap<String, String>,
    total_size: u64,
) -> io::Result<()> {
    let json = serde_json::json!({
        "metadata": { "total_size": total_size },
        "weight_map": weight_map,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&json)?)
}

/// Writes a file of a raw header length, header bytes and data: for malformed inputs.
pub fn write_raw(path: &Path, header_len: u64, header: &[u8], data: &[u8]) -> io::Result<()> {
    let mut bytes = header_len.to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes)
}

/// What [`write_synthetic`] wrote.
#[derive(Debug, Clone)]
pub struct SyntheticCheckpoint {
    /// The shards.
    pub files: Vec<PathBuf>,
    /// The index.
    pub index: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// Tensor bytes written.
    pub bytes: u64,
}

/// The tensors of a Qwen-like checkpoint of about `total_bytes`: an embedding of about 30% of the
/// total (over 256 MiB at 1 GiB), then decoder layers (attention with biases, MLP, norms) in BF16
/// and F32, with sizes that leave tail chunks; split into shards of about a quarter each.
pub fn synthetic_specs(total_bytes: u64) -> Vec<Vec<TensorSpec>> {
    synthetic_specs_with(total_bytes, Dtype::BF16)
}

/// [`synthetic_specs`] with the matrices in `dtype` (a 2-byte type keeps the sizes; F16 lets
/// numpy-based baselines read the checkpoint).
pub fn synthetic_specs_with(total_bytes: u64, dtype: Dtype) -> Vec<Vec<TensorSpec>> {
    let hidden: usize = match total_bytes {
        b if b >= 256 << 20 => 2048,
        b if b >= 16 << 20 => 512,
        _ => 128,
    };
    let intermediate = hidden * 43 / 16; // 2048 -> 5504
    let kv = hidden / 8;
    let bf16 = dtype;
    // An odd row count keeps the embedding off any power-of-two multiple.
    let vocab = ((total_bytes as f64 * 0.3) as usize / (2 * hidden)) | 1;
    let mut tensors = vec![TensorSpec::new(
        "model.embed_tokens.weight",
        bf16,
        &[vocab, hidden],
    )];
    let layer = |i: usize| -> Vec<TensorSpec> {
        let p = format!("model.layers.{i}");
        vec![
            TensorSpec::new(format!("{p}.input_layernorm.weight"), Dtype::F32, &[hidden]),
            TensorSpec::new(
                format!("{p}.self_attn.q_proj.weight"),
                bf16,
                &[hidden, hidden],
            ),
            TensorSpec::new(format!("{p}.self_attn.q_proj.bias"), bf16, &[hidden]),
            TensorSpec::new(format!("{p}.self_attn.k_proj.weight"), bf16, &[kv, hidden]),
            TensorSpec::new(format!("{p}.self_attn.k_proj.bias"), bf16, &[kv]),
            TensorSpec::new(format!("{p}.self_attn.v_proj.weight"), bf16, &[kv, hidden]),
            TensorSpec::new(format!("{p}.self_attn.v_proj.bias"), bf16, &[kv]),
            TensorSpec::new(
                format!("{p}.self_attn.o_proj.weight"),
                bf16,
                &[hidden, hidden],
            ),
            TensorSpec::new(
                format!("{p}.post_attention_layernorm.weight"),
                Dtype::F32,
                &[hidden],
            ),
            TensorSpec::new(
                format!("{p}.mlp.gate_proj.weight"),
                bf16,
                &[intermediate, hidden],
            ),
            TensorSpec::new(
                format!("{p}.mlp.up_proj.weight"),
                bf16,
                &[intermediate, hidden],
            ),
            TensorSpec::new(
                format!("{p}.mlp.down_proj.weight"),
                bf16,
                &[hidden, intermediate],
            ),
        ]
    };
    let layer_bytes: u64 = layer(0).iter().map(|t| t.byte_len() as u64).sum();
    let embed_bytes = tensors[0].byte_len() as u64;
    let layers = (total_bytes.saturating_sub(embed_bytes) / layer_bytes).max(1) as usize;
    for i in 0..layers {
        tensors.extend(layer(i));
    }
    tensors.push(TensorSpec::new("model.norm.weight", Dtype::F32, &[hidden]));

    let per_shard = (total_bytes / 4).max(1);
    let mut shards: Vec<Vec<TensorSpec>> = vec![Vec::new()];
    let mut in_shard = 0u64;
    for t in tensors {
        let len = t.byte_len() as u64;
        if in_shard > 0 && in_shard + len > per_shard {
            shards.push(Vec::new());
            in_shard = 0;
        }
        in_shard += len;
        if let Some(last) = shards.last_mut() {
            last.push(t);
        }
    }
    shards
}

/// Writes a Qwen-like sharded checkpoint of about `total_bytes` (see [`synthetic_specs`]) with
/// random contents into `dir`, streaming, without holding the data in memory.
pub fn write_synthetic(dir: &Path, total_bytes: u64, seed: u64) -> io::Result<SyntheticCheckpoint> {
    write_sharded_streaming(dir, &synthetic_specs(total_bytes), seed)
}

/// Writes `shards` as a sharded checkpoint with an index and random contents, streaming.
pub fn write_sharded_streaming(
    dir: &Path,
    shards: &[Vec<TensorSpec>],
    seed: u64,
) -> io::Result<SyntheticCheckpoint> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut files = Vec::new();
    let mut weight_map = BTreeMap::new();
    let (mut tensors, mut bytes) = (0usize, 0u64);
    for (i, specs) in shards.iter().enumerate() {
        let name = shard_name(i, shards.len());
        let path = dir.join(&name);
        write_streaming(&path, specs, |_, buf| rng.fill_bytes(buf))?;
        for spec in specs {
            weight_map.insert(spec.name.clone(), name.clone());
            tensors += 1;
            bytes += spec.byte_len() as u64;
        }
        files.push(path);
    }
    let index = dir.join(INDEX_FILE_NAME);
    write_index(&index, &weight_map, bytes)?;
    Ok(SyntheticCheckpoint {
        files,
        index,
        tensors,
        bytes,
    })
}
