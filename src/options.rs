//! [`LoadOptions`]: every setting of a load as plain data, with the one parser of their
//! spellings. The doors only spell: `stage`'s flags, Python's keywords and C's
//! `stg_config_set(config, key, value)` each hand `(key, value)` pairs (or typed values) to
//! [`LoadOptions::set`], and [`LoadOptions::loader`] turns the result into a [`Loader`]. What
//! `auto` means, and what "a GPU was asked for" means, is decided in [`crate::backend`] from
//! [`Device`] and [`BackendKind`], for every door alike.

use std::path::PathBuf;
use std::str::FromStr;

use staging_core::{RowRange, Selection, StagingPolicy};

use crate::backend::{AutoOptions, Backend, HostOptions};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::loader::Loader;

/// Which backend loads the tensors, by name (its options are the other fields of
/// [`LoadOptions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BackendKind {
    /// Decided by the [`Device`]: a GPU backend (cuFile, then hipFile) when the device is a GPU
    /// or `auto`, the host backend for `cpu` or when `auto` finds no GPU.
    #[default]
    Auto,
    /// System memory standing for the device.
    Host,
    /// NVIDIA GPUs through cuFile.
    Cufile,
    /// AMD GPUs through hipFile.
    Hipfile,
    /// The host backend behind the mock's ledger (builds with the `mock` feature only).
    Mock,
}

impl BackendKind {
    /// The name, as every door spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Host => "host",
            Self::Cufile => "cufile",
            Self::Hipfile => "hipfile",
            Self::Mock => "mock",
        }
    }
}

impl FromStr for BackendKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text.trim() {
            "auto" => Self::Auto,
            "host" => Self::Host,
            "cufile" => Self::Cufile,
            "hipfile" => Self::Hipfile,
            "mock" => Self::Mock,
            _ => return Err("expected auto, host, cufile, hipfile or mock".into()),
        })
    }
}

/// How the cuFile backend reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CufileMode {
    /// GDS if nvidia-fs is loaded, else cuFile's compatibility mode, else POSIX.
    #[default]
    Auto,
    /// GPUDirect Storage only.
    Gds,
    /// cuFile's compatibility mode.
    Compat,
    /// No libcufile: `pread` into pinned buffers, then host-to-device copies.
    Posix,
}

impl FromStr for CufileMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text.trim() {
            "auto" => Self::Auto,
            "gds" => Self::Gds,
            "compat" => Self::Compat,
            "posix" => Self::Posix,
            _ => return Err("expected auto, gds, compat or posix".into()),
        })
    }
}

/// How the hipFile backend reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HipfileMode {
    /// hipFile (its fastpath or its own fallback); per file POSIX when a file cannot be
    /// registered.
    #[default]
    Auto,
    /// hipFile only.
    Hipfile,
    /// No libhipfile: `pread` into pinned buffers, then host-to-device copies.
    Posix,
}

impl FromStr for HipfileMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text.trim() {
            "auto" => Self::Auto,
            "hipfile" => Self::Hipfile,
            "posix" => Self::Posix,
            _ => return Err("expected auto, hipfile or posix".into()),
        })
    }
}

/// Every setting of a load, as plain data: what `stage`'s flags, Python's keywords and C's
/// `stg_config_set` keys all spell, one field per key of [`LoadOptions::KEYS`]. `None` keeps the
/// library's default. Two doors given the same settings produce equal options. `Debug` (what
/// `stage --print-options`, C's `stg_config_describe` and Python's `_options` print) shows no
/// secret: a store option that may hold one reads `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// `backend`: which backend loads (default `auto`).
    pub backend: BackendKind,
    /// `device`: where the tensors go (default `auto`).
    pub device: Device,
    /// `memory_cap`: device bytes the load may use: the host backend's capacity, or a budget
    /// replacing a GPU's free-memory figure.
    pub memory_cap: Option<u64>,
    /// `chunk_size`: the largest single read; also the staging buffer's size unless
    /// `staging_size` is set.
    pub chunk_size: Option<usize>,
    /// `staging_size`: the size of each device staging buffer of host assembly.
    pub staging_size: Option<usize>,
    /// `headroom_min`: the headroom's floor, in bytes (`max(headroom_min, len / divisor)`).
    pub headroom_min: Option<u64>,
    /// `headroom_divisor`: the headroom's divisor.
    pub headroom_divisor: Option<u64>,
    /// `threads`: I/O threads.
    pub threads: Option<usize>,
    /// `staging_slots`: staging buffers host assembly uses at once.
    pub staging_slots: Option<usize>,
    /// `coalesce_below`: back-to-back tensors smaller than this are read together.
    pub coalesce_below: Option<usize>,
    /// `suballocate`: tensors under 1 MiB are carved from shared blocks (default true).
    pub suballocate: bool,
    /// `direct_io`: the host backend reads with `O_DIRECT` (default false).
    pub direct_io: bool,
    /// `cufile_mode`: how cuFile reads (default `auto`).
    pub cufile_mode: CufileMode,
    /// `cufile_lib`: an explicit libcufile path.
    pub cufile_lib: Option<PathBuf>,
    /// `hipfile_mode`: how hipFile reads (default `auto`).
    pub hipfile_mode: HipfileMode,
    /// `hipfile_lib`: an explicit libhipfile path.
    pub hipfile_lib: Option<PathBuf>,
    /// `hip_lib`: an explicit HIP runtime path.
    pub hip_lib: Option<PathBuf>,
    /// `select` (repeatable): tensors to load, by glob; a pattern without `*?[]{}` is a name,
    /// and a name the checkpoint does not hold is an error. None: every tensor.
    pub select: Vec<String>,
    /// `rows` (repeatable, `GLOB=START:END` or `GLOB=RANK/PARTS`): rows of dimension 0 to load
    /// of the tensors matching GLOB (the first rule that matches wins; a GLOB that is a name
    /// must exist).
    pub rows: Vec<(String, RowRange)>,
    /// `concurrency`: for a URL, ranged GETs in flight.
    pub concurrency: Option<usize>,
    /// `range_size`: for a URL, bytes per ranged GET.
    pub range_size: Option<usize>,
    /// `retries`: for a URL, retries of a transiently failed request.
    pub retries: Option<usize>,
    /// `bandwidth`: for a URL, at most this many bytes per second.
    pub bandwidth: Option<u64>,
    /// `store_option` (repeatable, `KEY=VALUE`): object_store options, after the environment.
    pub store_options: Vec<(String, String)>,
    /// `allow_redirect` (repeatable): for a URL, a host a redirect may lead to besides the one
    /// asked for (`cdn.example.com`, `*.example.com`, or `*` for any).
    pub allow_redirects: Vec<String>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field by name, so that a new one cannot be left out of the dump unnoticed.
        let Self {
            backend,
            device,
            memory_cap,
            chunk_size,
            staging_size,
            headroom_min,
            headroom_divisor,
            threads,
            staging_slots,
            coalesce_below,
            suballocate,
            direct_io,
            cufile_mode,
            cufile_lib,
            hipfile_mode,
            hipfile_lib,
            hip_lib,
            select,
            rows,
            concurrency,
            range_size,
            retries,
            bandwidth,
            store_options,
            allow_redirects,
        } = self;
        f.debug_struct("LoadOptions")
            .field("backend", backend)
            .field("device", device)
            .field("memory_cap", memory_cap)
            .field("chunk_size", chunk_size)
            .field("staging_size", staging_size)
            .field("headroom_min", headroom_min)
            .field("headroom_divisor", headroom_divisor)
            .field("threads", threads)
            .field("staging_slots", staging_slots)
            .field("coalesce_below", coalesce_below)
            .field("suballocate", suballocate)
            .field("direct_io", direct_io)
            .field("cufile_mode", cufile_mode)
            .field("cufile_lib", cufile_lib)
            .field("hipfile_mode", hipfile_mode)
            .field("hipfile_lib", hipfile_lib)
            .field("hip_lib", hip_lib)
            .field("select", select)
            .field("rows", rows)
            .field("concurrency", concurrency)
            .field("range_size", range_size)
            .field("retries", retries)
            .field("bandwidth", bandwidth)
            .field("store_options", &redacted_store_options(store_options))
            .field("allow_redirects", allow_redirects)
            .finish()
    }
}

/// `options` as they may be shown: the remote backend's redaction of secret values, or (in a
/// build without it) every value redacted.
fn redacted_store_options(options: &[(String, String)]) -> Vec<(String, String)> {
    #[cfg(feature = "remote")]
    {
        backend_remote::redacted_options(options)
    }
    #[cfg(not(feature = "remote"))]
    {
        options
            .iter()
            .map(|(key, _)| (key.clone(), "<redacted>".to_owned()))
            .collect()
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            backend: BackendKind::Auto,
            device: Device::Auto,
            memory_cap: None,
            chunk_size: None,
            staging_size: None,
            headroom_min: None,
            headroom_divisor: None,
            threads: None,
            staging_slots: None,
            coalesce_below: None,
            suballocate: true,
            direct_io: false,
            cufile_mode: CufileMode::Auto,
            cufile_lib: None,
            hipfile_mode: HipfileMode::Auto,
            hipfile_lib: None,
            hip_lib: None,
            select: Vec::new(),
            rows: Vec::new(),
            concurrency: None,
            range_size: None,
            retries: None,
            bandwidth: None,
            store_options: Vec::new(),
            allow_redirects: Vec::new(),
        }
    }
}

/// What a value of a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueKind {
    /// A name from a fixed list.
    Choice,
    /// A byte size (`4096`, `512MiB`, `2GiB`, `1MB`).
    Size,
    /// A whole number.
    Count,
    /// `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
    Bool,
    /// A file path.
    Path,
    /// A repeatable text (each `set` adds one).
    Repeated,
}

impl LoadOptions {
    /// Every key [`set`](Self::set) takes, with what its value is and a line of help. `stage` spells key `k` as
    /// the flag `--k` (underscores as dashes), Python as the keyword `k` (`store_options` a
    /// mapping, `select`/`rows` collections), C as `stg_config_set(config, "k", value)`.
    pub const KEYS: &'static [(&'static str, ValueKind, &'static str)] = &[
        (
            "backend",
            ValueKind::Choice,
            "Which backend loads the tensors: auto (decided by the device), host, cufile, hipfile, mock (builds with the `mock` feature only)",
        ),
        (
            "device",
            ValueKind::Choice,
            "Where the tensors go: auto (a GPU when one is usable, else host memory), cpu, cuda, cuda:N or N (a GPU, or an error), hip or hip:N (hipFile only)",
        ),
        (
            "memory_cap",
            ValueKind::Size,
            "Device bytes the load may use, e.g. 512MiB: the host backend's capacity, or a budget replacing a GPU's free-memory figure",
        ),
        (
            "chunk_size",
            ValueKind::Size,
            "Largest single read; also the staging buffer's size unless staging_size is set (default 16MiB)",
        ),
        (
            "staging_size",
            ValueKind::Size,
            "Size of each device staging buffer of host assembly (default: chunk_size)",
        ),
        (
            "headroom_min",
            ValueKind::Size,
            "A tensor gets its own device buffer when free memory leaves max(headroom_min, size / headroom_divisor) (default 256MiB)",
        ),
        (
            "headroom_divisor",
            ValueKind::Count,
            "See headroom_min (default 4)",
        ),
        (
            "threads",
            ValueKind::Count,
            "I/O threads (default: the machine's cores, at most 8; for a URL at least min(concurrency, 8))",
        ),
        (
            "staging_slots",
            ValueKind::Count,
            "Staging buffers host assembly uses at once, so reads overlap copies (default 2)",
        ),
        (
            "coalesce_below",
            ValueKind::Size,
            "Back-to-back tensors smaller than this are read together (default 1MiB; 0: each alone)",
        ),
        (
            "suballocate",
            ValueKind::Bool,
            "Carve tensors under 1 MiB from shared 32 MiB blocks (default true)",
        ),
        (
            "direct_io",
            ValueKind::Bool,
            "Host backend: read with O_DIRECT, past the page cache (default false)",
        ),
        (
            "cufile_mode",
            ValueKind::Choice,
            "How cuFile reads: auto, gds, compat, posix",
        ),
        (
            "cufile_lib",
            ValueKind::Path,
            "An explicit libcufile path (else $STAGING_CUFILE_LIB, libcufile.so.0, libcufile.so)",
        ),
        (
            "hipfile_mode",
            ValueKind::Choice,
            "How hipFile reads: auto, hipfile, posix",
        ),
        (
            "hipfile_lib",
            ValueKind::Path,
            "An explicit libhipfile path (else $STAGING_HIPFILE_LIB, libhipfile.so.0, libhipfile.so)",
        ),
        (
            "hip_lib",
            ValueKind::Path,
            "An explicit HIP runtime path (else $STAGING_HIP_LIB, libamdhip64.so, .so.7, .so.6)",
        ),
        (
            "select",
            ValueKind::Repeated,
            "Load only tensors matching this glob (repeatable: any match loads); a pattern without *?[]{} is a name, which must exist",
        ),
        (
            "rows",
            ValueKind::Repeated,
            "Rows of dimension 0 of the tensors matching GLOB: GLOB=START:END, or GLOB=RANK/PARTS for part RANK of PARTS near-equal parts (repeatable; first match wins)",
        ),
        (
            "concurrency",
            ValueKind::Count,
            "URLs: ranged GETs in flight at once (default 16)",
        ),
        (
            "range_size",
            ValueKind::Size,
            "URLs: bytes per ranged GET (default 8MiB)",
        ),
        (
            "retries",
            ValueKind::Count,
            "URLs: retries of a transiently failed request (default 5)",
        ),
        (
            "bandwidth",
            ValueKind::Size,
            "URLs: at most this many bytes per second, e.g. 500MB",
        ),
        (
            "store_option",
            ValueKind::Repeated,
            "URLs: an object_store option KEY=VALUE, after the environment: aws_endpoint=http://127.0.0.1:9000, allow_http=true, ... (repeatable; secret values are never printed)",
        ),
        (
            "allow_redirect",
            ValueKind::Repeated,
            "URLs: a host a redirect may lead to besides the one asked for: cdn.example.com, *.example.com, or * for any (repeatable; default: the same host, or the cloud's own endpoints)",
        ),
    ];

    /// The defaults: backend and device `auto`, the policy's and the remote reader's defaults,
    /// every tensor whole, small tensors sub-allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` (one of [`KEYS`](Self::KEYS)) from its spelling `value`; a repeatable key
    /// adds one more. An unknown key or a value that does not parse is
    /// [`Error::InvalidOption`], naming both, and changes nothing.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        // A store option's value may be a secret: an error shows its key only.
        let shown = match key {
            "store_option" => match value.split_once('=') {
                Some((name, _)) => format!("{name}=<redacted>"),
                None => "<redacted>".to_owned(),
            },
            _ => value.to_owned(),
        };
        let invalid = |reason: String| Error::InvalidOption {
            key: key.to_owned(),
            value: shown.clone(),
            reason,
        };
        match key {
            "backend" => self.backend = value.parse().map_err(invalid)?,
            "device" => self.device = value.parse().map_err(invalid)?,
            "memory_cap" => self.memory_cap = Some(parse_size(value).map_err(invalid)?),
            "chunk_size" => self.chunk_size = Some(parse_usize_size(value).map_err(invalid)?),
            "staging_size" => self.staging_size = Some(parse_usize_size(value).map_err(invalid)?),
            "headroom_min" => self.headroom_min = Some(parse_size(value).map_err(invalid)?),
            "headroom_divisor" => {
                self.headroom_divisor = Some(parse_count(value).map_err(invalid)? as u64);
            }
            "threads" => self.threads = Some(parse_count(value).map_err(invalid)?),
            "staging_slots" => self.staging_slots = Some(parse_count(value).map_err(invalid)?),
            "coalesce_below" => {
                self.coalesce_below = Some(parse_usize_size(value).map_err(invalid)?);
            }
            "suballocate" => self.suballocate = parse_bool(value).map_err(invalid)?,
            "direct_io" => self.direct_io = parse_bool(value).map_err(invalid)?,
            "cufile_mode" => self.cufile_mode = value.parse().map_err(invalid)?,
            "cufile_lib" => self.cufile_lib = Some(parse_path(value).map_err(invalid)?),
            "hipfile_mode" => self.hipfile_mode = value.parse().map_err(invalid)?,
            "hipfile_lib" => self.hipfile_lib = Some(parse_path(value).map_err(invalid)?),
            "hip_lib" => self.hip_lib = Some(parse_path(value).map_err(invalid)?),
            "select" => {
                glob(value).map_err(invalid)?;
                self.select.push(value.to_owned());
            }
            "rows" => self.rows.push(parse_rows(value).map_err(invalid)?),
            "concurrency" => {
                self.concurrency = Some(positive(parse_count(value)).map_err(invalid)?)
            }
            "range_size" => {
                self.range_size = Some(positive(parse_usize_size(value)).map_err(invalid)?);
            }
            "retries" => self.retries = Some(parse_count(value).map_err(invalid)?),
            "bandwidth" => self.bandwidth = Some(positive(parse_size(value)).map_err(invalid)?),
            "store_option" => self
                .store_options
                .push(parse_key_value(value).map_err(invalid)?),
            "allow_redirect" => self
                .allow_redirects
                .push(parse_host(value).map_err(invalid)?),
            _ => {
                let known: Vec<&str> = Self::KEYS.iter().map(|(k, ..)| *k).collect();
                return Err(invalid(format!(
                    "unknown key; the keys are {}",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The staging policy these options give (the defaults for what is unset; `chunk_size` also
    /// sizes the staging buffer unless `staging_size` is set).
    pub fn policy(&self) -> Result<StagingPolicy> {
        let mut policy = StagingPolicy::builder();
        if let Some(chunk) = self.chunk_size {
            policy = policy.chunk_size(chunk).staging_size(chunk);
        }
        if let Some(size) = self.staging_size {
            policy = policy.staging_size(size);
        }
        if self.headroom_min.is_some() || self.headroom_divisor.is_some() {
            let defaults = StagingPolicy::default();
            policy = policy.headroom(
                self.headroom_min.unwrap_or(defaults.headroom_min()),
                self.headroom_divisor.unwrap_or(defaults.headroom_divisor()),
            );
        }
        if let Some(threads) = self.threads {
            policy = policy.io_threads(threads);
        }
        if let Some(slots) = self.staging_slots {
            policy = policy.staging_slots(slots);
        }
        if let Some(below) = self.coalesce_below {
            policy = policy.coalesce_below(below);
        }
        Ok(policy.build()?)
    }

    /// The selection `select` and `rows` give: globs compiled once; names (patterns without glob
    /// characters) required to exist.
    pub fn selection(&self) -> Result<Selection> {
        let mut names = Vec::new();
        let mut selection = if self.select.is_empty() {
            Selection::all()
        } else {
            let mut set = globset::GlobSetBuilder::new();
            for pattern in &self.select {
                if is_name(pattern) {
                    names.push(pattern.clone());
                }
                set.add(glob(pattern).map_err(|reason| Error::InvalidOption {
                    key: "select".into(),
                    value: pattern.clone(),
                    reason,
                })?);
            }
            let set = set.build().map_err(|e| Error::InvalidOption {
                key: "select".into(),
                value: self.select.join(" "),
                reason: e.to_string(),
            })?;
            Selection::matching(move |name| set.is_match(name))
        };
        for (pattern, rows) in &self.rows {
            if is_name(pattern) {
                names.push(pattern.clone());
            }
            let matcher = glob(pattern)
                .map_err(|reason| Error::InvalidOption {
                    key: "rows".into(),
                    value: pattern.clone(),
                    reason,
                })?
                .compile_matcher();
            let rows = rows.clone();
            selection = selection
                .rows_where(move |meta| matcher.is_match(&meta.name).then(|| rows.clone()));
        }
        Ok(selection.requiring(names))
    }

    /// The backend these options ask for, with its options.
    // The GPU backends' fields exist only in builds with them, so `auto`'s options are set field
    // by field.
    #[allow(clippy::field_reassign_with_default)]
    pub fn backend(&self) -> Result<Backend> {
        let host = HostOptions::default().direct_io(self.direct_io);
        Ok(match self.backend {
            BackendKind::Auto => {
                let mut auto = AutoOptions::default();
                #[cfg(feature = "cufile")]
                {
                    auto.cufile = self.cufile_options();
                }
                #[cfg(feature = "hipfile")]
                {
                    auto.hipfile = self.hipfile_options();
                }
                auto.host = host;
                Backend::Auto(auto)
            }
            BackendKind::Host => Backend::Host(host),
            #[cfg(feature = "cufile")]
            BackendKind::Cufile => Backend::Cufile(self.cufile_options()),
            #[cfg(feature = "hipfile")]
            BackendKind::Hipfile => Backend::Hipfile(self.hipfile_options()),
            #[cfg(feature = "mock")]
            BackendKind::Mock => Backend::Mock,
            #[allow(unreachable_patterns)] // with every backend built, nothing is left over
            other => return Err(Error::NotBuilt(other.as_str())),
        })
    }

    #[cfg(feature = "cufile")]
    fn cufile_options(&self) -> backend_cufile::Options {
        use backend_cufile::RequestedMode;
        backend_cufile::Options {
            device: self.device.gpu_index().unwrap_or(0),
            mode: match self.cufile_mode {
                CufileMode::Auto => RequestedMode::Auto,
                CufileMode::Gds => RequestedMode::Fast,
                CufileMode::Compat => RequestedMode::Compat,
                CufileMode::Posix => RequestedMode::Posix,
            },
            library: self.cufile_lib.clone(),
            ..Default::default()
        }
    }

    #[cfg(feature = "hipfile")]
    fn hipfile_options(&self) -> backend_hipfile::Options {
        use backend_hipfile::RequestedMode;
        backend_hipfile::Options {
            device: self.device.gpu_index().unwrap_or(0),
            mode: match self.hipfile_mode {
                HipfileMode::Auto => RequestedMode::Auto,
                HipfileMode::Hipfile => RequestedMode::Fast,
                HipfileMode::Posix => RequestedMode::Posix,
            },
            library: self.hipfile_lib.clone(),
            hip_library: self.hip_lib.clone(),
            ..Default::default()
        }
    }

    /// The remote reader's options these give (its defaults for what is unset).
    #[cfg(feature = "remote")]
    pub fn remote_options(&self) -> backend_remote::Options {
        let mut options = backend_remote::Options::default();
        if let Some(n) = self.concurrency {
            options.concurrency = n;
        }
        if let Some(size) = self.range_size {
            options.range_size = size;
        }
        if let Some(n) = self.retries {
            options.max_retries = n;
        }
        options.bandwidth = self.bandwidth;
        options.config.clone_from(&self.store_options);
        options.allow_redirects.clone_from(&self.allow_redirects);
        options
    }

    /// A loader with these options (no destination: add one with
    /// [`Loader::destination`] or [`Loader::raw_destination`]).
    pub fn loader(&self) -> Result<Loader<'static>> {
        let loader = Loader::new()
            .backend(self.backend()?)
            .device(self.device)
            .policy(self.policy()?)
            .memory_cap(self.memory_cap)
            .suballocate(self.suballocate)
            .select(self.selection()?);
        #[cfg(feature = "remote")]
        let loader = loader.remote(self.remote_options());
        Ok(loader)
    }
}

/// Parses a size with the `parse-size` crate's grammar: a number, optionally fractional, then
/// an optional unit, case-insensitive, `B` optional. `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB` are
/// decimal (1000); `Ki`/`KiB`, `Mi`/`MiB`, `Gi`/`GiB`, `Ti`/`TiB` are binary (1024). So `4096`,
/// `512MiB`, `2GiB`, `0.5MiB`, `1MB`, `64KiB`. A number without a unit must be a whole number of
/// bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.parse::<f64>().is_ok() && trimmed.parse::<u64>().is_err() {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    parse_size::parse_size(trimmed)
        .map_err(|e| format!("{text:?} is not a size like 512MiB, 2GiB or 4096: {e}"))
}

fn parse_usize_size(text: &str) -> Result<usize, String> {
    let size = parse_size(text)?;
    usize::try_from(size).map_err(|_| format!("{size} bytes is too large for this machine"))
}

/// A value that must be at least 1 (where 0 would mean a reader that never reads).
fn positive<T: PartialEq + From<u8>>(parsed: Result<T, String>) -> Result<T, String> {
    match parsed {
        Ok(value) if value == T::from(0) => Err("must be at least 1".into()),
        other => other,
    }
}

fn parse_count(text: &str) -> Result<usize, String> {
    text.trim()
        .parse::<usize>()
        .map_err(|_| format!("{text:?} is not a whole number"))
}

fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("{text:?} is not true or false")),
    }
}

fn parse_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("an empty path".into());
    }
    Ok(PathBuf::from(text))
}

/// A host a redirect may go to: `host` (a name or an address, without port), `*.domain` or `*`.
fn parse_host(text: &str) -> Result<String, String> {
    let host = text.trim().to_ascii_lowercase();
    let name = host.strip_prefix("*.").unwrap_or(&host);
    let ipv6 = name.starts_with('[')
        && name.ends_with(']')
        && name.len() > 2
        && name[1..name.len() - 1]
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if host == "*" || plain || (ipv6 && !host.starts_with('*')) {
        Ok(host)
    } else {
        Err(format!(
            "{text:?} is not a host, *.domain or * (no scheme, port or path)"
        ))
    }
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        // Not the text itself: it may hold a secret.
        .ok_or_else(|| "expected KEY=VALUE".to_owned())
}

/// Parses `PATTERN=SPEC`, SPEC being `START:END` (rows `START..END` of dimension 0) or
/// `RANK/PARTS` (part `RANK` of `PARTS` near-equal parts).
pub fn parse_rows(text: &str) -> Result<(String, RowRange), String> {
    let (pattern, spec) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?} is not PATTERN=START:END or PATTERN=RANK/PARTS"))?;
    let rows = spec
        .parse::<RowRange>()
        .map_err(|e| format!("{e} (in {text:?})"))?;
    glob(pattern)?;
    Ok((pattern.to_owned(), rows))
}

/// Characters that make a pattern a glob rather than a name.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}', '\\'];

/// Whether `pattern` is a plain tensor name (no glob characters).
fn is_name(pattern: &str) -> bool {
    !pattern.contains(GLOB_CHARS)
}

/// `name` as a pattern that matches exactly it (its glob characters escaped).
pub fn escape_name(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len());
    for c in name.chars() {
        if GLOB_CHARS.contains(&c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn glob(pattern: &str) -> Result<globset::Glob, String> {
    globset::GlobBuilder::new(pattern)
        .backslash_escape(true)
        .build()
        .map_err(|e| format!("{pattern:?} is not a glob: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("4096", Ok(4096))]
    #[case("64KiB", Ok(64 << 10))]
    #[case("64ki", Ok(64 << 10))]
    #[case("64k", Ok(64_000))]
    #[case("1MiB", Ok(1 << 20))]
    #[case("0.5MiB", Ok(1 << 19))]
    #[case("2GiB", Ok(2 << 30))]
    #[case("1MB", Ok(1_000_000))]
    #[case(" 1 GB ", Ok(1_000_000_000))]
    #[case("12XB", Err(()))]
    #[case("lots", Err(()))]
    #[case("-1", Err(()))]
    #[case("1.3", Err(()))]
    #[case("", Err(()))]
    fn sizes(#[case] text: &str, #[case] expected: Result<u64, ()>) {
        assert_eq!(parse_size(text).map_err(|_| ()), expected);
    }

    #[test]
    fn rows() {
        assert_eq!(
            parse_rows("model.*.weight=2:5").unwrap(),
            ("model.*.weight".to_owned(), RowRange::Rows(2..5))
        );
        assert_eq!(
            parse_rows("w=1/4").unwrap(),
            ("w".to_owned(), RowRange::Part { rank: 1, parts: 4 })
        );
        for bad in ["w", "w=1", "w=a:b", "w=1/x", "w=-1:2", "[=0:1"] {
            assert!(parse_rows(bad).is_err(), "{bad}");
        }
    }

    #[rstest]
    #[case("auto", Ok(Device::Auto))]
    #[case("cpu", Ok(Device::Cpu))]
    #[case("cuda", Ok(Device::Gpu(0)))]
    #[case("cuda:3", Ok(Device::Gpu(3)))]
    #[case("2", Ok(Device::Gpu(2)))]
    #[case("hip", Ok(Device::Hip(0)))]
    #[case("hip:1", Ok(Device::Hip(1)))]
    #[case("cuda:", Err(()))]
    #[case("cuda:-1", Err(()))]
    #[case("gpu", Err(()))]
    #[case("-1", Err(()))]
    #[case("", Err(()))]
    fn devices(#[case] text: &str, #[case] expected: Result<Device, ()>) {
        assert_eq!(text.parse::<Device>().map_err(|_| ()), expected);
        if let Ok(device) = expected {
            // Display spells what parses back to the same device.
            assert_eq!(device.to_string().parse::<Device>(), Ok(device));
        }
    }

    #[test]
    fn every_key_sets_its_field_and_a_bad_value_changes_nothing() {
        let good = |kind: ValueKind, key: &str| match (kind, key) {
            (_, "backend") => "host",
            (_, "device") => "cuda:1",
            (_, "cufile_mode") => "compat",
            (_, "hipfile_mode") => "posix",
            (_, "rows") => "w=0:1",
            (_, "store_option") => "allow_http=true",
            (_, "allow_redirect") => "cdn.example.com",
            (ValueKind::Size, _) => "2MiB",
            (ValueKind::Count, _) => "3",
            (ValueKind::Bool, "suballocate") => "false",
            (ValueKind::Bool, _) => "true",
            (ValueKind::Path, _) => "/x.so",
            (_, _) => "layers.*",
        };
        for &(key, kind, _) in LoadOptions::KEYS {
            let mut options = LoadOptions::new();
            options.set(key, good(kind, key)).unwrap();
            assert_ne!(options, LoadOptions::new(), "{key} changed nothing");
            let before = options.clone();
            let bad = if kind == ValueKind::Path {
                ""
            } else {
                "[nonsense"
            };
            let error = options.set(key, bad).unwrap_err();
            assert_eq!(error.kind(), crate::ErrorKind::InvalidOption, "{key}");
            assert!(error.to_string().contains(key), "{error}");
            assert_eq!(options, before, "{key}: a bad value changed the options");
        }
        let error = LoadOptions::new().set("chunk", "1").unwrap_err();
        assert!(error.to_string().contains("unknown key"), "{error}");
        // A store option's value is never shown, even when it does not parse.
        for bad in ["aws_secret_access_key:SECRET", "=SECRET"] {
            let error = LoadOptions::new().set("store_option", bad).unwrap_err();
            assert!(!error.to_string().contains("SECRET"), "{error}");
            assert!(error.to_string().contains("KEY=VALUE"), "{error}");
        }
    }

    #[test]
    fn names_escape_to_themselves() {
        let name = "a[0].b*{c}?";
        let escaped = escape_name(name);
        let matcher = glob(&escaped).unwrap().compile_matcher();
        assert!(matcher.is_match(name));
        assert!(!matcher.is_match("a0.bx{c}?"));
        assert!(is_name("model.layers.0.weight"));
        assert!(!is_name(&escaped));
    }

    #[test]
    fn chunk_size_sizes_staging_unless_staging_size_is_set() {
        let mut options = LoadOptions::new();
        options.set("chunk_size", "4MiB").unwrap();
        let policy = options.policy().unwrap();
        assert_eq!(
            (policy.chunk_size(), policy.staging_size()),
            (4 << 20, 4 << 20)
        );
        options.set("staging_size", "8MiB").unwrap();
        let policy = options.policy().unwrap();
        assert_eq!(
            (policy.chunk_size(), policy.staging_size()),
            (4 << 20, 8 << 20)
        );
    }
}
