//! The one entry point, `Loader`, on the host backend: what `auto` chose and why, selection and
//! row ranges (bytes, shapes, and only those bytes read), destinations of the right and the
//! wrong memory space, hand-over of device memory, and Hugging Face hub-cache layouts.
//!
//! Length: one test per behaviour of the entry point, sharing the checkpoint helpers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::collections::BTreeMap;
use std::path::Path;

use backend_mock::fixtures::{Contents, TensorSpec, every_dtype, write_file, write_hub_cache};
use backend_mock::{FaultyReader, ScriptedAllocator};
use rstest::rstest;
use safetensors_staging::{
    Backend, Checkpoint, Destination, DestinationError, DeviceRegion, Dtype, Error, HostMemory,
    HostOptions, Loader, RowRange, Selection, StagingPath, StagingPolicy, TensorMeta,
};
use staging_core::host::{HostAllocator, HostReader};
use staging_core::{Reader, Stager};

fn host() -> Backend {
    Backend::Host(HostOptions::default())
}

/// A file of a 2-D BF16 matrix, a 1-D norm, a 3-D F32 tensor and a scalar.
fn matrix_file(dir: &Path) -> (std::path::PathBuf, Contents) {
    let path = dir.join("model.safetensors");
    let specs = [
        TensorSpec::new("w", Dtype::BF16, &[96, 40]),
        TensorSpec::new("norm", Dtype::F32, &[40]),
        TensorSpec::new("cube", Dtype::F32, &[6, 3, 5]),
        TensorSpec::new("scalar", Dtype::F64, &[]),
    ];
    let contents = write_file(&path, &specs, 17).unwrap();
    (path, contents)
}

/// Every tensor of a load, by name: (bytes, shape, rows).
type Loaded = BTreeMap<String, (Vec<u8>, Vec<usize>, Option<std::ops::Range<usize>>)>;

fn load_all(loader: Loader<'_>, path: &Path) -> (Loaded, safetensors_staging::LoadReport) {
    let mut load = loader.open(path).unwrap();
    let mut out = BTreeMap::new();
    for tensor in load.by_ref() {
        let tensor = tensor.unwrap();
        let meta = tensor.meta().clone();
        out.insert(
            meta.name.clone(),
            (tensor.to_vec().unwrap(), meta.shape, meta.row_range),
        );
    }
    (out, load.report())
}

#[test]
fn auto_on_a_machine_without_a_gpu_loads_on_the_host_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    let (loaded, report) = load_all(Loader::new(), &path);
    // This test process loads no stub library: on a machine without a GPU neither runtime is
    // there, and `auto` says so for each. (On a GPU machine, the first that opens is chosen.)
    match report.backend.as_str() {
        "host" => {
            assert_eq!(report.passed_over.len(), 2, "{:?}", report.passed_over);
            assert!(
                report.passed_over[0].starts_with("cufile: no CUDA driver")
                    || report.passed_over[0].starts_with("cufile: no CUDA device"),
                "{:?}",
                report.passed_over
            );
            assert!(
                report.passed_over[1].starts_with("hipfile: no HIP runtime")
                    || report.passed_over[1].starts_with("hipfile: no HIP device"),
                "{:?}",
                report.passed_over
            );
        }
        "cufile" => assert!(report.passed_over.is_empty()),
        "hipfile" => assert_eq!(report.passed_over.len(), 1, "{:?}", report.passed_over),
        other => panic!("auto chose {other}"),
    }
    for (name, (bytes, _, rows)) in &loaded {
        assert_eq!(bytes, &contents[name], "{name}");
        assert!(rows.is_none());
    }
    assert_eq!(report.bytes_read, report.bytes);
    // Chosen explicitly, nothing was passed over.
    let (_, explicit) = load_all(Loader::new().backend(host()), &path);
    assert!(explicit.passed_over.is_empty());
}

#[test]
fn a_selection_loads_exactly_what_it_names_and_reads_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    let (loaded, report) = load_all(
        Loader::new()
            .backend(host())
            .select(Selection::names(["norm", "scalar"])),
        &path,
    );
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["norm", "scalar"]);
    assert_eq!(loaded["norm"].0, contents["norm"]);
    let selected = (contents["norm"].len() + contents["scalar"].len()) as u64;
    assert_eq!((report.bytes, report.bytes_read), (selected, selected));

    let (loaded, _) = load_all(
        Loader::new()
            .backend(host())
            .select(Selection::matching(|name| name.starts_with('c'))),
        &path,
    );
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["cube"]);

    let unknown = Loader::new()
        .backend(host())
        .select(Selection::names(["norm", "nrom"]))
        .open(&path)
        .unwrap_err();
    assert!(
        matches!(&unknown, Error::Load(staging_core::Error::UnknownTensor { name }) if name == "nrom"),
        "{unknown}"
    );
}

#[rstest]
#[case::rows(RowRange::Rows(10..37), 10..37)]
#[case::first_part(RowRange::Part { rank: 0, parts: 3 }, 0..32)]
#[case::last_part(RowRange::Part { rank: 2, parts: 3 }, 64..96)]
#[case::no_rows(RowRange::Rows(5..5), 5..5)]
fn a_row_range_holds_those_rows_and_reads_only_them(
    #[case] rows: RowRange,
    #[case] expected: std::ops::Range<usize>,
    #[values(1, 2)] threads: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = matrix_file(dir.path());
    // The same rows as the safetensors crate reads them from the file.
    let file = std::fs::read(&path).unwrap();
    let reference = safetensors::SafeTensors::deserialize(&file).unwrap();
    let w = reference.tensor("w").unwrap();
    let row_bytes = 40 * 2;
    let want = &w.data()[expected.start * row_bytes..expected.end * row_bytes];

    let policy = StagingPolicy::builder()
        .io_threads(threads)
        .build()
        .unwrap();
    let selection = Selection::names(["w"]).rows("w", rows.clone());
    let (loaded, report) = load_all(
        Loader::new()
            .backend(host())
            .policy(policy.clone())
            .select(selection.clone()),
        &path,
    );
    let (bytes, shape, got_rows) = &loaded["w"];
    assert_eq!(bytes.as_slice(), want);
    assert_eq!(shape, &[expected.len(), 40]);
    assert_eq!(got_rows.as_ref(), Some(&expected));
    assert_eq!(report.bytes_read, want.len() as u64);

    // Every read call of the same load lies inside those rows: the core's stager under a reader
    // that logs its calls.
    let checkpoint = Checkpoint::open(&path).unwrap().select(&selection).unwrap();
    let meta = checkpoint.tensor("w").unwrap().clone();
    let reader = FaultyReader::new(HostReader);
    let log = reader.log();
    let stager = Stager::new(
        checkpoint,
        reader,
        ScriptedAllocator::new(HostAllocator::new()),
        policy,
    )
    .unwrap();
    assert_eq!(stager.count(), 1);
    let (start, end) = (meta.offset, meta.offset + meta.len as u64);
    for call in log.calls() {
        assert!(
            call.offset >= start && call.offset + call.requested as u64 <= end,
            "a read at {} of {} bytes is outside rows {start}..{end}",
            call.offset,
            call.requested
        );
    }
    let read: usize = log.calls().iter().map(|c| c.requested).sum();
    assert_eq!(read, want.len());
}

#[test]
fn rows_of_higher_rank_tensors_and_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    let (loaded, _) = load_all(
        Loader::new()
            .backend(host())
            .select(Selection::names(["cube"]).rows("cube", RowRange::Rows(2..4))),
        &path,
    );
    assert_eq!(loaded["cube"].1, [2, 3, 5]);
    assert_eq!(loaded["cube"].0, contents["cube"][2 * 60..4 * 60]);

    for (name, rows, text) in [
        ("scalar", RowRange::Rows(0..1), "a scalar has no rows"),
        (
            "w",
            RowRange::Rows(90..97),
            "cannot read rows 90..97: they are not inside its 96 rows",
        ),
        (
            "w",
            RowRange::Part { rank: 3, parts: 3 },
            "cannot read part 3 of 3: they are not",
        ),
        (
            "ghost",
            RowRange::Rows(0..1),
            "\"ghost\" is not in the checkpoint",
        ),
    ] {
        let error = Loader::new()
            .backend(host())
            .select(Selection::all().rows(name, rows))
            .open(&path)
            .unwrap_err();
        assert!(error.to_string().contains(text), "{name}: {error}");
    }

    // Rows of sub-byte dtypes must be whole bytes: F4 [3, 8, 5] rows are 40 nibbles = 20 bytes,
    // F6 rows are 240 bits = 30 bytes; both cut; BOOL too.
    let every = dir.path().join("every.safetensors");
    let contents = write_file(&every, &every_dtype(), 3).unwrap();
    let (loaded, _) = load_all(
        Loader::new()
            .backend(host())
            .select(Selection::all().rows_where(|_| Some(RowRange::Rows(1..2)))),
        &every,
    );
    for (name, (bytes, shape, _)) in &loaded {
        let whole = &contents[name];
        let row = whole.len() / 3;
        assert_eq!(bytes.as_slice(), &whole[row..2 * row], "{name}");
        assert_eq!(shape, &[1, 8, 5], "{name}");
    }
    let odd = dir.path().join("odd.safetensors");
    write_file(&odd, &[TensorSpec::new("f4", Dtype::F4, &[4, 3])], 3).unwrap();
    let error = Loader::new()
        .backend(host())
        .select(Selection::all().rows("f4", RowRange::Rows(0..2)))
        .open(&odd)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("a row of 12 bits (F4) is not a whole number of bytes"),
        "{error}"
    );
}

/// Takes the tensor called `name` into a vector of the caller's, safely.
struct IntoVec<'a> {
    name: &'static str,
    target: &'a mut Vec<u8>,
}

impl Destination<HostMemory> for IntoVec<'_> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, HostMemory>>, DestinationError> {
        if tensor.name != self.name {
            return Ok(None);
        }
        self.target.resize(tensor.len, 0);
        Ok(Some(DeviceRegion::from_slice(self.target)))
    }
}

/// A destination for CUDA memory that declines everything.
struct CudaDeclines;

impl Destination<safetensors_staging::cufile::CudaMemory> for CudaDeclines {
    fn region(
        &mut self,
        _: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, safetensors_staging::cufile::CudaMemory>>, DestinationError>
    {
        Ok(None)
    }
}

#[test]
fn a_destination_of_the_backends_memory_takes_its_tensor_and_another_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    let mut mine = Vec::new();
    {
        let mut load = Loader::new()
            .backend(host())
            .destination(IntoVec {
                name: "w",
                target: &mut mine,
            })
            .open(&path)
            .unwrap();
        let paths: Vec<_> = load
            .by_ref()
            .map(|t| {
                let t = t.unwrap();
                (t.name().to_owned(), t.path())
            })
            .collect();
        assert_eq!(paths[0], ("w".to_owned(), StagingPath::Destination));
        assert!(paths[1..].iter().all(|(_, p)| *p == StagingPath::Device));
        assert_eq!(
            load.report().paths.destination.bytes,
            contents["w"].len() as u64
        );
    }
    assert_eq!(mine, contents["w"]);

    let error = Loader::new()
        .backend(host())
        .destination(CudaDeclines)
        .open(&path)
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::DestinationSpace {
                expected: "host",
                given: "cuda",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn taken_device_memory_is_the_callers_and_the_report_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    let mut load = Loader::new().backend(host()).open(&path).unwrap();
    let first = load.next().unwrap().unwrap();
    assert_eq!(first.name(), "w");
    let (meta, memory) = first.take_device().unwrap();
    assert_eq!(memory.len(), meta.len);
    assert_eq!(memory.space(), "host");
    assert_eq!(memory.host_bytes().unwrap(), contents["w"].as_slice());
    let rest: Vec<_> = load.by_ref().map(Result::unwrap).collect();
    // A host-path tensor has no device memory to take: it comes back.
    let report = load.report();
    assert_eq!(report.taken_device_bytes, meta.len as u64);
    assert!(
        report.peak_device_bytes >= (contents["norm"].len() + contents["cube"].len()) as u64,
        "the tensors the library kept"
    );
    drop((rest, memory));
}

#[test]
fn held_memory_outlives_the_load_and_reaches_zero_when_everything_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    // A cap under the headroom: every tensor takes the host path, through the staging buffer.
    for cap in [None, Some(1 << 20)] {
        let mut load = Loader::new()
            .backend(host())
            .memory_cap(cap)
            .open(&path)
            .unwrap();
        let held = load.held_memory();
        let mut tensors: Vec<_> = load.by_ref().map(Result::unwrap).collect();
        let total: u64 = contents.values().map(|b| b.len() as u64).sum();
        let taken = tensors.remove(0).take_device();
        let in_tensors = held.device_bytes() + held.host_bytes() + held.caller_bytes();
        assert!(in_tensors >= total, "{cap:?}: {in_tensors} < {total}");
        if cap.is_some() {
            assert_eq!(
                held.device_bytes(),
                0,
                "host path only: no device bytes kept"
            );
            assert!(
                taken.is_err(),
                "a host-path tensor has no device memory to take"
            );
        } else {
            assert_eq!(held.caller_bytes(), contents["w"].len() as u64);
        }
        drop(load);
        assert!(
            held.host_bytes() + held.device_bytes() > 0,
            "the tensors keep theirs"
        );
        drop((tensors, taken));
        assert_eq!(
            (held.device_bytes(), held.host_bytes(), held.caller_bytes()),
            (0, 0, 0),
            "{cap:?}"
        );
    }
}

#[test]
fn a_hub_cache_snapshot_loads_by_index_and_by_scan() {
    let cache = tempfile::tempdir().unwrap();
    let shards = vec![
        vec![
            TensorSpec::new("model.embed_tokens.weight", Dtype::BF16, &[512, 64]),
            TensorSpec::new("model.layers.0.mlp.up_proj.weight", Dtype::BF16, &[128, 64]),
        ],
        vec![TensorSpec::new("model.norm.weight", Dtype::F32, &[64])],
    ];
    let written = write_hub_cache(cache.path(), "org/model", "0123abcd", &shards, 4).unwrap();
    // Every file of the snapshot is a symlink into ../../blobs.
    for file in written.files.iter().chain([&written.index]) {
        let target = std::fs::read_link(file).unwrap();
        assert!(target.starts_with("../../blobs"), "{}", target.display());
    }
    let (loaded, report) = load_all(Loader::new().backend(host()), &written.dir);
    assert_eq!(report.files, 2);
    assert_eq!(loaded.len(), 3);
    for (name, (bytes, _, _)) in &loaded {
        assert_eq!(bytes, &written.contents[name], "{name}");
    }
    // Without the index, the directory scan finds the same shards.
    std::fs::remove_file(&written.index).unwrap();
    let (scanned, _) = load_all(Loader::new().backend(host()), &written.dir);
    assert_eq!(scanned, loaded);
}

#[test]
fn metadata_without_loading_includes_the_headers_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let header = br#"{"__metadata__":{"format":"pt","source":"test"},"w":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}}"#;
    backend_mock::fixtures::write_raw(&path, header.len() as u64, header, &[0; 8]).unwrap();
    let checkpoint = Checkpoint::open(&path).unwrap();
    let metadata = checkpoint.metadata().unwrap();
    assert_eq!(metadata.get("format").map(String::as_str), Some("pt"));
    assert_eq!(metadata.get("source").map(String::as_str), Some("test"));
    let w = checkpoint.tensor("w").unwrap();
    assert_eq!(
        (w.dtype, w.shape.as_slice(), w.len),
        (Dtype::F32, &[2, 1][..], 8)
    );
    assert_eq!(checkpoint.files()[0].metadata.as_ref(), Some(metadata));
    let (path, _) = matrix_file(dir.path());
    assert_eq!(Checkpoint::open(&path).unwrap().metadata(), None);
}

/// The reader the stager reads with, seen through `Reader`: the mode is an enum.
#[test]
fn the_host_readers_modes_are_named() {
    assert_eq!(HostReader.mode().as_str(), "posix");
    assert_eq!(
        staging_core::host::DirectHostReader::default()
            .mode()
            .as_str(),
        "direct"
    );
}

/// A load, its tensors and taken memory may move to another thread (a Python loader's worker, a
/// C++ engine's loading thread).
#[test]
fn loads_tensors_and_taken_memory_are_send() {
    fn send<T: Send>() {}
    send::<safetensors_staging::Load<'static>>();
    send::<safetensors_staging::Tensor>();
    send::<safetensors_staging::DeviceMemory>();
    send::<safetensors_staging::cuda::CudaTensorMemory>();
    send::<Loader<'static>>();
    send::<safetensors_staging::Prepared<'static>>();
}

/// One prepared backend opens load after load, and loads at once: each gets its bytes and a
/// report of its own, and all draw on one memory account (a tensor another load still holds
/// counts against the cap). A destination serves the load opened next, and only it.
#[test]
fn a_prepared_loader_serves_several_loads_on_one_memory_account() {
    let dir = tempfile::tempdir().unwrap();
    let specs = |prefix: &str| -> Vec<TensorSpec> {
        (0..4)
            .map(|i| TensorSpec::bytes(format!("{prefix}{i}"), 64 << 10))
            .collect()
    };
    let first = dir.path().join("first.safetensors");
    let second = dir.path().join("second.safetensors");
    let first_contents = write_file(&first, &specs("w"), 31).unwrap();
    let second_contents = write_file(&second, &specs("w"), 32).unwrap();
    let policy = StagingPolicy::builder()
        .headroom(0, u64::MAX)
        .build()
        .unwrap();
    let mut prepared = Loader::new()
        .backend(host())
        .policy(policy)
        .memory_cap(Some(336 << 10))
        .suballocate(false)
        .prepare()
        .unwrap();
    let drain = |load: safetensors_staging::Load<'_>, contents: &Contents| {
        let report_tensors = load.checkpoint().tensors().len();
        let mut kept = Vec::new();
        let mut load = load;
        for tensor in load.by_ref() {
            let tensor = tensor.unwrap();
            assert_eq!(tensor.to_vec().unwrap(), contents[tensor.name()]);
            kept.push(tensor);
        }
        let report = load.report();
        assert_eq!((report.tensors, report_tensors), (4, 4));
        assert_eq!(report.bytes_read, 4 * (64 << 10));
        (kept, report)
    };

    // The first load's 256 KiB stay held: of the second's four tensors only one fits the
    // 336 KiB on the device, the other three take the host path (through a staging buffer in
    // the 16 KiB left).
    let (held, report) = drain(prepared.open(&first).unwrap(), &first_contents);
    assert_eq!(report.paths.device.tensors, 4);
    let (_, report) = drain(prepared.open(&second).unwrap(), &second_contents);
    assert_eq!(
        (report.paths.device.tensors, report.paths.host.tensors),
        (1, 3),
        "the loads of one prepared backend do not share its memory account"
    );
    // Once they are dropped, a third load has the whole cap again.
    drop(held);
    let (_, report) = drain(prepared.open(&second).unwrap(), &second_contents);
    assert_eq!(report.paths.device.tensors, 4);

    // A destination serves the next load only.
    let mut mine = Vec::new();
    {
        let mut prepared = Loader::new().backend(host()).prepare().unwrap();
        prepared.destination(IntoVec {
            name: "w1",
            target: &mut mine,
        });
        let paths = |load: safetensors_staging::Load<'_>| -> Vec<StagingPath> {
            load.map(|t| t.unwrap().path()).collect()
        };
        assert_eq!(
            paths(prepared.open(&first).unwrap())[1],
            StagingPath::Destination
        );
        assert!(
            paths(prepared.open(&second).unwrap())
                .iter()
                .all(|p| *p == StagingPath::Device),
            "a destination served a second load"
        );
    }
    assert_eq!(mine, first_contents["w1"]);
}

/// A reader asking for tensors one at a time (what Python's `safe_open` does): one small load
/// per tensor on one prepared backend, its file kept open, no block carved for one tensor, a
/// report adding every load up, the file kept open read after a new one is renamed over it,
/// and the new file refused once the old is closed.
#[test]
fn tensor_by_tensor_on_a_prepared_backend() {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents) = matrix_file(dir.path());
    let mut prepared = Loader::new().backend(host()).prepare().unwrap();
    prepared.keep_files_open();
    let checkpoint = prepared.read_headers(&[&path]).unwrap();
    assert_eq!(
        prepared.files_open(),
        0,
        "reading headers opens nothing for loads"
    );

    let mut total: Option<safetensors_staging::LoadReport> = None;
    let mut kept = Vec::new();
    for name in ["norm", "w", "scalar", "cube", "norm"] {
        let mut load = prepared
            .open_checkpoint(checkpoint.only(name, None).unwrap())
            .unwrap();
        let tensor = load.next().unwrap().unwrap();
        assert!(load.next().is_none(), "one tensor per load");
        assert_eq!(tensor.to_vec().unwrap(), contents[name], "{name}");
        assert_eq!(
            prepared.files_open(),
            1,
            "the file is opened once, for every load"
        );
        // A small tensor alone is not carved from a 32 MiB block: it holds its own bytes.
        assert_eq!(
            load.held_memory().device_bytes(),
            tensor.len() as u64,
            "{name}"
        );
        let report = load.report();
        match &mut total {
            Some(total) => total.absorb(&report),
            None => total = Some(report),
        }
        kept.push(tensor);
    }
    let total = total.unwrap();
    let bytes: u64 = ["norm", "w", "scalar", "cube", "norm"]
        .iter()
        .map(|n| contents[*n].len() as u64)
        .sum();
    assert_eq!(
        (total.tensors, total.bytes, total.bytes_read),
        (5, bytes, bytes)
    );
    assert_eq!(total.paths.device.tensors, 5);

    // Rows of dimension 0: only their bytes are read.
    let mut load = prepared
        .open_checkpoint(checkpoint.only("w", Some(&RowRange::Rows(10..13))).unwrap())
        .unwrap();
    let rows = load.next().unwrap().unwrap();
    let row = 40 * 2;
    assert_eq!(rows.to_vec().unwrap(), contents["w"][10 * row..13 * row]);
    assert_eq!(load.report().bytes_read, 3 * row as u64);
    assert!(matches!(
        checkpoint.only("missing", None),
        Err(staging_core::Error::UnknownTensor { .. })
    ));
    assert!(
        checkpoint
            .only("scalar", Some(&RowRange::Rows(0..1)))
            .is_err()
    );

    // Renamed over since its header was read: the file kept open is the one read, whole, as
    // `safetensors` keeps reading the file it opened; never the new file's bytes.
    let replacement = dir.path().join("replacement");
    let specs = [TensorSpec::new("norm", Dtype::F32, &[40])];
    write_file(&replacement, &specs, 99).unwrap();
    std::fs::rename(&replacement, &path).unwrap();
    let served = prepared
        .open_checkpoint(checkpoint.only("norm", None).unwrap())
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(served.to_vec().unwrap(), contents["norm"]);
    // Once closed, the path names the new file: refused, not read.
    prepared.close_files();
    assert_eq!(prepared.files_open(), 0);
    let refused = prepared
        .open_checkpoint(checkpoint.only("norm", None).unwrap())
        .unwrap()
        .next()
        .unwrap();
    assert!(
        matches!(
            refused,
            Err(Error::Load(staging_core::Error::FileChanged { .. }))
        ),
        "{refused:?}"
    );
    prepared.close_files();
    assert_eq!(prepared.files_open(), 0);
}
