//! Which files of a folder make its checkpoint: the one rule every store's loads follow, a
//! local directory's, an object store's prefix's and a Hugging Face repository listing's alike
//! (the folder's `model.safetensors.index.json`, else its `model.safetensors`, else every
//! `*.safetensors` not hidden, in natural order), and the shard names an index lists.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::store::checked_components;
use crate::error::{Error, Result};

/// The index file name Hugging Face uses for sharded checkpoints.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
/// The single-file checkpoint name.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";

/// What a folder's entries say its checkpoint is made of ([`checkpoint_files`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout<N> {
    /// The folder's index, [`INDEX_FILE_NAME`], names the shards.
    Index,
    /// The single file [`SINGLE_FILE_NAME`].
    Single,
    /// These files (each a `*.safetensors` name not starting with `.`), in natural order
    /// ([`natural_cmp`]); never empty.
    Files(Vec<N>),
    /// No safetensors weights at all.
    Nothing,
}

/// Which of a folder's entries (`names`, each a name directly in it, in any order) make its
/// checkpoint: [`INDEX_FILE_NAME`] if it is there, else [`SINGLE_FILE_NAME`], else every
/// name ending in `.safetensors` that does not start with `.`, in natural order.
pub fn checkpoint_files<'a>(names: impl IntoIterator<Item = &'a str>) -> Layout<&'a str> {
    let names: Vec<&str> = names.into_iter().collect();
    let found = checkpoint_files_with(
        |name| Ok::<_, std::convert::Infallible>(names.contains(&name)),
        || Ok(names.clone()),
    );
    match found {
        Ok(layout) => layout,
        Err(never) => match never {},
    }
}

/// [`checkpoint_files`] for a folder that is asked: `has` says whether a name is there (asked
/// for the index, then the single file), and only when neither is, `list` gives every name.
/// A store that can answer `has` without listing (a local directory, an object store) lists
/// nothing when an index or single file is there.
pub fn checkpoint_files_with<N: AsRef<str>, E>(
    mut has: impl FnMut(&str) -> Result<bool, E>,
    list: impl FnOnce() -> Result<Vec<N>, E>,
) -> Result<Layout<N>, E> {
    if has(INDEX_FILE_NAME)? {
        return Ok(Layout::Index);
    }
    if has(SINGLE_FILE_NAME)? {
        return Ok(Layout::Single);
    }
    let mut found: Vec<N> = list()?
        .into_iter()
        .filter(|name| {
            let name = name.as_ref();
            name.ends_with(".safetensors") && !name.starts_with('.')
        })
        .collect();
    if found.is_empty() {
        return Ok(Layout::Nothing);
    }
    found.sort_by(|a, b| natural_cmp(a.as_ref(), b.as_ref()));
    Ok(Layout::Files(found))
}

/// An index as far as it is read: which shard holds each tensor.
#[derive(Deserialize)]
pub(super) struct IndexFile {
    pub(super) weight_map: BTreeMap<String, String>,
}

impl IndexFile {
    /// The index in `bytes`; `Err` says why they are not one.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| {
            let reason = e.to_string();
            // A JSON file that is no index at all (a model's config.json, given as its path).
            if reason.starts_with("missing field `weight_map`") {
                "no `weight_map`, so not a safetensors index (a config.json? give the \
                 checkpoint's directory or its .safetensors files)"
                    .to_owned()
            } else {
                reason
            }
        })
    }

    /// The shard names it lists, each once, in natural order; `Err` says why one is not a
    /// plain relative path ([`checked_components`]).
    pub(super) fn shard_names(&self) -> Result<Vec<&str>, String> {
        let mut names: Vec<&str> = self.weight_map.values().map(String::as_str).collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        names.dedup();
        for name in &names {
            checked_components(name).map_err(|why| format!("shard path {name:?} {why}"))?;
        }
        Ok(names)
    }
}

/// The shard names the index `bytes` (read from `index_path`) lists, each once, in natural
/// order (the order a load reads them), every one a plain relative path
/// ([`checked_components`]): what [`Checkpoint::from_index`](crate::Checkpoint::from_index)
/// reads of an index, with its checks and its [`Error::Index`] when the bytes are no JSON
/// object with a `weight_map` of strings, or a name is not a plain relative path.
pub fn index_shard_names(index_path: &Path, bytes: &[u8]) -> Result<Vec<String>> {
    let index = IndexFile::parse(bytes).map_err(|reason| Error::index(index_path, reason))?;
    let names = index
        .shard_names()
        .map_err(|reason| Error::index(index_path, reason))?;
    Ok(names.into_iter().map(str::to_owned).collect())
}

/// Compares names the way people count: "shard-2" before "shard-10".
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let dx = x.iter().take_while(|c| c.is_ascii_digit()).count();
                let dy = y.iter().take_while(|c| c.is_ascii_digit()).count();
                let (nx, ny) = (&x[..dx], &y[..dy]);
                let trim = |s: &'_ [u8]| -> usize { s.iter().take_while(|&&c| c == b'0').count() };
                let (tx, ty) = (&nx[trim(nx)..], &ny[trim(ny)..]);
                let ord = tx.len().cmp(&ty.len()).then_with(|| tx.cmp(ty));
                if ord != Ordering::Equal {
                    return ord;
                }
                x = &x[dx..];
                y = &y[dy..];
            }
            (Some(c), Some(d)) => {
                if c != d {
                    return c.cmp(d);
                }
                x = &x[1..];
                y = &y[1..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("a-2", "a-10", Ordering::Less)]
    #[case("model-00002-of-00003", "model-00010-of-00003", Ordering::Less)]
    #[case("x10", "x9", Ordering::Greater)]
    #[case("x010", "x10", Ordering::Less)]
    #[case("abc", "abd", Ordering::Less)]
    #[case("ab", "ab1", Ordering::Less)]
    fn natural_order(#[case] a: &str, #[case] b: &str, #[case] expected: Ordering) {
        assert_eq!(natural_cmp(a, b), expected);
        assert_eq!(natural_cmp(b, a), expected.reverse());
    }

    #[rstest]
    // The index wins over everything else.
    #[case(&["model.safetensors", "model.safetensors.index.json", "a.safetensors"], Layout::Index)]
    // Then the single file, over the other safetensors files.
    #[case(&["other.safetensors", "model.safetensors", "config.json"], Layout::Single)]
    // Then every safetensors file, in natural order, hidden ones and other names left out.
    #[case(
        &["s-10.safetensors", ".s-0.safetensors", "s-9.safetensors", "s.safetensors.bak",
          "README.md", ".safetensors", "S-1.SAFETENSORS"],
        Layout::Files(vec!["s-9.safetensors", "s-10.safetensors"])
    )]
    // Nothing.
    #[case(&["pytorch_model.bin", "config.json", ".hidden.safetensors"], Layout::Nothing)]
    #[case(&[], Layout::Nothing)]
    fn a_folder_s_checkpoint_is_its_index_else_its_single_file_else_its_shards(
        #[case] names: &[&str],
        #[case] expected: Layout<&str>,
    ) {
        assert_eq!(checkpoint_files(names.iter().copied()), expected);
    }

    #[test]
    fn a_folder_with_an_index_or_a_single_file_is_never_listed() {
        for (there, expected) in [
            (INDEX_FILE_NAME, Layout::Index),
            (SINGLE_FILE_NAME, Layout::Single),
        ] {
            let mut asked = Vec::new();
            let layout = checkpoint_files_with(
                |name| {
                    asked.push(name.to_owned());
                    Ok::<_, ()>(name == there)
                },
                || -> Result<Vec<String>, ()> { panic!("listed") },
            );
            assert_eq!(layout, Ok(expected));
            assert_eq!(asked.last().map(String::as_str), Some(there));
        }
        // What the folder says fails is its caller's error.
        let failed = checkpoint_files_with(|_| Ok(false), || Err::<Vec<String>, _>("gone"));
        assert_eq!(failed, Err("gone"));
    }

    #[test]
    fn an_index_lists_its_shards_once_in_natural_order_each_a_plain_relative_path() {
        let index = br#"{"metadata":{"total_size":8},"weight_map":{
            "a":"s-10.safetensors","b":"s-9.safetensors","c":"s-10.safetensors","d":"sub/s-1.safetensors"}}"#;
        let at = Path::new("i.json");
        assert_eq!(
            index_shard_names(at, index).unwrap(),
            ["s-9.safetensors", "s-10.safetensors", "sub/s-1.safetensors"]
        );
        let hostile = br#"{"weight_map":{"a":"../../etc/passwd"}}"#;
        assert_eq!(
            index_shard_names(at, hostile).unwrap_err().to_string(),
            r#"i.json: invalid index: shard path "../../etc/passwd" contains '..'"#
        );
        let config = br#"{"model_type":"tiny"}"#;
        let error = index_shard_names(at, config).unwrap_err().to_string();
        assert!(
            error.starts_with("i.json: invalid index: no `weight_map`, so not a safetensors index"),
            "{error}"
        );
        for bad in [&br#"{"weight_map":{"a":1}}"#[..], b"[]", b"not json"] {
            let error = index_shard_names(at, bad).unwrap_err();
            assert!(matches!(error, Error::Index { .. }), "{error}");
        }
    }

    /// The rule as core's `open_dir` and the Hub's `choose` each wrote it before they shared
    /// [`checkpoint_files`] (the two agreed on the names of one folder): the chosen files,
    /// `None` for none.
    fn the_rule_as_it_was(names: &[&str]) -> Option<Vec<String>> {
        if names.contains(&INDEX_FILE_NAME) {
            return Some(vec![INDEX_FILE_NAME.to_owned()]);
        }
        if names.contains(&SINGLE_FILE_NAME) {
            return Some(vec![SINGLE_FILE_NAME.to_owned()]);
        }
        let mut found: Vec<String> = names
            .iter()
            .filter(|name| name.ends_with(".safetensors") && !name.starts_with('.'))
            .map(|name| (*name).to_owned())
            .collect();
        found.sort_by(|a, b| natural_cmp(a, b));
        (!found.is_empty()).then_some(found)
    }

    proptest::proptest! {
        /// Any folder's names, in any order, give the files the rule gave before it was shared.
        #[test]
        fn the_shared_rule_is_the_rule_both_callers_had(
            names in proptest::collection::vec(
                "(\\.?)(model|m|a-?[0-9]{1,3}|x[0-9]{0,2})(\\.safetensors(\\.index\\.json)?|\\.bin|\\.SAFETENSORS)?",
                0..12,
            ),
        ) {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let got = match checkpoint_files(names.iter().copied()) {
                Layout::Index => Some(vec![INDEX_FILE_NAME.to_owned()]),
                Layout::Single => Some(vec![SINGLE_FILE_NAME.to_owned()]),
                Layout::Files(files) => {
                    proptest::prop_assert!(!files.is_empty());
                    Some(files.iter().map(|f| (*f).to_owned()).collect())
                }
                Layout::Nothing => None,
            };
            proptest::prop_assert_eq!(got, the_rule_as_it_was(&names));
        }
    }
}
