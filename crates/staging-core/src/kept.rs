//! What several loads of one prepared backend share beyond the backend itself: the files it has
//! opened ([`OpenFiles`], through the [`KeepOpen`] reader) and its I/O threads ([`IoThreads`]).
//!
//! A reader that asks for tensors one at a time (`safe_open(...).get_tensor(name)`) runs one
//! small load per tensor; without these, each would open its file again (for cuFile, register
//! it again) and start its own thread pool.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::checkpoint::FileIdentity;
use crate::error::{Error, ReadError, Result};
use crate::memory::DeviceRegion;
use crate::traits::{IoMode, Reader};

type AnyFile = Arc<dyn Any + Send + Sync>;

/// At most `capacity` values by path, the least recently used dropped first when one more is
/// kept: what bounds the files (descriptors, mappings) a reader or a load keeps, whatever the
/// number of files it reads. Finding a value costs a hash lookup, keeping one a log.
pub struct Recent<V> {
    capacity: usize,
    entries: Mutex<Entries<V>>,
}

/// The values by path, each with when it was last used; and the paths by when.
struct Entries<V> {
    by_path: HashMap<PathBuf, (V, u64)>,
    by_use: BTreeMap<u64, PathBuf>,
    clock: u64,
}

impl<V> Entries<V> {
    fn touch(&mut self, path: &Path) {
        self.clock += 1;
        let clock = self.clock;
        if let Some((_, used)) = self.by_path.get_mut(path) {
            self.by_use.remove(used);
            *used = clock;
            self.by_use.insert(clock, path.to_path_buf());
        }
    }

    fn remove(&mut self, path: &Path) {
        if let Some((_, used)) = self.by_path.remove(path) {
            self.by_use.remove(&used);
        }
    }
}

impl<V: Clone> Recent<V> {
    /// At most `capacity` values (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: Mutex::new(Entries {
                by_path: HashMap::new(),
                by_use: BTreeMap::new(),
                clock: 0,
            }),
        }
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.lock().by_path.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every value (their other holders keep theirs).
    pub fn clear(&self) {
        let mut entries = self.lock();
        entries.by_path.clear();
        entries.by_use.clear();
    }

    /// The value kept for `path` (now the most recently used), if `found` takes it (a value
    /// `found` declines stays where it was); else the value `open` makes, kept in its place,
    /// the least recently used dropped when there are `capacity`. `open` runs with the values
    /// locked: two callers asking at once make one value. `Ok(None)` from `open` keeps nothing.
    pub fn get_or_keep<T, E>(
        &self,
        path: &Path,
        found: impl FnOnce(&V) -> Option<T>,
        open: impl FnOnce() -> std::result::Result<Option<(V, T)>, E>,
    ) -> std::result::Result<Option<T>, E> {
        let mut entries = self.lock();
        if let Some(taken) = entries
            .by_path
            .get(path)
            .and_then(|(value, _)| found(value))
        {
            entries.touch(path);
            return Ok(Some(taken));
        }
        let Some((value, taken)) = open()? else {
            return Ok(None);
        };
        entries.remove(path);
        while entries.by_path.len() >= self.capacity {
            let Some((_, oldest)) = entries.by_use.pop_first() else {
                break;
            };
            entries.by_path.remove(&oldest);
        }
        entries.by_path.insert(path.to_path_buf(), (value, 0));
        entries.touch(path);
        Ok(Some(taken))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<V>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<V> fmt::Debug for Recent<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_path
            .len();
        f.debug_struct("Recent")
            .field("kept", &kept)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Files opened by readers, kept open until the last clone of this is dropped. Shared by the
/// readers of one backend: a file is opened once, whichever load asks first. A file is found by
/// its path and by the reader's file type, so readers of different kinds never share one.
///
/// At most [`OpenFiles::KEPT`] files are kept, the least recently used closed first (a load
/// reading it keeps it open until it is done with it): a reader of a checkpoint of any number
/// of files holds a few descriptors, not one a file. A file closed so is opened again by its
/// path when it is next read, and checked then against the identity its header was read with.
#[derive(Clone)]
pub struct OpenFiles(Arc<Recent<AnyFile>>);

impl Default for OpenFiles {
    fn default() -> Self {
        Self(Arc::new(Recent::new(Self::KEPT)))
    }
}

impl fmt::Debug for OpenFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenFiles")
            .field("open", &self.len())
            .finish()
    }
}

impl OpenFiles {
    /// How many files are kept open at most.
    pub const KEPT: usize = 16;

    /// How many files are open.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no file is open.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Closes every file (each when the last load reading it lets go).
    pub fn clear(&self) {
        self.0.clear();
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
        let opened = self.files.0.get_or_keep::<_, ReadError>(
            path,
            // A file of another reader's type is not this reader's: opened again, it replaces it.
            |file| Arc::clone(file).downcast::<R::File>().ok(),
            || {
                let file = Arc::new(self.inner.open(path)?);
                Ok(Some((Arc::clone(&file) as AnyFile, file)))
            },
        )?;
        opened.ok_or_else(|| ReadError::Io(std::io::Error::other("no file was opened")))
    }

    fn reopen(&self, path: &Path) -> std::result::Result<Self::File, ReadError> {
        // The file kept is declined: opened anew, it replaces it.
        let opened = self.files.0.get_or_keep::<_, ReadError>(
            path,
            |_| None,
            || {
                let file = Arc::new(self.inner.reopen(path)?);
                Ok(Some((Arc::clone(&file) as AnyFile, file)))
            },
        )?;
        opened.ok_or_else(|| ReadError::Io(std::io::Error::other("no file was opened")))
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

    fn identity_of(&self, file: &Self::File) -> Option<FileIdentity> {
        self.inner.identity_of(file)
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
    use crate::memory::DeviceRegion;
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
        assert_eq!(Arc::strong_count(&files.0.lock().by_path[&path].0), 1);
        files.clear();
        assert!(files.is_empty());
        let missing = a.open(&dir.path().join("missing"));
        assert!(missing.is_err(), "a file that cannot open is an error");
        assert!(files.is_empty(), "and is not kept");
    }

    #[test]
    fn recent_keeps_at_most_its_capacity_dropping_the_least_recently_used() {
        let recent: Recent<u32> = Recent::new(2);
        let keep = |path: &str, value: u32| {
            recent.get_or_keep::<_, ()>(Path::new(path), |v| Some(*v), || Ok(Some((value, value))))
        };
        assert_eq!(keep("a", 1), Ok(Some(1)));
        assert_eq!(keep("b", 2), Ok(Some(2)));
        assert_eq!(keep("a", 9), Ok(Some(1)), "kept: not made again");
        assert_eq!(keep("c", 3), Ok(Some(3)));
        assert_eq!(recent.len(), 2);
        // `b` was the least recently used: made again; `a` is still kept.
        assert_eq!(keep("b", 4), Ok(Some(4)));
        assert_eq!(keep("c", 9), Ok(Some(3)));
        assert_eq!(recent.len(), 2);
        // A value declined is made again and replaces it; nothing made keeps nothing.
        let made = recent.get_or_keep::<_, ()>(Path::new("c"), |_| None, || Ok(Some((5, 5))));
        assert_eq!(made, Ok(Some(5)));
        assert_eq!(keep("c", 9), Ok(Some(5)));
        let none = recent.get_or_keep::<u32, ()>(Path::new("d"), |v| Some(*v), || Ok(None));
        assert_eq!(none, Ok(None));
        let failed = recent.get_or_keep::<u32, &str>(Path::new("d"), |v| Some(*v), || Err("no"));
        assert_eq!(failed, Err("no"));
        assert_eq!(recent.len(), 2);
        recent.clear();
        assert!(recent.is_empty());
    }

    #[test]
    fn a_file_held_by_a_load_stays_open_when_more_files_push_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::default();
        let reader = KeepOpen::new(HostReader, files.clone());
        let paths: Vec<_> = (0..OpenFiles::KEPT + 5)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                std::fs::write(&path, [i as u8; 8]).unwrap();
                path
            })
            .collect();
        let held = reader.open(&paths[0]).unwrap();
        for path in &paths[1..] {
            drop(reader.open(path).unwrap());
        }
        assert_eq!(files.len(), OpenFiles::KEPT);
        // Pushed out of the kept files, still readable by the load that holds it.
        let mut byte = [0u8; 1];
        let read = reader
            .read_at(&held, 3, DeviceRegion::from_slice(&mut byte))
            .unwrap();
        assert_eq!((read, byte), (1, [0]));
        // Asked again, it is opened anew (another file than the one held).
        let again = reader.open(&paths[0]).unwrap();
        assert!(!Arc::ptr_eq(&held, &again));
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
