//! What a load says when a URL's server cannot be reached: the transport failure in words
//! (connection refused, DNS, timeout, TLS) and the host, one short line, not object_store's
//! "Generic HTTP error ... error sending request". Each against a real socket.

use std::net::TcpListener;
use std::time::Duration;

use backend_mock::http::RangeServer;
use safetensors_staging::{Backend, ErrorKind, HostOptions, Loader, RemoteOptions};

fn loader(config: &[(&str, &str)]) -> Loader<'static> {
    let mut options = RemoteOptions::default();
    options.retry_backoff = Duration::from_millis(5);
    options.max_retries = 0;
    options.config = config
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .remote(options)
}

/// The one-line message of opening `url`.
fn message(url: &str, config: &[(&str, &str)]) -> String {
    let error = loader(config).open(url).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io, "{error}");
    let text = error.to_string();
    assert!(!text.contains("error sending request"), "{text}");
    assert!(!text.contains('\n') && text.len() < 160, "{text}");
    text
}

#[test]
fn a_closed_port_is_connection_refused_naming_host_and_port() {
    // A port just freed: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/model.safetensors");
    assert_eq!(
        message(&url, &[]),
        format!("{url}: connection refused by 127.0.0.1:{port}")
    );
}

#[test]
fn an_unknown_host_is_a_failed_dns_lookup() {
    // `.invalid` never resolves (RFC 2606).
    let url = "http://no-such-host.invalid/model.safetensors";
    assert_eq!(
        message(url, &[]),
        format!("{url}: DNS lookup of no-such-host.invalid failed (no such host?)")
    );
}

#[test]
fn a_server_that_never_answers_is_a_timeout() {
    // Accepts (the kernel's backlog) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/model.safetensors");
    assert_eq!(
        message(&url, &[("timeout", "300ms")]),
        format!("{url}: timed out talking to 127.0.0.1:{port}")
    );
    drop(silent);
}

#[test]
fn https_to_a_plain_http_server_is_a_failed_tls_handshake() {
    // The client speaks TLS (rustls with ring) to a server that answers in plain HTTP.
    let server = RangeServer::start().unwrap();
    let url = server
        .url("/model.safetensors")
        .replacen("http://", "https://", 1);
    let host = url
        .trim_start_matches("https://")
        .trim_end_matches("/model.safetensors")
        .to_owned();
    let text = message(&url, &[]);
    assert!(
        text.starts_with(&format!("{url}: TLS handshake with {host} failed: ")),
        "{text}"
    );
}
