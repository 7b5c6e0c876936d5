//! `Loader::load_into`: a checkpoint read into memory that already holds its tensors, checked
//! whole before the first byte is written.

use std::collections::BTreeMap;

use backend_mock::fixtures::{TensorSpec, write_sharded};
use safetensors_staging::{
    Backend, Device, DeviceRegion, Dtype, Error, HostOptions, Loader, RowRange, Selection, Target,
};
use staging_core::HostMemory;

fn cpu() -> Loader<'static> {
    Loader::new()
        .device(Device::Cpu)
        .backend(Backend::Host(HostOptions::default()))
}

fn shards(dir: &std::path::Path) -> backend_mock::fixtures::ShardedFixture {
    write_sharded(
        dir,
        &[
            vec![
                TensorSpec::new("a", Dtype::F32, &[64, 100]),
                TensorSpec::new("b", Dtype::F16, &[300]),
            ],
            vec![TensorSpec::new("c", Dtype::BF16, &[8, 8])],
        ],
        5,
    )
    .unwrap()
}

#[test]
fn every_target_gets_its_tensor_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = shards(dir.path());
    let mut memory: BTreeMap<&str, Vec<u8>> = [("a", 64 * 100 * 4), ("b", 600), ("c", 128)]
        .into_iter()
        .map(|(n, len)| (n, vec![0u8; len]))
        .collect();
    let addresses: BTreeMap<&str, usize> = memory
        .iter()
        .map(|(n, m)| (*n, m.as_ptr() as usize))
        .collect();
    let targets: BTreeMap<String, Target<'_, HostMemory>> = memory
        .iter_mut()
        .map(|(name, m)| ((*name).to_owned(), Target::new(DeviceRegion::from_slice(m))))
        .collect();
    let done = cpu().load_into(dir.path(), targets, true).unwrap();
    assert!(done.missing.is_empty() && done.unexpected.is_empty());
    for (name, bytes) in &memory {
        assert_eq!(bytes, &fixture.contents[*name], "{name}");
        assert_eq!(bytes.as_ptr() as usize, addresses[name]);
    }
    // Straight into the targets: the destination path only, each byte read once.
    assert_eq!(done.report.paths.destination.tensors, 3);
    assert_eq!(done.report.paths.destination.bytes, done.report.bytes);
    assert_eq!(done.report.bytes_read, done.report.bytes);
    assert_eq!(done.report.peak_host_bytes, 0);
}

#[test]
fn a_mismatch_writes_nothing_and_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    shards(dir.path());
    let mut a = vec![0u8; 64 * 100 * 4];
    let mut b = vec![0u8; 601];
    let mut c = vec![0u8; 128];
    let mut z = vec![0u8; 4];
    let targets = BTreeMap::from([
        (
            "a".to_owned(),
            Target::new(DeviceRegion::from_slice(&mut a)).shape([100, 64]),
        ),
        (
            "b".to_owned(),
            Target::new(DeviceRegion::from_slice(&mut b)),
        ),
        (
            "c".to_owned(),
            Target::new(DeviceRegion::from_slice(&mut c)).dtype(Dtype::F16),
        ),
        (
            "z".to_owned(),
            Target::<HostMemory>::new(DeviceRegion::from_slice(&mut z)),
        ),
    ]);
    let error = cpu().load_into(dir.path(), targets, true).unwrap_err();
    let Error::Mismatch { problems } = &error else {
        panic!("{error}");
    };
    assert_eq!(
        problems,
        &[
            "z: missing from the checkpoint",
            "a: shape [64, 100] in the checkpoint, [100, 64] in the target",
            "b: 600 bytes in the checkpoint, 601 in the target",
            "c: dtype BF16 in the checkpoint, F16 in the target",
        ]
    );
    assert!(error.to_string().contains("nothing was written"), "{error}");
    assert!([&a, &b, &c, &z].iter().all(|m| m.iter().all(|&x| x == 0)));
}

#[test]
fn not_strict_loads_what_both_have_and_rows_narrow_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = shards(dir.path());
    // A rank's part: rows 16..32 of a, and a tensor the checkpoint lacks.
    let mut a = vec![0u8; 16 * 100 * 4];
    let mut y = vec![7u8; 4];
    let targets = BTreeMap::from([
        (
            "a".to_owned(),
            Target::new(DeviceRegion::from_slice(&mut a)).shape([16, 100]),
        ),
        (
            "y".to_owned(),
            Target::<HostMemory>::new(DeviceRegion::from_slice(&mut y)),
        ),
    ]);
    let done = cpu()
        .select(Selection::all().rows("a", RowRange::Part { rank: 1, parts: 4 }))
        .load_into(dir.path(), targets, false)
        .unwrap();
    assert_eq!(done.missing, ["y"]);
    assert_eq!(done.unexpected, ["b", "c"]);
    assert_eq!(a, fixture.contents["a"][16 * 400..32 * 400]);
    assert_eq!(y, [7; 4]);
    assert_eq!(done.report.bytes_read, 16 * 400);
}
