//! The load report: where the tensors went, why any fell back, how much memory the library held,
//! and how fast it went.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::policy::{FallbackCause, StagingPath};
use crate::traits::IoMode;

/// Tensors and bytes that took one path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathCount {
    /// How many tensors.
    pub tensors: usize,
    /// How many bytes.
    pub bytes: u64,
}

/// Totals per path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathTotals {
    /// Read into the caller's destinations.
    pub destination: PathCount,
    /// Read into device buffers of their own.
    pub device: PathCount,
    /// Assembled in host memory.
    pub host: PathCount,
    /// Mapped from their files (host tensors from local files).
    pub mapped: PathCount,
}

impl PathTotals {
    /// The count for one path.
    pub fn get(&self, path: StagingPath) -> PathCount {
        match path {
            StagingPath::Destination => self.destination,
            StagingPath::Device => self.device,
            StagingPath::Host => self.host,
            StagingPath::Mapped => self.mapped,
        }
    }

    /// Counts one more tensor of `bytes` on `path`.
    pub fn add(&mut self, path: StagingPath, bytes: u64) {
        let slot = match path {
            StagingPath::Destination => &mut self.destination,
            StagingPath::Device => &mut self.device,
            StagingPath::Host => &mut self.host,
            StagingPath::Mapped => &mut self.mapped,
        };
        slot.tensors += 1;
        slot.bytes += bytes;
    }
}

/// Host-path tensors by why they did not go to the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Fallbacks {
    /// Free memory was below `len + headroom(len)`.
    pub insufficient_memory: usize,
    /// The device allocation failed with out-of-memory after the free-memory check passed.
    pub allocation_race: usize,
}

impl Fallbacks {
    pub(crate) fn add(&mut self, cause: FallbackCause) {
        match cause {
            FallbackCause::InsufficientMemory => self.insufficient_memory += 1,
            FallbackCause::AllocationRace => self.allocation_race += 1,
        }
    }
}

/// What a load did. Serializes to the JSON report of the `stage` command.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoadReport {
    /// The reader's backend name.
    pub backend: String,
    /// How the reader moved bytes.
    pub mode: IoMode,
    /// Backends passed over before this one was chosen, each with why (`"cufile: no CUDA
    /// driver: ..."`); empty unless the backend was chosen automatically.
    pub passed_over: Vec<String>,
    /// How the reader knows each file is still the one whose header was read (the weakest over
    /// the files): `file-identity` for local files (device, inode, size, modification time),
    /// and for object storage `etag`, `last-modified` or `size` (a replacement of the same size
    /// is then not seen).
    pub unchanged_by: &'static str,
    /// Each redirect the reader followed to another host than the one asked for, as
    /// `URL -> host[:port]`: where the bytes of that URL really came from (none for local
    /// files, and none when every response came from the host asked for).
    pub redirects: Vec<String>,
    /// Why the backend runs its POSIX path when its library's own path was asked for
    /// automatically and could not run (no usable `libcufile`, say); `None` otherwise.
    pub mode_reason: Option<String>,
    /// Files in the checkpoint.
    pub files: usize,
    /// Headers read to open the checkpoint: every file's, or, where a selection narrowed a
    /// checkpoint with an index, those of the shards holding a selected tensor.
    pub headers_read: usize,
    /// Tensors staged so far.
    pub tensors: usize,
    /// Bytes staged so far.
    pub bytes: u64,
    /// Seconds from the first tensor asked for to the last one staged (or now).
    pub seconds: f64,
    /// `bytes / seconds`.
    pub bytes_per_second: f64,
    /// Totals per path.
    pub paths: PathTotals,
    /// Fallbacks by cause.
    pub fallbacks: Fallbacks,
    /// The most device bytes the library's buffers held at once (staging buffers, and tensors
    /// handed out and not yet dropped or taken by the caller).
    pub peak_device_bytes: u64,
    /// Device bytes the caller took ownership of (`DeviceTensor::take`): the caller's from
    /// then on, counted against a memory budget until dropped.
    pub taken_device_bytes: u64,
    /// The most host bytes the library's buffers held at once (host-assembled tensors not yet
    /// dropped or taken with `into_bytes`).
    pub peak_host_bytes: u64,
    /// Read calls made to the backend's reader. One per chunk, or per run of coalesced small
    /// tensors, plus one for every short read continued.
    pub read_requests: u64,
    /// Bytes the backend's reader returned from storage. For a full load this equals `bytes`;
    /// with a selection or row ranges, only the bytes of what was asked for are read. A mapped
    /// tensor counts its bytes, as a read served by the page cache does (one read request
    /// each).
    pub bytes_read: u64,
    /// For a model read from the Hugging Face Hub (`hf://`): the commit the revision named,
    /// the files read and where their bytes came from. `None` for any other source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub: Option<HubReport>,
}

/// What a load from the Hugging Face Hub read: the one answer to which commit, and which
/// files, for every door (the transformers helper takes its config from that commit).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HubReport {
    /// The repository (`org/name`).
    pub repo: String,
    /// The revision asked for (`main`, a tag, a commit).
    pub revision: String,
    /// The commit it named when the load opened (40 hex digits).
    pub commit: String,
    /// The path inside the repository asked for (`""`: its root).
    pub path: String,
    /// The snapshot in the Hugging Face cache the files are in (`snapshots/<commit>`; `None`
    /// with the cache off).
    pub snapshot: Option<std::path::PathBuf>,
    /// Whether the load read the snapshot alone (every weight was in the cache).
    pub cached: bool,
    /// The files read, as paths in the repository: the index (if any) and the weights.
    pub files: Vec<String>,
    /// Bytes received from the Hub (and its storage) since the model was opened: the small
    /// files fetched and the weights streamed.
    pub bytes_downloaded: u64,
    /// Bytes of the weights read from blobs in the cache (already there: another commit's, an
    /// earlier load's).
    pub bytes_from_cache: u64,
    /// Bytes written into the cache's blobs (files committed whole, after their check).
    pub bytes_written: u64,
    /// What did not go as asked, where the load went on without it: the Hub could not be asked
    /// (an outage: the cache served), or the cache could not be updated (read-only: the files
    /// came from another snapshot or from its blobs). `None` when all went as asked.
    pub note: Option<String>,
}

impl LoadReport {
    /// Adds `other`, a later load on the same backend, to this report: one report for a
    /// reader that loads tensor after tensor (counts, bytes and seconds add up; peaks are the
    /// highest of either; the mode becomes the later load's when it differs).
    pub fn absorb(&mut self, other: &LoadReport) {
        for (mine, theirs) in [
            (&mut self.paths.destination, other.paths.destination),
            (&mut self.paths.device, other.paths.device),
            (&mut self.paths.host, other.paths.host),
            (&mut self.paths.mapped, other.paths.mapped),
        ] {
            mine.tensors += theirs.tensors;
            mine.bytes += theirs.bytes;
        }
        self.fallbacks.insufficient_memory += other.fallbacks.insufficient_memory;
        self.fallbacks.allocation_race += other.fallbacks.allocation_race;
        self.tensors += other.tensors;
        self.bytes += other.bytes;
        self.seconds += other.seconds;
        self.bytes_per_second = if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        };
        self.peak_device_bytes = self.peak_device_bytes.max(other.peak_device_bytes);
        self.peak_host_bytes = self.peak_host_bytes.max(other.peak_host_bytes);
        self.taken_device_bytes += other.taken_device_bytes;
        self.read_requests += other.read_requests;
        self.bytes_read += other.bytes_read;
        self.files = self.files.max(other.files);
        self.headers_read = self.headers_read.max(other.headers_read);
        self.mode = other.mode;
        for redirect in &other.redirects {
            if !self.redirects.contains(redirect) {
                self.redirects.push(redirect.clone());
            }
        }
        // The Hub's counts run from the model's opening: the later load's are the total, and
        // a snapshot read alone counts every byte read.
        if let Some(theirs) = &other.hub {
            let mut hub = theirs.clone();
            if hub.cached {
                hub.bytes_from_cache = self.bytes_read;
            }
            self.hub = Some(hub);
        }
    }
}

/// One tensor as the JSON report lists it (`stage --json`'s `tensor_list`, and the Python
/// package's `report()`): one definition, so every door reports the same keys.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TensorRecord {
    /// The tensor's name.
    pub name: String,
    /// Its file.
    pub file: String,
    /// Its dtype as the format writes it (`"BF16"`).
    pub dtype: String,
    /// Its shape (narrowed for a row range).
    pub shape: Vec<usize>,
    /// Its length in bytes.
    pub bytes: usize,
    /// The path it took.
    pub path: StagingPath,
    /// The rows of dimension 0 it holds, when a row range was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<[usize; 2]>,
    /// The SHA-256 of its bytes, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl TensorRecord {
    /// The record of a tensor loaded by `path`, without a checksum.
    pub fn new(meta: &crate::TensorMeta, path: StagingPath) -> Self {
        Self {
            name: meta.name.clone(),
            file: meta.file.display().to_string(),
            dtype: meta.dtype_name(),
            shape: meta.shape.clone(),
            bytes: meta.len,
            path,
            rows: meta.row_range.as_ref().map(|r| [r.start, r.end]),
            sha256: None,
        }
    }
}

/// The JSON report: the [`LoadReport`]'s keys, then `tensor_list`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JsonReport {
    /// What the load did.
    #[serde(flatten)]
    pub report: LoadReport,
    /// Every tensor loaded, in order.
    pub tensor_list: Vec<TensorRecord>,
}

/// The bytes a load's buffers hold right now, readable after the load itself is gone (tensors
/// handed out keep their share): for checking that everything came back.
#[derive(Debug, Clone)]
pub struct HeldMemory(pub(crate) std::sync::Arc<Accounting>);

impl HeldMemory {
    /// A load that holds no buffers of its own (tensors mapped from their files: the page cache
    /// is their memory): every count reads 0.
    pub fn none() -> Self {
        Self(std::sync::Arc::default())
    }

    /// Device bytes the library's buffers hold (staging buffers, tensors not yet dropped).
    pub fn device_bytes(&self) -> u64 {
        self.0.device_now.load(Ordering::Acquire)
    }

    /// Host bytes the library's buffers hold (host-assembled tensors not yet dropped).
    pub fn host_bytes(&self) -> u64 {
        self.0.host_now.load(Ordering::Acquire)
    }

    /// Device bytes callers took from the load and have not dropped.
    pub fn caller_bytes(&self) -> u64 {
        self.0.caller_now.load(Ordering::Acquire)
    }
}

/// Live and peak bytes, shared by the stager and the buffers it hands out.
#[derive(Debug, Default)]
pub(crate) struct Accounting {
    device_now: AtomicU64,
    device_peak: AtomicU64,
    host_now: AtomicU64,
    host_peak: AtomicU64,
    caller_now: AtomicU64,
    caller_total: AtomicU64,
    read_requests: AtomicU64,
    bytes_read: AtomicU64,
}

/// Which counter a held allocation belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum MemoryKind {
    /// Device memory the library holds.
    Device,
    /// Host memory the library holds.
    Host,
    /// Device memory a caller took from the load.
    Caller,
}

impl Accounting {
    fn counters(&self, kind: MemoryKind) -> (&AtomicU64, &AtomicU64) {
        match kind {
            MemoryKind::Device => (&self.device_now, &self.device_peak),
            MemoryKind::Host => (&self.host_now, &self.host_peak),
            MemoryKind::Caller => (&self.caller_now, &self.caller_total),
        }
    }

    pub(crate) fn acquire(&self, kind: MemoryKind, bytes: u64) {
        let (now, peak) = self.counters(kind);
        let current = now.fetch_add(bytes, Ordering::AcqRel) + bytes;
        match kind {
            // For the caller's memory the second counter is a running total, not a peak.
            MemoryKind::Caller => peak.fetch_add(bytes, Ordering::AcqRel),
            MemoryKind::Device | MemoryKind::Host => peak.fetch_max(current, Ordering::AcqRel),
        };
    }

    pub(crate) fn release(&self, kind: MemoryKind, bytes: u64) {
        let (now, _) = self.counters(kind);
        now.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Device bytes in use by this load: the library's buffers and what callers took.
    pub(crate) fn device_in_use(&self) -> u64 {
        self.device_now.load(Ordering::Acquire) + self.caller_now.load(Ordering::Acquire)
    }

    pub(crate) fn count_request(&self) {
        self.read_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_bytes_read(&self, bytes: usize) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn read_requests(&self) -> u64 {
        self.read_requests.load(Ordering::Acquire)
    }

    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Acquire)
    }

    pub(crate) fn taken_total(&self) -> u64 {
        self.caller_total.load(Ordering::Acquire)
    }

    pub(crate) fn peaks(&self) -> (u64, u64) {
        (
            self.device_peak.load(Ordering::Acquire),
            self.host_peak.load(Ordering::Acquire),
        )
    }
}
