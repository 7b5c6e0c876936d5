//! [`SubAllocator`]: small tensors carved from large blocks.
//!
//! Thousands of small tensors each with an allocation of their own cost more than their bytes:
//! on the host, every fresh small allocation is faulted in 4 KiB pages; on a GPU, every
//! `cuMemAlloc` is a driver call. This wrapper serves requests below a threshold from blocks of
//! the inner allocator (bump allocation), and frees a block when the last buffer carved from it
//! is dropped. Larger requests pass straight through.
//!
//! It never hands out overlapping ranges: each block's bump pointer only moves forward, under a
//! lock, and a block is only freed when no buffer refers to it.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::error::{AllocError, DeviceError};
use crate::memory::DeviceRegion;
use crate::traits::{DeviceAllocator, DeviceBuffer, MemoryInfo};

/// Alignment of every carved buffer: enough for any dtype and for 4 KiB-aligned chunk reads to
/// stay cheap.
pub const SUB_ALIGN: usize = 256;

/// Serves small allocations from shared blocks of an inner allocator.
pub struct SubAllocator<A: DeviceAllocator> {
    inner: A,
    block_size: usize,
    threshold: usize,
    current: Mutex<Option<Current<A::Buffer>>>,
}

impl<A: DeviceAllocator + fmt::Debug> fmt::Debug for SubAllocator<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubAllocator")
            .field("inner", &self.inner)
            .field("block_size", &self.block_size)
            .field("threshold", &self.threshold)
            .finish()
    }
}

/// The block being carved, and how much of it is used.
type Current<B> = (Arc<Block<B>>, usize);

/// One block of the inner allocator, shared by the buffers carved from it.
#[derive(Debug)]
struct Block<B> {
    buffer: B,
    addr: usize,
}

/// A buffer: either carved from a block, or an inner buffer of its own.
#[derive(Debug)]
pub struct SubBuffer<B> {
    kind: Kind<B>,
    len: usize,
}

#[derive(Debug)]
enum Kind<B> {
    Carved { block: Arc<Block<B>>, offset: usize },
    Own(B),
}

impl<A: DeviceAllocator> SubAllocator<A> {
    /// Serves requests smaller than `threshold` from blocks of `block_size` bytes of `inner`.
    pub fn new(inner: A, block_size: usize, threshold: usize) -> Self {
        Self {
            inner,
            block_size: block_size.max(SUB_ALIGN),
            threshold: threshold.min(block_size),
            current: Mutex::new(None),
        }
    }

    /// The defaults: 32 MiB blocks for requests under 1 MiB.
    pub fn with_defaults(inner: A) -> Self {
        Self::new(inner, 32 << 20, 1 << 20)
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Stops carving from the current block, so that it is freed as soon as the buffers carved
    /// from it are (a load calls this when it ends; later requests start a new block).
    pub fn retire_block(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// `len` bytes from the inner allocator, checked to be as long as asked: carving relies on
    /// it, and `DeviceAllocator` is a safe trait.
    fn allocate_inner(&self, len: usize) -> Result<A::Buffer, AllocError> {
        let buffer = self.inner.allocate(len)?;
        if buffer.len() != len {
            return Err(AllocError::Failed {
                requested: len,
                detail: format!("the allocator returned a buffer of {} bytes", buffer.len()),
            });
        }
        Ok(buffer)
    }
}

impl<A: DeviceAllocator> DeviceAllocator for SubAllocator<A>
where
    A::Buffer: Sync,
{
    type Space = A::Space;
    type Buffer = SubBuffer<A::Buffer>;

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        self.inner.memory_info()
    }

    fn allocate(&self, len: usize) -> Result<SubBuffer<A::Buffer>, AllocError> {
        if len == 0 || len >= self.threshold {
            return Ok(SubBuffer {
                kind: Kind::Own(self.allocate_inner(len)?),
                len,
            });
        }
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let fits = current
            .as_ref()
            .is_some_and(|(block, used)| used + len <= block.buffer.len());
        if !fits {
            // A new block; the old one lives on in the buffers carved from it.
            match self.allocate_inner(self.block_size) {
                Ok(buffer) => {
                    let addr = buffer.addr();
                    *current = Some((Arc::new(Block { buffer, addr }), 0));
                }
                // No room for a whole block: the request on its own may still fit.
                Err(AllocError::OutOfMemory { .. }) => {
                    return Ok(SubBuffer {
                        kind: Kind::Own(self.allocate_inner(len)?),
                        len,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        let Some((block, used)) = current.as_mut() else {
            return Err(AllocError::Failed {
                requested: len,
                detail: "no current block after allocating one (a bug)".into(),
            });
        };
        let offset = *used;
        *used = (offset + len).div_ceil(SUB_ALIGN) * SUB_ALIGN;
        Ok(SubBuffer {
            kind: Kind::Carved {
                block: Arc::clone(block),
                offset,
            },
            len,
        })
    }

    fn copy_to_host(
        &self,
        src: &SubBuffer<A::Buffer>,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), DeviceError> {
        DeviceError::check_bounds("copy_to_host", src.len, offset, dst.len())?;
        match &src.kind {
            Kind::Own(buffer) => self.inner.copy_to_host(buffer, offset, dst),
            Kind::Carved { block, offset: at } => {
                self.inner.copy_to_host(&block.buffer, at + offset, dst)
            }
        }
    }

    fn splits(&self) -> bool {
        true
    }

    /// Pieces are carved buffers sharing the original allocation (a buffer of its own becomes
    /// a block), which is freed when the last piece is dropped.
    fn split(
        &self,
        buffer: SubBuffer<A::Buffer>,
        pieces: &[(usize, usize)],
    ) -> Result<Vec<SubBuffer<A::Buffer>>, SubBuffer<A::Buffer>> {
        if !pieces_fit(pieces, buffer.len) {
            return Err(buffer);
        }
        let (block, base) = match buffer.kind {
            Kind::Carved { block, offset } => (block, offset),
            Kind::Own(inner) => {
                let addr = inner.addr();
                (
                    Arc::new(Block {
                        buffer: inner,
                        addr,
                    }),
                    0,
                )
            }
        };
        Ok(pieces
            .iter()
            .map(|&(offset, len)| SubBuffer {
                kind: Kind::Carved {
                    block: Arc::clone(&block),
                    offset: base + offset,
                },
                len,
            })
            .collect())
    }
}

/// Whether `pieces` are in increasing order, do not overlap, and lie inside `len` bytes.
fn pieces_fit(pieces: &[(usize, usize)], len: usize) -> bool {
    let mut end = 0usize;
    for &(offset, piece_len) in pieces {
        match offset.checked_add(piece_len) {
            Some(piece_end) if offset >= end && piece_end <= len => end = piece_end,
            _ => return false,
        }
    }
    true
}

impl<B: DeviceBuffer> SubBuffer<B> {
    /// A whole allocation of its own as a sub-allocator buffer.
    pub fn from_whole(buffer: B) -> Self {
        Self {
            len: buffer.len(),
            kind: Kind::Own(buffer),
        }
    }
}

impl<B> SubBuffer<B> {
    /// The inner buffer, when this buffer is a whole allocation of its own rather than a piece
    /// carved from a shared block.
    pub fn into_whole(self) -> Result<B, Self> {
        match self.kind {
            Kind::Own(buffer) => Ok(buffer),
            kind => Err(Self {
                kind,
                len: self.len,
            }),
        }
    }

    /// Whether this buffer is a piece of a block shared with other buffers.
    pub fn is_carved(&self) -> bool {
        matches!(self.kind, Kind::Carved { .. })
    }
}

// SAFETY: a carved buffer's range lies inside its block (the bump pointer and `pieces_fit` check
// it against the block's own, trusted, length), is handed to this buffer alone (bump ranges and
// split pieces never overlap, and a split consumes the buffer it cuts), and stays allocated while
// this buffer holds the block's `Arc`; `addr` and `len` are fixed at creation. A buffer of its
// own forwards to the inner buffer, which upholds the same contract.
unsafe impl<B: DeviceBuffer + Sync> DeviceBuffer for SubBuffer<B> {
    type Space = B::Space;

    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> usize {
        match &self.kind {
            Kind::Own(buffer) => buffer.addr(),
            Kind::Carved { block, offset } => block.addr + offset,
        }
    }

    fn region(&mut self) -> DeviceRegion<'_, B::Space> {
        match &mut self.kind {
            Kind::Own(buffer) => buffer.region(),
            Kind::Carved { block, offset } => {
                // SAFETY: `[block.addr + offset, + len)` lies inside the block (the bump pointer,
                // or `split` with `pieces_fit`, checked it against the block's length), was
                // handed to this buffer alone (bump ranges and split pieces never overlap, and a
                // split consumes the buffer it cuts), and the block stays allocated while this
                // buffer holds its `Arc`; the region borrows this buffer mutably.
                unsafe { DeviceRegion::from_raw_parts(block.addr + *offset, self.len) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostAllocator;

    #[test]
    fn small_buffers_share_a_block_and_the_block_is_freed_last() {
        let host = HostAllocator::with_capacity(1 << 20);
        let sub = SubAllocator::new(host.clone(), 4096, 1024);
        let mut a = sub.allocate(100).unwrap();
        let mut b = sub.allocate(300).unwrap();
        assert_eq!(host.used(), 4096, "one block");
        assert_eq!(b.addr() - a.addr(), SUB_ALIGN, "carved in order, aligned");
        a.region().as_mut_slice().fill(1);
        b.region().as_mut_slice().fill(2);
        let mut out = vec![0u8; 300];
        sub.copy_to_host(&b, 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 2));
        sub.copy_to_host(&a, 0, &mut out[..100]).unwrap();
        assert!(out[..100].iter().all(|&x| x == 1));
        assert!(
            sub.copy_to_host(&a, 1, &mut out[..100]).is_err(),
            "bounds are the buffer's own"
        );
        let big = sub.allocate(2000).unwrap();
        assert_eq!(host.used(), 4096 + 2000, "large requests pass through");
        drop(big);
        // Filling the block starts a new one; the old one is freed only when its last buffer is.
        let c = sub.allocate(1000).unwrap();
        let d = sub.allocate(1000).unwrap();
        let e = sub.allocate(1000).unwrap();
        assert_eq!(host.used(), 4096, "a, b, c, d, e fit in one block");
        let f = sub.allocate(1000).unwrap();
        assert_eq!(host.used(), 2 * 4096, "f needed a second block");
        drop((a, b, c, d));
        assert_eq!(host.used(), 2 * 4096, "e still holds the first block");
        drop(e);
        assert_eq!(
            host.used(),
            4096,
            "the first block is freed with its last buffer"
        );
        drop(f);
        assert_eq!(
            host.used(),
            4096,
            "the allocator still holds the current block"
        );
        drop(sub);
        assert_eq!(host.used(), 0, "everything returned");
    }

    #[test]
    fn split_pieces_free_their_memory_with_the_last_one() {
        let host = HostAllocator::with_capacity(1 << 20);
        let sub = SubAllocator::new(host.clone(), 4096, 1024);
        assert!(sub.splits());
        // A carved buffer: pieces share the block.
        let run = sub.allocate(900).unwrap();
        let base = run.addr();
        let mut pieces = sub.split(run, &[(0, 100), (256, 300), (768, 132)]).unwrap();
        assert_eq!(
            pieces
                .iter()
                .map(|p| (p.addr() - base, p.len()))
                .collect::<Vec<_>>(),
            vec![(0, 100), (256, 300), (768, 132)]
        );
        for (i, piece) in pieces.iter_mut().enumerate() {
            piece.region().as_mut_slice().fill(i as u8 + 1);
        }
        let mut out = vec![0u8; 300];
        sub.copy_to_host(&pieces[1], 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 2));
        assert!(
            sub.copy_to_host(&pieces[2], 0, &mut out).is_err(),
            "a piece's own bounds"
        );
        drop(sub);
        assert_eq!(host.used(), 4096, "the pieces hold the block");
        drop(pieces);
        assert_eq!(host.used(), 0);

        // A buffer of its own becomes a block shared by its pieces.
        let sub = SubAllocator::new(host.clone(), 4096, 1024);
        let own = sub.allocate(3000).unwrap();
        let mut pieces = sub.split(own, &[(0, 1000), (1024, 1976)]).unwrap();
        assert_eq!(host.used(), 3000);
        let last = pieces.pop().unwrap();
        drop(pieces);
        assert_eq!(host.used(), 3000, "one piece still holds the allocation");
        drop(last);
        assert_eq!(host.used(), 0);
    }

    #[rstest::rstest]
    #[case::past_the_end(&[(0, 100), (200, 101)])]
    #[case::overlapping(&[(0, 100), (99, 10)])]
    #[case::out_of_order(&[(200, 10), (0, 10)])]
    #[case::overflowing(&[(usize::MAX, 2)])]
    fn bad_pieces_give_the_buffer_back(#[case] pieces: &[(usize, usize)]) {
        let host = HostAllocator::with_capacity(1 << 20);
        let sub = SubAllocator::new(host.clone(), 4096, 1024);
        let buffer = sub.allocate(300).unwrap();
        let addr = buffer.addr();
        let back = sub.split(buffer, pieces).unwrap_err();
        assert_eq!((back.addr(), back.len()), (addr, 300));
    }

    #[test]
    fn a_full_device_still_serves_a_small_request_alone() {
        let host = HostAllocator::with_capacity(3000);
        let sub = SubAllocator::new(host.clone(), 4096, 1024);
        let a = sub.allocate(500).unwrap();
        assert_eq!(host.used(), 500, "no room for a block: allocated alone");
        drop(a);
        assert_eq!(host.used(), 0);
    }

    /// An allocator that hands out half of what is asked: a broken safe implementation.
    #[derive(Debug)]
    struct Halving(HostAllocator);

    impl DeviceAllocator for Halving {
        type Space = crate::HostMemory;
        type Buffer = crate::host::HostBuffer;
        fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
            self.0.memory_info()
        }
        fn allocate(&self, len: usize) -> Result<Self::Buffer, AllocError> {
            self.0.allocate(len / 2)
        }
        fn copy_to_host(
            &self,
            src: &Self::Buffer,
            offset: usize,
            dst: &mut [u8],
        ) -> Result<(), DeviceError> {
            self.0.copy_to_host(src, offset, dst)
        }
    }

    #[test]
    fn a_short_buffer_from_the_inner_allocator_is_refused_not_carved() {
        let sub = SubAllocator::new(Halving(HostAllocator::new()), 4096, 1024);
        for len in [100, 2000] {
            match sub.allocate(len) {
                Err(AllocError::Failed { detail, .. }) => {
                    assert!(detail.contains("returned a buffer of"), "{detail}")
                }
                other => panic!("{len}: expected a refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn copying_a_piece_reads_only_its_bytes_while_a_neighbour_is_written() {
        // The host allocator copies exactly the piece's range through raw pointers: no
        // reference covers the neighbour that another thread writes meanwhile.
        let sub = SubAllocator::new(HostAllocator::new(), 1 << 16, 1 << 12);
        let mut a = sub.allocate(1000).unwrap();
        let mut b = sub.allocate(1000).unwrap();
        assert_eq!(b.addr() - a.addr(), 1024, "neighbours in one block");
        a.region().as_mut_slice().fill(7);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for i in 0..2000u32 {
                    b.region().as_mut_slice().fill(i as u8);
                }
            });
            for _ in 0..2000 {
                let mut out = [0u8; 1000];
                sub.copy_to_host(&a, 0, &mut out).unwrap();
                assert!(out.iter().all(|&x| x == 7));
            }
        });
    }
}
