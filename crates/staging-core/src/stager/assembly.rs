//! Step 3 of the policy: a tensor assembled in host memory, chunk by chunk, through the bounded
//! device staging buffers (allocated once per load, halved when memory is short, freed when the
//! load ends). With several I/O threads and slots, one chunk's read overlaps another's
//! device-to-host copy.

use crate::checkpoint::TensorMeta;
use crate::error::{AllocError, Error, Result};
use crate::memory::HostBytes;
use crate::policy::FallbackCause;
use crate::report::MemoryKind;
use crate::traits::{Destination, DeviceAllocator, DeviceBuffer, Reader};
use crate::write_loop::{error_offset, plan_chunks, read_exact};

use super::Stager;
use super::batch::Counted;
use super::plan::allocate_staging;
use super::tensor::{DeviceTensor, Held, HostTensor, StagedTensor, TensorData};

/// Alignment of host-assembled tensors.
const HOST_ALIGN: usize = 16;

impl<R, A, D> Stager<R, A, D>
where
    R: Reader,
    A: DeviceAllocator<Space = R::Space>,
    D: Destination<R::Space>,
{
    /// Allocates the staging slots once per load: the first (halved on out-of-memory, see
    /// [`allocate_staging`]), then up to `staging_slots - 1` more of the same size while memory
    /// allows (only with an I/O pool; more slots let reads overlap device-to-host copies).
    fn allocate_staging_slots(&mut self, meta: &TensorMeta) -> Result<()> {
        let staging_error = |bytes, source| Error::StagingBuffer {
            tensor: meta.name.clone(),
            file: meta.file.to_path_buf(),
            offset: meta.offset,
            bytes,
            source,
        };
        let (buffer, size) = allocate_staging(&self.allocator, self.policy.staging_size())
            .map_err(|(bytes, source)| staging_error(bytes, source))?;
        let held = Held::new(&self.accounting, MemoryKind::Device, size as u64);
        self.staging.push(DeviceTensor { buffer, held });
        let slots = if self.threads.pool().is_some() {
            self.policy.staging_slots()
        } else {
            1
        };
        while self.staging.len() < slots {
            match self.allocator.allocate(size) {
                Ok(buffer) => {
                    let held = Held::new(&self.accounting, MemoryKind::Device, size as u64);
                    self.staging.push(DeviceTensor { buffer, held });
                }
                Err(AllocError::OutOfMemory { .. }) => break,
                Err(source) => return Err(staging_error(size, source)),
            }
        }
        Ok(())
    }

    /// Step 3 of the policy: host assembly through the bounded staging buffer(s).
    pub(super) fn stage_host(
        &mut self,
        meta: TensorMeta,
        cause: FallbackCause,
    ) -> Result<StagedTensor<A::Buffer>> {
        self.ensure_open(&meta)?;
        let bytes =
            HostBytes::zeroed(meta.len, HOST_ALIGN).ok_or_else(|| Error::HostAllocation {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: meta.offset,
                bytes: meta.len,
            })?;
        let mut host = HostTensor {
            held: Held::new(&self.accounting, MemoryKind::Host, meta.len as u64),
            bytes,
        };
        if meta.len > 0 {
            if self.staging.is_empty() {
                self.allocate_staging_slots(&meta)?;
            }
            let Some((_, file)) = self.open.as_ref() else {
                return Err(Error::Internal("no open file".into()));
            };
            let assembly = HostAssembly {
                reader: counted!(self),
                allocator: &self.allocator,
                file,
                meta: &meta,
                chunk_size: self.policy.chunk_size(),
            };
            match self.threads.pool().filter(|_| self.staging.len() > 1) {
                Some(pool) => assembly.run_overlapped(pool, &mut self.staging, &mut host.bytes)?,
                None => {
                    let Some(slot) = self.staging.first_mut() else {
                        return Err(Error::Internal("no staging buffer".into()));
                    };
                    assembly.run(slot, &mut host.bytes)?;
                }
            }
        }
        self.verify_unchanged(&meta)?;
        Ok(StagedTensor {
            meta,
            data: TensorData::Host(host),
            fallback: Some(cause),
        })
    }
}

/// Host assembly of one tensor through staging slots.
struct HostAssembly<'a, R: Reader, A: DeviceAllocator<Space = R::Space>> {
    reader: Counted<'a, R>,
    allocator: &'a A,
    file: &'a R::File,
    meta: &'a TensorMeta,
    chunk_size: usize,
}

impl<R: Reader, A: DeviceAllocator<Space = R::Space>> HostAssembly<'_, R, A> {
    /// Reads every chunk of the tensor through `slot` into `host` (the whole tensor's bytes), in
    /// order, stopping at the first failure.
    fn run(&self, slot: &mut DeviceTensor<A::Buffer>, host: &mut [u8]) -> Result<()> {
        let meta = self.meta;
        let chunk = self.chunk_size.min(slot.buffer.len());
        for (rel, n) in plan_chunks(meta.offset, meta.len, chunk) {
            let Some(dst) = host.get_mut(rel..rel + n) else {
                return Err(Error::Internal("chunk outside tensor".into()));
            };
            self.chunk_into(slot, rel, n, dst)?;
        }
        Ok(())
    }

    /// Every slot works on its share of the chunks at once, so one slot's read overlaps
    /// another's device-to-host copy. Returns the failure at the lowest offset.
    fn run_overlapped(
        &self,
        pool: &rayon::ThreadPool,
        slots: &mut [DeviceTensor<A::Buffer>],
        host: &mut [u8],
    ) -> Result<()> {
        let chunk = slots
            .iter()
            .map(|s| s.buffer.len())
            .min()
            .unwrap_or(0)
            .min(self.chunk_size);
        // Cut the host bytes into the chunks' slices, dealt to the slots in turn.
        let mut shares: Vec<Vec<(usize, &mut [u8])>> =
            (0..slots.len()).map(|_| Vec::new()).collect();
        let mut rest = host;
        for (i, (rel, n)) in plan_chunks(self.meta.offset, self.meta.len, chunk).enumerate() {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            if let Some(share) = shares.get_mut(i % slots.len()) {
                share.push((rel, piece));
            }
        }
        let failed = std::sync::atomic::AtomicBool::new(false);
        let errors = std::sync::Mutex::new(Vec::new());
        pool.scope(|scope| {
            for (slot, share) in slots.iter_mut().zip(shares) {
                let (failed, errors) = (&failed, &errors);
                scope.spawn(move |_| {
                    for (rel, piece) in share {
                        if failed.load(std::sync::atomic::Ordering::Acquire) {
                            return;
                        }
                        let n = piece.len();
                        if let Err(e) = self.chunk_into(slot, rel, n, piece) {
                            failed.store(true, std::sync::atomic::Ordering::Release);
                            errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                            return;
                        }
                    }
                });
            }
        });
        let errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
        match errors.into_iter().min_by_key(error_offset) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads the chunk at `rel` (of `n` bytes) through `slot` and copies it to `dst`, the
    /// chunk's host slice.
    fn chunk_into(
        &self,
        slot: &mut DeviceTensor<A::Buffer>,
        rel: usize,
        n: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let meta = self.meta;
        let at = meta.offset + rel as u64;
        let mut whole = slot.buffer.region();
        let Some(region) = whole.slice(0, n) else {
            return Err(Error::Internal(
                "a chunk larger than the staging buffer".into(),
            ));
        };
        read_exact(
            &self.reader,
            self.file,
            std::slice::from_ref(meta),
            at,
            region,
        )?;
        self.allocator
            .copy_to_host(&slot.buffer, 0, dst)
            .map_err(|source| Error::Device {
                tensor: meta.name.clone(),
                file: meta.file.to_path_buf(),
                offset: at,
                source,
            })
    }
}
