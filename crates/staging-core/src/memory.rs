//! Memory spaces, device regions and owned host bytes.
//!
//! A backend's "device" memory is named by a [`MemorySpace`] marker type. Readers and allocators
//! declare their space, and the stager only pairs a reader with an allocator of the same space,
//! so a reader that writes through host addresses can never be handed a GPU address.
//!
//! This module must never hand out a region that outlives the memory it describes: every
//! [`DeviceRegion`] borrows its memory for its lifetime `'a`.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A kind of memory a backend reads into: host memory, CUDA device memory, HIP device memory.
pub trait MemorySpace: fmt::Debug + Send + Sync + 'static {
    /// A short name for reports ("host", "cuda", "hip").
    const NAME: &'static str;
}

/// Ordinary system memory, addressable by the CPU. The host and mock backends use it to stand
/// for device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory;

impl MemorySpace for HostMemory {
    const NAME: &'static str = "host";
}

/// A mutable borrow of bytes in space `S` (covariant in `'a`, `Send` and `Sync`).
type Borrow<'a, S> = (&'a mut [u8], fn() -> S);

/// A writable byte range `[addr, addr + len)` in memory space `S`, borrowed for `'a`.
///
/// Regions are what readers write into. They come from a device buffer
/// ([`crate::DeviceBuffer::region`]), from a caller's [`crate::Destination`], or (for host memory)
/// from a plain `&mut [u8]`.
pub struct DeviceRegion<'a, S: MemorySpace> {
    addr: usize,
    len: usize,
    /// Where the allocation this region was carved from starts (cuFile's `bufPtr_base`).
    base: usize,
    _borrow: PhantomData<Borrow<'a, S>>,
}

impl<S: MemorySpace> fmt::Debug for DeviceRegion<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRegion")
            .field("space", &S::NAME)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}

impl<'a, S: MemorySpace> DeviceRegion<'a, S> {
    /// Describes `len` bytes of memory space `S` starting at address `addr`.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must be memory of space `S` (for [`HostMemory`]: valid, initialized
    /// host memory), writable for all of `'a`, and neither read nor written through any other
    /// path while the region exists. `addr + len` must not overflow.
    pub unsafe fn from_raw_parts(addr: usize, len: usize) -> Self {
        Self {
            addr,
            len,
            base: addr,
            _borrow: PhantomData,
        }
    }

    /// An empty region (address 0, no bytes): nothing is ever written to it.
    pub fn empty() -> Self {
        Self {
            addr: 0,
            len: 0,
            base: 0,
            _borrow: PhantomData,
        }
    }

    /// The address of the first byte in the region's memory space.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The start of the allocation (or caller region) this region was carved from. Sub-regions
    /// keep it, so a reader can pass a base pointer and an offset (cuFile's `bufPtr_base` and
    /// `bufPtr_offset`, which registered buffers require).
    pub fn base(&self) -> usize {
        self.base
    }

    /// This region's offset from [`base`](Self::base).
    pub fn offset_in_base(&self) -> usize {
        self.addr - self.base
    }

    /// A sub-region that keeps this region's base.
    fn carve(&self, offset: usize, len: usize) -> Self {
        Self {
            addr: self.addr + offset,
            len,
            base: self.base,
            _borrow: PhantomData,
        }
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-region `[offset, offset + len)`, reborrowed; `None` when out of bounds.
    pub fn slice(&mut self, offset: usize, len: usize) -> Option<DeviceRegion<'_, S>> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // The sub-range lies inside this region (checked above) and is borrowed from `&mut self`,
        // so nothing else can use this region's memory while it exists.
        let sub = self.carve(offset, len);
        Some(DeviceRegion {
            addr: sub.addr,
            len: sub.len,
            base: sub.base,
            _borrow: PhantomData,
        })
    }

    /// Narrows the region to `[offset, offset + len)`, keeping its lifetime; `None` when out of
    /// bounds.
    pub fn into_subregion(self, offset: usize, len: usize) -> Option<Self> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // The sub-range lies inside this region, which is consumed.
        Some(self.carve(offset, len))
    }

    /// Splits the region in two at `mid`; `None` when `mid > len`.
    pub fn split_at(self, mid: usize) -> Option<(Self, Self)> {
        if mid > self.len {
            return None;
        }
        // The two halves are disjoint and together cover exactly this region, which is consumed,
        // so the exclusivity of `'a` carries over to each half.
        Some((self.carve(0, mid), self.carve(mid, self.len - mid)))
    }
}

impl<'a> DeviceRegion<'a, HostMemory> {
    /// A host region over a mutable slice.
    pub fn from_slice(slice: &'a mut [u8]) -> Self {
        // SAFETY: a `&'a mut [u8]` is valid, initialized, exclusively borrowed host memory.
        unsafe { Self::from_raw_parts(slice.as_mut_ptr() as usize, slice.len()) }
    }

    /// The region's bytes as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: a host region is valid, initialized, exclusively borrowed host memory of `len`
        // bytes (the contract of `from_raw_parts`, or it came from a slice).
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

/// The bytes of a buffer in host memory, as a slice.
pub fn host_bytes<B: crate::DeviceBuffer<Space = HostMemory>>(buffer: &B) -> &[u8] {
    if buffer.is_empty() {
        return &[];
    }
    // SAFETY: by the `DeviceBuffer` contract, `[addr, addr + len)` is memory of the buffer's
    // space, host memory here, owned by `buffer` and written only through it; `&B` rules out a
    // write through it while the slice lives.
    unsafe { std::slice::from_raw_parts(buffer.addr() as *const u8, buffer.len()) }
}

/// Zero-initialized, aligned host bytes whose allocation can fail without aborting the process.
///
/// Used for host-assembled tensors and by the host backend as its "device" memory. Buffers of
/// [`HostBytes::MMAP_THRESHOLD`] or more are anonymous mappings: zeroed lazily by the kernel
/// (nothing is written twice). They are not advised to use transparent huge pages: on a VM whose
/// kernel compacts memory for advised regions on fault (`defrag=madvise`, the usual default),
/// loading 1 GiB into fresh processes took a median 0.55 s advised against 0.44 s not (10
/// interleaved runs each, 2026-12-02), with advised runs up to 1.65 s.
pub struct HostBytes {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

#[derive(Debug)]
enum Backing {
    /// Nothing allocated (`len == 0`); `ptr` is dangling and aligned.
    Empty,
    /// From the global allocator with this alignment.
    Heap(usize),
    /// An anonymous private mapping of `len` bytes, held only to be unmapped when dropped.
    Mapped { _mapping: memmap2::MmapMut },
}

// SAFETY: `HostBytes` owns its allocation exclusively, like a `Box<[u8]>`.
unsafe impl Send for HostBytes {}
// SAFETY: shared access hands out `&[u8]` and raw pointers only, like a `Box<[u8]>`.
unsafe impl Sync for HostBytes {}

impl HostBytes {
    /// Allocations at least this large are anonymous mappings.
    pub const MMAP_THRESHOLD: usize = 1 << 20;

    /// Allocates `len` zeroed bytes aligned to `align` (a power of two); `None` when the
    /// allocation fails or the layout is invalid.
    pub fn zeroed(len: usize, align: usize) -> Option<Self> {
        if len == 0 {
            let ptr = NonNull::new(align as *mut u8)?;
            return Some(Self {
                ptr,
                len,
                backing: Backing::Empty,
            });
        }
        if len >= Self::MMAP_THRESHOLD && align <= 4096 {
            return Self::mapped(len, false);
        }
        let layout = Layout::from_size_align(len, align).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)?;
        Some(Self {
            ptr,
            len,
            backing: Backing::Heap(align),
        })
    }

    /// Like [`zeroed`](Self::zeroed), with every page of a mapped allocation made present at
    /// once (`MAP_POPULATE`): for bytes about to be written in full, where one call that
    /// faults in every page costs less than a fault per page.
    pub fn zeroed_present(len: usize, align: usize) -> Option<Self> {
        if len >= Self::MMAP_THRESHOLD && align <= 4096 {
            return Self::mapped(len, true);
        }
        Self::zeroed(len, align)
    }

    /// An anonymous mapping (page-aligned, zeroed by the kernel: lazily, or at once when
    /// `populate`).
    fn mapped(len: usize, populate: bool) -> Option<Self> {
        let mut options = memmap2::MmapOptions::new();
        options.len(len);
        if populate {
            options.populate();
        }
        let mut map = options.map_anon().ok()?;
        let ptr = NonNull::new(map.as_mut_ptr())?;
        Some(Self {
            ptr,
            len,
            backing: Backing::Mapped { _mapping: map },
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole buffer as a host region.
    pub fn region(&mut self) -> DeviceRegion<'_, HostMemory> {
        DeviceRegion::from_slice(self)
    }

    /// The address of the first byte, without making a reference to the bytes (so other
    /// threads may be writing parts of them); dangling when empty.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// A pointer to the first byte that carries the allocation's write permission, made without
    /// a reference to the bytes; dangling when empty. Writing through it is the caller's
    /// `unsafe`: no reference to those bytes may be alive meanwhile.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`, reading nothing else: no
    /// reference to the whole buffer is made, so other threads may be writing other ranges of
    /// it meanwhile. `None` when the range is outside the buffer.
    pub fn copy_range_to(&self, offset: usize, dst: &mut [u8]) -> Option<()> {
        let end = offset.checked_add(dst.len())?;
        if end > self.len {
            return None;
        }
        if dst.is_empty() {
            return Some(());
        }
        // SAFETY: `[offset, end)` lies inside the allocation (checked above); the source is
        // read through a raw pointer of exactly that range, and `dst` is a distinct `&mut`
        // borrow, so the two cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Some(())
    }
}

impl Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialized (zeroed) bytes, or dangling and aligned
        // with `len == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HostBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        if let Backing::Heap(align) = self.backing
            && let Ok(layout) = Layout::from_size_align(self.len, align)
        {
            // SAFETY: the pointer came from `alloc_zeroed` with this same layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
        // A mapping is unmapped by its own drop; an empty buffer owns nothing.
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBytes")
            .field("len", &self.len)
            .field(
                "backing",
                &match self.backing {
                    Backing::Empty => "empty",
                    Backing::Heap(_) => "heap",
                    Backing::Mapped { .. } => "mapped",
                },
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_and_splits_stay_in_bounds() {
        let mut bytes = vec![0u8; 10];
        let mut region = DeviceRegion::from_slice(&mut bytes);
        assert!(region.slice(8, 3).is_none());
        assert!(region.slice(usize::MAX, 2).is_none());
        region.slice(2, 3).unwrap().as_mut_slice().fill(7);
        let (mut a, mut b) = region.split_at(5).unwrap();
        assert_eq!(a.as_mut_slice(), &[0, 0, 7, 7, 7]);
        b.as_mut_slice().fill(1);
        assert_eq!(bytes, [0, 0, 7, 7, 7, 1, 1, 1, 1, 1]);
        let mut more = vec![0u8; 10];
        let mut region = DeviceRegion::from_slice(&mut more);
        let base = region.addr();
        let mut sub = region.slice(4, 6).unwrap();
        let inner = sub.slice(1, 2).unwrap();
        assert_eq!((inner.base(), inner.offset_in_base()), (base, 5));
        let (_, tail) = region.split_at(7).unwrap();
        assert_eq!((tail.base(), tail.offset_in_base()), (base, 7));
    }

    #[test]
    fn host_bytes_are_zeroed_aligned_and_empty_is_fine() {
        let bytes = HostBytes::zeroed(10_000, 4096).unwrap();
        assert_eq!(bytes.as_ptr() as usize % 4096, 0);
        let calloc = HostBytes::zeroed(10_000, 16).unwrap();
        assert_eq!(calloc.as_ptr() as usize % 16, 0);
        assert!(calloc.iter().all(|&b| b == 0));
        assert!(bytes.iter().all(|&b| b == 0));
        let empty = HostBytes::zeroed(0, 4096).unwrap();
        assert!(empty.is_empty());
        assert!(HostBytes::zeroed(usize::MAX - 10, 4096).is_none());
        let mut big = HostBytes::zeroed(3 << 20, 4096).unwrap();
        assert!(matches!(big.backing, Backing::Mapped { .. }));
        assert_eq!(big.as_ptr() as usize % 4096, 0);
        assert!(big.iter().all(|&b| b == 0));
        big[3 << 19] = 9;
        assert_eq!(big.iter().map(|&b| b as usize).sum::<usize>(), 9);
        let small = HostBytes::zeroed(100, 64).unwrap();
        assert!(matches!(small.backing, Backing::Heap(64)));
    }
}
