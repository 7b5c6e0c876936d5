//! The staging policy: which path a tensor takes, and the sizes the write loop works with.
//!
//! The contract (DESIGN.md): a caller's destination first; else a device buffer of its own when
//! free memory is at least `len + headroom(len)`, `headroom(len) = max(256 MiB, len / 4)`; else,
//! or when that allocation fails with out-of-memory, host assembly through one bounded staging
//! buffer. The headroom is a heuristic, not a guarantee that later work will not run out of memory.

use crate::error::{Error, Result};

/// One mebibyte.
pub const MIB: u64 = 1024 * 1024;

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
}

impl StagingPath {
    /// The lowercase name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Destination => "destination",
            Self::Device => "device",
            Self::Host => "host",
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

/// The numbers the stager works with. Defaults follow DESIGN.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagingPolicy {
    /// The smallest headroom, in bytes (default 256 MiB).
    pub headroom_min: u64,
    /// The headroom is at least `len / headroom_divisor` (default 4).
    pub headroom_divisor: u64,
    /// The most bytes one read asks for (default 16 MiB).
    pub chunk_size: usize,
    /// Size of the one device staging buffer used for host assembly (default 16 MiB). Host-path
    /// reads are at most this long. When the device cannot allocate it, the stager halves it (down
    /// to one 4 KiB page) rather than fail.
    pub staging_size: usize,
    /// A free-memory budget that replaces the device's own figure (for example the minimum over
    /// ranks). The stager subtracts the device bytes it holds from it.
    pub memory_budget: Option<u64>,
    /// I/O threads (default [`default_io_threads`]). With more than one, chunks of several tensors of a file are read at once on
    /// a pool of this many threads (decisions and allocations stay in file order, one tensor at a
    /// time); with one, everything runs on the caller's thread.
    pub io_threads: usize,
    /// With several I/O threads: how many staging buffers host assembly uses at once, so one
    /// chunk's read overlaps another's device-to-host copy (default 2; fewer when the device
    /// cannot hold them). Device memory for staging is at most `staging_slots * staging_size`.
    pub staging_slots: usize,
    /// With several I/O threads: how many bytes of device-path tensors are read together before
    /// they are handed out (default 256 MiB; a larger tensor is read alone). Bigger batches
    /// leave the pool idle less often at batch ends; the device memory they allocate ahead of the
    /// consumer is memory the consumer's tensors take anyway.
    pub batch_bytes: usize,
    /// With several I/O threads and an allocator that [splits](crate::DeviceAllocator::splits):
    /// device-path tensors smaller than this (default 1 MiB; 0 turns coalescing off) that lie
    /// back to back in their file are allocated together and read with one request, then handed
    /// out as pieces of that allocation. Each piece starts a multiple of
    /// [`COALESCE_ALIGN`] bytes after the run's start, so tensors keep the alignment a device
    /// allocation gives; a tensor that would not is read on its own.
    pub coalesce_below: usize,
    /// The longest run of coalesced tensors, in bytes (default 4 MiB; never more than
    /// `chunk_size`).
    pub coalesce_bytes: usize,
}

/// The alignment, relative to the start of a run, of every tensor read as part of the run.
pub const COALESCE_ALIGN: u64 = 256;

impl Default for StagingPolicy {
    fn default() -> Self {
        Self {
            headroom_min: 256 * MIB,
            headroom_divisor: 4,
            chunk_size: 16 * MIB as usize,
            staging_size: 16 * MIB as usize,
            memory_budget: None,
            io_threads: default_io_threads(),
            staging_slots: 2,
            batch_bytes: 256 * MIB as usize,
            coalesce_below: MIB as usize,
            coalesce_bytes: 4 * MIB as usize,
        }
    }
}

/// The default number of I/O threads: the machine's parallelism, at most 8. Measured on a 2-core
/// VM (`cargo run --release --example bench -- --threads N`): 2 threads loaded a page-cached
/// 2 GiB checkpoint 2.5 to 3.6 times faster than 1 thread; 4 threads were no faster than 2.
pub fn default_io_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
}

impl StagingPolicy {
    /// The headroom a tensor of `len` bytes needs: `max(headroom_min, len / headroom_divisor)`.
    pub fn headroom(&self, len: u64) -> u64 {
        self.headroom_min.max(len / self.headroom_divisor.max(1))
    }

    /// Whether a tensor of `len` bytes may take the device path with `free` bytes free:
    /// `free >= len + headroom(len)`.
    pub fn fits_on_device(&self, len: u64, free: u64) -> bool {
        len.checked_add(self.headroom(len))
            .is_some_and(|needed| free >= needed)
    }

    /// Checks the numbers make sense.
    pub fn validate(&self) -> Result<()> {
        if self.chunk_size == 0 {
            return Err(Error::Policy("chunk size must be at least 1 byte".into()));
        }
        if self.staging_size == 0 {
            return Err(Error::Policy(
                "staging buffer size must be at least 1 byte".into(),
            ));
        }
        if self.headroom_divisor == 0 {
            return Err(Error::Policy("headroom divisor must be at least 1".into()));
        }
        if self.staging_slots == 0 {
            return Err(Error::Policy("staging slots must be at least 1".into()));
        }
        if self.io_threads == 0 {
            return Err(Error::Policy("I/O threads must be at least 1".into()));
        }
        Ok(())
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
        for broken in [
            StagingPolicy {
                chunk_size: 0,
                ..Default::default()
            },
            StagingPolicy {
                staging_size: 0,
                ..Default::default()
            },
            StagingPolicy {
                headroom_divisor: 0,
                ..Default::default()
            },
            StagingPolicy {
                io_threads: 0,
                ..Default::default()
            },
            StagingPolicy {
                staging_slots: 0,
                ..Default::default()
            },
        ] {
            assert!(
                matches!(broken.validate(), Err(Error::Policy(_))),
                "{broken:?}"
            );
        }
        assert!(StagingPolicy::default().validate().is_ok());
    }
}
