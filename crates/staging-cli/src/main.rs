//! `stage`: load a safetensors checkpoint through the staging policy and report where every
//! tensor went.
//!
//! ```text
//! stage [PATH ...] [--backend auto|host|mock|cufile|hipfile] [--device-memory SIZE]
//!       [--select GLOB]... [--rows GLOB=START:END|GLOB=RANK/PARTS]...
//!       [--synthetic-size SIZE] [--keep-synthetic DIR]
//!       [--chunk-size SIZE] [--threads N] [--coalesce-below SIZE] [--staging-slots N]
//!       [--json] [--checksums]
//!       [--device N] [--cufile-mode auto|gds|compat|posix] [--cufile-lib PATH] [--direct-io]
//!       [--hipfile-mode auto|hipfile|posix] [--hipfile-lib PATH] [--hip-lib PATH]
//!       [--concurrency N] [--range-size SIZE] [--retries N] [--bandwidth SIZE]
//!       [--store-option KEY=VALUE]...
//! ```
//!
//! A PATH may be an `s3://`, `gs://`, `az://` or `http(s)://` URL (a prefix stands for a
//! directory), configured by each cloud's environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
//! ...) and `--store-option`.
//!
//! With no PATH it writes a synthetic sharded checkpoint to a temporary directory, loads it and
//! removes it. Every loaded tensor is kept until the load ends, as a model loader would. Exit 0
//! on success (also when whoever reads stdout stops early); otherwise one line on stderr and
//! exit 1. Everything is decided by the library's `Loader`; this file only translates flags and
//! prints.

mod output;

use std::error::Error as StdError;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use safetensors_staging::cufile::RequestedMode;
use safetensors_staging::{
    AutoOptions, Backend, HostOptions, Loader, Prepared, RowRange, Selection, StagingPolicy,
};
use staging_cli::{parse_rows, parse_size};

use output::{Closed, Printer};

type BoxError = Box<dyn StdError + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// cuFile when a CUDA driver and device are usable, else hipFile, else host.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HipfileMode {
    /// hipFile (its fastpath or its own fallback); per file POSIX when a file cannot be registered.
    Auto,
    /// hipFile only.
    Hipfile,
    /// No libhipfile: pread into pinned buffers, then host-to-device copies.
    Posix,
}

/// Load a safetensors checkpoint onto a device and report where every tensor went.
#[derive(Debug, Parser)]
#[command(name = "stage", version)]
#[cfg_attr(not(feature = "remote"), allow(dead_code))] // the remote flags
struct Args {
    /// A checkpoint directory, an index file, or safetensors files. None: a synthetic checkpoint
    /// is written to a temporary directory, loaded and removed.
    paths: Vec<PathBuf>,
    /// Which backend loads the tensors.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Cap the device's memory, e.g. 512MiB: the host or mock device's capacity, or a budget
    /// that replaces the free-memory figure of a GPU.
    #[arg(long, value_parser = parse_size)]
    device_memory: Option<u64>,
    /// Load only the tensors whose names match this glob (repeatable: any match loads).
    #[arg(long = "select", value_name = "GLOB")]
    select: Vec<String>,
    /// Load only rows of dimension 0 of the tensors matching GLOB: `GLOB=START:END`, or
    /// `GLOB=RANK/PARTS` for part RANK of PARTS near-equal parts (repeatable; first match wins).
    #[arg(long = "rows", value_name = "GLOB=SPEC", value_parser = parse_rows)]
    rows: Vec<(String, RowRange)>,
    /// The GPU device ordinal.
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
    /// I/O threads (default: the machine's cores, at most 8; for a URL at least
    /// min(--concurrency, 8)).
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
    /// s3://, gs://, az://, http(s):// paths: ranged GETs in flight at once (default 16).
    #[arg(long)]
    concurrency: Option<usize>,
    /// s3://, gs://, az://, http(s):// paths: bytes per ranged GET (default 8MiB).
    #[arg(long, value_parser = parse_size)]
    range_size: Option<u64>,
    /// s3://, gs://, az://, http(s):// paths: retries of a transiently failed request (default 5).
    #[arg(long)]
    retries: Option<usize>,
    /// s3://, gs://, az://, http(s):// paths: at most this many bytes per second, e.g. 500MB.
    #[arg(long, value_parser = parse_size)]
    bandwidth: Option<u64>,
    /// An object_store option, after the environment: `aws_endpoint=http://127.0.0.1:9000`,
    /// `aws_region=us-east-1`, `allow_http=true`, ... (repeatable).
    #[arg(long = "store-option", value_name = "KEY=VALUE", value_parser = parse_store_option)]
    store_options: Vec<(String, String)>,
}

fn parse_store_option(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

/// The remote flags as the loader's remote options.
#[cfg(feature = "remote")]
fn remote_options(args: &Args) -> Result<safetensors_staging::RemoteOptions, BoxError> {
    let mut options = safetensors_staging::RemoteOptions::default();
    if let Some(n) = args.concurrency {
        options.concurrency = n;
    }
    if let Some(size) = args.range_size {
        options.range_size = usize::try_from(size).map_err(|_| "--range-size is too large")?;
    }
    if let Some(n) = args.retries {
        options.max_retries = n;
    }
    options.bandwidth = args.bandwidth;
    options.config.clone_from(&args.store_options);
    Ok(options)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Closed>() => ExitCode::SUCCESS,
        Err(e) => {
            let line = e.to_string().replace('\n', " ");
            // A closed stderr leaves nothing to tell; the exit status still says it failed.
            let _ = writeln!(std::io::stderr(), "stage: error: {line}");
            ExitCode::FAILURE
        }
    }
}

fn backend(args: &Args) -> Backend {
    let cufile = safetensors_staging::cufile::Options {
        device: args.device,
        mode: match args.cufile_mode {
            CufileMode::Auto => RequestedMode::Auto,
            CufileMode::Gds => RequestedMode::Fast,
            CufileMode::Compat => RequestedMode::Compat,
            CufileMode::Posix => RequestedMode::Posix,
        },
        library: args.cufile_lib.clone(),
        ..Default::default()
    };
    let hipfile = safetensors_staging::hipfile::Options {
        device: args.device,
        mode: match args.hipfile_mode {
            HipfileMode::Auto => RequestedMode::Auto,
            HipfileMode::Hipfile => RequestedMode::Fast,
            HipfileMode::Posix => RequestedMode::Posix,
        },
        library: args.hipfile_lib.clone(),
        hip_library: args.hip_lib.clone(),
        ..Default::default()
    };
    let host = HostOptions::default().direct_io(args.direct_io);
    match args.backend {
        BackendArg::Auto => {
            let mut auto = AutoOptions::default();
            auto.cufile = cufile;
            auto.hipfile = hipfile;
            auto.host = host;
            Backend::Auto(auto)
        }
        BackendArg::Host => Backend::Host(host),
        BackendArg::Mock => Backend::Mock,
        BackendArg::Cufile => Backend::Cufile(cufile),
        BackendArg::Hipfile => Backend::Hipfile(hipfile),
    }
}

fn policy(args: &Args) -> Result<StagingPolicy, BoxError> {
    let mut policy = StagingPolicy::builder();
    if let Some(chunk) = args.chunk_size {
        let chunk = usize::try_from(chunk).map_err(|_| "--chunk-size is too large")?;
        policy = policy.chunk_size(chunk).staging_size(chunk);
    }
    if let Some(threads) = args.threads {
        policy = policy.io_threads(threads);
    }
    if let Some(slots) = args.staging_slots {
        policy = policy.staging_slots(slots);
    }
    if let Some(below) = args.coalesce_below {
        let below = usize::try_from(below).map_err(|_| "--coalesce-below is too large")?;
        policy = policy.coalesce_below(below);
    }
    Ok(policy.build()?)
}

/// `--select` and `--rows` as a selection: globs compiled once.
fn selection(args: &Args) -> Result<Selection, BoxError> {
    let glob = |pattern: &str| {
        globset::Glob::new(pattern)
            .map(|g| g.compile_matcher())
            .map_err(|e| format!("--select/--rows pattern {pattern:?}: {e}"))
    };
    let mut selection = if args.select.is_empty() {
        Selection::all()
    } else {
        let mut set = globset::GlobSetBuilder::new();
        for pattern in &args.select {
            set.add(globset::Glob::new(pattern).map_err(|e| format!("--select {pattern:?}: {e}"))?);
        }
        let set = set.build()?;
        Selection::matching(move |name| set.is_match(name))
    };
    for (pattern, rows) in &args.rows {
        let matcher = glob(pattern)?;
        let rows = rows.clone();
        selection =
            selection.rows_where(move |meta| matcher.is_match(&meta.name).then(|| rows.clone()));
    }
    Ok(selection)
}

fn run(args: &Args) -> Result<(), BoxError> {
    let loader = Loader::new()
        .backend(backend(args))
        .device(args.device)
        .policy(policy(args)?)
        .memory_cap(args.device_memory)
        .select(selection(args)?);
    #[cfg(feature = "remote")]
    let loader = loader.remote(remote_options(args)?);
    // The backend first: a machine that cannot run it fails before a byte is written.
    let prepared = loader.prepare()?;
    if let (Some(reason), false) = (prepared.mode_reason(), args.json) {
        let _ = writeln!(
            std::io::stderr(),
            "{}: using the POSIX path: {reason}",
            prepared.backend_name()
        );
    }
    // Removed when dropped, after the load.
    let (load, _synthetic) = open(args, prepared)?;
    load_and_report(args, load)
}

/// Opens the paths given, or a synthetic checkpoint written for the run.
fn open(
    args: &Args,
    prepared: Prepared<'static>,
) -> Result<
    (
        safetensors_staging::Load<'static>,
        Option<tempfile::TempDir>,
    ),
    BoxError,
> {
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
                let _ = writeln!(
                    std::io::stderr(),
                    "writing a synthetic {} checkpoint to {} ...",
                    HumanBytes(args.synthetic_size),
                    dir.display()
                );
            }
            write_synthetic(&dir, args.synthetic_size)?;
            Ok((prepared.open(&dir)?, temporary))
        }
        [one] => Ok((prepared.open(one)?, None)),
        many => Ok((prepared.open_files(many)?, None)),
    }
}

/// Writes the synthetic checkpoint and flushes it: a load racing the write-back of just-written
/// pages measured 0.7 GB/s here against 5 GB/s once they were on disk; the load should be timed
/// alone.
fn write_synthetic(dir: &std::path::Path, size: u64) -> Result<(), BoxError> {
    let written = backend_mock::fixtures::write_synthetic(dir, size, 0x5eed)
        .map_err(|e| format!("{}: writing the synthetic checkpoint: {e}", dir.display()))?;
    for file in written.files.iter().chain([&written.index]) {
        std::fs::File::open(file)
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("{}: flushing: {e}", file.display()))?;
    }
    Ok(())
}

fn load_and_report(
    args: &Args,
    mut load: safetensors_staging::Load<'static>,
) -> Result<(), BoxError> {
    let total = load.checkpoint().total_bytes();
    let count = load.checkpoint().tensors().len();
    if count == 0 && !args.select.is_empty() {
        return Err(format!(
            "--select {} matches no tensor of the checkpoint",
            args.select.join(" --select ")
        )
        .into());
    }
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
    for item in load.by_ref() {
        let tensor = item?;
        progress.inc(tensor.len() as u64);
        kept.push(tensor);
    }
    progress.finish_and_clear();
    let report = load.report();
    let mut printer = Printer::new(args.checksums);
    for tensor in &kept {
        printer.add(tensor)?;
    }
    let printed = if args.json {
        printer.json(report)
    } else {
        printer.human(&report)
    };
    drop(kept);
    if let Some(ledger) = load.ledger() {
        let leaked = ledger.outstanding();
        if !leaked.is_empty() {
            return Err(format!(
                "mock ledger: {} buffers were never returned: {leaked:?}",
                leaked.len()
            )
            .into());
        }
    }
    printed
}
