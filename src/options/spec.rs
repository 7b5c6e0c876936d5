//! What one load option is ([`OptionSpec`]: its key, aliases, kind, default, help, and how it is
//! set and shown) and [`load_options!`], the macro that turns the one list of options
//! (`table`) into the [`LoadOptions`] struct, its `Default`, its `Debug` and the table of
//! [`OptionSpec`]s, so that a row is the only place an option is spelled.

use super::LoadOptions;

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
pub(super) enum Shown {
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

/// A key's values in [`LoadOptions`] as [`LoadOptions::set`] spells them (none where it is
/// unset; one per value of a repeated key).
type Getter = fn(&LoadOptions) -> Vec<String>;

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
    get: Getter,
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

    /// This option's values in `options`, as [`apply`](Self::apply) takes them (a store
    /// option's secret values redacted).
    pub(crate) fn values(&self, options: &LoadOptions) -> Vec<String> {
        (self.get)(options)
    }
}

/// The flag a key is spelled as: `chunk_size` → `chunk-size`.
fn flag_of(key: &str) -> String {
    key.replace('_', "-")
}

/// An entry with the fields most entries share (no alias, no choices, the key as Python
/// keyword, values shown in errors); [`load_options!`] gives it its setter and getter.
pub(super) const fn spec(
    name: &'static str,
    kind: ValueKind,
    value_name: &'static str,
    default: Shown,
    help: &'static str,
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
        set: |_, _| Err("no setter".to_owned()),
        get: |_| Vec::new(),
    }
}

impl OptionSpec {
    pub(super) const fn aliased(mut self, aliases: &'static [&'static str]) -> Self {
        self.aliases = aliases;
        self
    }

    pub(super) const fn choosing(mut self, choices: &'static [&'static str]) -> Self {
        self.choices = choices;
        self
    }

    pub(super) const fn keyword(mut self, python_keyword: &'static str) -> Self {
        self.python_keyword = python_keyword;
        self
    }

    pub(super) const fn secret(mut self) -> Self {
        self.secret_values = true;
        self
    }

    /// The entry with how its field is set and shown (what [`load_options!`] writes).
    pub(super) const fn handled(mut self, set: Setter, get: Getter) -> Self {
        self.set = set;
        self.get = get;
        self
    }
}

/// Writes, from the one list of load options in `table`, everything an option is: the
/// [`LoadOptions`] struct (one field per row, with the row's doc comment), its `Default` (the
/// row's default) and `Debug` (every field by name; a row's `debug` function shows what may
/// hold a secret), and `OPTIONS`, the [`OptionSpec`] of each row with its setter and getter.
///
/// A row is `FIELD: TYPE = DEFAULT, SPEC, set PARSE, show SHOW;` where `SPEC` is the
/// [`spec`] entry (key, kind, value name, default as documented, help, then aliases, choices,
/// ...), `PARSE` turns a value's spelling into the field (`add PARSE` for a repeated key: into
/// one more element), and `SHOW` turns the field into the spellings `PARSE` takes, one per value
/// (`, debug F` after it, a function the field is shown through in `Debug`).
macro_rules! load_options {
    (@set $field:ident set $parse:expr) => {
        |options, value| {
            let parse: fn(&str) -> Result<_, String> = $parse;
            options.$field = parse(value)?;
            Ok(())
        }
    };
    (@set $field:ident add $parse:expr) => {
        // The value is parsed whole before the one push, so an `Err` changes nothing.
        |options, value| {
            let parse: fn(&str) -> Result<_, String> = $parse;
            options.$field.push(parse(value)?);
            Ok(())
        }
    };
    (@debug $value:expr) => {
        $value
    };
    (@debug $value:expr, $debug:path) => {
        &$debug($value)
    };
    (
        $(#[$meta:meta])*
        pub struct LoadOptions {
            $(
                $(#[$field_meta:meta])*
                $field:ident: $type:ty = $default:expr,
                $spec:expr,
                $how:ident $parse:expr,
                show $show:expr $(, debug $debug:path)?;
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct LoadOptions {
            $(
                $(#[$field_meta])*
                pub $field: $type,
            )*
        }

        impl Default for LoadOptions {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                }
            }
        }

        impl std::fmt::Debug for LoadOptions {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("LoadOptions")
                    $(.field(
                        stringify!($field),
                        load_options!(@debug &self.$field $(, $debug)?),
                    ))*
                    .finish()
            }
        }

        /// The load options, in the order the documentation lists them.
        pub(super) static OPTIONS: &[OptionSpec] = &[
            $(
                $spec.handled(load_options!(@set $field $how $parse), |options| {
                    let show: fn(&$type) -> Vec<String> = $show;
                    show(&options.$field)
                }),
            )*
        ];
    };
}
pub(super) use load_options;
