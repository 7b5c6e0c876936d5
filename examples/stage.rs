//! `stage`: load a safetensors checkpoint through the staging policy and report where every
//! tensor went.
//!
//! ```text
//! stage [PATH ...] [--backend auto|host|mock|cufile] [--device-memory SIZE] [--synthetic-size SIZE]
//!       [--chunk-size SIZE] [--threads N] [--coalesce-below SIZE] [--staging-slots N]
//!       [--json] [--checksums]
//!       [--device N] [--cufile-mode auto|gds|compat|posix] [--cufile-lib PATH] [--direct-io]
//!       [--hipfile-mode auto|hipfile|posix] [--hipfile-lib PATH] [--hip-lib PATH]
//! ```
//!
//! With no PATH it writes a synthetic sharded checkpoint to a temporary directory, loads it and
//! removes it. Every loaded tensor is kept until the load ends, as a model loader would. Exit 0
//! on success; otherwise one line on stderr and exit 1.

use std::error::Error as StdError;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use backend_cufile::{Options as CufileOptions, RequestedMode};
use backend_mock::fixtures::write_synthetic;
use backend_mock::mock_backend;
use clap::{Parser, ValueEnum};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use serde::Serialize;
use sha2::{Digest, Sha256};
use staging_core::host::{DirectHostReader, HostAllocator, HostReader};
use staging_core::{
    Checkpoint, DeviceAllocator, LoadReport, Reader, StagedTensor, Stager, StagingPath,
    StagingPolicy, SubAllocator, TensorData,
};

type BoxError = Box<dyn StdError + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// cuFile when a CUDA driver and device are usable, else host.
    Auto,
    /// System memory standing for the device.
    Host,
    /// The host backend behind the mock's ledger, which checks every buffer came back.
    Mock,
    /// NVIDIA GPUs through cuFile (GDS or compatibility mode) or its POSIX path.
    Cufile,
    /// AMD GPUs through hipFile or its POSIX path (run against stubs only so far).
    Hipfile,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HipfileMode {
    /// hipFile (its fastpath or its own fallback); per file POSIX when a file cannot be registered.
    Auto,
    /// hipFile only.
    Hipfile,
    /// No libhipfile: pread into pinned buffers, then host-to-device copies.
    Posix,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CufileMode {
    /// GDS if nvidia-fs is loaded, else cuFile's compatibility mode, else POSIX.
    Auto,
    /// GPUDirect Storage only.
    Gds,
    /// cuFile's compatibility mode.
    Compat,
    /// No libcufile: pread into pinned buffers, then host-to-device copies.
    Posix,
}

impl From<CufileMode> for RequestedMode {
    fn from(mode: CufileMode) -> Self {
        match mode {
            CufileMode::Auto => RequestedMode::Auto,
            CufileMode::Gds => RequestedMode::Fast,
            CufileMode::Compat => RequestedMode::Compat,
            CufileMode::Posix => RequestedMode::Posix,
        }
    }
}

/// Load a safetensors checkpoint onto a device and report where every tensor went.
#[derive(Debug, Parser)]
#[command(name = "stage", version)]
struct Args {
    /// A checkpoint directory, an index file, or safetensors files. None: a synthetic checkpoint
    /// is written to a temporary directory, loaded and removed.
    paths: Vec<PathBuf>,
    /// Which backend loads the tensors.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Cap the device's memory, e.g. 512MiB: the host or mock device's capacity, or a budget
    /// that replaces the free-memory figure of a GPU.
    #[arg(long, value_parser = parse_size)]
    device_memory: Option<u64>,
    /// The CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// How the cuFile backend reads.
    #[arg(long, value_enum, default_value_t = CufileMode::Auto)]
    cufile_mode: CufileMode,
    /// An explicit libcufile path (else $STAGING_CUFILE_LIB, libcufile.so.0, libcufile.so).
    #[arg(long)]
    cufile_lib: Option<PathBuf>,
    /// How the hipFile backend reads.
    #[arg(long, value_enum, default_value_t = HipfileMode::Auto)]
    hipfile_mode: HipfileMode,
    /// An explicit libhipfile path (else $STAGING_HIPFILE_LIB, libhipfile.so.0, libhipfile.so).
    #[arg(long)]
    hipfile_lib: Option<PathBuf>,
    /// An explicit HIP runtime path (else $STAGING_HIP_LIB, libamdhip64.so, .so.7, .so.6).
    #[arg(long)]
    hip_lib: Option<PathBuf>,
    /// Size of the synthetic checkpoint written when no PATH is given.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    synthetic_size: u64,
    /// Write the synthetic checkpoint into this directory and keep it (for benchmarks).
    #[arg(long)]
    keep_synthetic: Option<PathBuf>,
    /// Largest single read, and the size of the one staging buffer (default 16MiB).
    #[arg(long, value_parser = parse_size)]
    chunk_size: Option<u64>,
    /// I/O threads (default: the machine's cores, at most 8).
    #[arg(long)]
    threads: Option<usize>,
    /// Back-to-back tensors smaller than this are read together, one request per run
    /// (default 1MiB; 0 reads every tensor on its own; needs more than one I/O thread).
    #[arg(long, value_parser = parse_size)]
    coalesce_below: Option<u64>,
    /// Staging buffers host assembly uses at once, so reads overlap device-to-host copies
    /// (default 2; needs more than one I/O thread).
    #[arg(long)]
    staging_slots: Option<usize>,
    /// Host backend: read with O_DIRECT, bypassing the page cache (for a cold first load).
    #[arg(long)]
    direct_io: bool,
    /// Print only the JSON report on stdout.
    #[arg(long)]
    json: bool,
    /// Read every tensor back from where it landed and add its SHA-256 to the report.
    #[arg(long)]
    checksums: bool,
}

/// Parses `512MiB`, `2GiB`, `1.5GB`, `4096`, `64k`: binary units for `K`/`KiB`-style suffixes,
/// decimal for `KB`/`MB`/`GB`/`TB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 512MiB, 2GiB or 4096"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

#[derive(Serialize)]
struct TensorEntry {
    name: String,
    file: String,
    dtype: String,
    shape: Vec<usize>,
    bytes: usize,
    path: StagingPath,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

#[derive(Serialize)]
struct JsonReport {
    #[serde(flatten)]
    report: LoadReport,
    tensor_list: Vec<TensorEntry>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = e.to_string().replace('\n', " ");
            eprintln!("stage: error: {line}");
            ExitCode::FAILURE
        }
    }
}

/// The backend chosen before anything is read or written.
enum Chosen {
    Host,
    Mock,
    Cufile(Box<backend_cufile::Backend>),
    Hipfile(Box<backend_hipfile::Backend>),
}

fn open_hipfile(args: &Args) -> Result<backend_hipfile::Backend, backend_hipfile::Error> {
    let options = backend_hipfile::Options {
        device: args.device,
        mode: match args.hipfile_mode {
            HipfileMode::Auto => backend_hipfile::RequestedMode::Auto,
            HipfileMode::Hipfile => backend_hipfile::RequestedMode::Fast,
            HipfileMode::Posix => backend_hipfile::RequestedMode::Posix,
        },
        library: args.hipfile_lib.clone(),
        hip_library: args.hip_lib.clone(),
        ..backend_hipfile::Options::default()
    };
    let backend = backend_hipfile::open(&options)?;
    if let (Some(reason), false) = (&backend.fallback_reason, args.json) {
        eprintln!("hipfile: using the POSIX path: {reason}");
    }
    Ok(backend)
}

/// `auto` after cuFile found no CUDA driver or device: hipFile, else the host backend.
fn auto_after_cufile(args: &Args) -> Result<Chosen, BoxError> {
    match open_hipfile(args) {
        Ok(backend) => Ok(Chosen::Hipfile(Box::new(backend))),
        Err(backend_hipfile::Error::NoHipRuntime { .. } | backend_hipfile::Error::NoDevice) => {
            Ok(Chosen::Host)
        }
        Err(e) => Err(format!("hipfile backend: {e}").into()),
    }
}

fn choose_backend(args: &Args) -> Result<Chosen, BoxError> {
    match args.backend {
        Backend::Host => Ok(Chosen::Host),
        Backend::Mock => Ok(Chosen::Mock),
        Backend::Hipfile => open_hipfile(args)
            .map(|b| Chosen::Hipfile(Box::new(b)))
            .map_err(|e| format!("hipfile backend: {e}").into()),
        Backend::Auto | Backend::Cufile => {
            let options = CufileOptions {
                device: args.device,
                mode: args.cufile_mode.into(),
                library: args.cufile_lib.clone(),
                ..CufileOptions::default()
            };
            match backend_cufile::open(&options) {
                Ok(backend) => {
                    if let (Some(reason), false) = (&backend.fallback_reason, args.json) {
                        eprintln!("cufile: using the POSIX path: {reason}");
                    }
                    Ok(Chosen::Cufile(Box::new(backend)))
                }
                Err(backend_cufile::Error::NoCudaDriver | backend_cufile::Error::NoDevice)
                    if args.backend == Backend::Auto =>
                {
                    auto_after_cufile(args)
                }
                Err(e) => Err(format!("cufile backend: {e}").into()),
            }
        }
    }
}

fn open_checkpoint(args: &Args) -> Result<(Checkpoint, Option<tempfile::TempDir>), BoxError> {
    match args.paths.as_slice() {
        [] => {
            let (dir, temporary) = match &args.keep_synthetic {
                Some(dir) => {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    (dir.clone(), None)
                }
                None => {
                    let tmp = tempfile::Builder::new()
                        .prefix("stage-synthetic-")
                        .tempdir()?;
                    (tmp.path().to_path_buf(), Some(tmp))
                }
            };
            if !args.json {
                eprintln!(
                    "writing a synthetic {} checkpoint to {} ...",
                    HumanBytes(args.synthetic_size),
                    dir.display()
                );
            }
            let written = write_synthetic(&dir, args.synthetic_size, 0x5eed)
                .map_err(|e| format!("{}: writing the synthetic checkpoint: {e}", dir.display()))?;
            // Flush it first: a load racing the write-back of just-written pages measured 0.7 GB/s
            // here against 5 GB/s once they were on disk; the load should be timed alone.
            for file in written.files.iter().chain([&written.index]) {
                std::fs::File::open(file)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| format!("{}: flushing: {e}", file.display()))?;
            }
            Ok((Checkpoint::open(&dir)?, temporary))
        }
        [one] => Ok((Checkpoint::open(one)?, None)),
        many => Ok((Checkpoint::from_files(many)?, None)),
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    let mut policy = StagingPolicy::default();
    if let Some(chunk) = args.chunk_size {
        let chunk = usize::try_from(chunk).map_err(|_| "--chunk-size is too large")?;
        policy.chunk_size = chunk;
        policy.staging_size = chunk;
    }
    if let Some(threads) = args.threads {
        policy.io_threads = threads;
    }
    if let Some(slots) = args.staging_slots {
        policy.staging_slots = slots;
    }
    if let Some(below) = args.coalesce_below {
        policy.coalesce_below =
            usize::try_from(below).map_err(|_| "--coalesce-below is too large")?;
    }
    policy.validate()?;

    // The backend first: a machine that cannot run it fails before a byte is written.
    let chosen = choose_backend(args)?;
    // Removed when dropped, after the load.
    let (checkpoint, _synthetic_dir) = open_checkpoint(args)?;
    match chosen {
        Chosen::Host => {
            let allocator = SubAllocator::with_defaults(match args.device_memory {
                Some(cap) => HostAllocator::with_capacity(cap),
                None => HostAllocator::new(),
            });
            if args.direct_io {
                load(
                    args,
                    checkpoint,
                    DirectHostReader::default(),
                    allocator,
                    policy,
                )
            } else {
                load(args, checkpoint, HostReader, allocator, policy)
            }
        }
        Chosen::Cufile(backend) => {
            // On a GPU the cap is a budget that replaces the device's free-memory figure.
            policy.memory_budget = args.device_memory;
            let backend = *backend;
            let allocator = SubAllocator::with_defaults(backend.allocator);
            load(args, checkpoint, backend.reader, allocator, policy)
        }
        Chosen::Hipfile(backend) => {
            policy.memory_budget = args.device_memory;
            let backend = *backend;
            let allocator = SubAllocator::with_defaults(backend.allocator);
            load(args, checkpoint, backend.reader, allocator, policy)
        }
        Chosen::Mock => {
            let (reader, allocator) = mock_backend();
            let allocator = match args.device_memory {
                Some(cap) => allocator.with_capacity(cap),
                None => allocator,
            };
            let ledger = allocator.ledger();
            load(args, checkpoint, reader, allocator, policy)?;
            let leaked = ledger.outstanding();
            if !leaked.is_empty() {
                return Err(format!(
                    "mock ledger: {} buffers were never returned: {leaked:?}",
                    leaked.len()
                )
                .into());
            }
            Ok(())
        }
    }
}

fn load<R, A>(
    args: &Args,
    checkpoint: Checkpoint,
    reader: R,
    allocator: A,
    policy: StagingPolicy,
) -> Result<(), BoxError>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
{
    let total = checkpoint.total_bytes();
    let count = checkpoint.tensors().len();
    let mut stager = Stager::new(checkpoint, reader, allocator, policy)?;
    let progress = if !args.json && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total);
        let style = ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
        )?;
        bar.set_style(style.progress_chars("=> "));
        bar
    } else {
        ProgressBar::hidden()
    };
    // Keep every tensor until the load ends, as a model loader would.
    let mut kept = Vec::with_capacity(count);
    for item in stager.by_ref() {
        let tensor = item?;
        progress.inc(tensor.meta().len as u64);
        kept.push(tensor);
    }
    progress.finish_and_clear();
    let report = stager.report();

    let mut tensor_list = Vec::with_capacity(kept.len());
    for tensor in &kept {
        let meta = tensor.meta();
        let sha256 = if args.checksums {
            Some(checksum(stager.allocator(), tensor)?)
        } else {
            None
        };
        tensor_list.push(TensorEntry {
            name: meta.name.clone(),
            file: meta.file.display().to_string(),
            dtype: meta.dtype_name(),
            shape: meta.shape.clone(),
            bytes: meta.len,
            path: tensor.path(),
            sha256,
        });
    }

    if args.json {
        let json = serde_json::to_string_pretty(&JsonReport {
            report,
            tensor_list,
        })?;
        println!("{json}");
    } else {
        print_human(&report, &tensor_list);
    }
    Ok(())
}

/// SHA-256 of a tensor's bytes, read back from where they landed.
fn checksum<A: DeviceAllocator>(
    allocator: &A,
    tensor: &StagedTensor<A::Buffer>,
) -> Result<String, BoxError> {
    let mut hasher = Sha256::new();
    match tensor.data() {
        TensorData::Host(bytes) => hasher.update(&bytes[..]),
        TensorData::Device(device) => {
            let len = tensor.meta().len;
            let mut chunk = vec![0u8; len.min(16 << 20)];
            let mut offset = 0;
            while offset < len {
                let n = chunk.len().min(len - offset);
                allocator
                    .copy_to_host(device.buffer(), offset, &mut chunk[..n])
                    .map_err(|e| format!("{}: reading back: {e}", tensor.name()))?;
                hasher.update(&chunk[..n]);
                offset += n;
            }
        }
        TensorData::Destination { .. } => {
            return Err(format!(
                "{}: a caller destination cannot be checksummed here",
                tensor.name()
            )
            .into());
        }
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn print_human(report: &LoadReport, tensors: &[TensorEntry]) {
    let name_width = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<name_width$}  {:<6} {:<16} {:>12}  path",
        "name", "dtype", "shape", "bytes"
    );
    for t in tensors {
        let shape = format!("{:?}", t.shape);
        println!(
            "{:<name_width$}  {:<6} {:<16} {:>12}  {}{}",
            t.name,
            t.dtype,
            shape,
            t.bytes,
            t.path.as_str(),
            t.sha256
                .as_deref()
                .map(|h| format!("  sha256:{h}"))
                .unwrap_or_default()
        );
    }
    let gbps = report.bytes_per_second / 1e9;
    println!();
    println!(
        "loaded {} tensors, {} from {} files in {:.3} s: {:.2} GB/s (backend {}, mode {})",
        report.tensors,
        HumanBytes(report.bytes),
        report.files,
        report.seconds,
        gbps,
        report.backend,
        report.mode
    );
    println!("{:<12} {:>8} {:>12}", "path", "tensors", "bytes");
    for (name, count) in [
        ("destination", report.paths.destination),
        ("device", report.paths.device),
        ("host", report.paths.host),
    ] {
        println!(
            "{name:<12} {:>8} {:>12}",
            count.tensors,
            HumanBytes(count.bytes).to_string()
        );
    }
    println!(
        "fallbacks: {} insufficient memory, {} allocation race",
        report.fallbacks.insufficient_memory, report.fallbacks.allocation_race
    );
    println!(
        "peak held: device {}, host {}",
        HumanBytes(report.peak_device_bytes),
        HumanBytes(report.peak_host_bytes)
    );
    println!("read requests: {}", report.read_requests);
}
