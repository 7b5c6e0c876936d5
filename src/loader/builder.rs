//! [`Loader`]: the builder of a load (backend, device, policy, memory cap, selection,
//! destination, and for URLs the remote options), and [`Loader::prepare`] opening its backend.

use std::fmt;
use std::path::Path;
#[cfg(any(feature = "remote", feature = "cufile"))]
use std::sync::Arc;

use staging_core::{Checkpoint, Destination, RawDestination, Selection, StagingPolicy};

use super::Load;
use super::mapped::MapDecision;
use super::prepared::Prepared;
use super::source::Source;
use crate::backend::{self, Backend, MapFiles};
use crate::device::Device;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::space::{AnyDestination, KnownSpace};

/// Builds a load: backend, device, policy, memory cap, selection, destination; then
/// [`open`](Self::open) a checkpoint.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
/// # let mut file = (header.len() as u64).to_le_bytes().to_vec();
/// # file.extend_from_slice(header);
/// # file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
/// # std::fs::write(dir.path().join("model.safetensors"), file)?;
/// use safetensors_staging::{Backend, Loader};
///
/// let mut load = Loader::new().backend(Backend::default()).open(dir.path())?;
/// for tensor in load.by_ref() {
///     let tensor = tensor?;
///     println!("{} {:?} {:?}", tensor.name(), tensor.meta().shape, tensor.path());
/// }
/// println!("{} bytes read, backends passed over: {:?}", load.report().bytes_read, load.report().passed_over);
/// # Ok(())
/// # }
/// ```
pub struct Loader<'d> {
    #[cfg(feature = "remote")]
    remote: backend_remote::Options,
    #[cfg(feature = "remote")]
    hub: backend_hub::HubOptions,
    #[cfg(feature = "remote")]
    interrupt: Option<backend_remote::Interrupt>,
    #[cfg(feature = "remote")]
    object_store: Option<Arc<dyn backend_remote::ObjectStore>>,
    #[cfg(feature = "cufile")]
    cuda: Option<backend::CallerCuda>,
    backend: Backend,
    device: Device,
    policy: StagingPolicy,
    memory_cap: Option<u64>,
    suballocate: bool,
    pub(crate) selection: Selection,
    destination: AnyDestination<'d>,
}

impl fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("backend", &self.backend)
            .field("device", &self.device)
            .field("policy", &self.policy)
            .field("memory_cap", &self.memory_cap)
            .field("suballocate", &self.suballocate)
            .field("selection", &self.selection)
            .finish()
    }
}

impl Default for Loader<'static> {
    fn default() -> Self {
        Self::new()
    }
}

impl Loader<'static> {
    /// A loader with the defaults: backend `auto`, device 0, the default policy, no memory cap,
    /// every tensor, no destination, small tensors sub-allocated.
    pub fn new() -> Self {
        Self {
            #[cfg(feature = "remote")]
            remote: backend_remote::Options::default(),
            #[cfg(feature = "remote")]
            hub: backend_hub::HubOptions::default(),
            #[cfg(feature = "remote")]
            interrupt: None,
            #[cfg(feature = "remote")]
            object_store: None,
            #[cfg(feature = "cufile")]
            cuda: None,
            backend: Backend::default(),
            device: Device::Auto,
            policy: StagingPolicy::default(),
            memory_cap: None,
            suballocate: true,
            selection: Selection::all(),
            destination: AnyDestination::None,
        }
    }
}

impl<'d> Loader<'d> {
    /// The backend (default `auto`: [`Backend::Auto`] with default options).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Where the tensors go (default [`Device::Auto`]: a GPU when one is usable, else host
    /// memory). A GPU ordinal (`.device(1)`) or [`Device::Gpu`] asks for a GPU: `auto` then
    /// fails with [`Error::NoGpu`] rather than load into host memory; the index replaces the
    /// device in a GPU backend's options.
    pub fn device(mut self, device: impl Into<Device>) -> Self {
        self.device = device.into();
        self
    }

    /// The staging policy (headroom, chunk and staging sizes, I/O threads, coalescing).
    pub fn policy(mut self, policy: StagingPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Caps device memory: the capacity of the host backend's "device", or on a GPU a budget
    /// that replaces the device's free-memory figure (for example the minimum over ranks).
    pub fn memory_cap(mut self, bytes: Option<u64>) -> Self {
        self.memory_cap = bytes;
        self
    }

    /// Whether tensors under 1 MiB are carved from shared 32 MiB blocks (default: yes; it
    /// took a page-cached load of many small tensors from 2.3 to 5.3 GB/s on the host). Off,
    /// every tensor has an allocation of its own (so each can become a `CudaSlice`), except
    /// neighbours read together while coalescing is on in the policy.
    pub fn suballocate(mut self, yes: bool) -> Self {
        self.suballocate = yes;
        self
    }

    /// Which tensors to load, and which rows of them (default: all, whole). Unselected bytes
    /// are never read.
    pub fn select(mut self, selection: Selection) -> Self {
        self.selection = selection;
        self
    }

    /// Reads tensors the destination accepts straight into its memory, in the load this loader
    /// opens (after [`prepare`](Self::prepare), the first load the [`Prepared`] opens; see
    /// [`Prepared::destination`] for later ones). Its memory space must be the one the backend
    /// loads into (host memory for `host`, `CudaMemory` for `cufile`):
    /// otherwise opening the load is [`Error::DestinationSpace`].
    pub fn destination<'e, S, D>(self, destination: D) -> Loader<'e>
    where
        S: KnownSpace,
        D: Destination<S> + Send + 'e,
    {
        self.with_destination(S::wrap(Box::new(destination)))
    }

    /// Reads tensors the destination accepts straight into the raw regions it gives, of
    /// whatever space the backend loads into (for callers outside Rust).
    pub fn raw_destination<'e, D>(self, destination: D) -> Loader<'e>
    where
        D: RawDestination + Send + 'e,
    {
        self.with_destination(AnyDestination::Raw(Box::new(destination)))
    }

    /// How checkpoints at `s3://`, `gs://`, `az://` and `http(s)://` URLs are read: requests
    /// in flight, range size, retries, a bandwidth cap, store options. The environment of each
    /// cloud (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, ...) applies first.
    #[cfg(feature = "remote")]
    pub fn remote(mut self, options: backend_remote::Options) -> Self {
        self.remote = options;
        self
    }

    /// How models on the Hugging Face Hub (`hf://`) are read: the cache (and whether it is
    /// written), the endpoint, the token, offline. The remote options apply to their reads
    /// too; `huggingface_hub`'s environment (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_CACHE`,
    /// `HF_HUB_OFFLINE`) fills in what is unset.
    #[cfg(feature = "remote")]
    pub fn hub(mut self, options: backend_hub::HubOptions) -> Self {
        self.hub = options;
        self
    }

    /// Asked every 50 ms while a read of a URL waits on the network: once it says true, the
    /// load ends with an error, "interrupted" (Python's Ctrl-C). Kept when
    /// [`remote`](Self::remote) options are set afterwards.
    #[cfg(feature = "remote")]
    pub fn interrupt(mut self, interrupt: backend_remote::Interrupt) -> Self {
        self.interrupt = Some(interrupt);
        self
    }

    /// Reads and checks the headers of the checkpoint at `paths` (one path as
    /// [`open`](Self::open) takes it, or several files as [`open_files`](Self::open_files);
    /// local or URLs, read with this loader's remote options) without loading anything: the
    /// metadata a caller chooses a selection from. A load of it
    /// ([`Prepared::open_checkpoint`]) checks the files are still the ones read here.
    pub fn read_headers<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Checkpoint> {
        let Some(first) = paths.first() else {
            return Ok(Checkpoint::from_files::<_, &Path>([])?);
        };
        if let [one] = paths {
            let found = Source::hub(
                one.as_ref(),
                #[cfg(feature = "remote")]
                &self.remote_options(),
                #[cfg(feature = "remote")]
                &self.hub,
            )?;
            if let Some((source, found, _)) = found {
                return source.read_headers(&found, None);
            }
        }
        super::prepared::refuse_hub_among(paths)?;
        let source = Source::of(
            first.as_ref(),
            #[cfg(feature = "remote")]
            || {
                Ok(backend_remote::Remote::open_with(
                    first.as_ref(),
                    self.object_store.clone(),
                    &self.remote_options(),
                )?)
            },
        )?;
        source.read_headers(paths, None)
    }

    /// Reads URLs through the caller's own object store (its credentials, client and
    /// middleware) instead of one the library builds from the URL and the remote options'
    /// `config`. The URLs still name the objects: `s3://bucket/prefix/model.safetensors` is key
    /// `prefix/model.safetensors` of `store`.
    #[cfg(feature = "remote")]
    pub fn object_store(mut self, store: Arc<dyn backend_remote::ObjectStore>) -> Self {
        self.object_store = Some(store);
        self
    }

    /// Works in the caller's own `cudarc` context instead of the device's primary context
    /// retained by the library: the load uses cuFile (`auto` becomes `cufile` with `auto`'s
    /// cuFile options) on the context's GPU, allocates in that context, and keeps it alive while
    /// anything of the load lives. Another backend, or a device on another GPU, is
    /// [`Error::DeviceMismatch`] when the loader is prepared.
    #[cfg(feature = "cufile")]
    pub fn cuda_context(
        mut self,
        context: Arc<backend_cufile::cudarc::driver::CudaContext>,
    ) -> Self {
        self.cuda = Some(backend::CallerCuda::Context(context));
        self
    }

    /// As [`cuda_context`](Self::cuda_context) with the stream's context, and every copy the
    /// POSIX path (and a load from a URL) makes to the device is queued on `stream`, waited for
    /// by events recorded on it: the library creates no stream of its own. Reads through cuFile
    /// itself are synchronous and use no stream.
    #[cfg(feature = "cufile")]
    pub fn cuda_stream(mut self, stream: Arc<backend_cufile::cudarc::driver::CudaStream>) -> Self {
        self.cuda = Some(backend::CallerCuda::Stream(stream));
        self
    }

    /// The remote options with the interrupt, if one was given.
    #[cfg(feature = "remote")]
    fn remote_options(&self) -> backend_remote::Options {
        let mut options = self.remote.clone();
        if self.interrupt.is_some() {
            options.interrupt.clone_from(&self.interrupt);
        }
        options
    }

    fn with_destination<'e>(self, destination: AnyDestination<'e>) -> Loader<'e> {
        Loader {
            #[cfg(feature = "remote")]
            remote: self.remote,
            #[cfg(feature = "remote")]
            hub: self.hub,
            #[cfg(feature = "remote")]
            interrupt: self.interrupt,
            #[cfg(feature = "remote")]
            object_store: self.object_store,
            #[cfg(feature = "cufile")]
            cuda: self.cuda,
            backend: self.backend,
            device: self.device,
            policy: self.policy,
            memory_cap: self.memory_cap,
            suballocate: self.suballocate,
            selection: self.selection,
            destination,
        }
    }

    /// Opens the backend (choosing it, for `auto`) for local checkpoints, without opening one: a
    /// machine that cannot run it fails here.
    pub fn prepare(self) -> Result<Prepared<'d>> {
        self.prepare_with(false)
    }

    /// Opens the backend for reading the checkpoint at `path` (local, or a URL) without opening
    /// it. For a URL no local file is read, so a GPU backend opens only what its POSIX path
    /// needs (the device, pinned bounce buffers), never its driver library (libcufile,
    /// libhipfile), and the report gives no reason about one.
    pub fn prepare_for(self, path: impl AsRef<Path>) -> Result<Prepared<'d>> {
        // A model on the Hub may be in the cache (a local load): its backend is opened as for
        // local files.
        let path = path.as_ref();
        let remote = staging_core::is_url(path) && !super::source::is_hub(path);
        self.prepare_with(remote)
    }

    fn prepare_with(self, remote_source: bool) -> Result<Prepared<'d>> {
        #[cfg(feature = "cufile")]
        let (backend, device) = match &self.cuda {
            Some(cuda) => cuda.apply(&self.backend, self.device)?,
            None => (self.backend.clone(), self.device),
        };
        #[cfg(not(feature = "cufile"))]
        let (backend, device) = (self.backend.clone(), self.device);
        let chosen = backend::open(&backend, device, self.memory_cap, remote_source)?;
        #[cfg(feature = "remote")]
        let remote = self.remote_options();
        let policy = if chosen.opened.is_host() {
            self.policy
        } else {
            self.policy
                .to_builder()
                .memory_budget(self.memory_cap.or(self.policy.memory_budget()))
                .build()?
        };
        let map = match chosen.opened.host_options() {
            Some(options) if !options.direct_io => {
                map_decision(options.map, device, self.memory_cap)
            }
            _ => MapDecision::No,
        };
        Ok(Prepared {
            #[cfg(feature = "remote")]
            remote,
            #[cfg(feature = "remote")]
            hub_options: self.hub,
            #[cfg(feature = "remote")]
            store: None,
            #[cfg(feature = "remote")]
            object_store: self.object_store,
            chosen,
            policy,
            suballocate: self.suballocate,
            selection: self.selection,
            destination: self.destination,
            files: None,
            maps: None,
            map,
            remote_fs: std::collections::HashMap::new(),
            threads: Vec::new(),
            hub: None,
        })
    }

    /// Opens the backend and the checkpoint at `path` (a directory, an index file, or one
    /// `.safetensors` file) into a load.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Load<'d>> {
        let path = path.as_ref();
        self.prepare_for(path)?.open(path)
    }

    /// Opens the backend and these `.safetensors` files, as one checkpoint, into a load.
    pub fn open_files<I, P>(self, files: I) -> Result<Load<'d>>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let files: Vec<P> = files.into_iter().collect();
        match files.first() {
            Some(first) => self.prepare_for(first)?.open_files(files),
            None => self.prepare()?.open_files(files),
        }
    }
}

/// Whether loads on the host backend map their local files: as `map` says, and for
/// [`MapFiles::Auto`] when the tensors are meant for host memory (device `cpu`) and no memory cap
/// makes the host stand for a device of that size; never where this kernel cannot report a
/// mapped file's read error (no `MADV_POPULATE_READ`).
fn map_decision(map: MapFiles, device: Device, memory_cap: Option<u64>) -> MapDecision {
    if !crate::mapping::populate_supported() {
        return MapDecision::No;
    }
    match map {
        MapFiles::Never => MapDecision::No,
        MapFiles::Always => MapDecision::Yes,
        MapFiles::Auto if device == Device::Cpu && memory_cap.is_none() => {
            MapDecision::LocalFileSystems
        }
        MapFiles::Auto => MapDecision::No,
    }
}
