//! [`Loader::load_into`]: a checkpoint read into memory that already holds its tensors (a
//! model's weights reloaded in place), checked whole before the first byte is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use staging_core::{
    DestinationError, DeviceRegion, Dtype, LoadReport, MemorySpace, RawDestination, TensorMeta,
};

use crate::error::{Error, Result};
use crate::loader::Loader;
use crate::space::KnownSpace;

/// The memory one tensor of a reload goes into, and what it holds: the bytes are checked
/// against the checkpoint's tensor (its length always; its dtype and shape when given) before
/// anything is written.
#[derive(Debug)]
pub struct Target<'a, S: MemorySpace> {
    region: DeviceRegion<'a, S>,
    dtype: Option<Dtype>,
    shape: Option<Vec<usize>>,
}

impl<'a, S: MemorySpace> Target<'a, S> {
    /// The tensor's memory; the checkpoint's tensor must have exactly `region.len()` bytes.
    pub fn new(region: DeviceRegion<'a, S>) -> Self {
        Self {
            region,
            dtype: None,
            shape: None,
        }
    }

    /// The dtype the tensor in memory has: the checkpoint's must be the same.
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// The shape the tensor in memory has: the checkpoint's (narrowed to the loader's rows)
    /// must be the same.
    pub fn shape(mut self, shape: impl Into<Vec<usize>>) -> Self {
        self.shape = Some(shape.into());
        self
    }
}

/// A target of [`Loader::load_into_raw`]: the address and length of its memory, in the space
/// the backend loads into, and what it holds (checked as [`Target`]'s).
#[derive(Debug, Clone)]
pub struct RawTarget {
    /// The first byte's address.
    pub addr: usize,
    /// Bytes: the checkpoint's tensor must have exactly this many.
    pub len: usize,
    /// The dtype the tensor in memory has, if it is to be checked.
    pub dtype: Option<Dtype>,
    /// The shape the tensor in memory has, if it is to be checked.
    pub shape: Option<Vec<usize>>,
}

/// What a target must be to take a tensor, whatever its memory.
struct Expected {
    len: usize,
    dtype: Option<Dtype>,
    shape: Option<Vec<usize>>,
}

/// What [`Loader::load_into`] did.
#[derive(Debug, Clone)]
pub struct LoadedInto {
    /// Targets the checkpoint has no tensor for (left as they were).
    pub missing: Vec<String>,
    /// Tensors of the checkpoint no target was given for (not read).
    pub unexpected: Vec<String>,
    /// Targets written, in the order they were (every target the checkpoint has, unless the
    /// loader's selection left some out).
    pub written: Vec<String>,
    /// The load's report.
    pub report: LoadReport,
}

/// The destination of a reload: each target's memory, once; the names whose memory was handed
/// to the load, in order. Each tensor is checked again as the load reaches it (the checkpoint
/// may have been replaced since it was checked).
struct IntoTargets<'a, S: MemorySpace> {
    targets: BTreeMap<String, (DeviceRegion<'a, S>, Expected)>,
    started: Arc<Mutex<Vec<String>>>,
}

impl<S: MemorySpace> staging_core::Destination<S> for IntoTargets<'_, S> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
    ) -> std::result::Result<Option<DeviceRegion<'_, S>>, DestinationError> {
        let Some((region, expected)) = self.targets.get_mut(&tensor.name) else {
            return Ok(None);
        };
        if let Some(problem) = mismatch(tensor, expected) {
            return Err(format!("the checkpoint changed since it was checked: {problem}").into());
        }
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tensor.name.clone());
        let len = region.len();
        Ok(region.slice(0, len))
    }

    fn unwritten(&mut self, tensor: &TensorMeta) {
        forget(&self.started, &tensor.name);
    }
}

/// `name` holds what it held: no longer among the names `started`.
fn forget(started: &Mutex<Vec<String>>, name: &str) {
    started
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|n| n != name);
}

/// The raw destination of a reload: each target's address and length; `stop`, asked before
/// each target is handed to the load, ends the load there when it says so.
struct RawTargets<'s> {
    targets: BTreeMap<String, ((usize, usize), Expected)>,
    started: Arc<Mutex<Vec<String>>>,
    stop: &'s (dyn Fn() -> bool + Sync),
}

/// What a reload stopped by its caller fails with: the destination error at the source of its
/// [`Error::PartialLoad`] (or of the error itself, when nothing was written yet).
const STOPPED: &str = "stopped by the caller";

// SAFETY: the regions are the caller's targets, which `Loader::load_into_raw`'s contract makes
// writable memory of the load's space, untouched by anything else until the load ends.
unsafe impl RawDestination for RawTargets<'_> {
    fn region(
        &mut self,
        tensor: &TensorMeta,
        _space: &'static str,
    ) -> std::result::Result<Option<(usize, usize)>, DestinationError> {
        let Some((region, expected)) = self.targets.get(&tensor.name) else {
            return Ok(None);
        };
        if (self.stop)() {
            return Err(STOPPED.into());
        }
        if let Some(problem) = mismatch(tensor, expected) {
            return Err(format!("the checkpoint changed since it was checked: {problem}").into());
        }
        let region = *region;
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tensor.name.clone());
        Ok(Some(region))
    }

    /// Each target is a weight's own memory, none of those written overlapping another's
    /// (checked by `overlapping` before the load): a mapped load copies into several at once.
    fn regions_disjoint(&self) -> bool {
        true
    }

    fn unwritten(&mut self, tensor: &TensorMeta) {
        forget(&self.started, &tensor.name);
    }
}

/// One line for each of the targets `loading` (those the load writes) whose memory overlaps
/// another's (a fused `qkv` and a view of its rows): written in place, one would overwrite the
/// other. Targets the checkpoint lacks are not written, so they may share memory (a tied
/// `lm_head` beside the `embed_tokens` the checkpoint has).
fn overlapping(
    targets: &BTreeMap<String, ((usize, usize), Expected)>,
    loading: &[String],
) -> Vec<String> {
    let mut spans: Vec<(usize, usize, &str)> = loading
        .iter()
        .filter_map(|name| targets.get_key_value(name))
        .filter(|(_, ((_, len), _))| *len > 0)
        .map(|(name, ((addr, len), _))| (*addr, addr.saturating_add(*len), name.as_str()))
        .collect();
    spans.sort_unstable();
    let mut problems = Vec::new();
    let mut reach: Option<(usize, &str)> = None; // the furthest end so far, and whose
    for (start, end, name) in spans {
        if let Some((furthest, other)) = reach
            && start < furthest
        {
            problems.push(format!(
                "{name}: its memory overlaps {other}'s in the targets (written in place, one \
                 would overwrite the other)"
            ));
        }
        if reach.is_none_or(|(furthest, _)| end > furthest) {
            reach = Some((end, name));
        }
    }
    problems
}

/// Reload targets by name: each one's memory `R` and what it must hold.
type Targets<R> = BTreeMap<String, (R, Expected)>;

impl<'d> Loader<'d> {
    /// Reads the checkpoint at `path` into `targets` (by tensor name), in place: a model's
    /// weights reloaded into the memory that holds them, with no second copy.
    ///
    /// Every header is read and every target checked first: the checkpoint's tensor (narrowed
    /// to this loader's rows, if it has a [`select`](Self::select)ion with rows) must have the
    /// target's length, and its dtype and shape where the target gives them. A mismatch, or
    /// with `strict` a target the checkpoint lacks or a tensor of the checkpoint no target
    /// takes, is [`Error::Mismatch`] and nothing is written. A failure after writing began is
    /// [`Error::PartialLoad`], which lists exactly which targets hold new bytes, which may hold
    /// some, and which are unchanged.
    ///
    /// The targets' memory must be the memory the backend loads into (host memory for `host`,
    /// device memory for `cufile`): otherwise [`Error::DestinationSpace`], before anything is
    /// written.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    /// # let mut file = (header.len() as u64).to_le_bytes().to_vec();
    /// # file.extend_from_slice(header);
    /// # file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
    /// # std::fs::write(dir.path().join("model.safetensors"), file)?;
    /// use std::collections::BTreeMap;
    /// use safetensors_staging::{DeviceRegion, Dtype, Loader, Target};
    ///
    /// let mut w = vec![0u8; 8]; // the weight as the model holds it: 2 x F32
    /// let targets = BTreeMap::from([(
    ///     "w".to_owned(),
    ///     Target::new(DeviceRegion::from_slice(&mut w)).dtype(Dtype::F32).shape([2]),
    /// )]);
    /// let done = Loader::new().load_into(dir.path(), targets, true)?;
    /// assert!(done.missing.is_empty() && done.unexpected.is_empty());
    /// assert_eq!(w, [0, 0, 128, 63, 0, 0, 0, 64]); // 1.0, 2.0
    /// # Ok(())
    /// # }
    /// ```
    pub fn load_into<S>(
        self,
        path: impl AsRef<Path>,
        targets: BTreeMap<String, Target<'_, S>>,
        strict: bool,
    ) -> Result<LoadedInto>
    where
        S: KnownSpace,
    {
        self.load_into_with(path.as_ref(), targets, strict, &mut |_| {})
    }

    /// [`load_into`](Self::load_into) with raw targets: addresses and lengths of memory of the
    /// space the backend loads into (device memory for `cufile` and `hipfile`, host memory for
    /// `host`), for callers outside Rust. Checked and written as `load_into` does.
    ///
    /// # Safety
    ///
    /// Each target's `[addr, addr + len)` must be writable memory of the space the backend
    /// loads into, and neither read nor written by anything else until this returns. Targets
    /// whose memory overlaps are refused ([`Error::Mismatch`]) before anything is written.
    pub unsafe fn load_into_raw(
        self,
        path: impl AsRef<Path>,
        targets: BTreeMap<String, RawTarget>,
        strict: bool,
    ) -> Result<LoadedInto> {
        // SAFETY: the caller's contract is this function's.
        unsafe { self.load_files_into_raw(&[path.as_ref()], targets, strict, &|| false) }
    }

    /// [`load_into_raw`](Self::load_into_raw) from `paths` (one path as
    /// [`open`](Self::open) takes it, or several files as [`open_files`](Self::open_files)),
    /// asking `stop` as each target's memory is asked for (on a load copying into several
    /// targets at once, for each of a batch of up to 64 MiB before any of it is read): once it
    /// returns true the load ends there,
    /// with an [`Error::PartialLoad`] (or, when nothing was written yet, the error itself)
    /// whose destination error says "stopped by the caller". What the Python door's Ctrl-C
    /// does.
    ///
    /// # Safety
    ///
    /// As [`load_into_raw`](Self::load_into_raw)'s.
    pub unsafe fn load_files_into_raw<P: AsRef<Path>>(
        self,
        paths: &[P],
        targets: BTreeMap<String, RawTarget>,
        strict: bool,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<LoadedInto> {
        let paths: Vec<&Path> = paths.iter().map(AsRef::as_ref).collect();
        let targets = targets
            .into_iter()
            .map(|(name, t)| {
                let expected = Expected {
                    len: t.len,
                    dtype: t.dtype,
                    shape: t.shape,
                };
                (name, ((t.addr, t.len), expected))
            })
            .collect();
        self.reload(
            &paths,
            targets,
            strict,
            |loader, targets, started| {
                loader.raw_destination(RawTargets {
                    targets,
                    started,
                    stop,
                })
            },
            overlapping,
            &mut |_| {},
        )
    }

    /// [`load_into`](Self::load_into), calling `after_each` with the name of each tensor
    /// written (the tests' way in, between two tensors).
    fn load_into_with<S>(
        self,
        path: &Path,
        targets: BTreeMap<String, Target<'_, S>>,
        strict: bool,
        after_each: &mut dyn FnMut(&str),
    ) -> Result<LoadedInto>
    where
        S: KnownSpace,
    {
        let targets = targets
            .into_iter()
            .map(|(name, target)| {
                let expected = Expected {
                    len: target.region.len(),
                    dtype: target.dtype,
                    shape: target.shape,
                };
                (name, (target.region, expected))
            })
            .collect();
        self.reload(
            &[path],
            targets,
            strict,
            |loader, targets, started| loader.destination(IntoTargets { targets, started }),
            // Regions borrowed mutably, each of its own: none can overlap another.
            |_, _| Vec::new(),
            after_each,
        )
    }

    /// Checks each target (its memory `R`, and what it must hold) against the checkpoint at
    /// `path`, and the memory of those it will write for `overlaps`, then loads it through the
    /// destination `attach` makes of the targets (which records each name whose memory it hands
    /// to the load in `started`).
    fn reload<'e, R>(
        self,
        paths: &[&Path],
        targets: Targets<R>,
        strict: bool,
        attach: impl FnOnce(Loader<'d>, Targets<R>, Arc<Mutex<Vec<String>>>) -> Loader<'e>,
        overlaps: fn(&Targets<R>, &[String]) -> Vec<String>,
        after_each: &mut dyn FnMut(&str),
    ) -> Result<LoadedInto> {
        let expected = &targets;
        let checkpoint = self.read_headers(paths)?;
        let present: BTreeSet<&str> = checkpoint
            .tensors()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        let missing: Vec<String> = expected
            .keys()
            .filter(|name| !present.contains(name.as_str()))
            .cloned()
            .collect();
        let unexpected: Vec<String> = checkpoint
            .tensors()
            .iter()
            .filter(|t| !expected.contains_key(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let loading: Vec<String> = expected
            .keys()
            .filter(|name| present.contains(name.as_str()))
            .cloned()
            .collect();
        let selection = self.selection.clone().within(loading);
        let narrowed = checkpoint.select(&selection)?;
        let mut problems = Vec::new();
        if strict {
            problems.extend(
                missing
                    .iter()
                    .map(|n| format!("{n}: missing from the checkpoint")),
            );
            problems.extend(
                unexpected
                    .iter()
                    .map(|n| format!("{n}: in the checkpoint, not in the targets")),
            );
        }
        for meta in narrowed.tensors() {
            if let Some(problem) = expected
                .get(&meta.name)
                .and_then(|(_, e)| mismatch(meta, e))
            {
                problems.push(problem);
            }
        }
        let names: Vec<String> = narrowed.tensors().iter().map(|t| t.name.clone()).collect();
        problems.extend(overlaps(expected, &names));
        if !problems.is_empty() {
            return Err(Error::Mismatch { problems });
        }
        // Writing begins: a name is started once the load asked for its memory, written once
        // the load handed it out whole.
        let started = Arc::new(Mutex::new(Vec::new()));
        let mut written = Vec::new();
        let loader = attach(self.select(selection), targets, Arc::clone(&started));
        let outcome = (|| -> Result<LoadReport> {
            let mut load = match paths {
                [one] => loader.open(one)?,
                several => loader.open_files(several)?,
            };
            for tensor in load.by_ref() {
                let name = tensor?.name().to_owned();
                after_each(&name);
                written.push(name);
            }
            Ok(load.report())
        })();
        match outcome {
            Ok(report) => Ok(LoadedInto {
                missing,
                unexpected,
                written,
                report,
            }),
            Err(source) => {
                let started = started.lock().unwrap_or_else(|e| e.into_inner()).clone();
                // Nothing was started: the load failed before writing (a file replaced since
                // its header was read, a backend that cannot run): every target is unchanged.
                if started.is_empty() && written.is_empty() {
                    return Err(source);
                }
                let done: BTreeSet<&String> = written.iter().collect();
                let partly: Vec<String> = started
                    .iter()
                    .filter(|n| !done.contains(n))
                    .cloned()
                    .collect();
                let unchanged = names
                    .into_iter()
                    .filter(|n| !done.contains(n) && !partly.contains(n))
                    .collect();
                Err(Error::PartialLoad {
                    source: Box::new(source),
                    written,
                    partly_written: partly,
                    unchanged,
                })
            }
        }
    }
}

/// Why a target `expected` to be so cannot take `meta`'s bytes; `None` when it can.
fn mismatch(meta: &TensorMeta, expected: &Expected) -> Option<String> {
    let name = &meta.name;
    if let Some(shape) = &expected.shape
        && shape != &meta.shape
    {
        return Some(format!(
            "{name}: shape {:?} in the checkpoint, {shape:?} in the target",
            meta.shape
        ));
    }
    if let Some(dtype) = expected.dtype
        && dtype != meta.dtype
    {
        return Some(format!(
            "{name}: dtype {:?} in the checkpoint, {dtype:?} in the target",
            meta.dtype
        ));
    }
    if expected.len != meta.len {
        return Some(format!(
            "{name}: {} bytes in the checkpoint, {} in the target",
            meta.len, expected.len
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

    use std::collections::BTreeMap;

    use staging_core::{DeviceRegion, HostMemory, StagingPolicy};

    use super::Target;
    use crate::{Backend, Device, Error, HostOptions, Loader};

    /// `names.len()` tensors of `len` bytes each, tensor i all `i + 1`.
    fn checkpoint(path: &std::path::Path, names: &[&str], len: usize) {
        let mut header = String::from("{");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                header.push(',');
            }
            header.push_str(&format!(
                r#""{name}":{{"dtype":"U8","shape":[{len}],"data_offsets":[{},{}]}}"#,
                i * len,
                (i + 1) * len
            ));
        }
        header.push('}');
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        for i in 0..names.len() {
            file.extend(std::iter::repeat_n(i as u8 + 1, len));
        }
        std::fs::write(path, file).unwrap();
    }

    #[test]
    fn a_read_failing_after_writing_began_says_what_each_target_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let len = 1 << 20;
        checkpoint(&path, &names, len);
        let mut memory: Vec<Vec<u8>> = names.iter().map(|_| vec![0u8; len]).collect();
        let targets: BTreeMap<String, Target<'_, HostMemory>> = names
            .iter()
            .zip(memory.iter_mut())
            .map(|(n, m)| ((*n).to_owned(), Target::new(DeviceRegion::from_slice(m))))
            .collect();
        let loader = Loader::new()
            .device(Device::Cpu)
            .backend(Backend::Host(HostOptions::default()))
            .policy(
                StagingPolicy::builder()
                    .io_threads(1)
                    .chunk_size(1 << 20)
                    .build()
                    .unwrap(),
            );
        // After the first tensor is written, the file loses its second half.
        let mut cut = false;
        let error = loader
            .load_into_with(&path, targets, true, &mut |_| {
                if !cut {
                    cut = true;
                    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                    let size = file.metadata().unwrap().len();
                    file.set_len(size / 2).unwrap();
                }
            })
            .unwrap_err();
        let (source, written, partly_written, unchanged) = partial(Err(error));
        // The library's own error, naming the file (it changed under the load).
        assert_eq!(source.file(), Some(path.as_path()), "{source}");
        assert_eq!(written.first().map(String::as_str), Some("a"));
        assert!(
            !unchanged.is_empty(),
            "the second half was never read: {written:?} {partly_written:?}"
        );
        // Every target is exactly one of the three.
        let mut all: Vec<&str> = written
            .iter()
            .chain(&partly_written)
            .chain(&unchanged)
            .map(String::as_str)
            .collect();
        all.sort_unstable();
        assert_eq!(all, names);
        for (i, name) in names.iter().enumerate() {
            let bytes = &memory[i];
            if written.iter().any(|w| w == name) {
                assert!(bytes.iter().all(|&b| b == i as u8 + 1), "{name}");
            } else if unchanged.iter().any(|u| u == name) {
                assert!(bytes.iter().all(|&b| b == 0), "{name}");
            }
        }
    }

    /// A reload of raw targets from `dir/model.safetensors`, 8 tensors of 256 KiB each, the
    /// file mapped: copied in batches (1 MiB in the crate's unit tests: 4 tensors each) on 2
    /// threads. `stop` is asked before each target.
    fn raw_reload(
        dir: &std::path::Path,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> (Vec<Vec<u8>>, crate::Result<super::LoadedInto>) {
        use super::RawTarget;

        let path = dir.join("model.safetensors");
        let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let len = 256 << 10;
        checkpoint(&path, &names, len);
        let mut memory: Vec<Vec<u8>> = names.iter().map(|_| vec![0u8; len]).collect();
        let targets: BTreeMap<String, RawTarget> = names
            .iter()
            .zip(memory.iter_mut())
            .map(|(n, m)| {
                let target = RawTarget {
                    addr: m.as_mut_ptr() as usize,
                    len,
                    dtype: None,
                    shape: Some(vec![len]),
                };
                ((*n).to_owned(), target)
            })
            .collect();
        let loader = Loader::new()
            .device(Device::Cpu)
            .backend(Backend::Host(
                HostOptions::default().map(crate::MapFiles::Always),
            ))
            .policy(StagingPolicy::builder().io_threads(2).build().unwrap());
        // SAFETY: each target is a live, writable buffer of its own, untouched until it returns.
        let done = unsafe { loader.load_files_into_raw(&[&path], targets, true, stop) };
        (memory, done)
    }

    #[test]
    fn raw_targets_are_copied_out_of_the_mapping_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let (memory, done) = raw_reload(dir.path(), &|| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            false
        });
        let done = done.unwrap();
        assert_eq!(done.written, ["a", "b", "c", "d", "e", "f", "g", "h"]);
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 8);
        new_then_old(&memory, 8);
        assert_eq!(done.report.paths.destination.tensors, 8);
        assert_eq!(done.report.paths.mapped.tensors, 0);
        assert_eq!(
            done.report.mode.as_str(),
            "mmap",
            "read from the mapped file"
        );
        assert_eq!(done.report.bytes_read, 8 << 18);
    }

    #[test]
    fn raw_targets_whose_memory_overlaps_are_refused_before_anything_is_written() {
        use super::RawTarget;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        checkpoint(&path, &["qkv", "q", "k"], 4096);
        let mut memory = vec![0u8; 3 * 4096];
        let base = memory.as_mut_ptr() as usize;
        let target = |addr: usize| RawTarget {
            addr,
            len: 4096,
            dtype: None,
            shape: None,
        };
        // q starts inside qkv; k is after both, its own.
        let targets = BTreeMap::from([
            ("qkv".to_owned(), target(base)),
            ("q".to_owned(), target(base + 2048)),
            ("k".to_owned(), target(base + 8192)),
        ]);
        let loader = Loader::new()
            .device(Device::Cpu)
            .backend(Backend::Host(HostOptions::default()));
        // SAFETY: every target lies in `memory`, alive and untouched until this returns.
        let error = unsafe { loader.load_into_raw(&path, targets, true) }.unwrap_err();
        let Error::Mismatch { problems } = &error else {
            panic!("{error}");
        };
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("q: its memory overlaps qkv's"),
            "{problems:?}"
        );
        assert!(memory.iter().all(|&b| b == 0), "nothing was written");
        // A target the checkpoint lacks is not written: it may share memory (a tied lm_head).
        let targets = BTreeMap::from([
            ("qkv".to_owned(), target(base)),
            ("k".to_owned(), target(base + 8192)),
            ("lm_head".to_owned(), target(base + 8192)),
        ]);
        let loader = Loader::new()
            .device(Device::Cpu)
            .backend(Backend::Host(HostOptions::default()));
        // SAFETY: as above.
        let done = unsafe { loader.load_into_raw(&path, targets, false) }.unwrap();
        assert_eq!(done.missing, ["lm_head"]);
        assert_eq!(done.unexpected, ["q"]);
        assert!(memory[..4096].iter().all(|&b| b == 1) && memory[8192..].iter().all(|&b| b == 3));
    }

    #[test]
    fn a_stop_in_a_batch_hands_out_the_targets_asked_before_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // The second batch is e, f, g, h: the stop comes as f is asked for. e was asked for
        // before it: it is copied, whole, before the load ends.
        let dir = tempfile::tempdir().unwrap();
        let asked = AtomicUsize::new(0);
        let (memory, done) = raw_reload(dir.path(), &|| asked.fetch_add(1, Ordering::SeqCst) == 5);
        let (source, written, partly_written, unchanged) = partial(done);
        assert!(source.to_string().contains(super::STOPPED), "{source}");
        assert_eq!(written, ["a", "b", "c", "d", "e"]);
        assert!(partly_written.is_empty(), "{partly_written:?}");
        assert_eq!(unchanged, ["f", "g", "h"]);
        new_then_old(&memory, 5);
    }

    /// The error, written, partly written and unchanged targets of a reload that failed after
    /// writing began.
    fn partial(
        done: crate::Result<super::LoadedInto>,
    ) -> (Error, Vec<String>, Vec<String>, Vec<String>) {
        match done {
            Err(Error::PartialLoad {
                source,
                written,
                partly_written,
                unchanged,
            }) => (*source, written, partly_written, unchanged),
            other => panic!("{other:?}"),
        }
    }

    /// The first `n` targets of `raw_reload` hold their tensors' bytes, the rest zeroes.
    fn new_then_old(memory: &[Vec<u8>], n: usize) {
        for (i, bytes) in memory.iter().enumerate() {
            let want = if i < n { i as u8 + 1 } else { 0 };
            assert!(bytes.iter().all(|&b| b == want), "target {i}");
        }
    }

    #[test]
    fn a_file_cut_short_during_a_batch_is_found_before_it_is_copied() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // As f (the second batch's second target) is asked for, the file loses its second half,
        // where e to h lie: found before a byte of the batch is copied, so e to h are
        // unchanged, and said to be.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let asked = AtomicUsize::new(0);
        let (memory, done) = raw_reload(dir.path(), &|| {
            if asked.fetch_add(1, Ordering::SeqCst) == 5 {
                let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                let size = file.metadata().unwrap().len();
                file.set_len(size / 2).unwrap();
            }
            false
        });
        let (source, written, partly_written, unchanged) = partial(done);
        assert_eq!(source.file(), Some(path.as_path()), "{source}");
        assert_eq!(written, ["a", "b", "c", "d"]);
        assert!(partly_written.is_empty(), "{partly_written:?}");
        assert_eq!(unchanged, ["e", "f", "g", "h"]);
        new_then_old(&memory, 4);
    }

    #[test]
    fn a_stop_ends_a_raw_reload_between_targets_and_one_from_several_files_loads() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use super::{RawTarget, STOPPED};

        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("a.safetensors");
        let second = dir.path().join("b.safetensors");
        checkpoint(&first, &["a", "b"], 4096);
        checkpoint(&second, &["c", "d"], 4096);
        let mut memory: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 4096]).collect();
        let targets = |memory: &mut Vec<Vec<u8>>| -> BTreeMap<String, RawTarget> {
            ["a", "b", "c", "d"]
                .iter()
                .zip(memory.iter_mut())
                .map(|(n, m)| {
                    let target = RawTarget {
                        addr: m.as_mut_ptr() as usize,
                        len: m.len(),
                        dtype: None,
                        shape: Some(vec![4096]),
                    };
                    ((*n).to_owned(), target)
                })
                .collect()
        };
        let loader = || {
            Loader::new()
                .device(Device::Cpu)
                .backend(Backend::Host(HostOptions::default()))
        };
        // Asked before each target: the third ask stops the load.
        let asked = AtomicUsize::new(0);
        let stop = || asked.fetch_add(1, Ordering::SeqCst) >= 2;
        // SAFETY: each target is a live, writable buffer of its own, untouched until it returns.
        let error = unsafe {
            loader().load_files_into_raw(&[&first, &second], targets(&mut memory), true, &stop)
        }
        .unwrap_err();
        let (source, written, partly_written, unchanged) = partial(Err(error));
        assert!(source.to_string().contains(STOPPED), "{source}");
        assert_eq!(written, &["a", "b"]);
        assert!(partly_written.is_empty(), "{partly_written:?}");
        assert_eq!(unchanged, &["c", "d"]);
        assert!(memory[0].iter().all(|&b| b == 1) && memory[1].iter().all(|&b| b == 2));
        assert!(memory[2].iter().all(|&b| b == 0) && memory[3].iter().all(|&b| b == 0));

        // Never stopped: both files, every target.
        // SAFETY: as above.
        let done = unsafe {
            loader().load_files_into_raw(&[&first, &second], targets(&mut memory), true, &|| false)
        }
        .unwrap();
        assert_eq!(done.written, ["a", "b", "c", "d"]);
        assert!(done.missing.is_empty() && done.unexpected.is_empty());
        assert!(memory[2].iter().all(|&b| b == 1) && memory[3].iter().all(|&b| b == 2));
    }
}
