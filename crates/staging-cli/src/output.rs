//! What `stage` prints: the JSON report, or a table and a summary; and what it does when
//! whoever reads its stdout stops reading (ends quietly: [`Closed`]).

use std::fmt;
use std::io::{self, Write};

use indicatif::HumanBytes;
use safetensors_staging::{JsonReport, LoadReport, Tensor, TensorRecord};
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

    /// Prints the table of tensors, then the summary.
    pub(crate) fn human(self, report: &LoadReport) -> Result<(), BoxError> {
        let mut out = io::stdout().lock();
        written(print_human(&mut out, report, &self.entries).and_then(|()| out.flush()))
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

fn print_human(
    out: &mut impl Write,
    report: &LoadReport,
    tensors: &[TensorRecord],
) -> io::Result<()> {
    let name_width = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "{:<name_width$}  {:<6} {:<16} {:>12}  path",
        "name", "dtype", "shape", "bytes"
    )?;
    for t in tensors {
        let shape = format!("{:?}", t.shape);
        writeln!(
            out,
            "{:<name_width$}  {:<6} {:<16} {:>12}  {}{}{}",
            t.name,
            t.dtype,
            shape,
            t.bytes,
            t.path.as_str(),
            t.rows
                .map(|[a, b]| format!("  rows {a}..{b}"))
                .unwrap_or_default(),
            t.sha256
                .as_deref()
                .map(|h| format!("  sha256:{h}"))
                .unwrap_or_default()
        )?;
    }
    let gbps = report.bytes_per_second / 1e9;
    writeln!(out)?;
    writeln!(
        out,
        "loaded {} tensors, {} from {} files in {:.3} s: {:.2} GB/s (backend {}, mode {})",
        report.tensors,
        HumanBytes(report.bytes),
        report.files,
        report.seconds,
        gbps,
        report.backend,
        report.mode
    )?;
    for why in &report.passed_over {
        writeln!(out, "passed over: {why}")?;
    }
    writeln!(out, "{:<12} {:>8} {:>12}", "path", "tensors", "bytes")?;
    for (name, count) in [
        ("destination", report.paths.destination),
        ("device", report.paths.device),
        ("host", report.paths.host),
    ] {
        writeln!(
            out,
            "{name:<12} {:>8} {:>12}",
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
        "peak held: device {}, host {}",
        HumanBytes(report.peak_device_bytes),
        HumanBytes(report.peak_host_bytes)
    )?;
    writeln!(
        out,
        "read: {} bytes ({}) in {} requests",
        report.bytes_read,
        HumanBytes(report.bytes_read),
        report.read_requests
    )
}
