//! Writes every malformed checkpoint of `backend_mock::malformed` under `DIR/<case>/` and prints
//! one line per case: the case, then the paths to load, tab-separated. The Python suite loads
//! them, so both suites try the same cases without the wheel carrying the writer.
//!
//! ```text
//! cargo run -p backend-mock --example write_malformed -- DIR
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use backend_mock::malformed;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: write_malformed DIR");
        return ExitCode::FAILURE;
    };
    let mut out = std::io::stdout().lock();
    for case in malformed::MALFORMED {
        let case_dir = dir.join(case);
        if let Err(e) = std::fs::create_dir_all(&case_dir) {
            eprintln!("{}: {e}", case_dir.display());
            return ExitCode::FAILURE;
        }
        let paths = malformed::build(case, &case_dir);
        let mut line = (*case).to_owned();
        for path in paths {
            line.push('\t');
            line.push_str(&path.to_string_lossy());
        }
        if writeln!(out, "{line}").is_err() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
