//! Host tensors from local files as private mappings of their files (`map`): which loads map,
//! the bytes, the report, copy-on-write writes that never reach the file, mappings outliving
//! the load, and files that change under a mapping (an error naming the file, never a fault).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::path::Path;

use backend_mock::fixtures::{ShardedFixture, TensorSpec, write_sharded};
use safetensors_staging::{
    Backend, Device, Error, HostOptions, Loader, MapFiles, RowRange, StagingPath, Tensor,
};
use staging_core::{DestinationError, DeviceRegion, Dtype, HostMemory, TensorMeta};

fn fixture(dir: &Path) -> ShardedFixture {
    let shards = vec![
        vec![
            TensorSpec::new("one.a", Dtype::F32, &[5000]),
            TensorSpec::bytes("one.b", 30000),
            TensorSpec::bytes("one.empty", 0),
        ],
        vec![
            TensorSpec::new("two.a", Dtype::F16, &[64, 700]),
            TensorSpec::bytes("two.b", 9000),
        ],
    ];
    write_sharded(dir, &shards, 21).unwrap()
}

fn load(loader: Loader<'_>, dir: &Path) -> (Vec<Tensor>, safetensors_staging::LoadReport) {
    let mut load = loader.open(dir).unwrap();
    let tensors: Vec<Tensor> = load.by_ref().collect::<Result<_, _>>().unwrap();
    (tensors, load.report())
}

fn map(map: MapFiles) -> Backend {
    Backend::Host(HostOptions::default().map(map))
}

/// A loader for host memory that maps as the doors do by default (`map=auto`).
fn cpu() -> Loader<'static> {
    Loader::new()
        .device(Device::Cpu)
        .backend(map(MapFiles::Auto))
}

#[test]
fn device_cpu_maps_every_tensor_with_its_bytes_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let (tensors, report) = load(cpu(), dir.path());
    assert_eq!(tensors.len(), 5);
    for tensor in &tensors {
        assert_eq!(tensor.path(), StagingPath::Mapped, "{}", tensor.name());
        assert_eq!(tensor.space(), "host");
        assert_eq!(tensor.device_ptr(), None);
        assert_eq!(
            tensor.host_bytes().unwrap(),
            &fixture.contents[tensor.name()][..],
            "{}",
            tensor.name()
        );
        let mut copy = vec![0u8; tensor.len()];
        tensor.copy_to_host(&mut copy).unwrap();
        assert_eq!(copy, fixture.contents[tensor.name()]);
    }
    let bytes: u64 = fixture.contents.values().map(|v| v.len() as u64).sum();
    assert_eq!(report.mode.as_str(), "mmap");
    assert_eq!(report.paths.mapped.tensors, 5);
    assert_eq!(report.paths.mapped.bytes, bytes);
    assert_eq!(report.paths.device.tensors + report.paths.host.tensors, 0);
    assert_eq!(report.peak_host_bytes, 0);
    assert_eq!(report.bytes, bytes);
    // Every tensor with bytes taken from its file once (one read request each).
    assert_eq!(report.bytes_read, bytes);
    assert_eq!(report.read_requests, 4);
}

#[test]
fn which_loads_map() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let path_of = |loader: Loader<'_>| {
        let (tensors, _) = load(loader, dir.path());
        tensors[0].path()
    };
    // A Rust loader maps only when asked (safe Rust cannot rule out a file changing under a
    // mapping); the doors' options ask (below).
    assert_eq!(
        path_of(Loader::new().device(Device::Cpu)),
        StagingPath::Device
    );
    // The host backend standing for a device (device auto on a machine without a GPU), or a
    // cap making the host a device of that size: its own memory, as before.
    assert_eq!(
        path_of(Loader::new().backend(map(MapFiles::Auto))),
        StagingPath::Device
    );
    assert_eq!(
        path_of(cpu().memory_cap(Some(1 << 30))),
        StagingPath::Device
    );
    assert_eq!(
        path_of(
            Loader::new()
                .device(Device::Cpu)
                .backend(map(MapFiles::Never))
        ),
        StagingPath::Device
    );
    assert_eq!(
        path_of(Loader::new().backend(map(MapFiles::Always))),
        StagingPath::Mapped
    );
    // O_DIRECT reads were asked for: no mapping.
    assert_eq!(
        path_of(Loader::new().device(Device::Cpu).backend(Backend::Host(
            HostOptions::default().direct_io(true).map(MapFiles::Auto)
        ))),
        StagingPath::Device
    );
    // The same through the options every door spells.
    let mut options = safetensors_staging::LoadOptions::new();
    options.set("device", "cpu").unwrap();
    assert_eq!(path_of(options.loader().unwrap()), StagingPath::Mapped);
    options.set("map", "false").unwrap();
    assert_eq!(path_of(options.loader().unwrap()), StagingPath::Device);
    options.set("map", "auto").unwrap();
    assert_eq!(path_of(options.loader().unwrap()), StagingPath::Mapped);
    assert!(options.set("map", "sometimes").is_err());
}

/// Takes `one.b` into a vector of the caller's.
struct IntoVec<'a>(&'a mut Vec<u8>);

impl staging_core::Destination<HostMemory> for IntoVec<'_> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> Result<Option<DeviceRegion<'_, HostMemory>>, DestinationError> {
        if tensor.name != "one.b" {
            return Ok(None);
        }
        self.0.resize(tensor.len, 0);
        Ok(Some(DeviceRegion::from_slice(self.0)))
    }
}

#[test]
fn a_destination_is_preferred_to_a_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let mut mine = Vec::new();
    {
        let (tensors, report) = load(cpu().destination(IntoVec(&mut mine)), dir.path());
        let b = tensors.iter().find(|t| t.name() == "one.b").unwrap();
        assert_eq!(b.path(), StagingPath::Destination);
        assert_eq!(report.paths.destination.tensors, 1);
        // The tensors the destination declines are mappings, as without one.
        assert_eq!(report.paths.mapped.tensors, 4);
        for tensor in tensors.iter().filter(|t| t.name() != "one.b") {
            assert_eq!(tensor.path(), StagingPath::Mapped);
            assert_eq!(
                tensor.host_bytes().unwrap(),
                &fixture.contents[tensor.name()][..]
            );
        }
    }
    // Copied out of the mapping into the caller's memory.
    assert_eq!(mine, fixture.contents["one.b"]);
}

#[test]
fn writes_to_a_mapped_tensor_stay_in_it_and_never_reach_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let before: Vec<Vec<u8>> = fixture
        .files
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    let (tensors, _) = load(cpu(), dir.path());
    let a = tensors.iter().find(|t| t.name() == "one.a").unwrap();
    let ptr = a.host_mut_ptr().unwrap();
    // SAFETY: `ptr` is the first of `a`'s `len` bytes, writable (copy-on-write), and no slice
    // of them is alive across the write.
    unsafe { std::ptr::write_bytes(ptr, 0xAB, a.len()) };
    assert!(a.host_bytes().unwrap().iter().all(|&b| b == 0xAB));
    // Its neighbour, in the same mapping, is untouched; so is the file, and a second load.
    let b = tensors.iter().find(|t| t.name() == "one.b").unwrap();
    assert_eq!(b.host_bytes().unwrap(), &fixture.contents["one.b"][..]);
    for (file, bytes) in fixture.files.iter().zip(&before) {
        assert_eq!(&std::fs::read(file).unwrap(), bytes);
    }
    let (again, _) = load(cpu(), dir.path());
    let a2 = again.iter().find(|t| t.name() == "one.a").unwrap();
    assert_eq!(a2.host_bytes().unwrap(), &fixture.contents["one.a"][..]);
}

#[test]
fn tensors_keep_their_mapping_after_the_load_and_the_files_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let (tensors, _) = load(cpu(), dir.path());
    drop(dir);
    for tensor in &tensors {
        assert_eq!(
            tensor.host_bytes().unwrap(),
            &fixture.contents[tensor.name()][..]
        );
    }
    let (meta, bytes) = tensors
        .into_iter()
        .find(|t| t.name() == "two.a")
        .unwrap()
        .into_mapped()
        .unwrap();
    assert_eq!(&bytes[..], &fixture.contents[&meta.name][..]);
    assert_eq!(bytes.len(), meta.len);
}

#[test]
fn row_ranges_and_selections_map_just_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let selection = staging_core::Selection::names(["two.a"])
        .rows("two.a", staging_core::RowRange::Rows(10..20));
    let (tensors, report) = load(cpu().select(selection), dir.path());
    assert_eq!(tensors.len(), 1);
    let row = 700 * 2;
    assert_eq!(
        tensors[0].host_bytes().unwrap(),
        &fixture.contents["two.a"][10 * row..20 * row]
    );
    assert_eq!(tensors[0].meta().shape, vec![10, 700]);
    assert_eq!(report.bytes, 10 * row as u64);
}

/// Replaces `path` by a copy of itself: same size, same bytes, another file (inode).
fn replace_with_a_copy(path: &Path) {
    let copy = path.with_extension("copy");
    std::fs::copy(path, &copy).unwrap();
    std::fs::rename(&copy, path).unwrap();
}

#[test]
fn a_file_replaced_after_its_header_was_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let loader = cpu();
    let checkpoint = loader.read_headers(&[dir.path()]).unwrap();
    let first = &fixture.files[0];
    replace_with_a_copy(first);
    // The first file is mapped (and checked) when the load opens: nothing is handed out.
    let error = loader
        .prepare()
        .unwrap()
        .open_checkpoint(checkpoint)
        .unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Load(staging_core::Error::FileChanged { file, .. }) if file == first
        ),
        "{error}"
    );
}

#[test]
fn a_later_file_replaced_after_its_header_was_read_is_refused_when_the_load_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let loader = cpu();
    let checkpoint = loader.read_headers(&[dir.path()]).unwrap();
    let second = &fixture.files[1];
    replace_with_a_copy(second);
    // Files are mapped as the load reaches them (one mapping at a time, whatever their
    // number): the first file's tensors are handed out, exact, then the second is refused.
    let mut load = loader
        .prepare()
        .unwrap()
        .open_checkpoint(checkpoint)
        .unwrap();
    let mut names = Vec::new();
    let error = loop {
        match load.next() {
            Some(Ok(tensor)) => {
                assert_eq!(
                    tensor.host_bytes().unwrap(),
                    &fixture.contents[tensor.name()][..]
                );
                names.push(tensor.name().to_owned());
            }
            Some(Err(error)) => break error,
            None => panic!("the replaced file loaded"),
        }
    };
    assert!(
        !names.is_empty() && names.iter().all(|n| n.starts_with("one.")),
        "{names:?}"
    );
    assert!(
        matches!(
            &error,
            Error::Load(staging_core::Error::FileChanged { file, .. }) if file == second
        ),
        "{error}"
    );
    assert!(load.next().is_none());
}

#[test]
fn a_file_cut_short_under_its_mapping_is_an_error_naming_the_file_not_a_fault() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let mut load = cpu().open(dir.path()).unwrap();
    // The first tensor maps the first file; then the file loses its last tensor's bytes (and
    // the page cache with them).
    let first = load.next().unwrap().unwrap();
    assert_eq!(first.name(), "one.a");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&fixture.files[0])
        .unwrap();
    let size = file.metadata().unwrap().len();
    file.set_len(size - 20000).unwrap();
    // Found by the file's size before a page of it is touched: the file changed during the
    // load, as a load that reads says it.
    let error = load.next().unwrap().unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Load(staging_core::Error::FileChanged { file, detail })
                if file == &fixture.files[0] && detail.starts_with("changed size")
        ),
        "{error}"
    );
    assert!(load.next().is_none());
    // What was handed out before is still whole.
    assert_eq!(first.host_bytes().unwrap(), &fixture.contents["one.a"][..]);
}

#[test]
fn a_reader_maps_each_file_once_and_lets_go_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let loader = cpu();
    let checkpoint = loader.read_headers(&[dir.path()]).unwrap();
    let mut prepared = loader.prepare().unwrap();
    prepared.keep_files_open();
    for name in ["one.a", "one.b", "two.b"] {
        let only = checkpoint.only(name, None).unwrap();
        let tensor = prepared
            .open_checkpoint(only)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(tensor.path(), StagingPath::Mapped);
        assert_eq!(tensor.host_bytes().unwrap(), &fixture.contents[name][..]);
    }
    assert_eq!(prepared.files_open(), 2);
    prepared.close_files();
    assert_eq!(prepared.files_open(), 0);
}

#[test]
fn columns_are_read_alone_out_of_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let loader = cpu();
    let checkpoint = loader.read_headers(&[dir.path()]).unwrap();
    let mut prepared = loader.prepare().unwrap();
    // two.a is F16 [64, 700]: a row is 1400 bytes; columns 100..300 are bytes 200..600 of it.
    let rows = checkpoint
        .only("two.a", Some(&RowRange::Rows(3..40)))
        .unwrap();
    let (tensor, report) = prepared.read_columns(&rows, 100..300).unwrap().unwrap();
    let whole = &fixture.contents["two.a"];
    let want: Vec<u8> = (3..40)
        .flat_map(|r| whole[r * 1400 + 200..r * 1400 + 600].iter().copied())
        .collect();
    assert_eq!(tensor.host_bytes().unwrap(), &want[..]);
    assert_eq!(tensor.meta().shape, vec![37, 200]);
    assert_eq!(tensor.len(), want.len());
    assert_eq!(tensor.path(), StagingPath::Host);
    // Only the columns were read, into memory of their own.
    assert_eq!(report.bytes_read, want.len() as u64);
    assert_eq!(report.paths.host.bytes, want.len() as u64);
    assert_eq!(report.paths.mapped.tensors, 0);
    assert_eq!(report.mode.as_str(), "mmap");
    // No columns: an empty tensor, nothing read.
    let (empty, report) = prepared.read_columns(&rows, 5..5).unwrap().unwrap();
    assert_eq!((empty.len(), empty.meta().shape.clone()), (0, vec![37, 0]));
    assert_eq!(report.bytes_read, 0);
    // Columns past dimension 1 are an error, not a read; a tensor of one dimension has none.
    let all = checkpoint.only("two.a", None).unwrap();
    assert!(prepared.read_columns(&all, 600..701).is_err());
    let one = checkpoint.only("one.a", None).unwrap();
    assert!(prepared.read_columns(&one, 0..10).unwrap().is_none());
    // A loader that reads into memory of its own (as on a GPU) does not read columns alone:
    // the caller reads the rows.
    let mut reads = Loader::new()
        .device(Device::Cpu)
        .backend(map(MapFiles::Never))
        .prepare()
        .unwrap();
    assert!(reads.read_columns(&rows, 100..300).unwrap().is_none());
}

#[test]
fn columns_of_a_file_cut_short_are_an_error_naming_it_not_a_fault() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let loader = cpu();
    let checkpoint = loader.read_headers(&[dir.path()]).unwrap();
    let mut prepared = loader.prepare().unwrap();
    prepared.keep_files_open();
    let all = checkpoint.only("two.a", None).unwrap();
    // Mapped (and kept), then the file loses two.b and the last rows of two.a.
    let (first, _) = prepared.read_columns(&all, 0..350).unwrap().unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&fixture.files[1])
        .unwrap();
    let size = file.metadata().unwrap().len();
    file.set_len(size - 9000 - 14000).unwrap();
    let error = prepared.read_columns(&all, 350..700).unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Load(staging_core::Error::Truncated { tensor, file, .. })
                if tensor == "two.a" && file == &fixture.files[1]
        ) || matches!(
            &error,
            Error::Load(staging_core::Error::FileChanged { file, .. }) if file == &fixture.files[1]
        ),
        "{error}"
    );
    // What was read before is still whole: memory of its own.
    let whole = &fixture.contents["two.a"];
    let want: Vec<u8> = (0..64)
        .flat_map(|r| whole[r * 1400..r * 1400 + 700].iter().copied())
        .collect();
    assert_eq!(first.host_bytes().unwrap(), &want[..]);
}
