//! The spellings of the options' values: sizes, counts, booleans, paths, hosts, row ranges and
//! globs, each parsed once for every door.

use std::path::PathBuf;

use staging_core::RowRange;

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
    parse_size::parse_size(trimmed).map_err(|e| match e {
        parse_size::Error::PosOverflow => {
            format!("{text:?} does not fit in 64 bits (at most 16 EiB - 1 byte)")
        }
        _ => format!("{text:?} is not a size: expected bytes or a number and a unit, like 4096, 512MiB or 2GiB"),
    })
}

pub(super) fn parse_usize_size(text: &str) -> Result<usize, String> {
    let size = parse_size(text)?;
    usize::try_from(size).map_err(|_| format!("{size} bytes is too large for this machine"))
}

/// A value that must be at least 1 (where 0 would mean a reader that never reads).
pub(super) fn positive<T: PartialEq + From<u8>>(parsed: Result<T, String>) -> Result<T, String> {
    match parsed {
        Ok(value) if value == T::from(0) => Err("must be at least 1".into()),
        other => other,
    }
}

pub(super) fn parse_count(text: &str) -> Result<usize, String> {
    text.trim()
        .parse::<usize>()
        .map_err(|_| format!("{text:?} is not a whole number"))
}

pub(super) fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("{text:?} is not true or false")),
    }
}

pub(super) fn parse_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("an empty path".into());
    }
    Ok(PathBuf::from(text))
}

/// A host a redirect may go to: `host` (a name or an address, without port), `*.domain` or `*`.
pub(super) fn parse_host(text: &str) -> Result<String, String> {
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

pub(super) fn parse_key_value(text: &str) -> Result<(String, String), String> {
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
    // A plain name is a glob matching itself (it has no glob character to misread).
    if !is_name(pattern) {
        glob(pattern)?;
    }
    Ok((pattern.to_owned(), rows))
}

/// Characters that make a pattern a glob rather than a name.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}', '\\'];

/// Whether `pattern` is a plain tensor name (no glob characters).
pub(super) fn is_name(pattern: &str) -> bool {
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

pub(super) fn glob(pattern: &str) -> Result<globset::Glob, String> {
    globset::GlobBuilder::new(pattern)
        .backslash_escape(true)
        .build()
        .map_err(|e| format!("{pattern:?} is not a glob: {e}"))
}
