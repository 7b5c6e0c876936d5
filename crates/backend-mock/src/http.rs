//! A plain HTTP/1.1 server on loopback that serves objects from memory with `HEAD`, ranged
//! `GET`, `ETag` and `If-Match`, `Last-Modified` and `If-Unmodified-Since`, and scripted
//! faults: the first request of each range failing with 503, bodies cut short, denied paths,
//! objects replaced while a load runs, validators left out, weak ETags or conditions ignored,
//! `GET`s never answered; redirects, to wherever a test points them; and S3's `ListObjectsV2`
//! listing of a bucket path's objects (`?list-type=2`, in one page). It logs each request's
//! `Authorization` header, so a test sees which host was sent a login. For tests of the remote
//! reader against a real socket and a real HTTP client.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader, Read, Write};
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
    /// Send no `Last-Modified` (and so ignore `If-Unmodified-Since`).
    pub no_last_modified: bool,
    /// Ignore `If-Match` and `If-Unmodified-Since` (answer as if they were not sent), as a
    /// server that does not implement conditional requests does.
    pub ignore_conditions: bool,
    /// Every `GET` is read and never answered (the connection stays open until the server
    /// stops), as a server that stopped answering does.
    pub stall: bool,
    /// Send weak ETags (`W/"v1"`), and evaluate `If-Match` as RFC 9110 says: by strong
    /// comparison, which a weak tag never passes (412).
    pub weak_etag: bool,
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
    /// The request's `If-Match`, if any.
    pub if_match: Option<String>,
    /// The request's `If-Unmodified-Since`, if any, as sent.
    pub if_unmodified_since: Option<String>,
    /// The request's `Authorization`, if any.
    pub authorization: Option<String>,
}

/// One object: its bytes, its ETag and its modification time (seconds since the epoch).
#[derive(Debug, Clone)]
struct Object {
    bytes: Arc<Vec<u8>>,
    etag: String,
    modified: u64,
}

/// The modification time of the first object put: 2026-01-01T00:00:00Z; each later put is one
/// second later, so a replaced object has a later `Last-Modified` (HTTP dates have whole
/// seconds: a replacement within the same second is invisible to `Last-Modified`, as on any
/// server).
const FIRST_MODIFIED: u64 = 1_767_225_600;

#[derive(Debug, Default)]
struct State {
    objects: HashMap<String, Object>,
    faults: Faults,
    seen: HashSet<(String, Option<(u64, u64)>)>,
    seen_ends: HashSet<(String, Option<u64>)>,
    log: Vec<Logged>,
    versions: u64,
    /// Paths answered with `302 Found` and this `Location`.
    redirects: HashMap<String, String>,
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
        Self::start_on("127.0.0.1:0")
    }

    fn bind(listener: TcpListener) -> io::Result<Self> {
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
                    let stop = Arc::clone(&stop);
                    std::thread::spawn(move || {
                        let _ = serve(stream, &state, &stop);
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

    /// Serves `bytes` at `path` under a new ETag and a later `Last-Modified` (replacing what
    /// was there).
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        let mut state = self.state();
        state.versions += 1;
        let object = Object {
            bytes: Arc::new(bytes),
            etag: format!("\"v{}\"", state.versions),
            modified: FIRST_MODIFIED + state.versions,
        };
        state.objects.insert(path.to_owned(), object);
    }

    /// Starts a server on `addr` (`127.0.0.1:9000`; port 0 for any).
    pub fn start_on(addr: &str) -> io::Result<Self> {
        Self::bind(TcpListener::bind(addr)?)
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

    /// Answers every request for `path` with `302 Found` to `location` (a URL, perhaps of
    /// another server).
    pub fn redirect(&self, path: &str, location: &str) {
        self.state()
            .redirects
            .insert(path.to_owned(), location.to_owned());
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
    Redirect(String),
    Listing(String),
    Head {
        len: u64,
        validators: Validators,
    },
    Body {
        bytes: Arc<Vec<u8>>,
        range: Option<(u64, u64)>,
        validators: Validators,
        cut: bool,
    },
}

/// The validators an answer carries.
struct Validators {
    etag: Option<String>,
    last_modified: Option<String>,
}

impl Validators {
    fn write(&self, out: &mut impl Write) -> io::Result<()> {
        if let Some(etag) = &self.etag {
            write!(out, "ETag: {etag}\r\n")?;
        }
        if let Some(date) = &self.last_modified {
            write!(out, "Last-Modified: {date}\r\n")?;
        }
        Ok(())
    }
}

/// An HTTP date (`Thu, 01 Jan 2026 00:00:00 GMT`).
fn http_date(seconds: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds))
}

/// Seconds since the epoch of an HTTP date.
fn parse_http_date(text: &str) -> Option<u64> {
    httpdate::parse_http_date(text.trim())
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// A query parameter's value, percent-decoded.
pub(crate) fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v, true))
    })
}

/// `text` as one path segment: every byte but the unreserved (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
pub(crate) fn percent_encode_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `text` percent-decoded; `+` is a space in a query (`plus_is_space`), not in a path.
pub(crate) fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// S3's `ListObjectsV2` (path style: `GET /bucket?list-type=2&prefix=...&delimiter=/`) over the
/// objects whose path starts with `/bucket/`, in one page.
fn list_objects(objects: &HashMap<String, Object>, bucket_path: &str, query: &str) -> String {
    let bucket = bucket_path.trim_matches('/');
    let prefix = query_param(query, "prefix").unwrap_or_default();
    let delimiter = query_param(query, "delimiter").unwrap_or_default();
    let root = format!("/{bucket}/");
    let mut keys: Vec<(&str, usize, &str)> = objects
        .iter()
        .filter_map(|(path, object)| {
            let key = path.strip_prefix(&root)?;
            key.starts_with(&prefix)
                .then_some((key, object.bytes.len(), object.etag.as_str()))
        })
        .collect();
    keys.sort_unstable();
    let mut contents = String::new();
    let mut prefixes: Vec<String> = Vec::new();
    for (key, size, etag) in keys {
        let rest = &key[prefix.len()..];
        match rest.find(delimiter.as_str()).filter(|_| !delimiter.is_empty()) {
            Some(at) => {
                let common = format!("{prefix}{}", &rest[..at + delimiter.len()]);
                if !prefixes.contains(&common) {
                    prefixes.push(common);
                }
            }
            None => contents.push_str(&format!(
                "<Contents><Key>{}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>\
                 <ETag>{}</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>",
                xml_escape(key),
                xml_escape(etag)
            )),
        }
    }
    let common: String = prefixes
        .iter()
        .map(|p| {
            format!(
                "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
                xml_escape(p)
            )
        })
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
         <ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
         <Name>{}</Name><Prefix>{}</Prefix><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>\
         {contents}{common}</ListBucketResult>",
        xml_escape(bucket),
        xml_escape(&prefix)
    )
}

/// A `Range: bytes=a-b` header (also `a-`, to the end, and `-n`, the last n bytes) as an
/// inclusive range; `u64::MAX` stands for the object's end until its length is known.
pub(crate) fn parse_range(value: &str) -> Option<(u64, u64)> {
    let (a, b) = value.trim().strip_prefix("bytes=")?.split_once('-')?;
    match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
        (Some(a), Some(b)) => Some((a, b)),
        (Some(a), None) if b.is_empty() => Some((a, u64::MAX)),
        (None, Some(n)) if a.is_empty() => Some((u64::MAX, n)),
        _ => None,
    }
}

/// `range` with open ends resolved against an object of `len` bytes.
pub(crate) fn resolve(range: (u64, u64), len: u64) -> (u64, u64) {
    match range {
        (u64::MAX, n) => (len.saturating_sub(n), len.saturating_sub(1)),
        (a, u64::MAX) => (a, len.saturating_sub(1)),
        other => other,
    }
}

/// One request as read: its line and the headers either stand-in server (this range server and
/// the fake Hub's two sockets) looks at. Its body, if it has one, is read and dropped.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// Path and query as sent (the absolute form's scheme and host taken off).
    pub(crate) target: String,
    /// The object's path; a query (`?x-id=GetObject`, say) is not part of it.
    pub(crate) path: String,
    /// The query after `?`; `None` where the target has no `?`.
    pub(crate) query: Option<String>,
    pub(crate) range: Option<(u64, u64)>,
    pub(crate) if_match: Option<String>,
    pub(crate) if_unmodified_since: Option<String>,
    pub(crate) authorization: Option<String>,
    /// `Connection: close`, or an HTTP/1.0 request line without a later `Connection` header.
    pub(crate) close: bool,
}

impl Request {
    /// The token of `Authorization: Bearer <token>`.
    pub(crate) fn token(&self) -> Option<&str> {
        let value = self.authorization.as_deref()?;
        let (scheme, token) = value.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then_some(token.trim())
    }
}

/// Reads one request's line and headers (blank lines before the request line are skipped, as
/// RFC 9112 allows; a body of `Content-Length` bytes is read and dropped); `None` at the end of
/// the stream. The one parser of both stand-in servers.
pub(crate) fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut line = String::new();
    while line.trim().is_empty() {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let target = parts.next().unwrap_or("/");
    // The absolute form (`GET http://host:port/path`, as the AWS CRT client sends it) names
    // the same path.
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
        None => target,
    };
    let close = parts.next() == Some("HTTP/1.0");
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (target, None),
    };
    let mut request = Request {
        method,
        target: target.to_owned(),
        path: path.to_owned(),
        query,
        range: None,
        if_match: None,
        if_unmodified_since: None,
        authorization: None,
        close,
    };
    let mut body_len = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            return Ok(None);
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => request.range = parse_range(value),
                "if-match" => request.if_match = Some(value.to_owned()),
                "if-unmodified-since" => request.if_unmodified_since = Some(value.to_owned()),
                "authorization" => request.authorization = Some(value.to_owned()),
                "connection" => request.close = value.eq_ignore_ascii_case("close"),
                "content-length" => body_len = value.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    io::copy(&mut reader.take(body_len), &mut io::sink())?;
    Ok(Some(request))
}

/// What `request` is answered, from the objects, redirects and faults of `state`, where it is
/// noted as asked for (its range and its range end: `fail_first`, `truncate_first`).
fn answer_to(state: &mut State, request: &Request) -> Answer {
    let path = &request.path;
    let query = request.query.as_deref().unwrap_or("");
    let first = state.seen.insert((path.clone(), request.range));
    let first_end = state
        .seen_ends
        .insert((path.clone(), request.range.map(|(_, b)| b)));
    let faults = &state.faults;
    match state.objects.get(path) {
        _ if faults.denied.contains(path) => Answer::Status(403),
        _ if state.redirects.contains_key(path) => Answer::Redirect(state.redirects[path].clone()),
        None if request.method == "GET" && query.contains("list-type=2") => {
            Answer::Listing(list_objects(&state.objects, path, query))
        }
        None => Answer::Status(404),
        Some(object) => answer_object(object, request, faults, first, first_end),
    }
}

/// What `request` is answered for an object that exists: its conditions checked, then a `HEAD`,
/// a `GET` (whole or ranged, under the faults) or 405. `first` and `first_end`: whether this is
/// the first request of its range, and of its range end.
fn answer_object(
    object: &Object,
    request: &Request,
    faults: &Faults,
    first: bool,
    first_end: bool,
) -> Answer {
    let bytes = &object.bytes;
    let range = request.range.map(|r| resolve(r, bytes.len() as u64));
    let etag = if faults.weak_etag {
        format!("W/{}", object.etag)
    } else {
        object.etag.clone()
    };
    let validators = Validators {
        etag: (!faults.no_etag).then_some(etag),
        last_modified: (!faults.no_last_modified).then(|| http_date(object.modified)),
    };
    // Strong comparison: a weak tag on either side never matches.
    let etag_stale = matches!(
        (&request.if_match, &validators.etag),
        (Some(want), Some(have))
            if want != have || want.starts_with("W/") || have.starts_with("W/")
    );
    // RFC 9110 13.1.4: evaluated only without If-Match, and only when the server has a
    // modification date.
    let date_stale = request.if_match.is_none()
        && validators.last_modified.is_some()
        && request
            .if_unmodified_since
            .as_deref()
            .and_then(parse_http_date)
            .is_some_and(|since| object.modified > since);
    if (etag_stale || date_stale) && !faults.ignore_conditions {
        Answer::Status(412)
    } else if request.method == "HEAD" {
        Answer::Head {
            len: bytes.len() as u64,
            validators,
        }
    } else if request.method != "GET" {
        Answer::Status(405)
    } else if first && faults.fail_first {
        Answer::Status(503)
    } else if range.is_some_and(|(a, b)| a > b || b >= bytes.len() as u64) {
        Answer::Status(416)
    } else {
        Answer::Body {
            bytes: Arc::clone(bytes),
            range,
            validators,
            cut: faults.truncate_always || (first_end && faults.truncate_first),
        }
    }
}

impl Answer {
    /// The status it is sent with.
    fn status(&self) -> u16 {
        match self {
            Answer::Status(s) => *s,
            Answer::Redirect(_) => 302,
            Answer::Head { .. } | Answer::Listing(_) => 200,
            Answer::Body { range, .. } => {
                if range.is_some() {
                    206
                } else {
                    200
                }
            }
        }
    }

    /// Writes the answer and flushes it; `false` when the connection must close (a body cut
    /// short).
    fn write(self, out: &mut impl Write) -> io::Result<bool> {
        match self {
            Answer::Status(status) => {
                write!(out, "HTTP/1.1 {status} Status\r\nContent-Length: 0\r\n\r\n")?;
            }
            Answer::Redirect(location) => {
                write!(
                    out,
                    "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
                )?;
            }
            Answer::Listing(xml) => {
                write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{xml}",
                    xml.len()
                )?;
            }
            Answer::Head { len, validators } => {
                write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n")?;
                validators.write(out)?;
                write!(out, "Accept-Ranges: bytes\r\n\r\n")?;
            }
            Answer::Body {
                bytes,
                range,
                validators,
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
                validators.write(out)?;
                write!(out, "Content-Length: {}\r\n\r\n", body.len())?;
                if cut {
                    out.write_all(&body[..body.len() / 2])?;
                    out.flush()?;
                    return Ok(false); // closes the connection mid-body
                }
                out.write_all(body)?;
            }
        }
        out.flush()?;
        Ok(true)
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>, stop: &AtomicBool) -> io::Result<()> {
    // Each answer is written whole and then flushed: without TCP_NODELAY a response split over
    // several small writes waits on the client's delayed ACK (40 ms per request, measured).
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = io::BufWriter::with_capacity(64 << 10, stream);
    while let Some(request) = read_request(&mut reader)? {
        let stall = request.method == "GET" && {
            let state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.faults.stall
        };
        if stall {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            return Ok(());
        }
        let answer = {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            let answer = answer_to(&mut state, &request);
            state.log.push(Logged {
                status: answer.status(),
                method: request.method,
                path: request.path,
                range: request.range,
                if_match: request.if_match,
                if_unmodified_since: request.if_unmodified_since,
                authorization: request.authorization,
            });
            answer
        };
        if !answer.write(&mut out)? {
            return Ok(());
        }
    }
    Ok(())
}
