//! Every fault at every point of a multi-shard load through the mock backend: a read error at
//! each read call in turn, and out-of-memory at each allocation in turn, with one and with three
//! I/O threads. Each run ends either in success with every byte right (out-of-memory falls
//! back) or in the expected error naming the right tensor; nothing is yielded after an error and
//! nothing leaks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use backend_mock::fixtures::{Contents, TensorSpec, write_sharded};
use backend_mock::{FaultyReader, ScriptedAllocator};
use staging_core::host::{HostAllocator, HostReader};
use staging_core::plan_chunks;
use staging_core::{Checkpoint, Dtype, Error, Stager, StagingPath, StagingPolicy, TensorData};

const CHUNK: usize = 8192;

fn fixture() -> (tempfile::TempDir, Checkpoint, Contents) {
    let dir = tempfile::tempdir().unwrap();
    let shards = vec![
        vec![
            TensorSpec::new("s0.a", Dtype::F32, &[100]),
            TensorSpec::new("s0.big", Dtype::BF16, &[3 * CHUNK / 2 + 77]),
            TensorSpec::bytes("s0.empty", 0),
        ],
        vec![
            TensorSpec::new("s1.b", Dtype::F16, &[5000]),
            TensorSpec::bytes("s1.c", 2 * CHUNK),
        ],
        vec![
            TensorSpec::new("s2.d", Dtype::I64, &[3000]),
            TensorSpec::bytes("s2.e", 10),
        ],
    ];
    let written = write_sharded(dir.path(), &shards, 1234).unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    (dir, checkpoint, written.contents)
}

fn policy(threads: usize) -> StagingPolicy {
    StagingPolicy::builder()
        .chunk_size(CHUNK)
        .staging_size(CHUNK)
        .io_threads(threads)
        .build()
        .unwrap()
}

/// Every read request of a fault-free load, in order: (file, offset, tensor name).
fn read_requests(checkpoint: &Checkpoint) -> Vec<(std::path::PathBuf, u64, String)> {
    let mut out = Vec::new();
    for t in checkpoint.tensors() {
        for (rel, _) in plan_chunks(t.offset, t.len, CHUNK) {
            out.push((t.file.to_path_buf(), t.offset + rel as u64, t.name.clone()));
        }
    }
    out
}

fn bytes_of(
    allocator: &ScriptedAllocator<HostAllocator>,
    t: &staging_core::StagedTensor<backend_mock::ScriptedBuffer<staging_core::host::HostBuffer>>,
) -> Vec<u8> {
    match t.data() {
        TensorData::Device(d) => {
            let mut out = vec![0u8; t.meta().len];
            staging_core::DeviceAllocator::copy_to_host(allocator, d.buffer(), 0, &mut out)
                .unwrap();
            out
        }
        TensorData::Host(h) => h.to_vec(),
        TensorData::Destination { .. } => unreachable!("no destination in this sweep"),
    }
}

#[test]
fn a_read_error_at_every_chunk() {
    let (_dir, checkpoint, contents) = fixture();
    let requests = read_requests(&checkpoint);
    for threads in [1, 3] {
        for (file, offset, tensor) in &requests {
            for free in [u64::MAX / 2, 0] {
                let reader = FaultyReader::new(HostReader).fail_at_offset_in(file.clone(), *offset);
                let allocator = ScriptedAllocator::new(HostAllocator::new()).report_free(free);
                let ledger = allocator.ledger();
                let mut stager =
                    Stager::new(checkpoint.clone(), reader, allocator, policy(threads)).unwrap();
                let mut good = Vec::new();
                let error = loop {
                    match stager.next() {
                        Some(Ok(t)) => good.push(t),
                        Some(Err(e)) => break e,
                        None => panic!("threads {threads}: the fault at {offset} was never hit"),
                    }
                };
                match &error {
                    Error::Read {
                        tensor: name,
                        offset: at,
                        ..
                    } => {
                        assert_eq!(name, tensor, "threads {threads}, offset {offset}");
                        assert_eq!(at, offset);
                    }
                    other => panic!("threads {threads}: expected a read error, got {other}"),
                }
                assert!(stager.next().is_none(), "a tensor after the error");
                let order: Vec<&str> = checkpoint
                    .tensors()
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect();
                let failed_at = order.iter().position(|n| n == tensor).unwrap();
                assert_eq!(
                    good.len(),
                    failed_at,
                    "every tensor before the failing one, and only those"
                );
                for t in &good {
                    assert!(
                        bytes_of(stager.allocator(), t) == contents[t.name()],
                        "{} wrong",
                        t.name()
                    );
                }
                drop(good);
                drop(stager);
                assert!(
                    ledger.outstanding().is_empty(),
                    "leak after fault at {offset}: {:?}",
                    ledger.outstanding()
                );
            }
        }
    }
}

#[test]
fn out_of_memory_at_every_allocation() {
    let (_dir, checkpoint, contents) = fixture();
    // A fault-free run counts the allocations.
    let counting = ScriptedAllocator::new(HostAllocator::new()).report_free(u64::MAX / 2);
    let ledger = counting.ledger();
    let all: Vec<_> = Stager::new(checkpoint.clone(), HostReader, counting, policy(1))
        .unwrap()
        .collect();
    drop(all);
    let allocations = ledger.allocation_calls();
    assert!(allocations >= checkpoint.tensors().len());
    for threads in [1, 3] {
        for k in 0..allocations + 2 {
            let allocator = ScriptedAllocator::new(HostAllocator::new())
                .report_free(u64::MAX / 2)
                .oom_on_allocation(k);
            let ledger = allocator.ledger();
            let mut stager =
                Stager::new(checkpoint.clone(), HostReader, allocator, policy(threads)).unwrap();
            let tensors: Vec<_> = stager
                .by_ref()
                .map(|t| t.unwrap_or_else(|e| panic!("OOM at {k}: {e}")))
                .collect();
            assert_eq!(tensors.len(), checkpoint.tensors().len());
            for t in &tensors {
                assert!(
                    bytes_of(stager.allocator(), t) == contents[t.name()],
                    "OOM at {k}: {} wrong",
                    t.name()
                );
            }
            let races = tensors
                .iter()
                .filter(|t| t.path() == StagingPath::Host)
                .count();
            assert!(
                races <= 1,
                "OOM at {k}: one allocation failed, {races} tensors fell back"
            );
            assert_eq!(stager.report().fallbacks.allocation_race, races);
            drop(tensors);
            drop(stager);
            assert!(ledger.outstanding().is_empty(), "leak after OOM at {k}");
        }
    }
}

#[test]
fn two_loads_at_once_do_not_interfere() {
    let (_dir, checkpoint, contents) = fixture();
    std::thread::scope(|scope| {
        for threads in [1, 2] {
            let (checkpoint, contents) = (checkpoint.clone(), &contents);
            scope.spawn(move || {
                for _ in 0..20 {
                    let allocator = ScriptedAllocator::new(HostAllocator::new());
                    let ledger = allocator.ledger();
                    let mut stager =
                        Stager::new(checkpoint.clone(), HostReader, allocator, policy(threads))
                            .unwrap();
                    let tensors: Vec<_> = stager.by_ref().map(Result::unwrap).collect();
                    for t in &tensors {
                        assert!(bytes_of(stager.allocator(), t) == contents[t.name()]);
                    }
                    drop(tensors);
                    drop(stager);
                    assert!(ledger.outstanding().is_empty());
                }
            });
        }
    });
}
