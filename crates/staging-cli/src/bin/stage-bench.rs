//! `stage-bench`: the loader against the limits, side by side, in one run.
//!
//! ```text
//! stage-bench [--sizes 2GiB[,8GiB]] [--layouts large,small] [--dir DIR] [--repeat N] [--threads N]
//!       [--variants a,b,...] [--cold-memory] [--json]
//! ```
//!
//! For each size it writes (once, kept in `--dir`) two F16 checkpoints: `large` (Qwen-like: few
//! large tensors) and `small` (many tensors of 4 KiB to 1 MiB). With the page cache hot, each
//! variant runs in a child process (so its peak RSS is its own, from `wait4`):
//!
//! - `seq-reused`: sequential `pread` of the files into one reused 16 MiB buffer (page-cache limit);
//! - `fresh-memory`: the files read into fresh memory of their size (fresh-memory limit; the same
//!   anonymous mappings the host backend uses);
//! - `safetensors-mmap`: the `safetensors` crate over an mmap, every tensor copied out;
//! - `python-numpy`: Python's `safetensors.numpy.load_file` (when importable);
//! - `stager-1`: the library's `Loader`, host backend, one I/O thread;
//! - `stager`: the `Loader` as configured (`--threads`, default: the policy's default);
//! - `stager-uncoalesced`: the same with coalesced reads off (one request per tensor);
//! - `stager-direct`: the same reading with `O_DIRECT`: past the page cache, from the disk.
//!
//! Before each timed child, a short-lived process touches and frees memory of the checkpoint's
//! size, so that every variant starts with guest memory the hypervisor has backed
//! (`--cold-memory` skips this; see `touch_memory`). Every variant keeps what it loaded until it
//! ends, as a loader would. The table gives GB/s (of tensor bytes), each variant's ratio to
//! `fresh-memory` and `python-numpy`, peak RSS, and for the
//! stager the peak host and device bytes its report holds.

use std::error::Error as StdError;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use safetensors_staging::{
    Backend, Checkpoint, Dtype, HostBytes, HostOptions, Load, LoadReport, Loader, StagingPolicy,
};
use serde::{Deserialize, Serialize};
use staging_cli::parse_size;
use staging_core::write::{TensorSpec, synthetic_specs_with, write_sharded_streaming};

type BoxError = Box<dyn StdError + Send + Sync>;

const VARIANTS: [&str; 8] = [
    "seq-reused",
    "fresh-memory",
    "safetensors-mmap",
    "python-numpy",
    "stager-1",
    "stager",
    "stager-uncoalesced",
    "stager-direct",
];

#[derive(Debug, Serialize, Deserialize)]
struct ChildResult {
    seconds: f64,
    peak_host_bytes: Option<u64>,
    peak_device_bytes: Option<u64>,
}

/// One variant's median time and peaks.
struct Measured {
    variant: String,
    seconds: f64,
    rss_kib: u64,
    host: Option<u64>,
    device: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Row {
    size: String,
    layout: String,
    variant: String,
    gb_per_s: f64,
    seconds: f64,
    vs_fresh_memory: Option<f64>,
    vs_python_numpy: Option<f64>,
    peak_rss_mib: u64,
    peak_host_bytes: Option<u64>,
    peak_device_bytes: Option<u64>,
}

fn arg_value(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match (arg_value(&args, "--variant"), arg_value(&args, "--touch")) {
        (Some(variant), _) => child(&variant, &args),
        (None, Some(bytes)) => parse_size(&bytes)
            .map_err(BoxError::from)
            .and_then(touch_memory),
        (None, None) => parent(&args),
    };
    if let Err(e) = result {
        eprintln!("bench: error: {e}");
        std::process::exit(1);
    }
}

/// The files of a checkpoint directory, in load order.
fn files_of(dir: &Path) -> Result<Vec<PathBuf>, BoxError> {
    Ok(Checkpoint::open(dir)?
        .files()
        .iter()
        .map(|f| f.path.to_path_buf())
        .collect())
}

fn read_file_into(file: &File, buf: &mut [u8]) -> Result<(), BoxError> {
    let mut done = 0;
    while done < buf.len() {
        let end = (done + (16 << 20)).min(buf.len());
        let n = file.read_at(&mut buf[done..end], done as u64)?;
        if n == 0 {
            return Err("file shrank".into());
        }
        done += n;
    }
    Ok(())
}

fn child(variant: &str, args: &[String]) -> Result<(), BoxError> {
    let dir = PathBuf::from(arg_value(args, "--checkpoint").ok_or("--checkpoint missing")?);
    let threads: Option<usize> = arg_value(args, "--threads")
        .map(|t| t.parse())
        .transpose()?;
    let start = Instant::now();
    let mut result = ChildResult {
        seconds: 0.0,
        peak_host_bytes: None,
        peak_device_bytes: None,
    };
    match variant {
        "seq-reused" => {
            let mut buf = vec![0u8; 16 << 20];
            for path in files_of(&dir)? {
                let file = File::open(&path)?;
                let mut offset = 0u64;
                loop {
                    let n = file.read_at(&mut buf, offset)?;
                    if n == 0 {
                        break;
                    }
                    offset += n as u64;
                }
            }
        }
        "fresh-memory" => {
            let mut kept = Vec::new();
            for path in files_of(&dir)? {
                let file = File::open(&path)?;
                let len = usize::try_from(file.metadata()?.len())?;
                let mut bytes = HostBytes::zeroed(len, 4096).ok_or("allocation failed")?;
                read_file_into(&file, &mut bytes)?;
                kept.push(bytes);
            }
        }
        "safetensors-mmap" => {
            let mut kept: Vec<Vec<u8>> = Vec::new();
            for path in files_of(&dir)? {
                let file = File::open(&path)?;
                // SAFETY: the benchmark's own files are not modified while mapped.
                let map = unsafe { memmap2::Mmap::map(&file)? };
                let tensors = safetensors::SafeTensors::deserialize(&map)?;
                for (_, view) in tensors.iter() {
                    kept.push(view.data().to_vec());
                }
            }
        }
        "stager-1" | "stager" | "stager-uncoalesced" | "stager-direct" => {
            let mut policy = StagingPolicy::builder();
            if variant == "stager-1" {
                policy = policy.io_threads(1);
            } else if let Some(t) = threads {
                policy = policy.io_threads(t);
            }
            if variant == "stager-uncoalesced" {
                policy = policy.coalesce_below(0);
            }
            // As the `stage` command runs it: the library's one entry point, with its defaults
            // (small tensors carved from shared blocks).
            let host = HostOptions::default().direct_io(variant == "stager-direct");
            let load = Loader::new()
                .backend(Backend::Host(host))
                .policy(policy.build()?)
                .open(&dir)?;
            let report = load_all(load)?;
            result.peak_host_bytes = Some(report.peak_host_bytes);
            result.peak_device_bytes = Some(report.peak_device_bytes);
        }
        other => return Err(format!("unknown variant {other}").into()),
    }
    result.seconds = start.elapsed().as_secs_f64();
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// Loads every tensor, keeping them all until the end, and returns the report.
fn load_all(mut load: Load<'_>) -> Result<LoadReport, BoxError> {
    let mut kept = Vec::new();
    for tensor in load.by_ref() {
        kept.push(tensor?);
    }
    Ok(load.report())
}

/// Runs a command, returning its stdout and peak RSS in KiB (from `wait4`).
/// Touches and frees `bytes` of memory, so the next process's fresh memory is backed by the
/// hypervisor again. On a VM with free page reporting (virtio-balloon), memory freed and left
/// idle for a few seconds is handed back to the host, and the next process to touch it pays
/// the host's faults: on the development VM `stage` loaded 2 GiB at 0.7-0.8 GB/s after 10 s
/// idle and 5.8-6.2 GB/s back to back. Without this, which variant pays depends on timing.
fn touch_memory(bytes: u64) -> Result<(), BoxError> {
    let len = usize::try_from(bytes)?;
    let mut memory = HostBytes::zeroed(len, 4096).ok_or("allocation failed")?;
    for page in memory.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&memory);
    Ok(())
}

fn run_measured(command: &mut Command) -> Result<(String, u64), BoxError> {
    let out_file = tempfile::tempfile()?;
    let mut child = command
        .stdout(out_file.try_clone()?)
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = libc::pid_t::try_from(child.id())?;
    let mut status = 0;
    // SAFETY: `rusage` is plain old data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own un-waited child; the pointers are to valid locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if waited != pid {
        let _ = child.kill();
        return Err(format!("wait4 failed: {}", std::io::Error::last_os_error()).into());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!("{command:?} failed with status {status}").into());
    }
    let mut out = String::new();
    use std::io::{Read, Seek};
    let mut f = out_file;
    f.rewind()?;
    f.read_to_string(&mut out)?;
    Ok((out, u64::try_from(usage.ru_maxrss)?))
}

fn small_layout(total: u64) -> Vec<Vec<TensorSpec>> {
    // Sizes cycle over 4 KiB .. 1 MiB (F16), odd element counts included, in shards of ~512 MiB.
    let sizes = [
        2048usize, 3000, 16384, 65536, 131_072, 262_144, 524_288, 77_777,
    ];
    let mut shards = vec![Vec::new()];
    let (mut in_shard, mut total_written, mut i) = (0u64, 0u64, 0usize);
    while total_written < total {
        let elements = sizes[i % sizes.len()];
        let bytes = 2 * elements as u64;
        if in_shard + bytes > 512 << 20 {
            shards.push(Vec::new());
            in_shard = 0;
        }
        if let Some(last) = shards.last_mut() {
            last.push(TensorSpec::new(format!("t.{i}"), Dtype::F16, &[elements]));
        }
        in_shard += bytes;
        total_written += bytes;
        i += 1;
    }
    shards
}

fn ensure_checkpoint(dir: &Path, layout: &str, size: u64) -> Result<(), BoxError> {
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let shards = match layout {
        "large" => synthetic_specs_with(size, Dtype::F16),
        _ => small_layout(size),
    };
    eprintln!(
        "writing {layout} checkpoint of {} MiB to {} ...",
        size >> 20,
        dir.display()
    );
    write_sharded_streaming(dir, &shards, 42)?;
    std::fs::write(marker, b"")?;
    Ok(())
}

/// What every measurement of a run shares: the bench binary run as the child, its threads,
/// how many times each variant runs, and whether memory is left cold between runs.
struct Runs<'a> {
    exe: &'a Path,
    threads: Option<&'a str>,
    repeat: usize,
    cold_memory: bool,
}

fn parent(args: &[String]) -> Result<(), BoxError> {
    let sizes: Vec<u64> = arg_value(args, "--sizes")
        .unwrap_or_else(|| "2GiB".into())
        .split(',')
        .map(parse_size)
        .collect::<Result<_, _>>()?;
    let root = PathBuf::from(arg_value(args, "--dir").unwrap_or_else(|| "/tmp/stage-bench".into()));
    let repeat: usize = arg_value(args, "--repeat").map_or(Ok(3), |r| r.parse())?;
    let layouts = arg_value(args, "--layouts").unwrap_or_else(|| "large,small".into());
    let threads = arg_value(args, "--threads");
    let only = arg_value(args, "--variants");
    let cold_memory = args.iter().any(|a| a == "--cold-memory");
    let json = args.iter().any(|a| a == "--json");
    let exe = std::env::current_exe()?;
    let python_ok = Command::new("python3")
        .args(["-c", "import safetensors.numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let runs = Runs {
        exe: &exe,
        threads: threads.as_deref(),
        repeat,
        cold_memory,
    };

    let mut rows = Vec::new();
    for &size in &sizes {
        for layout in layouts.split(',') {
            let dir = root.join(format!("{layout}-{}mib", size >> 20));
            ensure_checkpoint(&dir, layout, size)?;
            let checkpoint = Checkpoint::open(&dir)?;
            let tensor_bytes = checkpoint.total_bytes();
            let files = files_of(&dir)?;
            // Warm the page cache.
            run_measured(
                Command::new(&exe)
                    .args(["--variant", "seq-reused", "--checkpoint"])
                    .arg(&dir),
            )?;
            let mut results: Vec<Measured> = Vec::new();
            for variant in VARIANTS {
                if only
                    .as_ref()
                    .is_some_and(|o| !o.split(',').any(|v| v == variant))
                {
                    continue;
                }
                if variant == "python-numpy" && !python_ok {
                    eprintln!("python-numpy: skipped (safetensors.numpy not importable)");
                    continue;
                }
                results.push(measure(&runs, variant, &dir, &files, tensor_bytes)?);
            }
            let rate = |name: &str| {
                results
                    .iter()
                    .find(|r| r.variant == name)
                    .map(|r| tensor_bytes as f64 / r.seconds / 1e9)
            };
            let (fresh, python) = (rate("fresh-memory"), rate("python-numpy"));
            for Measured {
                variant,
                seconds: secs,
                rss_kib: rss,
                host,
                device,
            } in results
            {
                let gbps = tensor_bytes as f64 / secs / 1e9;
                rows.push(Row {
                    size: format!("{} MiB", size >> 20),
                    layout: format!("{layout} ({} tensors)", checkpoint.tensors().len()),
                    variant,
                    gb_per_s: (gbps * 100.0).round() / 100.0,
                    seconds: (secs * 1000.0).round() / 1000.0,
                    vs_fresh_memory: fresh.map(|f| (gbps / f * 100.0).round() / 100.0),
                    vs_python_numpy: python.map(|p| (gbps / p * 100.0).round() / 100.0),
                    peak_rss_mib: rss / 1024,
                    peak_host_bytes: host,
                    peak_device_bytes: device,
                });
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    print_table(&rows, repeat);
    Ok(())
}

/// Runs `variant` on the checkpoint `dir` (its `files`, `tensor_bytes` bytes of tensors)
/// `runs.repeat` times, each in a child process (memory touched first, unless it is to stay
/// cold): the median time, the peak RSS of all runs and the stager's peaks of the last.
fn measure(
    runs: &Runs<'_>,
    variant: &str,
    dir: &Path,
    files: &[PathBuf],
    tensor_bytes: u64,
) -> Result<Measured, BoxError> {
    let mut seconds = Vec::new();
    let (mut rss, mut host, mut device) = (0u64, None, None);
    for _ in 0..runs.repeat {
        let mut command = if variant == "python-numpy" {
            let mut c = Command::new("python3");
            c.args([
                "-c",
                "import json, sys, time\nfrom safetensors.numpy import load_file\nt = time.perf_counter()\nkept = [load_file(f) for f in sys.argv[1:]]\nprint(json.dumps({'seconds': time.perf_counter() - t, 'peak_host_bytes': None, 'peak_device_bytes': None}))",
            ]);
            c.args(files);
            c
        } else {
            let mut c = Command::new(runs.exe);
            c.args(["--variant", variant, "--checkpoint"]).arg(dir);
            if let Some(t) = runs.threads {
                c.args(["--threads", t]);
            }
            c
        };
        if !runs.cold_memory {
            // In a process of its own: the parent's peak RSS would be inherited by
            // every child it forks, and counted in the child's.
            let status = Command::new(runs.exe)
                .args(["--touch", &tensor_bytes.to_string()])
                .status()?;
            if !status.success() {
                return Err("touching memory failed".into());
            }
        }
        let (out, kib) = run_measured(&mut command)?;
        let child: ChildResult = serde_json::from_str(out.trim())?;
        seconds.push(child.seconds);
        rss = rss.max(kib);
        host = child.peak_host_bytes;
        device = child.peak_device_bytes;
    }
    seconds.sort_by(f64::total_cmp);
    let median = seconds[seconds.len() / 2];
    Ok(Measured {
        variant: variant.to_owned(),
        seconds: median,
        rss_kib: rss,
        host,
        device,
    })
}

/// The rows as a Markdown table, times the median of `repeat` runs.
fn print_table(rows: &[Row], repeat: usize) {
    println!(
        "| size | layout | variant | GB/s | s (median of {repeat}) | vs fresh-memory | vs python-numpy | peak RSS MiB | stager peak host / device MiB |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.2}"));
    for r in rows {
        let held = match (r.peak_host_bytes, r.peak_device_bytes) {
            (Some(h), Some(d)) => format!("{} / {}", h >> 20, d >> 20),
            _ => String::new(),
        };
        println!(
            "| {} | {} | {} | {:.2} | {:.3} | {} | {} | {} | {} |",
            r.size,
            r.layout,
            r.variant,
            r.gb_per_s,
            r.seconds,
            opt(r.vs_fresh_memory),
            opt(r.vs_python_numpy),
            r.peak_rss_mib,
            held
        );
    }
}
