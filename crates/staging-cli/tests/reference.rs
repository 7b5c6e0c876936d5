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

const ERRORS_INTRO: &str = "\
# Errors

<!-- Generated from the library's table of error kinds (`KINDS_IN_DOORS`) by
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
        // The library's one table of what each door makes of a kind (Python and C read it too).
        let row = kind.in_doors();
        let (meaning, python, status) = (row.meaning, row.python_class, row.c_status);
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
