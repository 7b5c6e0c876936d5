//! [`LoadOptions`]: every setting of a load as plain data, with the one parser of their
//! spellings. The doors only spell: `stage`'s flags, Python's keywords and C's
//! `stg_config_set(config, key, value)` each hand `(key, value)` pairs (or typed values) to
//! [`LoadOptions::set`], and [`LoadOptions::loader`] turns the result into a [`Loader`]. What
//! `auto` means, and what "a GPU was asked for" means, is decided in [`crate::backend`] from
//! [`Device`](crate::Device) and [`BackendKind`], for every door alike.
//!
//! - `table`: the one list of options: each row the field of [`LoadOptions`], its default, and
//!   its entry in the table of keys ([`OptionSpec`]: aliases, kind, documented default, help,
//!   how it is parsed and shown);
//! - `spec`: what an entry is, and the macro that makes the struct, its `Default` and `Debug`,
//!   and the table from the list;
//! - `parse`: the spellings of values (sizes, booleans, hosts, row ranges, globs).

mod parse;
mod spec;
mod table;

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use staging_core::{RowRange, Selection, StagingPolicy};

use crate::backend::{AutoOptions, Backend, HostOptions};
use crate::error::{Error, Result};
use crate::loader::Loader;

pub use backend_gds::{CufileMode, HipfileMode};
pub use parse::{escape_name, parse_rows, parse_size};
use parse::{glob, is_name};
pub use spec::{OptionSpec, ValueKind};
pub use table::LoadOptions;

/// Declares [`BackendKind`] from one list, each backend once: its variant, its name as every
/// door spells it, its documentation; [`ALL`](BackendKind::ALL), [`NAMES`](BackendKind::NAMES)
/// and [`as_str`](BackendKind::as_str) follow from it, in its order.
macro_rules! backend_kinds {
    ($($(#[$attr:meta])* $variant:ident = $name:literal,)+) => {
        /// Which backend loads the tensors, by name (its options are the other fields of
        /// [`LoadOptions`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        #[non_exhaustive]
        pub enum BackendKind {
            $($(#[$attr])* $variant,)+
        }

        impl BackendKind {
            /// Every backend, in the order the documentation lists them.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
            /// Every backend's name, in the order of [`ALL`](Self::ALL).
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The name, as every door spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }
        }
    };
}

backend_kinds! {
    /// Decided by the [`Device`](crate::Device): a GPU backend (cuFile, then hipFile) when the
    /// device is a GPU or `auto`, the host backend for `cpu` or when `auto` finds no GPU.
    #[default]
    Auto = "auto",
    /// System memory standing for the device.
    Host = "host",
    /// NVIDIA GPUs through cuFile.
    Cufile = "cufile",
    /// AMD GPUs through hipFile.
    Hipfile = "hipfile",
    /// The host backend behind the mock's ledger (builds with the `mock` feature only).
    Mock = "mock",
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
            let values = spec.values(self);
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
