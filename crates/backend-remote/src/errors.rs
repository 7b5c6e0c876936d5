//! How an object_store error is told as an `io::Error`: its kind, its words (redacted, a
//! refused redirect's reason, a transport failure said plainly), and the errors of a store of a
//! caller's own making ([`StoreFailure`]).

use std::io;

use crate::client::RefusedRedirect;
use crate::location::redacted_text;

/// An error of a store of a caller's own making ([`Remote::with_store`]), carried through
/// object_store's error as its source: its kind is the one the load reports, and its words are
/// shown as they are (redacted).
///
/// [`Remote::with_store`]: crate::Remote::with_store
#[derive(Debug)]
pub struct StoreFailure(pub io::Error);

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StoreFailure {}

/// The `io::ErrorKind` closest to an object_store error.
pub(crate) fn kind_of(e: &object_store::Error) -> io::ErrorKind {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(failure) = error.downcast_ref::<StoreFailure>() {
            return failure.0.kind();
        }
        source = error.source();
    }
    match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        object_store::Error::InvalidPath { .. } => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    }
}

/// What an object_store error says, or what the redirect policy said when it was a refused
/// redirect (reqwest reports that one only as "error following redirect").
pub(crate) fn describe(e: &object_store::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<RefusedRedirect>() {
            return refused.to_string();
        }
        // A store's own words (the Hub's error codes, a signed URL refused) as they are.
        if let Some(failure) = error.downcast_ref::<StoreFailure>() {
            return redacted_text(&failure.to_string());
        }
        source = error.source();
    }
    if let Some(words) = transport_failure(e) {
        return words;
    }
    // object_store's messages name the request's URL, with the login of an endpoint option
    // and a query (an Azure SAS token, say) in it.
    redacted_text(&e.to_string())
}

/// `host:port` of a URL.
fn host_port(url: &url::Url) -> String {
    let name = url.host_str().unwrap_or_default();
    match url.port_or_known_default() {
        Some(port) => format!("{name}:{port}"),
        None => name.to_owned(),
    }
}

/// The first `http(s)://` URL in `text`.
fn url_in(text: &str) -> Option<url::Url> {
    let start = text.find("https://").or_else(|| text.find("http://"))?;
    let end = text[start..]
        .find(char::is_whitespace)
        .map_or(text.len(), |n| start + n);
    url::Url::parse(&text[start..end]).ok()
}

/// What kept a request from getting an answer, in words, and where: `connection refused by
/// 127.0.0.1:9`, `DNS lookup of example.invalid failed`, `timed out talking to host:443`, `TLS
/// handshake with host:443 failed: ...`; `None` when the server answered (its status says
/// what went wrong) or the cause is none of these. object_store and reqwest say all of these
/// as "error sending request".
pub fn transport_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut host = None;
    let mut words: Option<&str> = None;
    let mut tls_detail = None;
    // Words are looked for from reqwest's error down: above it, object_store's messages may
    // quote what a server answered.
    let mut below_reqwest = false;
    let mut source = Some(e);
    while let Some(error) = source {
        if let Some(request) = error.downcast_ref::<reqwest::Error>() {
            if request.status().is_some() {
                // The server answered: its status says what went wrong.
                return None;
            }
            below_reqwest = true;
            if let Some(url) = request.url() {
                host.get_or_insert_with(|| host_port(url));
            }
            if request.is_timeout() {
                words.get_or_insert("timed out");
            }
        }
        if let Some(io) = error.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::ConnectionRefused => words = Some("connection refused"),
                io::ErrorKind::ConnectionReset => words = Some("connection reset"),
                io::ErrorKind::TimedOut => words = Some("timed out"),
                _ => {}
            }
        }
        let text = error.to_string();
        // object_store drops the URL from reqwest's error but names it in its own message.
        if host.is_none() {
            host = url_in(&text).map(|url| host_port(&url));
        }
        let dns = text.contains("dns error") || text.contains("failed to lookup address");
        let tls = error.downcast_ref::<rustls::Error>().is_some()
            || text.contains("tls handshake")
            || text.contains("invalid peer certificate");
        if below_reqwest && dns {
            words = Some("dns");
        } else if below_reqwest && tls {
            words = Some("tls");
            tls_detail = Some(text);
        }
        source = error.source();
    }
    let host = host?;
    Some(match words? {
        "dns" => format!(
            "DNS lookup of {} failed (no such host?)",
            host.rsplit_once(':')
                .map_or(host.as_str(), |(name, _)| name)
        ),
        "tls" => format!(
            "TLS handshake with {host} failed: {}",
            tls_detail.unwrap_or_default()
        ),
        "connection refused" => format!("connection refused by {host}"),
        "connection reset" => format!("connection reset by {host}"),
        other => format!("{other} talking to {host}"),
    })
}

/// An object_store error as an `io::Error` of the closest kind, saying what [`describe`] says.
pub(crate) fn io_error(e: &object_store::Error) -> io::Error {
    io::Error::new(kind_of(e), describe(e))
}
