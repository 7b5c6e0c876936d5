//! Choosing and opening a backend, once, for every door (Rust, C, the `stage` command, the
//! benchmark). `auto` is decided here and nowhere else (`auto.rs`): cuFile when a CUDA driver
//! and a device are there, else hipFile when a HIP runtime and a device are, else the host
//! backend; each backend passed over is recorded with why.
//!
//! One file per backend (`host.rs`, `cufile.rs`, `hipfile.rs`, `mock.rs`): how it opens for a
//! device, and the reader and allocator it reads a local file or a URL's store with (the two GPU
//! backends, both over `backend-gds`, share `with_gds_reader` here). The enums here ([`Backend`],
//! `Opened`) only name the backends; their arms delegate to those files.

mod auto;
#[cfg(feature = "cufile")]
mod cufile;
#[cfg(feature = "hipfile")]
mod hipfile;
mod host;
#[cfg(feature = "mock")]
mod mock;

use staging_core::{DeviceAllocator, Reader};

#[cfg(feature = "cufile")]
pub(crate) use cufile::CallerCuda;
pub use host::{HostOptions, MapFiles};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::space::KnownSpace;

/// Which backend loads the tensors.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// cuFile when a CUDA driver and a device are there, else hipFile when a HIP runtime and a
    /// device are, else the host backend, each with these options. The report's `passed_over`
    /// says why each was skipped.
    Auto(AutoOptions),
    /// System memory standing for the device (a real loader for CPU inference).
    Host(HostOptions),
    /// NVIDIA GPUs through cuFile (GDS or its compatibility mode) or a POSIX path.
    #[cfg(feature = "cufile")]
    Cufile(backend_cufile::Options),
    /// AMD GPUs through hipFile or a POSIX path (run against stub libraries only so far).
    #[cfg(feature = "hipfile")]
    Hipfile(backend_hipfile::Options),
    /// The host backend behind the mock's ledger, which records every buffer handed out and
    /// returned (for tests and leak checks).
    #[cfg(feature = "mock")]
    Mock,
}

impl Default for Backend {
    fn default() -> Self {
        Self::Auto(AutoOptions::default())
    }
}

/// The options each backend `auto` may choose runs with.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AutoOptions {
    /// For cuFile.
    #[cfg(feature = "cufile")]
    pub cufile: backend_cufile::Options,
    /// For hipFile.
    #[cfg(feature = "hipfile")]
    pub hipfile: backend_hipfile::Options,
    /// For the host backend.
    pub host: HostOptions,
}

impl Backend {
    /// The backend's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Auto(_) => "auto",
            Self::Host(_) => "host",
            #[cfg(feature = "cufile")]
            Self::Cufile(_) => "cufile",
            #[cfg(feature = "hipfile")]
            Self::Hipfile(_) => "hipfile",
            #[cfg(feature = "mock")]
            Self::Mock => "mock",
        }
    }
}

/// A URL's store, which every backend reads through a reader of its own (none in a build
/// without `remote`).
#[cfg(feature = "remote")]
pub(crate) type RemoteStore = backend_remote::Remote;
/// A URL's store: none in a build without `remote`.
#[cfg(not(feature = "remote"))]
pub(crate) enum RemoteStore {}

/// Work done with the reader (and allocator) a backend reads a source with: a load, or binding
/// a reader's files.
pub(crate) trait OnReader<'d> {
    type Output;

    fn run<R, A>(self, reader: R, allocator: A, backend: &str) -> Result<Self::Output>
    where
        R: Reader + 'd,
        R::File: 'static,
        R::Space: KnownSpace,
        A: DeviceAllocator<Space = R::Space> + 'static,
        A::Buffer: Sync + 'static;
}

/// A backend, opened: what every load of it shares (the device, the driver, pooled buffers, the
/// allocator and its accounting); each load gets a reader of its own from it.
pub(crate) enum Opened {
    Host(host::Host),
    #[cfg(feature = "cufile")]
    Cufile(Box<backend_cufile::Backend>),
    #[cfg(feature = "hipfile")]
    Hipfile(Box<backend_hipfile::Backend>),
    #[cfg(feature = "mock")]
    Mock(mock::Mock),
}

impl Opened {
    /// The backend's name: `host`, `cufile`, `hipfile` or `mock`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Host(_) => "host",
            #[cfg(feature = "cufile")]
            Self::Cufile(_) => "cufile",
            #[cfg(feature = "hipfile")]
            Self::Hipfile(_) => "hipfile",
            #[cfg(feature = "mock")]
            Self::Mock(_) => "mock",
        }
    }

    /// Whether the backend's device is system memory (a cap is then its capacity, not a budget).
    pub(crate) fn is_host(&self) -> bool {
        match self {
            Self::Host(_) => true,
            #[cfg(feature = "mock")]
            Self::Mock(_) => true,
            #[allow(unreachable_patterns)] // with no GPU backend built, there is nothing else
            _ => false,
        }
    }

    /// The host backend's options, when it is the host backend.
    pub(crate) fn host_options(&self) -> Option<&HostOptions> {
        match self {
            Self::Host(host) => Some(&host.options),
            #[allow(unreachable_patterns)] // with no other backend built, there is nothing else
            _ => None,
        }
    }

    /// The mock's ledger, when it is the mock backend.
    #[cfg(feature = "mock")]
    pub(crate) fn ledger(&self) -> Option<backend_mock::Ledger> {
        match self {
            Self::Mock(mock) => Some(mock.ledger()),
            _ => None,
        }
    }

    /// Runs `task` with the reader and allocator this backend reads a local file (`remote`
    /// `None`) or a URL's store with.
    pub(crate) fn with_reader<'d, T: OnReader<'d>>(
        &self,
        remote: Option<&RemoteStore>,
        task: T,
    ) -> Result<T::Output> {
        match self {
            Self::Host(host) => host.with_reader(remote, task),
            #[cfg(feature = "cufile")]
            Self::Cufile(backend) => {
                with_gds_reader(&backend.reader, backend.allocator.clone(), remote, task)
            }
            #[cfg(feature = "hipfile")]
            Self::Hipfile(backend) => {
                with_gds_reader(&backend.reader, backend.allocator.clone(), remote, task)
            }
            #[cfg(feature = "mock")]
            Self::Mock(mock) => mock.with_reader(remote, task),
        }
    }
}

/// Runs `task` with a GPU backend's reader (cuFile's and hipFile's are both `GdsReader`s, named
/// by their driver) and `allocator`: a new reader of the backend's for a local file (`remote`
/// `None`), or for a URL the store's reader bounced through its pinned buffers.
#[cfg(any(feature = "cufile", feature = "hipfile"))]
fn with_gds_reader<'d, F, G, A, T>(
    reader: &backend_gds::GdsReader<F, G>,
    allocator: A,
    remote: Option<&RemoteStore>,
    task: T,
) -> Result<T::Output>
where
    F: backend_gds::FileApi + 'static,
    G: backend_gds::Gpu,
    G::Space: KnownSpace,
    A: DeviceAllocator<Space = G::Space> + 'static,
    A::Buffer: Sync + 'static,
    T: OnReader<'d>,
{
    match remote {
        None => task.run(reader.another(), allocator, F::BACKEND),
        #[cfg(feature = "remote")]
        Some(remote) => task.run(reader.bounced(remote.reader()), allocator, F::BACKEND),
        #[cfg(not(feature = "remote"))]
        Some(never) => match *never {},
    }
}

/// What [`open`] chose, and why.
pub(crate) struct Chosen {
    pub(crate) opened: Opened,
    /// `"name: why"` for each backend `auto` passed over.
    pub(crate) passed_over: Vec<String>,
    /// Why the chosen backend runs its POSIX path, when `auto` mode made it do so.
    pub(crate) mode_reason: Option<String>,
}

impl Chosen {
    fn plain(opened: Opened) -> Self {
        Self {
            opened,
            passed_over: Vec::new(),
            mode_reason: None,
        }
    }
}

/// The error of a backend asked for a device it cannot load onto, with `hint`.
fn mismatch(backend: &'static str, device: Device, hint: &'static str) -> Error {
    Error::DeviceMismatch {
        backend,
        device: device.to_string(),
        hint,
    }
}

/// Opens `backend` for `device`; a host or mock device holds at most `host_capacity` bytes.
///
/// This is where `auto` and "a GPU was asked for" are decided, for every door:
/// - `auto` on device `auto`: cuFile, then hipFile (GPU 0, or the backend options' own device),
///   else the host backend, each GPU backend passed over recorded with why;
/// - `auto` on `cpu`: the host backend;
/// - `auto` on GPU `n` (`cuda:N`): cuFile, then hipFile; neither usable is [`Error::NoGpu`];
///   on `hip:N`: hipFile only, or [`Error::NoGpu`];
/// - a named backend: that one, on the GPU given (or its options' device for `auto`); a device
///   it cannot load onto is [`Error::DeviceMismatch`];
/// - `remote`: the checkpoint is at a URL, so no local file is read: a GPU backend opens only
///   what its POSIX path needs (the device, pinned bounce buffers), never its driver library
///   (libcufile, libhipfile), whatever mode was asked for.
pub(crate) fn open(
    backend: &Backend,
    device: Device,
    host_capacity: Option<u64>,
    remote: bool,
) -> Result<Chosen> {
    #[cfg(not(any(feature = "cufile", feature = "hipfile")))]
    let _ = remote; // no GPU backend in this build
    match backend {
        Backend::Auto(options) => auto::open(options, device, host_capacity, remote),
        Backend::Host(options) => host::open(*options, device, host_capacity),
        #[cfg(feature = "cufile")]
        Backend::Cufile(options) => cufile::open(options, device, remote),
        #[cfg(feature = "hipfile")]
        Backend::Hipfile(options) => hipfile::open(options, device, remote),
        #[cfg(feature = "mock")]
        Backend::Mock => mock::open(device, host_capacity),
    }
}
