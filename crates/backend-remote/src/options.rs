//! What a [`Remote`](crate::Remote) is opened with ([`Options`]), and which of the store
//! options may hold a secret ([`is_secret_option`]), so that none is ever shown.

use std::sync::Arc;
use std::time::Duration;

use object_store::ClientConfigKey;

use crate::location::{REDACTED, redacted};
use crate::retry::RetryPolicy;

/// How a [`Remote`](crate::Remote) reads. `Debug` shows no secret: the value of every store
/// option that may hold one ([`is_secret_option`]) reads `<redacted>`.
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// The most ranged `GET`s in flight at once, over every read of the `Remote` (default 16).
    pub concurrency: usize,
    /// Bytes asked for by one ranged `GET` (default 8 MiB, as Run:ai Model Streamer uses).
    /// Against a loopback server on a 2-core VM (median of 6 loads of 1 GiB): 2 MiB 1.08 GB/s,
    /// 4 MiB 1.46, 8 MiB 1.50, 16 MiB 1.16; a far store, with latency per request, favours the
    /// larger ranges.
    pub range_size: usize,
    /// How many times a request that failed transiently is retried (default 5). With
    /// `retry_backoff` and `retry_timeout`, the one [`RetryPolicy`] of every request
    /// ([`Options::retry`]).
    pub max_retries: usize,
    /// The first retry's backoff; each later one doubles it, up to 15 s, each with a random
    /// jitter (default 100 ms).
    pub retry_backoff: Duration,
    /// The waits between the tries of one request add up to at most this (default 2 min).
    pub retry_timeout: Duration,
    /// A request that has not finished after this long fails (and is retried) (default 5 min;
    /// a ranged `GET` of 8 MiB takes well under a second on any working link).
    pub request_timeout: Duration,
    /// At most this many bytes per second over every request (default: no cap).
    pub bandwidth: Option<u64>,
    /// object_store configuration keys and values (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `allow_http`, `google_service_account`, `azure_storage_account_name`,
    /// ...), applied after the environment.
    pub config: Vec<(String, String)>,
    /// Asked every 50 ms while a call waits on the network: once it says true, the call ends
    /// with an error, "interrupted" (default: none).
    pub interrupt: Option<Interrupt>,
    /// Hosts a redirect may lead to besides the one asked for: a host (`cdn.example.com`),
    /// `*.domain` (its hosts) or `*` (any). A redirect on the same host, or between two hosts
    /// of one cloud's own domain (`*.amazonaws.com`, `*.googleapis.com`,
    /// `*.core.windows.net`), needs none; any other is refused with an error naming both hosts
    /// (default: none).
    pub allow_redirects: Vec<String>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("concurrency", &self.concurrency)
            .field("range_size", &self.range_size)
            .field("max_retries", &self.max_retries)
            .field("retry_backoff", &self.retry_backoff)
            .field("retry_timeout", &self.retry_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("bandwidth", &self.bandwidth)
            .field("config", &redacted_options(&self.config))
            .field("interrupt", &self.interrupt)
            .field("allow_redirects", &self.allow_redirects)
            .finish()
    }
}

/// Whether the store option `key` may hold a secret, by the stores' own keys: `key` is parsed
/// as each store's configuration key (S3's, GCS's, Azure's, the HTTP client's: aliases and
/// prefixes as object_store takes them), and only the keys this crate knows to be settings
/// (a region, an endpoint, a timeout) are not secret. A key no store knows, and every
/// credential, token, signature or customer-held encryption key, is.
pub fn is_secret_option(key: &str) -> bool {
    use object_store::aws::AmazonS3ConfigKey as S3;
    use object_store::azure::AzureConfigKey as Az;
    use object_store::gcp::GoogleConfigKey as Gcs;
    let client = |k: &ClientConfigKey| !matches!(k, ClientConfigKey::ProxyUrl);
    let s3 = key.parse::<S3>().ok().map(|k| match k {
        S3::Client(k) => client(&k),
        S3::Bucket
        | S3::Region
        | S3::DefaultRegion
        | S3::Endpoint
        | S3::S3Endpoint
        | S3::StsEndpoint
        | S3::ImdsV1Fallback
        | S3::DisableBulkDelete
        | S3::VirtualHostedStyleRequest
        | S3::S3Express
        | S3::UnsignedPayload
        | S3::Checksum
        | S3::MetadataEndpoint
        | S3::SkipSignature
        | S3::CopyIfNotExists
        | S3::ConditionalPut
        | S3::DisableTagging
        | S3::RequestPayer => true,
        _ => false,
    });
    let gcs = key.parse::<Gcs>().ok().map(|k| match k {
        Gcs::Client(k) => client(&k),
        Gcs::Bucket | Gcs::BaseUrl | Gcs::SkipSignature => true,
        _ => false,
    });
    let azure = key.parse::<Az>().ok().map(|k| match k {
        Az::Client(k) => client(&k),
        Az::AccountName
        | Az::ContainerName
        | Az::Endpoint
        | Az::UseEmulator
        | Az::UseFabricEndpoint
        | Az::UseAzureCli
        | Az::SkipSignature
        | Az::DisableTagging
        | Az::AuthorityHost
        | Az::AuthorityId
        | Az::ClientId
        | Az::ObjectId
        | Az::MsiEndpoint
        | Az::MsiResourceId => true,
        _ => false,
    });
    let http = key.parse::<ClientConfigKey>().ok().map(|k| client(&k));
    // Public only when every store that knows the key says it is a plain setting.
    let verdicts = [s3, gcs, azure, http];
    !(verdicts.iter().any(Option::is_some) && verdicts.iter().flatten().all(|public| *public))
}

/// `options` as they may be shown: the value of a secret key ([`is_secret_option`]) replaced
/// by `<redacted>`, and a login or query in any other value's URL taken off ([`redacted`]).
pub fn redacted_options(options: &[(String, String)]) -> Vec<(String, String)> {
    options
        .iter()
        .map(|(key, value)| {
            let shown = if is_secret_option(key) {
                REDACTED.to_owned()
            } else {
                redacted(value)
            };
            (key.clone(), shown)
        })
        .collect()
}

/// A predicate that interrupts a [`Remote`](crate::Remote)'s calls ([`Options::interrupt`]).
#[derive(Clone)]
pub struct Interrupt(Arc<dyn Fn() -> bool + Send + Sync>);

impl Interrupt {
    /// Interrupts the calls once `fired` returns true (it is called from the I/O threads).
    pub fn new(fired: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(fired))
    }

    pub(crate) fn fired(&self) -> bool {
        (self.0)()
    }
}

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interrupt(..)")
    }
}

impl Options {
    /// The retry policy these options give every request.
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy {
            max_retries: self.max_retries,
            backoff: self.retry_backoff,
            timeout: self.retry_timeout,
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            concurrency: 16,
            range_size: 8 << 20,
            max_retries: 5,
            retry_backoff: Duration::from_millis(100),
            retry_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(300),
            bandwidth: None,
            config: Vec::new(),
            interrupt: None,
            allow_redirects: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_options_are_told_by_the_stores_own_keys() {
        for key in [
            "aws_secret_access_key",
            "secret_access_key",
            "aws_access_key_id",
            "aws_session_token",
            "token",
            "aws_sse_customer_key_base64",
            "google_service_account_key",
            "service_account_key",
            "google_application_credentials",
            "azure_storage_account_key",
            "access_key",
            "azure_storage_sas_key",
            "sas_token",
            "azure_client_secret",
            "azure_storage_token",
            "bearer_token",
            "proxy_url",
            "no_store_has_this_key",
        ] {
            assert!(is_secret_option(key), "{key} should be secret");
        }
        for key in [
            "aws_region",
            "region",
            "aws_endpoint",
            "endpoint",
            "aws_bucket",
            "allow_http",
            "aws_allow_http",
            "timeout",
            "connect_timeout",
            "azure_storage_account_name",
            "azure_container_name",
            "google_bucket",
            "aws_skip_signature",
        ] {
            assert!(!is_secret_option(key), "{key} is no secret");
        }
        let shown = redacted_options(&[
            ("aws_secret_access_key".into(), "abc".into()),
            ("aws_endpoint".into(), "http://u:p@h:1".into()),
        ]);
        assert_eq!(
            shown,
            [
                ("aws_secret_access_key".to_owned(), REDACTED.to_owned()),
                (
                    "aws_endpoint".to_owned(),
                    "http://<redacted>@h:1".to_owned()
                ),
            ]
        );
    }
}
