//! [`Prepared`]: a loader whose backend is open. It opens checkpoints (local, or URLs through
//! one store kept for every load of objects in it), reads their headers, asks a store afresh
//! what its objects are when a checkpoint is opened again, and starts each load.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use staging_core::{
    Checkpoint, Destination, DeviceAllocator, HostMemory, IoThreads, KeepOpen, OpenFiles,
    RawDestination, Reader, Selection, ShardFile, StagingPolicy, Wanted,
};

#[cfg(doc)]
use super::Loader;
use super::mapped::{MapCache, MapDecision, MappedLoad};
use super::source::{HubFacts, Source, is_hub};
use super::{Load, Setup};
use crate::backend::{Chosen, OnReader};
use crate::error::Result;
use crate::space::{AnyDestination, KnownSpace};

/// The I/O threads a load from a URL uses at least (fewer when fewer requests may be in flight).
#[cfg(feature = "remote")]
const REMOTE_IO_THREADS: usize = 8;

/// A loader whose backend is open ([`Loader::prepare`]): it opens any number of loads, one
/// after another or at once, all on that backend (its device, driver, pinned buffers and memory
/// accounting opened once), each with the same options, and a URL's store opened once for every
/// load of objects in it. A destination serves one load: the one opened next
/// ([`destination`](Self::destination)).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
/// # let mut file = (header.len() as u64).to_le_bytes().to_vec();
/// # file.extend_from_slice(header);
/// # file.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
/// # std::fs::write(dir.path().join("model.safetensors"), file)?;
/// # let (model, draft) = (dir.path(), dir.path());
/// use safetensors_staging::Loader;
///
/// let mut prepared = Loader::new().prepare()?;
/// let weights: Vec<_> = prepared.open(model)?.collect::<Result<_, _>>()?;
/// let draft_weights: Vec<_> = prepared.open(draft)?.collect::<Result<_, _>>()?;
/// assert_eq!(weights.len(), draft_weights.len());
/// # Ok(())
/// # }
/// ```
pub struct Prepared<'d> {
    #[cfg(feature = "remote")]
    pub(super) remote: backend_remote::Options,
    /// How Hub paths are read.
    #[cfg(feature = "remote")]
    pub(super) hub_options: backend_hub::HubOptions,
    /// The store opened for the headers ([`read_headers`](Self::read_headers)), reused by the
    /// load: one client, one runtime, and the versions its `HEAD`s recorded.
    #[cfg(feature = "remote")]
    pub(super) store: Option<backend_remote::Remote>,
    /// The caller's object store, if one was given ([`Loader::object_store`]).
    #[cfg(feature = "remote")]
    pub(super) object_store: Option<Arc<dyn backend_remote::ObjectStore>>,
    pub(super) chosen: Chosen,
    pub(super) policy: StagingPolicy,
    pub(super) suballocate: bool,
    pub(super) selection: Selection,
    /// The destination of the load opened next (none after it).
    pub(super) destination: AnyDestination<'d>,
    /// The files loads have opened, kept open for the next ones ([`keep_files_open`]).
    ///
    /// [`keep_files_open`]: Self::keep_files_open
    pub(super) files: Option<OpenFiles>,
    /// The mappings of the files kept open, when loads map their files.
    pub(super) maps: Option<MapCache>,
    /// Whether loads map their local files (decided once, when the backend was opened).
    pub(super) map: MapDecision,
    /// Whether each file loads have asked about is on a network or user-space file system
    /// (where they do not map), asked once per file.
    pub(super) remote_fs: std::collections::HashMap<Arc<Path>, bool>,
    /// The I/O threads of every load, by how many there are (a URL's loads use more).
    pub(super) threads: Vec<IoThreads>,
    /// What the Hub path opened last opened to (its loads' reports carry it).
    pub(super) hub: Option<HubFacts>,
}

impl fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("backend", &self.backend_name())
            .field("passed_over", &self.chosen.passed_over)
            .finish()
    }
}

impl<'d> Prepared<'d> {
    /// The backend chosen: `host`, `cufile`, `hipfile` or `mock`.
    pub fn backend_name(&self) -> &'static str {
        self.chosen.opened.name()
    }

    /// What the Hugging Face Hub path opened last (by [`open`](Self::open) or
    /// [`read_headers`](Self::read_headers)) opened to, as a load's report gives it
    /// (`LoadReport::hub`), before any tensor is read: the commit the revision named, the files
    /// and the snapshot. `None` when the checkpoint opened last is not a Hub path.
    pub fn hub_report(&self) -> Option<staging_core::HubReport> {
        self.hub.as_ref().map(|hub| hub.report(0))
    }

    /// Each backend `auto` passed over, with why (`"cufile: no CUDA driver: ..."`).
    pub fn passed_over(&self) -> &[String] {
        &self.chosen.passed_over
    }

    /// Why the backend runs its POSIX path, when `auto` mode made it do so (no usable
    /// `libcufile`, for example).
    pub fn mode_reason(&self) -> Option<&str> {
        self.chosen.mode_reason.as_deref()
    }

    /// Opens the checkpoint at `path` (a directory, an index file, or one `.safetensors` file;
    /// or the same at an `s3://`, `gs://`, `az://` or `http(s)://` URL, a prefix standing for a
    /// directory).
    pub fn open(&mut self, path: impl AsRef<Path>) -> Result<Load<'d>> {
        let path = path.as_ref();
        let selection = self.selection.clone();
        let wants = |name: &str| selection.wants(name);
        let wanted: Option<Wanted<'_>> = self.narrows().then_some(&wants);
        if let Some((source, paths)) = self.hub_source(path)? {
            let checkpoint = source.read_headers(&paths, wanted)?;
            return self.load(checkpoint, source);
        }
        let source = self.source_of(path, Revalidate::Yes)?;
        let checkpoint = source.open(path, wanted)?;
        self.load(checkpoint, source)
    }

    /// Opens these `.safetensors` files (all local, or all URLs in one store) as one checkpoint.
    pub fn open_files<I, P>(&mut self, files: I) -> Result<Load<'d>>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<Path>,
    {
        let files: Vec<P> = files.into_iter().collect();
        refuse_hub_among(&files)?;
        self.hub = None;
        let source = match files.first() {
            Some(first) => self.source_of(first.as_ref(), Revalidate::Yes)?,
            None => Source::Local,
        };
        let checkpoint = source.open_files(&files)?;
        self.load(checkpoint, source)
    }

    /// Loads a checkpoint already opened (its files on the local file system, or URLs of one
    /// store).
    pub fn open_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<Load<'d>> {
        let source = match checkpoint.files().first() {
            // The versions its headers were read at are the ones this load reads.
            Some(first) => self.source_of(&first.path, Revalidate::No)?,
            None => Source::Local,
        };
        self.load(checkpoint, source)
    }

    /// Whether a load of `checkpoint` (already opened) with no destination hands out its
    /// tensors as mappings of their files ([`StagingPath::Mapped`](crate::StagingPath::Mapped)): host tensors from local
    /// files, where this loader maps. A load may still read instead, when the system has no
    /// memory for a mapping.
    pub fn maps(&mut self, checkpoint: &Checkpoint) -> Result<bool> {
        let source = match checkpoint.files().first() {
            Some(first) => self.source_of(&first.path, Revalidate::No)?,
            None => Source::Local,
        };
        Ok(self.maps_from(&source, checkpoint))
    }

    /// Whether loads of `checkpoint` from `source` map its files.
    fn maps_from(&mut self, source: &Source, checkpoint: &Checkpoint) -> bool {
        matches!(source, Source::Local)
            && super::mapped::maps(self.map, checkpoint, &mut self.remote_fs)
    }

    /// Columns `columns` (a range of dimension 1) of every row of the one tensor of
    /// `checkpoint` (narrowed to it, and to rows of it, by [`Checkpoint::only`]), copied into
    /// host memory of their own, reading only those columns: for a tensor-parallel rank that
    /// keeps a share of a tensor's columns, and for slices of an inner dimension.
    ///
    /// Served where this loader's loads map their files (host tensors from local files; see
    /// [`HostOptions::map`](crate::HostOptions::map)): the columns are copied out of the
    /// mapping, and only the pages holding them are read. `Ok(None)` elsewhere (a GPU, no
    /// mapping, a URL, a tensor whose rows are not runs of whole bytes): read the rows and
    /// take their columns.
    ///
    /// Returns the tensor, whose shape has `columns.len()` in dimension 1, and the read's
    /// report.
    pub fn read_columns(
        &mut self,
        checkpoint: &Checkpoint,
        columns: std::ops::Range<usize>,
    ) -> Result<Option<(crate::Tensor, crate::LoadReport)>> {
        let Some(first) = checkpoint.files().first() else {
            return Ok(None);
        };
        if !matches!(self.source_of(&first.path, Revalidate::No)?, Source::Local)
            || !matches!(self.destination, AnyDestination::None)
            || !super::mapped::maps(self.map, checkpoint, &mut self.remote_fs)
        {
            return Ok(None);
        }
        Ok(super::columns::read_columns(
            checkpoint,
            self.maps.as_ref(),
            columns,
        )?)
    }

    /// A Hub path's source and what to open in it (see `Source::hub`); its store is kept for
    /// the loads of the checkpoint read here ([`open_checkpoint`](Self::open_checkpoint)).
    fn hub_source(&mut self, path: &Path) -> Result<Option<(Source, Vec<std::path::PathBuf>)>> {
        let found = Source::hub(
            path,
            #[cfg(feature = "remote")]
            &self.remote,
            #[cfg(feature = "remote")]
            &self.hub_options,
        )?;
        // The facts of the model opened last go with the loads of what was read of it.
        self.hub = None;
        let Some((source, paths, facts)) = found else {
            return Ok(None);
        };
        #[cfg(feature = "remote")]
        if let Source::Remote(store) = &source {
            self.store = Some(store.clone());
        }
        self.hub = Some(facts);
        Ok(Some((source, paths)))
    }

    /// Where `path` is read from: a URL's store (the one already open when it holds `path`,
    /// asked afresh what its objects are when `revalidate` says so: a checkpoint opened again
    /// sees an object replaced since), or the local file system.
    fn source_of(&mut self, path: &Path, revalidate: Revalidate) -> Result<Source> {
        #[cfg(feature = "remote")]
        if let Some(store) = self.store.as_ref().filter(|s| s.holds(path)) {
            if revalidate == Revalidate::Yes {
                store.revalidate();
            }
            return Ok(Source::Remote(store.clone()));
        }
        #[cfg(not(feature = "remote"))]
        let _ = revalidate;
        let source = Source::of(
            path,
            #[cfg(feature = "remote")]
            || {
                Ok(backend_remote::Remote::open_with(
                    path,
                    self.object_store.clone(),
                    &self.remote,
                )?)
            },
        )?;
        #[cfg(feature = "remote")]
        if let Source::Remote(store) = &source {
            self.store = Some(store.clone());
        }
        Ok(source)
    }

    /// Reads and checks the headers of the checkpoint at `paths` (as
    /// [`Loader::read_headers`]), through the store this load will read from: a load of the
    /// result ([`open_checkpoint`](Self::open_checkpoint)) opens no second client and asks
    /// nothing again of what was asked here.
    ///
    /// With a selection ([`select`](Self::select), or the loader's), a checkpoint with an
    /// index reads only the headers of the shards holding a selected tensor, and holds only
    /// those shards ([`Checkpoint::open_for_in`]); its
    /// [`headers_read`](Checkpoint::headers_read) says how many were read.
    pub fn read_headers<P: AsRef<Path>>(&mut self, paths: &[P]) -> Result<Checkpoint> {
        let selection = self.selection.clone();
        let wants = |name: &str| selection.wants(name);
        let wanted: Option<Wanted<'_>> = self.narrows().then_some(&wants);
        self.read_headers_wanted(paths, wanted)
    }

    /// [`read_headers`](Self::read_headers) for the tensors that both the selection and
    /// `wanted` accept (a caller's own choice, made by name): a checkpoint with an index reads
    /// only the headers of the shards holding one. `wanted` is asked once for each name the
    /// index lists (none when there is no index), before any header is read.
    pub fn read_headers_for<P: AsRef<Path>>(
        &mut self,
        paths: &[P],
        wanted: Wanted<'_>,
    ) -> Result<Checkpoint> {
        let selection = self.selection.clone();
        let narrows = self.narrows();
        let both = |name: &str| (!narrows || selection.wants(name)) && wanted(name);
        self.read_headers_wanted(paths, Some(&both))
    }

    fn read_headers_wanted<P: AsRef<Path>>(
        &mut self,
        paths: &[P],
        wanted: Option<Wanted<'_>>,
    ) -> Result<Checkpoint> {
        if let [one] = paths
            && let Some((source, found)) = self.hub_source(one.as_ref())?
        {
            return source.read_headers(&found, wanted);
        }
        refuse_hub_among(paths)?;
        self.hub = None;
        match paths.first() {
            Some(first) => self
                .source_of(first.as_ref(), Revalidate::Yes)?
                .read_headers(paths, wanted),
            None => Ok(Checkpoint::from_files::<_, &Path>([])?),
        }
    }

    /// Whether the selection narrows what is loaded (then an index reads only the headers of
    /// the shards holding what it selects).
    fn narrows(&self) -> bool {
        !self.selection.is_all()
    }

    /// Keeps the files loads open open for the loads after it (on cuFile and hipFile,
    /// registered), until this is dropped or [`close_files`](Self::close_files): for a reader
    /// that asks for tensors one at a time, one small load each. At most
    /// [`OpenFiles::KEPT`] files (and 256 mappings), the least recently used closed first. A
    /// file kept is checked through its descriptor (a file renamed over it since is not read;
    /// one written in place is refused); one opened again is checked to be the file its header
    /// was read from.
    pub fn keep_files_open(&mut self) {
        self.files.get_or_insert_with(OpenFiles::default);
        if self.map != MapDecision::No {
            self.maps.get_or_insert_with(MapCache::default);
        }
    }

    /// Keeps files open as [`keep_files_open`](Self::keep_files_open) does, and opens the files
    /// of `checkpoint` (its headers read by this loader) now: mapped, where loads of it map
    /// (up to 256 files), else opened by the backend's reader (up to
    /// [`OpenFiles::KEPT`]). Loads of `checkpoint` then read those files as they were when
    /// their headers were read, whatever their paths name later (a new file renamed over one
    /// is not read; one changed in place is refused), as `safetensors` serves the file it
    /// opened. A file past those (or closed since, for a checkpoint of more files) is opened
    /// again by its path when it is read, and refused if it is not the file its header was
    /// read from. URLs are asked for their objects when read, as before.
    pub fn keep_files_open_for(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.keep_files_open();
        let Some(first) = checkpoint.files().first() else {
            return Ok(());
        };
        let source = self.source_of(&first.path, Revalidate::No)?;
        if !matches!(source, Source::Local) {
            return Ok(());
        }
        let shards: Vec<ShardFile> = super::mapped::used_files(checkpoint).cloned().collect();
        if self.maps_from(&source, checkpoint) {
            if let Some(cache) = &self.maps {
                for shard in shards.iter().take(super::mapped::MAPS_KEPT) {
                    if cache.get_or_map(shard)?.is_none() {
                        break; // no memory for a mapping: the loads read instead
                    }
                }
            }
            return Ok(());
        }
        let files = self.files.clone().unwrap_or_default();
        let count = shards.len().min(OpenFiles::KEPT);
        self.with_reader(
            source,
            Bind {
                files: &files,
                shards: &shards[..count],
            },
        )
    }

    /// Closes the files kept open (each when the last load reading it ends); later loads open
    /// files again, and keep them if [`keep_files_open`](Self::keep_files_open) was called.
    pub fn close_files(&mut self) {
        if let Some(files) = &self.files {
            files.clear();
        }
        if let Some(maps) = &self.maps {
            maps.clear();
        }
    }

    /// How many files are kept open or mapped.
    pub fn files_open(&self) -> usize {
        self.files.as_ref().map_or(0, OpenFiles::len) + self.maps.as_ref().map_or(0, MapCache::len)
    }

    /// How many descriptors the files kept open hold (a mapping holds none; a few descriptors
    /// of mapped files are kept to ask the page cache about them).
    pub fn descriptors_open(&self) -> usize {
        self.files.as_ref().map_or(0, OpenFiles::len)
            + self.maps.as_ref().map_or(0, MapCache::descriptors_open)
    }

    /// The I/O threads loads with `policy` read on: started by the first load that needs that
    /// many, shared by every load after it (loads at once share them too).
    fn threads_for(&mut self, policy: &StagingPolicy) -> Result<IoThreads> {
        let wanted = policy.io_threads();
        if let Some(threads) = self.threads.iter().find(|t| t.count() == wanted) {
            return Ok(threads.clone());
        }
        let threads = IoThreads::new(wanted)?;
        self.threads.push(threads.clone());
        Ok(threads)
    }

    /// Replaces the selection of the loads opened from now on (for a caller that chooses
    /// tensors from the headers it read with [`read_headers`](Self::read_headers)).
    pub fn select(&mut self, selection: Selection) {
        self.selection = selection;
    }

    /// Reads tensors the destination accepts straight into its memory, in the load opened next
    /// (replacing any destination not used yet); the loads after it have none unless given one
    /// again. Its memory space must be the one the backend loads into, as for
    /// [`Loader::destination`].
    pub fn destination<S, D>(&mut self, destination: D)
    where
        S: KnownSpace,
        D: Destination<S> + Send + 'd,
    {
        self.destination = S::wrap(Box::new(destination));
    }

    /// Reads tensors the destination accepts straight into the raw regions it gives, in the load
    /// opened next, as [`destination`](Self::destination).
    pub fn raw_destination<D>(&mut self, destination: D)
    where
        D: RawDestination + Send + 'd,
    {
        self.destination = AnyDestination::Raw(Box::new(destination));
    }

    /// Runs `task` with the reader and allocator this loader's backend reads `source` with.
    fn with_reader<T: OnReader<'d>>(&self, source: Source, task: T) -> Result<T::Output> {
        match source {
            Source::Local => self.chosen.opened.with_reader(None, task),
            #[cfg(feature = "remote")]
            Source::Remote(remote) => self.chosen.opened.with_reader(Some(&remote), task),
        }
    }

    fn load(&mut self, checkpoint: Checkpoint, source: Source) -> Result<Load<'d>> {
        // Narrowing copies every tensor's metadata: only when there is something to narrow.
        let checkpoint = if self.selection.is_all() {
            checkpoint
        } else {
            checkpoint.select(&self.selection)?
        };
        // Host tensors from local files: mappings of the files, when the loader maps; a
        // destination in host memory is read into from the files. With no memory to map
        // the first file (an allocation failure), the load reads into memory of its own;
        // a later file with none is read tensor by tensor (`MappedLoad::map_one`).
        if matches!(
            self.destination,
            AnyDestination::None | AnyDestination::Host(_) | AnyDestination::Raw(_)
        ) && self.maps_from(&source, &checkpoint)
        {
            // Threads only for copies into a destination: a load that hands out mappings
            // copies nothing.
            let threads = if matches!(self.destination, AnyDestination::None) {
                IoThreads::new(1)?
            } else {
                self.threads_for(&self.policy.clone())?
            };
            // Copied in batches where the destination promises disjoint regions.
            let batches =
                matches!(&self.destination, AnyDestination::Raw(raw) if raw.regions_disjoint());
            let declines_all = matches!(self.destination, AnyDestination::None);
            let destination = <HostMemory as crate::space::sealed::Sealed>::unwrap(
                std::mem::replace(&mut self.destination, AnyDestination::None),
                "host",
            )?;
            let cache = self.maps.as_ref();
            match MappedLoad::open(
                checkpoint.clone(),
                cache,
                destination,
                threads,
                batches,
                declines_all,
            )? {
                Ok(mapped) => {
                    return Ok(Load {
                        inner: Box::new(mapped),
                        passed_over: self.chosen.passed_over.clone(),
                        mode_reason: self.chosen.mode_reason.clone(),
                        hub: self.hub.clone(),
                        #[cfg(feature = "mock")]
                        ledger: None,
                    });
                }
                // No memory for a mapping: the destination serves the load that reads instead.
                Err(destination) => self.destination = AnyDestination::Host(destination),
            }
        }
        let policy = match &source {
            Source::Local => self.policy.clone(),
            // Threads reading a URL wait on the network, not a disk: enough of them to keep
            // `concurrency` requests in flight, up to 8. On loopback (no latency to hide) 2
            // threads loaded 1 GiB at 1.37 GB/s and 8 at 1.46 (medians of 6, 2-core VM).
            #[cfg(feature = "remote")]
            Source::Remote(_) => {
                let threads = self
                    .policy
                    .io_threads()
                    .max(self.remote.concurrency.min(REMOTE_IO_THREADS));
                self.policy.to_builder().io_threads(threads).build()?
            }
        };
        let setup = Setup {
            checkpoint,
            threads: self.threads_for(&policy)?,
            files: self.files.clone(),
            policy,
            suballocate: self.suballocate,
            // A destination serves the one load it was given for.
            destination: std::mem::replace(&mut self.destination, AnyDestination::None),
        };
        #[cfg(feature = "mock")]
        let ledger = self.chosen.opened.ledger();
        // Each load reads through a reader of its own, on what the backend's loads share.
        let inner = self.with_reader(source, setup)?;
        Ok(Load {
            inner,
            passed_over: self.chosen.passed_over.clone(),
            mode_reason: self.chosen.mode_reason.clone(),
            hub: self.hub.clone(),
            #[cfg(feature = "mock")]
            ledger,
        })
    }
}

/// Opens files into the files a reader keeps ([`OpenFiles`]), each checked against the identity
/// its header was read with: a reader's handle is bound to the files as they were when it read
/// their headers.
struct Bind<'a> {
    files: &'a OpenFiles,
    shards: &'a [ShardFile],
}

impl<'d> OnReader<'d> for Bind<'_> {
    type Output = ();

    fn run<R, A>(self, reader: R, _: A, _: &str) -> Result<()>
    where
        R: Reader + 'd,
        R::File: 'static,
        R::Space: KnownSpace,
        A: DeviceAllocator<Space = R::Space> + 'static,
        A::Buffer: Sync + 'static,
    {
        let reader = KeepOpen::new(reader, self.files.clone());
        for shard in self.shards {
            let opened = |source| staging_core::Error::Open {
                file: shard.path.to_path_buf(),
                source,
            };
            let check = |file: &_| match reader.identity_of(file) {
                Some(now) => shard.identity.compare(&now),
                None => reader.verify_unchanged(&shard.path, &shard.identity),
            };
            let file = reader.open(&shard.path).map_err(opened)?;
            if check(&file).is_ok() {
                continue;
            }
            // A file kept from an older header of this path: opened anew once.
            let file = reader.reopen(&shard.path).map_err(opened)?;
            check(&file).map_err(|detail| staging_core::Error::FileChanged {
                file: shard.path.to_path_buf(),
                detail,
            })?;
        }
        Ok(())
    }
}

/// A Hub path is one checkpoint, given alone: never one of several files.
pub(super) fn refuse_hub_among<P: AsRef<Path>>(paths: &[P]) -> Result<()> {
    match paths.iter().find(|p| is_hub(p.as_ref())) {
        Some(hub) => Err(staging_core::Error::Io {
            path: hub.as_ref().to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a Hub path (hf://) names a whole checkpoint: give it alone, not as one of \
                 several files (hf://org/name/file.safetensors names one file)",
            ),
        }
        .into()),
        None => Ok(()),
    }
}

/// Whether a store already open is asked afresh what its objects are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Revalidate {
    /// A checkpoint is being opened: each object as it is now.
    Yes,
    /// A checkpoint already opened is being loaded: the versions its headers were read at.
    No,
}
