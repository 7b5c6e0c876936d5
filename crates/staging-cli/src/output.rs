//! What `stage` prints: the JSON report, or a table and a summary; a failure as one line (and
//! as JSON with `--json`); and what it does when whoever reads its stdout stops reading (ends
//! quietly: [`Closed`]).

use std::fmt;
use std::io::{self, Write};

use indicatif::HumanBytes;
use safetensors_staging::{ErrorKind, JsonReport, LoadReport, StagingPath, Tensor, TensorRecord};
use sha2::{Digest, Sha256};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Stdout was closed by its reader (`stage ... | head`): not a failure of the load.
#[derive(Debug)]
pub(crate) struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for Closed {}

/// A write error, with a closed pipe told apart.
fn written(result: io::Result<()>) -> Result<(), BoxError> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(Box::new(Closed)),
        other => Ok(other?),
    }
}

/// A failure as `stage` tells it: its kind, one line, the file and tensor where there are
/// some, and the details `-v` adds.
#[derive(Debug)]
pub(crate) struct Failure {
    kind: ErrorKind,
    message: String,
    file: Option<String>,
    tensor: Option<String>,
    details: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// A failure of the command's own, of `kind`.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            file: None,
            tensor: None,
            details: Vec::new(),
        }
    }

    /// A file or directory of the command's own (the demo's) could not be made, written or
    /// flushed: `PATH: why`, kind `io` (or `not-found`, `permission-denied`), naming the file.
    pub(crate) fn io(path: &std::path::Path, error: &io::Error) -> Self {
        Self {
            file: Some(path.display().to_string()),
            ..Self::new(
                ErrorKind::of_io(error, ErrorKind::Io),
                format!("{}: {}", path.display(), staging_core::io_words(error)),
            )
        }
    }

    /// The command line asks for nothing it can do.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Usage, message)
    }

    /// What `error` says: the library's kind, file, tensor and details where it is the
    /// library's error; the command's own errors are `usage`, or `io` for its files.
    pub(crate) fn of(error: &(dyn std::error::Error + Send + Sync + 'static)) -> Self {
        let message = error.to_string().replace('\n', " ");
        if let Some(own) = error.downcast_ref::<Failure>() {
            return Self {
                kind: own.kind,
                message,
                file: own.file.clone(),
                tensor: own.tensor.clone(),
                details: own.details.clone(),
            };
        }
        let library =
            |kind, file: Option<&std::path::Path>, tensor: Option<&str>, details: &[String]| Self {
                kind,
                message: message.clone(),
                file: file.map(|p| p.display().to_string()),
                tensor: tensor.map(str::to_owned),
                details: details.to_vec(),
            };
        if let Some(e) = error.downcast_ref::<safetensors_staging::Error>() {
            return library(e.kind(), e.file(), e.tensor(), e.details());
        }
        if let Some(e) = error.downcast_ref::<staging_core::Error>() {
            return library(e.kind(), e.file(), e.tensor(), &[]);
        }
        let kind = if error.downcast_ref::<io::Error>().is_some() {
            ErrorKind::Io
        } else {
            ErrorKind::Usage
        };
        Self::new(kind, message)
    }

    /// `{"error": {"kind", "message", "file", "tensor", "details"}}` on stdout.
    pub(crate) fn print_json(&self) -> io::Result<()> {
        let json = serde_json::json!({
            "error": {
                "kind": self.kind.as_str(),
                "message": self.message,
                "file": self.file,
                "tensor": self.tensor,
                "details": self.details,
            }
        });
        let mut out = io::stdout().lock();
        writeln!(out, "{json:#}")?;
        out.flush()
    }

    /// `stage: error: MESSAGE` on stderr; with `verbose` also its kind and each detail, else
    /// a pointer to `-v` where there are details.
    pub(crate) fn print_human(&self, verbose: bool) -> io::Result<()> {
        let mut err = io::stderr().lock();
        if verbose {
            writeln!(err, "stage: error: {}", self.message)?;
            writeln!(err, "  kind: {}", self.kind)?;
            for detail in &self.details {
                writeln!(err, "  {detail}")?;
            }
            Ok(())
        } else if self.details.is_empty() {
            writeln!(err, "stage: error: {}", self.message)
        } else {
            writeln!(err, "stage: error: {} (-v for details)", self.message)
        }
    }
}

/// Collects what is printed about each tensor, then prints it all.
pub(crate) struct Printer {
    checksums: bool,
    entries: Vec<TensorRecord>,
}

impl Printer {
    pub(crate) fn new(checksums: bool) -> Self {
        Self {
            checksums,
            entries: Vec::new(),
        }
    }

    /// Records a tensor (and its SHA-256, read back from where it landed, with `--checksums`).
    pub(crate) fn add(&mut self, tensor: &Tensor) -> Result<(), BoxError> {
        let meta = tensor.meta();
        let sha256 = if self.checksums {
            Some(checksum(tensor)?)
        } else {
            None
        };
        self.entries.push(TensorRecord {
            sha256,
            ..TensorRecord::new(meta, tensor.path())
        });
        Ok(())
    }

    /// Prints only the JSON report.
    pub(crate) fn json(self, report: LoadReport) -> Result<(), BoxError> {
        let json = serde_json::to_string_pretty(&JsonReport {
            report,
            tensor_list: self.entries,
        })?;
        let mut out = io::stdout().lock();
        written(writeln!(out, "{json}").and_then(|()| out.flush()))
    }

    /// Prints the table of tensors, then the summary (with `verbose`, the backends passed
    /// over).
    pub(crate) fn human(self, report: &LoadReport, verbose: bool) -> Result<(), BoxError> {
        let mut out = io::stdout().lock();
        written(print_human(&mut out, report, &self.entries, verbose).and_then(|()| out.flush()))
    }
}

/// SHA-256 of a tensor's bytes, read back from where they landed, 16 MiB at a time.
fn checksum(tensor: &Tensor) -> Result<String, BoxError> {
    let mut hasher = Sha256::new();
    if let Some(bytes) = tensor.host_bytes() {
        hasher.update(bytes);
    } else {
        let len = tensor.len();
        let mut chunk = vec![0u8; len.min(16 << 20)];
        let mut offset = 0;
        while offset < len {
            let n = chunk.len().min(len - offset);
            let piece = chunk.get_mut(..n).ok_or("a chunk outside its buffer")?;
            tensor
                .copy_to_host_at(offset, piece)
                .map_err(|e| format!("reading back: {e}"))?;
            hasher.update(&*piece);
            offset += n;
        }
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A path as the human output names it: what happened to the bytes, not the policy's terms
/// (the JSON report's `device` and `host`), which would call host memory "device" on the host
/// backend.
fn path_word(path: StagingPath) -> &'static str {
    match path {
        StagingPath::Destination => "destination",
        StagingPath::Device => "direct",
        StagingPath::Host => "staged",
        StagingPath::Mapped => "mapped",
    }
}

/// The memory a path's bytes end in, as the human output names it.
fn memory_word(path: StagingPath, report: &LoadReport) -> &'static str {
    match path {
        StagingPath::Destination => "the caller's",
        // The mock backend is the host backend behind a ledger: host memory too.
        StagingPath::Device if matches!(report.backend.as_str(), "host" | "mock") => "host",
        StagingPath::Device => "device",
        StagingPath::Host => "host",
        StagingPath::Mapped => "page cache",
    }
}

fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

fn print_human(
    out: &mut impl Write,
    report: &LoadReport,
    tensors: &[TensorRecord],
    verbose: bool,
) -> io::Result<()> {
    let name_width = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let with_rows = tensors.iter().any(|t| t.rows.is_some());
    let with_sha = tensors.iter().any(|t| t.sha256.is_some());
    let mut header = format!(
        "{:<name_width$}  {:<6} {:<16} {:>12}  {:<11}",
        "name", "dtype", "shape", "bytes", "path"
    );
    if with_rows {
        header.push_str(&format!("  {:<16}", "rows"));
    }
    if with_sha {
        header.push_str("  sha256");
    }
    writeln!(out, "{}", header.trim_end())?;
    for t in tensors {
        let shape = format!("{:?}", t.shape);
        let mut line = format!(
            "{:<name_width$}  {:<6} {:<16} {:>12}  {:<11}",
            t.name,
            t.dtype,
            shape,
            t.bytes,
            path_word(t.path)
        );
        if with_rows {
            let rows = t.rows.map(|[a, b]| format!("{a}..{b}")).unwrap_or_default();
            line.push_str(&format!("  {rows:<16}"));
        }
        if let Some(sha) = &t.sha256 {
            line.push_str(&format!("  {sha}"));
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    let gbps = report.bytes_per_second / 1e9;
    writeln!(out)?;
    writeln!(
        out,
        "loaded {}, {} from {} in {:.3} s: {:.2} GB/s (backend {}, mode {})",
        plural(report.tensors as u64, "tensor", "tensors"),
        HumanBytes(report.bytes),
        plural(report.files as u64, "file", "files"),
        report.seconds,
        gbps,
        report.backend,
        report.mode
    )?;
    if verbose {
        for why in &report.passed_over {
            writeln!(out, "passed over: {why}")?;
        }
    }
    writeln!(
        out,
        "{:<12} {:<12} {:>8} {:>12}",
        "path", "memory", "tensors", "bytes"
    )?;
    for path in [
        StagingPath::Destination,
        StagingPath::Device,
        StagingPath::Host,
        StagingPath::Mapped,
    ] {
        let count = report.paths.get(path);
        // `stage` has no destination of its own: the row only where a caller's was used; the
        // mapped row only where files were mapped (device cpu).
        if matches!(path, StagingPath::Destination | StagingPath::Mapped) && count.tensors == 0 {
            continue;
        }
        writeln!(
            out,
            "{:<12} {:<12} {:>8} {:>12}",
            path_word(path),
            memory_word(path, report),
            count.tensors,
            HumanBytes(count.bytes).to_string()
        )?;
    }
    writeln!(
        out,
        "fallbacks: {} insufficient memory, {} allocation race",
        report.fallbacks.insufficient_memory, report.fallbacks.allocation_race
    )?;
    writeln!(
        out,
        "peak held: {} of {} memory (direct), {} of host memory (staged)",
        HumanBytes(report.peak_device_bytes),
        memory_word(StagingPath::Device, report),
        HumanBytes(report.peak_host_bytes)
    )?;
    writeln!(
        out,
        "read: {} bytes ({}) in {}",
        report.bytes_read,
        HumanBytes(report.bytes_read),
        plural(report.read_requests, "request", "requests")
    )
}
