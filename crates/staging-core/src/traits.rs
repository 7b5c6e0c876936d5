//! The three backend traits: [`Reader`], [`DeviceAllocator`] (with its [`DeviceBuffer`]) and
//! [`Destination`], and the errors they return.
//!
//! Backends implement `Reader` and `DeviceAllocator` for one [`MemorySpace`]; callers implement
//! `Destination` to receive tensors in memory they own. The contracts written on each method are
//! what the stager relies on; the conformance suite in `backend-mock` checks them.

use std::fmt;
use std::path::Path;

use crate::checkpoint::{FileIdentity, TensorMeta};
use crate::error::{AllocError, DestinationError, DeviceError, ReadError};
use crate::memory::{DeviceRegion, MemorySpace};

/// Free and total device memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes the device could allocate now.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// How a reader moves bytes, as reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoMode {
    /// Positional reads (`pread`): straight into memory the CPU addresses (host backend), or
    /// into pinned host buffers copied to the device (the GPU backends' POSIX path).
    Posix,
    /// `O_DIRECT` reads through aligned bounce buffers, past the page cache.
    Direct,
    /// GPUDirect Storage: cuFile with nvidia-fs.
    Gds,
    /// cuFile's compatibility mode (its own POSIX path).
    Compat,
    /// hipFile (its fastpath or its own fallback; hipFile chooses inside).
    HipFile,
    /// GDS, and the POSIX path for files that could not be registered.
    GdsAndPosix,
    /// cuFile's compatibility mode, and the POSIX path for files that could not be registered.
    CompatAndPosix,
    /// hipFile, and the POSIX path for files that could not be registered.
    HipFileAndPosix,
    /// Ranged GETs from object storage or an HTTP server: straight into host memory, or into
    /// pinned host buffers copied to the device.
    Remote,
    /// Private mappings of local files, the pages of each tensor not all in the page cache made
    /// resident before it is handed out (`MADV_POPULATE_READ`): the host backend's tensors for
    /// host memory.
    Mapped,
}

impl IoMode {
    /// The name reports use: `posix`, `direct`, `gds`, `compat`, `hipfile`, `gds+posix`,
    /// `compat+posix`, `hipfile+posix`, `remote`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Posix => "posix",
            Self::Direct => "direct",
            Self::Gds => "gds",
            Self::Compat => "compat",
            Self::HipFile => "hipfile",
            Self::GdsAndPosix => "gds+posix",
            Self::CompatAndPosix => "compat+posix",
            Self::HipFileAndPosix => "hipfile+posix",
            Self::Remote => "remote",
            Self::Mapped => "mmap",
        }
    }

    /// This mode with the POSIX path added for some files.
    pub fn with_posix_files(self) -> Self {
        match self {
            Self::Gds => Self::GdsAndPosix,
            Self::Compat => Self::CompatAndPosix,
            Self::HipFile => Self::HipFileAndPosix,
            other => other,
        }
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for IoMode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Reads file bytes into memory of one space.
///
/// # Contract
///
/// - `read_at` is positional: it never moves a shared file cursor, and calls on the same file
///   from several threads at once are allowed.
/// - `read_at` returns how many bytes it wrote to the start of `dst`, between 1 and `dst.len()`
///   when `dst` is not empty. It may return fewer than asked (a short read); the caller continues
///   from there. `Ok(0)` means the file ended.
/// - On `Err` the contents of `dst` are unspecified; the caller discards them.
/// - A reader only ever writes inside `dst`.
pub trait Reader: Send + Sync {
    /// The memory space this reader writes into.
    type Space: MemorySpace;
    /// An open file, shareable between threads.
    type File: Send + Sync;

    /// The backend's name for reports ("host", "cufile").
    fn name(&self) -> &str;

    /// How this reader moves bytes, for reports.
    fn mode(&self) -> IoMode;

    /// Opens a file for reading.
    fn open(&self, path: &Path) -> Result<Self::File, ReadError>;

    /// Opens a file for reading anew, never handing back one kept from before (a reader that
    /// keeps its files, [`KeepOpen`](crate::KeepOpen), replaces the one it kept): what a load
    /// asks for when the file [`open`](Self::open) gave is not the one whose header it read
    /// (a file kept from an older header of the same path). By default, `open`.
    fn reopen(&self, path: &Path) -> Result<Self::File, ReadError> {
        self.open(path)
    }

    /// Reads up to `dst.len()` bytes at `offset` of `file` into `dst`.
    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        dst: DeviceRegion<'_, Self::Space>,
    ) -> Result<usize, ReadError>;

    /// How this reader knows a file is still the one whose header was read, for the report's
    /// `unchanged_by`: by default `file-identity` (device, inode, size and modification time on
    /// the local file system, as [`verify_unchanged`](Self::verify_unchanged) checks); a reader
    /// of another store names its own way (`etag`, `last-modified`, `size`).
    fn unchanged_by(&self) -> &'static str {
        "file-identity"
    }

    /// Each redirect this reader followed to another host than the one asked for, as
    /// `URL -> host[:port]`, for the report's `redirects`: by default none (local files).
    fn redirects(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether `path` is still the file whose header was read (`identity`), checked when a file
    /// is opened and after every tensor is read, before it is handed out; `Err` says what
    /// changed. By default, the file's metadata on the local file system; a reader of another
    /// store checks its own way (an object's version tag, say).
    fn verify_unchanged(&self, path: &Path, identity: &FileIdentity) -> Result<(), String> {
        identity.check(path)
    }

    /// The identity of the open `file` as it is now (`fstat` of the descriptor it reads
    /// through), where the reader can tell it: a load then checks the file it has open, not
    /// whatever its path names now, so a file renamed over it is still read whole and
    /// consistently (as `safetensors` reads the file it mapped), and one changed in place is
    /// refused. `None` (the default: a store with no descriptors) checks by path with
    /// [`verify_unchanged`](Self::verify_unchanged).
    fn identity_of(&self, file: &Self::File) -> Option<FileIdentity> {
        let _ = file;
        None
    }
}

/// A shared reader reads like the reader it shares (so one backend, opened once, serves several
/// loads, with its pooled buffers).
impl<R: Reader + ?Sized> Reader for std::sync::Arc<R> {
    type Space = R::Space;
    type File = R::File;

    fn name(&self) -> &str {
        (**self).name()
    }

    fn mode(&self) -> IoMode {
        (**self).mode()
    }

    fn open(&self, path: &Path) -> Result<Self::File, ReadError> {
        (**self).open(path)
    }

    fn reopen(&self, path: &Path) -> Result<Self::File, ReadError> {
        (**self).reopen(path)
    }

    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        dst: DeviceRegion<'_, Self::Space>,
    ) -> Result<usize, ReadError> {
        (**self).read_at(file, offset, dst)
    }

    fn unchanged_by(&self) -> &'static str {
        (**self).unchanged_by()
    }

    fn redirects(&self) -> Vec<String> {
        (**self).redirects()
    }

    fn verify_unchanged(&self, path: &Path, identity: &FileIdentity) -> Result<(), String> {
        (**self).verify_unchanged(path, identity)
    }

    fn identity_of(&self, file: &Self::File) -> Option<FileIdentity> {
        (**self).identity_of(file)
    }
}

/// An owned allocation of device memory. Dropping it frees it.
///
/// # Safety
///
/// The library computes addresses from what a buffer says about itself (the sub-allocator
/// carves tensors out of `[addr, addr + len)`, readers write there), so an implementation must
/// guarantee:
///
/// - `[addr(), addr() + len())` is memory of [`Self::Space`] that this buffer owns exclusively
///   from its creation until it is dropped, and that nothing else reads or writes meanwhile
///   except through this buffer;
/// - `len()` and `addr()` return the same values every time they are called, and
///   `addr() + len()` does not overflow;
/// - `region()` describes exactly `[addr(), addr() + len())`.
///
/// ```compile_fail,E0200
/// // Implementing the trait without `unsafe` does not compile: the contract above is a promise.
/// use staging_core::{DeviceBuffer, DeviceRegion, HostMemory};
/// #[derive(Debug)]
/// struct Lying;
/// impl DeviceBuffer for Lying {
///     type Space = HostMemory;
///     fn len(&self) -> usize { usize::MAX }
///     fn addr(&self) -> usize { 0 }
///     fn region(&mut self) -> DeviceRegion<'_, HostMemory> { unimplemented!() }
/// }
/// ```
pub unsafe trait DeviceBuffer: Send + fmt::Debug {
    /// The memory space the buffer lives in.
    type Space: MemorySpace;

    /// Length in bytes, exactly what was asked of [`DeviceAllocator::allocate`].
    fn len(&self) -> usize;

    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of the first byte in the buffer's memory space.
    fn addr(&self) -> usize;

    /// The whole buffer as a writable region.
    fn region(&mut self) -> DeviceRegion<'_, Self::Space>;
}

/// Allocates device memory and copies it back to the host.
///
/// # Contract
///
/// - `memory_info` reports what the device could allocate now; it is advice, and an allocation
///   after a positive answer may still fail with out-of-memory (another process, a race).
/// - `allocate(len)` returns a buffer of exactly `len` bytes (zero is allowed), or
///   [`AllocError::OutOfMemory`] when memory is short, or [`AllocError::Failed`] for anything
///   else. It never panics on exhaustion.
/// - `copy_to_host(src, offset, dst)` copies `dst.len()` bytes starting at `offset` in `src` and
///   returns only when the bytes are in `dst`. An out-of-bounds request is an error. It reads
///   nothing of `src` outside that range: other threads may be writing the rest of an
///   allocation `src` was cut from.
pub trait DeviceAllocator: Send + Sync {
    /// The memory space buffers live in.
    type Space: MemorySpace;
    /// The owned allocation type.
    type Buffer: DeviceBuffer<Space = Self::Space>;

    /// Free and total memory of the device.
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError>;

    /// Allocates `len` bytes of device memory.
    fn allocate(&self, len: usize) -> Result<Self::Buffer, AllocError>;

    /// Copies `dst.len()` bytes from `src` at `offset` to host memory.
    fn copy_to_host(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError>;

    /// Whether [`split`](Self::split) can cut buffers. When it can, the stager reads runs of
    /// neighbouring small tensors into one buffer with one request and hands each tensor out as
    /// a piece of it. The default is `false`.
    fn splits(&self) -> bool {
        false
    }

    /// Cuts `buffer` into buffers of its own, one per `(offset, len)` piece (in increasing
    /// offset order, not overlapping, inside the buffer). Each piece frees independently; the
    /// memory is returned when the last piece is dropped. Bytes outside every piece are
    /// unreachable afterwards. An allocator that cannot split, or pieces that break these rules,
    /// give the buffer back unchanged (the default always does).
    fn split(
        &self,
        buffer: Self::Buffer,
        pieces: &[(usize, usize)],
    ) -> Result<Vec<Self::Buffer>, Self::Buffer> {
        let _ = pieces;
        Err(buffer)
    }
}

/// A shared allocator allocates like the allocator it shares (so a caller can keep a handle for
/// copying tensors back while a stager owns another).
impl<A: DeviceAllocator + ?Sized> DeviceAllocator for std::sync::Arc<A> {
    type Space = A::Space;
    type Buffer = A::Buffer;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        (**self).memory_info()
    }

    fn allocate(&self, len: usize) -> Result<Self::Buffer, AllocError> {
        (**self).allocate(len)
    }

    fn copy_to_host(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        (**self).copy_to_host(src, offset, dst)
    }

    fn splits(&self) -> bool {
        (**self).splits()
    }

    fn split(
        &self,
        buffer: Self::Buffer,
        pieces: &[(usize, usize)],
    ) -> Result<Vec<Self::Buffer>, Self::Buffer> {
        (**self).split(buffer, pieces)
    }
}

/// Caller-owned memory that tensors are read into, preferred over any allocation.
///
/// # Contract
///
/// - `region` is asked once per tensor, in file order, before the stager allocates anything for
///   that tensor.
/// - `Ok(Some(region))` takes the tensor: its bytes are written to the start of `region`. A
///   region shorter than the tensor is an error (never a truncation); a longer one is allowed.
/// - `Ok(None)` declines: the tensor takes the library's own paths.
/// - `Err` aborts the load with the error, naming the tensor.
pub trait Destination<S: MemorySpace> {
    /// Where `tensor`'s bytes should go, if the caller wants them.
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError>;

    /// Told of a tensor whose region this destination gave when the load fails before writing
    /// a byte of it: its memory holds what it held before. (A load that fails says so where it
    /// knows; a region given and never told of may hold some of the tensor's bytes.)
    fn unwritten(&mut self, tensor: &TensorMeta) {
        let _ = tensor;
    }
}

/// The destination that declines every tensor.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDestination;

impl<S: MemorySpace> Destination<S> for NoDestination {
    fn region(
        &mut self,
        _tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        Ok(None)
    }
}

impl<S: MemorySpace, D: Destination<S> + ?Sized> Destination<S> for Box<D> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        (**self).region(tensor)
    }

    fn unwritten(&mut self, tensor: &TensorMeta) {
        (**self).unwritten(tensor);
    }
}

impl<S: MemorySpace, D: Destination<S> + ?Sized> Destination<S> for &mut D {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        (**self).region(tensor)
    }

    fn unwritten(&mut self, tensor: &TensorMeta) {
        (**self).unwritten(tensor);
    }
}

/// A destination that answers with raw addresses, for callers that cannot name a memory-space
/// type (a C callback, a Python object). [`RawRegions`] turns it into a [`Destination`] of any
/// space.
///
/// # Safety
///
/// Every `Some((addr, capacity))` that `region(tensor, space)` returns must be
/// `[addr, addr + capacity)` of the memory space whose [`MemorySpace::NAME`] is `space`,
/// writable, with `addr + capacity` not overflowing, and neither read nor written by anything
/// else from the call until the load hands out that tensor or fails.
///
/// Where [`regions_disjoint`](Self::regions_disjoint) returns `true`, moreover, no two regions
/// given in one load share a byte, and each stays so across later calls of `region`.
pub unsafe trait RawDestination {
    /// Where `tensor`'s bytes should go, as `(address, capacity)`, if the caller wants them.
    fn region(
        &mut self,
        tensor: &TensorMeta,
        space: &'static str,
    ) -> Result<Option<(usize, usize)>, DestinationError>;

    /// Whether the regions given for the tensors of one load are disjoint and each stays
    /// untouched by anything else until the load hands out its tensor or fails, across later
    /// calls of `region` too (a model's weights: every tensor its own memory). A load may then
    /// ask for several regions before it fills them, and fill them at once. The default,
    /// `false`, promises nothing more than the trait's contract: each region is filled and its
    /// tensor handed out before the next region is asked for (so one buffer may serve every
    /// tensor in turn).
    fn regions_disjoint(&self) -> bool {
        false
    }

    /// As [`Destination::unwritten`]: a region given for `tensor` holds what it held.
    fn unwritten(&mut self, tensor: &TensorMeta) {
        let _ = tensor;
    }
}

// SAFETY: forwards to the boxed destination, which upholds the contract.
unsafe impl<D: RawDestination + ?Sized> RawDestination for Box<D> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
        space: &'static str,
    ) -> Result<Option<(usize, usize)>, DestinationError> {
        (**self).region(tensor, space)
    }

    fn regions_disjoint(&self) -> bool {
        (**self).regions_disjoint()
    }

    fn unwritten(&mut self, tensor: &TensorMeta) {
        (**self).unwritten(tensor);
    }
}

/// A [`RawDestination`] used as a [`Destination`] of any memory space.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawRegions<D>(pub D);

impl<S: MemorySpace, D: RawDestination> Destination<S> for RawRegions<D> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        let Some((addr, capacity)) = self.0.region(tensor, S::NAME)? else {
            return Ok(None);
        };
        if addr.checked_add(capacity).is_none() {
            return Err(format!("region at {addr:#x} of {capacity} bytes wraps around").into());
        }
        // SAFETY: the `RawDestination` contract: `[addr, addr + capacity)` is writable memory of
        // space `S` (the name passed in), untouched by anyone else until the tensor is handed
        // out, which the region's borrow of `self` covers.
        Ok(Some(unsafe {
            DeviceRegion::from_raw_parts(addr, capacity)
        }))
    }

    fn unwritten(&mut self, tensor: &TensorMeta) {
        self.0.unwritten(tensor);
    }
}
