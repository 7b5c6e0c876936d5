//! Coalesced reads: back-to-back small tensors are allocated together and read with one request
//! (with several I/O threads and an allocator that splits). Each test counts the requests the
//! reader saw and checks the bytes, the addresses, the paths and what was freed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::path::Path;

use backend_mock::fixtures::{Contents, TensorSpec, write_file};
use backend_mock::{FaultyReader, ReadLog, ScriptedAllocator};
use rstest::rstest;
use staging_core::host::{HostAllocator, HostReader};
use staging_core::{
    Checkpoint, DeviceAllocator, DeviceBuffer, DeviceRegion, Dtype, Error, HostMemory, Stager,
    StagingPath, StagingPolicy, SubAllocator, TensorData, TensorMeta,
};

/// Several threads (coalescing works on the batch path), small tensors below 32 KiB.
fn policy(coalesce_below: usize) -> StagingPolicy {
    StagingPolicy::builder()
        .io_threads(2)
        .chunk_size(1 << 20)
        .coalesce_below(coalesce_below)
        .build()
        .unwrap()
}

fn write(dir: &Path, specs: &[TensorSpec]) -> (Checkpoint, Contents) {
    let path = dir.join("model.safetensors");
    let contents = write_file(&path, specs, 11).unwrap();
    (Checkpoint::open(&path).unwrap(), contents)
}

/// `n` F32 tensors of `elements` each, named `{prefix}{i:02}`.
fn floats(prefix: &str, n: usize, elements: usize) -> Vec<TensorSpec> {
    (0..n)
        .map(|i| TensorSpec::new(format!("{prefix}{i:02}"), Dtype::F32, &[elements]))
        .collect()
}

/// A device buffer's bytes, copied back.
fn device_bytes<A: DeviceAllocator>(allocator: &A, buffer: &A::Buffer) -> Vec<u8> {
    let mut bytes = vec![0u8; buffer.len()];
    allocator.copy_to_host(buffer, 0, &mut bytes).unwrap();
    bytes
}

/// Everything a load handed out: (name, path, address, bytes), and the error that ended it.
type Loaded = (Vec<(String, StagingPath, usize, Vec<u8>)>, Option<Error>);

fn drain<A>(stager: Stager<FaultyReader<HostReader>, A>) -> Loaded
where
    A: DeviceAllocator<Space = HostMemory>,
{
    let mut stager = stager;
    let mut out = Vec::new();
    while let Some(item) = stager.next() {
        match item {
            Ok(tensor) => {
                let (addr, bytes) = match tensor.data() {
                    TensorData::Device(d) => (
                        d.buffer().addr(),
                        device_bytes(stager.allocator(), d.buffer()),
                    ),
                    TensorData::Host(h) => (h.as_ptr() as usize, h.to_vec()),
                    TensorData::Destination { addr, .. } => (*addr, Vec::new()),
                };
                out.push((tensor.name().to_owned(), tensor.path(), addr, bytes));
            }
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

fn meta<'a>(checkpoint: &'a Checkpoint, name: &str) -> &'a TensorMeta {
    checkpoint.tensor(name).unwrap()
}

/// Small tensors carved from 1 MiB blocks of `host`, as `stage` does (with smaller numbers).
fn carved(host: &HostAllocator) -> SubAllocator<HostAllocator> {
    SubAllocator::new(host.clone(), 1 << 20, 32 << 10)
}

/// The requests a reader saw, as sorted `(offset, length)` pairs.
fn sorted_requests(log: &ReadLog) -> Vec<(u64, usize)> {
    let mut requests: Vec<(u64, usize)> = log
        .calls()
        .iter()
        .map(|c| (c.offset, c.requested))
        .collect();
    requests.sort_unstable();
    requests
}

/// Loads `checkpoint` through `reader`: what [`drain`] returns, and the requests the reader saw
/// as sorted `(offset, length)` pairs.
fn load<A>(
    checkpoint: Checkpoint,
    reader: FaultyReader<HostReader>,
    allocator: A,
    coalesce_below: usize,
) -> (Loaded, Vec<(u64, usize)>)
where
    A: DeviceAllocator<Space = HostMemory>,
{
    let log = reader.log();
    let stager = Stager::new(checkpoint, reader, allocator, policy(coalesce_below)).unwrap();
    let loaded = drain(stager);
    let requests = sorted_requests(&log);
    (loaded, requests)
}

#[test]
fn back_to_back_small_tensors_are_one_request_each_run() {
    let dir = tempfile::tempdir().unwrap();
    // Ten 1 KiB tensors, one 64 KiB tensor (not small), five 512-byte tensors.
    let mut specs = floats("a", 10, 256);
    specs.push(TensorSpec::new("big", Dtype::F32, &[16384]));
    specs.extend(floats("c", 5, 128));
    let (checkpoint, contents) = write(dir.path(), &specs);
    let offsets: Vec<u64> = ["a00", "big", "c00"]
        .iter()
        .map(|n| meta(&checkpoint, n).offset)
        .collect();
    let host = HostAllocator::with_capacity(1 << 30);
    let ((loaded, error), requests) = load(
        checkpoint,
        FaultyReader::new(HostReader),
        carved(&host),
        32 << 10,
    );
    assert!(error.is_none(), "{error:?}");
    assert_eq!(
        requests,
        vec![
            (offsets[0], 10 * 1024),
            (offsets[1], 64 * 1024),
            (offsets[2], 5 * 512)
        ],
        "one request per run and one for the large tensor"
    );
    assert_eq!(loaded.len(), 16);
    for (name, path, _, bytes) in &loaded {
        assert_eq!(*path, StagingPath::Device, "{name}");
        assert_eq!(bytes, &contents[name], "{name}");
    }
    // The run's tensors are pieces of one allocation, in file order, 256-byte aligned.
    for pair in loaded[..10].windows(2) {
        assert_eq!(
            pair[1].2 - pair[0].2,
            1024,
            "{} follows {}",
            pair[1].0,
            pair[0].0
        );
    }
    assert!(
        loaded
            .iter()
            .filter(|t| t.0 != "big")
            .all(|(_, _, addr, _)| addr % 256 == 0)
    );
    drop(loaded);
    assert_eq!(host.used(), 0, "every piece and block freed");
}

#[test]
fn a_neighbour_at_an_unaligned_distance_starts_a_new_run() {
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        TensorSpec::bytes("t0", 256),
        TensorSpec::bytes("t1", 100),
        TensorSpec::bytes("t2", 256), // 356 bytes after t0: cannot keep 256-byte alignment
        TensorSpec::bytes("t3", 256),
    ];
    let (checkpoint, contents) = write(dir.path(), &specs);
    let (t0, t2) = (
        meta(&checkpoint, "t0").offset,
        meta(&checkpoint, "t2").offset,
    );
    let ((loaded, error), requests) = load(
        checkpoint,
        FaultyReader::new(HostReader),
        carved(&HostAllocator::new()),
        32 << 10,
    );
    assert!(error.is_none(), "{error:?}");
    assert_eq!(requests, vec![(t0, 356), (t2, 512)]);
    for (name, _, addr, bytes) in &loaded {
        assert_eq!(bytes, &contents[name], "{name}");
        assert_eq!(addr % 256, 0, "{name} keeps the alignment");
    }
}

#[rstest]
#[case::off(0)]
#[case::on(32 << 10)]
fn a_bad_byte_inside_a_run_names_its_tensor_and_the_whole_ones_before_it_are_handed_out(
    #[case] coalesce_below: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, contents) = write(dir.path(), &floats("a", 10, 256));
    let bad = meta(&checkpoint, "a04").offset + 10;
    let host = HostAllocator::with_capacity(1 << 30);
    let ((loaded, error), _) = load(
        checkpoint,
        FaultyReader::new(HostReader).bad_byte_at(bad),
        carved(&host),
        coalesce_below,
    );
    let names: Vec<&str> = loaded.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(
        names,
        ["a00", "a01", "a02", "a03"],
        "the same with or without runs"
    );
    for (name, _, _, bytes) in &loaded {
        assert_eq!(bytes, &contents[name], "{name}");
    }
    match error {
        Some(Error::Read { tensor, offset, .. }) => {
            assert_eq!((tensor.as_str(), offset), ("a04", bad));
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    drop(loaded);
    assert_eq!(host.used(), 0, "the failed run's memory is freed");
}

/// Ten back-to-back 1 KiB tensors through `allocator`: one request each, bytes right.
fn one_request_per_tensor<A>(allocator: A, coalesce_below: usize)
where
    A: DeviceAllocator<Space = HostMemory>,
{
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, contents) = write(dir.path(), &floats("a", 10, 256));
    let ((loaded, error), requests) = load(
        checkpoint,
        FaultyReader::new(HostReader),
        allocator,
        coalesce_below,
    );
    assert!(error.is_none(), "{error:?}");
    assert_eq!(requests.len(), 10);
    assert!(loaded.iter().all(|(n, _, _, b)| b == &contents[n]));
}

#[test]
fn coalescing_off_reads_every_tensor_on_its_own() {
    one_request_per_tensor(carved(&HostAllocator::new()), 0);
}

#[test]
fn an_allocator_that_cannot_split_gets_one_request_per_tensor() {
    one_request_per_tensor(HostAllocator::new(), 32 << 10);
}

#[test]
fn a_run_that_runs_out_of_memory_is_staged_tensor_by_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, contents) = write(dir.path(), &floats("a", 10, 256));
    // The run's block, then the run on its own, run out of memory; the tensors one by one fit.
    let scripted = ScriptedAllocator::new(HostAllocator::new())
        .oom_on_allocation(0)
        .oom_on_allocation(1);
    let ledger = scripted.ledger();
    let reader = FaultyReader::new(HostReader);
    let log = reader.log();
    let mut stager = Stager::new(
        checkpoint,
        reader,
        SubAllocator::new(scripted, 1 << 20, 32 << 10),
        policy(32 << 10),
    )
    .unwrap();
    let mut loaded = Vec::new();
    while let Some(tensor) = stager.next() {
        let tensor = tensor.unwrap();
        assert_eq!(tensor.path(), StagingPath::Device, "{}", tensor.name());
        let TensorData::Device(d) = tensor.data() else {
            unreachable!()
        };
        let bytes = device_bytes(stager.allocator(), d.buffer());
        assert_eq!(bytes, contents[tensor.name()], "{}", tensor.name());
        loaded.push(tensor);
    }
    assert_eq!(loaded.len(), 10);
    let fallbacks = stager.report().fallbacks;
    assert_eq!(
        fallbacks.insufficient_memory + fallbacks.allocation_race,
        0,
        "no tensor left the device path"
    );
    assert_eq!(log.calls().len(), 10, "one request per tensor");
    drop((loaded, stager));
    assert_eq!(ledger.outstanding_bytes(), 0, "everything returned");
}

/// Takes one tensor by name into a buffer of its own.
struct TakeOne {
    name: &'static str,
    buffer: Vec<u8>,
}

impl staging_core::Destination<HostMemory> for TakeOne {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, HostMemory>>, staging_core::DestinationError> {
        if tensor.name == self.name {
            self.buffer = vec![0; tensor.len];
            Ok(Some(DeviceRegion::from_slice(&mut self.buffer)))
        } else {
            Ok(None)
        }
    }
}

#[test]
fn a_destination_tensor_splits_the_run_around_it() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, contents) = write(dir.path(), &floats("a", 6, 256));
    let starts: Vec<u64> = ["a00", "a03", "a04"]
        .iter()
        .map(|n| meta(&checkpoint, n).offset)
        .collect();
    let reader = FaultyReader::new(HostReader);
    let log = reader.log();
    let mut destination = TakeOne {
        name: "a03",
        buffer: Vec::new(),
    };
    let mut stager = Stager::new(
        checkpoint,
        reader,
        SubAllocator::new(HostAllocator::new(), 1 << 20, 32 << 10),
        policy(32 << 10),
    )
    .unwrap()
    .with_destination(&mut destination);
    let mut paths = Vec::new();
    while let Some(tensor) = stager.next() {
        let tensor = tensor.unwrap();
        if let TensorData::Device(d) = tensor.data() {
            let bytes = device_bytes(stager.allocator(), d.buffer());
            assert_eq!(bytes, contents[tensor.name()], "{}", tensor.name());
        }
        paths.push((tensor.name().to_owned(), tensor.path()));
    }
    drop(stager);
    assert_eq!(destination.buffer, contents["a03"]);
    assert_eq!(
        paths.iter().map(|p| p.1).collect::<Vec<_>>(),
        [
            StagingPath::Device,
            StagingPath::Device,
            StagingPath::Device,
            StagingPath::Destination,
            StagingPath::Device,
            StagingPath::Device
        ]
    );
    let requests = sorted_requests(&log);
    assert_eq!(
        requests,
        vec![
            (starts[0], 3 * 1024),
            (starts[1], 1024),
            (starts[2], 2 * 1024)
        ]
    );
}

/// Without host assembly (the drop-in functions' policy), a tensor the headroom would send to
/// the host takes a device buffer of its own, and a device out of memory is the error that ends
/// the load, naming the tensor: nothing is assembled in host memory, and what was allocated is
/// freed.
#[rstest]
#[case::one_thread(1)]
#[case::two_threads(2)]
fn without_host_assembly_every_tensor_is_on_the_device_or_the_load_fails(#[case] threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, contents) = write(dir.path(), &floats("w", 4, 64 << 10));
    let budgeted = |host_assembly: bool, budget: u64| {
        StagingPolicy::builder()
            .io_threads(threads)
            .coalesce_below(0)
            .memory_budget(Some(budget))
            .host_assembly(host_assembly)
            .build()
            .unwrap()
    };
    // Far below each tensor's headroom; the four tensors (256 KiB each) fit it exactly.
    let policy = |host_assembly: bool| budgeted(host_assembly, 1 << 20);
    // With it, the headroom sends every tensor to the host; without it, each is on the device.
    for (host_assembly, path) in [(true, StagingPath::Host), (false, StagingPath::Device)] {
        let stager = Stager::new(
            checkpoint.clone(),
            FaultyReader::new(HostReader),
            HostAllocator::new(),
            policy(host_assembly),
        )
        .unwrap();
        let (loaded, error) = drain(stager);
        assert!(error.is_none(), "{error:?}");
        assert_eq!(loaded.len(), 4);
        for (name, taken, _, bytes) in loaded {
            assert_eq!((taken, &bytes), (path, &contents[&name]), "{name}");
        }
    }
    // The third allocation is out of memory: the load ends there, with the error of its kind.
    let scripted = ScriptedAllocator::new(HostAllocator::new()).oom_on_allocation(2);
    let ledger = scripted.ledger();
    let stager = Stager::new(
        checkpoint.clone(),
        FaultyReader::new(HostReader),
        scripted,
        policy(false),
    )
    .unwrap();
    let (loaded, error) = drain(stager);
    let error = error.expect("out of memory ends the load");
    assert_eq!(
        error.kind(),
        staging_core::ErrorKind::DeviceAllocation,
        "{error}"
    );
    assert!(error.to_string().contains("w02"), "{error}");
    assert!(
        loaded
            .iter()
            .all(|(_, taken, _, _)| *taken == StagingPath::Device),
        "nothing assembled on the host"
    );
    assert_eq!(
        loaded.iter().map(|(n, ..)| n.as_str()).collect::<Vec<_>>(),
        ["w00", "w01"]
    );
    assert_eq!(ledger.outstanding_bytes(), 0, "everything freed");
    // The caller's budget still bounds what the load holds: 600 KiB hold two tensors kept by
    // the caller, not a third.
    let stager = Stager::new(
        checkpoint,
        FaultyReader::new(HostReader),
        HostAllocator::new(),
        budgeted(false, 600 << 10),
    )
    .unwrap();
    let mut loaded = Vec::new();
    let mut error = None;
    for item in stager {
        match item {
            Ok(tensor) => loaded.push(tensor),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let error = error.expect("over the budget ends the load");
    assert_eq!(
        error.kind(),
        staging_core::ErrorKind::DeviceAllocation,
        "{error}"
    );
    assert!(error.to_string().contains("memory_cap"), "{error}");
    assert_eq!(loaded.len(), 2, "{error}");
}
