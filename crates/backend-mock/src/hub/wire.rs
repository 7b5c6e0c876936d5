//! HTTP/1.1 as both sockets speak it: a [`Request`] read from a connection (by the crate's one
//! parser, [`crate::http::read_request`], which the range server uses too), a [`Response`]
//! built by a route (the Hub's errors, S3's errors, a file or a range of it with its faults)
//! and written back under the shared rate cap, by `sendfile` where it can.

use std::io::{self, BufWriter, Write};
use std::net::TcpStream;

use serde_json::{Value, json};

use super::repo::Content;
use super::{HubFaults, Shared};
use crate::http::resolve as resolve_range;

pub(super) use crate::http::{Request, read_request};

/// A path segment, percent-decoded (`+` is not a space in a path).
pub(super) fn decode_segment(text: &str) -> String {
    crate::http::percent_decode(text, false)
}

/// A response's body.
#[derive(Debug)]
enum Body {
    Owned(Vec<u8>),
    /// `content[start..end]` of a file.
    Slice(Content, u64, u64),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Owned(bytes) => bytes.len() as u64,
            Body::Slice(_, start, end) => end - start,
        }
    }
}

/// One answer, before it is written.
#[derive(Debug)]
pub(super) struct Response {
    pub(super) status: u16,
    headers: Vec<(&'static str, String)>,
    body: Body,
    /// The range served, open ends resolved (for the log).
    pub(super) range: Option<(u64, u64)>,
    /// Send the headers and half the body, then close.
    pub(super) cut: bool,
    /// The body's byte at this index is sent XORed with 0xFF.
    corrupt: Option<u64>,
}

impl Response {
    pub(super) fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Owned(Vec::new()),
            range: None,
            cut: false,
            corrupt: None,
        }
    }

    pub(super) fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub(super) fn json(status: u16, value: &Value) -> Self {
        let mut response =
            Self::new(status).header("Content-Type", "application/json; charset=utf-8");
        response.body = Body::Owned(value.to_string().into_bytes());
        response
    }

    /// The Hub's error: `X-Error-Code`, `X-Error-Message` and `{"error": message}`.
    pub(super) fn hub_error(status: u16, code: &str, message: &str) -> Self {
        Self::json(status, &json!({ "error": message }))
            .header("X-Error-Code", code)
            .header("X-Error-Message", message)
    }

    /// S3's error document.
    pub(super) fn s3_error(status: u16, code: &str, message: &str) -> Self {
        let mut response = Self::new(status).header("Content-Type", "application/xml");
        response.body = Body::Owned(
            format!("<Error><Code>{code}</Code><Message>{message}</Message></Error>").into_bytes(),
        );
        response
    }

    /// A file's bytes, or the range of them asked for (206), or 416.
    pub(super) fn file(content: &Content, range: Option<(u64, u64)>) -> Self {
        let total = content.len();
        let Some(range) = range else {
            let mut response = Self::new(200);
            response.body = Body::Slice(content.clone(), 0, total);
            return response;
        };
        let (a, b) = resolve_range(range, total);
        if a > b || b >= total {
            let mut response = Self::new(416).header("Content-Range", format!("bytes */{total}"));
            response.range = Some((a, b));
            return response;
        }
        let mut response = Self::new(206).header("Content-Range", format!("bytes {a}-{b}/{total}"));
        response.body = Body::Slice(content.clone(), a, b + 1);
        response.range = Some((a, b));
        response
    }

    /// Applies the `corrupt` and `truncate` faults of the files at `paths` to a file body.
    pub(super) fn faulted<'a>(
        mut self,
        faults: &HubFaults,
        paths: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let Body::Slice(_, start, end) = self.body else {
            return self;
        };
        let paths: Vec<&String> = paths.into_iter().collect();
        self.cut = paths.iter().any(|p| faults.truncate.contains(*p));
        self.corrupt = paths
            .iter()
            .find_map(|p| faults.corrupt.get(*p))
            .filter(|&&at| at >= start && at < end)
            .map(|at| at - start);
        self
    }

    /// Writes the answer (only its headers to a `HEAD`); `false` if the connection must close.
    /// Each piece of the body is counted in the log entry `seq` before it is sent, so a client
    /// that has the bytes finds them counted. A file on disk goes by `sendfile` (no copy
    /// through this process) where no byte of the piece is to be corrupted.
    pub(super) fn write(
        self,
        out: &mut BufWriter<TcpStream>,
        head: bool,
        shared: &Shared,
        seq: u64,
    ) -> io::Result<bool> {
        let len = self.body.len();
        let mut text = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str(&format!("Content-Length: {len}\r\n\r\n"));
        out.write_all(text.as_bytes())?;
        if head {
            out.flush()?;
            return Ok(true);
        }
        let (content, start) = match &self.body {
            Body::Owned(bytes) => {
                shared.count_sent(seq, len);
                out.write_all(bytes)?;
                out.flush()?;
                return Ok(true);
            }
            Body::Slice(content, start, _) => (content, *start),
        };
        let sent = if self.cut { len / 2 } else { len };
        let mut buf = Vec::new();
        let mut done = 0;
        while done < sent {
            let piece = (sent - done).min(shared.piece() as u64);
            shared.throttle(piece)?;
            shared.count_sent(seq, piece);
            let at = start + done;
            let corrupt = self.corrupt.filter(|&c| c >= done && c < done + piece);
            match (content, corrupt) {
                (Content::Disk(file, _), None) => {
                    out.flush()?;
                    send_file(out.get_ref(), file, at, piece)?;
                }
                (Content::Memory(bytes), None) => {
                    let range = usize::try_from(at).map_err(io::Error::other)?
                        ..usize::try_from(at + piece).map_err(io::Error::other)?;
                    out.write_all(bytes.get(range).unwrap_or(&[]))?;
                }
                (_, corrupt) => {
                    buf.resize(usize::try_from(piece).map_err(io::Error::other)?, 0);
                    content.read(at, &mut buf)?;
                    if let Some(c) = corrupt
                        && let Some(byte) =
                            usize::try_from(c - done).ok().and_then(|i| buf.get_mut(i))
                    {
                        *byte ^= 0xFF;
                    }
                    out.write_all(&buf)?;
                }
            }
            done += piece;
        }
        out.flush()?;
        Ok(!self.cut)
    }
}

/// Sends `len` bytes of `file` from `offset` on `socket`, by `sendfile`.
fn send_file(socket: &TcpStream, file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    let mut offset = offset;
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(1 << 30)).map_err(io::Error::other)?;
        let sent = rustix::fs::sendfile(socket, file, Some(&mut offset), want)?;
        if sent == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file is shorter than when it was registered",
            ));
        }
        left -= sent as u64;
    }
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        307 => "Temporary Redirect",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        416 => "Range Not Satisfiable",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
