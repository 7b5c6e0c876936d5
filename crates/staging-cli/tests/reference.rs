//! The generated reference pages, `docs/reference/options.md` (from the library's one table of
//! load options) and `docs/reference/errors.md` (from its error kinds and what each door makes
//! of them): this test renders both and fails when the committed file differs. Run it with
//! `STAGING_BLESS=1` to write them again:
//!
//! ```text
//! STAGING_BLESS=1 cargo test -p staging-cli --test reference
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use std::fmt::Write as _;
use std::path::PathBuf;

use safetensors_staging::{ErrorKind, LoadOptions, ValueKind};

/// The workspace's `docs/reference/`.
fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference")
}

/// Compares `rendered` with the committed `name`, or writes it under `STAGING_BLESS=1`.
fn check(name: &str, rendered: &str) {
    let path = reference_dir().join(name);
    if std::env::var_os("STAGING_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(reference_dir()).unwrap();
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "docs/reference/{name} is not what the library's tables give; write it again with\n\
         STAGING_BLESS=1 cargo test -p staging-cli --test reference\n\
         (first differing line: {:?})",
        committed
            .lines()
            .zip(rendered.lines())
            .find(|(a, b)| a != b)
            .map(|(_, b)| b)
            .or_else(|| rendered.lines().nth(committed.lines().count()))
    );
}

/// Text for a table cell: markdown's table and emphasis characters escaped.
fn cell(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code && matches!(c, '|' | '*' | '_' | '<' | '>' | '[' | ']') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn code(text: &str) -> String {
    format!("`{text}`")
}

const OPTIONS_INTRO: &str = "\
# Load options

<!-- Generated from the library's table of load options (`LoadOptions::specs()` in
     `src/options/table.rs`) by `crates/staging-cli/tests/reference.rs`; do not edit by hand:
     `STAGING_BLESS=1 cargo test -p staging-cli --test reference` writes it again. -->

Every door spells the same keys, and the library parses every value (`LoadOptions::set`), so a
value means the same wherever it is given:

- **`stage`**: the key as a flag, underscores as dashes: `chunk_size` is `--chunk-size 4MiB`. A
  `bool` flag alone means true (`--direct-io`); a `repeated` flag is given once per value.
- **Python**: the key as a keyword argument of `load_file`, `stage` and `safe_open`
  (`chunk_size=\"4MiB\"` or `chunk_size=4 << 20`): text, or an `int`, `bool`, path or
  `torch.device` spelled as text. `select` also takes a list of names or a function of a name,
  `rows` a dict of name (or glob) to `(start, end)` or a function, `store_options` a dict (the
  key `store_option`, one pair each), `allow_redirect` a list. `None` keeps the default.
- **C**: the key as it is, `stg_config_set(config, \"chunk_size\", \"4MiB\")`; a `repeated` key
  is set once per value.

An alias is accepted wherever its key is, spelled the same way (`device_memory`,
`--device-memory`). Sizes are `4096`, `512MiB`, `2GiB`, `1MB` (`K`, `M`, `G`, `T` decimal;
`Ki`, `Mi`, `Gi`, `Ti` binary); booleans `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
An unknown key, or a value that does not parse, is an `invalid-option` error
([errors](errors.md)) and changes nothing.

| Key | `stage` flag | Python keyword | C key | Aliases | Kind | Default | Help |
|---|---|---|---|---|---|---|---|
";

fn options_page() -> String {
    let mut page = OPTIONS_INTRO.to_owned();
    for spec in LoadOptions::specs() {
        let aliases = spec
            .aliases()
            .iter()
            .zip(spec.flag_aliases())
            .map(|(alias, flag)| format!("{}, {}", code(alias), code(&format!("--{flag}"))))
            .collect::<Vec<_>>()
            .join("; ");
        let kind = match spec.kind() {
            ValueKind::Choice if !spec.choices().is_empty() => format!(
                "choice: {}",
                spec.choices()
                    .iter()
                    .map(|c| code(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ValueKind::Bool | ValueKind::Size | ValueKind::Count => spec.kind().as_str().to_owned(),
            other => format!("{} {}", other.as_str(), code(spec.value_name())),
        };
        let default = if spec.default_is_value() {
            code(spec.default())
        } else {
            cell(spec.default())
        };
        writeln!(
            page,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            code(spec.name()),
            code(&match spec.kind() {
                // A boolean's value is optional: the flag alone means true.
                ValueKind::Bool => format!("--{} [{}]", spec.flag(), spec.value_name()),
                _ => format!("--{} {}", spec.flag(), spec.value_name()),
            }),
            code(spec.python_keyword()),
            code(spec.c_key()),
            aliases,
            kind,
            default,
            cell(spec.help()),
        )
        .unwrap();
    }
    page
}

/// What each door makes of an error kind: its meaning, Python's exception class and C's status
/// (as `staging-py/src/errors.rs` `class_of` and `staging-ffi` `status_of_kind` map them; the
/// doors' own tests hold this page to their mappings).
fn error_row(kind: ErrorKind) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match kind {
        ErrorKind::NotFound => (
            "A path (a file, a directory, an object) does not exist.",
            "PathNotFoundError",
            "STG_NOT_FOUND",
        ),
        ErrorKind::PermissionDenied => (
            "A path the process may not open.",
            "PathPermissionError",
            "STG_PERMISSION_DENIED",
        ),
        ErrorKind::Io => (
            "Any other failure to open, inspect or read a file while reading the headers.",
            "ReadError",
            "STG_IO",
        ),
        ErrorKind::InvalidCheckpoint => (
            "A header or index is malformed, disagrees with the files, or a file is shorter than its header says.",
            "MalformedCheckpointError",
            "STG_INVALID_CHECKPOINT",
        ),
        ErrorKind::NotACheckpoint => (
            "A path is not a regular file, or a directory holds no checkpoint.",
            "MalformedCheckpointError",
            "STG_NOT_A_CHECKPOINT",
        ),
        ErrorKind::Read => (
            "A read failed during the load, or a file changed under it.",
            "ReadError",
            "STG_READ",
        ),
        ErrorKind::DeviceAllocation => (
            "A device allocation failed where the policy had no fallback left (the staging buffer), or failed with something other than out-of-memory.",
            "OutOfMemoryError",
            "STG_ALLOCATION",
        ),
        ErrorKind::HostAllocation => (
            "Host memory for a host-assembled tensor could not be allocated.",
            "OutOfMemoryError",
            "STG_HOST_ALLOCATION",
        ),
        ErrorKind::Device => (
            "A device operation (memory query, copy) failed.",
            "DeviceError",
            "STG_DEVICE",
        ),
        ErrorKind::Destination => (
            "The caller's destination failed, or gave memory of the wrong kind.",
            "DestinationError",
            "STG_DESTINATION",
        ),
        ErrorKind::DestinationTooSmall => (
            "The caller's destination is shorter than the tensor.",
            "DestinationError",
            "STG_DESTINATION_TOO_SMALL",
        ),
        ErrorKind::Selection => (
            "A selection names a tensor the checkpoint does not hold, or rows a tensor does not have.",
            "SelectionError",
            "STG_SELECTION",
        ),
        ErrorKind::InvalidOption => (
            "An option's value is malformed, out of range, or inconsistent with the others; an unknown key; a backend and a device that do not go together.",
            "InvalidOptionError",
            "STG_INVALID_ARGUMENT",
        ),
        ErrorKind::BackendUnavailable => (
            "The backend or device asked for cannot run here (no driver, no device, no library, not built in), or a GPU was asked for and none can be used.",
            "BackendUnavailableError",
            "STG_BACKEND_UNAVAILABLE",
        ),
        ErrorKind::Usage => (
            "A tensor's bytes cannot be had the way asked for (already taken, another path).",
            "StagingError",
            "STG_INVALID_ARGUMENT",
        ),
        ErrorKind::Resource => (
            "The system refused a resource the load needs to run: its threads (a limit on processes or threads, memory for their stacks) or descriptors. The message names the limit.",
            "ResourceError",
            "STG_RESOURCE",
        ),
        ErrorKind::Internal => (
            "An invariant of the library did not hold: a bug.",
            "StagingError",
            "STG_INTERNAL",
        ),
        _ => return None,
    })
}

const ERRORS_INTRO: &str = "\
# Errors

<!-- Generated from the library's error kinds (`ErrorKind::ALL`) by
     `crates/staging-cli/tests/reference.rs`; do not edit by hand:
     `STAGING_BLESS=1 cargo test -p staging-cli --test reference` writes it again. -->

Every failure has one kind, decided by the library (`Error::kind()` in Rust), and each door
derives what it shows from that kind alone. The message is one line for people, naming the
file (and the tensor and offset) where there is one; where there is more to tell (each GPU
backend's reason when a GPU was asked for and none is usable) it is in the error's details
(`Error::details()` in Rust).

- **`stage`** prints the error's one line on stderr and exits 1; `-v` adds the kind and the
  details, `--json` puts `{\"error\": {\"kind\", \"message\", \"file\", \"tensor\", \"details\"}}` on
  stdout. Its own misuse (no checkpoint given, a flag it does not take) is kind `usage`; a
  command line it cannot parse exits 2, as every clap program.
- **Python** raises the kind's exception class; every class derives from `StagingError` (and,
  where `safetensors` is installed, from `safetensors.SafetensorError`), the instance's `kind`
  attribute is the kind's name below and its `details` the details. `PathNotFoundError` and
  `PathPermissionError` are also `FileNotFoundError` and `PermissionError`,
  `OutOfMemoryError` a `MemoryError`, `InvalidOptionError` a `ValueError`, `ResourceError` an
  `OSError` (its `errno` the system's code).
- **C** returns the kind's `stg_status`, the message in `stg_load_last_error` (or
  `stg_config_last_error`); `stg_status_str` names a status. The statuses that are about the
  call itself (`STG_NULL_ARGUMENT`, `STG_INVALID_UTF8`, `STG_BUSY`, `STG_PANIC`, ...) are
  documented in `staging_ffi.h`.

| Kind | Meaning | Python exception | C status |
|---|---|---|---|
";

fn errors_page() -> String {
    let mut page = ERRORS_INTRO.to_owned();
    for kind in ErrorKind::ALL {
        let (meaning, python, status) =
            error_row(kind).unwrap_or_else(|| panic!("error kind {kind} has no row"));
        writeln!(
            page,
            "| {} | {} | {} | {} |",
            code(kind.as_str()),
            cell(meaning),
            code(python),
            code(status)
        )
        .unwrap();
    }
    page
}

#[test]
fn options_page_is_the_table() {
    check("options.md", &options_page());
}

#[test]
fn errors_page_is_the_error_kinds() {
    check("errors.md", &errors_page());
}

#[test]
fn every_option_and_kind_is_on_its_page() {
    let options = options_page();
    for spec in LoadOptions::specs() {
        assert!(options.contains(&format!("| `{}` |", spec.name())));
    }
    let errors = errors_page();
    for kind in ErrorKind::ALL {
        assert!(errors.contains(&format!("| `{kind}` |")));
    }
}
