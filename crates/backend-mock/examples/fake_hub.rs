//! The fake Hugging Face Hub (`backend_mock::hub::FakeHub`) as a process: the one stand-in Hub
//! of the Rust tests, the Python tests (`crates/staging-py/tests/fakehub.py` drives it), the
//! benchmarks (`benches/bench_hub.py`) and the GPU check.
//!
//! ```text
//! cargo run --release -p backend-mock --example fake_hub -- \
//!     [--repo ORG/NAME=DIR]... [--rate 100MB] [--ready-file F] [--control]
//! ```
//!
//! Registers each `--repo` from its directory (LFS files served from disk), caps the bytes per
//! second of both sockets together with `--rate` (`100MB`, `100MiB`, `1.5GB`, a number of
//! bytes; `none`), then prints `HF_ENDPOINT=http://127.0.0.1:PORT` and `CDN=http://...` on
//! stdout (and writes the first line to `--ready-file`, atomically). Without `--control` it
//! serves until killed. With `--control` it reads commands from stdin, one JSON object a line,
//! and answers each with one line on stdout (the table is in `backend_mock::hub::control`'s
//! docs); it stops when stdin closes, so it never outlives the process that drives it.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use backend_mock::hub::FakeHub;

/// `100MB` (decimal), `100MiB`, `1.5GB`, `800000` (bytes a second); `none`, `0`: no cap.
fn parse_rate(text: &str) -> Result<Option<u64>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("none") || text.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let bad = || format!("not a rate: {text:?} (say 100MB, 100MiB or a number of bytes)");
    let digits = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let value: f64 = text[..digits].parse().map_err(|_| bad())?;
    let unit = text[digits..].trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let (power, binary) = match unit.strip_suffix('i') {
        Some(prefix) => (prefix, true),
        None => (unit, false),
    };
    let exponent = match power {
        "" => 0,
        "k" => 1,
        "m" => 2,
        "g" => 3,
        _ => return Err(bad()),
    };
    let base: f64 = if binary { 1024.0 } else { 1000.0 };
    let bytes = value * base.powi(exponent);
    Ok((bytes >= 1.0).then_some(bytes as u64))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: fake_hub [--repo ORG/NAME=DIR]... [--rate R] [--ready-file F] [--control]";
    let mut repos = Vec::new();
    let mut rate = None;
    let mut ready = None;
    let mut control = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--repo" => {
                let spec = args.next().ok_or(usage)?;
                let (repo, dir) = spec
                    .split_once('=')
                    .ok_or_else(|| format!("--repo {spec}: say ORG/NAME=DIR"))?;
                repos.push((repo.to_owned(), PathBuf::from(dir)));
            }
            "--rate" => rate = parse_rate(&args.next().ok_or(usage)?)?,
            "--ready-file" => ready = Some(PathBuf::from(args.next().ok_or(usage)?)),
            "--control" => control = true,
            _ => return Err(format!("{arg}? {usage}").into()),
        }
    }
    let hub = FakeHub::start()?;
    for (repo, dir) in &repos {
        hub.commit_dir(repo, dir, true)
            .map_err(|e| format!("--repo {repo}={}: {e}", dir.display()))?;
    }
    hub.set_rate(rate);
    let line = format!("HF_ENDPOINT={}", hub.endpoint());
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}\nCDN={}", hub.cdn())?;
    out.flush()?;
    if let Some(ready) = ready {
        let mut temporary = ready.clone().into_os_string();
        temporary.push(".tmp");
        std::fs::write(&temporary, format!("{line}\n"))?;
        std::fs::rename(&temporary, &ready)?;
    }
    if !control {
        loop {
            std::thread::park();
        }
    }
    for command in std::io::stdin().lock().lines() {
        let answer = hub.control(&command?);
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_in_every_spelling() {
        assert_eq!(parse_rate("100MB"), Ok(Some(100_000_000)));
        assert_eq!(parse_rate("100MiB"), Ok(Some(100 << 20)));
        assert_eq!(parse_rate("1.5GB"), Ok(Some(1_500_000_000)));
        assert_eq!(parse_rate("800000"), Ok(Some(800_000)));
        assert_eq!(parse_rate("64k"), Ok(Some(64_000)));
        assert_eq!(parse_rate("none"), Ok(None));
        assert_eq!(parse_rate("0"), Ok(None));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10TB").is_err());
    }
}
