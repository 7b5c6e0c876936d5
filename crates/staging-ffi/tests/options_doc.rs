//! The C header against the library's tables: `stg_config_set`'s documentation in
//! `include/staging_ffi.h` names every key of `LoadOptions::specs()` and its aliases (and every choice of a key
//! with a fixed list), and every C status `docs/reference/errors.md` maps an error kind to is a
//! status of the header.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code asserts by panicking

use safetensors_staging::LoadOptions;

const HEADER: &str = include_str!("../include/staging_ffi.h");

/// The documentation of `stg_config_set`: the comment just before its declaration.
fn config_set_doc() -> &'static str {
    let declaration = HEADER
        .find("stg_status stg_config_set(")
        .expect("stg_config_set is declared");
    let start = HEADER[..declaration]
        .rfind("/*")
        .expect("stg_config_set is documented");
    &HEADER[start..declaration]
}

/// Whether `text` holds `word` as a whole word (not inside a longer name).
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let inside = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !inside(before) && !inside(after)
    })
}

#[test]
fn stg_config_set_documents_every_key() {
    let doc = config_set_doc();
    let missing: Vec<&str> = LoadOptions::specs()
        .iter()
        .flat_map(|spec| std::iter::once(spec.c_key()).chain(spec.aliases().iter().copied()))
        .filter(|key| !doc.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "stg_config_set's documentation in staging_ffi.h leaves out {missing:?}"
    );
}

#[test]
fn stg_config_set_documents_every_choice() {
    let doc = config_set_doc();
    for spec in LoadOptions::specs() {
        for choice in spec.choices() {
            // `mock` is documented as left out of release builds; it is still named.
            assert!(
                has_word(doc, choice),
                "stg_config_set's documentation does not name {choice} (a value of {})",
                spec.c_key()
            );
        }
    }
}

#[test]
fn the_error_reference_names_statuses_of_the_header() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/errors.md"),
    )
    .unwrap();
    let mut rows = 0;
    for line in page.lines().filter(|line| line.starts_with("| `")) {
        let status = line
            .trim_end_matches([' ', '|'])
            .rsplit('|')
            .next()
            .unwrap()
            .trim()
            .trim_matches('`');
        assert!(
            HEADER.contains(&format!("  {status} = ")),
            "errors.md maps a kind to {status}, which staging_ffi.h does not declare"
        );
        rows += 1;
    }
    assert_eq!(rows, safetensors_staging::ErrorKind::ALL.len());
}
