//! The host backend: system memory standing for the device (a real loader for CPU inference),
//! read with the core's host reader, `O_DIRECT` when asked, or a URL's reader; and whether its
//! loads map their local files ([`MapFiles`]).

use std::sync::Arc;

use staging_core::host::{DirectHostReader, HostAllocator, HostReader};

use super::{Chosen, OnReader, Opened, RemoteStore, mismatch};
use crate::device::Device;
use crate::error::Result;

/// Whether a load for host memory maps its local files ([`HostOptions::map`]): its tensors
/// are then private, copy-on-write mappings of the files (`StagingPath::Mapped`), the page cache
/// their memory, as `safetensors` hands out.
///
/// A mapped tensor's bytes are the file's: a file modified in place while its tensors live may
/// show through [`Tensor::host_bytes`](crate::Tensor::host_bytes), and one truncated under them
/// makes touching the lost pages a `SIGBUS`. Safe Rust cannot rule that out, so a [`Loader`]
/// maps only when asked ([`Never`](Self::Never) is the default of [`HostOptions`]); the
/// options every door spells ([`LoadOptions`](crate::LoadOptions): Python, C, `stage`) default
/// to [`Auto`](Self::Auto), as `safetensors`' users expect.
///
/// [`Loader`]: crate::Loader
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapFiles {
    /// Map when the device asked for is `cpu` (the tensors are meant to live in host memory,
    /// not stand for a device's), no memory cap is set, and each file is on a local file system
    /// (not NFS, SMB, Ceph, 9p, GPFS, BeeGFS, FUSE and the like, where reads of our own are the
    /// better path).
    Auto,
    /// Map whenever the host backend reads local files (also for device `auto` on a machine
    /// without a GPU, and on any file system).
    Always,
    /// Never map: read into memory of the library's own (the default of [`HostOptions`]).
    #[default]
    Never,
}

impl MapFiles {
    /// The name the options use: `auto`, `true`, `false`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Always => "true",
            Self::Never => "false",
        }
    }
}

/// Options of the host backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostOptions {
    /// Read with `O_DIRECT`, past the page cache (for a cold first load of a checkpoint larger
    /// than memory).
    pub direct_io: bool,
    /// Whether loads for host memory hand out mappings of their files (default
    /// [`MapFiles::Never`]; the doors' options default to [`MapFiles::Auto`]).
    pub map: MapFiles,
}

impl HostOptions {
    /// Whether loads for host memory map their files.
    pub fn map(mut self, map: MapFiles) -> Self {
        self.map = map;
        self
    }

    /// With `O_DIRECT` reads or without.
    pub fn direct_io(mut self, direct_io: bool) -> Self {
        self.direct_io = direct_io;
        self
    }
}

/// The host backend, opened.
pub(crate) struct Host {
    pub(crate) options: HostOptions,
    allocator: HostAllocator,
    /// The `O_DIRECT` reader, with its pooled aligned buffers (unused without `direct_io`).
    direct: Arc<DirectHostReader>,
}

/// The host backend with `options`, its memory at most `capacity` bytes.
pub(super) fn opened(options: HostOptions, capacity: Option<u64>) -> Chosen {
    Chosen::plain(Opened::Host(Host {
        options,
        allocator: match capacity {
            Some(cap) => HostAllocator::with_capacity(cap),
            None => HostAllocator::new(),
        },
        direct: Arc::new(DirectHostReader::default()),
    }))
}

/// Opens the host backend for `device` (a GPU is [`Error::DeviceMismatch`](crate::Error)).
pub(super) fn open(options: HostOptions, device: Device, capacity: Option<u64>) -> Result<Chosen> {
    if device.gpu_index().is_some() {
        return Err(mismatch(
            "host",
            device,
            "it loads into host memory: use device cpu (or auto)",
        ));
    }
    Ok(opened(options, capacity))
}

impl Host {
    /// Runs `task` with the reader and allocator this backend reads a local file (`remote`
    /// `None`) or a URL's store with.
    pub(super) fn with_reader<'d, T: OnReader<'d>>(
        &self,
        remote: Option<&RemoteStore>,
        task: T,
    ) -> Result<T::Output> {
        match remote {
            None if self.options.direct_io => {
                task.run(Arc::clone(&self.direct), self.allocator.clone(), "host")
            }
            None => task.run(HostReader, self.allocator.clone(), "host"),
            #[cfg(feature = "remote")]
            Some(remote) => task.run(remote.reader(), self.allocator.clone(), "host"),
            #[cfg(not(feature = "remote"))]
            Some(never) => match *never {},
        }
    }
}
