//! Property tests of checkpoint parsing on mutated inputs (bit flips, truncation, huge numbers,
//! odd UTF-8) in headers and indexes: the result is an error or a valid checkpoint, never a
//! panic, and no allocation made while opening is sized from an untrusted number (every one is
//! bounded by the size of the files actually read).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;

use backend_mock::fixtures::{TensorSpec, header_for, write_index};
use proptest::prelude::*;
use staging_core::{Checkpoint, Dtype};

/// Records the largest single allocation made while `TRACKING` is set, on that thread only: the
/// other tests of this binary allocate at the same time on theirs. (Opening a checkpoint runs on
/// the calling thread.)
struct Counting;

thread_local! {
    /// Whether this thread is opening a checkpoint under watch.
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    /// The largest allocation this thread made while `TRACKING`.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Notes an allocation of `size` bytes. Const-initialized thread locals without a destructor
/// allocate nothing and stay readable while the thread exits; `try_with` never panics anyway.
fn record(size: usize) {
    let _ = TRACKING.try_with(|tracking| {
        if tracking.get() {
            let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same pointer and layout the caller got from `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: as in `alloc`/`dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn valid_file() -> Vec<u8> {
    let specs = [
        TensorSpec::new("a", Dtype::F32, &[3, 4]),
        TensorSpec::new("b.bias", Dtype::BF16, &[7]),
        TensorSpec::bytes("c", 5),
    ];
    let header = header_for(&specs).unwrap();
    let data_len: usize = specs.iter().map(TensorSpec::byte_len).sum();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend((0..data_len).map(|i| i as u8));
    bytes
}

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(usize),
    Truncate(usize),
    HeaderLength(u64),
    OddUtf8(usize, u8),
    HugeNumber(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::FlipBit),
        any::<usize>().prop_map(Mutation::Truncate),
        prop_oneof![
            any::<u64>(),
            Just(u64::MAX),
            Just(100_000_000),
            Just(99_999_999),
            0u64..200
        ]
        .prop_map(Mutation::HeaderLength),
        (
            any::<usize>(),
            prop_oneof![Just(0xffu8), Just(0xc3), Just(0x80), Just(0xed), Just(0)]
        )
            .prop_map(|(i, b)| Mutation::OddUtf8(i, b)),
        any::<usize>().prop_map(Mutation::HugeNumber),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    match *m {
        Mutation::FlipBit(i) => {
            if !bytes.is_empty() {
                let i = i % (bytes.len() * 8);
                bytes[i / 8] ^= 1 << (i % 8);
            }
        }
        Mutation::Truncate(n) => bytes.truncate(n % (bytes.len() + 1)),
        Mutation::HeaderLength(n) => bytes[..8].copy_from_slice(&n.to_le_bytes()),
        Mutation::OddUtf8(i, b) => {
            if header_end > 8 {
                bytes[8 + i % (header_end - 8)] = b;
            }
        }
        Mutation::HugeNumber(i) => {
            // Replace the i-th number in the header with a huge one (same or longer length).
            let text = String::from_utf8_lossy(&bytes[8..header_end]).into_owned();
            let numbers: Vec<(usize, usize)> = text
                .char_indices()
                .filter(|(_, c)| c.is_ascii_digit())
                .fold(Vec::new(), |mut runs: Vec<(usize, usize)>, (at, _)| {
                    match runs.last_mut() {
                        Some((start, len)) if *start + *len == at => *len += 1,
                        _ => runs.push((at, 1)),
                    }
                    runs
                });
            if let Some(&(start, len)) = numbers.get(i % numbers.len().max(1)) {
                let mut new = text.clone();
                new.replace_range(start..start + len, "18446744073709551615");
                let mut out = (new.len() as u64).to_le_bytes().to_vec();
                out.extend_from_slice(new.as_bytes());
                out.extend_from_slice(&bytes[header_end..]);
                *bytes = out;
            }
        }
    }
}

fn open_checked(
    dir: &std::path::Path,
    total_file_bytes: usize,
) -> Result<Checkpoint, staging_core::Error> {
    LARGEST.set(0);
    TRACKING.set(true);
    let result = Checkpoint::open(dir);
    TRACKING.set(false);
    let largest = LARGEST.get();
    // Parsing may build structures a few times the size of what it read, never more.
    let bound = 16 * total_file_bytes + (1 << 20);
    assert!(
        largest <= bound,
        "an allocation of {largest} bytes while opening {total_file_bytes} bytes of files"
    );
    if let Ok(c) = &result {
        for t in c.tensors() {
            let file = c.files()[t.file_index].size;
            assert!(
                t.offset + t.len as u64 <= file,
                "{} runs past its file",
                t.name
            );
        }
    }
    result
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_headers_give_an_error_or_a_valid_checkpoint(mutations in proptest::collection::vec(mutation(), 1..4)) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = valid_file();
        for m in &mutations {
            let header_fits = bytes.len() >= 8
                && u64::from_le_bytes(bytes[..8].try_into().unwrap())
                    .checked_add(8)
                    .is_some_and(|end| end <= bytes.len() as u64);
            if header_fits {
                apply(&mut bytes, m);
            } else if let Mutation::Truncate(n) = m {
                bytes.truncate(n % (bytes.len() + 1));
            }
        }
        std::fs::write(dir.path().join("model.safetensors"), &bytes).unwrap();
        let _ = open_checked(dir.path(), bytes.len());
    }

    #[test]
    fn mutated_indexes_give_an_error_or_a_valid_checkpoint(
        flips in proptest::collection::vec(any::<usize>(), 0..4),
        cut in proptest::option::of(any::<usize>()),
        odd in proptest::option::of((any::<usize>(), prop_oneof![Just(0xffu8), Just(b'.'), Just(b'/'), Just(0)])),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let shard = valid_file();
        std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), &shard).unwrap();
        let map: BTreeMap<String, String> = ["a", "b.bias", "c"].iter().map(|t| (t.to_string(), "model-00001-of-00001.safetensors".to_string())).collect();
        let index_path = dir.path().join("model.safetensors.index.json");
        write_index(&index_path, &map, 1 << 62).unwrap();
        let mut index = std::fs::read(&index_path).unwrap();
        for f in flips {
            let i = f % (index.len() * 8);
            index[i / 8] ^= 1 << (i % 8);
        }
        if let Some((at, byte)) = odd {
            let i = at % index.len();
            index[i] = byte;
        }
        // (the index is never empty before the cut: write_index wrote JSON)
        if let Some(n) = cut {
            index.truncate(n % (index.len() + 1));
        }
        std::fs::write(&index_path, &index).unwrap();
        let _ = open_checked(dir.path(), index.len() + shard.len());
    }
}

#[test]
fn an_unmutated_file_opens() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = valid_file();
    std::fs::write(dir.path().join("model.safetensors"), &bytes).unwrap();
    assert_eq!(
        open_checked(dir.path(), bytes.len())
            .unwrap()
            .tensors()
            .len(),
        3
    );
}

#[test]
fn a_header_length_far_beyond_the_file_allocates_nothing_of_that_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = valid_file();
    bytes[..8].copy_from_slice(&99_999_999u64.to_le_bytes());
    std::fs::write(dir.path().join("model.safetensors"), &bytes).unwrap();
    let error = open_checked(dir.path(), bytes.len()).unwrap_err();
    assert!(error.to_string().contains("runs past the end"), "{error}");
}
