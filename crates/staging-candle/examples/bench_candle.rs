//! Time to a usable candle model and to a checkpoint in candle CPU tensors: through
//! `staging-candle` and through candle's own `from_mmaped_safetensors`, rounds interleaved in one
//! process, medians and spread.
//!
//! ```text
//! cargo run --release -p staging-candle --example bench_candle -- MINILM_DIR [GIB] [ROUNDS]
//! ```
//! MINILM_DIR: all-MiniLM-L6-v2 (`config.json`, `model.safetensors`); GIB (default 1): the size
//! of a synthetic checkpoint written first (2 shards of 4096 x 4096 F16 tensors, in a temporary
//! directory); ROUNDS (default 7). Every file is in the page cache (just written, or read by the
//! first round): this measures the copy into candle's memory and the work around it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use backend_mock::fixtures::{TensorSpec, write_sharded_streaming};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use safetensors_staging::Dtype;
use staging_candle::StagedTensors;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn bert_ours(dir: &Path, config: &Config) -> Result {
    let vb = StagedTensors::load(dir)?.var_builder(DType::F32, &Device::Cpu);
    BertModel::load(vb, config)?;
    Ok(())
}

fn bert_candle(files: &[PathBuf], config: &Config) -> Result {
    // SAFETY: the benchmark's files are not changed while mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(files, DType::F32, &Device::Cpu)? };
    BertModel::load(vb, config)?;
    Ok(())
}

fn all_ours(dir: &Path) -> Result<usize> {
    Ok(StagedTensors::load(dir)?.tensors().len())
}

fn all_candle(files: &[PathBuf]) -> Result<usize> {
    // SAFETY: as above.
    let mapped = unsafe { candle_core::safetensors::MmapedSafetensors::multi(files)? };
    let mut kept = Vec::new();
    for (name, _) in mapped.tensors() {
        kept.push(mapped.load(&name, &Device::Cpu)?);
    }
    Ok(kept.len())
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> Result {
    let mut args = std::env::args().skip(1);
    let minilm = PathBuf::from(
        args.next()
            .ok_or("usage: bench_candle MINILM_DIR [GIB] [ROUNDS]")?,
    );
    let gib: f64 = args.next().map_or(Ok(1.0), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(7), |a| a.parse())?;
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(minilm.join("config.json"))?)?;
    let minilm_files = [minilm.join("model.safetensors")];

    let tmp = tempfile::tempdir()?;
    let per = 4096 * 4096 * 2;
    let count = ((gib * (1u64 << 30) as f64) / per as f64).round().max(2.0) as usize;
    let shards: Vec<Vec<TensorSpec>> = (0..2)
        .map(|s| {
            (s..count)
                .step_by(2)
                .map(|i| TensorSpec::new(format!("layer.{i}"), Dtype::F16, &[4096, 4096]))
                .collect()
        })
        .collect();
    let written = write_sharded_streaming(tmp.path(), &shards, 1)?;
    let bytes = (count * per) as f64;

    let names = [
        "bert: staging-candle",
        "bert: from_mmaped_safetensors",
        "all: staging-candle",
        "all: MmapedSafetensors::load",
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..=rounds {
        for (i, times) in times.iter_mut().enumerate() {
            let start = Instant::now();
            match i {
                0 => bert_ours(&minilm, &config)?,
                1 => bert_candle(&minilm_files, &config)?,
                2 => assert_eq!(all_ours(tmp.path())?, count),
                _ => assert_eq!(all_candle(&written.files)?, count),
            }
            if round > 0 {
                times.push(start.elapsed().as_secs_f64()); // round 0 warms the page cache
            }
        }
    }
    println!(
        "{rounds} rounds, interleaved; synthetic: {count} F16 tensors, {:.2} GB in 2 files\n",
        bytes / 1e9
    );
    println!("| what | median | min-max | vs candle's own |");
    println!("| --- | --- | --- | --- |");
    let medians: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    for (i, name) in names.iter().enumerate() {
        let (lo, hi) = times[i]
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        let base = medians[i | 1];
        let unit = if i < 2 {
            "ms".to_owned()
        } else {
            format!("ms ({:.2} GB/s)", bytes / medians[i] / 1e9)
        };
        println!(
            "| {name} | {:.1} {unit} | {:.1}-{:.1} | {:.2}x |",
            medians[i] * 1e3,
            lo * 1e3,
            hi * 1e3,
            base / medians[i]
        );
    }
    Ok(())
}
