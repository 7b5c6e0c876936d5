//! What several loads of one prepared backend share beyond the backend itself: the files it has
//! opened ([`OpenFiles`], through the [`KeepOpen`] reader) and its I/O threads ([`IoThreads`]).
//!
//! A reader that asks for tensors one at a time (`safe_open(...).get_tensor(name)`) runs one
//! small load per tensor; without these, each would open its file again (for cuFile, register
//! it again) and start its own thread pool.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::checkpoint::FileIdentity;
use crate::error::{Error, ReadError, Result};
use crate::memory::DeviceRegion;
use crate::traits::{IoMode, Reader};

type AnyFile = Arc<dyn Any + Send + Sync>;

/// Files opened by readers, kept open until the last clone of this is dropped. Shared by the
/// readers of one backend: a file is opened once, whichever load asks first. A file is found by
/// its path and by the reader's file type, so readers of different kinds never share one.
#[derive(Clone, Default)]
pub struct OpenFiles(Arc<Mutex<HashMap<PathBuf, AnyFile>>>);

impl fmt::Debug for OpenFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenFiles")
            .field("open", &self.len())
            .finish()
    }
}

impl OpenFiles {
    /// How many files are open.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no file is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every file (each when the last load reading it lets go).
    pub fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// A reader whose files stay open in an [`OpenFiles`] after the load that opened them: the next
/// load of the same file reads through the same open file. Everything else is the inner reader's,
/// including the check that a file is still the one whose header was read (made on its path, so
/// a file replaced since is refused rather than read through the old handle unnoticed).
#[derive(Debug)]
pub struct KeepOpen<R> {
    inner: R,
    files: OpenFiles,
}

impl<R> KeepOpen<R> {
    /// `inner`, keeping its files in `files`.
    pub fn new(inner: R, files: OpenFiles) -> Self {
        Self { inner, files }
    }
}

impl<R> Reader for KeepOpen<R>
where
    R: Reader,
    R::File: 'static,
{
    type Space = R::Space;
    type File = Arc<R::File>;

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn mode(&self) -> IoMode {
        self.inner.mode()
    }

    fn open(&self, path: &Path) -> std::result::Result<Self::File, ReadError> {
        let mut files = self.files.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = files
            .get(path)
            .and_then(|file| Arc::clone(file).downcast::<R::File>().ok())
        {
            return Ok(file);
        }
        // Opened under the lock: two loads asking at once open the file once.
        let file = Arc::new(self.inner.open(path)?);
        files.insert(path.to_path_buf(), Arc::clone(&file) as AnyFile);
        Ok(file)
    }

    fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        dst: DeviceRegion<'_, Self::Space>,
    ) -> std::result::Result<usize, ReadError> {
        self.inner.read_at(file, offset, dst)
    }

    fn unchanged_by(&self) -> &'static str {
        self.inner.unchanged_by()
    }

    fn redirects(&self) -> Vec<String> {
        self.inner.redirects()
    }

    fn verify_unchanged(
        &self,
        path: &Path,
        identity: &FileIdentity,
    ) -> std::result::Result<(), String> {
        self.inner.verify_unchanged(path, identity)
    }
}

/// The I/O threads a load reads on: none (reads on the calling thread) or a pool that loads may
/// share. Loads sharing a pool share its threads, so loads at once do not multiply them.
#[derive(Clone)]
pub struct IoThreads(Option<Arc<rayon::ThreadPool>>);

impl fmt::Debug for IoThreads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IoThreads").field(&self.count()).finish()
    }
}

impl IoThreads {
    /// `threads` I/O threads (none for 0 or 1: reads then run on the loading thread).
    pub fn new(threads: usize) -> Result<Self> {
        if threads <= 1 {
            return Ok(Self(None));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("staging-io-{i}"))
            .build()
            .map_err(|e| {
                // rayon gives the system's error as the source (its other errors are about its
                // global pool, which is not used here).
                let source = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .map_or_else(
                        || std::io::Error::other(e.to_string()),
                        |io| match io.raw_os_error() {
                            Some(code) => std::io::Error::from_raw_os_error(code),
                            None => std::io::Error::new(io.kind(), io.to_string()),
                        },
                    );
                Error::Resource {
                    what: format!("{threads} I/O threads"),
                    source,
                }
            })?;
        Ok(Self(Some(Arc::new(pool))))
    }

    /// How many threads (1: the loading thread itself).
    pub fn count(&self) -> usize {
        self.0.as_ref().map_or(1, |pool| pool.current_num_threads())
    }

    pub(crate) fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.0.as_deref()
    }

    /// Runs `work` on every item, in parallel on these threads (the caller waits), or in order
    /// on the calling thread when there are none. The first error is returned; items not yet
    /// started when it happened may still run.
    pub fn try_each<T, E>(
        &self,
        items: Vec<T>,
        work: impl Fn(T) -> std::result::Result<(), E> + Sync + Send,
    ) -> std::result::Result<(), E>
    where
        T: Send,
        E: Send,
    {
        use rayon::prelude::*;
        match self.pool() {
            Some(pool) if items.len() > 1 => {
                pool.install(|| items.into_par_iter().try_for_each(work))
            }
            _ => items.into_iter().try_for_each(work),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostReader;
    use std::io::Write;

    #[test]
    fn try_each_runs_every_item_and_returns_an_error() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for threads in [1, 3] {
            let pool = IoThreads::new(threads).unwrap();
            let sum = AtomicUsize::new(0);
            let done: std::result::Result<(), String> = pool.try_each((1..=100).collect(), |i| {
                sum.fetch_add(i, Ordering::Relaxed);
                Ok(())
            });
            assert_eq!(done, Ok(()));
            assert_eq!(sum.load(Ordering::Relaxed), 5050, "{threads} threads");
            let failed = pool.try_each((0..10).collect(), |i: usize| {
                if i == 7 {
                    Err(format!("item {i}"))
                } else {
                    Ok(())
                }
            });
            assert_eq!(failed, Err("item 7".to_string()), "{threads} threads");
        }
    }

    #[test]
    fn a_file_is_opened_once_and_closed_with_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(b"bytes")
            .unwrap();
        let files = OpenFiles::default();
        let (a, b) = (
            KeepOpen::new(HostReader, files.clone()),
            KeepOpen::new(HostReader, files.clone()),
        );
        let first = a.open(&path).unwrap();
        let second = b.open(&path).unwrap();
        assert!(
            Arc::ptr_eq(&first, &second),
            "the second load reuses the file"
        );
        assert_eq!(files.len(), 1);
        drop((first, second));
        assert_eq!(
            Arc::strong_count(files.0.lock().unwrap().get(&path).unwrap()),
            1
        );
        files.clear();
        assert!(files.is_empty());
        let missing = a.open(&dir.path().join("missing"));
        assert!(missing.is_err(), "a file that cannot open is an error");
        assert!(files.is_empty(), "and is not kept");
    }

    #[test]
    fn threads_are_shared_and_counted() {
        assert_eq!(IoThreads::new(0).unwrap().count(), 1);
        assert_eq!(IoThreads::new(1).unwrap().count(), 1);
        let four = IoThreads::new(4).unwrap();
        let shared = four.clone();
        assert_eq!(shared.count(), 4);
        assert!(std::ptr::eq(four.pool().unwrap(), shared.pool().unwrap()));
    }
}
