//! A plain HTTP/1.1 server on loopback that serves objects from memory with `HEAD`, ranged
//! `GET`, `ETag` and `If-Match`, and scripted faults: the first request of each range failing
//! with 503, bodies cut short, denied paths, objects replaced while a load runs. For tests of
//! the remote reader against a real socket and a real HTTP client.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// What the server does wrong, on purpose.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// The first `GET` of each (path, range) answers 503.
    pub fail_first: bool,
    /// The first `GET` of each (path, range end) sends its headers and half its body, then
    /// closes (a client that resumes asks for the rest of the same range, which is then whole).
    pub truncate_first: bool,
    /// Every `GET` sends half its body, then closes.
    pub truncate_always: bool,
    /// Paths answered with 403.
    pub denied: HashSet<String>,
    /// Send no `ETag` (and so ignore `If-Match`).
    pub no_etag: bool,
}

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// `HEAD` or `GET`.
    pub method: String,
    /// The request path (`/dir/model.safetensors`).
    pub path: String,
    /// The byte range asked for, inclusive end as HTTP writes it.
    pub range: Option<(u64, u64)>,
    /// The status answered.
    pub status: u16,
}

#[derive(Debug, Default)]
struct State {
    objects: HashMap<String, (Arc<Vec<u8>>, String)>,
    faults: Faults,
    seen: HashSet<(String, Option<(u64, u64)>)>,
    seen_ends: HashSet<(String, Option<u64>)>,
    log: Vec<Logged>,
    versions: u64,
}

/// The server; it stops when dropped.
#[derive(Debug)]
pub struct RangeServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RangeServer {
    /// Starts a server on an ephemeral loopback port.
    pub fn start() -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let state = Arc::clone(&state);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = Arc::clone(&state);
                    std::thread::spawn(move || {
                        let _ = serve(stream, &state);
                    });
                }
            })
        };
        Ok(Self {
            addr,
            state,
            stop,
            thread: Some(thread),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `http://127.0.0.1:PORT` followed by `path` (which starts with `/`, or is empty).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Serves `bytes` at `path` under a new ETag (replacing what was there).
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        let mut state = self.state();
        state.versions += 1;
        let etag = format!("\"v{}\"", state.versions);
        state
            .objects
            .insert(path.to_owned(), (Arc::new(bytes), etag));
    }

    /// Serves every file under `dir` at `prefix/<relative path>`.
    pub fn put_dir(&self, prefix: &str, dir: &std::path::Path) -> io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                let name = entry.file_name().to_string_lossy().into_owned();
                self.put(&format!("{prefix}/{name}"), std::fs::read(entry.path())?);
            }
        }
        Ok(())
    }

    /// Stops serving `path` (404 from now on).
    pub fn remove(&self, path: &str) {
        self.state().objects.remove(path);
    }

    /// Sets the faults (and forgets which ranges were seen).
    pub fn set_faults(&self, faults: Faults) {
        let mut state = self.state();
        state.faults = faults;
        state.seen.clear();
        state.seen_ends.clear();
    }

    /// Every request answered so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state().log.clone()
    }

    /// Forgets the log.
    pub fn clear_log(&self) {
        self.state().log.clear();
    }
}

impl Drop for RangeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What one answer is.
enum Answer {
    Status(u16),
    Head {
        len: u64,
        etag: Option<String>,
    },
    Body {
        bytes: Arc<Vec<u8>>,
        range: Option<(u64, u64)>,
        etag: Option<String>,
        cut: bool,
    },
}

fn parse_range(value: &str) -> Option<(u64, u64)> {
    let (a, b) = value.trim().strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn serve(stream: TcpStream, state: &Mutex<State>) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let mut range = None;
        let mut if_match = None;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "range" => range = parse_range(value),
                    "if-match" => if_match = Some(value.trim().to_owned()),
                    _ => {}
                }
            }
        }
        let answer = {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            let first = state.seen.insert((path.clone(), range));
            let first_end = state
                .seen_ends
                .insert((path.clone(), range.map(|(_, b)| b)));
            let faults = state.faults.clone();
            let answer = match state.objects.get(&path) {
                _ if faults.denied.contains(&path) => Answer::Status(403),
                None => Answer::Status(404),
                Some((bytes, etag)) => {
                    let etag = (!faults.no_etag).then(|| etag.clone());
                    let stale =
                        matches!((&if_match, &etag), (Some(want), Some(have)) if want != have);
                    if stale {
                        Answer::Status(412)
                    } else if method == "HEAD" {
                        Answer::Head {
                            len: bytes.len() as u64,
                            etag,
                        }
                    } else if method != "GET" {
                        Answer::Status(405)
                    } else if first && faults.fail_first {
                        Answer::Status(503)
                    } else if range.is_some_and(|(a, b)| a > b || b >= bytes.len() as u64) {
                        Answer::Status(416)
                    } else {
                        Answer::Body {
                            bytes: Arc::clone(bytes),
                            range,
                            etag,
                            cut: faults.truncate_always || (first_end && faults.truncate_first),
                        }
                    }
                }
            };
            let status = match &answer {
                Answer::Status(s) => *s,
                Answer::Head { .. } => 200,
                Answer::Body { range, .. } => {
                    if range.is_some() {
                        206
                    } else {
                        200
                    }
                }
            };
            state.log.push(Logged {
                method,
                path,
                range,
                status,
            });
            answer
        };
        match answer {
            Answer::Status(status) => {
                write!(out, "HTTP/1.1 {status} Status\r\nContent-Length: 0\r\n\r\n")?;
            }
            Answer::Head { len, etag } => {
                write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n")?;
                if let Some(etag) = etag {
                    write!(out, "ETag: {etag}\r\n")?;
                }
                write!(out, "Accept-Ranges: bytes\r\n\r\n")?;
            }
            Answer::Body {
                bytes,
                range,
                etag,
                cut,
            } => {
                let total = bytes.len() as u64;
                let (a, b) = range.unwrap_or((0, total.saturating_sub(1)));
                let body = usize::try_from(a)
                    .ok()
                    .zip(usize::try_from(b).ok())
                    .and_then(|(a, b)| bytes.get(a..=b))
                    .unwrap_or(&[]);
                if range.is_some() {
                    write!(
                        out,
                        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{total}\r\n"
                    )?;
                } else {
                    write!(out, "HTTP/1.1 200 OK\r\n")?;
                }
                if let Some(etag) = etag {
                    write!(out, "ETag: {etag}\r\n")?;
                }
                write!(out, "Content-Length: {}\r\n\r\n", body.len())?;
                if cut {
                    out.write_all(&body[..body.len() / 2])?;
                    out.flush()?;
                    return Ok(()); // closes the connection mid-body
                }
                out.write_all(body)?;
            }
        }
        out.flush()?;
    }
}
