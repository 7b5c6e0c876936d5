//! The Hugging Face cache, written as `huggingface_hub` writes it, while a load streams.
//!
//! ```text
//! {HF_HUB_CACHE}/CACHEDIR.TAG
//! {HF_HUB_CACHE}/.locks/models--org--name/<blob>.lock        flock(2)ed while a blob is written
//! {HF_HUB_CACHE}/models--org--name/blobs/<blob>                  LFS: <sha256>; else the git blob id
//! {HF_HUB_CACHE}/models--org--name/blobs/<blob>.<8 hex>.incomplete   while being written
//! {HF_HUB_CACHE}/models--org--name/snapshots/<commit>/<path> -> ../../blobs/<blob>
//! {HF_HUB_CACHE}/models--org--name/refs/<revision>               the commit, no newline
//! ```
//!
//! Every byte a load receives of a weight file is also written at its offset into the blob's
//! `.incomplete` file ([`HubCache::received`]); a thread per blob hashes the file's written
//! prefix as it grows, so the SHA-256 is ready soon after the last byte. When every byte of the
//! file has been written ([`HubCache::settle`], called after each read), its SHA-256 is
//! compared with the one the Hub lists: equal, the file is renamed into place and linked from
//! the snapshot; different, it is deleted and the read fails naming the file, so a wrong byte
//! is never committed to the cache. A blob another process is writing (its lock held) or that
//! is already there is not written again. Whatever is not complete when the cache is dropped
//! (a load stopped early, a selection of some tensors) is deleted: no partial blob is left.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use sha2::Digest;

use crate::api::TreeFile;
use crate::counters::Counters;

/// What `huggingface_hub` writes into `CACHEDIR.TAG`.
const CACHEDIR_TAG: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by huggingface_hub.\n\
# For information about cache directory tags, see:\n\
#\thttps://bford.info/cachedir/\n";

/// Bytes hashed per read of the written prefix.
const HASH_CHUNK: usize = 1 << 20;

/// An error about the cache at `path`.
fn cache_error(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "the Hugging Face cache at {}: {} (cache=false loads without writing it)",
            path.display(),
            staging_core::io_words(e)
        ),
    )
}

/// One repository's folders in the cache.
#[derive(Debug, Clone)]
pub(crate) struct RepoCache {
    /// `{cache}`: where `CACHEDIR.TAG` goes.
    pub(crate) root: PathBuf,
    /// `{cache}/models--org--name`.
    pub(crate) repo: PathBuf,
    /// `{cache}/.locks/models--org--name`.
    pub(crate) locks: PathBuf,
}

impl RepoCache {
    pub(crate) fn new(root: &Path, folder: &str) -> Self {
        Self {
            root: root.to_path_buf(),
            repo: root.join(folder),
            locks: root.join(".locks").join(folder),
        }
    }

    pub(crate) fn blob(&self, name: &str) -> PathBuf {
        self.repo.join("blobs").join(name)
    }

    pub(crate) fn snapshot(&self, commit: &str) -> PathBuf {
        self.repo.join("snapshots").join(commit)
    }

    /// The commit `refs/<revision>` names, if the cache has it.
    pub(crate) fn read_ref(&self, revision: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.repo.join("refs").join(revision)).ok()?;
        let text = text.trim();
        crate::api::is_commit(text).then(|| text.to_owned())
    }

    /// Creates the folders of blobs and locks and `CACHEDIR.TAG` (when missing). Not the
    /// snapshot's: it is made by the first file linked into it, since an empty
    /// `snapshots/<commit>/` is taken for a downloaded model (by `huggingface_hub`'s
    /// `local_files_only` and by an offline load) and a load may fail before any file arrives.
    pub(crate) fn prepare(&self) -> io::Result<()> {
        for dir in [self.repo.join("blobs"), self.locks.clone()] {
            std::fs::create_dir_all(&dir).map_err(|e| cache_error(&dir, &e))?;
        }
        let tag = self.root.join("CACHEDIR.TAG");
        if !tag.exists() {
            // As huggingface_hub: a tag that cannot be written is no reason to fail.
            let _ = std::fs::write(&tag, CACHEDIR_TAG);
        }
        Ok(())
    }

    /// Whether the cache can be written: its folders made (or there) and a file created in its
    /// blobs (an unnamed temporary one, gone at once). A mounted, read-only cache has its
    /// folders and `.locks/` already, so making them is no test.
    pub(crate) fn writable(&self) -> bool {
        self.prepare().is_ok() && tempfile::tempfile_in(self.repo.join("blobs")).is_ok()
    }

    /// `refs/<revision>` = `commit`, written atomically (a temporary file renamed), and only
    /// when it says something else.
    pub(crate) fn write_ref(&self, revision: &str, commit: &str) -> io::Result<()> {
        if revision == commit || self.read_ref(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        let path = self.repo.join("refs").join(revision);
        let parent = path.parent().unwrap_or(&self.repo).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| cache_error(&parent, &e))?;
        // A temporary file of a random name, created exclusively: processes that share the
        // cache (containers, each its own process 1) never write the same one.
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("ref");
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            // The umask's mode, as `huggingface_hub` writes a ref (0644 under umask 022).
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(&parent)
            .map_err(|e| cache_error(&parent, &e))?;
        tmp.write_all(commit.as_bytes())
            .map_err(|e| cache_error(tmp.path(), &e))?;
        tmp.persist(&path)
            .map_err(|e| cache_error(&path, &e.error))?;
        Ok(())
    }

    /// `snapshots/<commit>/<path>` -> `../../blobs/<blob>` (relative, one `../` more per folder
    /// of `path`), replacing whatever was there.
    pub(crate) fn link(&self, commit: &str, file: &TreeFile) -> io::Result<()> {
        let parts = staging_core::checked_components(&file.path).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the Hub lists a file {:?}, which {why}", file.path),
            )
        })?;
        let pointer = self.snapshot(commit).join(&file.path);
        let depth = parts.len() - 1 + 2;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(file.blob());
        if std::fs::read_link(&pointer).is_ok_and(|t| t == target) {
            return Ok(());
        }
        if let Some(parent) = pointer.parent() {
            std::fs::create_dir_all(parent).map_err(|e| cache_error(parent, &e))?;
        }
        match std::fs::remove_file(&pointer) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(cache_error(&pointer, &e)),
        }
        match std::os::unix::fs::symlink(&target, &pointer) {
            Ok(()) => Ok(()),
            // Linked at the same moment by another process: the same link is fine.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if std::fs::read_link(&pointer).is_ok_and(|t| t == target) {
                    Ok(())
                } else {
                    Err(cache_error(&pointer, &e))
                }
            }
            Err(e) => Err(cache_error(&pointer, &e)),
        }
    }

    /// Takes the blob's lock (`flock`, as `huggingface_hub`'s filelock), without waiting:
    /// `None` when another process holds it.
    pub(crate) fn try_lock(&self, blob: &str) -> io::Result<Option<File>> {
        let path = self.locks.join(format!("{blob}.lock"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o664)
            .open(&path)
            .map_err(|e| cache_error(&path, &e))?;
        use std::os::fd::AsRawFd;
        // SAFETY: `flock` on a descriptor this function owns (kept open by `file`); it takes
        // no pointer.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Some(file));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        Err(cache_error(&path, &e))
    }

    /// Writes a whole small file (`config.json`, the tokenizer) into its blob and links it,
    /// checked against the size (and for an LFS file the SHA-256) the Hub lists. Nothing is
    /// written when the blob is already there or another process is writing it. Returns the
    /// bytes written into the blob (0 when it was not written here).
    pub(crate) fn put_whole(&self, commit: &str, file: &TreeFile, bytes: &[u8]) -> io::Result<u64> {
        check_whole(file, bytes)?;
        let blob = self.blob(file.blob());
        let mut wrote = 0;
        if !blob.exists() {
            if let Some(_lock) = self.try_lock(file.blob())? {
                if !blob.exists() {
                    let tmp = incomplete(&blob);
                    let written = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&tmp)
                        .and_then(|mut f| f.write_all(bytes))
                        .and_then(|()| std::fs::rename(&tmp, &blob));
                    if let Err(e) = written {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(cache_error(&blob, &e));
                    }
                    wrote = bytes.len() as u64;
                }
            } else {
                // Another process writes it: the link waits for its blob.
                return Ok(0);
            }
        }
        self.link(commit, file).map(|()| wrote)
    }
}

/// Whether `bytes` are `file` as the Hub lists it.
pub(crate) fn check_whole(file: &TreeFile, bytes: &[u8]) -> io::Result<()> {
    if bytes.len() as u64 != file.size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: received {} bytes, the Hub lists {}",
                file.path,
                bytes.len(),
                file.size
            ),
        ));
    }
    if let Some(expected) = &file.sha256 {
        let got = hex(&sha2::Sha256::digest(bytes));
        if &got != expected {
            return Err(mismatch(&file.path, expected, &got));
        }
    }
    Ok(())
}

fn mismatch(path: &str, expected: &str, got: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{path}: the bytes received do not match the SHA-256 the Hub lists for it \
             (expected {expected}, received {got}); nothing of it was written to the cache"
        ),
    )
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// 8 hex digits for a temporary name that processes sharing the cache do not repeat (each
/// container may be its own process 1): the time in nanoseconds, the process id and a counter,
/// mixed. The file is created exclusively (`create_new`) under the blob's lock anyway.
fn unique() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // `RandomState` is seeded from the system's randomness once per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    format!("{:08x}", hasher.finish() as u32)
}

/// `<blob>.<8 hex>.incomplete`, as `huggingface_hub` 2.x names a blob being written.
fn incomplete(blob: &Path) -> PathBuf {
    let mut name = blob.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.incomplete", unique()));
    blob.with_file_name(name)
}

/// The byte ranges written so far, merged.
#[derive(Debug, Default)]
struct Covered(BTreeMap<u64, u64>);

impl Covered {
    fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        // Merge with every range that touches [start, end).
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=end)
            .rev()
            .take_while(|&(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    /// Where the range written from 0 ends.
    fn prefix(&self) -> u64 {
        self.0.get(&0).copied().unwrap_or(0)
    }
}

/// What is happening to one blob.
#[derive(Debug)]
enum Phase {
    /// Being written by this process: into `tmp`, under `lock`.
    Writing {
        file: Arc<File>,
        tmp: PathBuf,
        _lock: File,
    },
    /// Not written by this process: already in the cache, or another process holds its lock.
    Elsewhere,
    /// Committed to the cache.
    Done,
    /// Its bytes were wrong, or writing failed: the error, again for every later read.
    Failed(String),
}

#[derive(Debug)]
struct BlobState {
    phase: Phase,
    covered: Covered,
    /// Bytes of the prefix hashed so far, and the digest once all are.
    hashed: u64,
    digest: Option<String>,
    hash_error: Option<String>,
    stop: bool,
}

/// One weight file being written into its blob.
#[derive(Debug)]
struct Blob {
    file: TreeFile,
    state: Mutex<BlobState>,
    changed: Condvar,
}

impl Blob {
    fn lock(&self) -> MutexGuard<'_, BlobState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The hashing thread: follows the written prefix until the whole file is hashed, or the
    /// blob is given up.
    fn hash(self: Arc<Self>, file: Arc<File>) {
        let mut hasher = sha2::Sha256::new();
        let mut buf = vec![0u8; HASH_CHUNK];
        let size = self.file.size;
        let mut state = self.lock();
        loop {
            while !state.stop && state.hashed < size && state.covered.prefix() <= state.hashed {
                state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            if state.hashed >= size {
                state.digest = Some(hex(&hasher.finalize()));
                self.changed.notify_all();
                return;
            }
            let start = state.hashed;
            let end = state.covered.prefix().min(start + HASH_CHUNK as u64);
            drop(state);
            let len = (end - start) as usize;
            let read = buf
                .get_mut(..len)
                .ok_or_else(|| io::Error::other("hash buffer"))
                .and_then(|piece| file.read_exact_at(piece, start).map(|()| &*piece));
            state = self.lock();
            match read {
                Ok(piece) => {
                    hasher.update(piece);
                    state.hashed = end;
                }
                Err(e) => {
                    state.hash_error = Some(staging_core::io_words(&e));
                    self.changed.notify_all();
                    return;
                }
            }
        }
    }
}

/// The weight files of one load from the Hub, written into the cache as they stream.
#[derive(Debug)]
pub(crate) struct HubCache {
    dirs: RepoCache,
    commit: String,
    /// Bytes committed are counted here.
    counters: Arc<Counters>,
    /// The files the store serves, by object key.
    files: HashMap<String, TreeFile>,
    blobs: Mutex<HashMap<String, Arc<Blob>>>,
}

impl HubCache {
    pub(crate) fn new(
        dirs: RepoCache,
        commit: String,
        files: HashMap<String, TreeFile>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            dirs,
            commit,
            counters,
            files,
            blobs: Mutex::new(HashMap::new()),
        }
    }

    /// The blob of the file at `key`, opened for writing on first use (`None`: not a file this
    /// cache writes).
    fn blob(&self, key: &str) -> io::Result<Option<Arc<Blob>>> {
        let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(blob) = blobs.get(key) {
            return Ok(Some(Arc::clone(blob)));
        }
        let Some(file) = self.files.get(key) else {
            return Ok(None);
        };
        let path = self.dirs.blob(file.blob());
        let phase = if path.exists() {
            Phase::Elsewhere
        } else {
            match self.dirs.try_lock(file.blob())? {
                // Written meanwhile by the process that held the lock.
                Some(_) if path.exists() => Phase::Elsewhere,
                Some(lock) => {
                    let tmp = incomplete(&path);
                    let handle = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&tmp)
                        .map_err(|e| cache_error(&tmp, &e))?;
                    Phase::Writing {
                        file: Arc::new(handle),
                        tmp,
                        _lock: lock,
                    }
                }
                None => Phase::Elsewhere,
            }
        };
        let hash_with = match &phase {
            Phase::Writing { file: handle, .. } if file.sha256.is_some() => {
                Some(Arc::clone(handle))
            }
            _ => None,
        };
        let blob = Arc::new(Blob {
            file: file.clone(),
            state: Mutex::new(BlobState {
                phase,
                covered: Covered::default(),
                hashed: 0,
                digest: None,
                hash_error: None,
                stop: false,
            }),
            changed: Condvar::new(),
        });
        if let Some(handle) = hash_with {
            let hashing = Arc::clone(&blob);
            std::thread::Builder::new()
                .name("staging-hub-hash".into())
                .spawn(move || hashing.hash(handle))
                .map_err(|e| cache_error(&path, &e))?;
        }
        blobs.insert(key.to_owned(), Arc::clone(&blob));
        Ok(Some(blob))
    }

    /// `bytes` of the file at `key` were received at `offset`: written into its blob.
    pub(crate) fn write(&self, key: &str, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let Some(blob) = self.blob(key)? else {
            return Ok(());
        };
        let handle = {
            let state = blob.lock();
            match &state.phase {
                Phase::Writing { file, .. } => Arc::clone(file),
                Phase::Failed(why) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, why.clone()));
                }
                Phase::Elsewhere | Phase::Done => return Ok(()),
            }
        };
        let end = offset + bytes.len() as u64;
        if end > blob.file.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: bytes {offset}..{end} are past its end ({} bytes)",
                    blob.file.path, blob.file.size
                ),
            ));
        }
        if let Err(e) = handle.write_all_at(bytes, offset) {
            let e = cache_error(&self.dirs.blob(blob.file.blob()), &e);
            self.fail(&blob, e.to_string());
            return Err(e);
        }
        let mut state = blob.lock();
        state.covered.insert(offset, end);
        blob.changed.notify_all();
        Ok(())
    }

    /// Gives `blob` up: its temporary file deleted, the error kept for later reads.
    fn fail(&self, blob: &Blob, why: String) {
        let mut state = blob.lock();
        if let Phase::Writing { tmp, .. } = &state.phase {
            let _ = std::fs::remove_file(tmp);
        }
        state.phase = Phase::Failed(why);
        state.stop = true;
        blob.changed.notify_all();
    }

    /// After a read of the file at `key`: once every byte of it is written, checks its SHA-256
    /// and commits it (renamed into `blobs/`, linked from the snapshot), or deletes it and
    /// fails naming it.
    pub(crate) fn commit_if_whole(&self, key: &str) -> io::Result<()> {
        let Some(blob) = self.blob(key)? else {
            return Ok(());
        };
        let size = blob.file.size;
        let mut state = blob.lock();
        match &state.phase {
            Phase::Writing { .. } => {}
            Phase::Failed(why) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, why.clone()));
            }
            Phase::Elsewhere | Phase::Done => return Ok(()),
        }
        if state.covered.prefix() < size {
            return Ok(());
        }
        if let Some(expected) = blob.file.sha256.clone() {
            while state.digest.is_none() && state.hash_error.is_none() && !state.stop {
                state = blob.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            // Another read committed or failed it while this one waited.
            match &state.phase {
                Phase::Failed(why) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, why.clone()));
                }
                Phase::Elsewhere | Phase::Done => return Ok(()),
                Phase::Writing { .. } => {}
            }
            if let Some(why) = state.hash_error.clone() {
                drop(state);
                let e = cache_error(&self.dirs.blob(blob.file.blob()), &io::Error::other(why));
                self.fail(&blob, e.to_string());
                return Err(e);
            }
            let got = state.digest.clone().unwrap_or_default();
            if got != expected {
                drop(state);
                let e = mismatch(&blob.file.path, &expected, &got);
                self.fail(&blob, e.to_string());
                return Err(e);
            }
        }
        let Phase::Writing {
            tmp, _lock: lock, ..
        } = std::mem::replace(&mut state.phase, Phase::Done)
        else {
            return Ok(());
        };
        // The lock is held until the blob is in place: another process that takes it next
        // finds the blob there, and never writes it again or sees it half there.
        let target = self.dirs.blob(blob.file.blob());
        #[cfg(test)]
        tests::before_rename(&self.dirs, blob.file.blob());
        if let Err(e) = std::fs::rename(&tmp, &target) {
            let _ = std::fs::remove_file(&tmp);
            let e = cache_error(&target, &e);
            state.phase = Phase::Failed(e.to_string());
            return Err(e);
        }
        drop(lock);
        drop(state);
        Counters::add(&self.counters.written, size);
        self.dirs.link(&self.commit, &blob.file)
    }

    /// Links every blob another process wrote meanwhile.
    pub(crate) fn link_elsewhere(&self) {
        let blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        for blob in blobs.values() {
            let elsewhere = matches!(blob.lock().phase, Phase::Elsewhere);
            if elsewhere && self.dirs.blob(blob.file.blob()).exists() {
                let _ = self.dirs.link(&self.commit, &blob.file);
            }
        }
    }
}

/// The remote reader writes every byte it reads of the weights here.
impl backend_remote::Tee for HubCache {
    fn received(&self, key: &str, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.write(key, offset, bytes)
    }

    fn settle(&self, key: &str) -> io::Result<()> {
        self.commit_if_whole(key)
    }
}

impl Drop for HubCache {
    fn drop(&mut self) {
        self.link_elsewhere();
        let blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        for blob in blobs.values() {
            let mut state = blob.lock();
            if let Phase::Writing { tmp, .. } = &state.phase {
                let _ = std::fs::remove_file(tmp);
            }
            state.stop = true;
            blob.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Whether the blob's lock was free just before its rename, when a test asks.
        static LOCK_FREE_AT_RENAME: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }

    /// Called by `settle` just before a blob's rename: notes whether its lock could be taken
    /// (as another process would try to).
    pub(super) fn before_rename(dirs: &RepoCache, blob: &str) {
        // `flock` locks belong to the open file: another descriptor is another taker.
        let free = dirs.try_lock(blob).is_ok_and(|taken| taken.is_some());
        LOCK_FREE_AT_RENAME.with(|cell| cell.set(Some(free)));
    }

    #[test]
    fn the_blob_lock_is_held_until_the_blob_is_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = RepoCache::new(dir.path(), "models--org--name");
        dirs.prepare().unwrap();
        let bytes = vec![3u8; 4096];
        let file = tree_file("model.safetensors", &bytes, true);
        let cache = cache_of_one(&dirs, &file);
        cache.write("k", 0, &bytes).unwrap();
        cache.commit_if_whole("k").unwrap();
        assert_eq!(LOCK_FREE_AT_RENAME.with(std::cell::Cell::get), Some(false));
        // And free once it is.
        assert!(dirs.try_lock(file.blob()).unwrap().is_some());
        assert_eq!(std::fs::read(dirs.blob(file.blob())).unwrap(), bytes);
    }

    #[test]
    fn a_ref_is_written_whole_through_a_temporary_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = RepoCache::new(dir.path(), "models--org--name");
        // What a process of the same id elsewhere (another container) left mid-write, under
        // the names the temporary files used to have: never written over, nor in the way.
        let refs = dirs.repo.join("refs");
        std::fs::create_dir_all(&refs).unwrap();
        std::fs::write(refs.join(format!("main.{}.tmp", unique())), "x").unwrap();
        dirs.write_ref("main", COMMIT).unwrap();
        assert_eq!(dirs.read_ref("main").as_deref(), Some(COMMIT));
        let names: Vec<String> = std::fs::read_dir(&refs)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names.len(),
            2,
            "{names:?}: the ref and the stranger's file, no temporary"
        );
    }

    #[test]
    fn covered_ranges_merge() {
        let mut c = Covered::default();
        c.insert(10, 20);
        assert_eq!(c.prefix(), 0);
        c.insert(0, 5);
        assert_eq!(c.prefix(), 5);
        c.insert(5, 10);
        assert_eq!(c.prefix(), 20);
        c.insert(30, 40);
        c.insert(15, 35);
        assert_eq!(c.prefix(), 40);
        assert_eq!(c.0.len(), 1);
        c.insert(50, 50);
        assert_eq!(c.0.len(), 1);
    }

    fn tree_file(path: &str, bytes: &[u8], lfs: bool) -> TreeFile {
        TreeFile {
            path: path.to_owned(),
            size: bytes.len() as u64,
            oid: "0123456789abcdef0123456789abcdef01234567".to_owned(),
            sha256: lfs.then(|| hex(&sha2::Sha256::digest(bytes))),
        }
    }

    const COMMIT: &str = "c0ffee0000000000000000000000000000000000";

    /// A cache for one file, under the key `"k"`, at [`COMMIT`].
    fn cache_of_one(dirs: &RepoCache, file: &TreeFile) -> HubCache {
        HubCache::new(
            dirs.clone(),
            COMMIT.into(),
            HashMap::from([("k".to_owned(), file.clone())]),
            Arc::default(),
        )
    }

    #[test]
    fn a_file_written_out_of_order_is_committed_once_whole_and_right() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = RepoCache::new(dir.path(), "models--org--name");
        dirs.prepare().unwrap();
        let bytes: Vec<u8> = (0..3 * HASH_CHUNK as u32 / 2)
            .map(|i| (i % 251) as u8)
            .collect();
        let file = tree_file("sub/model.safetensors", &bytes, true);
        let cache = cache_of_one(&dirs, &file);
        let half = bytes.len() / 2;
        cache.write("k", half as u64, &bytes[half..]).unwrap();
        cache.commit_if_whole("k").unwrap();
        assert!(!dirs.blob(file.blob()).exists());
        cache.write("k", 0, &bytes[..half]).unwrap();
        cache.commit_if_whole("k").unwrap();
        assert_eq!(std::fs::read(dirs.blob(file.blob())).unwrap(), bytes);
        let pointer = dirs.snapshot(COMMIT).join("sub/model.safetensors");
        assert_eq!(
            std::fs::read_link(&pointer).unwrap(),
            Path::new("../../../blobs").join(file.blob())
        );
        assert_eq!(std::fs::read(&pointer).unwrap(), bytes);
        // Nothing else is left in blobs/.
        assert_eq!(
            std::fs::read_dir(dirs.repo.join("blobs")).unwrap().count(),
            1
        );
        // A file the cache does not write is ignored.
        cache.write("other", 0, b"x").unwrap();
    }

    #[test]
    fn a_wrong_byte_is_never_committed_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = RepoCache::new(dir.path(), "models--org--name");
        dirs.prepare().unwrap();
        let bytes = vec![7u8; 1000];
        let file = tree_file("model.safetensors", &bytes, true);
        let cache = cache_of_one(&dirs, &file);
        let mut wrong = bytes.clone();
        wrong[500] ^= 0xff;
        cache.write("k", 0, &wrong).unwrap();
        let e = cache.commit_if_whole("k").unwrap_err();
        assert!(
            e.to_string().contains("model.safetensors") && e.to_string().contains("SHA-256"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_dir(dirs.repo.join("blobs")).unwrap().count(),
            0
        );
        assert!(!dirs.snapshot(COMMIT).join("model.safetensors").exists());
        // Later reads say so again.
        assert!(cache.commit_if_whole("k").is_err());
        assert!(cache.write("k", 0, &bytes).is_err());
    }

    #[test]
    fn an_unfinished_blob_is_deleted_and_a_held_lock_is_respected() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = RepoCache::new(dir.path(), "models--org--name");
        dirs.prepare().unwrap();
        let bytes = vec![1u8; 100];
        let file = tree_file("a.safetensors", &bytes, true);
        let held = tree_file("b.safetensors", &[2u8; 100], true);
        let held = TreeFile {
            sha256: Some("b".repeat(64)),
            ..held
        };
        let _other_process = dirs.try_lock(held.blob()).unwrap().unwrap();
        let cache = HubCache::new(
            dirs.clone(),
            COMMIT.into(),
            HashMap::from([("a".to_owned(), file), ("b".to_owned(), held)]),
            Arc::default(),
        );
        cache.write("a", 0, &bytes[..50]).unwrap();
        cache.write("b", 0, &[2u8; 100]).unwrap();
        cache.commit_if_whole("b").unwrap();
        let names = |d: &Path| -> Vec<String> {
            std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        };
        let blobs = names(&dirs.repo.join("blobs"));
        assert_eq!(blobs.len(), 1, "{blobs:?}");
        assert!(blobs[0].ends_with(".incomplete"), "{blobs:?}");
        drop(cache);
        assert!(names(&dirs.repo.join("blobs")).is_empty());
    }

    #[test]
    fn refs_and_small_files_are_written_as_huggingface_hub_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = RepoCache::new(dir.path(), "models--org--name");
        dirs.prepare().unwrap();
        dirs.write_ref("main", COMMIT).unwrap();
        assert_eq!(
            std::fs::read_to_string(dirs.repo.join("refs/main")).unwrap(),
            COMMIT
        );
        assert_eq!(dirs.read_ref("main").as_deref(), Some(COMMIT));
        dirs.write_ref(COMMIT, COMMIT).unwrap();
        assert!(!dirs.repo.join("refs").join(COMMIT).exists());
        let config = tree_file("config.json", b"{}", false);
        dirs.put_whole(COMMIT, &config, b"{}").unwrap();
        assert_eq!(
            std::fs::read(dirs.snapshot(COMMIT).join("config.json")).unwrap(),
            b"{}"
        );
        assert!(dirs.put_whole(COMMIT, &config, b"{ }").is_err());
        let tag = std::fs::read_to_string(dir.path().join("CACHEDIR.TAG")).unwrap();
        assert!(tag.starts_with("Signature: 8a477f597d28d172789f06886806bc55\n"));
        let hostile = TreeFile {
            path: "../../escape".into(),
            ..config
        };
        assert!(dirs.link(COMMIT, &hostile).is_err());
    }
}
