//! The options' unit tests: sizes, rows and devices parsed; every key and alias set through
//! the table; its documented defaults against the real ones.

use super::*;
use crate::device::Device;
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
        (_, "map") => "false",
        (_, "rows") => "w=0:1",
        (_, "store_option") => "allow_http=true",
        (_, "allow_redirect") => "cdn.example.com",
        (ValueKind::Size, _) => "2MiB",
        (ValueKind::Count, _) => "3",
        (ValueKind::Bool, "suballocate" | "host_assembly" | "cache") => "false",
        (ValueKind::Bool, _) => "true",
        (ValueKind::Path, _) => "/x.so",
        (_, _) => "layers.*",
    };
    for spec in LoadOptions::specs() {
        let (key, kind) = (spec.name(), spec.kind());
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
fn aliases_set_their_key_and_errors_name_the_key_as_given() {
    let mut by_alias = LoadOptions::new();
    by_alias.set("device_memory", "1GiB").unwrap();
    let mut by_name = LoadOptions::new();
    by_name.set("memory_cap", "1GiB").unwrap();
    assert_eq!(by_alias, by_name);
    assert_eq!(by_alias.memory_cap, Some(1 << 30));
    let error = by_alias.set("device_memory", "lots").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("option device_memory=\"lots\""),
        "{error}"
    );
    assert_eq!(
        LoadOptions::spec("device_memory").map(OptionSpec::name),
        Some("memory_cap")
    );
}

#[test]
fn unknown_keys_list_every_key() {
    let error = LoadOptions::new()
        .set("chunk", "1")
        .unwrap_err()
        .to_string();
    for spec in LoadOptions::specs() {
        assert!(error.contains(spec.name()), "{error}");
    }
}

#[test]
fn the_table_spells_each_key_once() {
    let mut seen = std::collections::HashSet::new();
    for spec in LoadOptions::specs() {
        for key in std::iter::once(&spec.name()).chain(spec.aliases()) {
            assert!(seen.insert(*key), "{key} spells two options");
            assert!(
                key.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{key}"
            );
        }
        assert!(!spec.help().is_empty() && !spec.default().is_empty());
        assert!(
            !spec.help().contains("default"),
            "{}: the default has its own column",
            spec.name()
        );
        for choice in spec.choices() {
            let mut options = LoadOptions::new();
            options.set(spec.name(), choice).unwrap();
        }
    }
    assert_eq!(
        BackendKind::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>(),
        BackendKind::NAMES
    );
}

/// Every default the table shows as a value is what leaving the key out gives: setting it
/// changes neither the policy, nor the remote reader's options, nor any other field.
#[test]
fn documented_defaults_are_the_real_defaults() {
    let defaults = LoadOptions::new();
    let mut described = Vec::new();
    for spec in LoadOptions::specs() {
        if !spec.default_is_value() {
            described.push(spec.name());
            continue;
        }
        let mut options = LoadOptions::new();
        options
            .set(spec.name(), spec.default())
            .unwrap_or_else(|e| panic!("{}: its default does not parse: {e}", spec.name()));
        assert_eq!(
            options.policy().unwrap(),
            defaults.policy().unwrap(),
            "{}",
            spec.name()
        );
        #[cfg(feature = "remote")]
        {
            let (set, default) = (options.remote_options(), defaults.remote_options());
            assert_eq!(
                (
                    set.concurrency,
                    set.range_size,
                    set.max_retries,
                    set.bandwidth
                ),
                (
                    default.concurrency,
                    default.range_size,
                    default.max_retries,
                    default.bandwidth
                ),
                "{}",
                spec.name()
            );
        }
        // What the policy and the remote reader hold was compared above; anything else must
        // be the default field for field.
        let rest = LoadOptions {
            chunk_size: None,
            staging_size: None,
            headroom_min: None,
            headroom_divisor: None,
            threads: None,
            staging_slots: None,
            coalesce_below: None,
            concurrency: None,
            range_size: None,
            retries: None,
            bandwidth: None,
            ..options
        };
        assert_eq!(rest, defaults, "{}", spec.name());
    }
    // The defaults in words: what the key's absence means, checked where they can be.
    assert_eq!(
        described,
        [
            "memory_cap",
            "staging_size",
            "threads",
            "cufile_lib",
            "hipfile_lib",
            "hip_lib",
            "select",
            "rows",
            "bandwidth",
            "store_option",
            "allow_redirect",
            "cache_dir",
        ]
    );
    let policy = defaults.policy().unwrap();
    assert_eq!(policy.staging_size(), policy.chunk_size());
    assert_eq!(policy.io_threads(), staging_core::default_io_threads());
    assert!(defaults.memory_cap.is_none() && defaults.bandwidth.is_none());
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

/// The lines of `describe` that set something, set again (comments and defaults left out).
fn set_again(text: &str) -> LoadOptions {
    let mut options = LoadOptions::new();
    let set = |line: &&str| !line.starts_with('#') && !line.ends_with("  # default");
    for line in text.lines().filter(set) {
        let (key, value) = line.split_once(" = ").unwrap();
        options.set(key, value).unwrap();
    }
    options
}

#[test]
fn describe_prints_every_key_in_the_spelling_set_takes() {
    let defaults = LoadOptions::new().describe();
    for spec in LoadOptions::specs() {
        let key = spec.name();
        assert!(
            defaults.contains(&format!("{key} = ")),
            "{key} missing from:\n{defaults}"
        );
    }
    assert!(
        defaults.contains("backend = auto  # default\n"),
        "{defaults}"
    );
    assert!(
        defaults.contains("# memory_cap = none (default)\n"),
        "{defaults}"
    );
    assert!(!defaults.contains("Some("), "{defaults}");
    assert_eq!(set_again(&defaults), LoadOptions::new());

    let mut options = LoadOptions::new();
    for (key, value) in [
        ("backend", "host"),
        ("device", "cuda:1"),
        ("memory_cap", "300MiB"),
        ("chunk_size", "4194304"),
        ("headroom_min", "1000"),
        ("headroom_divisor", "3"),
        ("threads", "2"),
        ("suballocate", "false"),
        ("direct_io", "true"),
        ("cufile_mode", "compat"),
        ("cufile_lib", "/opt/libcufile.so"),
        ("select", "encoder.*"),
        ("select", "lm_head.weight"),
        ("rows", "*.bias=1/3"),
        ("rows", "w=10:100"),
        ("bandwidth", "1GiB"),
        ("allow_redirect", "cdn.example.com"),
    ] {
        options.set(key, value).unwrap();
    }
    let text = options.describe();
    for line in [
        "backend = host\n",
        "device = cuda:1\n",
        "memory_cap = 300MiB\n",
        "chunk_size = 4MiB\n",
        "headroom_min = 1000\n",
        "select = encoder.*\nselect = lm_head.weight\n",
        "rows = *.bias=1/3\nrows = w=10:100\n",
        "cufile_lib = /opt/libcufile.so\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert_eq!(set_again(&text), options);
}

#[rstest]
#[case(
    "lots",
    "option chunk_size=\"lots\": \"lots\" is not a size: expected bytes or a number and a unit, like 4096, 512MiB or 2GiB"
)]
#[case(
    "1.5",
    "option chunk_size=\"1.5\": \"1.5\" is not a whole number of bytes"
)]
#[case(
    "16EiB",
    "option chunk_size=\"16EiB\": \"16EiB\" does not fit in 64 bits (at most 16 EiB - 1 byte)"
)]
fn a_bad_size_says_what_was_expected(#[case] value: &str, #[case] message: &str) {
    let error = LoadOptions::new().set("chunk_size", value).unwrap_err();
    assert_eq!(error.to_string(), message);
}

/// Every key of the table shows in `describe` as set once it is set to something other than
/// its default: a row whose getter does not show what its setter set fails here.
#[test]
fn describe_shows_every_key_once_set() {
    for spec in LoadOptions::specs() {
        let key = spec.name();
        let value = match (spec.kind(), key) {
            (_, "backend") => "host",
            (_, "device") => "cuda:2",
            (_, "cufile_mode") => "posix",
            (_, "hipfile_mode") => "hipfile",
            (_, "map") => "true",
            (_, "rows") => "w=1/2",
            (_, "store_option") => "aws_region=x",
            (_, "allow_redirect") => "cdn.example.com",
            (ValueKind::Bool, _) if spec.default() == "true" => "false",
            (ValueKind::Bool, _) => "true",
            (ValueKind::Path, _) => "/lib.so",
            (ValueKind::Repeated, _) => "a.*",
            _ => "7",
        };
        let mut options = LoadOptions::new();
        options.set(key, value).unwrap();
        let text = options.describe();
        let line = text
            .lines()
            .find(|line| line.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("{key} not shown as set:\n{text}"));
        assert!(!line.ends_with("# default"), "{key}: {line}");
        // A redacted value is not kept (a build without `remote` redacts every store option).
        if !line.contains("<redacted>") {
            assert_eq!(set_again(&text), options, "{key}");
        }
    }
}

#[test]
fn the_first_rows_rule_given_wins_whether_by_name_or_glob() {
    use staging_core::write::{TensorSpec, write_file};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let specs: Vec<TensorSpec> = ["w", "x", "y"]
        .into_iter()
        .map(|name| TensorSpec::new(name, staging_core::Dtype::U8, &[8, 2]))
        .collect();
    write_file(&path, &specs, 1).unwrap();
    let checkpoint = staging_core::Checkpoint::open(&path).unwrap();
    let rows_of = |rules: &[&str]| -> Vec<(String, Option<std::ops::Range<usize>>)> {
        let mut options = LoadOptions::new();
        for rule in rules {
            options.set("rows", rule).unwrap();
        }
        let narrowed = checkpoint.select(&options.selection().unwrap()).unwrap();
        narrowed
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.row_range.clone()))
            .collect()
    };
    let all = |w, x, y| {
        vec![
            ("w".to_owned(), w),
            ("x".to_owned(), x),
            ("y".to_owned(), y),
        ]
    };
    // A name before a glob: the name's rule for it, the glob's for the rest.
    assert_eq!(
        rows_of(&["w=0:1", "*=1:2"]),
        all(Some(0..1), Some(1..2), Some(1..2))
    );
    // A glob before a name: the glob's rule for every tensor it matches.
    assert_eq!(
        rows_of(&["*=1:2", "w=0:1"]),
        all(Some(1..2), Some(1..2), Some(1..2))
    );
    // Two rules for one name: the first; a glob matching none of the names before it.
    assert_eq!(
        rows_of(&["w=0:1", "w=2:4", "[xz]=3:5"]),
        all(Some(0..1), Some(3..5), None)
    );
    // A glob after a name that it does not match, then one that does.
    assert_eq!(
        rows_of(&["x=0:2", "w=5:6", "?=7:8"]),
        all(Some(5..6), Some(0..2), Some(7..8))
    );
}
