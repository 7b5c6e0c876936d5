//! [`LoadOptions`]: every setting of a load as plain data, with the one parser of their
//! spellings. The doors only spell: `stage`'s flags, Python's keywords and C's
//! `stg_config_set(config, key, value)` each hand `(key, value)` pairs (or typed values) to
//! [`LoadOptions::set`], and [`LoadOptions::loader`] turns the result into a [`Loader`]. What
//! `auto` means, and what "a GPU was asked for" means, is decided in [`crate::backend`] from
//! [`Device`] and [`BackendKind`], for every door alike.
//!
//! - `table`: the one table of keys ([`OptionSpec`]): aliases, kinds, defaults, help, setters;
//! - `parse`: the spellings of values (sizes, booleans, hosts, row ranges, globs).

mod parse;
mod table;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::str::FromStr;

use staging_core::{RowRange, Selection, StagingPolicy};

use crate::backend::{AutoOptions, Backend, HostOptions, MapFiles};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::loader::Loader;

pub use backend_gds::{CufileMode, HipfileMode};
pub use parse::{escape_name, parse_rows, parse_size};
use parse::{glob, is_name};
pub use table::{OptionSpec, ValueKind};

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
    /// Every backend, in the order the documentation lists them.
    pub const ALL: &'static [Self] = &[
        Self::Auto,
        Self::Host,
        Self::Cufile,
        Self::Hipfile,
        Self::Mock,
    ];
    /// Every backend's name, in the order of [`ALL`](Self::ALL).
    pub const NAMES: &'static [&'static str] = &["auto", "host", "cufile", "hipfile", "mock"];

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
        let text = text.trim();
        Self::ALL
            .iter()
            .copied()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| match Self::NAMES {
                [rest @ .., last] => format!("expected {} or {last}", rest.join(", ")),
                [] => "no backend".to_owned(),
            })
    }
}

/// Every setting of a load, as plain data: what `stage`'s flags, Python's keywords and C's
/// `stg_config_set` keys all spell, one field per key of [`LoadOptions::specs`]. `None` keeps the
/// library's default. Two doors given the same settings produce equal options. Neither `Debug`
/// nor [`describe`](Self::describe) (the `key = value` lines every door prints) shows a secret:
/// a store option that may hold one reads `<redacted>`.
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
    /// `host_assembly`: a tensor the device cannot hold is assembled in host memory (default
    /// true); off, it is an out-of-memory error (`StagingPolicy::host_assembly`).
    pub host_assembly: bool,
    /// `direct_io`: the host backend reads with `O_DIRECT` (default false).
    pub direct_io: bool,
    /// `map`: host tensors from local files are mappings of the files (default `auto`: for
    /// device `cpu`).
    pub map: MapFiles,
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
    /// `cache`: a model from the Hub (`hf://`) is written into the Hugging Face cache as it
    /// streams (default true); false streams it without writing anything.
    pub cache: bool,
    /// `cache_dir`: the Hugging Face cache (default `HF_HUB_CACHE`, else `$HF_HOME/hub`).
    pub cache_dir: Option<PathBuf>,
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
            host_assembly,
            direct_io,
            map,
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
            cache,
            cache_dir,
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
            .field("host_assembly", host_assembly)
            .field("direct_io", direct_io)
            .field("map", map)
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
            .field("cache", cache)
            .field("cache_dir", cache_dir)
            .finish()
    }
}

/// A size in the grammar `set` parses: the largest binary unit it is a whole number of.
fn show_size(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Rows in the spelling `rows` takes after its `GLOB=`.
fn show_rows(range: &RowRange) -> String {
    match range {
        RowRange::Rows(rows) => format!("{}:{}", rows.start, rows.end),
        RowRange::Part { rank, parts } => format!("{rank}/{parts}"),
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
            host_assembly: true,
            direct_io: false,
            map: MapFiles::Auto,
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
            cache: true,
            cache_dir: None,
        }
    }
}

impl LoadOptions {
    /// Every key [`set`](Self::set) takes, in the order the documentation lists them: its
    /// aliases, what its value is, its default and a line of help. `stage` spells key `k` as the
    /// flag `--k` (underscores as dashes), Python as the keyword `k` (`store_options` a mapping,
    /// `select`/`rows` collections), C as `stg_config_set(config, "k", value)`; an alias is
    /// spelled the same way wherever the key is.
    pub fn specs() -> &'static [OptionSpec] {
        table::OPTIONS
    }

    /// The option `key` spells: its name or one of its aliases.
    pub fn spec(key: &str) -> Option<&'static OptionSpec> {
        table::find(key)
    }

    /// The defaults: backend and device `auto`, the policy's and the remote reader's defaults,
    /// every tensor whole, small tensors sub-allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` (one of [`specs`](Self::specs), or an alias of one) from its spelling
    /// `value`; a repeatable key adds one more. An unknown key or a value that does not parse is
    /// [`Error::InvalidOption`], naming both (the key as given), and changes nothing.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let spec = Self::spec(key);
        // A store option's value may be a secret: an error shows its key only.
        let shown = || match spec {
            Some(spec) if spec.secret_values() => match value.split_once('=') {
                Some((name, _)) => format!("{name}=<redacted>"),
                None => "<redacted>".to_owned(),
            },
            _ => value.to_owned(),
        };
        let invalid = |reason: String| Error::InvalidOption {
            key: key.to_owned(),
            value: shown(),
            reason,
        };
        let Some(spec) = spec else {
            let known: Vec<&str> = Self::specs().iter().map(OptionSpec::name).collect();
            return Err(invalid(format!(
                "unknown key; the keys are {}",
                known.join(", ")
            )));
        };
        // A repeated key's setter parses its value and only then adds it, so a value that does
        // not parse changes nothing: set in place. (A copy of the options per value made adding
        // n values quadratic: the 46,000 names a Python `select` function chose on a
        // DeepSeek-shaped checkpoint took 83 s to set.)
        if spec.kind() == ValueKind::Repeated {
            return spec.apply(self, value).map_err(invalid);
        }
        // Any other key is parsed into a copy, so that a value that does not parse changes
        // nothing.
        let mut changed = self.clone();
        spec.apply(&mut changed, value).map_err(invalid)?;
        *self = changed;
        Ok(())
    }

    /// The options as `key = value` lines, one per key of [`specs`](Self::specs) in its order
    /// (one per value of a repeatable key), each value in the spelling [`set`](Self::set)
    /// takes, so that the lines set again give these options (all but a redacted store option's
    /// value, which is shown as `<redacted>`, not kept). A key left unset shows its
    /// default: `chunk_size = 16MiB  # default` where the default is a value, a comment line
    /// (`# memory_cap = none (default)`) where it is a description. A store option that may hold
    /// a secret shows its key only (`aws_secret_access_key=<redacted>`). `stage
    /// --print-options`, C's `stg_config_describe` and Python's `describe_options` print these
    /// lines.
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let mut text = String::new();
        for spec in Self::specs() {
            let key = spec.name();
            let values = self.values_of(key);
            let is_default = spec.default_is_value() && values == [spec.default()];
            if values.is_empty() || is_default {
                // `writeln!` into a String cannot fail.
                let _ = if spec.default_is_value() {
                    writeln!(text, "{key} = {}  # default", spec.default())
                } else {
                    writeln!(text, "# {key} = {} (default)", spec.default())
                };
            }
            if !is_default {
                for value in values {
                    let _ = writeln!(text, "{key} = {value}");
                }
            }
        }
        text
    }

    /// `key`'s values as [`set`](Self::set) spells them; none where it is unset.
    fn values_of(&self, key: &str) -> Vec<String> {
        let size = |value: Option<u64>| value.map(show_size).into_iter().collect();
        let usize_size = |value: Option<usize>| size(value.map(|v| v as u64));
        let count = |value: Option<usize>| value.map(|v| v.to_string()).into_iter().collect();
        let path = |value: &Option<PathBuf>| {
            value
                .as_ref()
                .map(|p| p.display().to_string())
                .into_iter()
                .collect()
        };
        match key {
            "backend" => vec![self.backend.as_str().to_owned()],
            "device" => vec![self.device.to_string()],
            "memory_cap" => size(self.memory_cap),
            "chunk_size" => usize_size(self.chunk_size),
            "staging_size" => usize_size(self.staging_size),
            "headroom_min" => size(self.headroom_min),
            "headroom_divisor" => self
                .headroom_divisor
                .map(|v| v.to_string())
                .into_iter()
                .collect(),
            "threads" => count(self.threads),
            "staging_slots" => count(self.staging_slots),
            "coalesce_below" => usize_size(self.coalesce_below),
            "suballocate" => vec![self.suballocate.to_string()],
            "host_assembly" => vec![self.host_assembly.to_string()],
            "direct_io" => vec![self.direct_io.to_string()],
            "map" => vec![self.map.as_str().to_owned()],
            "cufile_mode" => vec![self.cufile_mode.to_string()],
            "cufile_lib" => path(&self.cufile_lib),
            "hipfile_mode" => vec![self.hipfile_mode.to_string()],
            "hipfile_lib" => path(&self.hipfile_lib),
            "hip_lib" => path(&self.hip_lib),
            "select" => self.select.clone(),
            "rows" => self
                .rows
                .iter()
                .map(|(glob, range)| format!("{glob}={}", show_rows(range)))
                .collect(),
            "concurrency" => count(self.concurrency),
            "range_size" => usize_size(self.range_size),
            "retries" => count(self.retries),
            "bandwidth" => size(self.bandwidth),
            "store_option" => redacted_store_options(&self.store_options)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            "allow_redirect" => self.allow_redirects.clone(),
            "cache" => vec![self.cache.to_string()],
            "cache_dir" => path(&self.cache_dir),
            _ => Vec::new(),
        }
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
        policy = policy.host_assembly(self.host_assembly);
        Ok(policy.build()?)
    }

    /// The selection `select` and `rows` give: globs compiled once; names (patterns without glob
    /// characters) required to exist.
    pub fn selection(&self) -> Result<Selection> {
        let mut names = Vec::new();
        let mut selection = if self.select.is_empty() {
            Selection::all()
        } else {
            // Plain names looked up in a set, globs compiled into one matcher: a `select`
            // function's 46,000 chosen names were as many globs to compile and match.
            let mut exact = HashSet::new();
            let mut set = globset::GlobSetBuilder::new();
            for pattern in &self.select {
                if is_name(pattern) {
                    names.push(pattern.clone());
                    exact.insert(pattern.clone());
                    continue;
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
            // A typed selection that keeps nothing is refused, in every door alike.
            Selection::matching(move |name| exact.contains(name) || set.is_match(name))
                .refusing_nothing(self.select.join(", "))
        };
        // Rules by name looked up in a map, rules by glob tried in order; the first rule given
        // wins either way. (One matcher per rule, each tried on every tensor, was quadratic: a
        // Python `rows` function answering for the 88,000 weights of a DeepSeek-shaped
        // checkpoint gave as many rules, and its open did not end in 10 minutes.)
        let mut by_name: HashMap<String, (usize, RowRange)> = HashMap::new();
        let mut by_glob = Vec::new();
        for (order, (pattern, rows)) in self.rows.iter().enumerate() {
            if is_name(pattern) {
                names.push(pattern.clone());
                by_name
                    .entry(pattern.clone())
                    .or_insert_with(|| (order, rows.clone()));
                continue;
            }
            let matcher = glob(pattern)
                .map_err(|reason| Error::InvalidOption {
                    key: "rows".into(),
                    value: pattern.clone(),
                    reason,
                })?
                .compile_matcher();
            by_glob.push((order, matcher, rows.clone()));
        }
        if !by_name.is_empty() || !by_glob.is_empty() {
            selection = selection.rows_where(move |meta| {
                let named = by_name.get(&meta.name);
                let before = named.map_or(usize::MAX, |(order, _)| *order);
                by_glob
                    .iter()
                    .take_while(|(order, _, _)| *order < before)
                    .find(|(_, matcher, _)| matcher.is_match(&meta.name))
                    .map(|(_, _, rows)| rows)
                    .or(named.map(|(_, rows)| rows))
                    .cloned()
            });
        }
        Ok(selection.requiring(names))
    }

    /// The backend these options ask for, with its options.
    // The GPU backends' fields exist only in builds with them, so `auto`'s options are set field
    // by field.
    #[allow(clippy::field_reassign_with_default)]
    pub fn backend(&self) -> Result<Backend> {
        let host = HostOptions::default()
            .direct_io(self.direct_io)
            .map(self.map);
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
        backend_cufile::Options {
            device: self.device.gpu_index().unwrap_or(0),
            mode: self.cufile_mode.into(),
            library: self.cufile_lib.clone(),
            ..Default::default()
        }
    }

    #[cfg(feature = "hipfile")]
    fn hipfile_options(&self) -> backend_hipfile::Options {
        backend_hipfile::Options {
            device: self.device.gpu_index().unwrap_or(0),
            mode: self.hipfile_mode.into(),
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

    /// How Hub paths are read, as these say (the environment fills in the rest).
    #[cfg(feature = "remote")]
    pub fn hub_options(&self) -> backend_hub::HubOptions {
        backend_hub::HubOptions {
            cache: self.cache,
            cache_dir: self.cache_dir.clone(),
            ..Default::default()
        }
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
        let loader = loader.remote(self.remote_options()).hub(self.hub_options());
        Ok(loader)
    }
}

#[cfg(test)]
mod tests;
