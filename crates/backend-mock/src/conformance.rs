//! The conformance suite: the staging contract, checked against any reader and allocator pair.
//!
//! A backend implements [`Harness`] (a fresh, fault-free reader and allocator) and expands
//! [`conformance_suite!`](crate::conformance_suite) in a test file; every case below becomes a
//! test. Faults are injected by wrapping the backend's own pair in [`FaultyReader`] and
//! [`ScriptedAllocator`], so the backend's real reading, allocating and copying code runs under
//! them. Each case asserts the bytes, the path each tensor took, what was freed and the error.
//!
//! The functions panic (they are assertions); they are meant to be called from `#[test]`s.
//!
//! Length: one suite, the staging contract case by case; the cases share the harness and the
//! macro that expands them, and each is short.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use staging_core::{
    Checkpoint, Destination, DestinationError, DeviceAllocator, DeviceBuffer, DeviceRegion, Error,
    FallbackCause, Reader, StagedTensor, Stager, StagingPath, StagingPolicy, TensorData,
    TensorMeta, plan_chunks,
};
use tempfile::TempDir;

use crate::fixtures::{self, Contents, TensorSpec, every_dtype, header_for};
use crate::{FaultyReader, Ledger, ReadLog, ScriptedAllocator};

/// A backend under test: hands out a fresh, fault-free reader and allocator pair.
pub trait Harness {
    /// The backend's reader.
    type Reader: Reader;
    /// The backend's allocator, in the reader's memory space.
    type Allocator: DeviceAllocator<Space = <Self::Reader as Reader>::Space>;

    /// A fresh pair.
    fn backend(&self) -> (Self::Reader, Self::Allocator);
}

/// Chunk and staging-buffer size the suite runs with: small, so tensors span several chunks.
pub const CHUNK: usize = 16 * 1024;
const HUGE: u64 = 1 << 50;
const MIB: u64 = 1 << 20;

/// Where a read error is injected within a multi-chunk tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkAt {
    /// Its first chunk.
    First,
    /// A chunk in the middle.
    Middle,
    /// Its last (tail) chunk.
    Tail,
}

type Space<H> = <<H as Harness>::Reader as Reader>::Space;
type TestStager<H, D> =
    Stager<FaultyReader<<H as Harness>::Reader>, ScriptedAllocator<<H as Harness>::Allocator>, D>;

/// A checkpoint written to a temporary directory.
struct Fixture {
    _dir: TempDir,
    checkpoint: Checkpoint,
    contents: Contents,
}

fn small_policy() -> StagingPolicy {
    threaded_policy(1)
}

/// The suite's policy with `threads` I/O threads (more than one reads in batches on a pool).
fn threaded_policy(threads: usize) -> StagingPolicy {
    // Cases that count read calls use one thread: they rely on chunks being read in order.
    StagingPolicy::builder()
        .chunk_size(CHUNK)
        .staging_size(CHUNK)
        .io_threads(threads)
        .build()
        .unwrap()
}

/// Four tensors in two shards with an index: small, multi-chunk with a tail, tiny, exactly one
/// chunk.
fn standard_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let shards = vec![
        vec![
            TensorSpec::new("a.small", staging_core::Dtype::U8, &[100]),
            TensorSpec::new(
                "b.multi",
                staging_core::Dtype::BF16,
                &[(3 * CHUNK + 100) / 2],
            ),
        ],
        vec![
            TensorSpec::new("c.norm", staging_core::Dtype::F32, &[64]),
            TensorSpec::bytes("d.exact", CHUNK),
        ],
    ];
    let written = fixtures::write_sharded(dir.path(), &shards, 7).unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    Fixture {
        _dir: dir,
        checkpoint,
        contents: written.contents,
    }
}

fn single_file_fixture(specs: &[TensorSpec]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let contents = fixtures::write_file(&path, specs, 11).unwrap();
    let checkpoint = Checkpoint::open(&path).unwrap();
    Fixture {
        _dir: dir,
        checkpoint,
        contents,
    }
}

/// A fixture whose `target` tensor starts on a 4 KiB file offset (after a padding tensor), so
/// its chunks are exactly `CHUNK` long and tails are what their length says.
fn aligned_fixture(target_len: usize) -> Fixture {
    for pad in 1..=8192usize {
        let specs = [
            TensorSpec::bytes("pad", pad),
            TensorSpec::bytes("target", target_len),
        ];
        let header = header_for(&specs).unwrap();
        if (8 + header.len() + pad).is_multiple_of(4096) {
            return single_file_fixture(&specs);
        }
    }
    panic!("no padding aligns the target tensor");
}

struct Run<H: Harness, D: Destination<Space<H>>> {
    stager: TestStager<H, D>,
    log: ReadLog,
    ledger: Ledger,
}

fn run<H: Harness>(
    harness: &H,
    fixture: &Fixture,
    policy: StagingPolicy,
    reader: impl FnOnce(FaultyReader<H::Reader>) -> FaultyReader<H::Reader>,
    allocator: impl FnOnce(ScriptedAllocator<H::Allocator>) -> ScriptedAllocator<H::Allocator>,
) -> Run<H, staging_core::NoDestination> {
    let (r, a) = harness.backend();
    let reader = reader(FaultyReader::new(r));
    let allocator = allocator(ScriptedAllocator::new(a));
    let (log, ledger) = (reader.log(), allocator.ledger());
    let stager = Stager::new(fixture.checkpoint.clone(), reader, allocator, policy).unwrap();
    Run {
        stager,
        log,
        ledger,
    }
}

/// Free memory the scripted allocator reports for a path: enough for everything, or nothing.
fn free_for(path: StagingPath) -> u64 {
    match path {
        StagingPath::Host => 0,
        _ => HUGE,
    }
}

/// Drains a stager that must succeed.
fn collect_ok<I, T>(stager: &mut I) -> Vec<T>
where
    I: Iterator<Item = Result<T, Error>>,
{
    let mut out = Vec::new();
    for item in stager.by_ref() {
        match item {
            Ok(t) => out.push(t),
            Err(e) => panic!("load failed: {e}"),
        }
    }
    out
}

/// The bytes of a staged tensor, copied back from where they landed.
fn bytes_of<A: DeviceAllocator>(allocator: &A, tensor: &StagedTensor<A::Buffer>) -> Vec<u8> {
    match tensor.data() {
        TensorData::Device(d) => {
            assert_eq!(d.buffer().len(), tensor.meta().len, "device buffer length");
            let mut out = vec![0u8; tensor.meta().len];
            allocator.copy_to_host(d.buffer(), 0, &mut out).unwrap();
            out
        }
        TensorData::Host(h) => h.to_vec(),
        TensorData::Destination { .. } => {
            panic!("{}: destination bytes are the caller's", tensor.name())
        }
    }
}

fn assert_bytes<A: DeviceAllocator>(
    allocator: &A,
    tensors: &[StagedTensor<A::Buffer>],
    contents: &Contents,
) {
    assert_eq!(tensors.len(), contents.len(), "tensor count");
    for t in tensors {
        let expected = contents
            .get(t.name())
            .unwrap_or_else(|| panic!("unexpected tensor {}", t.name()));
        let got = bytes_of(allocator, t);
        assert!(
            got == *expected,
            "{}: bytes differ from what was written",
            t.name()
        );
    }
}

/// The read-call index of chunk `chunk` of tensor `target`, counting every earlier tensor's
/// chunks (no short reads).
fn call_index(
    checkpoint: &Checkpoint,
    target: &str,
    chunk: usize,
    chunk_size: usize,
) -> (usize, u64) {
    let mut calls = 0;
    for t in checkpoint.tensors() {
        let plan: Vec<_> = plan_chunks(t.offset, t.len, chunk_size).collect();
        if t.name == target {
            let (rel, _) = plan[chunk];
            return (calls + chunk, t.offset + rel as u64);
        }
        calls += plan.len();
    }
    panic!("no tensor {target}");
}

fn meta<'a>(checkpoint: &'a Checkpoint, name: &str) -> &'a TensorMeta {
    checkpoint.tensor(name).unwrap()
}

fn file_of(checkpoint: &Checkpoint, name: &str) -> PathBuf {
    meta(checkpoint, name).file.to_path_buf()
}

/// Sufficient memory: every tensor goes straight to the device, no host copy exists, and every
/// buffer is returned when the tensors are dropped.
pub fn device_path_when_memory_suffices<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(HUGE),
    );
    let tensors = collect_ok(&mut r.stager);
    for t in &tensors {
        assert_eq!(t.path(), StagingPath::Device, "{}", t.name());
        assert_eq!(t.fallback(), None);
    }
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    let report = r.stager.report();
    assert_eq!(report.paths.device.tensors, 4);
    assert_eq!(report.paths.device.bytes, f.checkpoint.total_bytes());
    assert_eq!(report.paths.host.tensors, 0);
    assert_eq!(report.peak_host_bytes, 0, "no host copy on the device path");
    assert_eq!(report.peak_device_bytes, f.checkpoint.total_bytes());
    let lens: Vec<usize> = r.ledger.entries().iter().map(|e| e.len).collect();
    let expected: Vec<usize> = f.checkpoint.tensors().iter().map(|t| t.len).collect();
    assert_eq!(
        lens, expected,
        "one allocation per tensor, no staging buffer"
    );
    assert_eq!(r.ledger.outstanding().len(), 4);
    drop(tensors);
    assert!(
        r.ledger.outstanding().is_empty(),
        "leaked: {:?}",
        r.ledger.outstanding()
    );
}

/// Low memory: every tensor is assembled on the host, the device holds only the staging buffer,
/// and the staging buffer is freed when the load ends.
pub fn host_path_when_memory_is_low<H: Harness>(h: &H) {
    let f = standard_fixture();
    let mut r = run(h, &f, small_policy(), |r| r, |a| a.report_free(0));
    let tensors = collect_ok(&mut r.stager);
    for t in &tensors {
        assert_eq!(t.path(), StagingPath::Host, "{}", t.name());
        assert_eq!(t.fallback(), Some(FallbackCause::InsufficientMemory));
    }
    assert!(
        r.ledger.outstanding().is_empty(),
        "staging buffer held after the load"
    );
    let entries = r.ledger.entries();
    assert_eq!(entries.len(), 1, "one staging buffer per load: {entries:?}");
    assert_eq!(entries[0].len, CHUNK);
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    let report = r.stager.report();
    assert_eq!(report.paths.host.tensors, 4);
    assert_eq!(report.fallbacks.insufficient_memory, 4);
    assert_eq!(report.peak_device_bytes, CHUNK as u64);
    assert_eq!(report.peak_host_bytes, f.checkpoint.total_bytes());
}

/// Low memory with several I/O threads: host assembly runs through two staging slots at once
/// (reads overlapping device-to-host copies); the bytes are right, the device held exactly the
/// two slots, and both are freed when the load ends.
pub fn host_path_overlapped<H: Harness>(h: &H) {
    let f = standard_fixture();
    let mut r = run(h, &f, threaded_policy(3), |r| r, |a| a.report_free(0));
    let tensors = collect_ok(&mut r.stager);
    assert!(tensors.iter().all(|t| t.path() == StagingPath::Host));
    assert!(
        r.ledger.outstanding().is_empty(),
        "staging slots held after the load"
    );
    let lens: Vec<usize> = r.ledger.entries().iter().map(|e| e.len).collect();
    assert_eq!(
        lens,
        vec![CHUNK, CHUNK],
        "two staging slots, allocated once"
    );
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    assert_eq!(r.stager.report().peak_device_bytes, 2 * CHUNK as u64);
}

/// A capped device: tensors that fit with headroom go to the device, the one that does not is
/// assembled on the host, and device memory held never exceeds the cap.
pub fn capped_device_mixes_paths<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let cap = 2 * CHUNK as u64 + 4096;
    let policy = threaded_policy(threads)
        .to_builder()
        .headroom(1024, 4)
        .build()
        .unwrap();
    let mut r = run(h, &f, policy, |r| r, |a| a.with_capacity(cap));
    let tensors = collect_ok(&mut r.stager);
    let paths: Vec<_> = tensors
        .iter()
        .map(|t| (t.name().to_owned(), t.path()))
        .collect();
    assert_eq!(
        paths,
        vec![
            ("a.small".to_owned(), StagingPath::Device),
            ("b.multi".to_owned(), StagingPath::Host),
            ("c.norm".to_owned(), StagingPath::Device),
            // 16 KiB + 4 KiB headroom no longer fits next to the staging buffer and the others.
            ("d.exact".to_owned(), StagingPath::Host),
        ]
    );
    assert!(
        r.ledger.peak_bytes() <= cap,
        "device held {} > cap {cap}",
        r.ledger.peak_bytes()
    );
    assert!(r.stager.report().peak_device_bytes <= cap);
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
}

/// A device too small for the configured staging buffer gets a smaller one (halved on
/// out-of-memory), and the load still completes with the right bytes.
pub fn staging_buffer_shrinks_when_memory_is_short<H: Harness>(h: &H) {
    let f = standard_fixture();
    let cap = (CHUNK / 2 + 100) as u64;
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r,
        |a| a.report_free(0).with_capacity(cap),
    );
    let tensors = collect_ok(&mut r.stager);
    assert!(tensors.iter().all(|t| t.path() == StagingPath::Host));
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    let lens: Vec<usize> = r.ledger.entries().iter().map(|e| e.len).collect();
    assert_eq!(lens, vec![CHUNK / 2], "one staging buffer, halved once");
    assert_eq!(r.ledger.allocation_calls(), 2, "tried the full size first");
    let longest = r.log.calls().iter().map(|c| c.requested).max().unwrap();
    assert_eq!(longest, CHUNK / 2, "host-path reads fit the smaller buffer");
    assert!(r.ledger.outstanding().is_empty());
}

/// No staging buffer fits at all: the load fails naming the tensor, with nothing leaked.
pub fn no_staging_buffer_is_an_error<H: Harness>(h: &H) {
    let f = standard_fixture();
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r,
        |a| a.report_free(0).with_capacity(4095),
    );
    match r.stager.next() {
        Some(Err(Error::StagingBuffer { tensor, bytes, .. })) => {
            assert_eq!(tensor, "a.small");
            assert_eq!(bytes, 4096, "the smallest size tried");
        }
        other => panic!("expected a staging-buffer error, got {other:?}"),
    }
    assert!(r.stager.next().is_none());
    assert!(r.log.calls().is_empty(), "read without a staging buffer");
    assert!(r.ledger.outstanding().is_empty());
}

/// The allocation race: free memory said yes, the allocation said out-of-memory; the tensor
/// falls back to the host and is counted as a race.
pub fn allocation_race_falls_back<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(HUGE).oom_on_allocation(1),
    );
    let tensors = collect_ok(&mut r.stager);
    let paths: Vec<_> = tensors.iter().map(|t| t.path()).collect();
    assert_eq!(
        paths,
        [
            StagingPath::Device,
            StagingPath::Host,
            StagingPath::Device,
            StagingPath::Device
        ]
    );
    assert_eq!(tensors[1].fallback(), Some(FallbackCause::AllocationRace));
    let report = r.stager.report();
    assert_eq!(report.fallbacks.allocation_race, 1);
    assert_eq!(report.fallbacks.insufficient_memory, 0);
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    drop(tensors);
    assert!(r.ledger.outstanding().is_empty());
}

/// An allocation failure other than out-of-memory aborts the load, naming the tensor.
pub fn other_allocation_error_aborts<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(HUGE).fail_allocation(1),
    );
    let first = r.stager.next().unwrap().unwrap();
    match r.stager.next() {
        Some(Err(Error::Allocation { tensor, file, .. })) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(file, file_of(&f.checkpoint, "b.multi"));
        }
        other => panic!("expected an allocation error, got {other:?}"),
    }
    assert!(
        r.stager.next().is_none(),
        "a tensor was yielded after the error"
    );
    assert_eq!(
        r.ledger.outstanding().len(),
        1,
        "only the first tensor's buffer is held"
    );
    drop(first);
    assert!(r.ledger.outstanding().is_empty());
}

/// A read error at the first, a middle or the tail chunk of a multi-chunk tensor aborts the
/// load: the error names tensor, file and offset; no later read or tensor; nothing leaked.
pub fn read_error_aborts<H: Harness>(h: &H, path: StagingPath, at: ChunkAt) {
    let f = standard_fixture();
    let target = meta(&f.checkpoint, "b.multi");
    let chunks = plan_chunks(target.offset, target.len, CHUNK).count();
    assert!(
        chunks >= 3,
        "the target needs first, middle and tail chunks"
    );
    let chunk = match at {
        ChunkAt::First => 0,
        ChunkAt::Middle => chunks / 2,
        ChunkAt::Tail => chunks - 1,
    };
    let (call, offset) = call_index(&f.checkpoint, "b.multi", chunk, CHUNK);
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r.fail_on_call(call),
        |a| a.report_free(free_for(path)),
    );
    let first = r.stager.next().unwrap().unwrap();
    assert_eq!(first.path(), path);
    match r.stager.next() {
        Some(Err(Error::Read {
            tensor,
            file,
            offset: got,
            ..
        })) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(file, file_of(&f.checkpoint, "b.multi"));
            assert_eq!(got, offset, "error offset");
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    assert!(
        r.stager.next().is_none(),
        "a tensor was yielded after the error"
    );
    let calls = r.log.calls();
    assert_eq!(
        calls.last().map(|c| c.index),
        Some(call),
        "reads continued after the error"
    );
    let held: Vec<usize> = r.ledger.outstanding().iter().map(|e| e.len).collect();
    match path {
        StagingPath::Device => {
            assert_eq!(held, vec![100], "only the first tensor's buffer is held")
        }
        _ => assert!(
            held.is_empty(),
            "staging buffer held after the error: {held:?}"
        ),
    }
    drop(first);
    assert!(r.ledger.outstanding().is_empty());
}

/// A read error at the first, a middle or the tail chunk, named by file offset so that it holds
/// with any number of I/O threads: the error names tensor, file and offset; nothing after it is
/// yielded; nothing leaks.
pub fn read_error_at_offset<H: Harness>(h: &H, path: StagingPath, at: ChunkAt, threads: usize) {
    let f = standard_fixture();
    let target = meta(&f.checkpoint, "b.multi");
    let chunks = plan_chunks(target.offset, target.len, CHUNK).count();
    let chunk = match at {
        ChunkAt::First => 0,
        ChunkAt::Middle => chunks / 2,
        ChunkAt::Tail => chunks - 1,
    };
    let (_, offset) = call_index(&f.checkpoint, "b.multi", chunk, CHUNK);
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r.fail_at_offset_in(file_of(&f.checkpoint, "b.multi"), offset),
        |a| a.report_free(free_for(path)),
    );
    let items: Vec<_> = r.stager.by_ref().collect();
    assert_eq!(items.len(), 2, "a.small, then the error, then nothing");
    let Ok(first) = &items[0] else {
        panic!("a.small failed: {:?}", items[0]);
    };
    assert_eq!(first.path(), path);
    assert!(
        bytes_of(r.stager.allocator(), first) == f.contents["a.small"],
        "a tensor before the failure was handed out incomplete"
    );
    match &items[1] {
        Err(Error::Read {
            tensor,
            file,
            offset: got,
            ..
        }) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(*file, file_of(&f.checkpoint, "b.multi"));
            assert_eq!(*got, offset);
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    assert!(r.stager.next().is_none());
    drop(items);
    assert!(
        r.ledger.outstanding().is_empty(),
        "leaked: {:?}",
        r.ledger.outstanding()
    );
}

/// A file that ends early (a read returns 0 bytes) is a truncation error with the offset.
pub fn truncation_is_an_error<H: Harness>(h: &H, path: StagingPath) {
    let f = standard_fixture();
    let (call, offset) = call_index(&f.checkpoint, "b.multi", 1, CHUNK);
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r.eof_on_call(call),
        |a| a.report_free(free_for(path)),
    );
    let items: Vec<_> = r.stager.by_ref().collect();
    assert_eq!(items.len(), 2, "the load stops at the truncated tensor");
    match &items[1] {
        Err(Error::Truncated {
            tensor,
            offset: got,
            missing,
            ..
        }) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(*got, offset);
            assert!(*missing > 0);
        }
        other => panic!("expected a truncation error, got {other:?}"),
    }
    drop(items);
    assert!(r.ledger.outstanding().is_empty());
}

/// Short reads of varying length are continued until every byte is in place.
pub fn short_reads_are_continued<H: Harness>(h: &H, path: StagingPath, threads: usize) {
    let f = standard_fixture();
    let pattern = vec![1, 7, 4093, 100_000, 3, 5000];
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r.short_reads(pattern),
        |a| a.report_free(free_for(path)),
    );
    let tensors = collect_ok(&mut r.stager);
    assert!(tensors.iter().all(|t| t.path() == path));
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    let calls = r.log.calls();
    assert!(
        calls.iter().any(|c| c.returned == Some(1)),
        "the pattern was applied"
    );
}

/// For every dtype, the staged bytes equal what the `safetensors` crate reads from the file.
pub fn bytes_match_safetensors_for_every_dtype<H: Harness>(h: &H, path: StagingPath) {
    let f = single_file_fixture(&every_dtype());
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r,
        |a| a.report_free(free_for(path)),
    );
    let tensors = collect_ok(&mut r.stager);
    let file = std::fs::read(f.checkpoint.files()[0].path.as_ref() as &Path).unwrap();
    let reference = safetensors::SafeTensors::deserialize(&file).unwrap();
    assert_eq!(tensors.len(), reference.len());
    for t in &tensors {
        assert_eq!(t.path(), path);
        let view = reference.tensor(t.name()).unwrap();
        assert_eq!(view.dtype(), t.meta().dtype);
        assert_eq!(view.shape(), t.meta().shape.as_slice());
        assert!(
            bytes_of(r.stager.allocator(), t) == view.data(),
            "{}: bytes differ",
            t.name()
        );
    }
}

/// Tails: a tensor below, equal to, and one byte over a multiple of the chunk size is read in
/// exactly the expected requests, and its bytes are right.
pub fn tail_chunks<H: Harness>(h: &H, path: StagingPath, len: usize) {
    let f = aligned_fixture(len);
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r,
        |a| a.report_free(free_for(path)),
    );
    let tensors = collect_ok(&mut r.stager);
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    let target = meta(&f.checkpoint, "target").clone();
    assert_eq!(target.offset % 4096, 0, "fixture must align the target");
    let requests: Vec<usize> = r
        .log
        .calls()
        .iter()
        .filter(|c| c.offset >= target.offset)
        .map(|c| c.requested)
        .collect();
    let mut expected = vec![CHUNK; len / CHUNK];
    if !len.is_multiple_of(CHUNK) {
        expected.push(len % CHUNK);
    }
    assert_eq!(requests, expected, "chunk requests for a {len}-byte tensor");
    assert!(tensors.iter().all(|t| t.path() == path));
}

/// Zero-length tensors are handed out empty, on the path the policy gives, and read nothing.
pub fn zero_length_tensors<H: Harness>(h: &H, path: StagingPath, threads: usize) {
    let specs = [
        TensorSpec::bytes("a", 10),
        TensorSpec::new("empty.f32", staging_core::Dtype::F32, &[0]),
        TensorSpec::new("empty.bf16", staging_core::Dtype::BF16, &[3, 0]),
        TensorSpec::bytes("b", 20),
    ];
    let f = single_file_fixture(&specs);
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(free_for(path)),
    );
    let tensors = collect_ok(&mut r.stager);
    assert_eq!(tensors.len(), 4);
    for t in &tensors {
        assert_eq!(t.path(), path);
    }
    assert_eq!(tensors[1].meta().len, 0);
    assert!(bytes_of(r.stager.allocator(), &tensors[1]).is_empty());
    assert!(bytes_of(r.stager.allocator(), &tensors[2]).is_empty());
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
    let calls = r.log.calls();
    assert_eq!(
        calls.len(),
        2,
        "only the two non-empty tensors are read: {calls:?}"
    );
    assert!(calls.iter().all(|c| c.requested > 0));
}

/// A destination that hands out regions of one device buffer for tensors whose name starts with
/// a prefix.
struct ArenaDestination<B> {
    arena: B,
    prefix: &'static str,
    next: usize,
    placed: Vec<(String, usize, usize)>,
}

impl<B: DeviceBuffer> Destination<B::Space> for ArenaDestination<B> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, B::Space>>, DestinationError> {
        if !tensor.name.starts_with(self.prefix) {
            return Ok(None);
        }
        let offset = self.next;
        let len = tensor.len.min(self.arena.len().saturating_sub(offset));
        self.next += tensor.len;
        self.placed.push((tensor.name.clone(), offset, tensor.len));
        match self.arena.region().into_subregion(offset, len) {
            Some(region) => Ok(Some(region)),
            None => Err("arena exhausted".into()),
        }
    }
}

/// The caller's destination is preferred: accepted tensors land there with nothing allocated
/// for them; the rest take the device path; all bytes are right.
pub fn destination_is_preferred<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let (_, arena_allocator) = h.backend();
    let arena_len = meta(&f.checkpoint, "b.multi").len + meta(&f.checkpoint, "c.norm").len;
    let mut destination = ArenaDestination {
        arena: arena_allocator.allocate(arena_len).unwrap(),
        prefix: "",
        next: 0,
        placed: Vec::new(),
    };
    destination.prefix = "b.";
    let r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(HUGE),
    );
    let arena_addr = destination.arena.addr();
    let mut stager = r.stager.with_destination(&mut destination);
    let mut tensors = Vec::new();
    for item in stager.by_ref() {
        tensors.push(item.unwrap());
    }
    let report = stager.report();
    let paths: Vec<_> = tensors.iter().map(|t| t.path()).collect();
    assert_eq!(
        paths,
        [
            StagingPath::Device,
            StagingPath::Destination,
            StagingPath::Device,
            StagingPath::Device
        ]
    );
    assert_eq!(report.paths.destination.tensors, 1);
    assert_eq!(
        report.paths.destination.bytes,
        meta(&f.checkpoint, "b.multi").len as u64
    );
    let allocated: Vec<usize> = r.ledger.entries().iter().map(|e| e.len).collect();
    assert!(
        !allocated.contains(&meta(&f.checkpoint, "b.multi").len),
        "allocated for a destination tensor"
    );
    assert_eq!(allocated.len(), 3);
    match tensors[1].data() {
        TensorData::Destination { addr, capacity } => {
            assert_eq!(*addr, arena_addr);
            assert_eq!(*capacity, meta(&f.checkpoint, "b.multi").len);
        }
        other => panic!("expected destination data, got {other:?}"),
    }
    drop(stager);
    let (name, offset, len) = destination.placed[0].clone();
    let mut got = vec![0u8; len];
    arena_allocator
        .copy_to_host(&destination.arena, offset, &mut got)
        .unwrap();
    assert!(got == f.contents[&name], "destination bytes differ");
}

/// A destination shorter than the tensor is an error, not a truncation; nothing is read into it.
pub fn destination_too_small_is_an_error<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let (_, arena_allocator) = h.backend();
    let needed = meta(&f.checkpoint, "b.multi").len;
    let mut destination = ArenaDestination {
        arena: arena_allocator.allocate(needed - 1).unwrap(),
        prefix: "b.",
        next: 0,
        placed: Vec::new(),
    };
    let r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(HUGE),
    );
    let mut stager = r.stager.with_destination(&mut destination);
    let first = stager.next().unwrap().unwrap();
    let reads_before = r.log.calls().len();
    match stager.next() {
        Some(Err(Error::DestinationTooSmall {
            tensor,
            needed: n,
            capacity,
            ..
        })) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(n, needed);
            assert_eq!(capacity, needed - 1);
        }
        other => panic!("expected DestinationTooSmall, got {other:?}"),
    }
    assert!(stager.next().is_none());
    assert_eq!(
        r.log.calls().len(),
        reads_before,
        "read into a too-small destination"
    );
    drop(first);
    drop(stager);
    assert!(r.ledger.outstanding().is_empty());
}

/// The headroom boundary: free memory of exactly `len + 256 MiB` takes the device path; one byte
/// less takes the host path.
pub fn headroom_boundary<H: Harness>(h: &H, exact: bool) {
    let len = 5000usize;
    let f = single_file_fixture(&[TensorSpec::bytes("t", len)]);
    let free = len as u64 + 256 * MIB - u64::from(!exact);
    let mut r = run(h, &f, small_policy(), |r| r, |a| a.report_free(free));
    let tensors = collect_ok(&mut r.stager);
    if exact {
        assert_eq!(tensors[0].path(), StagingPath::Device);
    } else {
        assert_eq!(tensors[0].path(), StagingPath::Host);
        assert_eq!(
            tensors[0].fallback(),
            Some(FallbackCause::InsufficientMemory)
        );
    }
    assert_bytes(r.stager.allocator(), &tensors, &f.contents);
}

/// A failed device-to-host copy on the host path aborts the load with the chunk's offset.
pub fn copy_error_aborts<H: Harness>(h: &H) {
    let f = standard_fixture();
    // Copy 0 is "a.small"; copy 2 is the second chunk of "b.multi".
    let (_, offset) = call_index(&f.checkpoint, "b.multi", 1, CHUNK);
    let mut r = run(
        h,
        &f,
        small_policy(),
        |r| r,
        |a| a.report_free(0).fail_copy(2),
    );
    let items: Vec<_> = r.stager.by_ref().collect();
    assert_eq!(items.len(), 2);
    match &items[1] {
        Err(Error::Device {
            tensor,
            offset: got,
            ..
        }) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(*got, offset);
        }
        other => panic!("expected a copy error, got {other:?}"),
    }
    assert!(
        r.ledger.outstanding().is_empty(),
        "staging buffer held after the error"
    );
}

/// A consumer that stops half-way and drops the stager frees everything the library held; the
/// tensors it took stay valid until it drops them.
pub fn dropped_early_frees_everything<H: Harness>(h: &H, path: StagingPath, threads: usize) {
    let f = standard_fixture();
    let r = run(
        h,
        &f,
        threaded_policy(threads),
        |r| r,
        |a| a.report_free(free_for(path)),
    );
    let mut stager = r.stager;
    let taken: Vec<_> = stager.by_ref().take(2).map(Result::unwrap).collect();
    drop(stager);
    let held: Vec<usize> = r.ledger.outstanding().iter().map(|e| e.len).collect();
    match path {
        StagingPath::Device => assert_eq!(held, vec![taken[0].meta().len, taken[1].meta().len]),
        _ => assert!(held.is_empty(), "staging buffer held after drop: {held:?}"),
    }
    drop(taken);
    assert!(r.ledger.outstanding().is_empty());
}

/// Several I/O threads give the same bytes; a read error among them still names the failing
/// chunk's offset and nothing is leaked.
pub fn parallel_reads<H: Harness>(h: &H, fail: bool) {
    let f = standard_fixture();
    let policy = small_policy().to_builder().io_threads(4).build().unwrap();
    // The failing chunk is named by its offset: parallel reads run in any order.
    let (_, offset) = call_index(&f.checkpoint, "b.multi", 1, CHUNK);
    let mut r = run(
        h,
        &f,
        policy,
        |r| {
            if fail {
                r.fail_at_offset_in(file_of(&f.checkpoint, "b.multi"), offset)
            } else {
                r
            }
        },
        |a| a.report_free(HUGE),
    );
    if !fail {
        let tensors = collect_ok(&mut r.stager);
        assert_bytes(r.stager.allocator(), &tensors, &f.contents);
        return;
    }
    let items: Vec<_> = r.stager.by_ref().collect();
    assert_eq!(items.len(), 2);
    match &items[1] {
        Err(Error::Read {
            tensor,
            offset: got,
            ..
        }) => {
            assert_eq!(tensor, "b.multi");
            assert_eq!(*got, offset);
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    drop(items);
    assert!(r.ledger.outstanding().is_empty());
}

/// A file the reader cannot open is an error naming the file, before anything is allocated.
pub fn open_failure_names_the_file<H: Harness>(h: &H, threads: usize) {
    let f = standard_fixture();
    let mut r = run(
        h,
        &f,
        threaded_policy(threads),
        FaultyReader::fail_open,
        |a| a.report_free(HUGE),
    );
    match r.stager.next() {
        Some(Err(Error::Open { file, .. })) => assert_eq!(file, file_of(&f.checkpoint, "a.small")),
        other => panic!("expected an open error, got {other:?}"),
    }
    assert!(r.stager.next().is_none());
    assert_eq!(r.ledger.allocation_calls(), 0);
}

/// Tensors come out in file order, then offset order, across shards.
pub fn load_order_is_file_then_offset<H: Harness>(h: &H) {
    let f = standard_fixture();
    let mut r = run(h, &f, small_policy(), |r| r, |a| a.report_free(HUGE));
    let tensors = collect_ok(&mut r.stager);
    let names: Vec<_> = tensors.iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(names, ["a.small", "b.multi", "c.norm", "d.exact"]);
    let calls = r.log.calls();
    for pair in calls.windows(2) {
        if pair[0].file == pair[1].file {
            assert!(
                pair[0].offset < pair[1].offset,
                "reads out of order: {calls:?}"
            );
        }
    }
    let files: Vec<&PathBuf> = calls.iter().map(|c| &c.file).collect();
    let mut sorted = files.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), 2, "each file is read in one stretch");
    assert_eq!(r.stager.report().files, 2);
}

/// Expands to one `#[test]` per conformance case for a harness expression.
///
/// ```text
/// backend_mock::conformance_suite!(MyHarness::new());
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        #[allow(unused_imports)]
        use $crate::conformance as suite;
        #[allow(unused_imports)]
        use $crate::conformance::ChunkAt;
        #[allow(unused_imports)]
        use $crate::staging_core::StagingPath;

        #[test]
        fn device_path_when_memory_suffices() {
            suite::device_path_when_memory_suffices(&$harness, 1)
        }
        #[test]
        fn host_path_when_memory_is_low() {
            suite::host_path_when_memory_is_low(&$harness)
        }
        #[test]
        fn capped_device_mixes_paths() {
            suite::capped_device_mixes_paths(&$harness, 1)
        }
        #[test]
        fn staging_buffer_shrinks_when_memory_is_short() {
            suite::staging_buffer_shrinks_when_memory_is_short(&$harness)
        }
        #[test]
        fn no_staging_buffer_is_an_error() {
            suite::no_staging_buffer_is_an_error(&$harness)
        }
        #[test]
        fn allocation_race_falls_back() {
            suite::allocation_race_falls_back(&$harness, 1)
        }
        #[test]
        fn other_allocation_error_aborts() {
            suite::other_allocation_error_aborts(&$harness, 1)
        }
        #[test]
        fn read_error_first_chunk_device() {
            suite::read_error_aborts(&$harness, StagingPath::Device, ChunkAt::First)
        }
        #[test]
        fn read_error_middle_chunk_device() {
            suite::read_error_aborts(&$harness, StagingPath::Device, ChunkAt::Middle)
        }
        #[test]
        fn read_error_tail_chunk_device() {
            suite::read_error_aborts(&$harness, StagingPath::Device, ChunkAt::Tail)
        }
        #[test]
        fn read_error_first_chunk_host() {
            suite::read_error_aborts(&$harness, StagingPath::Host, ChunkAt::First)
        }
        #[test]
        fn read_error_middle_chunk_host() {
            suite::read_error_aborts(&$harness, StagingPath::Host, ChunkAt::Middle)
        }
        #[test]
        fn read_error_tail_chunk_host() {
            suite::read_error_aborts(&$harness, StagingPath::Host, ChunkAt::Tail)
        }
        #[test]
        fn truncation_device() {
            suite::truncation_is_an_error(&$harness, StagingPath::Device)
        }
        #[test]
        fn truncation_host() {
            suite::truncation_is_an_error(&$harness, StagingPath::Host)
        }
        #[test]
        fn short_reads_device() {
            suite::short_reads_are_continued(&$harness, StagingPath::Device, 1)
        }
        #[test]
        fn short_reads_host() {
            suite::short_reads_are_continued(&$harness, StagingPath::Host, 1)
        }
        #[test]
        fn every_dtype_device() {
            suite::bytes_match_safetensors_for_every_dtype(&$harness, StagingPath::Device)
        }
        #[test]
        fn every_dtype_host() {
            suite::bytes_match_safetensors_for_every_dtype(&$harness, StagingPath::Host)
        }
        #[test]
        fn tail_below_chunk_device() {
            suite::tail_chunks(&$harness, StagingPath::Device, 3 * suite::CHUNK - 1)
        }
        #[test]
        fn tail_equal_chunk_device() {
            suite::tail_chunks(&$harness, StagingPath::Device, 3 * suite::CHUNK)
        }
        #[test]
        fn tail_one_over_chunk_device() {
            suite::tail_chunks(&$harness, StagingPath::Device, 3 * suite::CHUNK + 1)
        }
        #[test]
        fn tail_below_chunk_host() {
            suite::tail_chunks(&$harness, StagingPath::Host, 3 * suite::CHUNK - 1)
        }
        #[test]
        fn tail_equal_chunk_host() {
            suite::tail_chunks(&$harness, StagingPath::Host, 3 * suite::CHUNK)
        }
        #[test]
        fn tail_one_over_chunk_host() {
            suite::tail_chunks(&$harness, StagingPath::Host, 3 * suite::CHUNK + 1)
        }
        #[test]
        fn tail_single_short_chunk() {
            suite::tail_chunks(&$harness, StagingPath::Device, 100)
        }
        #[test]
        fn zero_length_device() {
            suite::zero_length_tensors(&$harness, StagingPath::Device, 1)
        }
        #[test]
        fn zero_length_host() {
            suite::zero_length_tensors(&$harness, StagingPath::Host, 1)
        }
        #[test]
        fn destination_is_preferred() {
            suite::destination_is_preferred(&$harness, 1)
        }
        #[test]
        fn destination_too_small_is_an_error() {
            suite::destination_too_small_is_an_error(&$harness, 1)
        }
        #[test]
        fn headroom_boundary_exact() {
            suite::headroom_boundary(&$harness, true)
        }
        #[test]
        fn headroom_boundary_one_below() {
            suite::headroom_boundary(&$harness, false)
        }
        #[test]
        fn copy_error_aborts() {
            suite::copy_error_aborts(&$harness)
        }
        #[test]
        fn dropped_early_device() {
            suite::dropped_early_frees_everything(&$harness, StagingPath::Device, 1)
        }
        #[test]
        fn dropped_early_host() {
            suite::dropped_early_frees_everything(&$harness, StagingPath::Host, 1)
        }
        #[test]
        fn parallel_reads_bytes() {
            suite::parallel_reads(&$harness, false)
        }
        #[test]
        fn parallel_reads_error() {
            suite::parallel_reads(&$harness, true)
        }
        #[test]
        fn open_failure_names_the_file() {
            suite::open_failure_names_the_file(&$harness, 1)
        }
        #[test]
        fn load_order_is_file_then_offset() {
            suite::load_order_is_file_then_offset(&$harness)
        }
        // The same contract with several I/O threads (batched reads on a pool).
        #[test]
        fn threads_device_path_when_memory_suffices() {
            suite::device_path_when_memory_suffices(&$harness, 3)
        }
        #[test]
        fn threads_capped_device_mixes_paths() {
            suite::capped_device_mixes_paths(&$harness, 3)
        }
        #[test]
        fn threads_allocation_race_falls_back() {
            suite::allocation_race_falls_back(&$harness, 3)
        }
        #[test]
        fn threads_other_allocation_error_aborts() {
            suite::other_allocation_error_aborts(&$harness, 3)
        }
        #[test]
        fn threads_destination_is_preferred() {
            suite::destination_is_preferred(&$harness, 3)
        }
        #[test]
        fn threads_destination_too_small_is_an_error() {
            suite::destination_too_small_is_an_error(&$harness, 3)
        }
        #[test]
        fn threads_short_reads_device() {
            suite::short_reads_are_continued(&$harness, StagingPath::Device, 3)
        }
        #[test]
        fn threads_zero_length_device() {
            suite::zero_length_tensors(&$harness, StagingPath::Device, 3)
        }
        #[test]
        fn threads_dropped_early_device() {
            suite::dropped_early_frees_everything(&$harness, StagingPath::Device, 3)
        }
        #[test]
        fn threads_host_path_overlapped() {
            suite::host_path_overlapped(&$harness)
        }
        #[test]
        fn threads_open_failure_names_the_file() {
            suite::open_failure_names_the_file(&$harness, 3)
        }
        #[test]
        fn read_error_at_offset_first_device() {
            suite::read_error_at_offset(&$harness, StagingPath::Device, ChunkAt::First, 1)
        }
        #[test]
        fn threads_read_error_at_offset_first_device() {
            suite::read_error_at_offset(&$harness, StagingPath::Device, ChunkAt::First, 3)
        }
        #[test]
        fn threads_read_error_at_offset_middle_device() {
            suite::read_error_at_offset(&$harness, StagingPath::Device, ChunkAt::Middle, 3)
        }
        #[test]
        fn threads_read_error_at_offset_tail_device() {
            suite::read_error_at_offset(&$harness, StagingPath::Device, ChunkAt::Tail, 3)
        }
        #[test]
        fn threads_read_error_at_offset_middle_host() {
            suite::read_error_at_offset(&$harness, StagingPath::Host, ChunkAt::Middle, 3)
        }
    };
}
