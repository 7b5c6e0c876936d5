//! Serves the files of a directory over plain HTTP from memory (HEAD, ranged GET, ETag): a
//! stand-in for an S3 endpoint with path-style URLs that is not itself the bottleneck, for the
//! GPU check's remote rows (`scripts/gpu_check.py --range-serve`), where nginx may not be
//! installed; the remote benchmark uses nginx. Requests are not authenticated.
//!
//! ```text
//! cargo run --release -p backend-mock --example range_serve -- DIR /BUCKET/PREFIX [ADDR]
//! ```
//! prints `http://ADDR` on stdout once serving, and serves until killed.

use std::io::Write;

use backend_mock::http::RangeServer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(prefix)) = (args.next(), args.next()) else {
        return Err("usage: range_serve DIR /BUCKET/PREFIX [ADDR]".into());
    };
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let server = RangeServer::start_on(&addr)?;
    server.put_dir(&prefix, std::path::Path::new(&dir))?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", server.url(""))?;
    out.flush()?;
    // RANGE_SERVE_LOG=1: every request on stderr, once a second.
    let verbose = std::env::var_os("RANGE_SERVE_LOG").is_some();
    let mut shown = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        if verbose {
            let log = server.log();
            for entry in log.iter().skip(shown) {
                eprintln!("{entry:?}");
            }
            shown = log.len();
        }
    }
}
