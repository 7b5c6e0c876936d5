//! # backend-remote
//!
//! Checkpoints in object storage and on HTTP servers: `s3://bucket/prefix` (S3 and
//! S3-compatible stores), `gs://`, `az://`, and `http(s)://host/path`, read through the
//! [`object_store`] crate.
//!
//! A [`Remote`] is both halves the core needs:
//!
//! - a [`Store`]: a prefix is a directory (its index if there is one, else its `.safetensors`
//!   objects in natural order) and an object is a file. Headers come with ranged `GET`s (the
//!   8-byte length, then the header), never the whole object. A plain HTTP server has no
//!   listing, so an HTTP "directory" needs its `model.safetensors.index.json` or
//!   `model.safetensors`.
//! - a [`Reader`] ([`Remote::reader`]) of host memory: each read is split into ranges of
//!   [`Options::range_size`], fetched concurrently (at most [`Options::concurrency`] requests in
//!   flight for the whole `Remote`) and streamed straight into the destination as the body
//!   arrives. Nothing is buffered beyond the body chunks in flight, so the memory held does not
//!   grow with the checkpoint. A GPU backend puts this reader behind pinned bounce buffers.
//!
//! Every request after a file's header is read is conditional on the version seen then, by the
//! strongest validator the server gives: its ETag (`If-Match`), else its `Last-Modified`
//! (`If-Unmodified-Since`), else only its size. Every response is checked too (a server may
//! ignore the condition): its size and that validator must equal the recorded ones. An object
//! replaced during the load is an error naming it; nothing read from the new object is handed
//! out. A server with neither ETag nor `Last-Modified` can only be checked by size: a
//! replacement of the same size is then not seen, and the report says so (`unchanged_by`:
//! `size`). `Last-Modified` has whole seconds: a replacement within the second of the original
//! write is invisible to it.
//!
//! Transient failures (5xx, dropped connections, a body cut short) are retried under one
//! [`RetryPolicy`] ([`Options::retry`]): at most [`Options::max_retries`] times, waiting an
//! exponential backoff with a random jitter, the waits within [`Options::retry_timeout`]; the
//! requests object_store makes are retried by it under the same numbers. With an ETag, a body
//! cut short resumes from where it stopped,
//! conditional on the same ETag. Without one, a cut body is never resumed (the rest could come
//! from another version): its whole range is asked for again, conditional and checked like the
//! first, at most [`Options::max_retries`] times.
//!
//! Calls block the calling thread until their requests are done, on a runtime of the `Remote`'s
//! own: from a plain thread, or from a blocking thread of the caller's async runtime
//! (`tokio::task::spawn_blocking`); a call from an async task (a runtime worker thread, or a
//! runtime's `block_on`) is an error, since it would stall that runtime. A `Remote` may be
//! dropped anywhere, in async code too. [`Options::interrupt`] ends a call within about 50 ms
//! of its predicate turning true (the Python door ties it to Ctrl-C), however long the server
//! takes to answer.
//!
//! Configuration is each cloud's standard environment (for S3: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`; a plain
//! `http://` endpoint is allowed because it says so), then [`Options::config`] (object_store's
//! keys, such as `aws_endpoint` or `allow_http`), which wins.

// The modules, bottom up (none uses one above it): `retry` (the one retry policy, and the one
// retry loop every retry outside object_store runs through), `options` (what a `Remote` is
// opened with; which store options are secret), `location` (URLs as store keys, and their
// redaction), `client` (the HTTP client: logins, redirects), `errors` (object_store's errors as
// `io::Error`s), `pace` (the bandwidth cap), `runtime` (the `Remote`'s own tokio runtime, and
// calls that block on it), `version` (what an object was when its header was read, and whether
// a response shows another one), `inner` (what the parts share: the store, its runtime, the
// versions recorded, the `HEAD`s answered), `fetch` (ranged, conditional `GET`s, retried
// through `retry`'s loop), `reader` (the `RemoteReader`) and `store` (the `Remote` itself and
// its `Store`: `HEAD`s, listings, the files a header is read from).
mod client;
mod errors;
mod fetch;
mod inner;
mod location;
mod options;
mod pace;
mod reader;
mod retry;
mod runtime;
mod store;
mod version;

// What a protocol built on this crate's reader needs (`backend-hub`): a store of its own
// behind a `Remote` (`Remote::with_store`), its runtime, its redirects, its errors, a tee of
// the bytes read, the retry loop its requests run through.
pub use client::{Redirects, install_crypto};
pub use errors::{StoreFailure, transport_failure};
pub use inner::{Stats, Tee};
pub use location::{REDACTED, Scheme, redacted, redacted_path, redacted_text};
/// The trait of object stores, for a caller's own ([`Remote::open_with`]).
pub use object_store::ObjectStore;
pub use options::{Interrupt, Options, is_secret_option, redacted_options};
pub use reader::RemoteReader;
pub use retry::{
    Attempt, MAX_BACKOFF, RetryContext, RetryError, RetryPolicy, transient_status,
    transient_transport,
};
pub use runtime::OwnedRuntime;
pub use store::Remote;
pub use version::{Object, Validator};

// The core's traits, for the links above.
#[cfg(doc)]
use staging_core::{Reader, Store};
