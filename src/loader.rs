//! [`Loader`]: the one entry point. It takes the backend, the device, the policy, the selection
//! and the destination, opens the backend (deciding `auto` once), and opens paths into a
//! [`Load`]: an iterator of `Result<Tensor>` in file order, with its report.
//!
//! Whatever the backend, the load is the core's `Stager` over that backend's reader and its
//! allocator behind a `SubAllocator` (small tensors carved from shared blocks: the default, not
//! something each caller must remember), erased behind one type.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use staging_core::host::HostReader;
use staging_core::{
    Checkpoint, Destination, DeviceAllocator, HeldMemory, IoThreads, KeepOpen, LoadReport,
    OpenFiles, RawDestination, Reader, Selection, Stager, StagingPolicy, SubAllocator,
};

use crate::backend::{self, Backend, Chosen, Opened};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::space::sealed::Sealed;
use crate::space::{AnyDestination, Boxed, KnownSpace};
use crate::tensor::Tensor;

/// Blocks small tensors are carved from (`SubAllocator`).
const BLOCK_SIZE: usize = 32 << 20;
/// The I/O threads a load from a URL uses at least (fewer when fewer requests may be in flight).
#[cfg(feature = "remote")]
const REMOTE_IO_THREADS: usize = 8;
/// Tensors under this many bytes are carved from blocks.
const CARVE_BELOW: usize = 1 << 20;

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
    selection: Selection,
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
        source.read_headers(paths)
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
        let remote = staging_core::is_url(path.as_ref());
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
        Ok(Prepared {
            #[cfg(feature = "remote")]
            remote,
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
            threads: Vec::new(),
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

/// A loader whose backend is open ([`Loader::prepare`]): it opens any number of loads, one
/// after another or at once, all on that backend (its device, driver, pinned buffers and memory
/// accounting opened once), each with the same options, and a URL's store opened once for every
/// load of objects in it. A destination serves one load: the one opened next
/// ([`destination`](Self::destination)).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
/// # let mut file = (header.len() as u64).to_le_bytes().to_vec();
/// # file.extend_from_slice(header);
/// # file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
/// # std::fs::write(dir.path().join("model.safetensors"), file)?;
/// # let (model, draft) = (dir.path(), dir.path());
/// use safetensors_staging::Loader;
///
/// let mut prepared = Loader::new().prepare()?;
/// let weights: Vec<_> = prepared.open(model)?.collect::<Result<_, _>>()?;
/// let draft_weights: Vec<_> = prepared.open(draft)?.collect::<Result<_, _>>()?;
/// assert_eq!(weights.len(), draft_weights.len());
/// # Ok(())
/// # }
/// ```
pub struct Prepared<'d> {
    #[cfg(feature = "remote")]
    remote: backend_remote::Options,
    /// The store opened for the headers ([`read_headers`](Self::read_headers)), reused by the
    /// load: one client, one runtime, and the versions its `HEAD`s recorded.
    #[cfg(feature = "remote")]
    store: Option<backend_remote::Remote>,
    /// The caller's object store, if one was given ([`Loader::object_store`]).
    #[cfg(feature = "remote")]
    object_store: Option<Arc<dyn backend_remote::ObjectStore>>,
    chosen: Chosen,
    policy: StagingPolicy,
    suballocate: bool,
    selection: Selection,
    /// The destination of the load opened next (none after it).
    destination: AnyDestination<'d>,
    /// The files loads have opened, kept open for the next ones ([`keep_files_open`]).
    ///
    /// [`keep_files_open`]: Self::keep_files_open
    files: Option<OpenFiles>,
    /// The I/O threads of every load, by how many there are (a URL's loads use more).
    threads: Vec<IoThreads>,
}

impl fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("backend", &self.backend_name())
            .field("passed_over", &self.chosen.passed_over)
            .finish()
    }
}

impl<'d> Prepared<'d> {
    /// The backend chosen: `host`, `cufile`, `hipfile` or `mock`.
    pub fn backend_name(&self) -> &'static str {
        match &self.chosen.opened {
            Opened::Host { .. } => "host",
            #[cfg(feature = "cufile")]
            Opened::Cufile(_) => "cufile",
            #[cfg(feature = "hipfile")]
            Opened::Hipfile(_) => "hipfile",
            #[cfg(feature = "mock")]
            Opened::Mock { .. } => "mock",
        }
    }

    /// Each backend `auto` passed over, with why (`"cufile: no CUDA driver: ..."`).
    pub fn passed_over(&self) -> &[String] {
        &self.chosen.passed_over
    }

    /// Why the backend runs its POSIX path, when `auto` mode made it do so (no usable
    /// `libcufile`, for example).
    pub fn mode_reason(&self) -> Option<&str> {
        self.chosen.mode_reason.as_deref()
    }

    /// Opens the checkpoint at `path` (a directory, an index file, or one `.safetensors` file;
    /// or the same at an `s3://`, `gs://`, `az://` or `http(s)://` URL, a prefix standing for a
    /// directory).
    pub fn open(&mut self, path: impl AsRef<Path>) -> Result<Load<'d>> {
        let path = path.as_ref();
        let source = self.source_of(path, Revalidate::Yes)?;
        let checkpoint = source.open(path)?;
        self.load(checkpoint, source)
    }

    /// Opens these `.safetensors` files (all local, or all URLs in one store) as one checkpoint.
    pub fn open_files<I, P>(&mut self, files: I) -> Result<Load<'d>>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let files: Vec<P> = files.into_iter().collect();
        let source = match files.first() {
            Some(first) => self.source_of(first.as_ref(), Revalidate::Yes)?,
            None => Source::Local,
        };
        let checkpoint = source.open_files(&files)?;
        self.load(checkpoint, source)
    }

    /// Loads a checkpoint already opened (its files on the local file system, or URLs of one
    /// store).
    pub fn open_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<Load<'d>> {
        let source = match checkpoint.files().first() {
            // The versions its headers were read at are the ones this load reads.
            Some(first) => self.source_of(&first.path, Revalidate::No)?,
            None => Source::Local,
        };
        self.load(checkpoint, source)
    }

    /// Where `path` is read from: a URL's store (the one already open when it holds `path`,
    /// asked afresh what its objects are when `revalidate` says so: a checkpoint opened again
    /// sees an object replaced since), or the local file system.
    fn source_of(&mut self, path: &Path, revalidate: Revalidate) -> Result<Source> {
        #[cfg(feature = "remote")]
        if let Some(store) = self.store.as_ref().filter(|s| s.holds(path)) {
            if revalidate == Revalidate::Yes {
                store.revalidate();
            }
            return Ok(Source::Remote(store.clone()));
        }
        #[cfg(not(feature = "remote"))]
        let _ = revalidate;
        let source = Source::of(
            path,
            #[cfg(feature = "remote")]
            || {
                Ok(backend_remote::Remote::open_with(
                    path,
                    self.object_store.clone(),
                    &self.remote,
                )?)
            },
        )?;
        #[cfg(feature = "remote")]
        if let Source::Remote(store) = &source {
            self.store = Some(store.clone());
        }
        Ok(source)
    }

    /// Reads and checks the headers of the checkpoint at `paths` (as
    /// [`Loader::read_headers`]), through the store this load will read from: a load of the
    /// result ([`open_checkpoint`](Self::open_checkpoint)) opens no second client and asks
    /// nothing again of what was asked here.
    pub fn read_headers<P: AsRef<Path>>(&mut self, paths: &[P]) -> Result<Checkpoint> {
        match paths.first() {
            Some(first) => self
                .source_of(first.as_ref(), Revalidate::Yes)?
                .read_headers(paths),
            None => Ok(Checkpoint::from_files::<_, &Path>([])?),
        }
    }

    /// Keeps every file a load opens open for the loads after it (on cuFile and hipFile,
    /// registered), until this is dropped or [`close_files`](Self::close_files): for a reader
    /// that asks for tensors one at a time, one small load each. A file replaced since its
    /// header was read is still refused (the check is made on its path).
    pub fn keep_files_open(&mut self) {
        self.files.get_or_insert_with(OpenFiles::default);
    }

    /// Closes the files kept open (each when the last load reading it ends); later loads open
    /// files again, and keep them if [`keep_files_open`](Self::keep_files_open) was called.
    pub fn close_files(&mut self) {
        if let Some(files) = &self.files {
            files.clear();
        }
    }

    /// How many files are kept open.
    pub fn files_open(&self) -> usize {
        self.files.as_ref().map_or(0, OpenFiles::len)
    }

    /// The I/O threads loads with `policy` read on: started by the first load that needs that
    /// many, shared by every load after it (loads at once share them too).
    fn threads_for(&mut self, policy: &StagingPolicy) -> Result<IoThreads> {
        let wanted = policy.io_threads();
        if let Some(threads) = self.threads.iter().find(|t| t.count() == wanted) {
            return Ok(threads.clone());
        }
        let threads = IoThreads::new(wanted)?;
        self.threads.push(threads.clone());
        Ok(threads)
    }

    /// Replaces the selection of the loads opened from now on (for a caller that chooses
    /// tensors from the headers it read with [`read_headers`](Self::read_headers)).
    pub fn select(&mut self, selection: Selection) {
        self.selection = selection;
    }

    /// Reads tensors the destination accepts straight into its memory, in the load opened next
    /// (replacing any destination not used yet); the loads after it have none unless given one
    /// again. Its memory space must be the one the backend loads into, as for
    /// [`Loader::destination`].
    pub fn destination<S, D>(&mut self, destination: D)
    where
        S: KnownSpace,
        D: Destination<S> + Send + 'd,
    {
        self.destination = S::wrap(Box::new(destination));
    }

    /// Reads tensors the destination accepts straight into the raw regions it gives, in the load
    /// opened next, as [`destination`](Self::destination).
    pub fn raw_destination<D>(&mut self, destination: D)
    where
        D: RawDestination + Send + 'd,
    {
        self.destination = AnyDestination::Raw(Box::new(destination));
    }

    fn load(&mut self, checkpoint: Checkpoint, source: Source) -> Result<Load<'d>> {
        // Narrowing copies every tensor's metadata: only when there is something to narrow.
        let checkpoint = if self.selection.is_all() {
            checkpoint
        } else {
            checkpoint.select(&self.selection)?
        };
        let policy = match &source {
            Source::Local => self.policy.clone(),
            // Threads reading a URL wait on the network, not a disk: enough of them to keep
            // `concurrency` requests in flight, up to 8. On loopback (no latency to hide) 2
            // threads loaded 1 GiB at 1.37 GB/s and 8 at 1.46 (medians of 6, 2-core VM).
            #[cfg(feature = "remote")]
            Source::Remote(_) => {
                let threads = self
                    .policy
                    .io_threads()
                    .max(self.remote.concurrency.min(REMOTE_IO_THREADS));
                self.policy.to_builder().io_threads(threads).build()?
            }
        };
        let setup = Setup {
            checkpoint,
            threads: self.threads_for(&policy)?,
            files: self.files.clone(),
            policy,
            suballocate: self.suballocate,
            // A destination serves the one load it was given for.
            destination: std::mem::replace(&mut self.destination, AnyDestination::None),
        };
        #[cfg(feature = "mock")]
        let mut ledger = None;
        // Each load reads through a reader of its own, on what the backend's loads share.
        let inner = match (&self.chosen.opened, source) {
            (
                Opened::Host {
                    options,
                    allocator,
                    direct,
                },
                Source::Local,
            ) if options.direct_io => setup.start(Arc::clone(direct), allocator.clone(), "host")?,
            (Opened::Host { allocator, .. }, Source::Local) => {
                setup.start(HostReader, allocator.clone(), "host")?
            }
            #[cfg(feature = "remote")]
            (Opened::Host { allocator, .. }, Source::Remote(remote)) => {
                setup.start(remote.reader(), allocator.clone(), "host")?
            }
            #[cfg(feature = "cufile")]
            (Opened::Cufile(backend), Source::Local) => setup.start(
                backend.reader.another(),
                backend.allocator.clone(),
                "cufile",
            )?,
            #[cfg(all(feature = "cufile", feature = "remote"))]
            (Opened::Cufile(backend), Source::Remote(remote)) => {
                let reader = backend.reader.bounced(remote.reader());
                setup.start(reader, backend.allocator.clone(), "cufile")?
            }
            #[cfg(feature = "hipfile")]
            (Opened::Hipfile(backend), Source::Local) => setup.start(
                backend.reader.another(),
                backend.allocator.clone(),
                "hipfile",
            )?,
            #[cfg(all(feature = "hipfile", feature = "remote"))]
            (Opened::Hipfile(backend), Source::Remote(remote)) => {
                let reader = backend.reader.bounced(remote.reader());
                setup.start(reader, backend.allocator.clone(), "hipfile")?
            }
            #[cfg(feature = "mock")]
            (Opened::Mock { reader, allocator }, Source::Local) => {
                ledger = Some(allocator.ledger());
                setup.start(Arc::clone(reader), Arc::clone(allocator), "mock")?
            }
            #[cfg(all(feature = "mock", feature = "remote"))]
            (Opened::Mock { allocator, .. }, Source::Remote(remote)) => {
                ledger = Some(allocator.ledger());
                let reader = backend_mock::FaultyReader::new(remote.reader()).labelled("mock");
                setup.start(reader, Arc::clone(allocator), "mock")?
            }
        };
        Ok(Load {
            inner,
            passed_over: self.chosen.passed_over.clone(),
            mode_reason: self.chosen.mode_reason.clone(),
            #[cfg(feature = "mock")]
            ledger,
        })
    }
}

/// Whether a store already open is asked afresh what its objects are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Revalidate {
    /// A checkpoint is being opened: each object as it is now.
    Yes,
    /// A checkpoint already opened is being loaded: the versions its headers were read at.
    No,
}

/// Where a checkpoint's bytes come from.
enum Source {
    /// The local file system.
    Local,
    /// An object store or HTTP server.
    #[cfg(feature = "remote")]
    Remote(backend_remote::Remote),
}

impl Source {
    /// Where `path` is read from, with a store opened for it when it is a URL.
    fn of(
        path: &Path,
        #[cfg(feature = "remote")] open: impl FnOnce() -> Result<backend_remote::Remote>,
    ) -> Result<Self> {
        if !staging_core::is_url(path) {
            return Ok(Self::Local);
        }
        #[cfg(feature = "remote")]
        {
            Ok(Self::Remote(open()?))
        }
        #[cfg(not(feature = "remote"))]
        Err(Error::NotBuilt("remote"))
    }

    /// The files are read through.
    fn store(&self) -> &dyn staging_core::Store {
        match self {
            Self::Local => &staging_core::LocalFiles,
            #[cfg(feature = "remote")]
            Self::Remote(remote) => remote,
        }
    }

    /// `path` as the checkpoint names it in reports and errors: a URL without the login it
    /// may carry (the store was opened with it), a local path as it is.
    fn public(&self, path: &Path) -> Result<std::path::PathBuf> {
        match self {
            Self::Local => Ok(path.to_path_buf()),
            #[cfg(feature = "remote")]
            Self::Remote(remote) => Ok(remote.public_path(path)?),
        }
    }

    /// The checkpoint at `path` (a directory, an index or one file).
    fn open(&self, path: &Path) -> Result<Checkpoint> {
        Ok(Checkpoint::open_in(self.store(), &self.public(path)?)?)
    }

    /// These files as one checkpoint.
    fn open_files<P: AsRef<Path>>(&self, files: &[P]) -> Result<Checkpoint> {
        let files = files
            .iter()
            .map(|f| self.public(f.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Checkpoint::from_files_in(self.store(), &files)?)
    }

    /// One path as [`open`](Self::open) takes it, several as files.
    fn read_headers<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Checkpoint> {
        match paths {
            [one] => self.open(one.as_ref()),
            many => self.open_files(many),
        }
    }
}

/// What every load is made of, whatever the backend.
struct Setup<'d> {
    checkpoint: Checkpoint,
    threads: IoThreads,
    files: Option<OpenFiles>,
    policy: StagingPolicy,
    suballocate: bool,
    destination: AnyDestination<'d>,
}

impl<'d> Setup<'d> {
    fn start<R, A>(self, reader: R, allocator: A, backend: &str) -> Result<Box<dyn ErasedLoad + 'd>>
    where
        R: Reader + 'd,
        R::File: 'static,
        R::Space: KnownSpace,
        A: DeviceAllocator<Space = R::Space> + 'static,
        A::Buffer: Sync + 'static,
    {
        match self.files.clone() {
            Some(files) => self.start_on(KeepOpen::new(reader, files), allocator, backend),
            None => self.start_on(reader, allocator, backend),
        }
    }

    fn start_on<R, A>(
        self,
        reader: R,
        allocator: A,
        backend: &str,
    ) -> Result<Box<dyn ErasedLoad + 'd>>
    where
        R: Reader + 'd,
        R::Space: KnownSpace,
        A: DeviceAllocator<Space = R::Space> + 'static,
        A::Buffer: Sync + 'static,
    {
        let destination = <R::Space as Sealed>::unwrap(self.destination, backend)?;
        // A load of one tensor carves nothing: the block would outlive the load for that one
        // tensor (a reader asking for tensors one at a time would hold a block per tensor).
        let carve_below = if self.suballocate && self.checkpoint.tensors().len() > 1 {
            CARVE_BELOW
        } else {
            0
        };
        let allocator = Arc::new(SubAllocator::new(allocator, BLOCK_SIZE, carve_below));
        let stager = Stager::on_threads(
            self.checkpoint,
            reader,
            Arc::clone(&allocator),
            self.policy,
            self.threads,
        )
        .with_destination(destination);
        Ok(Box::new(Typed { stager, allocator }))
    }
}

/// A load of any backend.
trait ErasedLoad: Send {
    fn next_tensor(&mut self) -> Option<staging_core::Result<Tensor>>;
    fn report(&self) -> LoadReport;
    fn held_memory(&self) -> HeldMemory;
    fn checkpoint(&self) -> &Checkpoint;
}

struct Typed<'d, R, A>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    A::Buffer: Sync,
{
    stager: Stager<R, Arc<SubAllocator<A>>, Boxed<'d, R::Space>>,
    allocator: Arc<SubAllocator<A>>,
}

impl<R, A> ErasedLoad for Typed<'_, R, A>
where
    R: Reader,
    R::Space: KnownSpace,
    A: DeviceAllocator<Space = R::Space> + 'static,
    A::Buffer: Sync + 'static,
{
    fn next_tensor(&mut self) -> Option<staging_core::Result<Tensor>> {
        let item = self.stager.next();
        if !matches!(item, Some(Ok(_))) {
            // The load is over: the current block goes with the last tensor carved from it.
            self.allocator.retire_block();
        }
        Some(item?.map(|staged| Tensor::new(staged, &self.allocator)))
    }

    fn report(&self) -> LoadReport {
        self.stager.report()
    }

    fn held_memory(&self) -> HeldMemory {
        self.stager.held_memory()
    }

    fn checkpoint(&self) -> &Checkpoint {
        self.stager.checkpoint()
    }
}

/// A load in progress: an iterator of `Result<Tensor>` in file order. After an error it yields
/// nothing more; dropping it early frees everything it still holds.
pub struct Load<'d> {
    inner: Box<dyn ErasedLoad + 'd>,
    passed_over: Vec<String>,
    mode_reason: Option<String>,
    #[cfg(feature = "mock")]
    ledger: Option<backend_mock::Ledger>,
}

impl fmt::Debug for Load<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.inner.report();
        f.debug_struct("Load")
            .field("backend", &report.backend)
            .field("mode", &report.mode)
            .field("tensors", &report.tensors)
            .finish()
    }
}

impl Load<'_> {
    /// The report so far; final once the iterator has returned `None` or an error.
    pub fn report(&self) -> LoadReport {
        let mut report = self.inner.report();
        report.passed_over.clone_from(&self.passed_over);
        report.mode_reason.clone_from(&self.mode_reason);
        report
    }

    /// The checkpoint being loaded, narrowed to the selection.
    pub fn checkpoint(&self) -> &Checkpoint {
        self.inner.checkpoint()
    }

    /// What the load's buffers hold now, as a handle that stays valid after the load and its
    /// tensors are dropped (every count then reads 0).
    pub fn held_memory(&self) -> HeldMemory {
        self.inner.held_memory()
    }

    /// Why the backend runs its POSIX path, when `auto` mode made it do so.
    pub fn mode_reason(&self) -> Option<&str> {
        self.mode_reason.as_deref()
    }

    /// The mock backend's ledger of every buffer handed out and returned (mock loads only).
    #[cfg(feature = "mock")]
    pub fn ledger(&self) -> Option<&backend_mock::Ledger> {
        self.ledger.as_ref()
    }
}

impl Iterator for Load<'_> {
    type Item = Result<Tensor>;

    fn next(&mut self) -> Option<Result<Tensor>> {
        Some(self.inner.next_tensor()?.map_err(Error::from))
    }
}
