//! `stage`: load a safetensors checkpoint through the staging policy and report where every
//! tensor went.
//!
//! ```text
//! stage PATH... [--json] [--checksums] [-v] [LOAD OPTIONS]
//! stage --demo [--synthetic-size SIZE] [--keep-synthetic DIR] [--json] [--checksums] [-v] [LOAD OPTIONS]
//! stage --print-options [LOAD OPTIONS]
//!
//! LOAD OPTIONS, one flag per key of the library's `LoadOptions::specs()`:
//!       [--backend auto|host|cufile|hipfile|mock] [--device auto|cpu|cuda|cuda:N|N|hip:N]
//!       [--memory-cap SIZE] (alias --device-memory) [--select GLOB]...
//!       [--rows GLOB=START:END|GLOB=RANK/PARTS]...
//!       [--chunk-size SIZE] [--staging-size SIZE] [--headroom-min SIZE] [--headroom-divisor N]
//!       [--threads N] [--coalesce-below SIZE] [--staging-slots N] [--suballocate [BOOL]]
//!       [--direct-io [BOOL]] [--cufile-mode auto|gds|compat|posix] [--cufile-lib PATH]
//!       [--hipfile-mode auto|hipfile|posix] [--hipfile-lib PATH] [--hip-lib PATH]
//!       [--concurrency N] [--range-size SIZE] [--retries N] [--bandwidth SIZE]
//!       [--store-option KEY=VALUE]... [--allow-redirect HOST]... [--cache [BOOL]]
//!       [--cache-dir PATH]
//! ```
//!
//! A PATH may be an `s3://`, `gs://`, `az://` or `http(s)://` URL (a prefix stands for a
//! directory), configured by each cloud's environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
//! ...) and `--store-option`; or a model on the Hugging Face Hub, `hf://org/name[@revision]
//! [/path]`, streamed while it is written into the Hugging Face cache (`HF_ENDPOINT`,
//! `HF_TOKEN`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE` as `huggingface_hub` reads them).
//!
//! With no argument it prints its help. `--demo` writes a synthetic sharded checkpoint to a
//! temporary directory, loads it and removes it. Every loaded tensor is kept until the load ends,
//! as a model loader would. Exit 0 on success (also when whoever reads stdout stops early);
//! otherwise one line on stderr (`-v` adds the details), with `--json` also
//! `{"error": {...}}` on stdout, and exit 1. Everything is decided by the library
//! (`LoadOptions`, `Loader`); this file only spells flags and prints.

mod output;

use std::error::Error as StdError;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
#[cfg(feature = "mock")]
use safetensors_staging::ErrorKind;
use safetensors_staging::{Load, LoadOptions, Prepared};
use staging_cli::parse_size;
use staging_core::io_words;

use output::{Closed, Printer};

type BoxError = Box<dyn StdError + Send + Sync>;

/// Load a safetensors checkpoint onto a device and report where every tensor went.
///
/// The load options (under "Load options") are the library's keys, the same as Python's
/// keywords and C's `stg_config_set`; their values go through the library's one parser.
#[derive(Debug, Parser)]
#[command(name = "stage", version, arg_required_else_help = true)]
struct Args {
    // The help as an attribute, not a doc comment: rustdoc would read `[/path]` as a link.
    #[arg(
        help = "A checkpoint directory, an index file, safetensors files, a URL (s3://, gs://, \
                az://, http(s)://), or a model on the Hugging Face Hub \
                (hf://org/name[@revision][/path])"
    )]
    paths: Vec<PathBuf>,
    /// Write a synthetic sharded checkpoint (Qwen-like, --synthetic-size) to a temporary
    /// directory, load it and remove it: a first run that needs no model.
    #[arg(long, conflicts_with = "paths")]
    demo: bool,
    /// Size of the --demo checkpoint [default: 1GiB].
    #[arg(long, value_parser = parse_size, conflicts_with = "paths")]
    synthetic_size: Option<u64>,
    /// Write the --demo checkpoint into this directory and keep it (for benchmarks and docs).
    #[arg(long, conflicts_with = "paths")]
    keep_synthetic: Option<PathBuf>,
    /// Print only the JSON report on stdout (on failure `{"error": {...}}`).
    #[arg(long)]
    json: bool,
    /// Read every tensor back from where it landed and add its SHA-256 to the report.
    #[arg(long)]
    checksums: bool,
    /// Also print the backends passed over and an error's details.
    #[arg(short, long)]
    verbose: bool,
    /// Print the load options the flags give, as `key = value` lines, and exit, loading
    /// nothing.
    #[arg(long)]
    print_options: bool,
}

impl Args {
    /// Whether a synthetic checkpoint is asked for (`--synthetic-size` and `--keep-synthetic`
    /// only make sense with one, so either implies `--demo`).
    fn demo(&self) -> bool {
        self.demo || self.synthetic_size.is_some() || self.keep_synthetic.is_some()
    }
}

fn main() -> ExitCode {
    let matches = match staging_cli::with_load_options(Args::command()).try_get_matches() {
        Ok(matches) => matches,
        Err(e) => command_line_error(e),
    };
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => command_line_error(e),
    };
    let result = staging_cli::load_options(&matches)
        .map_err(BoxError::from)
        .and_then(|options| run(&args, &options));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Closed>() => ExitCode::SUCCESS,
        Err(e) => {
            let failure = output::Failure::of(e.as_ref());
            if args.json {
                // Best effort: stdout may be closed too; the exit status says it failed.
                let _ = failure.print_json();
            }
            // A closed stderr leaves nothing to tell; the exit status still says it failed.
            let _ = failure.print_human(args.verbose);
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, options: &LoadOptions) -> Result<(), BoxError> {
    if args.print_options {
        let _ = write!(std::io::stdout(), "{}", options.describe());
        return Ok(());
    }
    if args.paths.is_empty() && !args.demo() {
        return Err(output::Failure::usage(
            "no checkpoint given: name a PATH (a file, a directory, an index or a URL), or --demo for a synthetic one",
        )
        .into());
    }
    // The backend first: a machine that cannot run it fails before a byte is written.
    let loader = options.loader()?;
    let prepared = match args.paths.first() {
        Some(first) => loader.prepare_for(first)?,
        None => loader.prepare()?,
    };
    if let (Some(reason), false) = (prepared.mode_reason(), args.json) {
        // Said on every run (not behind -v): a GPU load that reads through the POSIX path is
        // several times slower than one through GPUDirect Storage.
        let _ = writeln!(
            std::io::stderr(),
            "{}: using the POSIX path: {reason}",
            prepared.backend_name()
        );
    }
    let (load, synthetic) = open(args, prepared)?;
    let result = load_and_report(args, load);
    // The temporary checkpoint is removed after the load, and the user told so.
    if let Some(dir) = synthetic {
        let path = dir.path().to_path_buf();
        match (dir.close(), args.json) {
            (Ok(()), false) => {
                let _ = writeln!(std::io::stderr(), "removed {}", path.display());
            }
            (Ok(()), true) => {}
            (Err(e), _) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "stage: could not remove {}: {}",
                    path.display(),
                    io_words(&e)
                );
            }
        }
    }
    result
}

/// A command line clap cannot take (an unknown flag, a missing value, a conflict): clap's own
/// message and exit status 2, as every clap program; with `--json` also the error object on
/// stdout (kind `usage`). Help and version are printed as asked.
fn command_line_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind as Clap;
    let shown_as_asked = matches!(
        e.kind(),
        Clap::DisplayHelp | Clap::DisplayVersion | Clap::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !shown_as_asked && std::env::args_os().any(|arg| arg == "--json") {
        let rendered = e.render().to_string();
        let first = rendered.lines().next().unwrap_or_default();
        let message = first.strip_prefix("error: ").unwrap_or(first);
        // Best effort: clap's message on stderr and the exit status say it too.
        let _ = output::Failure::usage(message).print_json();
    }
    e.exit()
}

/// Opens the paths given, or a synthetic checkpoint written for the run.
fn open(
    args: &Args,
    mut prepared: Prepared<'static>,
) -> Result<
    (
        safetensors_staging::Load<'static>,
        Option<tempfile::TempDir>,
    ),
    BoxError,
> {
    match args.paths.as_slice() {
        [] => {
            let size = args.synthetic_size.unwrap_or(1 << 30);
            let (dir, temporary) = match &args.keep_synthetic {
                Some(dir) => {
                    std::fs::create_dir_all(dir).map_err(|e| output::Failure::io(dir, &e))?;
                    (dir.clone(), None)
                }
                None => {
                    let tmp = tempfile::Builder::new()
                        .prefix("stage-synthetic-")
                        .tempdir()
                        .map_err(|e| output::Failure::io(&std::env::temp_dir(), &e))?;
                    (tmp.path().to_path_buf(), Some(tmp))
                }
            };
            if !args.json {
                let _ = writeln!(
                    std::io::stderr(),
                    "writing a synthetic checkpoint of about {} to {} ...",
                    HumanBytes(size),
                    dir.display()
                );
            }
            write_synthetic(&dir, size)?;
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
    let written = staging_core::write::write_synthetic(dir, size, 0x5eed)
        .map_err(|e| output::Failure::io(dir, &e))?;
    for file in written.files.iter().chain([&written.index]) {
        std::fs::File::open(file)
            .and_then(|f| f.sync_all())
            .map_err(|e| output::Failure::io(file, &e))?;
    }
    Ok(())
}

fn load_and_report(
    args: &Args,
    mut load: safetensors_staging::Load<'static>,
) -> Result<(), BoxError> {
    let total = load.checkpoint().total_bytes();
    let count = load.checkpoint().tensors().len();
    let progress = if !args.json && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total);
        let style = ProgressStyle::with_template(Load::PROGRESS_TEMPLATE)?;
        bar.set_style(style.progress_chars(Load::PROGRESS_CHARS));
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
        printer.human(&report, args.verbose)
    };
    drop(kept);
    #[cfg(feature = "mock")]
    if let Some(ledger) = load.ledger() {
        let leaked = ledger.outstanding();
        if !leaked.is_empty() {
            return Err(output::Failure::new(
                ErrorKind::Internal,
                format!(
                    "mock ledger: {} buffers were never returned: {leaked:?}",
                    leaked.len()
                ),
            )
            .into());
        }
    }
    printed
}
