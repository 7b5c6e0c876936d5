//! The host backend: positional POSIX reads into system memory that stands for the device.
//!
//! It lets everything run without a GPU, and is a real loader for CPU inference. An optional
//! capacity caps its "device" so the host-assembly fallback can be seen. Reads are `pread`s
//! (no shared file cursor), so one file may be read from several threads at once.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::checkpoint::FileIdentity;
use crate::error::{AllocError, DeviceError, ReadError};
use crate::memory::{DeviceRegion, HostBytes, HostMemory};
use crate::traits::{DeviceAllocator, DeviceBuffer, IoMode, MemoryInfo, Reader};

/// Alignment of small host "device" buffers: enough for every dtype, and what `calloc` gives,
/// so they come zeroed without a second pass. Buffers of [`HostBytes::MMAP_THRESHOLD`] or more
/// are page-aligned mappings.
pub const HOST_BUFFER_ALIGN: usize = 16;

/// How long a `/proc/meminfo` reading stands in for the system's free memory; in between, bytes
/// this allocator handed out are subtracted from it.
const MEMINFO_REFRESH: std::time::Duration = std::time::Duration::from_millis(50);

/// Opens `path` read-only if it is a regular file, without blocking on a fifo (`O_NONBLOCK`,
/// which does not affect regular files). The shared way readers open checkpoint files.
pub fn open_regular_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Reads files with `pread` into host memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostReader;

/// A file opened by [`HostReader`].
#[derive(Debug)]
pub struct HostFile {
    file: File,
}

impl HostFile {
    /// The open file's identity now (`fstat`); `None` when it cannot be inspected.
    fn identity(&self) -> Option<FileIdentity> {
        self.file.metadata().ok().map(|m| FileIdentity::of(&m))
    }
}

impl Reader for HostReader {
    type Space = HostMemory;
    type File = HostFile;

    fn name(&self) -> &str {
        "host"
    }

    fn mode(&self) -> IoMode {
        IoMode::Posix
    }

    fn open(&self, path: &Path) -> Result<HostFile, ReadError> {
        Ok(HostFile {
            file: open_regular_file(path)?,
        })
    }

    fn read_at(
        &self,
        file: &HostFile,
        offset: u64,
        mut dst: DeviceRegion<'_, HostMemory>,
    ) -> Result<usize, ReadError> {
        Ok(file.file.read_at(dst.as_mut_slice(), offset)?)
    }

    fn identity_of(&self, file: &HostFile) -> Option<FileIdentity> {
        file.identity()
    }
}

/// System memory standing for device memory, optionally capped.
#[derive(Debug, Clone, Default)]
pub struct HostAllocator {
    capacity: Option<u64>,
    used: Arc<AtomicU64>,
    snapshot: Arc<std::sync::Mutex<Option<MeminfoSnapshot>>>,
}

/// A `/proc/meminfo` reading and this allocator's use at the time.
#[derive(Debug, Clone, Copy)]
struct MeminfoSnapshot {
    taken: std::time::Instant,
    info: MemoryInfo,
    used: u64,
}

/// A host "device" buffer. Dropping it returns its bytes to the allocator's capacity.
#[derive(Debug)]
pub struct HostBuffer {
    bytes: HostBytes,
    used: Arc<AtomicU64>,
}

impl HostBuffer {
    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        self.used
            .fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
    }
}

// SAFETY: the buffer owns its `HostBytes` allocation exclusively; `addr` and `len` are those of
// the allocation and never change; `region` covers exactly it.
unsafe impl DeviceBuffer for HostBuffer {
    type Space = HostMemory;

    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn addr(&self) -> usize {
        self.bytes.as_ptr() as usize
    }

    fn region(&mut self) -> DeviceRegion<'_, HostMemory> {
        self.bytes.region()
    }
}

impl HostAllocator {
    /// An allocator limited only by the machine's memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// An allocator whose device holds at most `bytes`.
    pub fn with_capacity(bytes: u64) -> Self {
        Self {
            capacity: Some(bytes),
            ..Self::default()
        }
    }

    /// Bytes in live buffers.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    fn reserve(&self, len: u64) -> Result<(), AllocError> {
        let Some(capacity) = self.capacity else {
            self.used.fetch_add(len, Ordering::AcqRel);
            return Ok(());
        };
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(len).filter(|&total| total <= capacity)
            })
            .map(|_| ())
            .map_err(|used| AllocError::OutOfMemory {
                requested: len as usize,
                detail: format!("{used} of {capacity} bytes in use"),
            })
    }
}

impl DeviceAllocator for HostAllocator {
    type Space = HostMemory;
    type Buffer = HostBuffer;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        match self.capacity {
            Some(total) => Ok(MemoryInfo {
                free: total.saturating_sub(self.used()),
                total,
            }),
            None => Ok(self.system_memory_cached()),
        }
    }

    fn allocate(&self, len: usize) -> Result<HostBuffer, AllocError> {
        self.reserve(len as u64)?;
        match HostBytes::zeroed(len, HOST_BUFFER_ALIGN) {
            Some(bytes) => Ok(HostBuffer {
                bytes,
                used: Arc::clone(&self.used),
            }),
            None => {
                self.used.fetch_sub(len as u64, Ordering::AcqRel);
                Err(AllocError::OutOfMemory {
                    requested: len,
                    detail: "the system allocator refused".into(),
                })
            }
        }
    }

    fn copy_to_host(
        &self,
        src: &HostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        DeviceError::check_bounds("copy_to_host", src.bytes.len(), offset, dst.len())?;
        // Exactly the range, through a raw pointer: `src` may be a block whose other pieces
        // pool threads are writing.
        src.bytes
            .copy_range_to(offset, dst)
            .ok_or_else(|| DeviceError::new("copy_to_host", "out of bounds"))
    }
}

impl HostAllocator {
    /// The system's free memory without reading `/proc/meminfo` for every tensor: a reading at
    /// most [`MEMINFO_REFRESH`] old, less what this allocator handed out since.
    fn system_memory_cached(&self) -> MemoryInfo {
        let mut slot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        let used = self.used();
        let fresh = slot.filter(|s| s.taken.elapsed() < MEMINFO_REFRESH);
        let snapshot = match fresh {
            Some(s) => s,
            None => {
                let info = system_memory().unwrap_or(MemoryInfo {
                    free: u64::MAX,
                    total: u64::MAX,
                });
                let s = MeminfoSnapshot {
                    taken: std::time::Instant::now(),
                    info,
                    used,
                };
                *slot = Some(s);
                s
            }
        };
        let since = used.saturating_sub(snapshot.used);
        MemoryInfo {
            free: snapshot.info.free.saturating_sub(since),
            total: snapshot.info.total,
        }
    }
}

/// `MemAvailable` and `MemTotal` from `/proc/meminfo`.
fn system_memory() -> Option<MemoryInfo> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    Some(MemoryInfo {
        free: field("MemAvailable:")?,
        total: field("MemTotal:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_enforced_and_returned_on_drop() {
        let alloc = HostAllocator::with_capacity(100);
        let a = alloc.allocate(60).unwrap();
        assert!(matches!(
            alloc.allocate(41),
            Err(AllocError::OutOfMemory { requested: 41, .. })
        ));
        assert_eq!(
            alloc.memory_info().unwrap(),
            MemoryInfo {
                free: 40,
                total: 100
            }
        );
        let b = alloc.allocate(40).unwrap();
        drop(a);
        assert_eq!(alloc.used(), 40);
        drop(b);
        assert_eq!(alloc.used(), 0);
    }

    #[test]
    fn copy_to_host_checks_bounds() {
        let alloc = HostAllocator::new();
        let mut buf = alloc.allocate(8).unwrap();
        buf.region()
            .as_mut_slice()
            .copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut out = [0u8; 3];
        alloc.copy_to_host(&buf, 5, &mut out).unwrap();
        assert_eq!(out, [6, 7, 8]);
        assert!(alloc.copy_to_host(&buf, 6, &mut out).is_err());
        assert!(alloc.copy_to_host(&buf, usize::MAX, &mut out).is_err());
    }

    #[test]
    fn opening_a_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(HostReader.open(dir.path()).is_err());
    }
}

/// Reads files with `O_DIRECT`, bypassing the page cache: for a first, cold load of a checkpoint
/// larger than memory, where caching pages that are read once only evicts others.
///
/// `O_DIRECT` needs the file offset, the length and the memory address aligned to the
/// filesystem's block size, which tensors are not; each read goes through an aligned bounce
/// buffer covering the requested range rounded out to [`DIRECT_IO_ALIGN`], and the wanted bytes
/// are copied to the destination. A filesystem without `O_DIRECT` support fails at `open`.
#[derive(Debug)]
pub struct DirectHostReader {
    bounce_size: usize,
    pool: std::sync::Mutex<Vec<HostBytes>>,
}

/// The alignment `O_DIRECT` reads use (covers 512-byte and 4 KiB block devices).
pub const DIRECT_IO_ALIGN: u64 = 4096;

impl Default for DirectHostReader {
    fn default() -> Self {
        Self::new(16 << 20)
    }
}

impl DirectHostReader {
    /// A reader whose bounce buffers hold `bounce_size` bytes (rounded up to the alignment,
    /// plus one block each side).
    pub fn new(bounce_size: usize) -> Self {
        let align = DIRECT_IO_ALIGN as usize;
        Self {
            bounce_size: bounce_size.div_ceil(align).max(1) * align + 2 * align,
            pool: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Reader for DirectHostReader {
    type Space = HostMemory;
    type File = HostFile;

    fn name(&self) -> &str {
        "host"
    }

    fn mode(&self) -> IoMode {
        IoMode::Direct
    }

    fn open(&self, path: &Path) -> Result<HostFile, ReadError> {
        // The regular-file check first: O_DIRECT on a fifo or device would block or fail oddly.
        drop(open_regular_file(path)?);
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| {
                ReadError::Io(io::Error::new(
                    e.kind(),
                    format!("opening with O_DIRECT (does this filesystem support it?): {e}"),
                ))
            })?;
        Ok(HostFile { file })
    }

    fn read_at(
        &self,
        file: &HostFile,
        offset: u64,
        mut dst: DeviceRegion<'_, HostMemory>,
    ) -> Result<usize, ReadError> {
        if dst.is_empty() {
            return Ok(0);
        }
        let start = offset - offset % DIRECT_IO_ALIGN;
        let lead = (offset - start) as usize;
        let mut bounce = match self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(b) => b,
            None => {
                HostBytes::zeroed(self.bounce_size, DIRECT_IO_ALIGN as usize).ok_or_else(|| {
                    ReadError::Io(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        "O_DIRECT bounce buffer",
                    ))
                })?
            }
        };
        let wanted =
            (lead + dst.len()).div_ceil(DIRECT_IO_ALIGN as usize) * DIRECT_IO_ALIGN as usize;
        let span = wanted.min(bounce.len());
        let result = file.file.read_at(&mut bounce[..span], start);
        let outcome = match result {
            Ok(got) if got <= lead => Ok(0),
            Ok(got) => {
                let useful = (got - lead).min(dst.len());
                dst.as_mut_slice()[..useful].copy_from_slice(&bounce[lead..lead + useful]);
                Ok(useful)
            }
            Err(e) => Err(ReadError::Io(e)),
        };
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(bounce);
        outcome
    }

    fn identity_of(&self, file: &HostFile) -> Option<FileIdentity> {
        file.identity()
    }
}
