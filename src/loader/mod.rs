//! [`Loader`]: the one entry point. It takes the backend, the device, the policy, the selection
//! and the destination, opens the backend (deciding `auto` once), and opens paths into a
//! [`Load`]: an iterator of `Result<Tensor>` in file order, with its report.
//!
//! Whatever the backend, the load is the core's `Stager` over that backend's reader and its
//! allocator behind a `SubAllocator` (small tensors carved from shared blocks: the default, not
//! something each caller must remember), erased behind one type.

//!
//! The builder is in `builder`, the prepared loader (opening checkpoints, reading headers,
//! revalidating a store) in `prepared`, where bytes come from (local paths or URLs) in `source`;
//! loads whose tensors are mappings of their files in `mapped`, with their copies into a
//! caller's destination in `copy` and reads of some columns of a tensor in `columns`; the load
//! itself, erased over the backend's reader and allocator, is here.

mod builder;
mod columns;
mod copy;
mod mapped;
mod prepared;
mod source;

use std::fmt;
use std::sync::Arc;

use staging_core::{
    Checkpoint, DeviceAllocator, HeldMemory, IoThreads, KeepOpen, LoadReport, OpenFiles, Reader,
    Stager, StagingPolicy, SubAllocator,
};

pub use builder::Loader;

pub use prepared::Prepared;

use crate::backend::OnReader;
use crate::error::{Error, Result};
use crate::space::sealed::Sealed;
use crate::space::{AnyDestination, Boxed, KnownSpace};
use crate::tensor::Tensor;

/// Blocks small tensors are carved from (`SubAllocator`).
const BLOCK_SIZE: usize = 32 << 20;
/// Tensors under this many bytes are carved from blocks.
const CARVE_BELOW: usize = 1 << 20;

/// What every load is made of, whatever the backend.
struct Setup<'d> {
    checkpoint: Checkpoint,
    threads: IoThreads,
    files: Option<OpenFiles>,
    policy: StagingPolicy,
    suballocate: bool,
    destination: AnyDestination<'d>,
}

impl<'d> OnReader<'d> for Setup<'d> {
    type Output = Box<dyn ErasedLoad + 'd>;

    fn run<R, A>(self, reader: R, allocator: A, backend: &str) -> Result<Self::Output>
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
}

impl<'d> Setup<'d> {
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
    /// What a Hub path opened to, when the checkpoint is one.
    hub: Option<source::HubFacts>,
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
    /// The template of a progress bar over a load's bytes (an `indicatif` template), which
    /// every door that draws one uses (`stage` on a terminal, Python's `progress=True`): sizes
    /// in binary units, as the report and the documentation give them (`86.65 MiB/1.2 GiB`), the
    /// rate in decimal ones, as every GB/s the project reports.
    pub const PROGRESS_TEMPLATE: &'static str = "{spinner} {elapsed_precise} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {decimal_bytes_per_sec}";
    /// The characters the bar is drawn with (done, the head, to do), with
    /// [`PROGRESS_TEMPLATE`](Self::PROGRESS_TEMPLATE).
    pub const PROGRESS_CHARS: &'static str = "=> ";

    /// The report so far; final once the iterator has returned `None` or an error.
    pub fn report(&self) -> LoadReport {
        let mut report = self.inner.report();
        report.passed_over.clone_from(&self.passed_over);
        report.mode_reason.clone_from(&self.mode_reason);
        report.hub = self.hub.as_ref().map(|hub| hub.report(report.bytes_read));
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

/// What the loader's unit tests share.
#[cfg(test)]
mod test_support {
    use std::path::Path;
    use std::sync::Arc;

    use staging_core::{Dtype, TensorMeta};

    /// A tensor `w` of `dtype` and `shape` at offset 8 of a file `f`, whole.
    pub(super) fn meta(dtype: Dtype, shape: &[usize]) -> TensorMeta {
        TensorMeta {
            name: "w".into(),
            dtype,
            shape: shape.to_vec(),
            file: Arc::from(Path::new("f")),
            file_index: 0,
            offset: 8,
            len: shape.iter().product::<usize>() * dtype.bitsize() / 8,
            row_range: None,
        }
    }
}
