//! Which files of a repository a load reads, as core chooses them for every store
//! ([`checkpoint_files`]: the index, else `model.safetensors`, else every `*.safetensors` in
//! natural order); the shards an index names, as core reads them ([`index_shard_names`]); the
//! small files fetched beside the weights (every file that is not a weight).

use staging_core::{
    INDEX_FILE_NAME, Layout, SINGLE_FILE_NAME, checkpoint_files, index_shard_names,
};

use crate::api::TreeFile;
use crate::path::HubPath;

/// The largest file fetched whole beside the weights (a tokenizer is tens of MB at most): a
/// larger one that is not a weight (a dataset sample, an archive) is not fetched.
pub(crate) const SMALL_FILE_MAX: u64 = 256 << 20;

/// Whether `name` is a weight file of a format other than the safetensors chosen (these are
/// never fetched as small files).
pub(crate) fn is_weight(name: &str) -> bool {
    const WEIGHTS: &[&str] = &[
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".h5",
        ".msgpack",
        ".onnx",
        ".onnx_data",
        ".gguf",
        ".ot",
        ".tflite",
        ".mlmodel",
        ".npz",
        ".pkl",
        ".tar",
        ".zip",
        ".mlpackage",
        ".nemo",
        ".engine",
        ".plan",
    ];
    let lower = name.to_ascii_lowercase();
    WEIGHTS.iter().any(|ext| lower.ends_with(ext))
        || lower.contains(".safetensors.")
        || lower.ends_with(".index.json") && lower.contains("safetensors")
        || lower.ends_with(".index.json") && lower.contains("pytorch_model")
}

/// The weight files the loaders would read under `dir` (`""`: the root), and the index, if
/// one names them: the file asked for, else what core's rule picks of the folder's files
/// ([`checkpoint_files`]: `model.safetensors.index.json`, else `model.safetensors`, else every
/// `*.safetensors` there in natural order). `Err` says what is there instead.
pub(crate) fn choose(
    files: &[TreeFile],
    what: &HubPath,
) -> Result<(Option<String>, Vec<String>), String> {
    let given = what.path.as_deref().unwrap_or("");
    let exact = files.iter().find(|f| f.path == given);
    if let Some(file) = exact {
        if given.ends_with(".json") {
            return Ok((Some(file.path.clone()), Vec::new()));
        }
        return Ok((None, vec![file.path.clone()]));
    }
    let dir = if given.is_empty() {
        String::new()
    } else {
        format!("{given}/")
    };
    // The names directly in the folder (the listing holds files only).
    let in_dir = |name: &str| {
        name.strip_prefix(dir.as_str())
            .filter(|rest| !rest.contains('/'))
            .is_some()
    };
    let names = files
        .iter()
        .filter_map(|f| f.path.strip_prefix(dir.as_str()))
        .filter(|rest| !rest.contains('/'));
    let found = match checkpoint_files(names) {
        Layout::Index => return Ok((Some(format!("{dir}{INDEX_FILE_NAME}")), Vec::new())),
        Layout::Single => return Ok((None, vec![format!("{dir}{SINGLE_FILE_NAME}")])),
        Layout::Files(found) => found,
        Layout::Nothing => Vec::new(),
    };
    if found.is_empty() {
        if !given.is_empty() && !files.iter().any(|f| f.path.starts_with(&dir)) {
            return Err(format!("{} has no file or folder {given}", what.repo));
        }
        let others: Vec<&str> = files
            .iter()
            .map(|f| f.path.as_str())
            .filter(|p| in_dir(p) && is_weight(p))
            .take(5)
            .collect();
        let there = if others.is_empty() {
            String::new()
        } else {
            format!(" (weights in other formats: {})", others.join(", "))
        };
        return Err(format!(
            "{} has no safetensors weights in {}{there}",
            what.repo,
            if given.is_empty() { "its root" } else { given }
        ));
    }
    Ok((
        None,
        found.iter().map(|name| format!("{dir}{name}")).collect(),
    ))
}

/// Whether `path` is a repository's documentation (`README.md`, any `*.md`, `.gitattributes`),
/// which no load or loader reads.
pub(crate) fn is_documentation(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.to_ascii_lowercase().ends_with(".md") || name == ".gitattributes"
}

/// The shard files the index `index` names (joined under its folder), each once, in natural
/// order: core's reading of an index ([`index_shard_names`]), with its checks and words.
pub(crate) fn shards_of(bytes: &[u8], index: &str) -> Result<Vec<String>, String> {
    let names = index_shard_names(std::path::Path::new(index), bytes).map_err(|e| e.to_string())?;
    let dir = index.rsplit_once('/').map_or("", |(d, _)| d);
    Ok(names
        .into_iter()
        .map(|name| {
            if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> TreeFile {
        TreeFile {
            path: path.into(),
            size: 1,
            oid: "ab".into(),
            sha256: None,
        }
    }

    fn what(path: Option<&str>) -> HubPath {
        HubPath {
            repo: "org/name".into(),
            revision: None,
            path: path.map(str::to_owned),
        }
    }

    #[test]
    fn weights_are_chosen_as_the_loaders_choose_them() {
        let tree: Vec<TreeFile> = [
            "config.json",
            "model-00002-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
            "consolidated.safetensors",
            "model.safetensors.index.json",
            "sub/model-10.safetensors",
            "sub/model-9.safetensors",
            "onnx/model.onnx",
        ]
        .iter()
        .map(|p| file(p))
        .collect();
        assert_eq!(
            choose(&tree, &what(None)).unwrap(),
            (Some("model.safetensors.index.json".into()), vec![])
        );
        assert_eq!(
            choose(&tree, &what(Some("sub"))).unwrap(),
            (
                None,
                vec![
                    "sub/model-9.safetensors".into(),
                    "sub/model-10.safetensors".into()
                ]
            )
        );
        assert_eq!(
            choose(&tree, &what(Some("consolidated.safetensors"))).unwrap(),
            (None, vec!["consolidated.safetensors".into()])
        );
        let e = choose(&tree, &what(Some("onnx"))).unwrap_err();
        assert!(
            e.contains("no safetensors weights in onnx") && e.contains("onnx/model.onnx"),
            "{e}"
        );
        let e = choose(&tree, &what(Some("nope"))).unwrap_err();
        assert!(e.contains("no file or folder nope"), "{e}");
        let single = [file("model.safetensors"), file("other.safetensors")];
        assert_eq!(
            choose(&single, &what(None)).unwrap(),
            (None, vec!["model.safetensors".into()])
        );
    }

    #[test]
    fn small_files_are_everything_but_weights() {
        for name in [
            "config.json",
            "tokenizer.json",
            "tokenizer.model",
            "1_Pooling/config.json",
            "README.md",
        ] {
            assert!(!is_weight(name), "{name}");
        }
        for name in [
            "model.safetensors",
            "pytorch_model.bin",
            "x.gguf",
            "model.safetensors.index.json",
            "pytorch_model.bin.index.json",
            "flax_model.msgpack",
        ] {
            assert!(is_weight(name), "{name}");
        }
    }

    #[test]
    fn an_index_names_its_shards_under_its_folder_and_nothing_outside() {
        // Each once, in natural order (as core reads them), whichever tensor names them first.
        let index = br#"{"weight_map":{"a":"s-10.safetensors","b":"s-2.safetensors","c":"s-10.safetensors"}}"#;
        assert_eq!(
            shards_of(index, "sub/model.safetensors.index.json").unwrap(),
            ["sub/s-2.safetensors", "sub/s-10.safetensors"]
        );
        let hostile = br#"{"weight_map":{"a":"../../etc/passwd"}}"#;
        assert!(shards_of(hostile, "i.json").unwrap_err().contains("'..'"));
        for bad in [&b"{}"[..], br#"{"weight_map":{"a":1}}"#, b"[]", b"not json"] {
            let error = shards_of(bad, "i.json").unwrap_err();
            assert!(error.starts_with("i.json: invalid index: "), "{error}");
        }
        // Other keys (`metadata`) are the index's business.
        let with_metadata = br#"{"metadata":{"total_size":8},"weight_map":{"a":"s.safetensors"}}"#;
        assert_eq!(
            shards_of(with_metadata, "i.json").unwrap(),
            ["s.safetensors"]
        );
    }

    /// The names a folder may hold: the index, the single file, shards whose natural and
    /// byte orders differ, hidden files, near misses and other formats.
    const POOL: &[&str] = &[
        "model.safetensors.index.json",
        "model.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00010-of-00003.safetensors",
        "model-00001-of-00003.safetensors",
        "a-9.safetensors",
        "a-10.safetensors",
        "A-2.safetensors",
        ".hidden.safetensors",
        "model.safetensors.bak",
        "x.SAFETENSORS",
        "pytorch_model.bin",
        "config.json",
    ];

    /// A safetensors file holding one byte, the tensor `tensor`.
    fn write_weights(path: &std::path::Path, tensor: &str) {
        let header = format!(r#"{{"{tensor}":{{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}}}"#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.push(7);
        std::fs::write(path, bytes).unwrap();
    }

    proptest::proptest! {
        /// For any folder listing (at the root or in a folder, beside files of another folder),
        /// the Hub picks the files core's open of a real folder of those files reads: the index's
        /// shards in the same order, the single file, or the shards in the same order; and
        /// neither finds weights where the other finds none.
        #[test]
        fn the_hub_picks_what_core_opens(
            chosen in proptest::sample::subsequence(POOL, 0..=POOL.len()),
            in_index in proptest::collection::vec(proptest::bool::ANY, POOL.len()),
            in_sub in proptest::bool::ANY,
        ) {
            let root = tempfile::tempdir().unwrap();
            let (prefix, other) = if in_sub { ("sub/", "") } else { ("", "sub/") };
            std::fs::create_dir_all(root.path().join("sub")).unwrap();
            let folder = root.path().join(prefix);
            let mut listing: Vec<String> = vec![
                format!("{other}model.safetensors"),
                format!("{other}b.safetensors"),
            ];
            for name in [&format!("{other}model.safetensors"), &format!("{other}b.safetensors")] {
                write_weights(&root.path().join(name), name);
            }
            // The index names the chosen weight files its mask picks.
            let mut weight_map = std::collections::BTreeMap::new();
            for (name, named) in chosen.iter().zip(&in_index) {
                listing.push(format!("{prefix}{name}"));
                let path = folder.join(name);
                if name.ends_with(".safetensors") {
                    write_weights(&path, &format!("t:{name}"));
                    if *named {
                        weight_map.insert(format!("t:{name}"), name.to_string());
                    }
                } else if *name != INDEX_FILE_NAME {
                    std::fs::write(&path, b"{}").unwrap();
                }
            }
            let index = serde_json::to_vec(&serde_json::json!({ "weight_map": weight_map })).unwrap();
            if chosen.contains(&INDEX_FILE_NAME) {
                std::fs::write(folder.join(INDEX_FILE_NAME), &index).unwrap();
            }
            let tree: Vec<TreeFile> = listing.iter().map(|p| file(p)).collect();
            let hub = choose(&tree, &what(in_sub.then_some("sub")));
            let core = staging_core::Checkpoint::open(&folder);
            let hub_files = match hub {
                Ok((Some(index_path), files)) => {
                    proptest::prop_assert!(files.is_empty());
                    proptest::prop_assert_eq!(index_path, format!("{prefix}{INDEX_FILE_NAME}"));
                    shards_of(&index, &format!("{prefix}{INDEX_FILE_NAME}")).unwrap()
                }
                Ok((None, files)) => files,
                Err(why) => {
                    proptest::prop_assert!(core.is_err(), "the Hub: {why}; core: {core:?}");
                    return Ok(());
                }
            };
            let core = core.unwrap();
            let core_files: Vec<String> = core
                .files()
                .iter()
                .map(|f| {
                    let name = f.path.strip_prefix(root.path()).unwrap();
                    name.to_string_lossy().into_owned()
                })
                .collect();
            proptest::prop_assert_eq!(hub_files, core_files);
        }
    }
}
