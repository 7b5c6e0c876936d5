//! The one list of load options: every key [`LoadOptions::set`] takes, with the field it sets,
//! its default, its aliases, the kind of its value, its default as the documentation shows it,
//! its help, how a value is parsed and how the field is shown again. [`load_options!`] makes
//! of it the [`LoadOptions`] struct, its `Default` and `Debug`, and the table of
//! [`OptionSpec`]s. The doors build from that table (`stage`'s flags, Python's keywords, C's
//! keys), the reference page is rendered from it, and adding an option is one row here plus its
//! use.

use std::path::PathBuf;

use backend_gds::{CufileMode, HipfileMode};
use staging_core::RowRange;

use super::BackendKind;
use super::parse::{
    glob, is_name, parse_bool, parse_count, parse_host, parse_key_value, parse_path, parse_rows,
    parse_size, parse_usize_size, positive,
};
use super::spec::Shown::{Described, Value};
use super::spec::ValueKind::{Bool, Choice, Count, Path, Repeated, Size};
use super::spec::{OptionSpec, load_options, spec};
use crate::backend::MapFiles;
use crate::device::Device;

load_options! {
    /// Every setting of a load, as plain data: what `stage`'s flags, Python's keywords and C's
    /// `stg_config_set` keys all spell, one field per key of [`LoadOptions::specs`]. `None` keeps the
    /// library's default. Two doors given the same settings produce equal options. Neither `Debug`
    /// nor [`describe`](Self::describe) (the `key = value` lines every door prints) shows a secret:
    /// a store option that may hold one reads `<redacted>`.
    #[derive(Clone, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct LoadOptions {
        /// `backend`: which backend loads (default `auto`).
        backend: BackendKind = BackendKind::Auto,
        spec(
            "backend",
            Choice,
            "NAME",
            Value("auto"),
            "Which backend loads the tensors: auto is decided by the device; mock builds with the `mock` feature only",
        )
        .choosing(BackendKind::NAMES),
        set str::parse,
        show |v| vec![v.as_str().to_owned()];

        /// `device`: where the tensors go (default `auto`).
        device: Device = Device::Auto,
        spec(
            "device",
            Choice,
            "DEVICE",
            Value("auto"),
            "Where the tensors go: auto (a GPU when one is usable, else host memory), cpu, cuda, cuda:N or N (a GPU, or an error), hip or hip:N (hipFile only); in Python, cpu unless a device is given, as in safetensors",
        ),
        set str::parse,
        show one;

        /// `memory_cap`: device bytes the load may use: the host backend's capacity, or a budget
        /// replacing a GPU's free-memory figure.
        memory_cap: Option<u64> = None,
        spec(
            "memory_cap",
            Size,
            "SIZE",
            Described("none"),
            "Device bytes the load may use, e.g. 512MiB: the host backend's capacity, or a budget replacing a GPU's free-memory figure",
        )
        .aliased(&["device_memory"]),
        set |v| parse_size(v).map(Some),
        show size;

        /// `chunk_size`: the largest single read; also the staging buffer's size unless
        /// `staging_size` is set.
        chunk_size: Option<usize> = None,
        spec(
            "chunk_size",
            Size,
            "SIZE",
            Value("16MiB"),
            "Largest single read; also the staging buffer's size unless staging_size is set",
        ),
        set |v| parse_usize_size(v).map(Some),
        show usize_size;

        /// `staging_size`: the size of each device staging buffer of host assembly.
        staging_size: Option<usize> = None,
        spec(
            "staging_size",
            Size,
            "SIZE",
            Described("chunk_size"),
            "Size of each device staging buffer of host assembly",
        ),
        set |v| parse_usize_size(v).map(Some),
        show usize_size;

        /// `headroom_min`: the headroom's floor, in bytes (`max(headroom_min, len / divisor)`).
        headroom_min: Option<u64> = None,
        spec(
            "headroom_min",
            Size,
            "SIZE",
            Value("256MiB"),
            "A tensor gets its own device buffer when free memory leaves max(headroom_min, size / headroom_divisor)",
        ),
        set |v| parse_size(v).map(Some),
        show size;

        /// `headroom_divisor`: the headroom's divisor.
        headroom_divisor: Option<u64> = None,
        spec(
            "headroom_divisor",
            Count,
            "N",
            Value("4"),
            "See headroom_min",
        ),
        set |v| Ok(Some(parse_count(v)? as u64)),
        show count;

        /// `threads`: I/O threads.
        threads: Option<usize> = None,
        spec(
            "threads",
            Count,
            "N",
            Described("the machine's cores, at most 8; for a URL at least min(concurrency, 8)"),
            "I/O threads",
        ),
        set |v| parse_count(v).map(Some),
        show count;

        /// `staging_slots`: staging buffers host assembly uses at once.
        staging_slots: Option<usize> = None,
        spec(
            "staging_slots",
            Count,
            "N",
            Value("2"),
            "Staging buffers host assembly uses at once, so reads overlap copies",
        ),
        set |v| parse_count(v).map(Some),
        show count;

        /// `coalesce_below`: back-to-back tensors smaller than this are read together.
        coalesce_below: Option<usize> = None,
        spec(
            "coalesce_below",
            Size,
            "SIZE",
            Value("1MiB"),
            "Back-to-back tensors smaller than this are read together (0: each alone)",
        ),
        set |v| parse_usize_size(v).map(Some),
        show usize_size;

        /// `suballocate`: tensors under 1 MiB are carved from shared blocks (default true).
        suballocate: bool = true,
        spec(
            "suballocate",
            Bool,
            "BOOL",
            Value("true"),
            "Carve tensors under 1 MiB from shared 32 MiB blocks",
        ),
        set parse_bool,
        show one;

        /// `host_assembly`: a tensor the device cannot hold is assembled in host memory (default
        /// true); off, it is an out-of-memory error (`StagingPolicy::host_assembly`).
        host_assembly: bool = true,
        spec(
            "host_assembly",
            Bool,
            "BOOL",
            Value("true"),
            "A tensor the device cannot hold is assembled in host memory through the staging buffer; false: an out-of-memory error instead (every tensor on the device)",
        ),
        set parse_bool,
        show one;

        /// `direct_io`: the host backend reads with `O_DIRECT` (default false).
        direct_io: bool = false,
        spec(
            "direct_io",
            Bool,
            "BOOL",
            Value("false"),
            "Host backend: read with O_DIRECT, past the page cache",
        ),
        set parse_bool,
        show one;

        /// `map`: host tensors from local files are mappings of the files (default `auto`: for
        /// device `cpu`).
        map: MapFiles = MapFiles::Auto,
        spec(
            "map",
            Choice,
            "WHEN",
            Value("auto"),
            "Host tensors from local files as private (copy-on-write) mappings of the files, the page cache their memory: auto (for device cpu, no memory_cap, local file systems), true (whenever the host backend reads local files) or false (reads into memory of our own)",
        )
        .choosing(&["auto", "true", "false"]),
        set parse_map,
        show |v| vec![v.as_str().to_owned()];

        /// `cufile_mode`: how cuFile reads (default `auto`).
        cufile_mode: CufileMode = CufileMode::Auto,
        spec(
            "cufile_mode",
            Choice,
            "MODE",
            Value("auto"),
            "How cuFile reads: auto (GDS, else cuFile's compatibility mode, else POSIX), gds, compat, or posix (no libcufile)",
        )
        .choosing(CufileMode::NAMES),
        set str::parse,
        show one;

        /// `cufile_lib`: an explicit libcufile path.
        cufile_lib: Option<PathBuf> = None,
        spec(
            "cufile_lib",
            Path,
            "PATH",
            Described("$STAGING_CUFILE_LIB, else libcufile.so.0, libcufile.so"),
            "An explicit libcufile path",
        ),
        set |v| parse_path(v).map(Some),
        show path;

        /// `hipfile_mode`: how hipFile reads (default `auto`).
        hipfile_mode: HipfileMode = HipfileMode::Auto,
        spec(
            "hipfile_mode",
            Choice,
            "MODE",
            Value("auto"),
            "How hipFile reads: auto (hipFile, per file POSIX when a file cannot be registered), hipfile, or posix (no libhipfile)",
        )
        .choosing(HipfileMode::NAMES),
        set str::parse,
        show one;

        /// `hipfile_lib`: an explicit libhipfile path.
        hipfile_lib: Option<PathBuf> = None,
        spec(
            "hipfile_lib",
            Path,
            "PATH",
            Described("$STAGING_HIPFILE_LIB, else libhipfile.so.0, libhipfile.so"),
            "An explicit libhipfile path",
        ),
        set |v| parse_path(v).map(Some),
        show path;

        /// `hip_lib`: an explicit HIP runtime path.
        hip_lib: Option<PathBuf> = None,
        spec(
            "hip_lib",
            Path,
            "PATH",
            Described("$STAGING_HIP_LIB, else libamdhip64.so, .so.7, .so.6"),
            "An explicit HIP runtime path",
        ),
        set |v| parse_path(v).map(Some),
        show path;

        /// `select` (repeatable): tensors to load, by glob; a pattern without `*?[]{}` is a name,
        /// and a name the checkpoint does not hold is an error. None: every tensor.
        select: Vec<String> = Vec::new(),
        spec(
            "select",
            Repeated,
            "GLOB",
            Described("every tensor"),
            "Load only tensors matching this glob (repeatable: any match loads); a pattern without *?[]{} is a name, which must exist",
        ),
        add parse_select,
        show Vec::clone;

        /// `rows` (repeatable, `GLOB=START:END` or `GLOB=RANK/PARTS`): rows of dimension 0 to load
        /// of the tensors matching GLOB (the first rule that matches wins; a GLOB that is a name
        /// must exist).
        rows: Vec<(String, RowRange)> = Vec::new(),
        spec(
            "rows",
            Repeated,
            "GLOB=SPEC",
            Described("whole tensors"),
            "Rows of dimension 0 of the tensors matching GLOB: GLOB=START:END, or GLOB=RANK/PARTS for part RANK of PARTS near-equal parts (repeatable; first match wins)",
        ),
        add parse_rows,
        show |rows| {
            rows.iter()
                .map(|(glob, range)| format!("{glob}={}", show_rows(range)))
                .collect()
        };

        /// `concurrency`: for a URL, ranged GETs in flight.
        concurrency: Option<usize> = None,
        spec(
            "concurrency",
            Count,
            "N",
            Value("16"),
            "URLs: ranged GETs in flight at once",
        ),
        set |v| positive(parse_count(v)).map(Some),
        show count;

        /// `range_size`: for a URL, bytes per ranged GET.
        range_size: Option<usize> = None,
        spec(
            "range_size",
            Size,
            "SIZE",
            Value("8MiB"),
            "URLs: bytes per ranged GET",
        ),
        set |v| positive(parse_usize_size(v)).map(Some),
        show usize_size;

        /// `retries`: for a URL, retries of a transiently failed request.
        retries: Option<usize> = None,
        spec(
            "retries",
            Count,
            "N",
            Value("5"),
            "URLs: retries of a transiently failed request",
        ),
        set |v| parse_count(v).map(Some),
        show count;

        /// `bandwidth`: for a URL, at most this many bytes per second.
        bandwidth: Option<u64> = None,
        spec(
            "bandwidth",
            Size,
            "SIZE",
            Described("unlimited"),
            "URLs: at most this many bytes per second, e.g. 500MB",
        ),
        set |v| positive(parse_size(v)).map(Some),
        show size;

        /// `store_option` (repeatable, `KEY=VALUE`): object_store options, after the environment.
        store_options: Vec<(String, String)> = Vec::new(),
        spec(
            "store_option",
            Repeated,
            "KEY=VALUE",
            Described("the environment's"),
            "URLs: an object_store option KEY=VALUE, after the environment: aws_endpoint=http://127.0.0.1:9000, allow_http=true, ... (repeatable; secret values are never printed)",
        )
        .keyword("store_options")
        .secret(),
        add parse_key_value,
        show |options| {
            redacted_store_options(options)
                .into_iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect()
        },
        debug redacted_store_options;

        /// `allow_redirect` (repeatable): for a URL, a host a redirect may lead to besides the one
        /// asked for (`cdn.example.com`, `*.example.com`, or `*` for any).
        allow_redirects: Vec<String> = Vec::new(),
        spec(
            "allow_redirect",
            Repeated,
            "HOST",
            Described("the same host, or the cloud's own endpoints"),
            "URLs: a host a redirect may lead to besides the one asked for: cdn.example.com, *.example.com, or * for any (repeatable)",
        ),
        add parse_host,
        show Vec::clone;

        /// `cache`: a model from the Hub (`hf://`) is written into the Hugging Face cache as it
        /// streams (default true); false streams it without writing anything.
        cache: bool = true,
        spec(
            "cache",
            Bool,
            "BOOL",
            Value("true"),
            "hf:// models: write what streams into the Hugging Face cache, as huggingface_hub would (false: stream without writing)",
        ),
        set parse_bool,
        show one;

        /// `cache_dir`: the Hugging Face cache (default `HF_HUB_CACHE`, else `$HF_HOME/hub`).
        cache_dir: Option<PathBuf> = None,
        spec(
            "cache_dir",
            Path,
            "PATH",
            Described("$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub"),
            "hf:// models: the Hugging Face cache",
        ),
        set |v| parse_path(v).map(Some),
        show path;
    }
}

/// The option `key` spells (its name or an alias).
pub(super) fn find(key: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|spec| spec.is_spelled(key))
}

/// `map`'s spellings: `auto`, or a boolean.
fn parse_map(text: &str) -> Result<MapFiles, String> {
    Ok(match text.trim().to_ascii_lowercase().as_str() {
        "auto" => MapFiles::Auto,
        other => match parse_bool(other)? {
            true => MapFiles::Always,
            false => MapFiles::Never,
        },
    })
}

/// A `select` pattern, checked: a plain name is a glob matching itself (it has no glob
/// character to misread).
fn parse_select(text: &str) -> Result<String, String> {
    if !is_name(text) {
        glob(text)?;
    }
    Ok(text.to_owned())
}

/// A value shown by its `Display`.
fn one<T: ToString>(value: &T) -> Vec<String> {
    vec![value.to_string()]
}

/// A count, when set.
fn count<T: ToString>(value: &Option<T>) -> Vec<String> {
    value.iter().map(T::to_string).collect()
}

/// A size, when set.
fn size(value: &Option<u64>) -> Vec<String> {
    value.map(show_size).into_iter().collect()
}

/// A size held as `usize`, when set.
fn usize_size(value: &Option<usize>) -> Vec<String> {
    size(&value.map(|v| v as u64))
}

/// A path, when set.
fn path(value: &Option<PathBuf>) -> Vec<String> {
    value.iter().map(|p| p.display().to_string()).collect()
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
