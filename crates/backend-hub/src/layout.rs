//! Which files of a repository a load reads, as the loaders choose them: the index, else
//! `model.safetensors`, else every `*.safetensors` in natural order; the shards an index names;
//! the small files fetched beside the weights (every file that is not a weight).

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
/// one names them: `model.safetensors.index.json`, else `model.safetensors`, else every
/// `*.safetensors` there in natural order. `Err` says what is there instead.
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
    let in_dir = |name: &str| {
        name.strip_prefix(dir.as_str())
            .filter(|rest| !rest.contains('/'))
            .is_some()
    };
    let index = format!("{dir}model.safetensors.index.json");
    if files.iter().any(|f| f.path == index) {
        return Ok((Some(index), Vec::new()));
    }
    let single = format!("{dir}model.safetensors");
    if files.iter().any(|f| f.path == single) {
        return Ok((None, vec![single]));
    }
    let mut found: Vec<String> = files
        .iter()
        .map(|f| f.path.clone())
        .filter(|p| in_dir(p) && p.ends_with(".safetensors"))
        .filter(|p| !p.rsplit('/').next().unwrap_or("").starts_with('.'))
        .collect();
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
    found.sort_by(|a, b| staging_core::natural_cmp(a, b));
    Ok((None, found))
}

/// Whether `path` is a repository's documentation (`README.md`, any `*.md`, `.gitattributes`),
/// which no load or loader reads.
pub(crate) fn is_documentation(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.to_ascii_lowercase().ends_with(".md") || name == ".gitattributes"
}

/// The shard files an index names (joined under the index's folder), in the order first named.
pub(crate) fn shards_of(bytes: &[u8], index: &str) -> Result<Vec<String>, String> {
    /// An index as far as it is read here: which file holds each tensor.
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: std::collections::BTreeMap<String, String>,
    }
    let doc: Index = serde_json::from_slice(bytes)
        .map_err(|e| format!("{index} is not an index (a weight_map of file names): {e}"))?;
    let dir = index.rsplit_once('/').map_or("", |(d, _)| d);
    let mut seen = std::collections::HashSet::new();
    let mut shards = Vec::new();
    for name in doc.weight_map.values() {
        staging_core::checked_components(name)
            .map_err(|why| format!("{index} names a shard {name:?}, which {why}"))?;
        let joined = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        if seen.insert(joined.clone()) {
            shards.push(joined);
        }
    }
    Ok(shards)
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
        let index = br#"{"weight_map":{"a":"s-1.safetensors","b":"s-2.safetensors","c":"s-1.safetensors"}}"#;
        assert_eq!(
            shards_of(index, "sub/model.safetensors.index.json").unwrap(),
            ["sub/s-1.safetensors", "sub/s-2.safetensors"]
        );
        let hostile = br#"{"weight_map":{"a":"../../etc/passwd"}}"#;
        assert!(shards_of(hostile, "i.json").unwrap_err().contains("'..'"));
        for bad in [&b"{}"[..], br#"{"weight_map":{"a":1}}"#, b"[]", b"not json"] {
            let error = shards_of(bad, "i.json").unwrap_err();
            assert!(error.starts_with("i.json is not an index"), "{error}");
        }
        // Other keys (`metadata`) are the index's business.
        let with_metadata = br#"{"metadata":{"total_size":8},"weight_map":{"a":"s.safetensors"}}"#;
        assert_eq!(
            shards_of(with_metadata, "i.json").unwrap(),
            ["s.safetensors"]
        );
    }
}
