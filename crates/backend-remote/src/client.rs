//! The HTTP client every store of a [`Remote`](crate::Remote) sends its requests through.
//!
//! object_store's own client follows any redirect reqwest follows: ten hops, to any host, with
//! the report naming only the URL asked for. Here the same client options (object_store's keys,
//! from the environment and the store options, read back through
//! [`ClientOptions::get_config_value`]) build a reqwest client of our own whose redirect policy
//! is a decision ([`Redirects`]): a redirect stays on the host asked for (or, for an S3 or GCS
//! store, goes to that service's own storage endpoints: S3's regional REST endpoints,
//! `storage.googleapis.com`) unless the caller allowed its target; any other is refused with an
//! error naming both hosts, and every redirect followed to another host is recorded for the
//! report.
//!
//! This re-does what object_store's `ClientOptions::client()` does (that function is not
//! public): every string value is parsed as object_store parses it (booleans as `1/true/on/yes/
//! y` and `0/false/off/no/n` in any case, durations by `humantime`), and a test sets every key
//! by strings object_store takes. reqwest drops the
//! `Authorization` header on a redirect to another host, so a login given in an `http(s)://`
//! URL (sent as Basic authentication, marked sensitive) reaches only the host it was given for.
//!
//! What object_store's client does that this one does not: a DNS resolver that shuffles the
//! addresses of a host (`randomize_addresses`), and root certificates or default headers given
//! through object_store's Rust API (this crate never sets them; its callers spell options as
//! string keys, which are all read back).

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::client::{HttpClient, HttpConnector};
use object_store::{ClientConfigKey, ClientOptions};

use crate::Scheme;
use crate::location::{Login, redacted};

/// Hosts a redirect may go to besides the one asked for, and the redirects followed: the
/// allowed hosts (a host, `*.suffix`, or `*`) and, for object storage, the cloud's own storage
/// endpoints.
#[derive(Debug)]
pub struct Redirects {
    /// The kind of store: whose own storage endpoints a redirect may go to.
    scheme: Scheme,
    /// From [`Options::allow_redirects`](crate::Options::allow_redirects): a host, `*.suffix`
    /// (that domain's hosts) or `*` (any).
    allowed: Vec<String>,
    /// `URL -> host[:port]` for each redirect followed to another host.
    followed: Mutex<BTreeSet<String>>,
}

/// Whether `host` is one of the storage service's own endpoints for a store of `scheme`: S3's
/// REST endpoints (`bucket.s3.amazonaws.com`, `s3.us-west-2.amazonaws.com`,
/// `bucket.s3-us-west-2.amazonaws.com`, dual-stack ones; not the website endpoints, whose
/// redirects a bucket's owner writes), or GCS's `storage.googleapis.com`. Azure's blob service
/// does not redirect between hosts, and an HTTP server has no such endpoints.
fn storage_endpoint(scheme: Scheme, host: &str) -> bool {
    match scheme {
        Scheme::S3 => host.strip_suffix(".amazonaws.com").is_some_and(|name| {
            let labels = || name.split('.');
            labels().any(|label| label == "s3" || label.starts_with("s3-"))
                && !labels().any(|label| {
                    label.starts_with("s3-website") || label.starts_with("s3-object-lambda")
                })
        }),
        Scheme::Gcs => {
            host == "storage.googleapis.com" || host.ends_with(".storage.googleapis.com")
        }
        Scheme::Azure | Scheme::Http => false,
    }
}

/// `host`, or `host:port` when the URL names a port.
fn authority(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

impl Redirects {
    /// Redirects of a store of `scheme`, allowed to the hosts `allowed` (a host, `*.suffix`,
    /// or `*`) besides the cloud's own storage endpoints.
    pub fn new(scheme: Scheme, allowed: &[String]) -> Self {
        Self {
            scheme,
            allowed: allowed
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            followed: Mutex::default(),
        }
    }

    /// Forgets the redirects followed so far (a new checkpoint is being opened).
    pub(crate) fn forget(&self) {
        self.followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Whether a request for `from` may follow a redirect to `to` (recorded when it goes to
    /// another host); `Err` says why not.
    pub fn decide(&self, from: &url::Url, to: &url::Url) -> Result<(), String> {
        let from_host = from.host_str().unwrap_or("").to_ascii_lowercase();
        let to_host = to.host_str().unwrap_or("").to_ascii_lowercase();
        if from_host == to_host {
            return Ok(());
        }
        let same_cloud =
            storage_endpoint(self.scheme, &from_host) && storage_endpoint(self.scheme, &to_host);
        let allowed = self
            .allowed
            .iter()
            .any(|rule| match rule.strip_prefix('*') {
                Some("") => true,
                Some(suffix) if suffix.starts_with('.') => to_host.ends_with(suffix),
                _ => *rule == to_host,
            });
        if same_cloud || allowed {
            let mut followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
            followed.insert(format!("{} -> {}", redacted(from.as_str()), authority(to)));
            return Ok(());
        }
        Err(format!(
            "redirect refused: {} answered with a redirect to another host, {} (a redirect is \
             followed to another host only when allowed: the allow_redirect option, a host, \
             *.domain or *)",
            authority(from),
            authority(to)
        ))
    }

    /// Records a redirect followed to another host by design (a model's file on the Hugging
    /// Face Hub, redirected to the Hub's storage CDN).
    pub fn record(&self, from: &url::Url, to: &url::Url) {
        if from.host_str() != to.host_str() || from.port() != to.port() {
            let mut followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
            followed.insert(format!("{} -> {}", redacted(from.as_str()), authority(to)));
        }
    }

    /// `URL -> host` for each redirect followed to another host so far.
    pub fn followed(&self) -> Vec<String> {
        let followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
        followed.iter().cloned().collect()
    }
}

/// The error a refused redirect ends a request with (found again in the error's sources).
#[derive(Debug)]
pub(crate) struct RefusedRedirect(pub(crate) String);

impl std::fmt::Display for RefusedRedirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RefusedRedirect {}

/// Makes the reqwest clients of one [`Remote`](crate::Remote)'s store.
#[derive(Debug)]
pub(crate) struct Connector {
    pub(crate) redirects: Arc<Redirects>,
    pub(crate) login: Option<Login>,
}

fn config_error(key: ClientConfigKey, e: impl std::fmt::Display) -> object_store::Error {
    object_store::Error::Generic {
        store: "HTTP client",
        source: format!("{}: {e}", key.as_ref()).into(),
    }
}

/// The value of `key` in `options`, parsed.
fn value<T: FromStr>(
    options: &ClientOptions,
    key: ClientConfigKey,
) -> object_store::Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    options
        .get_config_value(&key)
        .map(|text| text.parse::<T>().map_err(|e| config_error(key, e)))
        .transpose()
}

/// A duration as object_store writes it (`30s`, `1m 30s`).
fn duration(
    options: &ClientOptions,
    key: ClientConfigKey,
) -> object_store::Result<Option<Duration>> {
    options
        .get_config_value(&key)
        .map(|text| humantime::parse_duration(&text).map_err(|e| config_error(key, e)))
        .transpose()
}

/// A boolean as object_store parses one: `1`, `true`, `on`, `yes`, `y` and `0`, `false`,
/// `off`, `no`, `n`, in any case; unset is false.
fn flag(options: &ClientOptions, key: ClientConfigKey) -> object_store::Result<bool> {
    let Some(text) = options.get_config_value(&key) else {
        return Ok(false);
    };
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" | "y" => Ok(true),
        "0" | "false" | "off" | "no" | "n" => Ok(false),
        _ => Err(config_error(key, format!("{text:?} is not a boolean"))),
    }
}

/// Installs ring as rustls's crypto provider for the process, before any HTTP client is built:
/// every store is given this connector, so every client of object_store's is built here
/// (reqwest is built without a provider of its own, to leave aws-lc-rs out of the build).
/// A provider someone else installed first (another library in a Python process) is used as it
/// is.
pub fn install_crypto() {
    // `Err` only when a provider is already installed: that one serves.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn client_error(e: reqwest::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "HTTP client",
        source: Box::new(e),
    }
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        use ClientConfigKey as K;
        let user_agent = options
            .get_config_value(&K::UserAgent)
            .unwrap_or_else(|| concat!("safetensors-staging/", env!("CARGO_PKG_VERSION")).into());
        install_crypto();
        let mut builder = reqwest::ClientBuilder::new().user_agent(user_agent);
        if let Some(login) = &self.login {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, login.basic_auth()?);
            builder = builder.default_headers(headers);
        }
        if let Some(url) = options.get_config_value(&K::ProxyUrl) {
            let mut proxy = reqwest::Proxy::all(&url).map_err(client_error)?;
            if let Some(pem) = options.get_config_value(&K::ProxyCaCertificate) {
                let certificate =
                    reqwest::tls::Certificate::from_pem(pem.as_bytes()).map_err(client_error)?;
                builder = builder.tls_certs_merge(std::iter::once(certificate));
            }
            if let Some(excludes) = options.get_config_value(&K::ProxyExcludes) {
                proxy = proxy.no_proxy(reqwest::NoProxy::from_string(&excludes));
            }
            builder = builder.proxy(proxy);
        }
        if flag(options, K::NoSystemCertificates)? {
            builder = builder.tls_certs_only(std::iter::empty());
        }
        if let Some(timeout) = duration(options, K::Timeout)? {
            builder = builder.timeout(timeout);
        }
        if let Some(timeout) = duration(options, K::ConnectTimeout)? {
            builder = builder.connect_timeout(timeout);
        }
        if let Some(timeout) = duration(options, K::ReadTimeout)? {
            builder = builder.read_timeout(timeout);
        }
        if let Some(timeout) = duration(options, K::PoolIdleTimeout)? {
            builder = builder.pool_idle_timeout(timeout);
        }
        if let Some(max) = value::<usize>(options, K::PoolMaxIdlePerHost)? {
            builder = builder.pool_max_idle_per_host(max);
        }
        if let Some(interval) = duration(options, K::Http2KeepAliveInterval)? {
            builder = builder.http2_keep_alive_interval(interval);
        }
        if let Some(timeout) = duration(options, K::Http2KeepAliveTimeout)? {
            builder = builder.http2_keep_alive_timeout(timeout);
        }
        if flag(options, K::Http2KeepAliveWhileIdle)? {
            builder = builder.http2_keep_alive_while_idle(true);
        }
        if let Some(size) = value::<u32>(options, K::Http2MaxFrameSize)? {
            builder = builder.http2_max_frame_size(Some(size));
        }
        if flag(options, K::Http1Only)? {
            builder = builder.http1_only();
        }
        if flag(options, K::Http2Only)? {
            builder = builder.http2_prior_knowledge();
        }
        if flag(options, K::AllowInvalidCertificates)? {
            builder = builder.danger_accept_invalid_certs(true);
        }
        let redirects = Arc::clone(&self.redirects);
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 10 {
                return attempt.error(RefusedRedirect("too many redirects (10)".into()));
            }
            let Some(first) = attempt.previous().first().cloned() else {
                return attempt.error(RefusedRedirect(
                    "redirect refused: the URL it came from is unknown".into(),
                ));
            };
            match redirects.decide(&first, attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(why) => attempt.error(RefusedRedirect(why)),
            }
        });
        let client = builder
            .redirect(policy)
            // Compression would change the lengths object_store checks sizes against.
            .no_gzip()
            .no_brotli()
            .no_zstd()
            .no_deflate()
            .https_only(!flag(options, K::AllowHttp)?)
            .build()
            .map_err(client_error)?;
        Ok(HttpClient::new(client))
    }
}

impl Login {
    /// The `Authorization` header of HTTP Basic authentication, marked sensitive (never shown
    /// by `Debug`, never cached by HTTP/2's header compression).
    fn basic_auth(&self) -> object_store::Result<reqwest::header::HeaderValue> {
        use base64::Engine;
        let pair = format!("{}:{}", self.user, self.password.as_deref().unwrap_or(""));
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Basic {encoded}"))
            .map_err(|e| object_store::Error::Generic {
                store: "HTTP client",
                source: Box::new(e),
            })?;
        value.set_sensitive(true);
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> url::Url {
        url::Url::parse(text).unwrap()
    }

    #[test]
    fn a_redirect_stays_on_its_host_unless_allowed() {
        let none = Redirects::new(Scheme::Http, &[]);
        let from = url("http://models.example.com/a/model.safetensors");
        assert!(
            none.decide(&from, &url("https://models.example.com/b"))
                .is_ok()
        );
        assert!(
            none.decide(&from, &url("http://MODELS.example.com:8080/b"))
                .is_ok()
        );
        let refused = none
            .decide(&from, &url("http://evil.example.net/x"))
            .unwrap_err();
        assert!(refused.contains("models.example.com"), "{refused}");
        assert!(refused.contains("evil.example.net"), "{refused}");
        assert!(none.followed().is_empty());

        // An S3 store's own endpoints; nothing else of the cloud's domain, and nothing for
        // another kind of store.
        let s3 = Redirects::new(Scheme::S3, &[]);
        let bucket = url("https://bkt.s3.amazonaws.com/k");
        for to in [
            "https://bkt.s3.eu-west-1.amazonaws.com/k",
            "https://s3.us-west-2.amazonaws.com/bkt/k",
            "https://bkt.s3-us-west-2.amazonaws.com/k",
            "https://bkt.s3.dualstack.us-east-1.amazonaws.com/k",
        ] {
            assert!(s3.decide(&bucket, &url(to)).is_ok(), "{to}");
        }
        for to in [
            "https://storage.googleapis.com/k",
            "https://internal-x.us-east-1.elb.amazonaws.com/",
            "https://bkt.s3-website-us-east-1.amazonaws.com/k",
            "https://bkt.s3-website.eu-west-1.amazonaws.com/k",
            "https://ec2.us-east-1.amazonaws.com/",
        ] {
            assert!(s3.decide(&bucket, &url(to)).is_err(), "{to}");
        }
        let website = url("https://bkt.s3-website-us-east-1.amazonaws.com/k");
        assert!(
            s3.decide(&website, &url("https://x.s3.amazonaws.com/"))
                .is_err()
        );
        let to_region = url("https://bkt.s3.eu-west-1.amazonaws.com/k");
        assert!(none.decide(&bucket, &to_region).is_err());
        let gcs = Redirects::new(Scheme::Gcs, &[]);
        let object = url("https://storage.googleapis.com/b/o");
        assert!(
            gcs.decide(&object, &url("https://b.storage.googleapis.com/o"))
                .is_ok()
        );
        assert!(
            gcs.decide(&object, &url("https://compute.googleapis.com/"))
                .is_err()
        );
        let azure = Redirects::new(Scheme::Azure, &[]);
        let blob = url("https://acct.blob.core.windows.net/c/x");
        let other = url("https://other.blob.core.windows.net/c/x");
        assert!(azure.decide(&blob, &other).is_err());

        let some = Redirects::new(Scheme::Http, &["cdn.example.net".into(), "*.hf.co".into()]);
        assert!(
            some.decide(&from, &url("http://cdn.example.net/x?sig=secret"))
                .is_ok()
        );
        assert!(
            some.decide(&from, &url("http://cas-bridge.xethub.hf.co/x"))
                .is_ok()
        );
        assert!(
            some.decide(&from, &url("http://other.example.net/x"))
                .is_err()
        );
        assert_eq!(
            some.followed(),
            [
                "http://models.example.com/a/model.safetensors -> cas-bridge.xethub.hf.co",
                "http://models.example.com/a/model.safetensors -> cdn.example.net",
            ]
        );
        assert!(
            Redirects::new(Scheme::Http, &["*".into()])
                .decide(&from, &url("http://x.y/"))
                .is_ok()
        );
        some.forget();
        assert!(some.followed().is_empty());
    }

    /// Every client key, set by a string object_store takes, builds a client: the values are
    /// parsed as object_store parses them.
    #[test]
    fn every_client_key_object_store_takes_builds_a_client() {
        use ClientConfigKey as K;
        let cases: &[(K, &[&str])] = &[
            (K::AllowHttp, &["TRUE", "yes", "1", "off", "N"]),
            (K::AllowInvalidCertificates, &["y", "0"]),
            (K::NoSystemCertificates, &["false"]),
            (K::Http1Only, &["1", "no"]),
            (K::Http2Only, &["On", "false"]),
            (K::Http2KeepAliveWhileIdle, &["YES"]),
            (K::ConnectTimeout, &["5s", "1m 30s", "250ms"]),
            (K::Timeout, &["30s"]),
            (K::ReadTimeout, &["2m"]),
            (K::PoolIdleTimeout, &["90s"]),
            (K::PoolMaxIdlePerHost, &["4"]),
            (K::Http2KeepAliveInterval, &["10s"]),
            (K::Http2KeepAliveTimeout, &["20s"]),
            (K::Http2MaxFrameSize, &["16384"]),
            (K::ProxyUrl, &["http://proxy.example:3128"]),
            (K::ProxyExcludes, &["localhost,.internal"]),
            (K::UserAgent, &["my-loader/1.0"]),
            (K::RandomizeAddresses, &["false"]),
            (K::DefaultContentType, &["application/octet-stream"]),
        ];
        let connector = Connector {
            redirects: Arc::new(Redirects::new(Scheme::Http, &[])),
            login: None,
        };
        for (key, values) in cases {
            for value in *values {
                let options = ClientOptions::new().with_config(*key, *value);
                if let Err(e) = connector.connect(&options) {
                    panic!("{key:?}={value}: {e}");
                }
            }
        }
        let bad = ClientOptions::new().with_config(K::AllowHttp, "maybe");
        assert!(connector.connect(&bad).is_err());
    }
}
