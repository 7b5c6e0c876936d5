//! Models on the Hugging Face Hub (`hf://org/name[@revision][/path]`), streamed onto the
//! device while they download, and written into the Hugging Face cache as `huggingface_hub`
//! would have written them, so every other tool finds them there.
//!
//! [`open`] does what `snapshot_download` followed by a load does, in one pass:
//!
//! 1. the revision is resolved to a commit (`GET /api/models/{repo}/revision/{rev}`), or, with
//!    `HF_HUB_OFFLINE`, read from the cache's `refs/`;
//! 2. the files at that commit are listed (`/tree/{commit}?recursive=true`) and the weights
//!    chosen as the loaders choose them: under the path given (the repository's root by
//!    default), `model.safetensors.index.json`, else `model.safetensors`, else every
//!    `*.safetensors` there in natural order;
//! 3. when the cache already holds every one of them (and the small files), the load is a
//!    local load of the snapshot: no byte of the weights goes over the network
//!    ([`Opened::Cached`]);
//! 4. else the small files a model needs beside its weights (`config.json`, the tokenizer:
//!    every file that is not a weight) are fetched into the snapshot, `refs/<revision>` is
//!    written, and the weights are read through a [`Remote`] whose store is the Hub
//!    (`store`), each byte written into the cache as it arrives (`cache`) and each file
//!    committed once its SHA-256 is the one the Hub lists ([`Opened::Streamed`]).
//!
//! Configuration is `huggingface_hub`'s environment: `HF_ENDPOINT` (a mirror), `HF_TOKEN`
//! (else `HUGGING_FACE_HUB_TOKEN`, else the token file `hf auth login` writes:
//! `HF_TOKEN_PATH`, default `$HF_HOME/token`), `HF_HUB_CACHE` (else `HUGGINGFACE_HUB_CACHE`,
//! else `$HF_HOME/hub`; `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, else
//! `~/.cache/huggingface`), `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), and the proxy
//! variables (`HTTPS_PROXY`, `NO_PROXY`). [`HubOptions::cache`] off streams without writing
//! anything; [`HubOptions::cache_dir`] puts the cache elsewhere.
//!
//! The environment is read once per load, by the entry point ([`open`], [`changes`]), into the
//! load's settings (`config`); nothing below it reads the environment.
//!
//! Built over `backend-remote`'s reader (its concurrency, bandwidth cap, interrupts, the GPU
//! backends' bounce buffers): the Hub is a store of this crate's making behind a
//! [`Remote`] ([`Remote::with_store`]), which tees the bytes it reads into the cache
//! ([`backend_remote::Tee`]); `backend-remote` knows nothing of the Hub.
//!
//! Not spoken: the Xet protocol (files the Hub stores in Xet are read through the same
//! `resolve` redirect as LFS files, which the Hub serves for every file), datasets and spaces.

// The modules, bottom up (none uses one above it): `counters` (the bytes a load counts),
// `path` (`hf://` paths), `config` (the options and the environment, read once), `api` (the
// Hub's HTTP API), `layout` (which files a load reads), `facts` (what a path opened to),
// `cache` (the Hugging Face cache, written as a load streams), `local` (loads from the cache
// alone), `connect` (the client, runtime and redirects of a load), `store` (the Hub's files as
// an object store), `load` (one load under way), then the steps of `open`: `resolve`, `plan`,
// `cached`, `stream`; and `changes`, which compares two revisions.
mod api;
mod cache;
mod cached;
mod changes;
mod config;
mod connect;
mod counters;
mod facts;
mod layout;
mod load;
mod local;
mod open;
mod path;
mod plan;
mod resolve;
mod store;
mod stream;

pub use changes::{Changes, changes, repository_path};
pub use config::{HubOptions, default_cache_dir};
pub use connect::STORAGE_HOSTS;
pub use facts::{HubFacts, Opened};
pub use open::open;
pub use path::{HubPath, is_hub, is_repo_id};

// For the links above.
#[cfg(doc)]
use backend_remote::Remote;
