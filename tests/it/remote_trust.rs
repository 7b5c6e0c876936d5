//! What a checkpoint at a URL may make the loader read, and what a load shows of a caller's
//! secrets: hostile indexes (names that climb out of their prefix once a URL parser decodes
//! them), redirects to other hosts, logins in URLs, secret store options, weak ETags, and
//! objects replaced between two loads of one `Prepared`. Each test runs against a real socket
//! (`backend_mock::http::RangeServer`, which logs every request) and a real HTTP client, and
//! asserts what the server was asked, the bytes, and the error or report text.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::time::Duration;

use backend_mock::fixtures::{Contents, TensorSpec, write_file};
use backend_mock::http::{Faults, RangeServer};
use safetensors_staging::{
    Backend, Error, HostOptions, JsonReport, Load, LoadOptions, Loader, RemoteOptions, TensorRecord,
};

fn options() -> RemoteOptions {
    let mut options = RemoteOptions::default();
    options.retry_backoff = Duration::from_millis(5);
    options.max_retries = 2;
    options
}

fn loader(options: RemoteOptions) -> Loader<'static> {
    Loader::new()
        .backend(Backend::Host(HostOptions::default()))
        .remote(options)
}

/// S3 path-style against the range server (credentials are not checked by it).
fn s3_options(server: &RangeServer) -> RemoteOptions {
    let mut options = options();
    options.config = vec![
        ("aws_endpoint".to_owned(), server.url("")),
        ("aws_access_key_id".to_owned(), "AKIDTEST".to_owned()),
        (
            "aws_secret_access_key".to_owned(),
            "s3cr3t-never-shown".to_owned(),
        ),
        ("aws_region".to_owned(), "us-east-1".to_owned()),
    ];
    options
}

/// A one-file checkpoint's bytes and contents.
fn one_file(tensors: &[(&str, usize)], seed: u64) -> (Vec<u8>, Contents) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(name, len)| TensorSpec::bytes(*name, *len))
        .collect();
    let contents = write_file(&path, &specs, seed).unwrap();
    (std::fs::read(&path).unwrap(), contents)
}

/// An index naming each tensor's shard by `shards`.
fn index(entries: &[(&str, &str)]) -> Vec<u8> {
    let map: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(tensor, shard)| ((*tensor).to_owned(), (*shard).into()))
        .collect();
    serde_json::to_vec(&serde_json::json!({ "metadata": {}, "weight_map": map })).unwrap()
}

fn drain(load: &mut Load<'_>) -> Result<Contents, Error> {
    let mut out = Contents::new();
    for tensor in load.by_ref() {
        let tensor = tensor?;
        out.insert(tensor.name().to_owned(), tensor.to_vec().unwrap());
    }
    Ok(out)
}

/// Shard names an index may not use: each climbs out of the index's prefix, or is no plain
/// object name, once a URL parser reads it.
const HOSTILE_SHARDS: &[&str] = &[
    "%2e%2e/%2e%2e/secret/model.safetensors",
    "%2E%2E/%2E%2E/secret/model.safetensors",
    "..%2f..%2fsecret/model.safetensors",
    "%2e%2e%2f%2e%2e%2fsecret%2fmodel.safetensors",
    "..\\..\\secret\\model.safetensors",
    "../../secret/model.safetensors",
    "./../../secret/model.safetensors",
    "/secret/model.safetensors",
    "a/\u{0}/../../../secret/model.safetensors",
    "a\n/../../../secret/model.safetensors",
];

#[test]
fn an_index_never_reaches_outside_its_prefix_over_http() {
    let server = RangeServer::start().unwrap();
    let (secret, _) = one_file(&[("secret", 64)], 1);
    server.put("/secret/model.safetensors", secret);
    for shard in HOSTILE_SHARDS {
        server.put(
            "/models/a/model.safetensors.index.json",
            index(&[("secret", shard)]),
        );
        server.clear_log();
        let url = server.url("/models/a/model.safetensors.index.json");
        let error = loader(options()).open(&url).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("invalid index") && text.contains("shard path"),
            "{shard}: {text}"
        );
        // Nothing outside the prefix was asked for: not the secret, nor anything else.
        let log = server.log();
        assert!(
            log.iter().all(|l| l.path.starts_with("/models/a/")),
            "{shard}: {log:#?}"
        );
    }
}

#[test]
fn an_index_never_reaches_outside_its_prefix_in_s3_and_the_keys_stay_unsigned_for_it() {
    let server = RangeServer::start().unwrap();
    let (secret, _) = one_file(&[("secret", 64)], 1);
    server.put("/bkt/secret/model.safetensors", secret);
    for shard in HOSTILE_SHARDS {
        server.put(
            "/bkt/models/a/model.safetensors.index.json",
            index(&[("secret", shard)]),
        );
        server.clear_log();
        let error = loader(s3_options(&server))
            .open("s3://bkt/models/a/model.safetensors.index.json")
            .unwrap_err();
        assert!(error.to_string().contains("shard path"), "{shard}: {error}");
        let log = server.log();
        assert!(
            log.iter().all(|l| l.path.starts_with("/bkt/models/a/")),
            "{shard}: {log:#?}"
        );
    }
}

#[test]
fn shard_names_are_object_names_and_the_report_names_the_object_read() {
    // A name with a space and a '?' is a plain object name: it is read as that key (the
    // server sees it percent-encoded), and the report names it by the URL that reads it.
    let server = RangeServer::start().unwrap();
    let (shard, contents) = one_file(&[("w", 4096)], 2);
    server.put("/models/a/shard%20one%3F.safetensors", shard);
    server.put(
        "/models/a/model.safetensors.index.json",
        index(&[("w", "shard one?.safetensors")]),
    );
    let mut load = loader(options())
        .open(server.url("/models/a/model.safetensors.index.json"))
        .unwrap();
    let file = load.checkpoint().files()[0].path.display().to_string();
    assert_eq!(file, server.url("/models/a/shard%20one%3F.safetensors"));
    assert_eq!(drain(&mut load).unwrap(), contents);
    assert!(
        server
            .log()
            .iter()
            .all(|l| l.path.starts_with("/models/a/"))
    );
}

/// A checkpoint on `a` whose file answers with a redirect to `b`.
fn redirected(a: &RangeServer, b: &RangeServer) -> Contents {
    let (bytes, contents) = one_file(&[("x", 100_000), ("y", 10)], 3);
    b.put("/elsewhere/model.safetensors", bytes);
    a.redirect(
        "/m/model.safetensors",
        &b.url("/elsewhere/model.safetensors"),
    );
    contents
}

#[test]
fn a_redirect_to_another_host_is_refused_naming_both_hosts() {
    let a = RangeServer::start().unwrap();
    // Another host: another loopback address (Linux answers the whole of 127/8).
    let b = RangeServer::start_on("127.0.0.2:0").unwrap();
    redirected(&a, &b);
    let error = loader(options())
        .open(a.url("/m/model.safetensors"))
        .unwrap_err();
    let text = error.to_string();
    let host = |s: &RangeServer| s.url("").trim_start_matches("http://").to_owned();
    assert!(text.contains("redirect refused"), "{text}");
    assert!(
        text.contains(&host(&a)) && text.contains(&host(&b)),
        "{text}"
    );
    assert!(
        b.log().is_empty(),
        "the other host was asked: {:?}",
        b.log()
    );
}

#[test]
fn a_redirect_on_the_same_host_is_followed_and_an_allowed_one_is_reported() {
    let a = RangeServer::start().unwrap();
    let (bytes, contents) = one_file(&[("x", 100_000), ("y", 10)], 4);
    a.put("/moved/model.safetensors", bytes);
    a.redirect("/m/model.safetensors", &a.url("/moved/model.safetensors"));
    let mut load = loader(options())
        .open(a.url("/m/model.safetensors"))
        .unwrap();
    assert_eq!(drain(&mut load).unwrap(), contents);
    assert!(load.report().redirects.is_empty(), "same host");

    let b = RangeServer::start_on("127.0.0.2:0").unwrap();
    let contents = redirected(&a, &b);
    let mut allowed = options();
    allowed.allow_redirects = vec!["127.0.0.2".to_owned()];
    let mut load = loader(allowed).open(a.url("/m/model.safetensors")).unwrap();
    assert_eq!(drain(&mut load).unwrap(), contents);
    let b_host = b.url("").trim_start_matches("http://").to_owned();
    assert_eq!(
        load.report().redirects,
        [format!("{} -> {b_host}", a.url("/m/model.safetensors"))]
    );
    assert!(b.log().iter().any(|l| l.method == "GET"));
    // The JSON report says so too.
    let json = serde_json::to_value(load.report()).unwrap();
    assert_eq!(
        json["redirects"][0].as_str().unwrap(),
        load.report().redirects[0]
    );
}

#[test]
fn a_login_in_an_http_url_is_sent_to_its_host_only_and_shown_nowhere() {
    let a = RangeServer::start().unwrap();
    let b = RangeServer::start_on("127.0.0.2:0").unwrap();
    let (bytes, contents) = one_file(&[("x", 5000)], 5);
    a.put("/private/model.safetensors", bytes);
    let url = a
        .url("/private/model.safetensors")
        .replace("http://", "http://alice:pa%20ss@");
    let mut load = loader(options()).open(&url).unwrap();
    assert_eq!(drain(&mut load).unwrap(), contents);
    // Basic authentication of alice:"pa ss", on every request.
    let log = a.log();
    assert!(!log.is_empty());
    assert!(
        log.iter()
            .all(|l| l.authorization.as_deref() == Some("Basic YWxpY2U6cGEgc3M=")),
        "{log:#?}"
    );
    // Nothing the load shows carries the login.
    let files: Vec<String> = load
        .checkpoint()
        .files()
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    assert_eq!(files, [a.url("/private/model.safetensors")]);
    let records: Vec<TensorRecord> = load
        .checkpoint()
        .tensors()
        .iter()
        .map(|t| TensorRecord::new(t, safetensors_staging::StagingPath::Device))
        .collect();
    let json = serde_json::to_string(&JsonReport {
        report: load.report(),
        tensor_list: records,
    })
    .unwrap();
    assert!(
        !json.contains("alice") && !json.contains("pa%20ss"),
        "{json}"
    );

    // An error names the URL without it.
    let missing = url.replace("model.safetensors", "missing.safetensors");
    let error = loader(options()).open(&missing).unwrap_err().to_string();
    assert!(error.contains("missing.safetensors"), "{error}");
    assert!(
        !error.contains("alice") && !error.contains("pa%20ss"),
        "{error}"
    );

    // A redirect to another host (allowed) does not carry the login there.
    redirected(&a, &b);
    let mut allowed = options();
    allowed.allow_redirects = vec!["*".to_owned()];
    let url = a
        .url("/m/model.safetensors")
        .replace("http://", "http://alice:pw@");
    let mut load = loader(allowed).open(&url).unwrap();
    drain(&mut load).unwrap();
    assert!(!b.log().is_empty());
    assert!(
        b.log().iter().all(|l| l.authorization.is_none()),
        "{:?}",
        b.log()
    );
}

#[test]
fn a_login_in_a_cloud_url_is_refused_without_showing_it() {
    for url in [
        "s3://AKID:topsecret@bucket/model",
        "gs://user:topsecret@bucket/model",
        "az://user:topsecret@container/model",
    ] {
        let error = loader(options()).open(url).unwrap_err().to_string();
        assert!(error.contains("takes no login"), "{error}");
        assert!(!error.contains("topsecret"), "{error}");
    }
}

#[test]
fn secret_store_options_are_never_printed() {
    let mut options = LoadOptions::new();
    for (key, value) in [
        ("aws_secret_access_key", "SECRET-1"),
        ("secret_access_key", "SECRET-2"),
        ("aws_session_token", "SECRET-3"),
        ("azure_storage_sas_key", "SECRET-4"),
        ("azure_storage_account_key", "SECRET-5"),
        ("google_service_account_key", "SECRET-6"),
        ("azure_client_secret", "SECRET-7"),
        ("some_key_no_store_knows", "SECRET-8"),
        ("aws_access_key_id", "SECRET-9"),
        ("aws_endpoint", "http://user:SECRET-10@127.0.0.1:9000"),
        ("proxy_url", "http://user:SECRET-11@proxy:3128"),
        ("aws_region", "eu-west-1"),
        ("allow_http", "true"),
    ] {
        options
            .set("store_option", &format!("{key}={value}"))
            .unwrap();
    }
    let shown = format!("{options:?} {options:#?} {:?}", options.remote_options());
    assert!(!shown.contains("SECRET"), "{shown}");
    // The settings that are no secret stay readable.
    assert!(
        shown.contains("eu-west-1") && shown.contains("allow_http"),
        "{shown}"
    );
    assert!(
        shown.contains("http://<redacted>@127.0.0.1:9000"),
        "{shown}"
    );
}

#[test]
fn weak_etags_are_no_condition_and_the_report_says_what_was_checked() {
    let server = RangeServer::start().unwrap();
    let (bytes, contents) = one_file(&[("x", 300_000), ("y", 3)], 6);
    server.put("/w/model.safetensors", bytes);
    server.set_faults(Faults {
        weak_etag: true,
        ..Faults::default()
    });
    let mut load = loader(options())
        .open(server.url("/w/model.safetensors"))
        .unwrap();
    assert_eq!(drain(&mut load).unwrap(), contents);
    assert_eq!(load.report().unchanged_by, "weak-etag+last-modified");
    let log = server.log();
    let gets: Vec<_> = log.iter().filter(|l| l.method == "GET").collect();
    assert!(!gets.is_empty());
    assert!(
        gets.iter()
            .all(|l| l.if_match.is_none() && l.if_unmodified_since.is_some() && l.status == 206),
        "{gets:#?}"
    );

    // Without Last-Modified, the size and the weak tag are all there is.
    server.set_faults(Faults {
        weak_etag: true,
        no_last_modified: true,
        ..Faults::default()
    });
    let mut load = loader(options())
        .open(server.url("/w/model.safetensors"))
        .unwrap();
    assert_eq!(drain(&mut load).unwrap(), contents);
    assert_eq!(load.report().unchanged_by, "weak-etag+size");
}

#[test]
fn a_kept_prepared_sees_an_object_replaced_between_loads() {
    let server = RangeServer::start().unwrap();
    let (first, first_contents) = one_file(&[("x", 70_000), ("y", 5)], 7);
    server.put("/r/model.safetensors", first);
    let url = server.url("/r/model.safetensors");
    let mut prepared = loader(options()).prepare_for(&url).unwrap();
    let mut load = prepared.open(&url).unwrap();
    assert_eq!(drain(&mut load).unwrap(), first_contents);
    drop(load);

    // Replaced, with other bytes and another size: the next open reads the new object.
    let (second, second_contents) = one_file(&[("x", 90_000), ("z", 9)], 8);
    server.put("/r/model.safetensors", second);
    let mut load = prepared.open(&url).unwrap();
    assert_eq!(drain(&mut load).unwrap(), second_contents);
    drop(load);

    // A checkpoint read before a replacement stays pinned: its load is refused, not mixed.
    let checkpoint = prepared.read_headers(&[&url]).unwrap();
    let (third, _) = one_file(&[("x", 90_000), ("z", 9)], 9);
    server.put("/r/model.safetensors", third);
    let mut load = prepared.open_checkpoint(checkpoint).unwrap();
    let error = drain(&mut load).unwrap_err().to_string();
    assert!(error.contains("changed during the load"), "{error}");
}

#[test]
fn a_remote_store_s_debug_shows_no_secret() {
    for (url, config) in [
        (
            "s3://bkt/x",
            vec![
                ("aws_secret_access_key", "SECRET-1"),
                ("aws_access_key_id", "AKID"),
                ("aws_session_token", "SECRET-2"),
                ("aws_region", "us-east-1"),
            ],
        ),
        (
            "az://container/x",
            vec![
                ("azure_storage_account_name", "acct"),
                ("azure_storage_account_key", "U0VDUkVULTM="),
            ],
        ),
        (
            "az://container/x",
            vec![
                ("azure_storage_account_name", "acct"),
                ("azure_storage_sas_key", "sv=2024&sig=SECRET-4"),
            ],
        ),
        ("https://alice:SECRET-5@host/x", vec![]),
    ] {
        let mut options = options();
        options.config = config
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let remote =
            safetensors_staging::remote::Remote::open(std::path::Path::new(url), &options).unwrap();
        let shown = format!("{remote:?} {remote:#?} {options:?}");
        assert!(
            !shown.contains("SECRET") && !shown.contains("U0VDUkVULTM="),
            "{url}: {shown}"
        );
    }
}

#[test]
fn a_login_in_an_endpoint_option_is_not_shown_in_errors_either() {
    // object_store's own error messages name the request's URL, built from the endpoint.
    let server = RangeServer::start().unwrap();
    let (bytes, _) = one_file(&[("x", 64)], 10);
    server.put("/bkt/denied/model.safetensors", bytes);
    server.set_faults(Faults {
        denied: ["/bkt/denied/model.safetensors".to_owned()].into(),
        ..Faults::default()
    });
    let mut options = s3_options(&server);
    options.config[0].1 = server.url("").replace("http://", "http://user:SECRET-EP@");
    let error = loader(options)
        .open("s3://bkt/denied/model.safetensors")
        .unwrap_err()
        .to_string();
    assert!(error.contains("denied/model.safetensors"), "{error}");
    assert!(error.contains("<redacted>@127.0.0.1"), "{error}");
    assert!(!error.contains("SECRET"), "{error}");
}
