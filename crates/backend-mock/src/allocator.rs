//! [`ScriptedAllocator`]: wraps any allocator with a scripted free-memory figure, a capacity,
//! injected allocation and copy failures, and a ledger of every buffer handed out and returned.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use staging_core::{
    AllocError, DeviceAllocator, DeviceBuffer, DeviceError, DeviceRegion, MemoryInfo,
};

/// One buffer the allocator handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The allocation call number, from 0.
    pub call: usize,
    /// Its length.
    pub len: usize,
    /// Whether it has been dropped.
    pub returned: bool,
}

#[derive(Debug, Default)]
struct LedgerState {
    entries: Vec<LedgerEntry>,
    outstanding_bytes: u64,
    peak_bytes: u64,
    calls: usize,
}

/// A shared account of every buffer handed out and returned; stays valid after the allocator
/// moves into a stager.
#[derive(Debug, Clone, Default)]
pub struct Ledger(Arc<Mutex<LedgerState>>);

impl Ledger {
    fn with<T>(&self, f: impl FnOnce(&mut LedgerState) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Every buffer handed out, in order.
    pub fn entries(&self) -> Vec<LedgerEntry> {
        self.with(|s| s.entries.clone())
    }

    /// Buffers handed out and not yet returned.
    pub fn outstanding(&self) -> Vec<LedgerEntry> {
        self.with(|s| s.entries.iter().filter(|e| !e.returned).cloned().collect())
    }

    /// Bytes in buffers not yet returned.
    pub fn outstanding_bytes(&self) -> u64 {
        self.with(|s| s.outstanding_bytes)
    }

    /// The most bytes outstanding at once.
    pub fn peak_bytes(&self) -> u64 {
        self.with(|s| s.peak_bytes)
    }

    /// Allocation calls made, including failed ones.
    pub fn allocation_calls(&self) -> usize {
        self.with(|s| s.calls)
    }
}

/// A buffer from a [`ScriptedAllocator`]; dropping it is recorded in the ledger.
#[derive(Debug)]
pub struct ScriptedBuffer<B> {
    inner: B,
    entry: usize,
    ledger: Ledger,
}

impl<B> ScriptedBuffer<B> {
    /// The wrapped buffer.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B> Drop for ScriptedBuffer<B> {
    fn drop(&mut self) {
        self.ledger.with(|s| {
            if let Some(e) = s.entries.get_mut(self.entry)
                && !e.returned
            {
                e.returned = true;
                s.outstanding_bytes -= e.len as u64;
            }
        });
    }
}

// SAFETY: every method forwards to the wrapped buffer, which upholds the contract; the wrapper
// only adds ledger bookkeeping on drop.
unsafe impl<B: DeviceBuffer> DeviceBuffer for ScriptedBuffer<B> {
    type Space = B::Space;

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn addr(&self) -> usize {
        self.inner.addr()
    }

    fn region(&mut self) -> DeviceRegion<'_, Self::Space> {
        self.inner.region()
    }
}

/// Wraps an allocator with scripted behaviour:
///
/// - `report_free(bytes)`: `memory_info` reports this free figure, whatever is allocated;
/// - `with_capacity(bytes)`: allocations beyond `bytes` outstanding fail with out-of-memory, and
///   (unless `report_free` is set) free memory is `bytes - outstanding`;
/// - `oom_on_allocation(k)`: the `k`-th allocation (from 0) fails with out-of-memory, whatever
///   free memory said: the allocation race;
/// - `fail_allocation(k)`: the `k`-th allocation fails with a non-OOM error;
/// - `fail_copy(k)`: the `k`-th device-to-host copy fails.
///
/// The capacity check and the ledger update are not one atomic step: allocations are expected to
/// come from one thread at a time, as the stager makes them.
#[derive(Debug)]
pub struct ScriptedAllocator<A> {
    inner: A,
    free: Option<u64>,
    capacity: Option<u64>,
    oom_on: BTreeSet<usize>,
    fail_on: BTreeSet<usize>,
    fail_copy_on: BTreeSet<usize>,
    copies: AtomicUsize,
    ledger: Ledger,
}

impl<A: DeviceAllocator> ScriptedAllocator<A> {
    /// Wraps `inner` with no faults.
    pub fn new(inner: A) -> Self {
        Self {
            inner,
            free: None,
            capacity: None,
            oom_on: BTreeSet::new(),
            fail_on: BTreeSet::new(),
            fail_copy_on: BTreeSet::new(),
            copies: AtomicUsize::new(0),
            ledger: Ledger::default(),
        }
    }

    /// `memory_info` reports `bytes` free.
    pub fn report_free(mut self, bytes: u64) -> Self {
        self.free = Some(bytes);
        self
    }

    /// At most `bytes` may be outstanding.
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// The `k`-th allocation fails with out-of-memory.
    pub fn oom_on_allocation(mut self, k: usize) -> Self {
        self.oom_on.insert(k);
        self
    }

    /// The `k`-th allocation fails with a non-OOM error.
    pub fn fail_allocation(mut self, k: usize) -> Self {
        self.fail_on.insert(k);
        self
    }

    /// The `k`-th device-to-host copy fails.
    pub fn fail_copy(mut self, k: usize) -> Self {
        self.fail_copy_on.insert(k);
        self
    }

    /// A handle on the ledger that stays valid after the allocator moves.
    pub fn ledger(&self) -> Ledger {
        self.ledger.clone()
    }
}

impl<A: DeviceAllocator> DeviceAllocator for ScriptedAllocator<A> {
    type Space = A::Space;
    type Buffer = ScriptedBuffer<A::Buffer>;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        if let Some(free) = self.free {
            let total = self.capacity.unwrap_or(free).max(free);
            return Ok(MemoryInfo { free, total });
        }
        if let Some(capacity) = self.capacity {
            let used = self.ledger.outstanding_bytes();
            return Ok(MemoryInfo {
                free: capacity.saturating_sub(used),
                total: capacity,
            });
        }
        self.inner.memory_info()
    }

    fn allocate(&self, len: usize) -> Result<Self::Buffer, AllocError> {
        let call = self.ledger.with(|s| {
            s.calls += 1;
            s.calls - 1
        });
        if self.oom_on.contains(&call) {
            return Err(AllocError::OutOfMemory {
                requested: len,
                detail: format!("injected out-of-memory on allocation {call}"),
            });
        }
        if self.fail_on.contains(&call) {
            return Err(AllocError::Failed {
                requested: len,
                detail: format!("injected failure on allocation {call}"),
            });
        }
        if let Some(capacity) = self.capacity {
            let used = self.ledger.outstanding_bytes();
            if used + len as u64 > capacity {
                return Err(AllocError::OutOfMemory {
                    requested: len,
                    detail: format!("{used} of {capacity} bytes in use"),
                });
            }
        }
        let inner = self.inner.allocate(len)?;
        let entry = self.ledger.with(|s| {
            s.entries.push(LedgerEntry {
                call,
                len,
                returned: false,
            });
            s.outstanding_bytes += len as u64;
            s.peak_bytes = s.peak_bytes.max(s.outstanding_bytes);
            s.entries.len() - 1
        });
        Ok(ScriptedBuffer {
            inner,
            entry,
            ledger: self.ledger.clone(),
        })
    }

    fn copy_to_host(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        let copy = self.copies.fetch_add(1, Ordering::AcqRel);
        if self.fail_copy_on.contains(&copy) {
            return Err(DeviceError::new(
                "copy_to_host",
                format!("injected failure on copy {copy}"),
            ));
        }
        self.inner.copy_to_host(&src.inner, offset, dst)
    }
}
