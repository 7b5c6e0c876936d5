//! The one table of load options: every key [`LoadOptions::set`] takes, with its aliases, the
//! kind of its value, its default as the documentation shows it, its help, and the function that
//! sets it. The doors build from it (`stage`'s flags, Python's keywords, C's keys), the
//! reference page is rendered from it, and adding an option is one entry here plus its use.

use backend_gds::{CufileMode, HipfileMode};

use super::parse::{
    glob, is_name, parse_bool, parse_count, parse_host, parse_key_value, parse_path, parse_rows,
    parse_size, parse_usize_size, positive,
};
use super::{BackendKind, LoadOptions};
use crate::backend::MapFiles;

/// What a value of a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueKind {
    /// A name from a fixed list ([`OptionSpec::choices`]), or a spelling the help describes.
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

impl ValueKind {
    /// The kind's name in the reference (`size`, `count`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Choice => "choice",
            Self::Size => "size",
            Self::Count => "count",
            Self::Bool => "bool",
            Self::Path => "path",
            Self::Repeated => "repeated",
        }
    }
}

/// A key's default, as the documentation shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// A value [`LoadOptions::set`] parses, which gives what the key's absence gives (a unit
    /// test holds every such default to it).
    Value(&'static str),
    /// What the key's absence means, in words (it is no value of the key).
    Described(&'static str),
}

/// Sets one key of [`LoadOptions`] from its spelling; `Err` is why it does not parse. A
/// repeated key's setter parses the whole value before its one change (a push), so that an
/// `Err` leaves the options as they were: [`LoadOptions::set`] applies it in place.
type Setter = fn(&mut LoadOptions, &str) -> Result<(), String>;

/// One load option: its key and aliases, what its value is, its default and help, and how it is
/// set. Every door spells the key: `stage` as the flag `--key` ([`flag`](Self::flag)), Python as
/// the keyword [`python_keyword`](Self::python_keyword), C as
/// `stg_config_set(config, "key", value)`. An alias is accepted wherever the key is, spelled
/// the same way (`device_memory`, `--device-memory`).
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct OptionSpec {
    name: &'static str,
    aliases: &'static [&'static str],
    kind: ValueKind,
    value_name: &'static str,
    choices: &'static [&'static str],
    default: Shown,
    help: &'static str,
    python_keyword: &'static str,
    secret_values: bool,
    set: Setter,
}

impl std::fmt::Debug for OptionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OptionSpec")
            .field("name", &self.name)
            .field("aliases", &self.aliases)
            .field("kind", &self.kind)
            .field("default", &self.default())
            .finish_non_exhaustive()
    }
}

impl OptionSpec {
    /// The key, as [`LoadOptions::set`] and C's `stg_config_set` take it (`chunk_size`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Other spellings of the key, accepted wherever the key is (`device_memory` for
    /// `memory_cap`).
    pub fn aliases(&self) -> &'static [&'static str] {
        self.aliases
    }

    /// What its value is.
    pub fn kind(&self) -> ValueKind {
        self.kind
    }

    /// What the value is called in usage lines: `SIZE`, `N`, `PATH`, `GLOB=SPEC`, ...
    pub fn value_name(&self) -> &'static str {
        self.value_name
    }

    /// For a [`ValueKind::Choice`] of a fixed list, the names it takes (empty when the help
    /// describes the spellings instead, as `device`'s).
    pub fn choices(&self) -> &'static [&'static str] {
        self.choices
    }

    /// The default, as the documentation shows it: a value (`16MiB`, `auto`, `true`) or what
    /// the key's absence means (`every tensor`).
    pub fn default(&self) -> &'static str {
        match self.default {
            Shown::Value(text) | Shown::Described(text) => text,
        }
    }

    /// Whether [`default`](Self::default) is a value of the key (it parses, and setting it
    /// changes nothing a load does) rather than words.
    pub fn default_is_value(&self) -> bool {
        matches!(self.default, Shown::Value(_))
    }

    /// One line of help (without the default or the choices, which have their own accessors).
    pub fn help(&self) -> &'static str {
        self.help
    }

    /// The `stage` flag, without its dashes (`chunk-size`).
    pub fn flag(&self) -> String {
        flag_of(self.name)
    }

    /// The `stage` flags of the aliases, without their dashes (`device-memory`).
    pub fn flag_aliases(&self) -> Vec<String> {
        self.aliases.iter().map(|alias| flag_of(alias)).collect()
    }

    /// The Python keyword (the key, except `store_options`: a mapping of `store_option`s).
    pub fn python_keyword(&self) -> &'static str {
        self.python_keyword
    }

    /// The C key of `stg_config_set` (the key).
    pub fn c_key(&self) -> &'static str {
        self.name
    }

    /// Whether `key` spells this option: its name or one of its aliases.
    pub fn is_spelled(&self, key: &str) -> bool {
        self.name == key || self.aliases.contains(&key)
    }

    /// Whether a value may hold a secret (a store option's): errors show its key only.
    pub(crate) fn secret_values(&self) -> bool {
        self.secret_values
    }

    /// Sets this option of `options` from `value`; `Err` says why it does not parse (and
    /// `options` is unchanged).
    pub(crate) fn apply(&self, options: &mut LoadOptions, value: &str) -> Result<(), String> {
        (self.set)(options, value)
    }
}

/// The flag a key is spelled as: `chunk_size` → `chunk-size`.
fn flag_of(key: &str) -> String {
    key.replace('_', "-")
}

/// An entry with the fields most entries share (no alias, no choices, the key as Python
/// keyword, values shown in errors).
const fn spec(
    name: &'static str,
    kind: ValueKind,
    value_name: &'static str,
    default: Shown,
    help: &'static str,
    set: Setter,
) -> OptionSpec {
    OptionSpec {
        name,
        aliases: &[],
        kind,
        value_name,
        choices: &[],
        default,
        help,
        python_keyword: name,
        secret_values: false,
        set,
    }
}

impl OptionSpec {
    const fn aliased(mut self, aliases: &'static [&'static str]) -> Self {
        self.aliases = aliases;
        self
    }

    const fn choosing(mut self, choices: &'static [&'static str]) -> Self {
        self.choices = choices;
        self
    }

    const fn keyword(mut self, python_keyword: &'static str) -> Self {
        self.python_keyword = python_keyword;
        self
    }

    const fn secret(mut self) -> Self {
        self.secret_values = true;
        self
    }
}

use Shown::{Described, Value};
use ValueKind::{Bool, Choice, Count, Path, Repeated, Size};

/// The load options, in the order the documentation lists them.
pub(super) static OPTIONS: &[OptionSpec] = &[
    spec(
        "backend",
        Choice,
        "NAME",
        Value("auto"),
        "Which backend loads the tensors: auto is decided by the device; mock builds with the `mock` feature only",
        |o, v| {
            o.backend = v.parse::<BackendKind>()?;
            Ok(())
        },
    )
    .choosing(BackendKind::NAMES),
    spec(
        "device",
        Choice,
        "DEVICE",
        Value("auto"),
        "Where the tensors go: auto (a GPU when one is usable, else host memory), cpu, cuda, cuda:N or N (a GPU, or an error), hip or hip:N (hipFile only); in Python, cpu unless a device is given, as in safetensors",
        |o, v| {
            o.device = v.parse()?;
            Ok(())
        },
    ),
    spec(
        "memory_cap",
        Size,
        "SIZE",
        Described("none"),
        "Device bytes the load may use, e.g. 512MiB: the host backend's capacity, or a budget replacing a GPU's free-memory figure",
        |o, v| {
            o.memory_cap = Some(parse_size(v)?);
            Ok(())
        },
    )
    .aliased(&["device_memory"]),
    spec(
        "chunk_size",
        Size,
        "SIZE",
        Value("16MiB"),
        "Largest single read; also the staging buffer's size unless staging_size is set",
        |o, v| {
            o.chunk_size = Some(parse_usize_size(v)?);
            Ok(())
        },
    ),
    spec(
        "staging_size",
        Size,
        "SIZE",
        Described("chunk_size"),
        "Size of each device staging buffer of host assembly",
        |o, v| {
            o.staging_size = Some(parse_usize_size(v)?);
            Ok(())
        },
    ),
    spec(
        "headroom_min",
        Size,
        "SIZE",
        Value("256MiB"),
        "A tensor gets its own device buffer when free memory leaves max(headroom_min, size / headroom_divisor)",
        |o, v| {
            o.headroom_min = Some(parse_size(v)?);
            Ok(())
        },
    ),
    spec(
        "headroom_divisor",
        Count,
        "N",
        Value("4"),
        "See headroom_min",
        |o, v| {
            o.headroom_divisor = Some(parse_count(v)? as u64);
            Ok(())
        },
    ),
    spec(
        "threads",
        Count,
        "N",
        Described("the machine's cores, at most 8; for a URL at least min(concurrency, 8)"),
        "I/O threads",
        |o, v| {
            o.threads = Some(parse_count(v)?);
            Ok(())
        },
    ),
    spec(
        "staging_slots",
        Count,
        "N",
        Value("2"),
        "Staging buffers host assembly uses at once, so reads overlap copies",
        |o, v| {
            o.staging_slots = Some(parse_count(v)?);
            Ok(())
        },
    ),
    spec(
        "coalesce_below",
        Size,
        "SIZE",
        Value("1MiB"),
        "Back-to-back tensors smaller than this are read together (0: each alone)",
        |o, v| {
            o.coalesce_below = Some(parse_usize_size(v)?);
            Ok(())
        },
    ),
    spec(
        "suballocate",
        Bool,
        "BOOL",
        Value("true"),
        "Carve tensors under 1 MiB from shared 32 MiB blocks",
        |o, v| {
            o.suballocate = parse_bool(v)?;
            Ok(())
        },
    ),
    spec(
        "host_assembly",
        Bool,
        "BOOL",
        Value("true"),
        "A tensor the device cannot hold is assembled in host memory through the staging buffer; false: an out-of-memory error instead (every tensor on the device)",
        |o, v| {
            o.host_assembly = parse_bool(v)?;
            Ok(())
        },
    ),
    spec(
        "direct_io",
        Bool,
        "BOOL",
        Value("false"),
        "Host backend: read with O_DIRECT, past the page cache",
        |o, v| {
            o.direct_io = parse_bool(v)?;
            Ok(())
        },
    ),
    spec(
        "map",
        Choice,
        "WHEN",
        Value("auto"),
        "Host tensors from local files as private (copy-on-write) mappings of the files, the page cache their memory: auto (for device cpu, no memory_cap, local file systems), true (whenever the host backend reads local files) or false (reads into memory of our own)",
        |o, v| {
            o.map = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => MapFiles::Auto,
                other => match parse_bool(other)? {
                    true => MapFiles::Always,
                    false => MapFiles::Never,
                },
            };
            Ok(())
        },
    )
    .choosing(&["auto", "true", "false"]),
    spec(
        "cufile_mode",
        Choice,
        "MODE",
        Value("auto"),
        "How cuFile reads: auto (GDS, else cuFile's compatibility mode, else POSIX), gds, compat, or posix (no libcufile)",
        |o, v| {
            o.cufile_mode = v.parse::<CufileMode>()?;
            Ok(())
        },
    )
    .choosing(CufileMode::NAMES),
    spec(
        "cufile_lib",
        Path,
        "PATH",
        Described("$STAGING_CUFILE_LIB, else libcufile.so.0, libcufile.so"),
        "An explicit libcufile path",
        |o, v| {
            o.cufile_lib = Some(parse_path(v)?);
            Ok(())
        },
    ),
    spec(
        "hipfile_mode",
        Choice,
        "MODE",
        Value("auto"),
        "How hipFile reads: auto (hipFile, per file POSIX when a file cannot be registered), hipfile, or posix (no libhipfile)",
        |o, v| {
            o.hipfile_mode = v.parse::<HipfileMode>()?;
            Ok(())
        },
    )
    .choosing(HipfileMode::NAMES),
    spec(
        "hipfile_lib",
        Path,
        "PATH",
        Described("$STAGING_HIPFILE_LIB, else libhipfile.so.0, libhipfile.so"),
        "An explicit libhipfile path",
        |o, v| {
            o.hipfile_lib = Some(parse_path(v)?);
            Ok(())
        },
    ),
    spec(
        "hip_lib",
        Path,
        "PATH",
        Described("$STAGING_HIP_LIB, else libamdhip64.so, .so.7, .so.6"),
        "An explicit HIP runtime path",
        |o, v| {
            o.hip_lib = Some(parse_path(v)?);
            Ok(())
        },
    ),
    spec(
        "select",
        Repeated,
        "GLOB",
        Described("every tensor"),
        "Load only tensors matching this glob (repeatable: any match loads); a pattern without *?[]{} is a name, which must exist",
        |o, v| {
            // A plain name is a glob matching itself (it has no glob character to misread).
            if !is_name(v) {
                glob(v)?;
            }
            o.select.push(v.to_owned());
            Ok(())
        },
    ),
    spec(
        "rows",
        Repeated,
        "GLOB=SPEC",
        Described("whole tensors"),
        "Rows of dimension 0 of the tensors matching GLOB: GLOB=START:END, or GLOB=RANK/PARTS for part RANK of PARTS near-equal parts (repeatable; first match wins)",
        |o, v| {
            o.rows.push(parse_rows(v)?);
            Ok(())
        },
    ),
    spec(
        "concurrency",
        Count,
        "N",
        Value("16"),
        "URLs: ranged GETs in flight at once",
        |o, v| {
            o.concurrency = Some(positive(parse_count(v))?);
            Ok(())
        },
    ),
    spec(
        "range_size",
        Size,
        "SIZE",
        Value("8MiB"),
        "URLs: bytes per ranged GET",
        |o, v| {
            o.range_size = Some(positive(parse_usize_size(v))?);
            Ok(())
        },
    ),
    spec(
        "retries",
        Count,
        "N",
        Value("5"),
        "URLs: retries of a transiently failed request",
        |o, v| {
            o.retries = Some(parse_count(v)?);
            Ok(())
        },
    ),
    spec(
        "bandwidth",
        Size,
        "SIZE",
        Described("unlimited"),
        "URLs: at most this many bytes per second, e.g. 500MB",
        |o, v| {
            o.bandwidth = Some(positive(parse_size(v))?);
            Ok(())
        },
    ),
    spec(
        "store_option",
        Repeated,
        "KEY=VALUE",
        Described("the environment's"),
        "URLs: an object_store option KEY=VALUE, after the environment: aws_endpoint=http://127.0.0.1:9000, allow_http=true, ... (repeatable; secret values are never printed)",
        |o, v| {
            o.store_options.push(parse_key_value(v)?);
            Ok(())
        },
    )
    .keyword("store_options")
    .secret(),
    spec(
        "allow_redirect",
        Repeated,
        "HOST",
        Described("the same host, or the cloud's own endpoints"),
        "URLs: a host a redirect may lead to besides the one asked for: cdn.example.com, *.example.com, or * for any (repeatable)",
        |o, v| {
            o.allow_redirects.push(parse_host(v)?);
            Ok(())
        },
    ),
    spec(
        "cache",
        Bool,
        "BOOL",
        Value("true"),
        "hf:// models: write what streams into the Hugging Face cache, as huggingface_hub would (false: stream without writing)",
        |o, v| {
            o.cache = parse_bool(v)?;
            Ok(())
        },
    ),
    spec(
        "cache_dir",
        Path,
        "PATH",
        Described("$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub"),
        "hf:// models: the Hugging Face cache",
        |o, v| {
            o.cache_dir = Some(parse_path(v)?);
            Ok(())
        },
    ),
];

/// The option `key` spells (its name or an alias).
pub(super) fn find(key: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|spec| spec.is_spelled(key))
}
