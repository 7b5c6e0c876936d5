//! Where the order of calls is the point, mockall checks it: the destination is asked before
//! anything is allocated, and after a read error nothing is read again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use backend_mock::fixtures::{TensorSpec, write_file};
use mockall::{Sequence, mock};
use staging_core::host::{HostAllocator, HostBuffer};
use staging_core::{
    AllocError, Checkpoint, Destination, DestinationError, DeviceAllocator, DeviceError,
    DeviceRegion, Error, HostMemory, IoMode, MemoryInfo, ReadError, Reader, Stager, StagingPath,
    StagingPolicy, TensorMeta,
};
use std::path::Path;

mock! {
    Alloc {}
    impl DeviceAllocator for Alloc {
        type Space = HostMemory;
        type Buffer = HostBuffer;
        fn memory_info(&self) -> Result<MemoryInfo, DeviceError>;
        fn allocate(&self, len: usize) -> Result<HostBuffer, AllocError>;
        fn copy_to_host(&self, src: &HostBuffer, offset: usize, dst: &mut [u8]) -> Result<(), DeviceError>;
    }
}

mock! {
    Dest {}
    impl Destination<HostMemory> for Dest {
        fn region<'a>(&'a mut self, tensor: &TensorMeta) -> Result<Option<DeviceRegion<'a, HostMemory>>, DestinationError>;
    }
}

mock! {
    Read {}
    impl Reader for Read {
        type Space = HostMemory;
        type File = ();
        fn name(&self) -> &str;
        fn mode(&self) -> IoMode;
        fn open(&self, path: &Path) -> Result<(), ReadError>;
        fn read_at<'a>(&self, file: &(), offset: u64, dst: DeviceRegion<'a, HostMemory>) -> Result<usize, ReadError>;
    }
}

fn two_tensor_checkpoint() -> (tempfile::TempDir, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_file(
        &path,
        &[
            TensorSpec::bytes("first", 64),
            TensorSpec::bytes("second", 32),
        ],
        3,
    )
    .unwrap();
    let checkpoint = Checkpoint::open(&path).unwrap();
    (dir, checkpoint)
}

fn real_allocation(len: usize) -> Result<HostBuffer, AllocError> {
    HostAllocator::new().allocate(len)
}

#[test]
fn destination_is_asked_before_any_allocation() {
    let (_dir, checkpoint) = two_tensor_checkpoint();
    let mut seq = Sequence::new();
    let mut dest = MockDest::new();
    let mut alloc = MockAlloc::new();
    for len in [64usize, 32] {
        dest.expect_region()
            .withf(move |t| t.len == len)
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_| Ok(None));
        alloc
            .expect_memory_info()
            .times(1)
            .in_sequence(&mut seq)
            .returning(|| {
                Ok(MemoryInfo {
                    free: u64::MAX,
                    total: u64::MAX,
                })
            });
        alloc
            .expect_allocate()
            .withf(move |&l| l == len)
            .times(1)
            .in_sequence(&mut seq)
            .returning(real_allocation);
    }
    let stager = Stager::new(
        checkpoint,
        staging_core::host::HostReader,
        alloc,
        StagingPolicy::default(),
    )
    .unwrap()
    .with_destination(&mut dest);
    let paths: Vec<StagingPath> = stager.map(|t| t.unwrap().path()).collect();
    assert_eq!(paths, [StagingPath::Device, StagingPath::Device]);
}

#[test]
fn a_destination_that_takes_the_tensor_means_no_allocation() {
    let (_dir, checkpoint) = two_tensor_checkpoint();
    let mut dest = MockDest::new();
    let mut alloc = MockAlloc::new();
    // The allocator has no expectations: any call to it fails the test.
    alloc.expect_memory_info().never();
    alloc.expect_allocate().never();
    // mockall wants a 'static closure: the arena is a raw allocation, taken back at the end.
    let raw: *mut [u8] = Box::into_raw(vec![0u8; 96].into_boxed_slice());
    // SAFETY: `raw` is a live allocation that only this borrow uses until it is freed below.
    let arena: &'static mut [u8] = unsafe { &mut *raw };
    let mut arena = Some(arena);
    dest.expect_region().times(2).returning(move |t| {
        let whole = arena.take().unwrap_or_default();
        let (mine, rest) = whole.split_at_mut(t.len);
        arena = Some(rest);
        Ok(Some(DeviceRegion::from_slice(mine)))
    });
    let stager = Stager::new(
        checkpoint,
        staging_core::host::HostReader,
        alloc,
        StagingPolicy::default(),
    )
    .unwrap()
    .with_destination(&mut dest);
    let paths: Vec<StagingPath> = stager.map(|t| t.unwrap().path()).collect();
    assert_eq!(paths, [StagingPath::Destination, StagingPath::Destination]);
    drop(dest);
    // SAFETY: the stager and the mock (whose closure held the last borrow) are gone.
    drop(unsafe { Box::from_raw(raw) });
}

#[test]
fn after_a_read_error_nothing_is_read_again() {
    let (_dir, checkpoint) = two_tensor_checkpoint();
    let first = checkpoint.tensors()[0].offset;
    let mut seq = Sequence::new();
    let mut reader = MockRead::new();
    reader.expect_name().return_const("mockall".to_owned());
    reader.expect_mode().return_const(IoMode::Posix);
    reader
        .expect_open()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(()));
    reader
        .expect_read_at()
        .withf(move |_, offset, dst| *offset == first && dst.len() == 32)
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, dst| Ok(dst.len()));
    reader
        .expect_read_at()
        .withf(move |_, offset, _| *offset == first + 32)
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, _| Err(ReadError::Io(std::io::Error::other("disk on fire"))));
    // No further expectation: one more read_at call would fail the test.
    let policy = StagingPolicy::builder()
        .chunk_size(32)
        .staging_size(32)
        .io_threads(1)
        .build()
        .unwrap();
    let mut stager = Stager::new(checkpoint, reader, HostAllocator::new(), policy).unwrap();
    match stager.next() {
        Some(Err(Error::Read { tensor, offset, .. })) => {
            assert_eq!(tensor, "first");
            assert_eq!(offset, first + 32);
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    assert!(stager.next().is_none());
    assert!(stager.next().is_none());
}
