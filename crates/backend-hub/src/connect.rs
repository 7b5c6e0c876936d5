//! The Hub at the endpoint a load's settings name, ready for requests: its API client (with
//! the token), the runtime that serves the API's requests and then the store's, and the
//! redirects a load follows.

use std::io;
use std::sync::Arc;

use backend_remote::{Options, OwnedRuntime, Redirects};
use staging_core::Error;

use crate::api::Api;
use crate::config::Settings;
use crate::path::{HubPath, error_at};

/// The Hugging Face Hub's own hosts, where it keeps its files: `huggingface.co`, `hf.co` and
/// their subdomains (`cdn-lfs.hf.co`, `cdn-lfs-us-1.hf.co`, `cdn-lfs.huggingface.co`,
/// `cas-bridge.xethub.hf.co`, `transfer.xethub.hf.co`, as of 2026-12): a redirect onwards from
/// the storage may go there without being allowed.
pub const STORAGE_HOSTS: [&str; 4] = ["huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co"];

/// The redirects of a Hub load: to the hosts `allowed`, and to the Hub's own
/// ([`STORAGE_HOSTS`]).
fn hub_redirects(allowed: &[String]) -> Redirects {
    let mut hosts = allowed.to_vec();
    hosts.extend(STORAGE_HOSTS.iter().map(|h| (*h).to_owned()));
    Redirects::new(backend_remote::Scheme::Http, &hosts)
}

/// The Hub at the endpoint the settings name, ready for requests.
pub(crate) struct Connection {
    pub(crate) api: Api,
    /// Serves the API's requests, and the store's.
    pub(crate) runtime: OwnedRuntime,
    /// Each redirect to another host (a file's to the storage CDN, followed by design) is in
    /// the report; onwards from there, only to hosts allowed.
    pub(crate) redirects: Arc<Redirects>,
    /// `scheme://host[:port]` of the endpoint: the store's root.
    pub(crate) root: String,
}

/// The connection a request about `what` is made through.
pub(crate) fn connect(
    what: &HubPath,
    options: &Options,
    settings: &Settings,
) -> Result<Connection, Error> {
    let endpoint = settings
        .endpoint()
        .map_err(|why| error_at(what, io::Error::new(io::ErrorKind::InvalidInput, why)))?;
    let client = hub_client(options).map_err(|e| error_at(what, e))?;
    let token = settings.token.clone();
    let redirects = Arc::new(hub_redirects(&options.allow_redirects));
    let api = Api::new(client, endpoint.clone(), token, Arc::clone(&redirects))
        .map_err(|e| error_at(what, e))?;
    let root = format!(
        "{}://{}",
        endpoint.scheme(),
        endpoint.host_str().unwrap_or_default()
    ) + &endpoint.port().map(|p| format!(":{p}")).unwrap_or_default();
    let runtime = OwnedRuntime::start().map_err(|source| Error::Resource {
        what: "the I/O runtime's 2 threads".into(),
        source,
    })?;
    Ok(Connection {
        api,
        runtime,
        redirects,
        root,
    })
}

/// The HTTP client of the Hub: no redirect followed by itself (the API follows the `resolve`
/// redirect by hand), the environment's proxies, the store's timeouts.
fn hub_client(options: &Options) -> io::Result<reqwest::Client> {
    backend_remote::install_crypto();
    reqwest::ClientBuilder::new()
        .user_agent(concat!("safetensors-staging/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(options.request_timeout)
        .connect_timeout(std::time::Duration::from_secs(10))
        .no_gzip()
        .no_brotli()
        .no_zstd()
        .no_deflate()
        .build()
        .map_err(|e| io::Error::other(format!("cannot build the HTTP client: {e}")))
}
