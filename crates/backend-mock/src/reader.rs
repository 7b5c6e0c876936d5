//! [`FaultyReader`]: wraps any reader and injects scripted read faults, recording every call.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use staging_core::{DeviceRegion, IoMode, ReadError, Reader};

/// One call to [`Reader::read_at`] as the wrapper saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadCall {
    /// Call number, from 0.
    pub index: usize,
    /// The file read.
    pub file: PathBuf,
    /// The file offset asked for.
    pub offset: u64,
    /// Bytes asked for.
    pub requested: usize,
    /// What came back: bytes, or `None` for an error.
    pub returned: Option<usize>,
}

/// A shared, growing log of read calls; clone it before the reader moves into a stager.
#[derive(Debug, Clone, Default)]
pub struct ReadLog(Arc<Mutex<Vec<ReadCall>>>);

impl ReadLog {
    /// Every call so far, in the order they were made.
    pub fn calls(&self) -> Vec<ReadCall> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn push(&self, call: ReadCall) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }
}

/// A file opened through a [`FaultyReader`].
#[derive(Debug)]
pub struct FaultyFile<F> {
    inner: F,
    path: PathBuf,
}

/// Wraps a reader with scripted faults:
///
/// - `fail_on_call(k)`: the `k`-th `read_at` call (from 0) fails with an I/O error;
/// - `fail_at_offset(at)`: any read covering file offset `at` fails (order-independent);
/// - `bad_byte_at(at)`: like a bad sector, a read covering `at` stops short before it and a read
///   starting at `at` fails;
/// - `eof_on_call(k)`: the `k`-th call returns 0 bytes, as a truncated file would;
/// - `short_reads(pattern)`: call `i` reads at most `pattern[i % len]` bytes;
/// - `fail_open()`: opening any file fails.
///
/// Without faults it behaves exactly like the wrapped reader.
#[derive(Debug)]
pub struct FaultyReader<R> {
    inner: R,
    label: String,
    fail_on: BTreeSet<usize>,
    fail_at: BTreeSet<u64>,
    fail_at_in: Vec<(PathBuf, u64)>,
    bad_bytes: BTreeSet<u64>,
    eof_on: BTreeSet<usize>,
    short_reads: Vec<usize>,
    fail_open: bool,
    calls: AtomicUsize,
    log: ReadLog,
}

impl<R: Reader> FaultyReader<R> {
    /// Wraps `inner`; reports carry the inner reader's name.
    pub fn new(inner: R) -> Self {
        let label = inner.name().to_owned();
        Self {
            inner,
            label,
            fail_on: BTreeSet::new(),
            fail_at: BTreeSet::new(),
            fail_at_in: Vec::new(),
            bad_bytes: BTreeSet::new(),
            eof_on: BTreeSet::new(),
            short_reads: Vec::new(),
            fail_open: false,
            calls: AtomicUsize::new(0),
            log: ReadLog::default(),
        }
    }

    /// Reports this name instead of the inner reader's.
    pub fn labelled(mut self, name: impl Into<String>) -> Self {
        self.label = name.into();
        self
    }

    /// The `k`-th read call fails.
    pub fn fail_on_call(mut self, k: usize) -> Self {
        self.fail_on.insert(k);
        self
    }

    /// Any read whose requested range `[offset, offset + len)` contains file offset `at` fails:
    /// deterministic whatever order parallel reads run in.
    pub fn fail_at_offset(mut self, at: u64) -> Self {
        self.fail_at.insert(at);
        self
    }

    /// Like [`fail_at_offset`](Self::fail_at_offset), for reads of the file at `path` only.
    pub fn fail_at_offset_in(mut self, path: impl Into<PathBuf>, at: u64) -> Self {
        self.fail_at_in.push((path.into(), at));
        self
    }

    /// File offset `at` is unreadable, as a bad sector is: a read of a range containing it
    /// returns the bytes before it (a short read), and a read starting at it fails. The error
    /// therefore comes at exactly `at`, whatever the requests' sizes.
    pub fn bad_byte_at(mut self, at: u64) -> Self {
        self.bad_bytes.insert(at);
        self
    }

    /// The `k`-th read call returns 0 bytes.
    pub fn eof_on_call(mut self, k: usize) -> Self {
        self.eof_on.insert(k);
        self
    }

    /// Call `i` reads at most `pattern[i % pattern.len()]` bytes (entries of 0 count as 1).
    pub fn short_reads(mut self, pattern: Vec<usize>) -> Self {
        self.short_reads = pattern;
        self
    }

    /// Opening any file fails.
    pub fn fail_open(mut self) -> Self {
        self.fail_open = true;
        self
    }

    /// A handle on the call log that stays valid after the reader moves.
    pub fn log(&self) -> ReadLog {
        self.log.clone()
    }
}

impl<R: Reader> Reader for FaultyReader<R> {
    type Space = R::Space;
    type File = FaultyFile<R::File>;

    fn name(&self) -> &str {
        &self.label
    }

    fn mode(&self) -> IoMode {
        self.inner.mode()
    }

    fn unchanged_by(&self) -> &'static str {
        self.inner.unchanged_by()
    }

    fn redirects(&self) -> Vec<String> {
        self.inner.redirects()
    }

    fn open(&self, path: &Path) -> Result<Self::File, ReadError> {
        if self.fail_open {
            return Err(ReadError::Io(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "injected open failure",
            )));
        }
        Ok(FaultyFile {
            inner: self.inner.open(path)?,
            path: path.to_path_buf(),
        })
    }

    fn reopen(&self, path: &Path) -> Result<Self::File, ReadError> {
        if self.fail_open {
            return Err(ReadError::Io(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "injected open failure",
            )));
        }
        Ok(FaultyFile {
            inner: self.inner.reopen(path)?,
            path: path.to_path_buf(),
        })
    }

    fn verify_unchanged(
        &self,
        path: &Path,
        identity: &staging_core::FileIdentity,
    ) -> Result<(), String> {
        self.inner.verify_unchanged(path, identity)
    }

    fn identity_of(&self, file: &Self::File) -> Option<staging_core::FileIdentity> {
        self.inner.identity_of(&file.inner)
    }

    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        dst: DeviceRegion<'_, Self::Space>,
    ) -> Result<usize, ReadError> {
        let index = self.calls.fetch_add(1, Ordering::AcqRel);
        let requested = dst.len();
        let record = |returned| {
            self.log.push(ReadCall {
                index,
                file: file.path.clone(),
                offset,
                requested,
                returned,
            })
        };
        let end = offset + requested as u64;
        let in_file = self
            .fail_at_in
            .iter()
            .any(|(path, at)| *path == file.path && (offset..end).contains(at));
        if self.fail_on.contains(&index)
            || in_file
            || self.fail_at.range(offset..end).next().is_some()
        {
            record(None);
            return Err(ReadError::Io(io::Error::other(format!(
                "injected read error on call {index}"
            ))));
        }
        if self.eof_on.contains(&index) {
            record(Some(0));
            return Ok(0);
        }
        let bad = self.bad_bytes.range(offset..end).next().copied();
        if bad == Some(offset) {
            record(None);
            return Err(ReadError::Io(io::Error::other(format!(
                "injected bad byte at offset {offset}"
            ))));
        }
        let before_bad = bad.map_or(requested, |at| (at - offset) as usize);
        let limit = match self.short_reads.len() {
            0 => requested,
            n => self.short_reads[index % n].max(1).min(requested),
        }
        .min(before_bad);
        let mut dst = dst;
        let result = match dst.slice(0, limit) {
            Some(part) => self.inner.read_at(&file.inner, offset, part),
            None => Ok(0),
        };
        record(result.as_ref().ok().copied());
        result
    }
}
