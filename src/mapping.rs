//! Host tensors from local files, handed out as private mappings of their files
//! ([`StagingPath::Mapped`]): the page cache is their memory, nothing is copied, and a tensor
//! whose pages are not all in the page cache is made resident (`MADV_POPULATE_READ`) before it
//! is handed out, so a file that cannot be read where a tensor lies *at hand-out* is an error
//! naming the tensor, file and offset rather than a `SIGBUS` when the caller touches it. Pages
//! the kernel later evicts are read again on touch, and a read failing then is a `SIGBUS`, as
//! for any mapped file (`safetensors`' tensors included).
//!
//! Why, measured (1 GiB in 4 shards, fresh processes, this 2-core VM, 2026-12-03): with the
//! file in the page cache, mapping and touching every page took 0.014-0.020 s where reading
//! into fresh memory took 0.25-0.30 s; from a cold cache the two read at the disk's rate
//! (0.6-1.4 s). Populating from 2 to 8 threads at once was no faster cold (0.61-1.1 s) and
//! 4-5x slower warm (0.075 s: the threads contend for the process's page tables), so each
//! tensor is populated on the thread that asks for it.
//!
//! What a mapping implies, as for `safetensors`' own mapped tensors: writes to a tensor stay in
//! this process (the mapping is private, copy-on-write); a file modified in place while its
//! tensors live may show through, and one truncated under them makes touching the lost pages
//! fault. Replace checkpoint files by renaming a new file over the old (as the Hub's cache and
//! every writer we know do), or load with `map=false`.
//!
//! A mapping holds no file descriptor: descriptors of mapped files are kept in a small cache
//! ([`Descriptors`]), each opened again by its path when needed and used only while the path
//! still names the file mapped, so a load or a handle over thousands of files holds a few.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use memmap2::{Advice, MmapMut, MmapOptions};
#[cfg(doc)]
use staging_core::StagingPath;
use staging_core::host::open_regular_file;
use staging_core::{FileIdentity, Recent, ShardFile};

/// Whether this kernel can populate a mapping and report a failure (`MADV_POPULATE_READ`,
/// Linux 5.14): without it a mapped tensor's read error would be a `SIGBUS`, so nothing is
/// mapped.
pub(crate) fn populate_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        MmapOptions::new()
            .len(4096)
            .map_anon()
            .and_then(|map| map.advise(Advice::PopulateRead))
            .is_ok()
    })
}

/// One file, mapped privately (`MAP_PRIVATE`, readable and writable: copy-on-write).
pub(crate) struct Mapping {
    map: MmapMut,
    /// The first byte's address, taken once from the mapping's own mutable pointer: tensors
    /// write through it (their own bytes; copy-on-write) and read through it.
    base: usize,
    /// The file mapped: its device and inode.
    file: FileKey,
}

/// A file by its device and inode: what a cache of files by path checks before handing one
/// back (the path may name another file since, read again under another header).
pub(crate) type FileKey = (u64, u64);

/// The file `shard`'s header was read from.
pub(crate) fn key_of(shard: &ShardFile) -> FileKey {
    (shard.identity.dev, shard.identity.ino)
}

impl Mapping {
    /// The file's length: the mapping's.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether this maps the file `shard`'s header was read from.
    pub(crate) fn maps(&self, shard: &ShardFile) -> bool {
        self.file == key_of(shard)
    }

    /// Maps the file `shard` describes: the descriptor `descriptors` holds of it, or the file
    /// its path names now, either checked against the identity its header was read with (the
    /// same file, unchanged). `Ok(None)` when the system has no memory for the mapping
    /// (`ENOMEM`: an address space limit, the map count, or strict overcommit charging the
    /// copy-on-write mapping): an allocation failure, after which the load reads into memory
    /// of its own instead.
    pub(crate) fn open(
        shard: &ShardFile,
        descriptors: &Descriptors,
    ) -> staging_core::Result<Option<Arc<Mapping>>> {
        let Some(file) = descriptors.get_or_open(shard)? else {
            return Err(no_longer_there(shard));
        };
        still_unchanged(shard, &file)?;
        let mut map = match map_private(&file) {
            Ok(map) => map,
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => return Ok(None),
            Err(source) => {
                return Err(staging_core::Error::Io {
                    path: shard.path.to_path_buf(),
                    source,
                });
            }
        };
        let base = map.as_mut_ptr() as usize;
        Ok(Some(Arc::new(Self {
            map,
            base,
            file: key_of(shard),
        })))
    }

    /// Makes `[offset, offset + len)` resident: read from the file where the page cache does not
    /// hold it, mapped into this process. `Err` is why the pages cannot be read (the file is
    /// shorter than its header says, or the read failed).
    /// `file` is the mapped file, open, where a descriptor of it is at hand (to ask the page
    /// cache what it holds; without one the range is populated). When the range must be read,
    /// up to `ahead` bytes after it are asked of the kernel first, to be read in the background
    /// (what a reader of part of a tensor asks for next, in file order).
    pub(crate) fn populate(
        &self,
        file: Option<&File>,
        offset: usize,
        len: usize,
        ahead: usize,
    ) -> std::io::Result<()> {
        if len == 0 || file.is_some_and(|file| resident(file, offset, len)) {
            return Ok(());
        }
        let end = offset.saturating_add(len);
        let ahead = ahead.min(self.map.len().saturating_sub(end));
        if ahead > 0 {
            // Advice only: a failure changes nothing but speed.
            let _ = self.map.advise_range(Advice::WillNeed, end, ahead);
        }
        self.map.advise_range(Advice::PopulateRead, offset, len)
    }
}

/// The error for `shard`, whose path names another file now or none: what its path shows.
pub(crate) fn no_longer_there(shard: &ShardFile) -> staging_core::Error {
    let detail = shard
        .identity
        .check(&shard.path)
        .err()
        .unwrap_or_else(|| "was replaced by another file".into());
    staging_core::Error::FileChanged {
        file: shard.path.to_path_buf(),
        detail,
    }
}

/// Checks that the open `file` is still the one `shard`'s header was read from, unchanged (its
/// size and modification time; the descriptor is of that file, `Descriptors` saw to it).
pub(crate) fn still_unchanged(shard: &ShardFile, file: &File) -> staging_core::Result<()> {
    let now = file
        .metadata()
        .map_err(|e| format!("cannot be inspected any more: {e}"))
        .and_then(|metadata| shard.identity.compare(&FileIdentity::of(&metadata)));
    now.map_err(|detail| staging_core::Error::FileChanged {
        file: shard.path.to_path_buf(),
        detail,
    })
}

/// Descriptors of the files a load or a reader maps, each the file its header was read from
/// (device and inode checked when it was opened), at most a few open: the least recently used
/// is closed first, and opened again by its path when asked for. Loads over any number of files
/// hold this many descriptors, not one a file.
pub(crate) struct Descriptors(Recent<(FileKey, Arc<File>)>);

impl Descriptors {
    /// At most `capacity` descriptors (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Self(Recent::new(capacity))
    }

    /// How many are open.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Closes every one (loads using one keep it until they are done with it).
    pub(crate) fn clear(&self) {
        self.0.clear();
    }

    /// A descriptor of the file `shard`'s header was read from: the one kept, else its path
    /// opened now. `Ok(None)` when the path names another file now (a file renamed over it), or
    /// none (removed): the file read from can no longer be opened by its path, and a mapping
    /// of it serves it still. `Err` when the path cannot be opened for another reason.
    pub(crate) fn get_or_open(&self, shard: &ShardFile) -> staging_core::Result<Option<Arc<File>>> {
        self.0.get_or_keep(
            &shard.path,
            // One of another file its path named before (read under an older header): declined.
            |(file, open)| (*file == key_of(shard)).then(|| Arc::clone(open)),
            || {
                let io = |source: std::io::Error| staging_core::Error::Io {
                    path: shard.path.to_path_buf(),
                    source,
                };
                let file = match open_regular_file(&shard.path) {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io(e)),
                };
                let now = FileIdentity::of(&file.metadata().map_err(io)?);
                if (now.dev, now.ino) != key_of(shard) {
                    return Ok(None);
                }
                let file = Arc::new(file);
                Ok(Some(((key_of(shard), Arc::clone(&file)), file)))
            },
        )
    }
}

/// Bytes after part of a tensor (rows, columns) that a read asks the kernel for ahead, when that
/// part was not in the page cache: the parts read next, in file order. Cold, 4 parts of every
/// tensor of a 1 GiB checkpoint were usable in 0.52 s with it and 0.73 s without (medians of 5,
/// 2026-12-03); whole tensors lost by it (0.89 s against 0.54 s for `load_file`: the kernel's
/// reads ahead then compete with the next tensor's own), so they do not ask.
pub(crate) const READ_AHEAD: usize = 32 << 20;

/// Whether every page of `[offset, offset + len)` is in the page cache, as `cachestat`
/// (Linux 6.5) counts them: such a range needs no read, so nothing can fail reading it,
/// and the caller's first touch of each page maps it (with its neighbours: the kernel's
/// fault-around) faster than populating it here would (1 GiB warm, this VM: touched in
/// 0.011-0.014 s, populated in 0.016-0.020 s; counted by `cachestat` in 1.4 ms, by
/// `mincore` page by page in about 20 ms). `false` where `cachestat` is missing or fails
/// (older kernels; some refuse it on files the caller cannot write): the range is then
/// populated.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn resident(file: &File, offset: usize, len: usize) -> bool {
    /// `cachestat`'s number in the unified syscall table (x86-64 and AArch64 both).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Counts {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let page = page_size() as u64;
    let (Ok(start), Ok(len)) = (u64::try_from(offset), u64::try_from(len)) else {
        return false;
    };
    let first = start / page;
    let pages = (start + len).div_ceil(page) - first;
    let range = Range {
        off: first * page,
        len: pages * page,
    };
    let mut counts = Counts::default();
    // SAFETY: `cachestat(fd, range, counts, flags)` reads `range` and writes `counts`, both
    // live `repr(C)` values laid out as the kernel's `struct cachestat_range` and `struct
    // cachestat`; `file` is open across the call.
    let status = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut counts as *mut Counts,
            0 as libc::c_uint,
        )
    };
    status == 0 && counts.nr_cache >= pages
}

/// Elsewhere every range is populated (`cachestat`'s number is not checked there).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn resident(_: &File, _: usize, _: usize) -> bool {
    false
}

/// Maps `file` privately, copy-on-write.
fn map_private(file: &File) -> std::io::Result<MmapMut> {
    // SAFETY: a private mapping of a file is memory other processes can still change (a write
    // to the file in place shows through pages not yet copied) or take away (a truncation
    // makes them fault). This is the contract of every mapped tensor, `safetensors`' included,
    // and the module's documentation and the user guide state it: the library itself never
    // writes the file, never creates a `&mut` to the mapping's bytes while a `&` exists (tensors
    // are disjoint ranges, each read or written through its own pointer), and unmaps only when
    // the last tensor holding the mapping is dropped.
    unsafe { MmapOptions::new().map_copy(file) }
}

/// Whether `file` is on a network or user-space file system, where a mapping's page faults are
/// round trips and reads of our own are the better path.
pub(crate) fn on_network_file_system(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const NETWORK: [i64; 16] = [
        0x6969,                // NFS
        0x517B,                // SMB
        0xFF53_4D42u32 as i64, // CIFS
        0xFE53_4D42u32 as i64, // SMB2
        0x6573_5546,           // FUSE
        0x00C3_6400,           // Ceph
        0x0102_1997,           // 9p
        0x5346_414F,           // AFS
        0x7375_7245,           // Coda
        0x0BD0_0BD0,           // Lustre
        0x0116_1970,           // GFS2
        0x7461_636F,           // OCFS2
        0x6B41_4653,           // kAFS
        0x4750_4653,           // GPFS
        0x1983_0326,           // BeeGFS
        0x786F_4256,           // vboxsf
    ];
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `name` is a NUL-terminated path that lives across the call, and `stat` is memory
    // of a `statfs`, which the call fills on success and which is read only then.
    let kind = unsafe {
        if libc::statfs(name.as_ptr(), stat.as_mut_ptr()) != 0 {
            return false;
        }
        stat.assume_init().f_type
    };
    #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs between targets
    NETWORK.contains(&(kind as i64))
}

/// A tensor's bytes in a private mapping of its file ([`StagingPath::Mapped`]); the mapping
/// lives until the last tensor in it is dropped.
pub struct MappedBytes {
    mapping: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedBytes")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl MappedBytes {
    /// `len` bytes of `mapping` from `offset` (within it: the caller checked).
    pub(crate) fn new(mapping: Arc<Mapping>, offset: usize, len: usize) -> Self {
        Self {
            mapping,
            offset,
            len,
        }
    }

    /// The address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        (self.mapping.base + self.offset) as *const u8
    }

    /// The address of the first byte, for writing: writes stay in this process (the mapping is
    /// copy-on-write) and change this tensor's bytes only.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        (self.mapping.base + self.offset) as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for MappedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `[offset, offset + len)` lies inside the mapping (checked when this was made),
        // which `self` keeps mapped; the slice covers this tensor's bytes only (never the whole
        // mapping, whose other tensors' bytes may be written through their own pointers), and a
        // write through `as_mut_ptr` needs the caller not to hold this slice meanwhile, as for
        // any pointer a tensor hands out.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: `sysconf` reads a system constant; it has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size)
            .ok()
            .filter(|&s| s > 0)
            .unwrap_or(4096)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code asserts by panicking

    use std::io::{Read, Write};

    use super::*;

    /// Whether this kernel has `cachestat` (an unknown call is `ENOSYS`; a bad descriptor to a
    /// known one `EBADF`).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn kernel_has_cachestat() -> bool {
        // SAFETY: with descriptor -1 the call fails before reading or writing its pointers.
        let status = unsafe {
            libc::syscall(
                451,
                -1,
                std::ptr::null::<u8>(),
                std::ptr::null_mut::<u8>(),
                0,
            )
        };
        status == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn a_file_just_read_is_resident_and_its_pages_are_counted() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 3 * 4096 + 100]).unwrap();
        file.sync_all().unwrap();
        let mut back = Vec::new();
        std::io::Seek::rewind(&mut file).unwrap();
        file.read_to_end(&mut back).unwrap();
        let len = back.len();
        if !kernel_has_cachestat() {
            // Not a pass: said on the test's output, and `resident` is then always false, which
            // the next assertion still checks.
            eprintln!("this kernel has no cachestat: every mapped range is populated");
            assert!(!resident(&file, 0, len));
            return;
        }
        assert!(resident(&file, 0, len));
        assert!(resident(&file, 4096 + 10, 200));
        // Past the end there is nothing in the page cache.
        assert!(!resident(&file, 0, len + 8 * 4096));
    }
}
