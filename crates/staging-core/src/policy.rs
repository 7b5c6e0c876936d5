//! The staging policy: which path a tensor takes, and the sizes the write loop works with.
//!
//! The contract (the README's "The staging policy, in plain words"): a caller's destination
//! first; else a device buffer of its own when free memory is at least `len + headroom(len)`,
//! `headroom(len) = max(256 MiB, len / 4)`; else, or when that allocation fails with
//! out-of-memory, host assembly through one bounded staging buffer. The headroom is a heuristic,
//! not a guarantee that later work will not run out of memory.
//!
//! A [`StagingPolicy`] is built by [`PolicyBuilder`], which refuses zero where zero means
//! nothing (a chunk, a staging buffer, a thread, a slot, a divisor): those fields are
//! `NonZero*`, so a policy that exists is a policy that works.

use std::num::{NonZeroU64, NonZeroUsize};

use crate::error::{Error, Result};

/// One mebibyte.
pub const MIB: u64 = 1024 * 1024;

/// The alignment, relative to the start of a run, of every tensor read as part of the run.
pub const COALESCE_ALIGN: u64 = 256;

/// Which path a tensor took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StagingPath {
    /// Read straight into the caller's destination.
    Destination,
    /// Read straight into a device buffer of its own.
    Device,
    /// Assembled in host memory through the staging buffer.
    Host,
    /// Handed out as a private (copy-on-write) mapping of its file: host tensors from local
    /// files, where the page cache is the memory and nothing is copied.
    Mapped,
}

impl StagingPath {
    /// The lowercase name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Destination => "destination",
            Self::Device => "device",
            Self::Host => "host",
            Self::Mapped => "mapped",
        }
    }
}

/// Why a tensor that could have gone to the device went to the host instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackCause {
    /// Free memory was below `len + headroom(len)`.
    InsufficientMemory,
    /// Free memory looked sufficient, but the allocation failed with out-of-memory.
    AllocationRace,
}

/// The numbers the stager works with. Defaults follow the README's policy section; build others
/// with [`StagingPolicy::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StagingPolicy {
    headroom_min: u64,
    headroom_divisor: NonZeroU64,
    chunk_size: NonZeroUsize,
    staging_size: NonZeroUsize,
    memory_budget: Option<u64>,
    io_threads: NonZeroUsize,
    staging_slots: NonZeroUsize,
    batch_bytes: usize,
    coalesce_below: usize,
    coalesce_bytes: usize,
    host_assembly: bool,
}

/// The default number of I/O threads: the machine's parallelism, at most 8. Measured on a 2-core
/// VM (`stage-bench --threads N`): 2 threads loaded a page-cached 2 GiB checkpoint 2.5 to 3.6
/// times faster than 1 thread; 4 threads were no faster than 2.
pub fn default_io_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
}

/// `n`, or 1 when `n` is zero.
const fn at_least_one(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => NonZeroUsize::MIN,
    }
}

impl Default for StagingPolicy {
    fn default() -> Self {
        Self {
            headroom_min: 256 * MIB,
            headroom_divisor: NonZeroU64::MIN.saturating_add(3),
            chunk_size: at_least_one(16 << 20),
            staging_size: at_least_one(16 << 20),
            memory_budget: None,
            io_threads: at_least_one(default_io_threads()),
            staging_slots: at_least_one(2),
            batch_bytes: 256 * MIB as usize,
            coalesce_below: MIB as usize,
            coalesce_bytes: 4 * MIB as usize,
            host_assembly: true,
        }
    }
}

impl StagingPolicy {
    /// A builder starting from the defaults.
    pub fn builder() -> PolicyBuilder {
        Self::default().to_builder()
    }

    /// A builder starting from this policy.
    pub fn to_builder(&self) -> PolicyBuilder {
        PolicyBuilder {
            headroom_min: self.headroom_min,
            headroom_divisor: self.headroom_divisor.get(),
            chunk_size: self.chunk_size.get(),
            staging_size: self.staging_size.get(),
            memory_budget: self.memory_budget,
            io_threads: self.io_threads.get(),
            staging_slots: self.staging_slots.get(),
            batch_bytes: self.batch_bytes,
            coalesce_below: self.coalesce_below,
            coalesce_bytes: self.coalesce_bytes,
            host_assembly: self.host_assembly,
        }
    }

    /// The smallest headroom, in bytes (default 256 MiB).
    pub fn headroom_min(&self) -> u64 {
        self.headroom_min
    }

    /// The headroom is at least `len / headroom_divisor` (default 4).
    pub fn headroom_divisor(&self) -> u64 {
        self.headroom_divisor.get()
    }

    /// The most bytes one read asks for (default 16 MiB).
    pub fn chunk_size(&self) -> usize {
        self.chunk_size.get()
    }

    /// Size of each device staging buffer used for host assembly (default 16 MiB). Host-path
    /// reads are at most this long. When the device cannot allocate it, the stager halves it
    /// (down to one 4 KiB page) rather than fail.
    pub fn staging_size(&self) -> usize {
        self.staging_size.get()
    }

    /// A free-memory budget that replaces the device's own figure (for example the minimum over
    /// ranks). The stager subtracts from it the device bytes the load holds and the bytes a
    /// caller took from it.
    pub fn memory_budget(&self) -> Option<u64> {
        self.memory_budget
    }

    /// I/O threads (default [`default_io_threads`]). With more than one, chunks of several
    /// tensors of a file are read at once on a pool of this many threads (decisions and
    /// allocations stay in file order, one tensor at a time); with one, everything runs on the
    /// caller's thread.
    pub fn io_threads(&self) -> usize {
        self.io_threads.get()
    }

    /// With several I/O threads: how many staging buffers host assembly uses at once, so one
    /// chunk's read overlaps another's device-to-host copy (default 2; fewer when the device
    /// cannot hold them). Device memory for staging is at most `staging_slots * staging_size`.
    pub fn staging_slots(&self) -> usize {
        self.staging_slots.get()
    }

    /// With several I/O threads: how many bytes of device-path tensors are read together before
    /// they are handed out (default 256 MiB; a larger tensor is read alone). Bigger batches
    /// leave the pool idle less often at batch ends; the device memory they allocate ahead of
    /// the consumer is memory the consumer's tensors take anyway.
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// With several I/O threads and an allocator that [splits](crate::DeviceAllocator::splits):
    /// device-path tensors smaller than this (default 1 MiB; 0 turns coalescing off) that lie
    /// back to back in their file are allocated together and read with one request, then handed
    /// out as pieces of that allocation. Each piece starts a multiple of [`COALESCE_ALIGN`] bytes
    /// after the run's start, so tensors keep the alignment a device allocation gives; a tensor
    /// that would not is read on its own.
    pub fn coalesce_below(&self) -> usize {
        self.coalesce_below
    }

    /// The longest run of coalesced tensors, in bytes (default 4 MiB; never more than the chunk
    /// size).
    pub fn coalesce_bytes(&self) -> usize {
        self.coalesce_bytes.min(self.chunk_size.get())
    }

    /// The headroom a tensor of `len` bytes needs: `max(headroom_min, len / headroom_divisor)`.
    pub fn headroom(&self, len: u64) -> u64 {
        self.headroom_min.max(len / self.headroom_divisor.get())
    }

    /// Whether a tensor without a destination that the device cannot hold is assembled in host
    /// memory (default true: the policy's step 3). Off, a tensor takes a device buffer of its
    /// own whatever the headroom, and a device out of memory is an error
    /// ([`ErrorKind::DeviceAllocation`](crate::ErrorKind::DeviceAllocation)): every tensor
    /// handed out is on the device, as a framework's own loader gives them.
    pub fn host_assembly(&self) -> bool {
        self.host_assembly
    }

    /// Whether a tensor of `len` bytes may take the device path with `free` bytes free:
    /// `free >= len + headroom(len)`.
    pub fn fits_on_device(&self, len: u64, free: u64) -> bool {
        len.checked_add(self.headroom(len))
            .is_some_and(|needed| free >= needed)
    }
}

/// Builds a [`StagingPolicy`]; [`build`](Self::build) refuses zero where zero means nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyBuilder {
    headroom_min: u64,
    headroom_divisor: u64,
    chunk_size: usize,
    staging_size: usize,
    memory_budget: Option<u64>,
    io_threads: usize,
    staging_slots: usize,
    batch_bytes: usize,
    coalesce_below: usize,
    coalesce_bytes: usize,
    host_assembly: bool,
}

impl Default for PolicyBuilder {
    fn default() -> Self {
        StagingPolicy::builder()
    }
}

impl PolicyBuilder {
    /// The headroom: `max(minimum, len / divisor)` (divisor at least 1).
    pub fn headroom(mut self, minimum: u64, divisor: u64) -> Self {
        self.headroom_min = minimum;
        self.headroom_divisor = divisor;
        self
    }

    /// The largest single read, in bytes (at least 1).
    pub fn chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// The size of each device staging buffer, in bytes (at least 1).
    pub fn staging_size(mut self, bytes: usize) -> Self {
        self.staging_size = bytes;
        self
    }

    /// A free-memory budget replacing the device's figure (`None`: ask the device).
    pub fn memory_budget(mut self, bytes: Option<u64>) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// I/O threads (at least 1; 1 reads on the calling thread).
    pub fn io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads;
        self
    }

    /// Staging buffers host assembly uses at once (at least 1).
    pub fn staging_slots(mut self, slots: usize) -> Self {
        self.staging_slots = slots;
        self
    }

    /// Bytes of device-path tensors read together before they are handed out.
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes;
        self
    }

    /// Back-to-back tensors smaller than this are read with one request (0: never).
    pub fn coalesce_below(mut self, bytes: usize) -> Self {
        self.coalesce_below = bytes;
        self
    }

    /// The longest run of coalesced tensors, in bytes.
    pub fn coalesce_bytes(mut self, bytes: usize) -> Self {
        self.coalesce_bytes = bytes;
        self
    }

    /// Whether a tensor the device cannot hold is assembled in host memory (default true); see
    /// [`StagingPolicy::host_assembly`].
    pub fn host_assembly(mut self, on: bool) -> Self {
        self.host_assembly = on;
        self
    }

    /// The policy, or [`Error::Policy`] naming the setting that is zero.
    pub fn build(self) -> Result<StagingPolicy> {
        let nonzero = |value: usize, what: &str, unit: &str| {
            NonZeroUsize::new(value)
                .ok_or_else(|| Error::Policy(format!("{what} must be at least 1{unit}")))
        };
        Ok(StagingPolicy {
            headroom_min: self.headroom_min,
            headroom_divisor: NonZeroU64::new(self.headroom_divisor)
                .ok_or_else(|| Error::Policy("the headroom divisor must be at least 1".into()))?,
            chunk_size: nonzero(self.chunk_size, "the chunk size", " byte")?,
            staging_size: nonzero(self.staging_size, "the staging buffer size", " byte")?,
            memory_budget: self.memory_budget,
            io_threads: nonzero(self.io_threads, "the number of I/O threads", "")?,
            staging_slots: nonzero(self.staging_slots, "the number of staging slots", "")?,
            batch_bytes: self.batch_bytes,
            coalesce_below: self.coalesce_below,
            coalesce_bytes: self.coalesce_bytes,
            host_assembly: self.host_assembly,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const GIB: u64 = 1024 * MIB;

    #[rstest]
    #[case::small_uses_minimum(MIB, 256 * MIB)]
    #[case::one_gib_is_exactly_minimum(GIB, 256 * MIB)]
    #[case::large_uses_quarter(4 * GIB, GIB)]
    #[case::odd_rounds_down(4 * GIB + 3, GIB)]
    fn headroom(#[case] len: u64, #[case] expected: u64) {
        assert_eq!(StagingPolicy::default().headroom(len), expected);
    }

    #[rstest]
    #[case::exactly_enough(300 * MIB, 300 * MIB + 256 * MIB, true)]
    #[case::one_byte_short(300 * MIB, 300 * MIB + 256 * MIB - 1, false)]
    #[case::large_exact(8 * GIB, 8 * GIB + 2 * GIB, true)]
    #[case::large_short(8 * GIB, 8 * GIB + 2 * GIB - 1, false)]
    #[case::zero_length_needs_headroom(0, 256 * MIB - 1, false)]
    #[case::overflow_never_fits(u64::MAX, u64::MAX, false)]
    fn device_boundary(#[case] len: u64, #[case] free: u64, #[case] fits: bool) {
        assert_eq!(StagingPolicy::default().fits_on_device(len, free), fits);
    }

    #[test]
    fn rejects_zero_sizes() {
        for (broken, setting) in [
            (StagingPolicy::builder().chunk_size(0), "chunk size"),
            (
                StagingPolicy::builder().staging_size(0),
                "staging buffer size",
            ),
            (StagingPolicy::builder().headroom(0, 0), "headroom divisor"),
            (StagingPolicy::builder().io_threads(0), "I/O threads"),
            (StagingPolicy::builder().staging_slots(0), "staging slots"),
        ] {
            match broken.clone().build() {
                Err(Error::Policy(why)) => assert!(why.contains(setting), "{why}"),
                other => panic!("{broken:?}: expected a policy error, got {other:?}"),
            }
        }
        assert_eq!(
            StagingPolicy::builder().build().unwrap(),
            StagingPolicy::default()
        );
    }

    #[test]
    fn builder_round_trips_and_caps_runs_at_a_chunk() {
        let policy = StagingPolicy::builder()
            .chunk_size(4096)
            .coalesce_bytes(1 << 20)
            .memory_budget(Some(7))
            .build()
            .unwrap();
        assert_eq!(
            policy.coalesce_bytes(),
            4096,
            "a run is never longer than a chunk"
        );
        assert_eq!(policy.memory_budget(), Some(7));
        assert_eq!(policy.to_builder().build().unwrap(), policy);
    }
}
